//! The thin layer over raw kernel structures: the only place that reads or
//! writes fields of WDK structs (but `UNICODE_STRING`, in `unicode`).
//!
//! On Linux the bindings come from mingw-w64 headers, which are older than
//! the WDK and not identical to it. Every field touched here is pinned below
//! to its offset in the real WDK (x64), so a header difference fails the
//! build instead of corrupting memory.

use core::{
    mem::{offset_of, size_of},
    ptr,
};

use kstack_abi::DriverImage;
use kstack_driver_core::{Platform, UserThread, UserWalkFailure, kernel_stack};

use wdk_sys::{
    DEVICE_OBJECT, DRIVER_OBJECT, HANDLE, IMAGE_INFO, IO_STACK_LOCATION, IRP, KAPC, LARGE_INTEGER,
    NTSTATUS, OB_PRE_OPERATION_INFORMATION, PEPROCESS, POBJECT_TYPE, PS_CREATE_NOTIFY_INFO,
    ntddk::{
        IoGetStackLimits, IoIs32bitProcess, IofCompleteRequest, KeGetCurrentProcessorNumberEx,
        KeQueryActiveProcessorCountEx, ObfDereferenceObject, PsGetCurrentProcessId,
        PsGetCurrentThreadId, PsIsSystemThread, PsLookupProcessByProcessId,
        RtlCaptureStackBackTrace,
    },
};

use crate::{fault_scope, routines::Routines};

// WDK x64 offsets of every field this module touches. Field paths only:
// bindgen's names for anonymous types differ between header sets.
const _: () = {
    assert!(offset_of!(DRIVER_OBJECT, DriverStart) == 0x18);
    assert!(offset_of!(DRIVER_OBJECT, DriverSize) == 0x20);
    assert!(offset_of!(DRIVER_OBJECT, DriverUnload) == 0x68);
    assert!(offset_of!(DRIVER_OBJECT, MajorFunction) == 0x70);
    assert!(offset_of!(DEVICE_OBJECT, Flags) == 0x30);
    assert!(offset_of!(IRP, AssociatedIrp) == 0x18);
    assert!(offset_of!(IRP, IoStatus) == 0x30);
    assert!(offset_of!(IRP, RequestorMode) == 0x40);
    assert!(
        offset_of!(
            IRP,
            Tail.Overlay
                .__bindgen_anon_2
                .__bindgen_anon_1
                .CurrentStackLocation
        ) == 0xB8
    );
    assert!(size_of::<IRP>() == 0xD0);
    assert!(offset_of!(IO_STACK_LOCATION, MajorFunction) == 0);
    assert!(
        offset_of!(
            IO_STACK_LOCATION,
            Parameters.DeviceIoControl.OutputBufferLength
        ) == 0x08
    );
    assert!(
        offset_of!(
            IO_STACK_LOCATION,
            Parameters.DeviceIoControl.InputBufferLength
        ) == 0x10
    );
    assert!(offset_of!(IO_STACK_LOCATION, Parameters.DeviceIoControl.IoControlCode) == 0x18);
    assert!(size_of::<IO_STACK_LOCATION>() == 0x48);
    assert!(offset_of!(PS_CREATE_NOTIFY_INFO, ParentProcessId) == 0x10);
    assert!(offset_of!(IMAGE_INFO, ImageBase) == 0x08);
    assert!(offset_of!(IMAGE_INFO, ImageSize) == 0x18);
    assert!(offset_of!(OB_PRE_OPERATION_INFORMATION, Operation) == 0);
    assert!(offset_of!(OB_PRE_OPERATION_INFORMATION, Object) == 0x08);
    assert!(offset_of!(OB_PRE_OPERATION_INFORMATION, ObjectType) == 0x10);
    assert!(offset_of!(OB_PRE_OPERATION_INFORMATION, Parameters) == 0x20);
    // The thread-stack source's slots embed KAPCs the kernel fills in.
    assert!(size_of::<KAPC>() == 0x58);
};

// ntoskrnl's object types are data exports. They are imported as the WDK
// declares them (a data import, through the import table; present on every
// supported Windows and in Wine), not looked up with
// `MmGetSystemRoutineAddress`, which is documented for routines.
#[link(name = "ntoskrnl", kind = "dylib")]
unsafe extern "C" {
    /// The kernel's variable holding the process object type.
    #[link_name = "PsProcessType"]
    static PROCESS_TYPE: POBJECT_TYPE;
    /// The kernel's variable holding the thread object type.
    #[link_name = "PsThreadType"]
    static THREAD_TYPE: POBJECT_TYPE;
}

// Routines the mingw-w64 headers do not declare (the WDK's wdm.h and
// ntddk.h do; both are ntoskrnl exports on every supported Windows).
#[link(name = "ntoskrnl", kind = "dylib")]
unsafe extern "system" {
    /// `PsGetCurrentThread()`: the current thread, not referenced.
    fn PsGetCurrentThread() -> wdk_sys::PETHREAD;
    /// `KeIsAttachedProcess()`: whether the current thread is attached to
    /// another process's address space.
    fn KeIsAttachedProcess() -> wdk_sys::BOOLEAN;
}

/// `RtlWalkFrameChain`'s flag for the user-mode stack (ntrtl.h).
const RTL_WALK_USER_MODE_STACK: u32 = 1;

/// Which kernel object type.
#[derive(Clone, Copy)]
pub enum ObjectType {
    Process,
    Thread,
}

impl ObjectType {
    /// The kernel's variable for this type, as `ObRegisterCallbacks`'
    /// `OB_OPERATION_REGISTRATION::ObjectType` takes it (the WDK's
    /// `PsProcessType` / `PsThreadType`).
    ///
    /// Max IRQL: any.
    pub fn variable(self) -> *mut POBJECT_TYPE {
        match self {
            Self::Process => (&raw const PROCESS_TYPE).cast_mut(),
            Self::Thread => (&raw const THREAD_TYPE).cast_mut(),
        }
    }

    /// The type itself, as an object's `ObjectType` holds it.
    ///
    /// Max IRQL: any.
    pub fn get(self) -> POBJECT_TYPE {
        // SAFETY: the kernel sets its object-type variables while it boots,
        // before any driver loads, and never changes them.
        unsafe { self.variable().read() }
    }
}

/// `KernelMode` as the `KPROCESSOR_MODE` that wait and handle routines take.
pub const KERNEL_MODE: wdk_sys::KPROCESSOR_MODE = 0;
const _: () = assert!(wdk_sys::_MODE::KernelMode == 0);

/// A kernel handle that holds a process or thread id.
///
/// Max IRQL: any.
pub fn handle_to_id(handle: HANDLE) -> u32 {
    u32::try_from(handle as usize).unwrap_or(u32::MAX)
}

/// The kernel handle that holds id `id` (a process or thread id).
///
/// Max IRQL: any.
pub fn id_to_handle(id: u32) -> HANDLE {
    ptr::without_provenance_mut(id as usize)
}

/// The creation time of `process` (`PsGetProcessCreateTimeQuadPart`), the
/// key that tells a reused process id apart; 0 when the host cannot say.
///
/// Max IRQL: `DISPATCH_LEVEL` (the callers run at `PASSIVE_LEVEL`).
pub fn process_key(routines: &Routines, process: PEPROCESS) -> u64 {
    let Some(create_time) = routines.process_create_time else {
        return 0;
    };
    if process.is_null() {
        return 0;
    }
    // SAFETY: set only when implemented (`Routines::resolve`); `process` is
    // a process object the caller holds for the call.
    let time = unsafe { create_time(process) };
    u64::try_from(time).unwrap_or(0)
}

/// [`process_key`] of the process with id `process_id`, looked up and
/// released; 0 for id 0 (the system's drivers), when the host cannot say,
/// or when no such process exists any more.
///
/// Max IRQL: `PASSIVE_LEVEL`.
pub fn process_key_by_id(routines: &Routines, process_id: HANDLE) -> u64 {
    if routines.process_create_time.is_none() || process_id.is_null() {
        return 0;
    }
    let mut process: PEPROCESS = core::ptr::null_mut();
    // SAFETY: `process` receives a referenced process on success, released
    // below.
    if unsafe { PsLookupProcessByProcessId(process_id, &raw mut process) } < 0 {
        return 0;
    }
    let key = process_key(routines, process);
    // SAFETY: the reference PsLookupProcessByProcessId took.
    unsafe { ObfDereferenceObject(process.cast()) };
    key
}

/// The current IRQL: on x64 it is CR8, which is what the WDK's inline
/// `KeGetCurrentIrql` reads (ntoskrnl does not export it on x64).
///
/// Max IRQL: any.
pub fn current_irql() -> u8 {
    let cr8: u64;
    // SAFETY: reading CR8 is allowed at CPL 0, has no side effects, and
    // touches no memory.
    unsafe {
        core::arch::asm!("mov {}, cr8", out(reg) cr8, options(nomem, nostack, preserves_flags));
    }
    u8::try_from(cr8 & 0xF).unwrap_or(u8::MAX)
}

/// The processors active now, in every processor group: one ring shard
/// each (exported by Windows 7 and later, and by Wine).
///
/// Max IRQL: any.
pub fn active_processor_count() -> u32 {
    // The routine takes a USHORT; the bindings give the constant as a u32.
    const _: () = assert!(wdk_sys::ALL_PROCESSOR_GROUPS == 0xFFFF);
    #[expect(clippy::cast_possible_truncation, reason = "0xFFFF fits a u16")]
    const ALL_PROCESSOR_GROUPS: u16 = wdk_sys::ALL_PROCESSOR_GROUPS as u16;
    // SAFETY: takes a group number and returns a count; callable at any
    // IRQL.
    unsafe { KeQueryActiveProcessorCountEx(ALL_PROCESSOR_GROUPS) }
}

/// Where the I/O manager loaded this driver's image.
///
/// Max IRQL: any.
pub fn driver_image(driver: &DRIVER_OBJECT) -> DriverImage {
    DriverImage {
        base: driver.DriverStart as u64,
        size: driver.DriverSize,
    }
}

/// `DISPATCH_LEVEL`.
const DISPATCH_LEVEL: u8 = 2;
const _: () = assert!(wdk_sys::DISPATCH_LEVEL == 2);

/// Sets the IRQL: on x64 it is CR8, which is what the WDK's inline
/// `KeRaiseIrql` and `KeLowerIrql` write (ntoskrnl exports neither there).
///
/// # Safety
/// Raising: the caller lowers back to what it read before returning.
/// Lowering: only to the IRQL the caller raised from.
///
/// Max IRQL: any.
unsafe fn set_irql(irql: u8) {
    // SAFETY: at CPL 0 writing CR8 sets the task priority; the caller keeps
    // raise and lower paired. It touches no memory.
    unsafe {
        core::arch::asm!("mov cr8, {}", in(reg) u64::from(irql), options(nomem, nostack, preserves_flags));
    }
}

/// The processor the caller runs on (its number across all groups).
///
/// Max IRQL: any.
fn current_processor() -> u32 {
    // SAFETY: a null PROCESSOR_NUMBER pointer is allowed; any IRQL.
    unsafe { KeGetCurrentProcessorNumberEx(core::ptr::null_mut()) }
}

/// The system time, or 0 when no routine was found.
///
/// Max IRQL: any.
fn system_time(routines: &Routines) -> u64 {
    let Some(query) = routines.query_system_time else {
        return 0;
    };
    let mut time = LARGE_INTEGER::default();
    // SAFETY: the routine writes one LARGE_INTEGER; callable at any IRQL.
    unsafe { query(&raw mut time) };
    // SAFETY: QuadPart is the whole value of the union.
    u64::try_from(unsafe { time.QuadPart }).unwrap_or(0)
}

/// The record clock (`kstack_abi::RecordHeader::timestamp`): the system
/// time at load plus the performance counter's time since, in 100 ns
/// units. Monotonic where the system time is not: a clock change after
/// load does not move it.
#[derive(Clone, Copy)]
pub struct Clock {
    system_at_start: u64,
    counter_at_start: i64,
    /// Counts per second (0: no performance counter; the system time is
    /// used as it is).
    frequency: i64,
}

impl Clock {
    /// Starts the clock now.
    ///
    /// Max IRQL: any (called in `DriverEntry`).
    pub fn start(routines: &Routines) -> Self {
        let mut frequency = LARGE_INTEGER::default();
        let counter_at_start = routines.query_performance_counter.map_or(0, |query| {
            // SAFETY: the routine writes the frequency; any IRQL.
            unsafe { query(&raw mut frequency) }
        });
        Self {
            system_at_start: system_time(routines),
            counter_at_start,
            // SAFETY: QuadPart is the whole value of the union.
            frequency: unsafe { frequency.QuadPart }.max(0),
        }
    }

    /// The time now.
    ///
    /// Max IRQL: any.
    fn now(&self, routines: &Routines) -> u64 {
        let Some(query) = routines
            .query_performance_counter
            .filter(|_| self.frequency > 0)
        else {
            return system_time(routines);
        };
        // SAFETY: a null frequency pointer is allowed; any IRQL.
        let counter = unsafe { query(core::ptr::null_mut()) };
        let ticks = u128::try_from(counter.saturating_sub(self.counter_at_start)).unwrap_or(0);
        let elapsed = if self.frequency == 10_000_000 {
            ticks
        } else {
            ticks * 10_000_000 / u128::from(self.frequency.unsigned_abs())
        };
        self.system_at_start
            .saturating_add(u64::try_from(elapsed).unwrap_or(u64::MAX))
    }
}

/// The kernel as kstack-driver-core's capture sees it.
pub struct KernelPlatform<'a> {
    pub routines: &'a Routines,
    pub clock: &'a Clock,
}

impl Platform for KernelPlatform<'_> {
    fn irql(&self) -> u8 {
        current_irql()
    }

    fn current_ids(&self) -> (u32, u32) {
        // SAFETY: callable at any IRQL; returns the current ids.
        let process = unsafe { PsGetCurrentProcessId() };
        // SAFETY: as above.
        let thread = unsafe { PsGetCurrentThreadId() };
        (handle_to_id(process), handle_to_id(thread))
    }

    fn processor(&self) -> u32 {
        current_processor()
    }

    fn at_dispatch<R>(&self, section: impl FnOnce(u32) -> R) -> R {
        let irql = current_irql();
        if irql >= DISPATCH_LEVEL {
            return section(current_processor());
        }
        // SAFETY: lowered back to `irql` below, before returning; panics
        // abort, so nothing returns in between.
        unsafe { set_irql(DISPATCH_LEVEL) };
        // Read after raising: the thread cannot move any more.
        let result = section(current_processor());
        // SAFETY: back to the IRQL read above, which this function raised from.
        unsafe { set_irql(irql) };
        result
    }

    fn timestamp(&self) -> u64 {
        self.clock.now(self.routines)
    }

    #[inline(never)]
    fn remaining_stack(&self) -> usize {
        // What the WDK's inline IoGetRemainingStackSize computes (Wine 8
        // does not export that name): from a local of this frame down to
        // the current stack's low limit; nothing when the limits are
        // unknown or do not hold this frame.
        let mut low = 0_u64;
        let mut high = 0_u64;
        // SAFETY: writes the two limits; callable at any IRQL since
        // Windows Server 2003 SP1.
        unsafe { IoGetStackLimits(&raw mut low, &raw mut high) };
        let here = (&raw const low).addr() as u64;
        kernel_stack::remaining_below(here, low, high)
    }

    #[inline(never)]
    fn walk_stack(&self, frames_to_skip: u32, frames: &mut [u64]) -> (usize, u32) {
        let mut hash = 0_u32;
        let wanted = u32::try_from(frames.len()).unwrap_or(u32::MAX);
        // SAFETY: `frames` holds `wanted` pointer-sized slots (u64 on x64);
        // the walk writes at most that many and the hash once. The caller
        // has checked the IRQL against the paging policy.
        let captured = unsafe {
            RtlCaptureStackBackTrace(
                frames_to_skip,
                wanted,
                frames.as_mut_ptr().cast(),
                &raw mut hash,
            )
        };
        (usize::from(captured), hash)
    }

    fn user_thread(&self) -> UserThread {
        // SAFETY: any IRQL; the current thread, not referenced.
        let thread = unsafe { PsGetCurrentThread() };
        // SAFETY: `thread` is the current thread, alive while it runs this.
        let system = unsafe { PsIsSystemThread(thread) } != 0;
        // SAFETY: any IRQL; reads the current thread's state.
        let attached = unsafe { KeIsAttachedProcess() } != 0;
        // SAFETY: a null IRP asks about the current process (PASSIVE_LEVEL
        // or APC_LEVEL, which the caller ensures: below DISPATCH_LEVEL).
        let wow64 = unsafe { IoIs32bitProcess(core::ptr::null_mut()) } != 0;
        // Set whenever the user walk is Available, the only case the core
        // asks in (see `Routines::resolve`); without it, assume the worst.
        let critical_region = self.routines.are_apcs_disabled.is_none_or(|disabled| {
            // SAFETY: at most DISPATCH_LEVEL (the caller is below it); reads
            // the current thread's APC-disable counts.
            let disabled = unsafe { disabled() };
            disabled != 0
        });
        UserThread {
            system,
            attached,
            wow64,
            critical_region,
        }
    }

    #[inline(never)]
    fn walk_user_stack(&self, frames: &mut [u64]) -> Result<usize, UserWalkFailure> {
        // Set whenever the user walk is Available, the only case the core
        // calls this in (see `Routines::resolve`).
        let walk = self
            .routines
            .walk_frame_chain
            .ok_or(UserWalkFailure::NoStack)?;
        let wanted = u32::try_from(frames.len()).unwrap_or(u32::MAX);
        // SAFETY: `frames` has `wanted` slots, the walk writes at most that
        // many; below DISPATCH_LEVEL, own user stack mapped (the caller's
        // checks); a fault on the user stack is caught by the scope.
        let walked = unsafe {
            fault_scope::guarded_walk_on_own_stack(
                walk,
                frames.as_mut_ptr().cast(),
                wanted,
                RTL_WALK_USER_MODE_STACK,
            )
        }?;
        Ok(usize::try_from(walked).unwrap_or(usize::MAX))
    }
}

/// What a device-control request carries, read once from its IRP.
pub struct DeviceControl {
    /// The control code.
    pub code: u32,
    /// The METHOD_BUFFERED system buffer: input on entry, output on return.
    pub system_buffer: *mut u8,
    /// Input length in bytes.
    pub input_length: usize,
    /// Output length in bytes.
    pub output_length: usize,
}

/// The major function, the file object the request came on (its address:
/// the reader, see `kstack_driver_core::Caller`) and, for device control,
/// the request parameters.
///
/// # Safety
/// `irp` is a valid IRP the I/O manager passed to this driver's dispatch
/// routine, with its current stack location set.
///
/// Max IRQL: `DISPATCH_LEVEL` (dispatch routines run at `PASSIVE_LEVEL`).
pub unsafe fn current_request(irp: *mut IRP) -> (u8, u64, Option<DeviceControl>) {
    // SAFETY: the caller passes a valid IRP that this driver owns while it
    // dispatches it.
    let irp = unsafe { &*irp };
    // SAFETY: while a driver dispatches an IRP, Tail.Overlay is the active
    // member of the Tail union.
    let overlay = unsafe { &irp.Tail.Overlay };
    // SAFETY: CurrentStackLocation is the active member while dispatched.
    let stack = unsafe {
        overlay
            .__bindgen_anon_2
            .__bindgen_anon_1
            .CurrentStackLocation
    };
    // SAFETY: the I/O manager set this driver's stack location before calling.
    let stack = unsafe { &*stack };
    let file_object = stack.FileObject as u64;
    if u32::from(stack.MajorFunction) != wdk_sys::IRP_MJ_DEVICE_CONTROL {
        return (stack.MajorFunction, file_object, None);
    }
    // SAFETY: for IRP_MJ_DEVICE_CONTROL the DeviceIoControl parameters are
    // the active member of the Parameters union.
    let parameters = unsafe { stack.Parameters.DeviceIoControl };
    // SAFETY: for METHOD_BUFFERED requests SystemBuffer is the active member
    // of AssociatedIrp (null when both lengths are zero).
    let system_buffer = unsafe { irp.AssociatedIrp.SystemBuffer };
    let control = DeviceControl {
        code: parameters.IoControlCode,
        system_buffer: system_buffer.cast(),
        input_length: parameters.InputBufferLength as usize,
        output_length: parameters.OutputBufferLength as usize,
    };
    (stack.MajorFunction, file_object, Some(control))
}

/// Completes `irp` with `status`, reporting `information` bytes written.
///
/// # Safety
/// `irp` is a valid IRP owned by this driver and not yet completed.
///
/// Max IRQL: `DISPATCH_LEVEL`.
pub unsafe fn complete_request(irp: *mut IRP, status: NTSTATUS, information: usize) -> NTSTATUS {
    // SAFETY: the caller owns the IRP until it is completed below.
    let irp_fields = unsafe { &mut *irp };
    irp_fields.IoStatus.__bindgen_anon_1.Status = status;
    irp_fields.IoStatus.Information = information as u64;
    // SAFETY: the IRP is owned by this driver and completed exactly once.
    unsafe { IofCompleteRequest(irp, 0) };
    status
}
