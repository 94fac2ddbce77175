//! Kernel routines kstack looks up by name at load, so a kernel
//! that lacks one reports the feature unavailable instead of refusing to load
//! the driver (a static import of a missing export fails the whole load on
//! Windows). Windows before 2004 lacks `ExAllocatePool2`; Windows 7 lacks
//! `KeQuerySystemTimePrecise`; Wine 8 lacks both, and `CmRegisterCallbackEx`.
//! `KeQueryPerformanceCounter` is ntoskrnl's on Windows 8 and later and
//! HAL's before (and in Wine); `MmGetSystemRoutineAddress` searches both.
//!
//! `KeAreApcsDisabled` is exported by every supported Windows and looked up
//! with `RtlWalkFrameChain`: a user walk needs both (no walk inside a
//! critical region), so user walks count as available only when both are.
//!
//! `RtlWalkFrameChain` (the user-stack walk),
//! `PsGetProcessCreateTimeQuadPart` (module records' process keys) and
//! `KeInsertQueueApc` (capture-threads requests' APCs) are exported by Wine
//! 8 too, but only as stubs that end the host process when called, and
//! `MmGetSystemRoutineAddress` cannot tell a stub from a routine. So the
//! driver asks for a name only Wine's ntoskrnl exports
//! (`wine_ntoskrnl_main_loop`): when it is there, the host is Wine and all
//! three are reported unavailable ([`HostRoutine::HostStub`]) and never
//! called.
//!
//! `KeInitializeApc`, `KeInsertQueueApc` and `KeRemoveQueueApc` are
//! exported by every x64 Windows but not documented (no WDK header declares
//! them), so they are looked up rather than imported; queueing APCs counts
//! as available only when the first two are there, and unload takes queued
//! APCs back with the third when it is (ReactOS does not export it; which
//! Windows builds do is the status's `apc_take_back`).

use core::{ffi::c_void, ptr};

use kstack_abi::HostRoutine;

use wdk_sys::{
    BOOLEAN, KAPC, KPRIORITY, KPROCESSOR_MODE, LARGE_INTEGER, NTSTATUS, PCUNICODE_STRING,
    PEPROCESS, PETHREAD, PEX_CALLBACK_FUNCTION, PKNORMAL_ROUTINE, PVOID,
    ntddk::MmGetSystemRoutineAddress,
};

use crate::{
    fault_scope::FrameWalk,
    unicode::{unicode_string, utf16},
};

/// `ExAllocatePool2(Flags, NumberOfBytes, Tag)`.
pub type AllocatePool2 = unsafe extern "system" fn(u64, usize, u32) -> *mut c_void;
/// `KeQuerySystemTimePrecise(CurrentTime)` / `KeQuerySystemTime(CurrentTime)`.
pub type QuerySystemTime = unsafe extern "system" fn(*mut LARGE_INTEGER);
/// `KeQueryPerformanceCounter(PerformanceFrequency)`: the counter (a
/// `LARGE_INTEGER`, returned in RAX like an `i64`).
pub type QueryPerformanceCounter = unsafe extern "system" fn(*mut LARGE_INTEGER) -> i64;
/// `CmRegisterCallbackEx(Function, Altitude, Driver, Context, Cookie, Reserved)`.
pub type RegisterRegistryCallback = unsafe extern "system" fn(
    PEX_CALLBACK_FUNCTION,
    PCUNICODE_STRING,
    *mut c_void,
    *mut c_void,
    *mut LARGE_INTEGER,
    *mut c_void,
) -> NTSTATUS;
/// `CmUnRegisterCallback(Cookie)`.
pub type UnregisterRegistryCallback = unsafe extern "system" fn(LARGE_INTEGER) -> NTSTATUS;
/// `ZwQuerySystemInformation(Class, Buffer, Length, ReturnLength)`: exported
/// by ntoskrnl on every supported Windows, but declared only in user-mode
/// headers, so looked up rather than imported.
pub type QuerySystemInformation =
    unsafe extern "system" fn(u32, *mut c_void, u32, *mut u32) -> NTSTATUS;
/// `PsGetProcessCreateTimeQuadPart(Process)`: the process's creation time.
pub type ProcessCreateTime = unsafe extern "system" fn(PEPROCESS) -> i64;

/// A special kernel APC's kernel routine (`PKKERNEL_ROUTINE`).
pub type ApcKernelRoutine =
    unsafe extern "system" fn(*mut KAPC, *mut PKNORMAL_ROUTINE, *mut PVOID, *mut PVOID, *mut PVOID);
/// An APC's rundown routine (`PKRUNDOWN_ROUTINE`).
pub type ApcRundownRoutine = unsafe extern "system" fn(*mut KAPC);
/// `KeInitializeApc(Apc, Thread, Environment, KernelRoutine,
/// RundownRoutine, NormalRoutine, ProcessorMode, NormalContext)`.
pub type InitializeApc = unsafe extern "system" fn(
    *mut KAPC,
    PETHREAD,
    u32,
    ApcKernelRoutine,
    Option<ApcRundownRoutine>,
    PKNORMAL_ROUTINE,
    KPROCESSOR_MODE,
    PVOID,
);
/// `KeInsertQueueApc(Apc, SystemArgument1, SystemArgument2, Increment)`:
/// whether the APC was queued.
pub type InsertQueueApc = unsafe extern "system" fn(*mut KAPC, PVOID, PVOID, KPRIORITY) -> BOOLEAN;

/// `KeAreApcsDisabled()`: whether the current thread is inside a critical
/// or guarded region.
pub type AreApcsDisabled = unsafe extern "system" fn() -> BOOLEAN;
/// `KeRemoveQueueApc(Apc)`: whether the APC was queued and is now taken
/// off its queue (no routine of it runs then).
pub type RemoveQueueApc = unsafe extern "system" fn(*mut KAPC) -> BOOLEAN;

/// What was found.
pub struct Routines {
    pub allocate_pool2: Option<AllocatePool2>,
    pub query_system_time: Option<QuerySystemTime>,
    pub query_performance_counter: Option<QueryPerformanceCounter>,
    pub register_registry_callback: Option<RegisterRegistryCallback>,
    pub unregister_registry_callback: Option<UnregisterRegistryCallback>,
    pub query_system_information: Option<QuerySystemInformation>,
    /// `RtlWalkFrameChain`, only when it can be called ([`HostRoutine::Available`]).
    pub walk_frame_chain: Option<FrameWalk>,
    /// Whether user stacks can be walked, and if not why.
    pub user_walk: HostRoutine,
    /// `KeAreApcsDisabled`, only when user stacks can be walked: no walk
    /// inside a critical or guarded region.
    pub are_apcs_disabled: Option<AreApcsDisabled>,
    /// `PsGetProcessCreateTimeQuadPart`, only when it can be called.
    pub process_create_time: Option<ProcessCreateTime>,
    /// Whether module records get process keys, and if not why.
    pub process_key: HostRoutine,
    /// Whether capture-threads requests can queue APCs, and if not why.
    pub apc: HostRoutine,
    /// `KeInitializeApc`, only when APCs can be queued ([`Routines::apc`]).
    pub initialize_apc: Option<InitializeApc>,
    /// `KeInsertQueueApc`, only when APCs can be queued.
    pub insert_queue_apc: Option<InsertQueueApc>,
    /// `KeRemoveQueueApc`, only when APCs can be queued and the kernel
    /// exports it (ReactOS and Wine do not; which Windows builds do is
    /// checked on the test VM): unload takes queued APCs back with it.
    pub remove_queue_apc: Option<RemoveQueueApc>,
    /// Whether unload can take queued APCs back (`remove_queue_apc`).
    pub apc_take_back: HostRoutine,
}

/// Looks up `name`, a routine Wine may export only as a stub: its state,
/// and its address only when it can be called (null otherwise).
///
/// Max IRQL: `PASSIVE_LEVEL`.
fn find_unless_stubbed(name: &'static [u16], host_is_wine: bool) -> (HostRoutine, *mut c_void) {
    let address = find(name);
    if address.is_null() {
        (HostRoutine::NotExported, address)
    } else if host_is_wine {
        (HostRoutine::HostStub, ptr::null_mut())
    } else {
        (HostRoutine::Available, address)
    }
}

/// The address the kernel exports under `name`, or null.
///
/// Max IRQL: `PASSIVE_LEVEL`.
fn find(name: &'static [u16]) -> *mut c_void {
    let mut name = unicode_string(name);
    // SAFETY: `name` is a valid UNICODE_STRING over a static buffer.
    unsafe { MmGetSystemRoutineAddress(&raw mut name) }
}

/// Reinterprets an export's address as the routine type `F`.
///
/// # Safety
/// The export named for `F` has exactly `F`'s signature and ABI.
unsafe fn routine<F: Copy>(address: *mut c_void) -> Option<F> {
    if address.is_null() {
        return None;
    }
    debug_assert_eq!(size_of::<F>(), size_of::<*mut c_void>());
    // SAFETY: `F` is a function pointer type (caller), the same size as a
    // pointer, and `address` is that routine's entry point.
    Some(unsafe { ptr::read((&raw const address).cast::<F>()) })
}

impl Routines {
    /// Looks everything up.
    ///
    /// Max IRQL: `PASSIVE_LEVEL`.
    pub fn resolve() -> Self {
        let precise = find(utf16!("KeQuerySystemTimePrecise"));
        let time = if precise.is_null() {
            find(utf16!("KeQuerySystemTime"))
        } else {
            precise
        };
        // SAFETY: the export name matches its type alias (the WDK prototypes;
        // KeQuerySystemTime and its precise variant share one), here and in
        // the blocks below.
        let allocate_pool2 = unsafe { routine(find(utf16!("ExAllocatePool2"))) };
        // SAFETY: as above.
        let query_system_time = unsafe { routine(time) };
        // SAFETY: as above.
        let query_performance_counter =
            unsafe { routine(find(utf16!("KeQueryPerformanceCounter"))) };
        // SAFETY: as above.
        let register_registry_callback = unsafe { routine(find(utf16!("CmRegisterCallbackEx"))) };
        // SAFETY: as above.
        let unregister_registry_callback = unsafe { routine(find(utf16!("CmUnRegisterCallback"))) };
        // SAFETY: as above (the prototype in winternl.h).
        let query_system_information = unsafe { routine(find(utf16!("ZwQuerySystemInformation"))) };
        let wine = !find(utf16!("wine_ntoskrnl_main_loop")).is_null();
        let (user_walk, walk) = find_unless_stubbed(utf16!("RtlWalkFrameChain"), wine);
        let apcs_disabled = find(utf16!("KeAreApcsDisabled"));
        // A user walk needs both: the walk, and whether it may page there.
        let (user_walk, walk, apcs_disabled) = match user_walk {
            HostRoutine::Available if apcs_disabled.is_null() => {
                (HostRoutine::NotExported, ptr::null_mut(), ptr::null_mut())
            }
            HostRoutine::Available => (user_walk, walk, apcs_disabled),
            _ => (user_walk, ptr::null_mut(), ptr::null_mut()),
        };
        // SAFETY: as above (`RtlWalkFrameChain(Callers, Count, Flags)`, ntrtl.h).
        let walk_frame_chain = unsafe { routine(walk) };
        // SAFETY: as above (`KeAreApcsDisabled()`, wdm.h).
        let are_apcs_disabled = unsafe { routine(apcs_disabled) };
        let (process_key, create_time) =
            find_unless_stubbed(utf16!("PsGetProcessCreateTimeQuadPart"), wine);
        // SAFETY: as above (`PsGetProcessCreateTimeQuadPart(Process)`, ntifs.h).
        let process_create_time = unsafe { routine(create_time) };
        let (apc, insert) = find_unless_stubbed(utf16!("KeInsertQueueApc"), wine);
        let initialize = find(utf16!("KeInitializeApc"));
        let (apc, initialize, insert, remove) = match apc {
            HostRoutine::Available if initialize.is_null() => (
                HostRoutine::NotExported,
                ptr::null_mut(),
                ptr::null_mut(),
                ptr::null_mut(),
            ),
            HostRoutine::Available => (apc, initialize, insert, find(utf16!("KeRemoveQueueApc"))),
            _ => (apc, ptr::null_mut(), ptr::null_mut(), ptr::null_mut()),
        };
        // SAFETY: as above (the prototypes in the type aliases: the
        // kernel's, undocumented).
        let initialize_apc = unsafe { routine(initialize) };
        // SAFETY: as above.
        let insert_queue_apc = unsafe { routine(insert) };
        let apc_take_back = if remove.is_null() {
            HostRoutine::NotExported
        } else {
            HostRoutine::Available
        };
        // SAFETY: as above.
        let remove_queue_apc = unsafe { routine(remove) };
        Self {
            allocate_pool2,
            query_system_time,
            query_performance_counter,
            register_registry_callback,
            unregister_registry_callback,
            query_system_information,
            walk_frame_chain,
            user_walk,
            are_apcs_disabled,
            process_create_time,
            process_key,
            apc,
            initialize_apc,
            insert_queue_apc,
            remove_queue_apc,
            apc_take_back,
        }
    }
}
