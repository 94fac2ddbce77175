//! The record ring as the driver keeps it: one [`RecordRing`] per processor
//! shard, so captures on different processors never write the same cache
//! line.
//!
//! Why: with a single ring every capture on every processor claimed its slot
//! with a compare-and-swap on one shared `tail` and took its sequence number
//! from one shared counter; two processors publishing back to back spent
//! most of their time moving those two lines between them
//! (`docs/performance.md`).
//!
//! The design:
//!
//! - **Shards.** [`shard_count`]: one per active processor, at most
//!   [`MAX_SHARDS`], and no more than leaves each shard [`MIN_SHARD_BYTES`]
//!   (room for two records of the deepest stack). A capture publishes at `DISPATCH_LEVEL`, into the shard of the
//!   processor it reads after raising, so on Windows a shard is written by
//!   its own processor only, one section at a time, and a section is never
//!   descheduled ([`RecordRing`]). Processors past the shard count share
//!   shards; the ring's writer word then makes the second wait for the
//!   first's section. A full shard drops the newest record and counts it.
//! - **Capacity.** `Parameters\RingCapacity` is the total over all shards,
//!   in KiB: of its `w` eight-byte words, shard `i` of `n` gets `w / n`,
//!   and the first `w % n` shards one more ([`shard_capacity`]). Status
//!   reports the total capacity in bytes, and the sums of bytes and records
//!   in use and of records dropped.
//! - **Which shard.** The processor's index modulo the shard count
//!   ([`ShardedRing::shard_for`]); with one shard per processor that is the
//!   processor's own.
//! - **Sequence numbers.** Per shard, from 1, taken with the slot inside
//!   the shard's publish section (on the line its producers already own):
//!   there is no counter shared by all processors. A record carries its
//!   shard and its number, so `(shard, sequence)` names it, and per shard
//!   every number spent is a record read, waiting, dropped (shard full) or
//!   cleared.
//! - **Counters.** The per-source counts a capture bumps are kept per shard
//!   as well, and summed for status, so a capture writes nothing but its
//!   own shard: `entered` (trace records that entered the shard, published
//!   or dropped, by source and user part, counted inside the publish
//!   section with one plain add, so per shard the sum over them and the
//!   module records is the sequence numbers spent; a source's `captured`
//!   is its row's sum), `skipped_irql`, `skipped_stack`, `filtered` and
//!   `not_kept` (see `kstack_abi::SourceStatus`).
//! - **Reading.** One consumer for all shards: [`ShardedRing::consumer`]
//!   takes every shard's try-lock in shard order and gives up if one is
//!   held, so a second concurrent reader is told the device is busy and
//!   nobody waits. A read merges the shards by timestamp: it copies the
//!   oldest of the shards' first records, again and again, whole records
//!   only, until the buffer is full or no shard has a written record
//!   ([`ShardedConsumer::drain`]). Each shard's own order is kept, ties go
//!   to the lower shard. A clear discards every shard.
//! - **Order across reads.** A read returns only records stamped before
//!   the read's *cut*, so no record it leaves can be older than one it
//!   returned. The cut is the clock read at the read's start, once every
//!   shard is seen *settled* ([`RecordRing::settle`]): no publish section
//!   that began before that clock read is still inside. A section that
//!   begins later stamps its record later (its timestamp is taken inside
//!   the section), so everything older than the cut is written. If a shard
//!   does not settle within [`crate::ring::SETTLE_SPINS`] looks (a
//!   preempted section: never on Windows, where sections run at
//!   `DISPATCH_LEVEL`), the read keeps the previous read's cut, for which
//!   this was already proven ([`ShardedConsumer::cut`]). Records stamped at
//!   or after the cut wait for a later read.
//!
//! A [`Shard`] is 128-byte aligned (its ring's producer and consumer sides
//! are), so shards side by side in memory share no cache line.

use kstack_abi::{MAX_RECORD_SIZE, MAX_SHARDS, Source, SourceStatus, UserPart};

use crate::{
    ring::{Consumer, Drained, Full, RecordRing, WORD_SIZE, Word},
    stack_table::TableCounters,
    sync::{AtomicU64, Ordering, fence},
};

/// [`MAX_SHARDS`] as an array length.
const SHARDS: usize = MAX_SHARDS as usize;

/// The least memory the driver gives a shard: two records of
/// [`MAX_RECORD_SIZE`], so a record of any depth fits an empty shard
/// wherever its tail stands (see [`RecordRing`]'s wrap mark).
pub const MIN_SHARD_BYTES: usize = 2 * MAX_RECORD_SIZE;

/// How many shards a ring of `capacity` bytes gets on a machine with
/// `processors` active processors (at least one).
///
/// Max IRQL: any.
#[must_use]
pub fn shard_count(processors: u32, capacity: usize) -> usize {
    usize::try_from(processors)
        .unwrap_or(SHARDS)
        .clamp(1, SHARDS)
        .min((capacity / MIN_SHARD_BYTES).max(1))
}

/// The words of shard `index` when `words` words are split over `shards`.
///
/// Max IRQL: any.
#[must_use]
pub const fn shard_capacity(words: usize, shards: usize, index: usize) -> usize {
    words / shards + if index < words % shards { 1 } else { 0 }
}

/// The words of a ring of `capacity` bytes (rounded down to whole words).
pub fn ring_words(capacity: usize) -> impl Iterator<Item = Word> {
    (0..capacity / WORD_SIZE).map(|_| Word::new())
}

/// The shards over `words`, split as [`shard_capacity`] says.
///
/// # Panics
/// When a shard would get fewer than [`crate::ring::MIN_WORDS`] words, or there are
/// more than [`MAX_SHARDS`] shards.
pub fn shards_over(words: &[Word], shards: usize) -> impl Iterator<Item = Shard<'_>> {
    let mut rest = words;
    (0..shards).map(move |index| {
        let (own, others) = rest.split_at(shard_capacity(words.len(), shards, index));
        rest = others;
        Shard {
            ring: RecordRing::new(own),
            index: u16::try_from(index)
                .ok()
                .filter(|&index| index < MAX_SHARDS)
                .expect("at most MAX_SHARDS shards"),
            entered: core::array::from_fn(|_| core::array::from_fn(|_| AtomicU64::new(0))),
            skipped_irql: core::array::from_fn(|_| AtomicU64::new(0)),
            skipped_stack: core::array::from_fn(|_| AtomicU64::new(0)),
            filtered: core::array::from_fn(|_| AtomicU64::new(0)),
            not_kept: core::array::from_fn(|_| AtomicU64::new(0)),
            sampled_out: core::array::from_fn(|_| AtomicU64::new(0)),
            sample_ticks: core::array::from_fn(|_| AtomicU64::new(0)),
            answered_only: core::array::from_fn(|_| AtomicU64::new(0)),
            module_records: AtomicU64::new(0),
            table: TableCounters::default(),
        }
    })
}

/// One processor's part of the ring: its records, and the per-source
/// counters its captures bump.
pub struct Shard<'a> {
    ring: RecordRing<'a>,
    /// Its place among the shards, written into its records.
    index: u16,
    /// Trace records that entered this shard (published or dropped), per
    /// source ([`Source::index`]) and by what happened to their user part
    /// ([`UserPart::index`]); written inside the publish section only. One
    /// counter a record: a source's captured count and its records' user
    /// parts are both sums over these.
    entered: [[AtomicU64; UserPart::COUNT]; Source::COUNT],
    /// Walks skipped because the IRQL was too high, per source.
    skipped_irql: [AtomicU64; Source::COUNT],
    /// Walks skipped because too little kernel stack was left, per source.
    skipped_stack: [AtomicU64; Source::COUNT],
    /// Events left out by the process filter, per source.
    filtered: [AtomicU64; Source::COUNT],
    /// Capture-now records answered to their caller only, the on-demand
    /// source being disabled, per source.
    not_kept: [AtomicU64; Source::COUNT],
    /// Events not kept by their source's sampling, per source.
    sampled_out: [AtomicU64; Source::COUNT],
    /// Events that reached this shard's sampling, per source: the n-th
    /// (from 0) is kept when n is a multiple of the source's rate.
    sample_ticks: [AtomicU64; Source::COUNT],
    /// Capture-nows answered to their caller only (the on-demand source's
    /// walked events that enter no ring), by what happened to their user
    /// part.
    answered_only: [AtomicU64; UserPart::COUNT],
    /// Module records that entered this shard (published or dropped);
    /// written inside the publish section only.
    module_records: AtomicU64,
    /// The stack table's lookup outcomes of this shard's captures.
    table: TableCounters,
}

/// What a record entering a shard is counted as, inside its publish
/// section.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counted {
    /// A trace record of this source, with this user-part outcome.
    Trace(Source, UserPart),
    /// A module record.
    Module,
}

/// A per-source counter of a shard, bumped where any processor may be
/// running (outside the publish section).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Uncaptured {
    /// A walk skipped because the IRQL was too high.
    SkippedIrql,
    /// A walk skipped because too little kernel stack was left.
    SkippedStack,
    /// An event left out by the process filter.
    Filtered,
    /// A capture-now record answered to its caller only.
    NotKept,
    /// An event not kept by its source's sampling.
    SampledOut,
}

impl Shard<'_> {
    /// Its place among the shards.
    ///
    /// Max IRQL: any.
    #[must_use]
    pub const fn index(&self) -> u16 {
        self.index
    }

    /// Publishes one record, `size` bytes, under this shard's next
    /// sequence number (see [`RecordRing::publish`]), and counts it, kept or
    /// dropped, inside the same section: a trace record as captured for its
    /// source and by its user part's outcome, a module record as such.
    ///
    /// # Errors
    /// [`Full`] when the shard lacks room; the drop is counted.
    ///
    /// Max IRQL: `DISPATCH_LEVEL` (the driver calls it at `DISPATCH_LEVEL`).
    pub fn publish(
        &self,
        counted: Counted,
        size: usize,
        write: impl FnOnce(u64, &mut [u8]),
    ) -> Result<u64, Full> {
        self.ring.publish_counted(size, write, || {
            // Inside the section: only this producer writes the counter, so
            // a plain load and store count exactly, without a locked
            // instruction.
            let entered = match counted {
                Counted::Trace(source, user_part) => {
                    &self.entered[source.index()][user_part.index()]
                }
                Counted::Module => &self.module_records,
            };
            entered.store(entered.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        })
    }

    /// The stack table's lookup counters for this shard's captures.
    ///
    /// Max IRQL: any.
    #[must_use]
    pub const fn table_counters(&self) -> &TableCounters {
        &self.table
    }

    /// Counts an event of `source` that did not enter the ring, and why.
    ///
    /// Max IRQL: any.
    pub fn count(&self, source: Source, why: Uncaptured) {
        let counters = match why {
            Uncaptured::SkippedIrql => &self.skipped_irql,
            Uncaptured::SkippedStack => &self.skipped_stack,
            Uncaptured::Filtered => &self.filtered,
            Uncaptured::NotKept => &self.not_kept,
            Uncaptured::SampledOut => &self.sampled_out,
        };
        counters[source.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a capture-now answered to its caller only (an on-demand
    /// event that enters no ring) whose user part had outcome `part`;
    /// events that enter a ring are counted by [`Shard::publish`].
    ///
    /// Max IRQL: any.
    pub fn count_answered_only(&self, part: UserPart) {
        self.answered_only[part.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Whether this shard keeps its next event of `source` under
    /// one-in-`every` sampling: the first, then every `every`-th. One not
    /// kept is counted as sampled out.
    ///
    /// Max IRQL: any.
    pub fn sample(&self, source: Source, every: u16) -> bool {
        let tick = self.sample_ticks[source.index()].fetch_add(1, Ordering::Relaxed);
        let kept = tick.is_multiple_of(u64::from(every.max(1)));
        if !kept {
            self.count(source, Uncaptured::SampledOut);
        }
        kept
    }

    /// This shard's ring.
    ///
    /// Max IRQL: any.
    #[must_use]
    pub const fn ring(&self) -> &RecordRing<'_> {
        &self.ring
    }
}

/// The shards, as one ring to the rest of the driver.
pub struct ShardedRing<'a> {
    shards: &'a [Shard<'a>],
    /// The last read's cut: every record stamped before it was written
    /// when that read looked. Written by the consumer only.
    cut: AtomicU64,
    /// Records copied out by reads. Written by the consumer only.
    read: AtomicU64,
}

impl<'a> ShardedRing<'a> {
    /// The ring over `shards`, made by [`shards_over`].
    ///
    /// # Panics
    /// When there is no shard, or the shards are not numbered in order.
    #[must_use]
    pub fn new(shards: &'a [Shard<'a>]) -> Self {
        assert!(!shards.is_empty(), "a ring needs at least one shard");
        assert!(
            shards
                .iter()
                .zip(0_u16..)
                .all(|(shard, index)| shard.index == index),
            "shards must be numbered in order"
        );
        Self {
            shards,
            cut: AtomicU64::new(0),
            read: AtomicU64::new(0),
        }
    }

    /// The shards, in order.
    ///
    /// Max IRQL: any.
    #[must_use]
    pub const fn shards(&self) -> &'a [Shard<'a>] {
        self.shards
    }

    /// The shard a capture on `processor` publishes into.
    ///
    /// Max IRQL: any.
    #[must_use]
    pub fn shard_for(&self, processor: u32) -> &'a Shard<'a> {
        let index = usize::try_from(processor).unwrap_or(usize::MAX);
        // One shard per processor is the usual case: no division then.
        self.shards
            .get(index)
            .unwrap_or_else(|| &self.shards[index % self.shards.len()])
    }

    /// Bytes of all shards.
    ///
    /// Max IRQL: any.
    #[must_use]
    pub fn capacity(&self) -> usize {
        self.shards.iter().map(|shard| shard.ring.capacity()).sum()
    }

    /// Bytes in use in all shards (see [`RecordRing::bytes_used`]).
    ///
    /// Max IRQL: `DISPATCH_LEVEL`.
    #[must_use]
    pub fn bytes_used(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| shard.ring.bytes_used())
            .sum()
    }

    /// Records waiting in all shards.
    ///
    /// Max IRQL: `DISPATCH_LEVEL`.
    #[must_use]
    pub fn len(&self) -> usize {
        self.shards.iter().map(|shard| shard.ring.len()).sum()
    }

    /// Whether no shard holds a record.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Records dropped because their shard was full.
    ///
    /// Max IRQL: any.
    #[must_use]
    pub fn dropped(&self) -> u64 {
        self.shards.iter().map(|shard| shard.ring.dropped()).sum()
    }

    /// Sequence numbers spent, over all shards.
    ///
    /// Max IRQL: any.
    #[must_use]
    pub fn sequences_spent(&self) -> u64 {
        self.shards
            .iter()
            .map(|shard| shard.ring.sequences_spent())
            .sum()
    }

    /// Records of `source` that entered the ring (published or dropped),
    /// over all shards.
    ///
    /// Max IRQL: any.
    #[must_use]
    pub fn captured(&self, source: Source) -> u64 {
        self.shards
            .iter()
            .flat_map(|shard| &shard.entered[source.index()])
            .map(|counter| counter.load(Ordering::Relaxed))
            .sum()
    }

    /// Module records that entered the ring (published or dropped), over
    /// all shards.
    ///
    /// Max IRQL: any.
    #[must_use]
    pub fn module_records(&self) -> u64 {
        self.shards
            .iter()
            .map(|shard| shard.module_records.load(Ordering::Relaxed))
            .sum()
    }

    /// Events of `source` that did not enter the ring for `why`, over all
    /// shards.
    ///
    /// Max IRQL: any.
    #[must_use]
    pub fn uncaptured(&self, source: Source, why: Uncaptured) -> u64 {
        self.shards
            .iter()
            .map(|shard| {
                let counters = match why {
                    Uncaptured::SkippedIrql => &shard.skipped_irql,
                    Uncaptured::SkippedStack => &shard.skipped_stack,
                    Uncaptured::Filtered => &shard.filtered,
                    Uncaptured::NotKept => &shard.not_kept,
                    Uncaptured::SampledOut => &shard.sampled_out,
                };
                counters[source.index()].load(Ordering::Relaxed)
            })
            .sum()
    }

    /// Walked events of `source` by their user part's outcome, over all
    /// shards.
    ///
    /// Max IRQL: any.
    #[must_use]
    pub fn user_parts(&self, source: Source) -> [u64; UserPart::COUNT] {
        core::array::from_fn(|part| {
            self.shards
                .iter()
                .map(|shard| {
                    let answered_only = if source == Source::OnDemand {
                        shard.answered_only[part].load(Ordering::Relaxed)
                    } else {
                        0
                    };
                    shard.entered[source.index()][part].load(Ordering::Relaxed) + answered_only
                })
                .sum()
        })
    }

    /// `source`'s counters over all shards, as the status reports them
    /// (registration and availability are the caller's, left as in
    /// [`SourceStatus::ZERO`]): what [`ShardedRing::captured`],
    /// [`ShardedRing::uncaptured`] and [`ShardedRing::user_parts`] return,
    /// in one pass over the shards that loads each counter once, so the
    /// `captured` it reports is the sum of the `entered` counters its user
    /// parts were read from. The status used to call those three, a pass
    /// over the shards per counter and per user part: about 39,000 of
    /// Miri's basic blocks a status against about 14,000 for this, where
    /// the request proptests take a status after every step.
    ///
    /// Max IRQL: any.
    #[must_use]
    pub fn source_counts(&self, source: Source) -> SourceStatus {
        let index = source.index();
        let mut counts = SourceStatus::ZERO;
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        for shard in self.shards {
            for (sum, entered) in counts.user_parts.iter_mut().zip(&shard.entered[index]) {
                let entered = load(entered);
                counts.captured += entered;
                *sum += entered;
            }
            if source == Source::OnDemand {
                for (sum, answered) in counts.user_parts.iter_mut().zip(&shard.answered_only) {
                    *sum += load(answered);
                }
            }
            counts.skipped_irql += load(&shard.skipped_irql[index]);
            counts.skipped_stack += load(&shard.skipped_stack[index]);
            counts.filtered += load(&shard.filtered[index]);
            counts.not_kept += load(&shard.not_kept[index]);
            counts.sampled_out += load(&shard.sampled_out[index]);
        }
        counts
    }

    /// Records copied out by reads.
    ///
    /// Max IRQL: any.
    #[must_use]
    pub fn read(&self) -> u64 {
        self.read.load(Ordering::Relaxed)
    }

    /// The consumer side of every shard, unless another caller holds any of
    /// them now. The try-locks are taken in shard order, so whoever holds
    /// the first holds all.
    ///
    /// Max IRQL: `DISPATCH_LEVEL`.
    #[must_use]
    pub fn consumer(&self) -> Option<ShardedConsumer<'_, 'a>> {
        let mut consumers = [const { None }; SHARDS];
        for (held, shard) in consumers.iter_mut().zip(self.shards) {
            // Returning drops (releases) those already taken.
            *held = Some(shard.ring.consumer()?);
        }
        Some(ShardedConsumer {
            consumers,
            count: self.shards.len(),
            ring: self,
        })
    }
}

/// The shard of the lowest key among `keys` (a shard's oldest record's
/// key, `None` for none; the lower shard first on a tie), and the key and
/// shard that come next among the others; `None` when every shard is
/// empty.
fn first_two(keys: &[Option<u64>]) -> Option<(usize, Option<(u64, usize)>)> {
    let mut first: Option<(u64, usize)> = None;
    let mut second: Option<(u64, usize)> = None;
    for (index, key) in keys.iter().enumerate() {
        let Some(key) = *key else { continue };
        let this = (key, index);
        if first.is_none_or(|first| this < first) {
            second = first;
            first = Some(this);
        } else if second.is_none_or(|second| this < second) {
            second = Some(this);
        }
    }
    first.map(|(_, index)| (index, second))
}

/// Exclusive access to every shard's consumer side; released when dropped.
pub struct ShardedConsumer<'r, 'a> {
    /// One per shard, in order; `None` past the last shard.
    consumers: [Option<Consumer<'r, 'a>>; SHARDS],
    /// How many shards there are.
    count: usize,
    ring: &'r ShardedRing<'a>,
}

impl ShardedConsumer<'_, '_> {
    /// The cut for a read that began at `now` (a timestamp taken just
    /// before this call): `now` when every shard settles, else the
    /// previous read's cut. Every record stamped before the returned cut
    /// is written (see the module's "Order across reads"), and cuts never
    /// go backwards.
    ///
    /// Max IRQL: `DISPATCH_LEVEL` (the driver calls it at `PASSIVE_LEVEL`).
    pub fn cut(&mut self, now: u64) -> u64 {
        // The clock read before this fence; the writer words after it.
        fence(Ordering::SeqCst);
        let previous = self.ring.cut.load(Ordering::Relaxed);
        let settled = self
            .consumers
            .iter()
            .flatten()
            .all(|consumer| consumer.ring().settle());
        let cut = if settled { now.max(previous) } else { previous };
        self.ring.cut.store(cut, Ordering::Relaxed);
        cut
    }

    /// [`ShardedConsumer::drain_with`], copying each record as it is.
    ///
    /// Max IRQL: `DISPATCH_LEVEL`.
    pub fn drain(&mut self, out: &mut [u8], order: impl Fn(&[u8]) -> u64, cut: u64) -> Drained {
        self.drain_with(out, order, cut, |record, room| {
            room.get_mut(..record.len())?.copy_from_slice(record);
            Some(record.len())
        })
    }

    /// Writes whole records stamped before `cut` into `out` while they
    /// fit (`write` gets a record and the room left, and returns the bytes
    /// it wrote there, or `None` when they do not fit), merging the shards: each time the written record with the
    /// lowest `order` (the timestamp) among the shards' oldest, the lower
    /// shard first on a tie. A record still being written, or stamped at
    /// or after `cut`, ends its shard's part of this drain. Counts the
    /// records copied as read.
    ///
    /// Max IRQL: `DISPATCH_LEVEL` (the driver calls it at `PASSIVE_LEVEL`).
    pub fn drain_with(
        &mut self,
        out: &mut [u8],
        order: impl Fn(&[u8]) -> u64,
        cut: u64,
        mut write: impl FnMut(&[u8], &mut [u8]) -> Option<usize>,
    ) -> Drained {
        let mut drained = Drained::default();
        let mut keys: [Option<u64>; SHARDS] = [None; SHARDS];
        let before_cut = |record: &[u8]| Some(order(record)).filter(|&key| key < cut);
        // Each shard's oldest written record's key (`None`: nothing
        // written before the cut).
        let oldest = &mut keys[..self.count];
        for (key, consumer) in oldest.iter_mut().zip(self.consumers.iter().flatten()) {
            *key = consumer.peek(before_cut).flatten();
        }
        // Records stamped before the cut are all written when the drain
        // starts, so there are at most the ring's worth of them: the bound
        // only keeps a broken consumer from looping forever.
        let mut steps_left: usize = self
            .consumers
            .iter()
            .flatten()
            .map(|consumer| consumer.ring().max_records())
            .sum();
        // One look over the shards finds the oldest record and the one
        // after it among the others (the bound); the oldest's shard is then
        // taken from for as long as its next record stays ahead of the
        // bound, with no look over the others: a run of one shard's records
        // costs one look, not one per record, and each record is looked at
        // once, by the take that takes it or leaves it.
        'merge: while let Some((index, bound)) = first_two(oldest) {
            let Some(consumer) = self.consumers[index].as_mut() else {
                break;
            };
            loop {
                if steps_left == 0 {
                    break 'merge;
                }
                // The shard's oldest record is taken when it is ahead of the
                // bound: an earlier key, or the same from a lower shard (ties
                // go to the lower shard). Otherwise it stays, and its key
                // goes back into the next look over the shards.
                let mut behind = None;
                let taken = consumer.take_front(|record| {
                    let key = before_cut(record);
                    let ahead = match (key, bound) {
                        (Some(key), Some(bound)) => (key, index) < bound,
                        (Some(_), None) => true,
                        (None, _) => false,
                    };
                    if !ahead {
                        behind = Some(key);
                        return false;
                    }
                    drained.write(out, |room| write(record, room))
                });
                match (taken, behind) {
                    (Some(true), _) => steps_left -= 1,
                    (None, _) => {
                        oldest[index] = None;
                        break;
                    }
                    (Some(false), Some(key)) => {
                        oldest[index] = key;
                        break;
                    }
                    // The record did not fit: more is pending.
                    (Some(false), None) => break 'merge,
                }
            }
        }
        let read = &self.ring.read;
        read.store(
            read.load(Ordering::Relaxed) + u64::from(drained.records),
            Ordering::Relaxed,
        );
        drained
    }

    /// Discards every written record of every shard, each passed to
    /// `discard` first; returns how many.
    ///
    /// Max IRQL: `DISPATCH_LEVEL`.
    pub fn discard_each(&mut self, mut discard: impl FnMut(&[u8])) -> u64 {
        self.consumers
            .iter_mut()
            .flatten()
            .map(|consumer| consumer.discard_each(&mut discard))
            .sum()
    }

    /// Discards every written record of every shard; returns how many.
    ///
    /// Max IRQL: `DISPATCH_LEVEL`.
    pub fn discard_all(&mut self) -> u64 {
        self.discard_each(|_| ())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::{collections::VecDeque, vec::Vec};

    use proptest::prelude::*;

    use super::*;
    use crate::test_support::keep;

    /// A sharded ring of `words` words in `shards` shards, kept for the
    /// whole run ([`crate::test_support::keep`]) so tests and their threads
    /// can hold it as long as they like.
    pub(crate) fn leaked_ring(words: usize, shards: usize) -> ShardedRing<'static> {
        let words: &'static [Word] = keep((0..words).map(|_| Word::new()).collect::<Vec<_>>());
        let shards: &'static [Shard<'static>] =
            keep(shards_over(words, shards).collect::<Vec<_>>());
        ShardedRing::new(shards)
    }

    /// A fake record: after the size word the ring writes, its merge key,
    /// the low bits of the sequence number the ring gave it, then `fill`.
    fn record(key: u16, fill: u8) -> impl FnOnce(u64, &mut [u8]) {
        move |sequence, record| {
            let size = u16::try_from(record.len()).unwrap();
            record.copy_from_slice(&fake(size, key, sequence, fill));
        }
    }

    fn fake(size: u16, key: u16, sequence: u64, fill: u8) -> Vec<u8> {
        let mut bytes = vec![fill; usize::from(size)];
        bytes[..2].copy_from_slice(&size.to_le_bytes());
        bytes[2..4].copy_from_slice(&key.to_le_bytes());
        bytes[4..6].copy_from_slice(&u16::try_from(sequence % 65_536).unwrap().to_le_bytes());
        bytes
    }

    fn key(record: &[u8]) -> u64 {
        u64::from(u16::from_le_bytes([record[2], record[3]]))
    }

    #[test]
    fn shard_count_follows_processors_within_bounds() {
        assert_eq!(shard_count(2, 1 << 20), 2);
        assert_eq!(shard_count(0, 1 << 20), 1, "at least one shard");
        assert_eq!(shard_count(1000, 1 << 20), SHARDS);
        assert_eq!(shard_count(MAX_SHARDS.into(), 1 << 20), SHARDS);
        assert_eq!(shard_count(u32::from(MAX_SHARDS) + 1, 1 << 20), SHARDS);
        assert_eq!(shard_count(u32::from(MAX_SHARDS) - 1, 1 << 20), SHARDS - 1);
        assert_eq!(
            shard_count(64, 8 * MIN_SHARD_BYTES + 8),
            8,
            "every shard keeps MIN_SHARD_BYTES"
        );
        assert_eq!(shard_count(64, 16 * 1024), 14, "the least RingCapacity");
        assert_eq!(shard_count(u32::MAX, 2), 1);
        assert_eq!(MIN_SHARD_BYTES % WORD_SIZE, 0);
    }

    #[test]
    fn a_capacity_in_bytes_makes_whole_words() {
        assert_eq!(ring_words(1024).count(), 128);
        assert_eq!(ring_words(1031).count(), 128, "rounded down");
        assert_eq!(ring_words(7).count(), 0);
    }

    #[test]
    fn capacity_is_split_with_the_remainder_in_front() {
        let sizes: Vec<_> = (0..4).map(|index| shard_capacity(18, 4, index)).collect();
        assert_eq!(sizes, [5, 5, 4, 4], "words");
        // The driver's default and largest rings take 9 and 144 MiB: too
        // much for Miri, which checks the small ones.
        let words_of = |kib| crate::ring::capacity_for_setting(kib) / WORD_SIZE;
        let large: &[(usize, usize)] = if cfg!(miri) {
            &[]
        } else {
            &[(words_of(None), 64), (words_of(Some(u32::MAX)), 7)]
        };
        for &(words, shards) in [(16, 1), (16, 2), (17, 3)].iter().chain(large) {
            let ring = leaked_ring(words, shards);
            assert_eq!(ring.capacity(), words * WORD_SIZE, "in bytes");
            assert_eq!(ring.shards().len(), shards);
        }
    }

    #[test]
    fn a_run_of_one_shard_stops_at_the_others_oldest_and_ties_go_to_the_lower_shard() {
        let ring = leaked_ring(48, 3);
        let publish = |processor: u32, key: u16| {
            ring.shard_for(processor)
                .publish(
                    Counted::Trace(Source::Timer, UserPart::Off),
                    8,
                    record(key, 0),
                )
                .unwrap();
        };
        // Shard 2 runs ahead of the others, then ties with shard 0; shard 1
        // ties with shard 2 later.
        for (processor, key) in [(0, 5), (0, 9), (1, 7), (2, 1), (2, 2), (2, 5), (2, 7)] {
            publish(processor, key);
        }
        let mut out = [0_u8; 256];
        let drained = ring.consumer().unwrap().drain(&mut out, key, u64::MAX);
        let order: Vec<(u64, u16)> = out[..drained.bytes]
            .chunks_exact(8)
            .map(|record| (key(record), u16::from_le_bytes([record[4], record[5]])))
            .collect();
        // (key, that shard's sequence number): shard 2's run stops before
        // its key 5, which shard 0 holds too, and before its key 7, which
        // shard 1 holds too.
        assert_eq!(
            order,
            [(1, 1), (2, 2), (5, 1), (5, 3), (7, 1), (7, 4), (9, 2)]
        );
    }

    #[test]
    fn as_many_shards_as_max_shards_are_made_and_drained() {
        let ring = leaked_ring(SHARDS * crate::ring::MIN_WORDS, SHARDS);
        let last = ring.shard_for(MAX_SHARDS.into()).index();
        assert_eq!(last, 0, "processor MAX_SHARDS wraps to shard 0");
        let last = ring.shard_for(u32::from(MAX_SHARDS) - 1);
        assert_eq!(
            last.publish(
                Counted::Trace(Source::Timer, UserPart::Off),
                8,
                record(7, 0)
            ),
            Ok(1)
        );
        assert!(!ring.is_empty(), "a record in the last shard");
        let mut out = [0_u8; 64];
        let drained = ring.consumer().unwrap().drain(&mut out, key, u64::MAX);
        assert_eq!(drained.records, 1, "the last shard is drained too");
        assert!(ring.is_empty());
    }

    #[test]
    #[should_panic(expected = "at most MAX_SHARDS shards")]
    fn more_shards_than_max_shards_are_refused() {
        let words: Vec<Word> = ring_words((SHARDS + 1) * MIN_SHARD_BYTES).collect();
        let _ = shards_over(&words, SHARDS + 1).count();
    }

    #[test]
    fn shards_side_by_side_share_no_cache_line() {
        assert_eq!(core::mem::align_of::<Shard<'_>>(), 128);
        assert_eq!(core::mem::size_of::<Shard<'_>>() % 128, 0);
    }

    #[test]
    fn processors_map_onto_shards() {
        let ring = leaked_ring(16, 3);
        assert_eq!(ring.shard_for(0).index(), 0);
        assert_eq!(ring.shard_for(2).index(), 2);
        assert_eq!(ring.shard_for(3).index(), 0, "past the last shard: wraps");
        assert_eq!(ring.shard_for(u32::MAX).index(), 0);
    }

    #[test]
    fn sequences_and_drops_are_per_shard() {
        let ring = leaked_ring(4, 2);
        let (first, second) = (ring.shard_for(0), ring.shard_for(1));
        assert_eq!(
            first.publish(
                Counted::Trace(Source::Timer, UserPart::Off),
                8,
                record(1, 0)
            ),
            Ok(1)
        );
        assert_eq!(
            second.publish(
                Counted::Trace(Source::Timer, UserPart::Off),
                8,
                record(2, 0)
            ),
            Ok(1)
        );
        assert_eq!(
            first.publish(
                Counted::Trace(Source::Timer, UserPart::Off),
                8,
                record(3, 0)
            ),
            Ok(2)
        );
        assert_eq!(
            first.publish(
                Counted::Trace(Source::Timer, UserPart::Off),
                8,
                record(4, 0)
            ),
            Err(Full { sequence: 3 })
        );
        assert_eq!(
            (ring.len(), ring.dropped(), ring.sequences_spent()),
            (3, 1, 4)
        );
        assert_eq!(ring.bytes_used(), 3 * 8, "summed over shards");
        assert!(!ring.is_empty());
        let mut out = [0_u8; 256];
        let drained = ring.consumer().unwrap().drain(&mut out, key, u64::MAX);
        let keys: Vec<_> = out[..drained.bytes].chunks_exact(8).map(key).collect();
        assert_eq!(keys, [1, 2, 3], "merged by key");
    }

    #[test]
    fn a_drain_stops_at_a_record_that_does_not_fit() {
        let ring = leaked_ring(8, 2);
        ring.shard_for(0)
            .publish(
                Counted::Trace(Source::Timer, UserPart::Off),
                8,
                record(1, 0),
            )
            .unwrap();
        ring.shard_for(1)
            .publish(
                Counted::Trace(Source::Timer, UserPart::Off),
                16,
                record(2, 0),
            )
            .unwrap();
        ring.shard_for(0)
            .publish(
                Counted::Trace(Source::Timer, UserPart::Off),
                8,
                record(3, 0),
            )
            .unwrap();
        let mut out = [0_u8; 20];
        let drained = ring.consumer().unwrap().drain(&mut out, key, u64::MAX);
        assert_eq!(
            drained,
            Drained {
                records: 1,
                bytes: 8,
                more_pending: true
            },
            "the older 16-byte record does not fit: the newer 8 waits behind it"
        );
    }

    #[test]
    fn one_consumer_for_all_shards() {
        let ring = leaked_ring(8, 4);
        let held = ring.consumer().unwrap();
        assert!(ring.consumer().is_none());
        drop(held);
        let one_shard = ring.shards()[2].ring().consumer().unwrap();
        assert!(
            ring.consumer().is_none(),
            "any shard held: busy, and nothing stays held"
        );
        drop(one_shard);
        assert!(ring.consumer().is_some());
        assert!(ring.shards()[0].ring().consumer().is_some());
    }

    #[test]
    fn counters_are_summed_over_shards_and_captured_counts_drops_too() {
        let ring = leaked_ring(4, 2);
        for processor in [0, 1, 0, 0] {
            let _ = ring.shard_for(processor).publish(
                Counted::Trace(Source::Timer, UserPart::Off),
                8,
                record(1, 0),
            );
        }
        ring.shard_for(1)
            .count(Source::Process, Uncaptured::SkippedIrql);
        ring.shard_for(0)
            .count(Source::Process, Uncaptured::Filtered);
        ring.shard_for(1)
            .count(Source::OnDemand, Uncaptured::NotKept);
        assert_eq!(ring.dropped(), 1, "shard 0 holds two");
        assert_eq!(ring.captured(Source::Timer), 4, "kept or dropped");
        assert_eq!(ring.captured(Source::Timer), ring.sequences_spent());
        assert_eq!(ring.uncaptured(Source::Process, Uncaptured::SkippedIrql), 1);
        assert_eq!(ring.uncaptured(Source::Process, Uncaptured::Filtered), 1);
        assert_eq!(ring.uncaptured(Source::OnDemand, Uncaptured::NotKept), 1);
        assert_eq!(ring.uncaptured(Source::Timer, Uncaptured::Filtered), 0);
        assert_eq!(ring.captured(Source::Process), 0);
    }

    #[test]
    fn source_counts_are_the_counters_summed_over_shards() {
        let ring = leaked_ring(64, 3);
        let mut events = 0_u32;
        for (processor, source, part) in [
            (0, Source::Timer, UserPart::Off),
            (1, Source::Timer, UserPart::Captured),
            (2, Source::Timer, UserPart::Captured),
            (1, Source::OnDemand, UserPart::Captured),
            (2, Source::Process, UserPart::Reentered),
        ] {
            let _ =
                ring.shard_for(processor)
                    .publish(Counted::Trace(source, part), 8, record(1, 0));
        }
        for processor in 0..3 {
            ring.shard_for(processor)
                .count_answered_only(UserPart::Captured);
        }
        ring.shard_for(2).count_answered_only(UserPart::Off);
        for source in Source::ALL {
            for why in [
                Uncaptured::SkippedIrql,
                Uncaptured::SkippedStack,
                Uncaptured::Filtered,
                Uncaptured::NotKept,
                Uncaptured::SampledOut,
            ] {
                // A different number of each, spread over the shards.
                events += 1;
                for count in 0..events {
                    ring.shard_for(count % 3).count(source, why);
                }
            }
        }
        for source in Source::ALL {
            let counts = ring.source_counts(source);
            assert_eq!(
                counts,
                SourceStatus {
                    captured: ring.captured(source),
                    skipped_irql: ring.uncaptured(source, Uncaptured::SkippedIrql),
                    skipped_stack: ring.uncaptured(source, Uncaptured::SkippedStack),
                    filtered: ring.uncaptured(source, Uncaptured::Filtered),
                    not_kept: ring.uncaptured(source, Uncaptured::NotKept),
                    sampled_out: ring.uncaptured(source, Uncaptured::SampledOut),
                    user_parts: ring.user_parts(source),
                    ..SourceStatus::ZERO
                },
                "{source:?}"
            );
        }
        let on_demand = ring.source_counts(Source::OnDemand);
        assert_eq!(
            (on_demand.captured, on_demand.user_part(UserPart::Captured)),
            (1, 4),
            "answered-only user parts count for the on-demand source, not its captured"
        );
        assert_eq!(ring.source_counts(Source::Timer).captured, 3);
        assert_eq!(
            ring.source_counts(Source::Thread).user_parts,
            [0; UserPart::COUNT]
        );
    }

    #[test]
    fn a_read_takes_only_records_stamped_before_its_cut_and_counts_them() {
        let ring = leaked_ring(8, 2);
        for (processor, key) in [(0, 10), (1, 20), (0, 30), (1, 40)] {
            ring.shard_for(processor)
                .publish(
                    Counted::Trace(Source::Timer, UserPart::Off),
                    8,
                    record(key, 0),
                )
                .unwrap();
        }
        let mut out = [0_u8; 256];
        let mut consumer = ring.consumer().unwrap();
        let cut = consumer.cut(30);
        assert_eq!(cut, 30, "every shard settled");
        let drained = consumer.drain(&mut out, key, cut);
        let keys: Vec<_> = out[..drained.bytes].chunks_exact(8).map(key).collect();
        assert_eq!(keys, [10, 20], "30 is not before the cut");
        assert!(!drained.more_pending, "held back is not more pending");
        assert_eq!(consumer.cut(25), 30, "a cut never goes backwards");
        drop(consumer);
        assert_eq!(ring.read(), 2);
        let drained = ring.consumer().unwrap().drain(&mut out, key, 41);
        assert_eq!(drained.records, 2);
        assert_eq!(ring.read(), 4);
    }

    #[test]
    fn a_shard_that_does_not_settle_keeps_the_previous_cut() {
        let ring = leaked_ring(8, 2);
        assert_eq!(ring.consumer().unwrap().cut(100), 100);
        // A producer inside shard 1's publish section, as a preempted one
        // would stay.
        let published = ring.shards()[1].ring().publish(8, |sequence, bytes| {
            assert_eq!(
                ring.consumer().unwrap().cut(200),
                100,
                "shard 1 busy: the previous cut"
            );
            record(150, 0)(sequence, bytes);
        });
        assert_eq!(published, Ok(1));
        assert_eq!(ring.consumer().unwrap().cut(300), 300, "settled again");
    }

    #[test]
    #[should_panic(expected = "numbered in order")]
    fn shards_must_be_in_order() {
        let words: Vec<Word> = ring_words(64).collect();
        let mut shards: Vec<Shard<'_>> = shards_over(&words, 2).collect();
        shards.swap(0, 1);
        let _ = ShardedRing::new(&shards);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Publish { shard: u32, key: u16 },
        Drain(usize),
        Clear,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0_u32..5, 0_u16..8)
                .prop_map(|(shard, key)| Op::Publish { shard, key }),
            2 => (0_usize..2000).prop_map(Op::Drain),
            1 => Just(Op::Clear),
        ]
    }

    /// One shard as the model sees it.
    #[derive(Default)]
    struct ModelShard {
        records: VecDeque<(u64, Vec<u8>)>,
        capacity: usize,
        spent: u64,
        dropped: u64,
    }

    proptest! {
        /// Publishes on random processors, drains into random buffers and
        /// clears: every shard is a bounded FIFO that drops the newest
        /// record when full and numbers every publish (drops included) in
        /// its own sequence; a drain is the merge of the shards' FIFOs by
        /// key, whole records only; every counter is exact per shard.
        #[test]
        fn behaves_like_per_shard_fifos_merged_by_key(
            capacity in 2_usize..24,
            shards in 1_usize..4,
            ops in prop::collection::vec(op(), 0..80),
        ) {
            // Each shard at least a ring's fewest words (`shard_count`, the
            // driver's rule, counts bytes for records of any size, and
            // would give these small rings one shard).
            let shards = shards.min(capacity / crate::ring::MIN_WORDS);
            let ring = leaked_ring(capacity, shards);
            let mut model: Vec<ModelShard> = (0..shards)
                .map(|index| ModelShard {
                    capacity: shard_capacity(capacity, shards, index),
                    ..ModelShard::default()
                })
                .collect();
            for (step, op) in ops.into_iter().enumerate() {
                let fill = u8::try_from(step % 251).unwrap();
                match op {
                    Op::Publish { shard: processor, key } => {
                        let shard = ring.shard_for(processor);
                        let index = usize::from(shard.index());
                        prop_assert_eq!(index, usize::try_from(processor).unwrap() % shards);
                        let result = shard.publish(Counted::Trace(Source::Timer, UserPart::Off), 8, record(key, fill));
                        let expected = &mut model[index];
                        expected.spent += 1;
                        if expected.records.len() < expected.capacity {
                            prop_assert_eq!(result, Ok(expected.spent));
                            expected.records.push_back((u64::from(key), fake(8, key, expected.spent, fill)));
                        } else {
                            prop_assert_eq!(result, Err(Full { sequence: expected.spent }));
                            expected.dropped += 1;
                        }
                    }
                    Op::Drain(room) => {
                        let mut out = vec![0_u8; room];
                        let drained = ring.consumer().unwrap().drain(&mut out, key, u64::MAX);
                        let mut bytes = Vec::new();
                        let mut more_pending = false;
                        while let Some((_, index)) = model
                            .iter()
                            .zip(0_usize..)
                            .filter_map(|(shard, index)| shard.records.front().map(|(key, _)| (*key, index)))
                            .min()
                        {
                            let next = &model[index].records[0].1;
                            if bytes.len() + next.len() > room {
                                more_pending = true;
                                break;
                            }
                            bytes.extend(model[index].records.pop_front().unwrap().1);
                        }
                        prop_assert_eq!(&out[..drained.bytes], bytes.as_slice());
                        prop_assert_eq!(drained.more_pending, more_pending);
                    }
                    Op::Clear => {
                        let waiting: usize = model.iter().map(|shard| shard.records.len()).sum();
                        prop_assert_eq!(ring.consumer().unwrap().discard_all(), waiting as u64);
                        for shard in &mut model {
                            shard.records.clear();
                        }
                    }
                }
                for (shard, expected) in ring.shards().iter().zip(&model) {
                    prop_assert_eq!(shard.ring().len(), expected.records.len());
                    prop_assert_eq!(shard.ring().dropped(), expected.dropped);
                    prop_assert_eq!(shard.ring().sequences_spent(), expected.spent);
                }
                prop_assert_eq!(ring.dropped(), model.iter().map(|shard| shard.dropped).sum::<u64>());
                prop_assert_eq!(ring.sequences_spent(), model.iter().map(|shard| shard.spent).sum::<u64>());
            }
        }
    }
}
