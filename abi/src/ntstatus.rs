//! The NTSTATUS values the driver completes requests with, and what each
//! means in kstack's protocol. The driver returns exactly these; the client
//! explains exactly these.

/// An NTSTATUS as the kernel returns it.
pub type NtStatus = i32;

/// Reinterprets the documented unsigned spelling of an NTSTATUS.
#[expect(
    clippy::cast_possible_wrap,
    reason = "NTSTATUS values are documented as unsigned hex"
)]
const fn nt(code: u32) -> NtStatus {
    code as NtStatus
}

/// The request succeeded.
pub const STATUS_SUCCESS: NtStatus = 0;
/// Status only: the output buffer held the version prefix but not the whole
/// response; the prefix was written (Win32 `ERROR_MORE_DATA`).
pub const STATUS_BUFFER_OVERFLOW: NtStatus = nt(0x8000_0005);
/// The control code is not one of kstack's.
pub const STATUS_INVALID_DEVICE_REQUEST: NtStatus = nt(0xC000_0010);
/// The output buffer is smaller than the request needs.
pub const STATUS_BUFFER_TOO_SMALL: NtStatus = nt(0xC000_0023);
/// A field of a decoded message is out of range.
pub const STATUS_INVALID_PARAMETER: NtStatus = nt(0xC000_000D);
/// The request's `abi_version` is not the driver's.
pub const STATUS_REVISION_MISMATCH: NtStatus = nt(0xC000_0059);
/// An input or output length that the request does not allow.
pub const STATUS_INVALID_BUFFER_SIZE: NtStatus = nt(0xC000_0206);
/// The host kernel lacks what an enabled source needs (its registration
/// failed or it cannot be registered at all).
pub const STATUS_NOT_SUPPORTED: NtStatus = nt(0xC000_00BB);
/// Configuration field 1 (`sources`) names a source that does not exist.
pub const STATUS_INVALID_PARAMETER_1: NtStatus = nt(0xC000_00EF);
/// Configuration field 2 (`frames_to_skip`) is out of range.
pub const STATUS_INVALID_PARAMETER_2: NtStatus = nt(0xC000_00F0);
/// Configuration field 3 (`frames_to_capture`) is out of range.
pub const STATUS_INVALID_PARAMETER_3: NtStatus = nt(0xC000_00F1);
/// Configuration field 4 (`timer_period_ms`) is out of range.
pub const STATUS_INVALID_PARAMETER_4: NtStatus = nt(0xC000_00F2);
/// Configuration field 5 (`processes`) is malformed: a list longer than
/// `MAX_PROCESS_IDS`, or a process id in both lists.
pub const STATUS_INVALID_PARAMETER_5: NtStatus = nt(0xC000_00F3);
/// Configuration field 6 (`sample_every`) is out of range: 0, or other
/// than 1 for the on-demand or thread-stack source.
pub const STATUS_INVALID_PARAMETER_6: NtStatus = nt(0xC000_00F4);
/// Configuration field 7 (`user_frames`) is out of range: above
/// `MAX_FRAMES`, or other than 0 for the timer source.
pub const STATUS_INVALID_PARAMETER_7: NtStatus = nt(0xC000_00F5);
/// Another read, clear or configure request is in progress; retry
/// (Win32 `ERROR_BUSY`). A warning status: no data is returned.
pub const STATUS_DEVICE_BUSY: NtStatus = nt(0x8000_0011);

/// kstack's own codes: severity error, customer bit set, facility 0xB5.
/// `RtlNtStatusToDosError` returns customer-bit codes unchanged (seen in
/// Wine's and ReactOS's implementation), so the client's `GetLastError`
/// reads them as they are.
const KSTACK_FACILITY_ERROR: u32 = 0xE0B5_0000;

/// Enabling a source that runs at DISPATCH_LEVEL (the timer) while the
/// kernel may page executive code (`DisablePagingExecutive`=1 not in effect,
/// [`crate::paging`]): a stack walk there could need a page fault where none
/// is allowed. Fix: `DisablePagingExecutive`=1 and reboot.
pub const KSTACK_STATUS_PAGING_EXECUTIVE_REQUIRED: NtStatus = nt(KSTACK_FACILITY_ERROR | 1);

/// A capture-now request arrived with less kernel stack left than kstack
/// needs for a walk (`MIN_REMAINING_STACK` in kstack-driver-core, 8 KiB):
/// nothing was walked, and the skip is counted as `skipped_stack`.
pub const KSTACK_STATUS_STACK_TOO_LOW: NtStatus = nt(KSTACK_FACILITY_ERROR | 3);

/// A capture-threads request ([`crate::Ioctl::CaptureThreads`]) while the
/// thread-stack source is disabled: nothing was queued. Fix: enable the
/// threadstack source first (`kstack config`), then request again.
pub const KSTACK_STATUS_SOURCE_DISABLED: NtStatus = nt(KSTACK_FACILITY_ERROR | 4);

/// A capture-threads request on a host that cannot deliver kernel APCs:
/// the driver cannot call `KeInsertQueueApc` (the status's
/// [`crate::StatusResponse::apc`] says why: under Wine it is a stub that
/// ends the host when called). Nothing was queued; thread stacks cannot be
/// captured on this host.
pub const KSTACK_STATUS_NO_APC: NtStatus = nt(KSTACK_FACILITY_ERROR | 5);

/// A registration status, in a driver built with the `test-injection`
/// feature only: the kernel has no routine for this source (Wine 8 lacks
/// `CmRegisterCallbackEx`), so its events come only from injection
/// requests. A success code, so the source can be enabled.
pub const KSTACK_STATUS_INJECTION_ONLY: NtStatus = nt(0x60B5_0002);

// Every code above is an error or warning (NT_SUCCESS false), and kstack's
// own carry the customer bit; checked when the crate compiles.
const _: () = {
    let failures = [
        STATUS_BUFFER_OVERFLOW,
        STATUS_DEVICE_BUSY,
        STATUS_INVALID_DEVICE_REQUEST,
        STATUS_BUFFER_TOO_SMALL,
        STATUS_INVALID_PARAMETER,
        STATUS_REVISION_MISMATCH,
        STATUS_INVALID_BUFFER_SIZE,
        STATUS_NOT_SUPPORTED,
        STATUS_INVALID_PARAMETER_1,
        STATUS_INVALID_PARAMETER_2,
        STATUS_INVALID_PARAMETER_3,
        STATUS_INVALID_PARAMETER_4,
        STATUS_INVALID_PARAMETER_5,
        STATUS_INVALID_PARAMETER_6,
        STATUS_INVALID_PARAMETER_7,
        KSTACK_STATUS_PAGING_EXECUTIVE_REQUIRED,
        KSTACK_STATUS_STACK_TOO_LOW,
        KSTACK_STATUS_SOURCE_DISABLED,
        KSTACK_STATUS_NO_APC,
    ];
    let mut i = 0;
    while i < failures.len() {
        assert!(failures[i] < 0);
        i += 1;
    }
    assert!(KSTACK_STATUS_PAGING_EXECUTIVE_REQUIRED.cast_unsigned() & 0x2000_0000 != 0);
    assert!(KSTACK_STATUS_STACK_TOO_LOW.cast_unsigned() & 0x2000_0000 != 0);
    assert!(KSTACK_STATUS_SOURCE_DISABLED.cast_unsigned() & 0x2000_0000 != 0);
    assert!(KSTACK_STATUS_NO_APC.cast_unsigned() & 0x2000_0000 != 0);
    assert!(KSTACK_STATUS_INJECTION_ONLY >= 0);
    assert!(KSTACK_STATUS_INJECTION_ONLY.cast_unsigned() & 0x2000_0000 != 0);
};
