//! Thread stacks on request (`Ioctl::CaptureThreads`): for each named
//! thread a special kernel APC, whose kernel routine captures the thread's
//! stack in the thread itself at `APC_LEVEL`.
//!
//! The bookkeeping (which slot is whose, what each request asked) is
//! kstack-driver-core's `thread_captures`; this file holds the kernel's
//! side: one `KAPC` per slot, the referenced thread each queued APC
//! targets, and the routines the kernel runs for it.
//!
//! How the kernel runs a special kernel APC (ReactOS `ntoskrnl/ke/apc.c`,
//! the WRK's `ke/apcobj.c` and `ke/apcsup.c`; docs/real-kernel.md):
//! - `KeInitializeApc` with no normal routine makes it kernel mode and sets
//!   its normal context to NULL, whatever the caller passed. So a routine
//!   finds its slot from the `KAPC`'s own address, which lies inside its
//!   [`ApcSlot`] (`CONTAINING_RECORD`, as System Informer does), never from
//!   the context.
//! - `KiDeliverApc` takes the APC off the queue, then calls the kernel
//!   routine at `APC_LEVEL` in the thread, inside a critical region too
//!   (not inside a guarded region).
//! - A thread that exits with it queued takes it in its exit path
//!   (`PspExitThread`): rundown routines are for the user-mode queue, so
//!   [`kstack_apc_rundown_routine`] is a defensive path no known kernel
//!   takes.
//!
//! What keeps a queued APC safe:
//! - its thread is referenced (`PsLookupThreadByThreadId`) until one of its
//!   routines ran, so the thread the APC is queued on stays;
//! - kstack's device object is referenced too, which keeps the device, its
//!   driver object and so kstack.sys mapped after `DriverUnload` until that
//!   reference is dropped. The routines drop it last, by a tail jump into
//!   `ObfDereferenceObject` from assembly: when that deletes the device and
//!   unmaps the image, before it returns at `PASSIVE_LEVEL` or on a worker
//!   thread at once at `APC_LEVEL`, it returns into the kernel's APC
//!   dispatcher, not into kstack;
//! - unload takes back the APCs still queued (`KeRemoveQueueApc`) and waits,
//!   bounded, for those being delivered; the slots and their `KAPC`s are a
//!   block of their own ([`ThreadStackSource::create`]), freed by unload
//!   or, when a delivery outlasts that wait, by the last of those APCs'
//!   routines (`Retirement`), so no `KAPC` is ever in freed memory and
//!   nothing stays allocated for good.

use core::{
    cell::UnsafeCell,
    ffi::c_void,
    mem::{offset_of, size_of},
    ptr::{self, NonNull},
    sync::atomic::{AtomicPtr, AtomicUsize, Ordering},
};

use kstack_abi::{ThreadRequestOutcome, thread_capture::THREAD_CAPTURE_SLOTS};
use kstack_driver_core::thread_captures::{Retirement, Slot};
use wdk_sys::{
    DEVICE_OBJECT, KAPC, PETHREAD,
    ntddk::{ObfDereferenceObject, ObfReferenceObject, PsIsSystemThread, PsLookupThreadByThreadId},
};

use crate::{
    kernel::{KERNEL_MODE, id_to_handle},
    pool, recorder,
    routines::Routines,
};

/// How many APCs can be in flight at once.
const SLOTS: usize = THREAD_CAPTURE_SLOTS as usize;

/// `OriginalApcEnvironment` of `KAPC_ENVIRONMENT`: the thread's own
/// process, whatever it is attached to when the APC is delivered.
const ORIGINAL_APC_ENVIRONMENT: u32 = 0;

/// One slot's `KAPC` and what its routines need: the `KAPC` first, so the
/// address the kernel passes them is the slot's.
#[repr(C)]
struct ApcSlot {
    /// The kernel's while its APC is queued.
    apc: UnsafeCell<KAPC>,
    /// The referenced thread the queued APC targets (null when free).
    thread: AtomicPtr<c_void>,
    /// This slot's index, written at creation.
    index: AtomicUsize,
}

/// The kernel's side of the thread-capture slots. All-zero bytes are its
/// initial state but for the slots' indexes (every KAPC not initialized,
/// every slot free, no thread, no device, nothing pending), so it is made
/// in place in zeroed pool: at about 34 KiB it is larger than a kernel
/// stack.
#[repr(C)]
pub struct ThreadStackSource {
    /// One `KAPC` per slot, with its thread and index.
    apcs: [ApcSlot; SLOTS],
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
        let source = unsafe { block.as_ref() };
        for (index, slot) in source.apcs.iter().enumerate() {
            slot.index.store(index, Ordering::Relaxed);
        }
        Some(source)
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

    /// The `KAPC` of slot `index`, as a pointer into the whole source, so
    /// a routine can step back from it to the source.
    ///
    /// Max IRQL: any.
    fn apc(&self, index: usize) -> *mut KAPC {
        ptr::from_ref(self)
            .wrapping_byte_add(offset_of!(Self, apcs) + index * size_of::<ApcSlot>())
            .cast_mut()
            .cast()
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
        self.apcs[index]
            .thread
            .store(thread.cast(), Ordering::Relaxed);
        let apc = self.apc(index);
        // A special kernel APC: no normal routine, so kernel mode and no
        // context (the kernel would drop one); the routines find their slot
        // from `apc`.
        // SAFETY: the slot is this request's (armed, not queued): no one else
        // touches its KAPC; every argument is as KeInitializeApc takes it.
        unsafe {
            initialize(
                apc,
                thread,
                ORIGINAL_APC_ENVIRONMENT,
                kstack_apc_kernel_routine,
                Some(kstack_apc_rundown_routine),
                None,
                KERNEL_MODE,
                ptr::null_mut(),
            );
        }
        // SAFETY: the KAPC was initialized above.
        let queued = unsafe { insert(apc, ptr::null_mut(), ptr::null_mut(), 0) };
        if queued == 0 {
            // Unload waits for requests to leave before it can abandon
            // the block, so this is never the one to free it.
            let _ = self.retirement.done();
            self.apcs[index]
                .thread
                .store(ptr::null_mut(), Ordering::Relaxed);
            // SAFETY: the thread's reference taken above, for an APC that
            // will never run.
            unsafe { ObfDereferenceObject(thread.cast()) };
            // SAFETY: as above, the device's.
            unsafe { ObfDereferenceObject(device.cast()) };
            return Err(ThreadRequestOutcome::NotQueued);
        }
        Ok(())
    }

    /// Unload takes back every APC still queued (`KeRemoveQueueApc`), so
    /// none runs after it: each taken back is finished here, its slot
    /// freed and its references dropped. An APC the kernel has already
    /// taken off the queue for delivery is not taken back: its routine
    /// finishes it. Without `KeRemoveQueueApc` nothing is taken back.
    ///
    /// `KeRemoveQueueApc` locks the APC's thread, so that thread must stay
    /// while it runs, even if the APC's routine finishes meanwhile on
    /// another processor and the thread exits: unload first claims the
    /// slot's thread reference (a routine that finishes after that finds
    /// none to drop) and drops it only after the call.
    ///
    /// The device references dropped here are never the last: the I/O
    /// manager keeps its own on the driver object until `DriverUnload`
    /// returns, so kstack.sys stays mapped through this.
    ///
    /// # Safety
    /// No request can queue an APC any more.
    ///
    /// Max IRQL: `PASSIVE_LEVEL`.
    pub unsafe fn take_back(&self, routines: &Routines) {
        let Some(remove) = routines.remove_queue_apc else {
            return;
        };
        for index in 0..SLOTS {
            let thread = self.apcs[index]
                .thread
                .swap(ptr::null_mut(), Ordering::AcqRel);
            if thread.is_null() {
                continue;
            }
            // SAFETY: the slot's KAPC was initialized by `queue`, and its
            // thread is held by the reference just claimed; the kernel
            // removes the APC only if it is still queued.
            if unsafe { remove(self.apc(index)) } != 0 {
                // SAFETY: taken back: no routine will run for this APC.
                let device = unsafe { self.finish(index) };
                // SAFETY: its device reference, not the last (see above).
                unsafe { ObfDereferenceObject(device.cast()) };
            }
            // SAFETY: the thread reference `queue` took, claimed above.
            unsafe { ObfDereferenceObject(thread) };
        }
    }

    /// The end of a queued APC, whichever routine ran (its capture or its
    /// count done) or unload took it back: frees the slot, frees the block
    /// too when unload gave up on it and this was the last APC, then drops
    /// the thread's reference unless unload has claimed it. Nothing of
    /// `self` is touched after the slot is freed: unload may free the block
    /// then. Returns the device, whose reference the caller drops last.
    ///
    /// # Safety
    /// Called once per queued APC, with its slot's index.
    ///
    /// Max IRQL: `APC_LEVEL`.
    unsafe fn finish(&self, index: usize) -> *mut DEVICE_OBJECT {
        let thread = self.apcs[index]
            .thread
            .swap(ptr::null_mut(), Ordering::AcqRel);
        let device = self.device.load(Ordering::Acquire);
        self.slots[index].release();
        if self.retirement.done() {
            // SAFETY: unload abandoned the block and this was its last
            // user; nothing touches it after.
            unsafe { self.free() };
        }
        if !thread.is_null() {
            // SAFETY: the reference `queue` took for this APC, not claimed
            // by unload.
            unsafe { ObfDereferenceObject(thread) };
        }
        device
    }
}

/// The source and slot index a queued APC belongs to, from the `KAPC`'s
/// own address (`CONTAINING_RECORD`: the `KAPC` is its [`ApcSlot`]'s first
/// field, the slots the source's first).
///
/// # Safety
/// `apc` is the `KAPC` of a slot of a live source, as `queue` gave it to
/// the kernel.
unsafe fn owner<'a>(apc: *mut KAPC) -> (&'a ThreadStackSource, usize) {
    // SAFETY: the caller's contract: `apc` is a slot's first field.
    let slot = unsafe { &*apc.cast::<ApcSlot>() };
    let index = slot.index.load(Ordering::Relaxed);
    let source = apc
        .wrapping_byte_sub(offset_of!(ThreadStackSource, apcs) + index * size_of::<ApcSlot>())
        .cast::<ThreadStackSource>();
    // SAFETY: `apc` came from `ThreadStackSource::apc(index)`, so stepping
    // back by as much gives the source, which lives until no APC is in
    // flight.
    (unsafe { &*source }, index)
}

// The routines the kernel calls, in assembly so that their last act is a
// tail jump into `ObfDereferenceObject` with the device the Rust part
// returns: that call may delete the device and unmap kstack.sys, and then
// returns straight to the kernel. Each keeps 40 bytes (the 32-byte home area
// and the alignment) with unwind information, so a stack walk from inside
// passes through. The `int3` after each jump is never reached.
//
// `kstack_apc_kernel_routine(Apc, NormalRoutine, NormalContext,
// SystemArgument1, SystemArgument2)` (`PKKERNEL_ROUTINE`): the Rust part
// needs only `Apc`, which it gets unchanged in RCX.
// `kstack_apc_rundown_routine(Apc)` (`PKRUNDOWN_ROUTINE`): likewise.
core::arch::global_asm!(
    ".text",
    ".globl kstack_apc_kernel_routine",
    ".p2align 4",
    "kstack_apc_kernel_routine:",
    ".seh_proc kstack_apc_kernel_routine",
    "sub rsp, 40",
    ".seh_stackalloc 40",
    ".seh_endprologue",
    "call {delivered}",
    "add rsp, 40",
    "mov rcx, rax",
    "jmp qword ptr [rip + __imp_ObfDereferenceObject]",
    "int3",
    ".seh_endproc",
    ".globl kstack_apc_rundown_routine",
    ".p2align 4",
    "kstack_apc_rundown_routine:",
    ".seh_proc kstack_apc_rundown_routine",
    "sub rsp, 40",
    ".seh_stackalloc 40",
    ".seh_endprologue",
    "call {run_down}",
    "add rsp, 40",
    "mov rcx, rax",
    "jmp qword ptr [rip + __imp_ObfDereferenceObject]",
    "int3",
    ".seh_endproc",
    delivered = sym delivered,
    run_down = sym run_down,
);

unsafe extern "system" {
    /// The kernel routine above: captures the thread's stack, then drops
    /// the APC's references.
    ///
    /// Max IRQL: `APC_LEVEL`.
    fn kstack_apc_kernel_routine(
        apc: *mut KAPC,
        normal_routine: *mut wdk_sys::PKNORMAL_ROUTINE,
        normal_context: *mut wdk_sys::PVOID,
        system_argument1: *mut wdk_sys::PVOID,
        system_argument2: *mut wdk_sys::PVOID,
    );
    /// The rundown routine above: counts the APC, then drops its
    /// references.
    ///
    /// Max IRQL: `PASSIVE_LEVEL`.
    fn kstack_apc_rundown_routine(apc: *mut KAPC);
}

/// The kernel routine's Rust part: in the target thread at `APC_LEVEL`,
/// captures its stack as the thread-stack source's event and finishes the
/// APC; returns the device whose reference the assembly drops last.
///
/// # Safety
/// Called once per APC `ThreadStackSource::queue` queued, by
/// `kstack_apc_kernel_routine`.
///
/// Max IRQL: `APC_LEVEL`.
unsafe extern "system" fn delivered(apc: *mut KAPC) -> *mut DEVICE_OBJECT {
    // SAFETY: the kernel passes the APC `queue` queued.
    let (source, index) = unsafe { owner(apc) };
    recorder::capture_thread(index);
    // SAFETY: once for this APC, after its capture.
    unsafe { source.finish(index) }
}

/// The rundown routine's Rust part: counts the APC and finishes it;
/// returns the device whose reference the assembly drops last.
///
/// # Safety
/// Called once per APC `ThreadStackSource::queue` queued, by
/// `kstack_apc_rundown_routine`.
///
/// Max IRQL: `PASSIVE_LEVEL`.
unsafe extern "system" fn run_down(apc: *mut KAPC) -> *mut DEVICE_OBJECT {
    // SAFETY: the kernel passes the APC `queue` queued.
    let (source, index) = unsafe { owner(apc) };
    recorder::thread_run_down();
    // SAFETY: once for this APC.
    unsafe { source.finish(index) }
}
