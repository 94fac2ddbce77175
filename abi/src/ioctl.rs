//! The device's control codes and the buffer lengths each one accepts.
//!
//! Every code is METHOD_BUFFERED: the I/O manager copies both buffers, so the
//! driver never touches user memory directly. Codes that only report need
//! read access to the handle; codes that change state need write access.
//!
//! A request that fails (an error NTSTATUS) returns no bytes: the driver
//! completes it with 0 bytes of output, and for an error status the I/O
//! manager copies nothing back, so the caller's output buffer is as it
//! was. The one reply with a non-success status that carries bytes is a
//! status request whose buffer is too short for the whole response: the
//! 8-byte prefix, with the warning `STATUS_BUFFER_OVERFLOW` (see
//! [`crate::StatusResponse`]).

use crate::{
    MAX_RECORD_SIZE,
    messages::{
        CAPTURE_NOW_REQUEST_SIZE, CONFIGURE_REQUEST_SIZE, READ_HEADER_SIZE, STATUS_PREFIX_SIZE,
    },
    ntstatus::{
        NtStatus, STATUS_BUFFER_TOO_SMALL, STATUS_INVALID_BUFFER_SIZE,
        STATUS_INVALID_DEVICE_REQUEST,
    },
    thread_capture::{CAPTURE_THREADS_REPLY_SIZE, CAPTURE_THREADS_REQUEST_SIZE},
};

/// kstack's device type, in the range Windows leaves to vendors (0x8000 and up).
pub const DEVICE_TYPE: u32 = 0x8B5C;
/// `METHOD_BUFFERED`.
const METHOD_BUFFERED: u32 = 0;
/// Vendor function codes start here; lower ones are Microsoft's.
const FIRST_FUNCTION: u32 = 0x800;

/// The smallest output buffer a read accepts: a header and one largest record,
/// so a read can always make progress.
pub const MIN_READ_BUFFER: usize = READ_HEADER_SIZE + MAX_RECORD_SIZE;

/// The largest input any request takes (the driver copies inputs this
/// small before using them).
pub const MAX_INPUT_LENGTH: usize = {
    let mut largest = 0;
    let mut index = 0;
    while index < Ioctl::ALL.len() {
        let (input, _, _) = Ioctl::ALL[index].lengths();
        if input > largest {
            largest = input;
        }
        index += 1;
    }
    largest
};

/// The test-injection request's code (see
/// [`crate::messages::encode_inject_request`]): outside [`Ioctl`], because
/// only a driver built with the `test-injection` feature knows it; a
/// release driver answers it as any unknown code.
pub const INJECT_CODE: u32 = ctl_code(DEVICE_TYPE, 0xF00, METHOD_BUFFERED, Access::Write);
/// The test fault-probe request's code (see
/// [`crate::messages::encode_fault_probe_request`]): like [`INJECT_CODE`],
/// served only by a `test-injection` build.
pub const FAULT_PROBE_CODE: u32 = ctl_code(DEVICE_TYPE, 0xF01, METHOD_BUFFERED, Access::Write);

/// The handle access a code requires (the `Access` field of `CTL_CODE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Access {
    /// `FILE_READ_ACCESS`.
    Read = 1,
    /// `FILE_WRITE_ACCESS`.
    Write = 2,
}

/// Windows' `CTL_CODE` macro.
#[must_use]
pub const fn ctl_code(device_type: u32, function: u32, method: u32, access: Access) -> u32 {
    (device_type << 16) | ((access as u32) << 14) | (function << 2) | method
}

/// kstack's control codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ioctl {
    /// Versions, paging policy, sources, counters, ring fill.
    Status,
    /// Replace the capture configuration ([`crate::CaptureConfig`], whose
    /// docs give its layout). A refused request changes nothing and fails
    /// with the first of these checks that fails: the buffer lengths
    /// ([`Ioctl::check_lengths`]); the request's ABI version and `size`
    /// word; its fields, in the order of their statuses (see
    /// [`crate::CaptureConfig`]); then against the driver's state: an
    /// enabled source whose registration failed at load
    /// (`STATUS_NOT_SUPPORTED`), the timer enabled while
    /// `DisablePagingExecutive`=1 is not in effect
    /// (`KSTACK_STATUS_PAGING_EXECUTIVE_REQUIRED`), another configure
    /// request under way (`STATUS_DEVICE_BUSY`). An accepted configuration
    /// leaves the ring's records and every counter as they are.
    Configure,
    /// Drain as many whole records as fit, oldest timestamp first: trace
    /// records and module records ([`crate::module_record`]) alike, each
    /// kind told by byte 2 ([`crate::Entry`]). A read
    /// returns only records stamped before it began, so no record a later
    /// read returns is older than one this read returned, across all
    /// shards. It first waits, boundedly, for publish sections under way
    /// in any shard (on Windows a section is one record's copy at
    /// `DISPATCH_LEVEL`, never descheduled, so this wait is below a
    /// microsecond plus interrupts); where one does not end within that
    /// bound (a preempted section, possible only where IRQL is not
    /// modelled, as under Wine), the read returns only records older than
    /// the previous read's limit. Records held back wait for a later read;
    /// `more_pending` reports only records that did not fit the buffer.
    ///
    /// The reader is the file object the read comes on (one per handle):
    /// which records come with their stack table frames depends on the
    /// reads before it, see [`crate::RecordFlags::STACK_BY_ID`].
    ///
    /// A read is delivered when the driver completes it: its records have
    /// left the ring and the stacks it carried count as sent to this
    /// reader. If the caller then does not get them (the I/O manager cannot
    /// copy the reply back into the caller's buffer, which another thread
    /// freed or protected meanwhile, and the request fails with that
    /// status; or the reply does not decode), the records are lost, and a
    /// later read on the same handle may name by id a stack whose frames
    /// went with them. So after any failed read a reader stops: it closes
    /// its handle and opens a new one, a new reader, which gets every
    /// stack's frames again. kstack's client does so (its `Reader` refuses
    /// to read again after a failure, and every command ends on a read
    /// error); the records lost show as a gap in their shard's sequence
    /// numbers.
    Read,
    /// Discard the records in the ring: in each shard, those written when
    /// the clear reaches it. A clear ends even while callbacks keep
    /// publishing into the shard it is clearing: it discards at most as
    /// many records as the shard has 8-byte words (no record is smaller
    /// than a word, so that is at least everything the shard held when the
    /// clear reached it), and a record published while it runs may remain.
    /// Counted as `cleared`.
    Clear,
    /// Capture the calling request's stack and return its record: one
    /// trace record of the on-demand source at the front of the output
    /// buffer, the bytes returned its size. The reply always carries its
    /// frames and never has [`crate::RecordFlags::STACK_BY_ID`], even when
    /// the ring's copy of it names its stack by id.
    ///
    /// The request walks first, whether or not the on-demand source is
    /// enabled, and fails without a record when it cannot: too little
    /// kernel stack left (`KSTACK_STATUS_STACK_TOO_LOW`, counted as
    /// `skipped_stack`) or an IRQL the paging policy forbids
    /// (`KSTACK_STATUS_PAGING_EXECUTIVE_REQUIRED`, counted as
    /// `skipped_irql`). Then the record is kept in the ring when the
    /// on-demand source is enabled and the process filter admits the
    /// caller; it then has the shard and sequence number it took (if the
    /// shard was full, the ring's copy is dropped and counted, and the
    /// reply still has the sequence number it spent). Otherwise the reply
    /// is flagged [`crate::RecordFlags::NOT_IN_RING`], with sequence 0 and
    /// shard 0, and counted as `not_kept` when the source is disabled
    /// (whatever the filter says of the caller), else as `filtered`. See
    /// [`crate::SourceStatus`]. A request refused before the walk (its
    /// buffer lengths, its ABI version or its `size` word) is counted
    /// nowhere: nothing was walked.
    CaptureNow,
    /// Capture the stacks of other threads, named by id
    /// ([`crate::thread_capture::CaptureThreadsRequest`], whose docs give
    /// its layout): for each, the driver queues a special kernel APC to the
    /// thread, which captures the thread's stack in it, at `APC_LEVEL`, as
    /// one event of the thread-stack source ([`crate::Source::ThreadStack`],
    /// facts [`crate::SourceFacts::ThreadStack`]). The reply
    /// ([`crate::thread_capture::CaptureThreadsReply`]) comes at once and
    /// says per id whether an APC was queued
    /// ([`crate::thread_capture::ThreadRequestOutcome`]); the records come
    /// through reads, when each thread next runs kernel APCs (a thread
    /// waiting in user mode or running runs them at once; one suspended,
    /// or waiting in the kernel with APCs disabled, later).
    ///
    /// A refused request queues nothing, counts nothing and fails with the
    /// first of these checks that fails: the buffer lengths
    /// ([`Ioctl::check_lengths`]); the request's ABI version, `size` word
    /// and fields (see [`crate::thread_capture::CaptureThreadsRequest`]);
    /// then against the driver's state: a host where the driver cannot
    /// queue APCs (`KSTACK_STATUS_NO_APC`, see
    /// [`crate::StatusResponse::apc`]; there the thread-stack source is
    /// unavailable, its registration `KSTACK_STATUS_NO_APC`, so it cannot
    /// be enabled), then the thread-stack source disabled
    /// (`KSTACK_STATUS_SOURCE_DISABLED`). While the driver unloads, this
    /// request fails as every request does (`STATUS_DEVICE_NOT_READY`).
    ///
    /// An accepted request succeeds with the 64-byte reply whatever its
    /// ids' outcomes, each counted in
    /// [`crate::messages::ThreadCaptureStatus`]. Its request time is
    /// taken when the driver serves it; a record's `delay` is from then to
    /// its capture, and `late` says it came after `timeout_ms`. A queued
    /// APC is delivered (one event, counted as `delivered`), also when its
    /// thread exits first: the kernel delivers a thread's queued kernel
    /// APCs in its exit path. `run_down` counts APCs a kernel ran down
    /// instead (their rundown routine; no record), which no known Windows
    /// does for kernel APCs. A delivered APC is an event like a
    /// callback's: the process filter (the captured thread's process) and
    /// the stack check apply (see [`crate::SourceStatus`]); the source is
    /// never sampled (its `sample_every` is 1).
    ///
    /// The record's kernel frames are the thread's own: the walk starts in
    /// kstack and in the kernel's APC dispatcher, so the frames inside
    /// kstack's image ([`crate::StatusResponse::driver_image`]) and the first
    /// frame after them (`KiDeliverApc`) are dropped; the configuration's
    /// `frames_to_skip` does not apply, `frames_to_capture` bounds the
    /// thread's frames. An APC delivered from an interrupt (a running
    /// thread) also leaves the kernel's `KiApcInterrupt` on top. The user
    /// part is the thread's, walked as for every source (`user_frames`).
    ///
    /// The user part is not walked when the APC interrupted the thread
    /// inside a critical or guarded region
    /// ([`crate::UserPart::CriticalRegion`]).
    ///
    /// While the driver unloads, an APC still queued is neither captured
    /// nor counted when it runs. Unload takes back the APCs still queued
    /// where it can ([`crate::StatusResponse::apc_take_back`]) and waits
    /// (up to 5 s) for the others; a thread that does not let its APC run
    /// by then keeps kstack's image loaded until it does (in its exit path
    /// at the latest), and that last APC frees the memory its slot was in
    /// (`LastUnloadPoolAllocations` counts it as left at unload). Until
    /// then, starting the driver again fails (`sc start` error 1056: the
    /// old image is still loaded).
    CaptureThreads,
}

impl Ioctl {
    /// Every code, in function-number order.
    pub const ALL: [Self; 6] = [
        Self::Status,
        Self::Configure,
        Self::Read,
        Self::Clear,
        Self::CaptureNow,
        Self::CaptureThreads,
    ];

    const fn function(self) -> u32 {
        FIRST_FUNCTION
            + match self {
                Self::Status => 0,
                Self::Configure => 1,
                Self::Read => 2,
                Self::Clear => 3,
                Self::CaptureNow => 4,
                Self::CaptureThreads => 5,
            }
    }

    /// The access the caller's handle needs.
    #[must_use]
    pub const fn access(self) -> Access {
        match self {
            Self::Status | Self::Read => Access::Read,
            Self::Configure | Self::Clear | Self::CaptureNow | Self::CaptureThreads => {
                Access::Write
            }
        }
    }

    /// The 32-bit control code passed to `DeviceIoControl`.
    #[must_use]
    pub const fn code(self) -> u32 {
        ctl_code(DEVICE_TYPE, self.function(), METHOD_BUFFERED, self.access())
    }

    /// The kstack code equal to `code`, if any.
    #[must_use]
    pub fn from_code(code: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|ioctl| ioctl.code() == code)
    }

    /// A short name for messages.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Status => "status",
            Self::Configure => "configure",
            Self::Read => "read",
            Self::Clear => "clear",
            Self::CaptureNow => "capture-now",
            Self::CaptureThreads => "capture-threads",
        }
    }

    /// The input length, the least output length, and whether an output
    /// buffer is allowed (see [`Ioctl::check_lengths`]).
    const fn lengths(self) -> (usize, usize, bool) {
        match self {
            Self::Status => (0, STATUS_PREFIX_SIZE, true),
            Self::Configure => (CONFIGURE_REQUEST_SIZE, 0, false),
            Self::Read => (0, MIN_READ_BUFFER, true),
            Self::Clear => (0, 0, false),
            Self::CaptureNow => (CAPTURE_NOW_REQUEST_SIZE, MAX_RECORD_SIZE, true),
            Self::CaptureThreads => (
                CAPTURE_THREADS_REQUEST_SIZE,
                CAPTURE_THREADS_REPLY_SIZE,
                true,
            ),
        }
    }

    /// Checks the buffer lengths of a request before anything is read.
    ///
    /// | code | input | output |
    /// |------|-------|--------|
    /// | status | 0 | at least 8 (the version prefix) |
    /// | configure | exactly [`CONFIGURE_REQUEST_SIZE`] | 0 |
    /// | read | 0 | at least [`MIN_READ_BUFFER`] |
    /// | clear | 0 | 0 |
    /// | capture-now | exactly [`CAPTURE_NOW_REQUEST_SIZE`] | at least [`MAX_RECORD_SIZE`] |
    /// | capture-threads | exactly [`CAPTURE_THREADS_REQUEST_SIZE`] | at least [`CAPTURE_THREADS_REPLY_SIZE`] |
    ///
    /// # Errors
    /// The first length that is wrong.
    pub const fn check_lengths(self, input: usize, output: usize) -> Result<(), RequestError> {
        let (input_size, min_output, output_allowed) = self.lengths();
        if input != input_size {
            return Err(RequestError::InputLength {
                expected: input_size,
                actual: input,
            });
        }
        if !output_allowed && output != 0 {
            return Err(RequestError::UnexpectedOutput { actual: output });
        }
        if output < min_output {
            return Err(RequestError::OutputTooSmall {
                needed: min_output,
                actual: output,
            });
        }
        Ok(())
    }
}

/// A request refused before its contents were looked at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestError {
    /// Not one of kstack's control codes.
    UnknownCode {
        /// The code received.
        code: u32,
    },
    /// The input buffer has the wrong length.
    InputLength {
        /// The length this code takes.
        expected: usize,
        /// The length received.
        actual: usize,
    },
    /// An output buffer was given to a code that returns nothing.
    UnexpectedOutput {
        /// The length received.
        actual: usize,
    },
    /// The output buffer is too small.
    OutputTooSmall {
        /// The least this code needs.
        needed: usize,
        /// The length received.
        actual: usize,
    },
}

impl RequestError {
    /// The status the driver completes the request with.
    #[must_use]
    pub const fn ntstatus(self) -> NtStatus {
        match self {
            Self::UnknownCode { .. } => STATUS_INVALID_DEVICE_REQUEST,
            Self::InputLength { .. } | Self::UnexpectedOutput { .. } => STATUS_INVALID_BUFFER_SIZE,
            Self::OutputTooSmall { .. } => STATUS_BUFFER_TOO_SMALL,
        }
    }
}

impl core::fmt::Display for RequestError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            Self::UnknownCode { code } => write!(f, "control code {code:#010x} is not kstack's"),
            Self::InputLength { expected, actual } => {
                write!(
                    f,
                    "input buffer is {actual} bytes; this request takes exactly {expected}"
                )
            }
            Self::UnexpectedOutput { actual } => {
                write!(
                    f,
                    "output buffer is {actual} bytes; this request returns nothing"
                )
            }
            Self::OutputTooSmall { needed, actual } => {
                write!(
                    f,
                    "output buffer is {actual} bytes; this request needs at least {needed}"
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffer_limits_are_the_documented_sizes() {
        // A read header (24) and one largest record (568).
        assert_eq!(MIN_READ_BUFFER, 592);
        // The capture-threads request (8 + 16 + 4 * 64) is the largest
        // input.
        assert_eq!(MAX_INPUT_LENGTH, 280);
        assert_eq!(MAX_INPUT_LENGTH, CAPTURE_THREADS_REQUEST_SIZE);
    }

    #[test]
    fn every_code_has_its_own_name_and_errors_say_what_is_wrong() {
        let names: Vec<&str> = Ioctl::ALL.into_iter().map(Ioctl::name).collect();
        assert_eq!(
            names,
            [
                "status",
                "configure",
                "read",
                "clear",
                "capture-now",
                "capture-threads"
            ]
        );
        let texts = [
            (
                RequestError::UnknownCode { code: 0x1234 },
                "control code 0x00001234 is not kstack's",
            ),
            (
                RequestError::InputLength {
                    expected: 24,
                    actual: 3,
                },
                "input buffer is 3 bytes; this request takes exactly 24",
            ),
            (
                RequestError::UnexpectedOutput { actual: 9 },
                "output buffer is 9 bytes; this request returns nothing",
            ),
        ];
        for (error, text) in texts {
            assert_eq!(error.to_string(), text);
        }
        let too_small = RequestError::OutputTooSmall {
            needed: 600,
            actual: 8,
        }
        .to_string();
        assert!(
            too_small.contains("600") && too_small.contains('8'),
            "{too_small}"
        );
    }

    #[test]
    fn codes_match_ctl_code_by_hand() {
        // CTL_CODE(0x8B5C, 0x800, METHOD_BUFFERED, FILE_READ_ACCESS)
        assert_eq!(Ioctl::Status.code(), 0x8B5C_6000);
        // CTL_CODE(0x8B5C, 0x801, METHOD_BUFFERED, FILE_WRITE_ACCESS)
        assert_eq!(Ioctl::Configure.code(), 0x8B5C_A004);
        assert_eq!(Ioctl::Read.code(), 0x8B5C_6008);
        assert_eq!(Ioctl::Clear.code(), 0x8B5C_A00C);
        assert_eq!(Ioctl::CaptureNow.code(), 0x8B5C_A010);
        // CTL_CODE(0x8B5C, 0x805, METHOD_BUFFERED, FILE_WRITE_ACCESS)
        assert_eq!(Ioctl::CaptureThreads.code(), 0x8B5C_A014);
    }

    #[test]
    fn codes_are_distinct_buffered_and_decode_back() {
        for ioctl in Ioctl::ALL {
            assert_eq!(ioctl.code() & 3, METHOD_BUFFERED);
            assert_eq!(Ioctl::from_code(ioctl.code()), Some(ioctl));
        }
        assert_eq!(Ioctl::from_code(0), None);
        // Same function, other access bits: not a kstack code.
        assert_eq!(Ioctl::from_code(Ioctl::Status.code() | 3 << 14), None);
    }

    #[test]
    fn reporting_codes_need_read_access_and_the_rest_write() {
        let read: Vec<_> = Ioctl::ALL
            .into_iter()
            .filter(|i| i.access() == Access::Read)
            .collect();
        assert_eq!(read, [Ioctl::Status, Ioctl::Read]);
    }

    #[test]
    fn lengths_are_checked_per_code() {
        use RequestError::*;
        assert_eq!(Ioctl::Status.check_lengths(0, 8), Ok(()));
        assert_eq!(
            Ioctl::Status.check_lengths(1, 8),
            Err(InputLength {
                expected: 0,
                actual: 1
            })
        );
        assert_eq!(
            Ioctl::Status.check_lengths(0, 7),
            Err(OutputTooSmall {
                needed: 8,
                actual: 7
            })
        );
        assert_eq!(
            Ioctl::Configure.check_lengths(CONFIGURE_REQUEST_SIZE, 0),
            Ok(())
        );
        assert_eq!(
            Ioctl::Configure.check_lengths(CONFIGURE_REQUEST_SIZE - 1, 0),
            Err(InputLength {
                expected: CONFIGURE_REQUEST_SIZE,
                actual: CONFIGURE_REQUEST_SIZE - 1
            })
        );
        assert_eq!(
            Ioctl::Configure.check_lengths(CONFIGURE_REQUEST_SIZE, 4),
            Err(UnexpectedOutput { actual: 4 })
        );
        assert_eq!(Ioctl::Read.check_lengths(0, MIN_READ_BUFFER), Ok(()));
        assert_eq!(
            Ioctl::Read.check_lengths(0, MIN_READ_BUFFER - 1),
            Err(OutputTooSmall {
                needed: MIN_READ_BUFFER,
                actual: MIN_READ_BUFFER - 1
            })
        );
        assert_eq!(Ioctl::Clear.check_lengths(0, 0), Ok(()));
        assert_eq!(
            Ioctl::Clear.check_lengths(0, 1),
            Err(UnexpectedOutput { actual: 1 })
        );
        assert_eq!(
            Ioctl::CaptureNow.check_lengths(CAPTURE_NOW_REQUEST_SIZE, MAX_RECORD_SIZE),
            Ok(())
        );
        assert_eq!(
            Ioctl::CaptureNow.check_lengths(CAPTURE_NOW_REQUEST_SIZE, 100),
            Err(OutputTooSmall {
                needed: MAX_RECORD_SIZE,
                actual: 100
            })
        );
        assert_eq!(
            Ioctl::CaptureThreads.check_lengths(CAPTURE_THREADS_REQUEST_SIZE, 64),
            Ok(())
        );
        assert_eq!(
            Ioctl::CaptureThreads.check_lengths(CAPTURE_THREADS_REQUEST_SIZE, 65),
            Ok(())
        );
        assert_eq!(
            Ioctl::CaptureThreads.check_lengths(CAPTURE_THREADS_REQUEST_SIZE + 4, 64),
            Err(InputLength {
                expected: 280,
                actual: 284
            })
        );
        assert_eq!(
            Ioctl::CaptureThreads.check_lengths(CAPTURE_THREADS_REQUEST_SIZE, 63),
            Err(OutputTooSmall {
                needed: 64,
                actual: 63
            })
        );
    }

    #[test]
    fn request_errors_map_to_their_statuses() {
        assert_eq!(
            RequestError::UnknownCode { code: 1 }.ntstatus(),
            STATUS_INVALID_DEVICE_REQUEST
        );
        assert_eq!(
            RequestError::InputLength {
                expected: 0,
                actual: 1
            }
            .ntstatus(),
            STATUS_INVALID_BUFFER_SIZE
        );
        assert_eq!(
            RequestError::UnexpectedOutput { actual: 1 }.ntstatus(),
            STATUS_INVALID_BUFFER_SIZE
        );
        assert_eq!(
            RequestError::OutputTooSmall {
                needed: 2,
                actual: 1
            }
            .ntstatus(),
            STATUS_BUFFER_TOO_SMALL
        );
    }
}
