//! The driver while loaded: one block of non-paged pool holding the
//! recorder (the core state) and the kernel objects the sources need, the
//! ring (every shard and its record memory) and the stack table's entries
//! in a second block, a global
//! pointer to the first, and the single teardown that frees both once the
//! recorder's rundown gate is drained. It also registers the sources'
//! callbacks at load and unregisters them at unload.

use core::{
    mem::{align_of, size_of},
    ptr::{self, NonNull},
    slice,
    sync::atomic::{AtomicPtr, Ordering},
};

use kstack_abi::{
    DriverImage, HostRoutine, PagingExecutive, Source, ThreadRequestOutcome,
    ntstatus::KSTACK_STATUS_NO_APC,
};
use kstack_driver_core::{
    DriverCore, Routine, Shard, ShardedRing, SourceControl, SourceRegistration, StackEntry,
    StackTable, Word,
    ring::WORD_SIZE,
    sharded_ring::{ring_words, shard_count, shards_over},
    user_walk_guard::UserWalkGuard,
};
use wdk_sys::{
    DRIVER_OBJECT, LARGE_INTEGER, NTSTATUS, STATUS_INSUFFICIENT_RESOURCES, STATUS_SUCCESS,
    ntddk::KeDelayExecutionThread,
};

use crate::{
    kernel::{Clock, KERNEL_MODE},
    pool,
    recorder::{self, Recorder},
    registry::ParametersKey,
    routines::Routines,
    sources::{
        image_load, object_handles::ObjectCallbacks, process,
        registry_operations::RegistryCallback, thread, thread_stack::ThreadStackSource,
        timer::TimerSource,
    },
    unicode::utf16,
};

/// Everything one load of the driver keeps.
pub struct LoadedDriver {
    /// The core and the kernel routines and clock captures use.
    pub recorder: Recorder,
    pub timer: TimerSource,
    pub registry: RegistryCallback,
    pub objects: ObjectCallbacks,
    /// The thread-capture slots and their APCs, in a block of their own
    /// (see `ThreadStackSource::retire`).
    pub thread_stacks: &'static ThreadStackSource,
    /// The user walks' re-entry guard, in a block of its own.
    user_walkers: NonNull<UserWalkGuard>,
    /// The ring's block, as allocated (the shards start at its first
    /// 128-byte boundary).
    ring_block: NonNull<u8>,
    /// Where unload records what it left allocated.
    parameters: Option<ParametersKey>,
}

/// The loaded driver; null before `DriverEntry` publishes it and after
/// unload takes it back.
static LOADED: AtomicPtr<LoadedDriver> = AtomicPtr::new(ptr::null_mut());

/// Runs `use_driver` with the loaded driver, unless unload has begun.
///
/// Max IRQL: `DISPATCH_LEVEL`.
pub fn with_loaded<R>(use_driver: impl FnOnce(&LoadedDriver) -> R) -> Option<R> {
    recorder::inside_gate(|| {
        // SAFETY: the pointer is either null or the published, fully
        // initialized state, which unload frees only after the gate has
        // drained.
        let loaded = unsafe { LOADED.load(Ordering::Acquire).as_ref() }?;
        Some(use_driver(loaded))
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

    fn queue_thread_capture(
        &self,
        thread_id: u32,
        slot: usize,
    ) -> Result<(), ThreadRequestOutcome> {
        self.thread_stacks
            .queue(&self.recorder.routines, thread_id, slot)
    }
}

/// How long unload waits for thread-capture APCs still queued: 500 pauses
/// of 10 ms.
const APC_WAITS: u32 = 500;

/// Bytes of the ring's block for `shards` shards, `capacity` bytes of
/// records in all and `entries` stack table entries: room to align the
/// shards, then the shards, then the record memory, then the entries (a
/// shard's size is a multiple of its alignment, and the words' of the
/// entries', so what follows the shards is aligned).
///
/// Max IRQL: any.
fn ring_block_size(shards: usize, capacity: usize, entries: usize) -> Option<usize> {
    const _: () = assert!(size_of::<Shard<'static>>().is_multiple_of(align_of::<Word>()));
    const _: () = assert!(align_of::<Word>() >= align_of::<StackEntry>());
    const _: () = assert!(size_of::<Word>().is_multiple_of(align_of::<StackEntry>()));
    let shards = shards.checked_mul(size_of::<Shard<'static>>())?;
    let words = (capacity / WORD_SIZE).checked_mul(size_of::<Word>())?;
    let entries = entries.checked_mul(size_of::<StackEntry>())?;
    (align_of::<Shard<'static>>() - 1)
        .checked_add(shards)?
        .checked_add(words)?
        .checked_add(entries)
}

/// Lays out the ring and the stack table in `block` (of
/// [`ring_block_size`] bytes): one shard per processor of `processors`, up
/// to kstack-abi's `MAX_SHARDS`, sharing `capacity` bytes of record memory,
/// then `entries` empty entries.
///
/// # Safety
/// `block` is unused, non-paged, [`ring_block_size`]`(shard_count(..),
/// capacity, entries)` bytes long, and stays allocated and untouched by anything
/// else until every user of the returned ring is gone.
///
/// Max IRQL: `DISPATCH_LEVEL` (kstack calls it only in `DriverEntry`).
unsafe fn lay_out_ring(
    block: NonNull<u8>,
    processors: u32,
    capacity: usize,
    entries: usize,
) -> (ShardedRing<'static>, StackTable<'static>) {
    let count = shard_count(processors, capacity);
    let padding = block.as_ptr().align_offset(align_of::<Shard<'static>>());
    // SAFETY: the block has room for the padding (below the alignment) in
    // front of the shards.
    let shards = unsafe { block.add(padding) }.cast::<Shard<'static>>();
    // SAFETY: the words follow the `count` shards inside the block.
    let words = unsafe { shards.add(count) }.cast::<Word>();
    let word_count = capacity / WORD_SIZE;
    for (index, word) in ring_words(capacity).enumerate() {
        // SAFETY: `index` < `word_count`: inside the words' part.
        let place = unsafe { words.add(index) };
        // SAFETY: aligned (see `ring_block_size`) and written once, before
        // anything reads it.
        unsafe { place.write(word) };
    }
    // SAFETY: the entries follow the `word_count` words inside the block.
    let table = unsafe { words.add(word_count) }.cast::<StackEntry>();
    for index in 0..entries {
        // SAFETY: `index` < `entries`: inside the entries' part.
        let place = unsafe { table.add(index) };
        // SAFETY: aligned (see `ring_block_size`) and written once, before
        // anything reads it.
        unsafe { place.write(StackEntry::new()) };
    }
    // SAFETY: all `word_count` words were initialized above; the caller
    // keeps them allocated as long as the ring is used.
    let words: &'static [Word] = unsafe { slice::from_raw_parts(words.as_ptr(), word_count) };
    // SAFETY: `count` shards' room, aligned by the padding, precedes the
    // words.
    unsafe { write_shards(shards, words, count) };
    // SAFETY: all `count` shards were initialized above, and live as long
    // as the words.
    let shards: &'static [Shard<'static>] =
        unsafe { slice::from_raw_parts(shards.as_ptr(), count) };
    // SAFETY: all `entries` entries were initialized above, and live as
    // long as the words.
    let table: &'static [StackEntry] = unsafe { slice::from_raw_parts(table.as_ptr(), entries) };
    (ShardedRing::new(shards), StackTable::new(table))
}

/// Writes the `count` shards over `words` from `shards`. Never inlined: each shard (1.5 KiB of counters) is built on
/// the stack before it is copied into place, and inlined into
/// `DriverEntry` its copies took that frame past a page, which needs a
/// stack probe (`__chkstk`) the driver does not link.
///
/// # Safety
/// `shards` is aligned for, and has room for, `count` shards that nothing
/// reads before this returns.
///
/// Max IRQL: `DISPATCH_LEVEL` (kstack calls it only in `DriverEntry`).
#[inline(never)]
unsafe fn write_shards(shards: NonNull<Shard<'static>>, words: &'static [Word], count: usize) {
    for (index, shard) in shards_over(words, count).enumerate() {
        // SAFETY: `index` < `count`: inside the caller's room.
        let place = unsafe { shards.add(index) };
        // SAFETY: aligned (the caller's room) and written once, before
        // anything reads it.
        unsafe { place.write(shard) };
    }
}

/// Allocates and publishes the state: a ring of `capacity` bytes in all,
/// in one shard per active processor (`processors`), a stack table of
/// `entries` entries (a power of two, or 0: off), nothing enabled, every
/// source unavailable until registered.
///
/// Max IRQL: `PASSIVE_LEVEL`.
pub fn create(
    routines: Routines,
    paging: PagingExecutive,
    image: DriverImage,
    (capacity, processors, entries): (usize, u32, usize),
    parameters: Option<&ParametersKey>,
) -> Result<&'static LoadedDriver, NTSTATUS> {
    let ring_bytes = ring_block_size(shard_count(processors, capacity), capacity, entries)
        .ok_or(STATUS_INSUFFICIENT_RESOURCES)?;
    let ring_block = pool::allocate(&routines, ring_bytes, pool::TAG_RING)
        .ok_or(STATUS_INSUFFICIENT_RESOURCES)?;
    let Some(thread_stacks) = ThreadStackSource::create(&routines) else {
        // SAFETY: allocated just above, unused.
        unsafe { pool::free(ring_block, pool::TAG_RING) };
        return Err(STATUS_INSUFFICIENT_RESOURCES);
    };
    // SAFETY: all-zero bytes are an empty guard (its docs); 4-byte aligned.
    let Some(user_walkers) =
        (unsafe { pool::allocate_zeroed::<UserWalkGuard>(&routines, pool::TAG_GUARD) })
    else {
        // SAFETY: allocated just above, no APC queued.
        unsafe { thread_stacks.free() };
        // SAFETY: as above.
        unsafe { pool::free(ring_block, pool::TAG_RING) };
        return Err(STATUS_INSUFFICIENT_RESOURCES);
    };
    let Some(state) = pool::allocate(&routines, size_of::<LoadedDriver>(), pool::TAG_STATE) else {
        // SAFETY: all allocated just above, unused.
        unsafe { pool::free(user_walkers.cast(), pool::TAG_GUARD) };
        // SAFETY: as above, no APC queued.
        unsafe { thread_stacks.free() };
        // SAFETY: as above.
        unsafe { pool::free(ring_block, pool::TAG_RING) };
        return Err(STATUS_INSUFFICIENT_RESOURCES);
    };
    // SAFETY: the block was just allocated with the size `lay_out_ring`
    // needs, and is freed only by `destroy`, after every user is gone.
    let (ring, table) = unsafe { lay_out_ring(ring_block, processors, capacity, entries) };
    let state = state.cast::<LoadedDriver>();
    // SAFETY: made in its zeroed block above, freed only by `destroy` after
    // the core that uses it is gone.
    let user_walkers_guard: &'static UserWalkGuard = unsafe { user_walkers.as_ref() };
    // Built as one value first: small, now that the tables larger than a
    // kernel stack are blocks of their own.
    // SAFETY: the block is sized and aligned (pool alignment is 16) for a
    // LoadedDriver and not yet shared.
    unsafe {
        state.as_ptr().write(LoadedDriver {
            recorder: Recorder {
                core: DriverCore::new(
                    ring,
                    table,
                    paging,
                    image,
                    &thread_stacks.slots,
                    user_walkers_guard,
                ),
                clock: Clock::start(&routines),
                routines,
            },
            timer: TimerSource::new(),
            registry: RegistryCallback::new(),
            objects: ObjectCallbacks::new(),
            thread_stacks,
            user_walkers,
            ring_block,
            parameters: parameters.copied(),
        });
    }
    // SAFETY: initialized above; it lives until `destroy`.
    let driver = unsafe { state.as_ref() };
    let (core, routines) = (&driver.recorder.core, &driver.recorder.routines);
    core.set_routine(Routine::UserWalk, routines.user_walk);
    core.set_routine(Routine::ProcessKey, routines.process_key);
    core.set_routine(Routine::Apc, routines.apc);
    core.set_routine(Routine::ApcTakeBack, routines.apc_take_back);
    recorder::publish(&driver.recorder);
    LOADED.store(state.as_ptr(), Ordering::Release);
    Ok(driver)
}

/// The single teardown path, for unload and for a failed `DriverEntry`:
/// closes the gate, unregisters the sources (and stops the timer), waits
/// until no callback or request is inside, then frees everything.
///
/// Max IRQL: `PASSIVE_LEVEL`.
pub fn destroy() {
    recorder::close_gate();
    let state = LOADED.load(Ordering::Acquire);
    let Some(state) = NonNull::new(state) else {
        return;
    };
    // SAFETY: published by `create` and not freed yet.
    let driver = unsafe { state.as_ref() };
    unregister_sources(driver);
    let mut pause = LARGE_INTEGER {
        QuadPart: -10 * 1000 * 10,
    }; // 10 ms, relative
    while !recorder::gate_drained() {
        // SAFETY: a kernel-mode, non-alertable wait at PASSIVE_LEVEL.
        let _ = unsafe { KeDelayExecutionThread(KERNEL_MODE, 0, &raw mut pause) };
    }
    // The APCs still queued are taken back; one the kernel is delivering
    // may still run its routine (it needs only its slot, its KAPC and the
    // device reference it holds; the gate keeps it out of the rest): wait
    // for those, bounded; if one does not finish in time, the last APC's
    // routine frees their block.
    // SAFETY: the gate is drained, so no request can queue an APC any more.
    unsafe {
        driver.thread_stacks.take_back(&driver.recorder.routines);
    }
    let mut waits = 0;
    while driver.thread_stacks.pending() && waits < APC_WAITS {
        // SAFETY: a kernel-mode, non-alertable wait at PASSIVE_LEVEL.
        let _ = unsafe { KeDelayExecutionThread(KERNEL_MODE, 0, &raw mut pause) };
        waits += 1;
    }
    // SAFETY: the gate is drained, so no request can queue an APC any more;
    // nothing below touches the block.
    unsafe { driver.thread_stacks.retire() };
    let user_walkers = driver.user_walkers;
    recorder::retire();
    LOADED.store(ptr::null_mut(), Ordering::Release);
    let ring_block = driver.ring_block;
    let parameters = driver.parameters;
    // SAFETY: no callback or request can reach the state any more (gate
    // drained, callbacks unregistered, timer stopped and its DPCs flushed).
    unsafe {
        ptr::drop_in_place(state.as_ptr());
    }
    // SAFETY: the blocks came from `create` and are freed once.
    unsafe { pool::free(ring_block, pool::TAG_RING) };
    // SAFETY: as above (the core that used it is gone).
    unsafe { pool::free(user_walkers.cast(), pool::TAG_GUARD) };
    // SAFETY: as above.
    unsafe { pool::free(state.cast(), pool::TAG_STATE) };
    // What this load left allocated (0 when everything was freed), for
    // whoever checks after the fact: the driver cannot be asked any more.
    if let Some(parameters) = parameters {
        let _ = parameters.write_dword(utf16!("LastUnloadPoolAllocations"), pool::outstanding());
    }
}

/// The base altitudes of the object and registry callbacks (see
/// `kstack_abi::altitude`).
pub struct Altitudes {
    pub object: u32,
    pub registry: u32,
}

/// Registers every source the kernel supports and records each result.
///
/// Max IRQL: `PASSIVE_LEVEL`.
pub fn register_sources(
    driver: &LoadedDriver,
    driver_object: *mut DRIVER_OBJECT,
    bases: &Altitudes,
) {
    let core = &driver.recorder.core;
    let (registry, registry_altitude) =
        driver
            .registry
            .register(&driver.recorder.routines, driver_object, bases.registry);
    let (objects, object_altitude) = driver.objects.register(bases.object);
    let results = [
        (Source::Process, process::register()),
        (Source::Thread, thread::register()),
        (Source::ImageLoad, image_load::register()),
        (Source::Registry, registry),
        (Source::ObjectHandle, objects),
        (Source::Timer, driver.timer.initialize()),
        (Source::OnDemand, STATUS_SUCCESS),
        // Requests, not a callback: available where APCs can be queued.
        (
            Source::ThreadStack,
            if driver.recorder.routines.apc == HostRoutine::Available {
                STATUS_SUCCESS
            } else {
                KSTACK_STATUS_NO_APC
            },
        ),
    ];
    for (source, status) in results {
        // The injection build makes every source but the timer (which Wine
        // fires) and the request sources injectable when the kernel lacks it.
        #[cfg(feature = "test-injection")]
        let status = if source == Source::Timer || source.is_request() {
            status
        } else {
            crate::injection::registration(status)
        };
        core.set_registration(source, SourceRegistration { status });
    }
    for (source, altitude) in [
        (Source::Registry, registry_altitude),
        (Source::ObjectHandle, object_altitude),
    ] {
        core.set_altitude(source, altitude);
    }
}

/// Unregisters what [`register_sources`] registered and stops the timer.
///
/// Max IRQL: `PASSIVE_LEVEL`.
fn unregister_sources(driver: &LoadedDriver) {
    let registered = |source| driver.recorder.core.registration(source).available();
    if registered(Source::Process) {
        process::unregister();
    }
    if registered(Source::Thread) {
        thread::unregister();
    }
    if registered(Source::ImageLoad) {
        image_load::unregister();
    }
    if registered(Source::Registry) {
        driver.registry.unregister(&driver.recorder.routines);
    }
    if registered(Source::ObjectHandle) {
        driver.objects.unregister();
    }
    driver.timer.stop();
}
