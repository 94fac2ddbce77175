//! The stack table: each distinct stack kept once, so that an event whose
//! stack is in the table enters the ring as a header and a slot number
//! (tens of bytes), and its frames cross to a reader once.
//!
//! Entries are fixed, allocated at load (`Parameters\StackTableEntries`),
//! and found by open addressing from the 64-bit stack id, looking at
//! [`PROBES`] slots. Each entry has a `version` (odd while one writer
//! fills it) and a count of the references to it (`refs`: the records in
//! the ring that name it, and a capture comparing its frames). A capture
//! at `DISPATCH_LEVEL`:
//!
//! - finds an entry with its id: it adds itself to `refs`, then checks
//!   the version did not move (both accesses sequentially consistent); an
//!   evictor claims the version first and checks `refs` after a
//!   sequentially consistent fence, so one of the two sees the other and
//!   the entry is never replaced under a reference. Holding it, the
//!   capture compares the entry's frames with its own (plain memory: no
//!   writer can be at them now) and keeps the reference on a *hit*;
//! - finds its id with other frames: a *collision*: the reference is
//!   given back, and the event carried inline (the record keeps its
//!   frames), counted, never merged;
//! - finds an empty slot, or else an entry no record names (the oldest
//!   of the window): claims it and writes its stack, an
//!   *insert* (an *eviction* too when it replaced a stack);
//! - finds every slot of the window named by unread records: *full*; a
//!   claim lost to another writer: *busy*. Both carried inline.
//!
//! A walk that returned no frames is never tabled (*empty*): a record
//! without frames that names its stack would look like one whose stack the
//! reader already has.
//!
//! The reader side (read and clear, one holder at a time through the
//! ring's consumer lock) drops a record's reference when it takes the
//! record out of the ring; a read writes the entry's frames into the
//! record it returns unless this reader got them already (`sent_to` holds
//! the reader epoch that did; a read from another reader starts a new
//! epoch). Every event a reader receives thus has its stack available to
//! that reader: in the record, or in an earlier record it received.

use kstack_abi::{MAX_FRAMES, StackTableStatus};

use crate::sync::{AtomicU32, AtomicU64, Ordering, UnsafeCell, fence, seq_cst_accesses_ordered};

/// Slots looked at from a stack id's home slot.
pub const PROBES: usize = 8;
/// Entries when `Parameters\StackTableEntries` is absent.
pub const DEFAULT_ENTRIES: u32 = 4096;
/// The most entries `StackTableEntries` may choose (0 turns the table off).
pub const MAX_ENTRIES: u32 = 65_536;

/// The entries for a `StackTableEntries` setting: the default when there is
/// none, else the setting brought down to a power of two no larger than
/// [`MAX_ENTRIES`]; 0 keeps the table off.
#[must_use]
pub fn entries_for_setting(setting: Option<u32>) -> usize {
    let entries = setting.unwrap_or(DEFAULT_ENTRIES).min(MAX_ENTRIES);
    match entries {
        0 => 0,
        // A power of two: the home slot is the id's low bits.
        _ => 1 << entries.ilog2(),
    }
}

/// One stack. 8-byte fields only. The fields a capture looks at before it
/// holds a reference are atomics (a writer may be filling the entry
/// meanwhile: the version tells); the frames are plain memory, read only
/// under a reference and written only by a writer that has claimed the
/// entry and seen it unreferenced ([`Frames`]).
pub struct StackEntry {
    /// Even when stable, odd while a writer fills it.
    version: AtomicU64,
    /// The stack id (0: empty; ids of 0 are never tabled).
    id: AtomicU64,
    /// Frame count (low 16 bits) and the OS hash (high 32 bits).
    shape: AtomicU64,
    /// Records in the ring that name this entry.
    refs: AtomicU32,
    /// The reader epoch that last received the frames (reader side only).
    sent_to: AtomicU64,
    /// When it was written, on the table's insert clock: the oldest entry
    /// no record names is replaced first.
    inserted: AtomicU64,
    frames: Frames,
}

/// An entry's frames. Written only by an insert that claimed the entry (odd
/// version) and then saw no reference; read only while holding a reference
/// taken on the stable version (a capture's pin, a record's): a pin after
/// the claim sees the version moved and reads nothing, and an insert after
/// a pin sees the reference and writes nothing (the module's ordering). So
/// the frames are never written while read, and a hit compares them as
/// plain memory, 32 frames in a few vector compares.
struct Frames(UnsafeCell<[u64; MAX_FRAMES as usize]>);

// SAFETY: the frames are written only by the one insert that holds the
// entry's claim while no reference exists, and read only under a
// reference; the claim and the references exclude each other (see
// `Frames`), and the version's Release/Acquire order the writes before
// any read.
unsafe impl Sync for Frames {}

impl Frames {
    fn new() -> Self {
        Self(UnsafeCell::new([0; MAX_FRAMES as usize]))
    }

    /// Writes `frames` (at most [`MAX_FRAMES`]) from the first.
    ///
    /// # Safety
    /// The caller holds the entry's claim and saw no reference after it.
    #[cfg(not(loom))]
    unsafe fn write(&self, frames: &[u64]) {
        // SAFETY: no reader nor other writer meanwhile (the caller's claim).
        let kept = unsafe { &mut *self.0.get() };
        copy_frames(frames, kept);
    }

    /// Writes `frames` (loom checks the caller's claim).
    ///
    /// # Safety
    /// As above.
    #[cfg(loom)]
    unsafe fn write(&self, frames: &[u64]) {
        self.0.with_mut(|kept| {
            // SAFETY: no reader nor other writer meanwhile (the caller's claim).
            copy_frames(frames, unsafe { &mut *kept });
        });
    }

    /// Runs `read` on the frames.
    ///
    /// # Safety
    /// The caller holds a reference on the entry.
    #[cfg(not(loom))]
    unsafe fn read<R>(&self, read: impl FnOnce(&[u64; MAX_FRAMES as usize]) -> R) -> R {
        // SAFETY: no writer meanwhile (the caller's reference).
        read(unsafe { &*self.0.get() })
    }

    /// Runs `read` on the frames (loom checks the caller's reference).
    ///
    /// # Safety
    /// As above.
    #[cfg(loom)]
    unsafe fn read<R>(&self, read: impl FnOnce(&[u64; MAX_FRAMES as usize]) -> R) -> R {
        self.0.with(|kept| {
            // SAFETY: no writer meanwhile (the caller's reference).
            read(unsafe { &*kept })
        })
    }
}

/// Copies `frames` into `kept` from the first, as many as fit.
fn copy_frames(frames: &[u64], kept: &mut [u64]) {
    let count = frames.len().min(kept.len());
    kept[..count].copy_from_slice(&frames[..count]);
}

impl StackEntry {
    /// An empty entry.
    #[must_use]
    pub fn new() -> Self {
        Self {
            version: AtomicU64::new(0),
            id: AtomicU64::new(0),
            shape: AtomicU64::new(0),
            refs: AtomicU32::new(0),
            sent_to: AtomicU64::new(0),
            inserted: AtomicU64::new(0),
            frames: Frames::new(),
        }
    }

    fn frame_count(&self) -> usize {
        (self.shape.load(Ordering::Relaxed) & 0xFFFF) as usize
    }

    fn os_hash(&self) -> u32 {
        (self.shape.load(Ordering::Relaxed) >> 32) as u32
    }

    /// Whether the entry holds `frames`.
    ///
    /// # Safety
    /// The caller holds a reference on the entry.
    unsafe fn holds(&self, frames: &[u64]) -> bool {
        self.frame_count() == frames.len()
            // SAFETY: the caller's reference.
            && unsafe {
                self.frames.read(|kept| {
                    // Every frame compared, no early exit: a hit (the
                    // common case) compares them all anyway, and this is a
                    // few vector instructions with no library call (a
                    // driver links no memcmp).
                    kept.iter()
                        .zip(frames)
                        .fold(0, |differ, (kept, frame)| differ | (kept ^ frame))
                        == 0
                })
            }
    }
}

impl Default for StackEntry {
    fn default() -> Self {
        Self::new()
    }
}

/// Where a capture's stack went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tabled {
    /// In this slot, which the capture's record now names (one reference).
    Slot(u32),
    /// Not tabled: the record carries its frames.
    Inline,
}

/// What a lookup found, one counter each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Hit,
    Insert,
    Eviction,
    Collision,
    Full,
    Busy,
    Empty,
}

/// One shard's lookup outcomes (kept in the shard, so captures on
/// different processors share no counter).
#[derive(Default)]
pub struct TableCounters {
    hits: AtomicU64,
    inserts: AtomicU64,
    evictions: AtomicU64,
    collisions: AtomicU64,
    full: AtomicU64,
    busy: AtomicU64,
    empty: AtomicU64,
}

/// The table. Lives with the ring, in non-paged memory; its lookup
/// counters are in the ring's shards.
pub struct StackTable<'a> {
    entries: &'a [StackEntry],
    /// Reader side only (under the consumer lock).
    reader: ReaderState,
    /// Counts inserts, to order entries by age (misses only: a hit writes
    /// nothing shared but the entry's `refs`).
    insert_clock: AtomicU64,
}

struct ReaderState {
    /// The current reader epoch (from 1).
    epoch: AtomicU64,
    /// The reader (file object) the epoch belongs to; 0 after it closed.
    reader: AtomicU64,
    sent: AtomicU64,
}

impl<'a> StackTable<'a> {
    /// A table over `entries` (a power of two in length, or none: off).
    ///
    /// # Panics
    /// When the length is not a power of two, or over `u32::MAX`.
    #[must_use]
    pub fn new(entries: &'a [StackEntry]) -> Self {
        assert!(
            entries.is_empty()
                || (entries.len().is_power_of_two() && u32::try_from(entries.len()).is_ok()),
            "stack table entries must be a power of two"
        );
        Self {
            entries,
            reader: ReaderState {
                epoch: AtomicU64::new(1),
                reader: AtomicU64::new(0),
                sent: AtomicU64::new(0),
            },
            insert_clock: AtomicU64::new(0),
        }
    }

    /// Whether the table holds entries.
    ///
    /// Max IRQL: any.
    #[must_use]
    pub fn is_on(&self) -> bool {
        !self.entries.is_empty()
    }

    /// Finds or enters the stack `frames` (whose id is `id` and OS hash
    /// `os_hash`) for one record about to enter the ring; counts the
    /// outcome in `counters` (the shard's). A slot returned carries a
    /// reference the caller gives back with [`StackTable::release`] if the
    /// record is not kept. Bounded: [`PROBES`] slots, no waiting.
    ///
    /// Max IRQL: `DISPATCH_LEVEL` (the driver calls it at `DISPATCH_LEVEL`,
    /// so no thread holds a claimed entry while descheduled).
    pub fn enter(&self, frames: &[u64], id: u64, os_hash: u32, counters: &TableCounters) -> Tabled {
        if !self.is_on() {
            return Tabled::Inline;
        }
        let (tabled, outcome) = if frames.is_empty() {
            (Tabled::Inline, Outcome::Empty)
        } else {
            self.find_or_insert(frames, id, os_hash)
        };
        let counter = match outcome {
            Outcome::Hit => &counters.hits,
            Outcome::Insert => &counters.inserts,
            Outcome::Eviction => {
                counters.evictions.fetch_add(1, Ordering::Relaxed);
                &counters.inserts
            }
            Outcome::Collision => &counters.collisions,
            Outcome::Full => &counters.full,
            Outcome::Busy => &counters.busy,
            Outcome::Empty => &counters.empty,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        tabled
    }

    fn find_or_insert(&self, frames: &[u64], id: u64, os_hash: u32) -> (Tabled, Outcome) {
        if id == 0 {
            return (Tabled::Inline, Outcome::Collision);
        }
        let mask = self.entries.len() - 1;
        // The low bits of a well-mixed id; truncation is the point.
        #[allow(clippy::cast_possible_truncation)]
        let home = id as usize & mask;
        // A slot to write: an empty one, else the oldest that no record
        // named when looked at.
        let mut target: Option<(usize, u64, bool)> = None;
        let mut oldest = u64::MAX;
        for step in 0..PROBES.min(self.entries.len()) {
            let slot = (home + step) & mask;
            let entry = &self.entries[slot];
            // Acquire: pairs with the writer's Release of the even version,
            // so the stack behind it is visible.
            let version = entry.version.load(Ordering::Acquire);
            if version % 2 == 1 {
                continue;
            }
            match entry.id.load(Ordering::Relaxed) {
                0 => {
                    // Entries are never emptied: nothing of ours lies past.
                    target = Some((slot, version, false));
                    break;
                }
                kept if kept == id => return self.pin(slot, version, frames),
                _ => {
                    let inserted = entry.inserted.load(Ordering::Relaxed);
                    if entry.refs.load(Ordering::Relaxed) == 0 && inserted < oldest {
                        oldest = inserted;
                        target = Some((slot, version, true));
                    }
                }
            }
        }
        match target {
            None => (Tabled::Inline, Outcome::Full),
            Some((slot, version, evicts)) => {
                self.insert(slot, version, evicts, frames, (id, os_hash))
            }
        }
    }

    /// Takes a reference on an entry seen stable at `version` with the
    /// stack's id, and keeps it when the entry holds `frames` (a hit).
    fn pin(&self, slot: usize, version: u64, frames: &[u64]) -> (Tabled, Outcome) {
        let entry = &self.entries[slot];
        // The reference, then the version again, both SeqCst; an evictor
        // claims the version, a SeqCst fence, then reads `refs` (see the
        // module). Of two such sequences one sees the other's write: the
        // store-buffer pattern, ordered here by the SeqCst total order (no
        // fence needed on this side, see `seq_cst_accesses_ordered`). The
        // reference is a locked add, the pin's one locked instruction:
        // every processor's captures share the entry. A fence here would be
        // a second one, which x64 does not need after the first (measured
        // with and without: `docs/performance.md`, 2026-11-27).
        entry.refs.fetch_add(1, Ordering::SeqCst);
        seq_cst_accesses_ordered();
        if entry.version.load(Ordering::SeqCst) != version {
            entry.refs.fetch_sub(1, Ordering::Release);
            return (Tabled::Inline, Outcome::Busy);
        }
        // SAFETY: the reference is held, on the version whose stack the
        // Acquire load in `find_or_insert` made visible.
        if !unsafe { entry.holds(frames) } {
            entry.refs.fetch_sub(1, Ordering::Release);
            return (Tabled::Inline, Outcome::Collision);
        }
        (Tabled::Slot(slot_number(slot)), Outcome::Hit)
    }

    /// Claims `slot` (seen stable at `version`), and writes the stack in.
    fn insert(
        &self,
        slot: usize,
        version: u64,
        evicts: bool,
        frames: &[u64],
        (id, os_hash): (u64, u32),
    ) -> (Tabled, Outcome) {
        let entry = &self.entries[slot];
        if entry
            .version
            .compare_exchange(version, version + 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return (Tabled::Inline, Outcome::Busy);
        }
        fence(Ordering::SeqCst);
        if entry.refs.load(Ordering::Acquire) != 0 {
            // A capture pinned it after all: nothing was written, so the
            // old version is still true of the entry.
            entry.version.store(version, Ordering::Release);
            return (Tabled::Inline, Outcome::Busy);
        }
        // Release: a capture that sees any of the stores below also sees
        // the odd version, so it never pins what is being written.
        fence(Ordering::Release);
        entry.id.store(id, Ordering::Relaxed);
        entry.shape.store(
            u64::from(os_hash) << 32 | frames.len() as u64,
            Ordering::Relaxed,
        );
        // SAFETY: the entry is claimed and was seen unreferenced after the
        // claim's fence.
        unsafe { entry.frames.write(frames) };
        entry.sent_to.store(0, Ordering::Relaxed);
        let tick = self.insert_clock.fetch_add(1, Ordering::Relaxed);
        entry.inserted.store(tick, Ordering::Relaxed);
        // An add, not a store: a capture that pinned after the check above
        // still holds its increment until it sees the version moved.
        entry.refs.fetch_add(1, Ordering::Relaxed);
        // Release: the stack is written before the version is even again.
        entry.version.store(version + 2, Ordering::Release);
        let outcome = if evicts {
            Outcome::Eviction
        } else {
            Outcome::Insert
        };
        (Tabled::Slot(slot_number(slot)), outcome)
    }

    /// Gives back the reference of a record that names `slot` and is not in
    /// the ring any more (dropped, read or cleared). A slot number that no
    /// entry has (a broken record) is ignored.
    ///
    /// Max IRQL: `DISPATCH_LEVEL`.
    pub fn release(&self, slot: u32) {
        if let Some(entry) = self.entry(slot) {
            // Release: whatever the holder read of the entry is read before
            // an evictor may rewrite it.
            entry.refs.fetch_sub(1, Ordering::Release);
        }
    }

    fn entry(&self, slot: u32) -> Option<&StackEntry> {
        self.entries.get(usize::try_from(slot).ok()?)
    }

    /// Starts a read by `reader` (its file object): the epoch to pass to
    /// [`StackTable::received`] and [`StackTable::sent`], a new one when the
    /// previous read was another reader's. Reader side only.
    ///
    /// Max IRQL: `DISPATCH_LEVEL`.
    pub fn begin_read(&self, reader: u64) -> u64 {
        let state = &self.reader;
        if state.reader.swap(reader, Ordering::Relaxed) != reader {
            state.epoch.fetch_add(1, Ordering::Relaxed);
        }
        state.epoch.load(Ordering::Relaxed)
    }

    /// Forgets `reader` when it was the last to read: its file object is
    /// closed, and its address may come back as another reader's.
    ///
    /// Max IRQL: `DISPATCH_LEVEL`.
    pub fn reader_closed(&self, reader: u64) {
        let _ =
            self.reader
                .reader
                .compare_exchange(reader, 0, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// For a record naming `slot`, read in `epoch`: its OS hash when this
    /// reader received the frames already (a read's common case: the record
    /// then goes out as it is, with the hash put back); `None` otherwise.
    ///
    /// Reader side only, while the record still holds its reference.
    ///
    /// Max IRQL: `DISPATCH_LEVEL`.
    #[must_use]
    pub fn received(&self, slot: u32, epoch: u64) -> Option<u32> {
        let entry = self.entry(slot)?;
        (entry.sent_to.load(Ordering::Relaxed) == epoch).then(|| entry.os_hash())
    }

    /// For a record naming `slot` whose frames its reader lacks (see
    /// [`StackTable::received`]): its OS hash, and its frames (written to
    /// `frames`, their count returned). `None` for a slot no entry has.
    ///
    /// Reader side only, while the record still holds its reference.
    ///
    /// Max IRQL: `DISPATCH_LEVEL`.
    pub fn frames_for(&self, slot: u32, frames: &mut [u64]) -> Option<(u32, usize)> {
        let entry = self.entry(slot)?;
        // The record's reference keeps the entry unchanged; the ring's
        // Acquire of the record made the entry's writes visible.
        let count = entry.frame_count().min(frames.len());
        // SAFETY: the record's reference.
        unsafe {
            entry
                .frames
                .read(|kept| frames[..count].copy_from_slice(&kept[..count]));
        };
        Some((entry.os_hash(), count))
    }

    /// Notes that the reader of `epoch` received `slot`'s frames (after the
    /// read wrote them into a record it returns). Reader side only.
    ///
    /// Max IRQL: `DISPATCH_LEVEL`.
    pub fn sent(&self, slot: u32, epoch: u64) {
        if let Some(entry) = self.entry(slot) {
            entry.sent_to.store(epoch, Ordering::Relaxed);
            let sent = &self.reader.sent;
            sent.store(sent.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        }
    }

    /// The table's part of the status response, with the lookup counters
    /// summed over `shards`' counters.
    ///
    /// Max IRQL: any.
    #[must_use]
    pub fn status<'c>(
        &self,
        shards: impl IntoIterator<Item = &'c TableCounters>,
    ) -> StackTableStatus {
        let mut status = StackTableStatus {
            entries: u32::try_from(self.entries.len()).unwrap_or(u32::MAX),
            sent: self.reader.sent.load(Ordering::Relaxed),
            ..StackTableStatus::default()
        };
        for counters in shards {
            let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
            status.hits += load(&counters.hits);
            status.inserts += load(&counters.inserts);
            status.evictions += load(&counters.evictions);
            status.collisions += load(&counters.collisions);
            status.full += load(&counters.full);
            status.busy += load(&counters.busy);
            status.empty += load(&counters.empty);
        }
        status.used =
            u32::try_from(status.inserts.saturating_sub(status.evictions)).unwrap_or(u32::MAX);
        status
    }
}

#[cfg(test)]
impl StackTable<'_> {
    /// References held over all entries: 0 once no record names any.
    pub(crate) fn references(&self) -> u64 {
        self.entries
            .iter()
            .map(|entry| u64::from(entry.refs.load(Ordering::Relaxed)))
            .sum()
    }
}

/// A stack table of kept entries and one shard's lookup counters: the
/// tests' table, used as a [`StackTable`] through `Deref` (host tests
/// only: the `test-support` feature).
#[cfg(feature = "test-support")]
pub struct TestTable {
    table: StackTable<'static>,
    counters: TableCounters,
}

#[cfg(feature = "test-support")]
impl TestTable {
    /// The OS hash every stack here is entered with.
    pub const OS_HASH: u32 = 7;

    /// A table of `entries` entries (a power of two), kept for the run.
    #[must_use]
    pub fn new(entries: usize) -> &'static Self {
        let entries: &'static [StackEntry] =
            crate::test_support::keep((0..entries).map(|_| StackEntry::new()).collect::<Vec<_>>());
        crate::test_support::keep(Self {
            table: StackTable::new(entries),
            counters: TableCounters::default(),
        })
    }

    /// Enters `frames` under `id`, counted in this table's counters.
    pub fn enter(&self, frames: &[u64], id: u64) -> Tabled {
        self.table.enter(frames, id, Self::OS_HASH, &self.counters)
    }

    /// The status, with this table's counters.
    #[must_use]
    pub fn status(&self) -> StackTableStatus {
        self.table.status(core::iter::once(&self.counters))
    }
}

#[cfg(feature = "test-support")]
impl core::ops::Deref for TestTable {
    type Target = StackTable<'static>;

    fn deref(&self) -> &Self::Target {
        &self.table
    }
}

/// Slot indexes fit 32 bits (the table is at most [`MAX_ENTRIES`] long,
/// checked in [`StackTable::new`]).
fn slot_number(slot: usize) -> u32 {
    u32::try_from(slot).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use std::vec::Vec;

    use proptest::prelude::*;

    use super::*;

    fn table(entries: usize) -> &'static TestTable {
        TestTable::new(entries)
    }

    /// The frames a fresh reader would receive for `slot`.
    fn frames_in(table: &StackTable<'_>, slot: u32) -> Vec<u64> {
        let mut frames = [0; MAX_FRAMES as usize];
        let (_, count) = table.frames_for(slot, &mut frames).unwrap();
        frames[..count].to_vec()
    }

    #[test]
    fn an_entry_takes_the_bytes_the_abi_documents() {
        // kstack_abi::STACK_TABLE_ENTRIES_VALUE: 544 bytes of non-paged pool.
        assert_eq!(core::mem::size_of::<StackEntry>(), 544);
    }

    #[test]
    fn settings_are_powers_of_two_within_bounds_and_zero_turns_it_off() {
        assert_eq!(entries_for_setting(None), 4096);
        assert_eq!(entries_for_setting(Some(0)), 0);
        assert_eq!(entries_for_setting(Some(1)), 1);
        assert_eq!(entries_for_setting(Some(5000)), 4096);
        assert_eq!(entries_for_setting(Some(u32::MAX)), 65_536);
    }

    #[test]
    fn a_stack_entered_twice_is_inserted_then_hit_in_the_same_slot() {
        let table = table(16);
        let first = table.enter(&[1, 2, 3], 42);
        let second = table.enter(&[1, 2, 3], 42);
        assert!(matches!(first, Tabled::Slot(_)));
        assert_eq!(first, second);
        let Tabled::Slot(slot) = first else {
            unreachable!()
        };
        assert_eq!(frames_in(table, slot), [1, 2, 3]);
        let status = table.status();
        assert_eq!((status.inserts, status.hits, status.used), (1, 1, 1));
    }

    #[test]
    fn a_shards_counters_count_each_lookup_outcome() {
        let entries: Vec<StackEntry> = (0..2).map(|_| StackEntry::new()).collect();
        let table = StackTable::new(&entries);
        let counters = TableCounters::default();
        for id in [1, 1, 2, 3, 3] {
            table.enter(&[id, 9], id, 0, &counters);
        }
        table.enter(&[], 4, 0, &counters);
        let counted = [
            &counters.hits,
            &counters.inserts,
            &counters.evictions,
            &counters.full,
            &counters.empty,
        ]
        .map(|counter| counter.load(Ordering::Relaxed));
        // 1 is inserted then hit, 2 inserted; both entries are held by
        // their references, so 3 finds the table full, twice.
        assert_eq!(counted, [1, 2, 0, 2, 1]);
    }

    #[test]
    fn another_stack_with_a_tabled_id_is_carried_inline_and_counted() {
        let table = table(16);
        let Tabled::Slot(slot) = table.enter(&[1, 2, 3], 42) else {
            panic!()
        };
        assert_eq!(table.enter(&[1, 2, 4], 42), Tabled::Inline);
        assert_eq!(table.enter(&[1, 2], 42), Tabled::Inline);
        assert_eq!(table.enter(&[9], 0), Tabled::Inline, "id 0 is never tabled");
        assert_eq!(table.status().collisions, 3);
        assert_eq!(frames_in(table, slot), [1, 2, 3], "the tabled stack stays");
    }

    #[test]
    fn a_stack_of_no_frames_is_never_tabled_and_counted_as_empty() {
        let table = table(16);
        assert_eq!(table.enter(&[], 42), Tabled::Inline);
        let status = table.status();
        assert_eq!((status.empty, status.used, status.inserts), (1, 0, 0));
    }

    #[test]
    fn an_entry_named_by_a_record_is_never_replaced_and_one_released_is() {
        let table = table(1);
        let Tabled::Slot(slot) = table.enter(&[1], 1) else {
            panic!()
        };
        assert_eq!(table.enter(&[2], 2), Tabled::Inline);
        assert_eq!(table.status().full, 1);
        table.release(slot);
        assert_eq!(table.enter(&[2], 2), Tabled::Slot(slot));
        assert_eq!(frames_in(table, slot), [2]);
        let status = table.status();
        assert_eq!((status.inserts, status.evictions, status.used), (2, 1, 1));
    }

    #[test]
    fn a_table_keeps_a_stack_in_every_entry() {
        // 64 ids with 64 different home slots: every entry takes one, far
        // more than one window's worth.
        const ENTRIES: u64 = 64;
        let table = table(64);
        let mut slots = std::collections::BTreeSet::new();
        for id in 1..=ENTRIES {
            let Tabled::Slot(slot) = table.enter(&[id, 0x1000], id) else {
                panic!("stack {id} not tabled: {:?}", table.status())
            };
            slots.insert(slot);
        }
        assert_eq!(slots.len(), 64, "one entry each");
        for id in 1..=ENTRIES {
            let Tabled::Slot(slot) = table.enter(&[id, 0x1000], id) else {
                panic!("stack {id} not found again")
            };
            assert_eq!(frames_in(table, slot), [id, 0x1000]);
        }
        let status = table.status();
        assert_eq!(
            (status.inserts, status.hits, status.used, status.evictions),
            (ENTRIES, ENTRIES, 64, 0)
        );
        assert_eq!((status.full, status.busy, status.collisions), (0, 0, 0));
    }

    #[test]
    fn a_window_wraps_past_the_last_entry() {
        // Ids 7 and 15 share home slot 7 of eight; 15 goes on to slot 0.
        let table = table(8);
        assert_eq!(table.enter(&[1], 7), Tabled::Slot(7));
        assert_eq!(table.enter(&[2], 15), Tabled::Slot(0));
        assert_eq!(frames_in(table, 0), [2]);
        assert_eq!(table.enter(&[2], 15), Tabled::Slot(0), "found there again");
    }

    #[test]
    fn the_status_sums_every_shard_and_says_the_entries() {
        let entries: &'static [StackEntry] =
            crate::test_support::keep((0..2).map(|_| StackEntry::new()).collect::<Vec<_>>());
        let table = StackTable::new(entries);
        let shards: [TableCounters; 3] = Default::default();
        let [first, second, third] = &shards;
        // Ids 2 and 4 share home slot 0 of two.
        let Tabled::Slot(a) = table.enter(&[1], 2, 7, first) else {
            panic!()
        };
        assert_eq!(table.enter(&[1], 2, 7, first), Tabled::Slot(a));
        let Tabled::Slot(b) = table.enter(&[2], 4, 7, second) else {
            panic!()
        };
        assert_eq!(table.enter(&[], 9, 7, second), Tabled::Inline);
        assert_eq!(table.enter(&[3], 2, 7, second), Tabled::Inline);
        assert_eq!(table.enter(&[], 9, 7, third), Tabled::Inline);
        assert_eq!(table.enter(&[5], 6, 7, third), Tabled::Inline);
        table.release(b);
        assert_eq!(table.enter(&[5], 6, 7, third), Tabled::Slot(b));
        // A claim lost to another writer needs a second thread (the
        // concurrency scenarios); here the counter is set as one would be.
        third.busy.fetch_add(1, Ordering::Relaxed);
        let epoch = table.begin_read(1);
        table.sent(a, epoch);
        assert_eq!(
            table.status(&shards),
            StackTableStatus {
                entries: 2,
                used: 2,
                hits: 1,
                inserts: 3,
                evictions: 1,
                collisions: 1,
                full: 1,
                busy: 1,
                empty: 2,
                sent: 1,
            }
        );
    }

    #[test]
    fn the_oldest_entry_no_record_names_is_replaced_first() {
        let table = table(2);
        // Ids 2 and 4 share home slot 0 of two.
        let Tabled::Slot(a) = table.enter(&[1], 2) else {
            panic!()
        };
        let Tabled::Slot(b) = table.enter(&[2], 4) else {
            panic!()
        };
        table.release(a);
        table.release(b);
        assert_eq!(table.enter(&[3], 6), Tabled::Slot(a));
        table.release(a);
        assert_eq!(table.enter(&[4], 8), Tabled::Slot(b));
    }

    #[test]
    fn a_reader_gets_each_stack_once_a_new_reader_again_and_a_rewritten_entry_again() {
        let table = table(1);
        let Tabled::Slot(slot) = table.enter(&[1, 2], 1) else {
            panic!()
        };
        let mut frames = [0; MAX_FRAMES as usize];
        let epoch = table.begin_read(100);
        assert_eq!(table.received(slot, epoch), None);
        assert_eq!(table.frames_for(slot, &mut frames), Some((7, 2)));
        table.sent(slot, epoch);
        assert_eq!(table.begin_read(100), epoch, "the same reader");
        assert_eq!(table.received(slot, epoch), Some(7));
        let other = table.begin_read(200);
        assert_ne!(other, epoch);
        assert_eq!(table.received(slot, other), None);
        assert_eq!(table.frames_for(slot, &mut frames), Some((7, 2)));
        table.sent(slot, other);
        // Reader 200 closes; a new file object at its address is new.
        table.reader_closed(200);
        let reused = table.begin_read(200);
        assert_ne!(reused, other);
        table.sent(slot, reused);
        table.release(slot);
        assert_eq!(table.enter(&[3], 2), Tabled::Slot(slot));
        assert_eq!(
            table.received(slot, reused),
            None,
            "a rewritten entry is sent again"
        );
        assert_eq!(table.frames_for(slot, &mut frames), Some((7, 1)));
        assert_eq!(table.status().sent, 3);
        assert_eq!(table.frames_for(1, &mut frames), None, "no such slot");
    }

    #[derive(Clone, Debug)]
    enum Op {
        /// Enter stack `n` of a small set (ids collide for some).
        Enter(u8),
        /// Release the n-th reference still held.
        Release(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0_u8..12).prop_map(Op::Enter),
            2 => any::<usize>().prop_map(Op::Release),
        ]
    }

    /// Stack `n`: ids from a set of 8, so stacks 8..12 collide with 0..4;
    /// depths differ so frames differ.
    fn stack(n: u8) -> (u64, Vec<u64>) {
        let id = u64::from(n % 8) + 1;
        (id, (0..=u64::from(n)).map(|frame| 0x1000 + frame).collect())
    }

    proptest! {
        /// Against a model: a slot handed out holds its stack for as long as
        /// the reference is held, every lookup has one outcome, and `used`
        /// never passes the entries.
        #[test]
        fn references_keep_their_stacks_and_the_counters_add_up(
            entries in prop_oneof![Just(1_usize), Just(2), Just(4), Just(16)],
            // Miri interprets every access: shorter runs there.
            ops in proptest::collection::vec(op(), 1..if cfg!(miri) { 60 } else { 200 }),
        ) {
            let table = table(entries);
            let mut held: Vec<(u32, Vec<u64>)> = Vec::new();
            let mut lookups = 0_u64;
            for op in ops {
                match op {
                    Op::Enter(n) => {
                        let (id, frames) = stack(n);
                        lookups += 1;
                        if let Tabled::Slot(slot) = table.enter(&frames, id) {
                            prop_assert_eq!(&frames_in(table, slot), &frames);
                            held.push((slot, frames));
                        }
                    }
                    Op::Release(index) if !held.is_empty() => {
                        let (slot, frames) = held.remove(index % held.len());
                        prop_assert_eq!(&frames_in(table, slot), &frames);
                        table.release(slot);
                    }
                    Op::Release(_) => {}
                }
                for (slot, frames) in &held {
                    prop_assert_eq!(&frames_in(table, *slot), frames);
                }
                let status = table.status();
                prop_assert_eq!(
                    status.hits
                        + status.inserts
                        + status.collisions
                        + status.full
                        + status.busy
                        + status.empty,
                    lookups
                );
                prop_assert!(status.used as usize <= entries);
                prop_assert_eq!(status.busy, 0, "one thread never finds a claim");
            }
        }
    }
}
