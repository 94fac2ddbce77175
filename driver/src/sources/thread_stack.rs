//! Thread stacks on request (`Ioctl::CaptureThreads`): for each named
//! thread a special kernel APC, whose kernel routine captures the thread's
//! stack in the thread itself at `APC_LEVEL`.
//!
//! The bookkeeping (which slot is whose, what each request asked) is
//! kstack-driver-core's `thread_captures`; this file holds the kernel's
//! side: one `KAPC` per slot, the referenced thread each queued APC
//! targets, and the two routines the kernel may run for it (exactly one,
//! whenever the thread next allows it, possibly never).
//!
//! What keeps a queued APC safe:
//! - its thread is referenced (`PsLookupThreadByThreadId`) until one of its
//!   routines ran, so the thread the APC is queued on stays;
//! - kstack's device object is referenced too, and the routine drops that
//!   reference as its last call: the I/O manager does not unload a driver
//!   while one of its device objects is referenced, so the routines' code
//!   is there whenever the kernel calls them, also after `DriverUnload`;
//! - the slots and their `KAPC`s are a block of their own
//!   ([`ThreadStackSource::create`]), freed once no APC can run a routine
//!   any more: by unload, which waits (bounded) for that, or, when a thread
//!   does not let its APC run in time, by the last of those APCs' routines
//!   (`Retirement`), so no `KAPC` is ever in freed memory and nothing stays
//!   allocated for good.
//!
//! Residual window, as for any driver that drops the reference on its own
//! device last: the routine's epilogue after that call.

use core::{
    cell::UnsafeCell,
    ffi::c_void,
    ptr::{self, NonNull},
    sync::atomic::{AtomicPtr, Ordering},
};

use kstack_abi::{ThreadRequestOutcome, thread_capture::THREAD_CAPTURE_SLOTS};
use kstack_driver_core::thread_captures::{Retirement, Slot};
use wdk_sys::{
    DEVICE_OBJECT, KAPC, PETHREAD, PKNORMAL_ROUTINE, PVOID,
    ntddk::{ObfDereferenceObject, ObfReferenceObject, PsIsSystemThread, PsLookupThreadByThreadId},
};

use crate::{
    kernel::{self, KERNEL_MODE, id_to_handle},
    pool, recorder,
    routines::Routines,
};

/// How many APCs can be in flight at once.
const SLOTS: usize = THREAD_CAPTURE_SLOTS as usize;

/// `OriginalApcEnvironment` of `KAPC_ENVIRONMENT`: the thread's own
/// process, whatever it is attached to when the APC is delivered.
const ORIGINAL_APC_ENVIRONMENT: u32 = 0;

/// The kernel's side of the thread-capture slots. All-zero bytes are its
/// initial state (every KAPC not initialized, every slot free, no thread,
/// no device, nothing pending), so it is made in place in zeroed pool: at
/// about 32 KiB it is larger than a kernel stack.
#[repr(C)]
pub struct ThreadStackSource {
    /// One `KAPC` per slot, the kernel's while its APC is queued.
    apcs: [UnsafeCell<KAPC>; SLOTS],
    /// The referenced thread each queued APC targets (null when free).
    threads: [AtomicPtr<c_void>; SLOTS],
    /// The core's bookkeeping of the same slots.
    pub slots: [Slot; SLOTS],
    /// The APCs that may still run a routine, and who frees this block.
    pub retirement: Retirement,
    /// kstack's device object, referenced once per queued APC.
    device: AtomicPtr<DEVICE_OBJECT>,
}

// SAFETY: a `KAPC` is touched only by the request that armed its slot
// (before queueing it) and then by the kernel; the rest is atomics.
unsafe impl Sync for ThreadStackSource {}

impl ThreadStackSource {
    /// The source in a zeroed block of its own.
    ///
    /// Max IRQL: `PASSIVE_LEVEL` (`DriverEntry`).
    pub fn create(routines: &Routines) -> Option<&'static Self> {
        // SAFETY: all-zero bytes are a valid source (the type's docs); its
        // alignment is 8.
        let block = unsafe { pool::allocate_zeroed::<Self>(routines, pool::TAG_APCS) }?;
        // SAFETY: made above, freed only by `free` once nothing uses it.
        Some(unsafe { block.as_ref() })
    }

    /// Frees the block.
    ///
    /// # Safety
    /// No APC is queued and nothing uses the source any more.
    ///
    /// Max IRQL: `APC_LEVEL`.
    pub unsafe fn free(&self) {
        // SAFETY: the block came from `create` (the caller's contract).
        unsafe { pool::free(NonNull::from(self).cast(), pool::TAG_APCS) };
    }

    /// Whether an APC may still run a routine.
    ///
    /// Max IRQL: any.
    pub fn pending(&self) -> bool {
        self.retirement.pending() != 0
    }

    /// Unload is done with the source: frees it now if no APC is pending,
    /// else leaves it to the last APC's routine.
    ///
    /// # Safety
    /// No request can queue an APC any more, and the caller touches the
    /// source no more.
    ///
    /// Max IRQL: `PASSIVE_LEVEL`.
    pub unsafe fn retire(&self) {
        if self.retirement.abandon() {
            // SAFETY: nothing pending, and the caller is done with it.
            unsafe { self.free() };
        }
    }
    /// The device the APCs keep referenced, once it exists.
    ///
    /// Max IRQL: `PASSIVE_LEVEL`.
    pub fn set_device(&self, device: *mut DEVICE_OBJECT) {
        self.device.store(device, Ordering::Release);
    }

    /// Queues the APC of slot `index` (armed by the core) to thread
    /// `thread_id`, with the references it needs.
    ///
    /// # Errors
    /// The outcome to report for the id when no APC was queued.
    ///
    /// Max IRQL: `PASSIVE_LEVEL` (requests run there;
    /// `PsLookupThreadByThreadId` allows `APC_LEVEL`).
    pub fn queue(
        &self,
        routines: &Routines,
        thread_id: u32,
        index: usize,
    ) -> Result<(), ThreadRequestOutcome> {
        let (Some(initialize), Some(insert)) = (routines.initialize_apc, routines.insert_queue_apc)
        else {
            return Err(ThreadRequestOutcome::NotQueued);
        };
        let device = self.device.load(Ordering::Acquire);
        if device.is_null() {
            return Err(ThreadRequestOutcome::NotQueued);
        }
        let mut thread: PETHREAD = ptr::null_mut();
        // SAFETY: writes a referenced thread to `thread` on success.
        if unsafe { PsLookupThreadByThreadId(id_to_handle(thread_id), &raw mut thread) } < 0 {
            return Err(ThreadRequestOutcome::NoSuchThread);
        }
        // SAFETY: `thread` is a valid, referenced thread.
        if unsafe { PsIsSystemThread(thread) } != 0 {
            // SAFETY: the reference taken just above.
            unsafe { ObfDereferenceObject(thread.cast()) };
            return Err(ThreadRequestOutcome::SystemThread);
        }
        // SAFETY: kstack's own device object, alive while the driver is.
        unsafe { ObfReferenceObject(device.cast()) };
        self.retirement.queued();
        self.threads[index].store(thread.cast(), Ordering::Relaxed);
        let apc = self.apcs[index].get();
        // A special kernel APC (no normal routine) in kernel mode, whose
        // routines stay loaded by the device reference, context this source.
        // SAFETY: the slot is this request's (armed, not queued): no one else
        // touches its KAPC; every argument is as KeInitializeApc takes it.
        unsafe {
            initialize(
                apc,
                thread,
                ORIGINAL_APC_ENVIRONMENT,
                on_apc,
                Some(on_rundown),
                None,
                KERNEL_MODE,
                ptr::from_ref(self).cast_mut().cast(),
            );
        }
        // SAFETY: the KAPC was initialized above; the slot's index travels
        // as the first system argument.
        let queued = unsafe { insert(apc, ptr::without_provenance_mut(index), ptr::null_mut(), 0) };
        if queued == 0 {
            // Unload waits for requests to leave before it can abandon
            // the block, so this is never the one to free it.
            let _ = self.retirement.done();
            self.threads[index].store(ptr::null_mut(), Ordering::Relaxed);
            // SAFETY: the thread's reference taken above, for an APC that
            // will never run.
            unsafe { ObfDereferenceObject(thread.cast()) };
            // SAFETY: as above, the device's.
            unsafe { ObfDereferenceObject(device.cast()) };
            return Err(ThreadRequestOutcome::NotQueued);
        }
        Ok(())
    }

    /// The end of a queued APC, whichever routine ran (its capture or its
    /// count done): frees the slot, frees the block too when unload gave up
    /// on it and this was the last APC, then drops the thread's reference,
    /// then the device's, last. Nothing of `self` is touched after the slot
    /// is freed: unload may free the block then.
    ///
    /// # Safety
    /// Called once per queued APC, by its routine, with its slot's index.
    ///
    /// Max IRQL: `APC_LEVEL`.
    unsafe fn finish(&self, index: usize) {
        let thread = self.threads[index].swap(ptr::null_mut(), Ordering::Relaxed);
        let device = self.device.load(Ordering::Acquire);
        self.slots[index].release();
        if self.retirement.done() {
            // SAFETY: unload abandoned the block and this was its last
            // user; nothing touches it after.
            unsafe { self.free() };
        }
        // SAFETY: the reference `queue` took for this APC.
        unsafe { ObfDereferenceObject(thread) };
        // SAFETY: as above; the last thing this routine does in kstack.
        unsafe { ObfDereferenceObject(device.cast()) };
    }
}

/// The source and slot an APC belongs to, from the context and the first
/// system argument `queue` gave it.
///
/// # Safety
/// `context` and `argument` are an APC's, as `queue` set them.
unsafe fn owner<'a>(context: PVOID, argument: PVOID) -> (&'a ThreadStackSource, usize) {
    // SAFETY: the caller's contract: `context` is the source, which lives
    // until no APC is in flight.
    (
        unsafe { &*context.cast::<ThreadStackSource>() },
        argument.addr(),
    )
}

/// The kernel routine: in the target thread at `APC_LEVEL`, captures its
/// stack as the thread-stack source's event, then finishes the APC.
///
/// # Safety
/// Called by the kernel once, for an APC `ThreadStackSource::queue` queued.
///
/// Max IRQL: `APC_LEVEL`.
unsafe extern "system" fn on_apc(
    _apc: *mut KAPC,
    _normal_routine: *mut PKNORMAL_ROUTINE,
    normal_context: *mut PVOID,
    system_argument1: *mut PVOID,
    _system_argument2: *mut PVOID,
) {
    // SAFETY: the kernel passes pointers to the APC's own context.
    let context = unsafe { *normal_context };
    // SAFETY: as above, to its first system argument.
    let argument = unsafe { *system_argument1 };
    // SAFETY: both as `queue` set them.
    let (source, index) = unsafe { owner(context, argument) };
    recorder::capture_thread(index);
    // SAFETY: once for this APC, after its capture.
    unsafe { source.finish(index) };
}

/// The rundown routine: the thread exits with the APC still queued (at
/// `PASSIVE_LEVEL`, in the exiting thread); counts it and finishes the APC.
///
/// # Safety
/// Called by the kernel once, for an APC `ThreadStackSource::queue` queued.
///
/// Max IRQL: `PASSIVE_LEVEL`.
unsafe extern "system" fn on_rundown(apc: *mut KAPC) {
    let (context, argument) = kernel::apc_context(apc);
    // SAFETY: the APC's context and first argument, as `queue` set them.
    let (source, index) = unsafe { owner(context, argument) };
    recorder::thread_run_down();
    // SAFETY: once for this APC.
    unsafe { source.finish(index) };
}
