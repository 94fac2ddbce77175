//! The driver while loaded: one block of non-paged pool holding the core
//! state and the kernel objects the sources need, the ring's slots in a
//! second block, a global pointer to the first, and the rundown gate that
//! keeps callbacks off both while unload frees them.

use core::{
    mem::size_of,
    ptr::{self, NonNull},
    slice,
    sync::atomic::{AtomicPtr, Ordering},
};

use kstack_abi::{DriverImage, PagingExecutive, SourceFacts};
use kstack_driver_core::{CaptureOutcome, DriverCore, RecordRing, Rundown, Slot, SourceControl};
use wdk_sys::{
    LARGE_INTEGER, NTSTATUS, STATUS_INSUFFICIENT_RESOURCES, ntddk::KeDelayExecutionThread,
};

use crate::{
    kernel::{KERNEL_MODE, KernelPlatform, utf16},
    pool,
    registry::ParametersKey,
    routines::Routines,
    sources::{
        object_handles::ObjectCallbacks, registry_operations::RegistryCallback, timer::TimerSource,
    },
};

/// Everything one load of the driver keeps.
pub struct LoadedDriver {
    pub core: DriverCore<'static>,
    pub routines: Routines,
    pub timer: TimerSource,
    pub registry: RegistryCallback,
    pub objects: ObjectCallbacks,
    slots: NonNull<Slot>,
    /// Where unload records what it left allocated.
    parameters: Option<ParametersKey>,
}

/// The loaded driver; null before `DriverEntry` publishes it and after
/// unload takes it back.
static LOADED: AtomicPtr<LoadedDriver> = AtomicPtr::new(ptr::null_mut());
/// Callbacks and requests enter this before using [`LOADED`].
static RUNDOWN: Rundown = Rundown::new();

/// Runs `use_driver` with the loaded driver, unless unload has begun.
///
/// Max IRQL: `DISPATCH_LEVEL`.
pub fn with_loaded<R>(use_driver: impl FnOnce(&LoadedDriver) -> R) -> Option<R> {
    let _inside = RUNDOWN.enter()?;
    // SAFETY: the pointer is either null or the published, fully initialized
    // state, which unload frees only after the gate has drained.
    let loaded = unsafe { LOADED.load(Ordering::Acquire).as_ref() }?;
    Some(use_driver(loaded))
}

/// Captures one event for a source's callback.
///
/// Max IRQL: `DISPATCH_LEVEL`.
pub fn record(facts: impl FnOnce(&LoadedDriver) -> Option<SourceFacts>) -> Option<CaptureOutcome> {
    with_loaded(|driver| {
        let facts = facts(driver)?;
        Some(driver.core.capture(
            &KernelPlatform {
                routines: &driver.routines,
            },
            facts,
        ))
    })
    .flatten()
}

impl SourceControl for LoadedDriver {
    fn set_timer(&self, period_ms: Option<u32>) {
        match period_ms {
            Some(period) => self.timer.start(period),
            None => self.timer.stop(),
        }
    }
}

/// Allocates and publishes the state: `capacity` ring slots, nothing
/// enabled, every source unavailable until registered.
///
/// Max IRQL: `PASSIVE_LEVEL`.
pub fn create(
    routines: Routines,
    paging: PagingExecutive,
    image: DriverImage,
    capacity: usize,
    parameters: Option<&ParametersKey>,
) -> Result<&'static LoadedDriver, NTSTATUS> {
    let slot_bytes = capacity
        .checked_mul(size_of::<Slot>())
        .ok_or(STATUS_INSUFFICIENT_RESOURCES)?;
    let slots = pool::allocate(&routines, slot_bytes, pool::TAG_RING)
        .ok_or(STATUS_INSUFFICIENT_RESOURCES)?;
    let Some(state) = pool::allocate(&routines, size_of::<LoadedDriver>(), pool::TAG_STATE) else {
        // SAFETY: allocated just above, unused.
        unsafe { pool::free(slots, pool::TAG_RING) };
        return Err(STATUS_INSUFFICIENT_RESOURCES);
    };
    let slots = slots.cast::<Slot>();
    for (index, position) in (0..capacity).zip(0_u64..) {
        // SAFETY: the block holds `capacity` slots, so `index` is inside it.
        let slot = unsafe { slots.as_ptr().add(index) };
        // SAFETY: each slot is written once, before anything reads it.
        unsafe { slot.write(Slot::new(position)) };
    }
    // SAFETY: all `capacity` slots were initialized above and stay allocated
    // until `destroy`, after every user is gone.
    let ring_slots: &'static [Slot] = unsafe { slice::from_raw_parts(slots.as_ptr(), capacity) };
    let state = state.cast::<LoadedDriver>();
    // SAFETY: the block is sized and aligned (pool alignment is 16) for a
    // LoadedDriver and not yet shared.
    unsafe {
        state.as_ptr().write(LoadedDriver {
            core: DriverCore::new(RecordRing::new(ring_slots), paging, image),
            routines,
            timer: TimerSource::new(),
            registry: RegistryCallback::new(),
            objects: ObjectCallbacks::new(),
            slots,
            parameters: parameters.copied(),
        });
    }
    // SAFETY: initialized above; it lives until `destroy`.
    let driver = unsafe { state.as_ref() };
    LOADED.store(state.as_ptr(), Ordering::Release);
    Ok(driver)
}

/// The single teardown path, for unload and for a failed `DriverEntry`:
/// closes the gate, has the sources unregister (and the timer stop), waits
/// until no callback or request is inside, then frees everything.
///
/// Max IRQL: `PASSIVE_LEVEL`.
pub fn destroy(unregister: impl FnOnce(&LoadedDriver)) {
    RUNDOWN.close();
    let state = LOADED.load(Ordering::Acquire);
    let Some(state) = NonNull::new(state) else {
        return;
    };
    // SAFETY: published by `create` and not freed yet.
    let driver = unsafe { state.as_ref() };
    unregister(driver);
    let mut pause = LARGE_INTEGER {
        QuadPart: -10 * 1000 * 10,
    }; // 10 ms, relative
    while !RUNDOWN.is_drained() {
        // SAFETY: a kernel-mode, non-alertable wait at PASSIVE_LEVEL.
        let _ = unsafe { KeDelayExecutionThread(KERNEL_MODE, 0, &raw mut pause) };
    }
    LOADED.store(ptr::null_mut(), Ordering::Release);
    let slots = driver.slots;
    let parameters = driver.parameters;
    // SAFETY: no callback or request can reach the state any more (gate
    // drained, callbacks unregistered, timer stopped and its DPCs flushed).
    unsafe {
        ptr::drop_in_place(state.as_ptr());
    }
    // SAFETY: both blocks came from `create` and are freed once.
    unsafe { pool::free(slots.cast(), pool::TAG_RING) };
    // SAFETY: as above.
    unsafe { pool::free(state.cast(), pool::TAG_STATE) };
    // What this load left allocated (0 when everything was freed), for
    // whoever checks after the fact: the driver cannot be asked any more.
    if let Some(parameters) = parameters {
        let _ = parameters.write_dword(utf16!("LastUnloadPoolAllocations"), pool::outstanding());
    }
}
