//! One record ring: bounded, lock-free, many producers and one consumer.
//! The driver keeps one per processor shard ([`crate::sharded_ring`]).
//!
//! Producers run in kernel callbacks at up to `DISPATCH_LEVEL`, so
//! publishing never waits and never takes a lock: a producer claims a slot
//! and its sequence number with one compare-and-swap on the claim word,
//! writes the record into the slot, and releases it by advancing the slot's
//! stamp (the bounded-queue scheme of D. Vyukov). When the ring is full the
//! newest record is dropped and counted; its sequence number is spent all
//! the same, so every number is a record kept or a drop.
//!
//! The claim word: one compare-and-swap per record (a second locked
//! instruction cost a third of a publish, `docs/performance.md`). A
//! record's sequence number is its position plus the drops before it plus
//! one, since a drop spends a number but no position. The word holds the
//! next position (its low [`POSITION_BITS`]) and the drop count modulo
//! 2^[`DROP_BITS`]; the exact count is a separate counter that a dropper
//! bumps after its compare-and-swap, so it can lag the word by the drops in
//! flight. A claim reads that counter before its compare-and-swap, and the
//! word's low bits make up the lag ([`Claim::drops`]): exact while fewer
//! than 2^16 producers are inside one ring's publish at once (each is a
//! thread or a processor's DPC; a lag past that would misnumber, never
//! lose, a record). A ring takes 2^48 - 1 records in its life (years at
//! millions per second), and drops every one after.
//!
//! Slot stamps: a slot at position `p` (index `p % capacity`) is free for
//! `p` when its stamp is `p`, holds `p`'s record when it is `p + 1`, and is
//! free again for `p + capacity` once the consumer has copied it out.
//!
//! The consumer side (read and clear requests, at `PASSIVE_LEVEL`) is one
//! holder at a time through [`RecordRing::consumer`], a try-lock that never
//! waits: a second concurrent reader is told the ring is busy.
//!
//! What producers write (the claim word, the drop counter) and what
//! the consumer writes (`head`, the try-lock) sit on cache lines of their
//! own, so draining does not pull the producers' line away from them.

use core::cmp::Ordering as CmpOrdering;

use kstack_abi::MAX_RECORD_SIZE;

use crate::sync::{AtomicBool, AtomicU64, Ordering, UnsafeCell};

/// The fewest slots a ring can have: with one slot, "written at position
/// p" (stamp p + 1) and "free for position p + 1" (stamp p + capacity)
/// would be the same stamp.
pub const MIN_CAPACITY: usize = 2;

/// Ring capacity, in records over all shards, when the service's
/// `Parameters\RingCapacity` registry value is absent: 16384 slots of 576
/// bytes, 9 MiB of non-paged pool.
pub const DEFAULT_CAPACITY: u32 = 16_384;
/// The capacities `RingCapacity` may choose (16 records to 144 MiB).
pub const CAPACITY_RANGE: core::ops::RangeInclusive<u32> = 16..=262_144;

/// The capacity for a `RingCapacity` setting: the default when there is
/// none, else the setting brought into [`CAPACITY_RANGE`] (status shows the
/// capacity in force).
#[must_use]
pub fn capacity_for_setting(setting: Option<u32>) -> u32 {
    setting.map_or(DEFAULT_CAPACITY, |records| {
        records.clamp(*CAPACITY_RANGE.start(), *CAPACITY_RANGE.end())
    })
}

/// Keeps its contents on cache lines of their own. 128 bytes: x86 cores
/// fetch 64-byte lines in adjacent pairs, so 64 would still share.
#[repr(align(128))]
pub(crate) struct CacheAligned<T>(pub(crate) T);

impl<T> core::ops::Deref for CacheAligned<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

/// One record's place in the ring.
pub struct Slot {
    stamp: AtomicU64,
    record: UnsafeCell<[u8; MAX_RECORD_SIZE]>,
}

// SAFETY: `record` is only written by the one producer that claimed the slot
// (its stamp equal to the claimed position) and only read by the one
// consumer after the producer's Release store of the next stamp; the stamp
// protocol gives each side exclusive access in turn.
unsafe impl Sync for Slot {}

impl Slot {
    /// The slot at `index` of a new ring (free for position `index`).
    #[must_use]
    pub fn new(index: u64) -> Self {
        Self {
            stamp: AtomicU64::new(index),
            record: UnsafeCell::new([0; MAX_RECORD_SIZE]),
        }
    }
}

/// Bits of the claim word that count drops, modulo 2^`DROP_BITS`; loom's
/// model gets 2, so its few producers wrap the field.
#[cfg(not(loom))]
const DROP_BITS: u32 = 16;
#[cfg(loom)]
const DROP_BITS: u32 = 2;
/// Bits of the claim word that hold the next position.
const POSITION_BITS: u32 = u64::BITS - DROP_BITS;
/// The position past the last a ring can claim.
const POSITION_LIMIT: u64 = (1 << POSITION_BITS) - 1;
/// One drop, added to the claim word.
const ONE_DROP: u64 = 1 << POSITION_BITS;
/// The drop field's values.
const DROP_MASK: u64 = (1 << DROP_BITS) - 1;

/// A value of the claim word: the next position, and the drops so far
/// modulo 2^[`DROP_BITS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Claim(u64);

impl Claim {
    /// The position the next record takes.
    const fn position(self) -> u64 {
        self.0 & POSITION_LIMIT
    }

    /// The exact drop count this word stands for, given `counted`, the
    /// drop counter read no earlier than the word's last drop could have
    /// been counted, and lagging it by fewer than 2^[`DROP_BITS`].
    const fn drops(self, counted: u64) -> u64 {
        counted + ((self.0 >> POSITION_BITS).wrapping_sub(counted) & DROP_MASK)
    }

    /// The sequence number of the record (or drop) this word's claim takes.
    const fn sequence(self, counted: u64) -> u64 {
        self.position() + self.drops(counted) + 1
    }

    /// The word after a record claims a position.
    const fn after_record(self) -> Self {
        Self(self.0 + 1)
    }

    /// The word after a drop (the drop field wraps).
    const fn after_drop(self) -> Self {
        Self(self.0.wrapping_add(ONE_DROP))
    }
}

/// The ring was full: the record was dropped (and counted), and its
/// sequence number spent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Full {
    /// The sequence number the dropped record would have had.
    pub sequence: u64,
}

/// What producers write.
struct ProducerSide<'a> {
    slots: &'a [Slot],
    /// A [`Claim`]: the next position and the drops modulo 2^[`DROP_BITS`].
    /// Sequence numbers start at 1 (0 marks records not kept in any ring).
    claim: AtomicU64,
    /// Records dropped because the ring was full: bumped (Release) after
    /// the drop's compare-and-swap, read (Acquire) before a claim's.
    dropped: AtomicU64,
}

/// What the consumer writes.
struct ConsumerSide {
    /// Next position the consumer copies out.
    head: AtomicU64,
    /// Set while a [`Consumer`] exists.
    active: AtomicBool,
}

/// The ring over caller-provided slots (non-paged memory in the driver).
pub struct RecordRing<'a> {
    producers: CacheAligned<ProducerSide<'a>>,
    consumer: CacheAligned<ConsumerSide>,
}

impl<'a> RecordRing<'a> {
    /// A ring over `slots`, which must be `Slot::new(0)`, `Slot::new(1)`, ...
    /// in order, and at least [`MIN_CAPACITY`].
    ///
    /// # Panics
    /// When there are too few slots or they are not freshly made in order.
    #[must_use]
    pub fn new(slots: &'a [Slot]) -> Self {
        assert!(
            slots.len() >= MIN_CAPACITY,
            "a ring needs at least {MIN_CAPACITY} slots"
        );
        assert!(
            slots
                .iter()
                .zip(0_u64..)
                .all(|(slot, index)| slot.stamp.load(Ordering::Relaxed) == index),
            "slots must be fresh and in order"
        );
        Self {
            producers: CacheAligned(ProducerSide {
                slots,
                claim: AtomicU64::new(0),
                dropped: AtomicU64::new(0),
            }),
            consumer: CacheAligned(ConsumerSide {
                head: AtomicU64::new(0),
                active: AtomicBool::new(false),
            }),
        }
    }

    /// How many records the ring holds at most.
    #[must_use]
    pub const fn capacity(&self) -> usize {
        self.producers.0.slots.len()
    }

    fn slot(&self, position: u64) -> &Slot {
        let slots = self.producers.slots;
        // The modulo keeps the index below `slots.len()`, which is a usize.
        #[expect(
            clippy::cast_possible_truncation,
            reason = "the remainder is below slots.len()"
        )]
        let index = (position % slots.len() as u64) as usize;
        &slots[index]
    }

    /// Publishes one record under the ring's next sequence number: `write`
    /// gets the number and fills the claimed slot (the record's first two
    /// bytes must be its size, as kstack-abi encodes it). Returns the number.
    ///
    /// # Errors
    /// [`Full`] when no slot is free: the number is spent, the drop counter
    /// has been incremented, and `write` was not called.
    ///
    /// Max IRQL: `DISPATCH_LEVEL`. Never waits: a failed claim only retries
    /// because another producer's claim succeeded.
    pub fn publish(
        &self,
        write: impl FnOnce(u64, &mut [u8; MAX_RECORD_SIZE]),
    ) -> Result<u64, Full> {
        let producers = &self.producers;
        let mut claim = Claim(producers.claim.load(Ordering::Relaxed));
        loop {
            let position = claim.position();
            let slot = self.slot(position);
            let full = match slot.stamp.load(Ordering::Acquire).cmp(&position) {
                // Free for `position`, unless the ring has used up its positions.
                CmpOrdering::Equal => position == POSITION_LIMIT,
                // The slot still holds the record from one lap ago.
                CmpOrdering::Less => true,
                CmpOrdering::Greater => {
                    // Another producer claimed `position` first.
                    claim = Claim(producers.claim.load(Ordering::Relaxed));
                    continue;
                }
            };
            // Read before the compare-and-swap: a drop counted here happened
            // before it, so the word it succeeds on includes that drop.
            let counted = producers.dropped.load(Ordering::Acquire);
            let next = if full {
                claim.after_drop()
            } else {
                claim.after_record()
            };
            if let Err(current) = producers.claim.compare_exchange_weak(
                claim.0,
                next.0,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                claim = Claim(current);
                continue;
            }
            let sequence = claim.sequence(counted);
            if full {
                producers.dropped.fetch_add(1, Ordering::Release);
                return Err(Full { sequence });
            }
            slot.record.with_mut(|record| {
                // SAFETY: only this producer claimed `position`; the
                // consumer reads the slot after the stamp below.
                write(sequence, unsafe { &mut *record });
            });
            slot.stamp.store(position + 1, Ordering::Release);
            return Ok(sequence);
        }
    }

    /// Records claimed and not yet copied out (a record being written counts).
    ///
    /// Max IRQL: `DISPATCH_LEVEL`.
    #[must_use]
    pub fn len(&self) -> usize {
        let head = self.consumer.head.load(Ordering::Relaxed);
        let tail = Claim(self.producers.claim.load(Ordering::Relaxed)).position();
        usize::try_from(tail.saturating_sub(head))
            .unwrap_or(usize::MAX)
            .min(self.capacity())
    }

    /// Whether no record is waiting.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Records dropped because the ring was full.
    ///
    /// Max IRQL: any.
    #[must_use]
    pub fn dropped(&self) -> u64 {
        self.producers.dropped.load(Ordering::Relaxed)
    }

    /// Sequence numbers spent so far: records published (in the ring, read
    /// or cleared since) plus records dropped.
    ///
    /// Max IRQL: any.
    #[must_use]
    pub fn sequences_spent(&self) -> u64 {
        // The counter first: it then lags the word, as `Claim::drops` needs.
        let counted = self.producers.dropped.load(Ordering::Acquire);
        Claim(self.producers.claim.load(Ordering::Relaxed)).sequence(counted) - 1
    }

    /// The consumer side, unless another caller holds it now.
    ///
    /// Max IRQL: `DISPATCH_LEVEL`.
    #[must_use]
    pub fn consumer(&self) -> Option<Consumer<'_, 'a>> {
        self.consumer
            .active
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .ok()
            .map(|_| Consumer {
                ring: self,
                head: self.consumer.head.load(Ordering::Relaxed),
            })
    }
}

/// What one drain copied out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Drained {
    /// Whole records copied.
    pub records: u32,
    /// Bytes copied.
    pub bytes: usize,
    /// A written record was left because the buffer was full.
    pub more_pending: bool,
}

impl Drained {
    /// Appends `record` to `out` after what was copied so far, unless it
    /// does not fit (then marks more pending). Returns whether it was copied.
    pub(crate) fn copy(&mut self, record: &[u8], out: &mut [u8]) -> bool {
        let Some(room) = out.get_mut(self.bytes..self.bytes + record.len()) else {
            self.more_pending = true;
            return false;
        };
        room.copy_from_slice(record);
        self.bytes += record.len();
        self.records += 1;
        true
    }
}

/// Exclusive access to the consumer side; released when dropped.
pub struct Consumer<'r, 'a> {
    ring: &'r RecordRing<'a>,
    /// The ring's `head`, which only this holder changes.
    head: u64,
}

impl Consumer<'_, '_> {
    /// Copies whole records into `out`, oldest first, while they fit. A
    /// record still being written ends the drain (it is read next time).
    ///
    /// Max IRQL: `DISPATCH_LEVEL` (the driver calls it at `PASSIVE_LEVEL`).
    pub fn drain(&mut self, out: &mut [u8]) -> Drained {
        let mut drained = Drained::default();
        while self.take_front(|record| drained.copy(record, out)) == Some(true) {}
        drained
    }

    /// Discards every written record; returns how many.
    ///
    /// Max IRQL: `DISPATCH_LEVEL`.
    pub fn discard_all(&mut self) -> u64 {
        let mut discarded = 0;
        while self.take_front(|_| true).is_some() {
            discarded += 1;
        }
        discarded
    }

    /// Runs `read` on the oldest record, if it is completely written.
    ///
    /// Max IRQL: `DISPATCH_LEVEL`.
    pub fn peek<R>(&self, read: impl FnOnce(&[u8]) -> R) -> Option<R> {
        let position = self.head;
        let slot = self.ring.slot(position);
        if slot.stamp.load(Ordering::Acquire) != position + 1 {
            return None;
        }
        Some(slot.record.with(|record| {
            // SAFETY: the Acquire load saw the producer's Release store of
            // `position + 1`: the record is complete, and no producer
            // touches the slot until `take_front` frees it.
            let record = unsafe { &*record };
            let size = usize::from(u16::from_le_bytes([record[0], record[1]])).min(MAX_RECORD_SIZE);
            read(&record[..size])
        }))
    }

    /// Hands the oldest record, if it is completely written, to `take`, and
    /// frees its slot when `take` returns true. Returns what `take`
    /// returned, or `None` when no written record was waiting.
    ///
    /// Max IRQL: `DISPATCH_LEVEL`.
    pub fn take_front(&mut self, take: impl FnOnce(&[u8]) -> bool) -> Option<bool> {
        let taken = self.peek(take)?;
        if taken {
            let ring = self.ring;
            ring.slot(self.head)
                .stamp
                .store(self.head + ring.capacity() as u64, Ordering::Release);
            self.head += 1;
            ring.consumer.head.store(self.head, Ordering::Relaxed);
        }
        Some(taken)
    }
}

impl Drop for Consumer<'_, '_> {
    fn drop(&mut self) {
        self.ring.consumer.active.store(false, Ordering::Release);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::{collections::VecDeque, vec::Vec};

    use proptest::prelude::*;

    use super::*;

    fn slots(capacity: u64) -> Vec<Slot> {
        (0..capacity).map(Slot::new).collect()
    }

    /// A fake record: its size word, then `fill` bytes up to `size`.
    pub(crate) fn record(size: u16, fill: u8) -> impl FnOnce(u64, &mut [u8; MAX_RECORD_SIZE]) {
        move |_, slot| {
            slot[..2].copy_from_slice(&size.to_le_bytes());
            slot[2..usize::from(size)].fill(fill);
        }
    }

    pub(crate) fn fake(size: u16, fill: u8) -> Vec<u8> {
        let mut bytes = vec![fill; usize::from(size)];
        bytes[..2].copy_from_slice(&size.to_le_bytes());
        bytes
    }

    #[test]
    fn capacity_settings_are_defaulted_and_bounded() {
        assert_eq!(capacity_for_setting(None), DEFAULT_CAPACITY);
        assert_eq!(capacity_for_setting(Some(0)), 16);
        assert_eq!(capacity_for_setting(Some(100)), 100);
        assert_eq!(capacity_for_setting(Some(u32::MAX)), 262_144);
        assert!(usize::try_from(*CAPACITY_RANGE.start()).unwrap() >= MIN_CAPACITY);
    }

    #[test]
    fn publishes_and_drains_in_order() {
        let slots = slots(4);
        let ring = RecordRing::new(&slots);
        assert_eq!(ring.publish(record(8, 1)), Ok(1));
        assert_eq!(ring.publish(record(16, 2)), Ok(2));
        assert_eq!(ring.len(), 2);
        let mut out = [0_u8; 64];
        let drained = ring.consumer().unwrap().drain(&mut out);
        assert_eq!(
            drained,
            Drained {
                records: 2,
                bytes: 24,
                more_pending: false
            }
        );
        assert_eq!(&out[..8], fake(8, 1).as_slice());
        assert_eq!(&out[8..24], fake(16, 2).as_slice());
        assert!(ring.is_empty());
    }

    #[test]
    fn full_ring_drops_the_newest_and_counts_it() {
        let slots = slots(2);
        let ring = RecordRing::new(&slots);
        ring.publish(record(8, 1)).unwrap();
        ring.publish(record(8, 2)).unwrap();
        assert_eq!(ring.publish(record(8, 3)), Err(Full { sequence: 3 }));
        assert_eq!(ring.dropped(), 1);
        let mut out = [0_u8; 64];
        ring.consumer().unwrap().drain(&mut out);
        assert_eq!(out[2], 1, "the oldest records stay; the newest was dropped");
        assert_eq!(out[10], 2);
        assert_eq!(ring.publish(record(8, 4)), Ok(4), "the drop spent number 3");
        assert_eq!((ring.dropped(), ring.sequences_spent()), (1, 4));
    }

    #[test]
    fn drop_counts_past_the_claim_words_field_number_exactly() {
        let slots = slots(2);
        let ring = RecordRing::new(&slots);
        ring.publish(record(8, 1)).unwrap();
        ring.publish(record(8, 2)).unwrap();
        let drops = 3 * (DROP_MASK + 1) + 7;
        for sequence in 3..3 + drops {
            assert_eq!(ring.publish(record(8, 3)), Err(Full { sequence }));
        }
        assert_eq!((ring.dropped(), ring.sequences_spent()), (drops, drops + 2));
        ring.consumer().unwrap().discard_all();
        assert_eq!(ring.publish(record(8, 4)), Ok(drops + 3));
    }

    #[test]
    fn a_lagging_drop_counter_is_made_up_by_the_word() {
        for drops in [0, 5, DROP_MASK, DROP_MASK + 1, 70_000, u64::MAX >> 20] {
            let claim = Claim(((drops & DROP_MASK) << POSITION_BITS) | 0x2A);
            for lag in [0, 1, DROP_MASK].into_iter().filter(|&lag| lag <= drops) {
                assert_eq!(claim.drops(drops - lag), drops, "{drops} drops, {lag} lag");
                assert_eq!(claim.sequence(drops - lag), 0x2A + drops + 1);
            }
        }
    }

    #[test]
    fn a_ring_at_its_last_position_drops_everything() {
        // Slots and head as a ring would have them after 2^48 - 4 records.
        let start = POSITION_LIMIT - 3;
        let slots: Vec<Slot> = (start..start + 4).map(Slot::new).collect();
        let ring = RecordRing {
            producers: CacheAligned(ProducerSide {
                slots: &slots,
                claim: AtomicU64::new(start),
                dropped: AtomicU64::new(0),
            }),
            consumer: CacheAligned(ConsumerSide {
                head: AtomicU64::new(start),
                active: AtomicBool::new(false),
            }),
        };
        for sequence in start + 1..=start + 3 {
            assert_eq!(ring.publish(record(8, 1)), Ok(sequence));
        }
        assert_eq!(
            ring.publish(record(8, 1)),
            Err(Full {
                sequence: start + 4
            })
        );
        assert_eq!(ring.consumer().unwrap().discard_all(), 3);
        assert_eq!(
            ring.publish(record(8, 1)),
            Err(Full {
                sequence: start + 5
            })
        );
        assert_eq!((ring.dropped(), ring.len()), (2, 0));
    }

    #[test]
    fn a_drain_never_splits_a_record() {
        let slots = slots(4);
        let ring = RecordRing::new(&slots);
        ring.publish(record(16, 1)).unwrap();
        ring.publish(record(16, 2)).unwrap();
        let mut out = [0_u8; 31];
        let drained = ring.consumer().unwrap().drain(&mut out);
        assert_eq!(
            drained,
            Drained {
                records: 1,
                bytes: 16,
                more_pending: true
            }
        );
        let drained = ring.consumer().unwrap().drain(&mut out);
        assert_eq!(
            drained,
            Drained {
                records: 1,
                bytes: 16,
                more_pending: false
            }
        );
    }

    #[test]
    fn only_one_consumer_at_a_time() {
        let slots = slots(2);
        let ring = RecordRing::new(&slots);
        let first = ring.consumer().unwrap();
        assert!(ring.consumer().is_none());
        drop(first);
        assert!(ring.consumer().is_some());
    }

    #[test]
    #[should_panic(expected = "at least 2 slots")]
    fn one_slot_is_too_few() {
        let slots = slots(1);
        let _ = RecordRing::new(&slots);
    }

    #[test]
    #[should_panic(expected = "fresh and in order")]
    fn slots_must_be_fresh() {
        let slots = vec![Slot::new(1), Slot::new(0)];
        let _ = RecordRing::new(&slots);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Publish(u16),
        Drain(usize),
        Clear,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (2_u16..=u16::try_from(MAX_RECORD_SIZE).unwrap()).prop_map(Op::Publish),
            2 => (0_usize..2000).prop_map(Op::Drain),
            1 => Just(Op::Clear),
        ]
    }

    proptest! {
        /// The ring behaves as a bounded FIFO that drops the newest record
        /// when full, counts every drop, numbers every publish in turn
        /// (drops included), and never splits a record.
        #[test]
        fn behaves_like_a_bounded_fifo(capacity in 2_u64..6, ops in prop::collection::vec(op(), 0..60)) {
            let slots = slots(capacity);
            let ring = RecordRing::new(&slots);
            let mut model: VecDeque<Vec<u8>> = VecDeque::new();
            let mut model_dropped = 0;
            let mut model_spent = 0;
            for (step, op) in ops.into_iter().enumerate() {
                let fill = u8::try_from(step % 251).unwrap();
                match op {
                    Op::Publish(size) => {
                        let result = ring.publish(record(size, fill));
                        model_spent += 1;
                        if model.len() < usize::try_from(capacity).unwrap() {
                            prop_assert_eq!(result, Ok(model_spent));
                            model.push_back(fake(size, fill));
                        } else {
                            prop_assert_eq!(result, Err(Full { sequence: model_spent }));
                            model_dropped += 1;
                        }
                    }
                    Op::Drain(room) => {
                        let mut out = vec![0_u8; room];
                        let drained = ring.consumer().unwrap().drain(&mut out);
                        let mut expected = Vec::new();
                        while model.front().is_some_and(|next| expected.len() + next.len() <= room) {
                            expected.extend(model.pop_front().unwrap());
                        }
                        prop_assert_eq!(&out[..drained.bytes], expected.as_slice());
                        prop_assert_eq!(drained.more_pending, !model.is_empty());
                    }
                    Op::Clear => {
                        let discarded = ring.consumer().unwrap().discard_all();
                        prop_assert_eq!(discarded, model.len() as u64);
                        model.clear();
                    }
                }
                prop_assert_eq!(ring.len(), model.len());
                prop_assert_eq!(ring.dropped(), model_dropped);
                prop_assert_eq!(ring.sequences_spent(), model_spent);
            }
        }
    }

    #[test]
    fn concurrent_producers_lose_nothing_silently() {
        const PRODUCERS: u8 = 4;
        const PER_PRODUCER: u16 = 20_000;
        let total_attempts = u64::from(PRODUCERS) * u64::from(PER_PRODUCER);
        let slots = slots(64);
        let ring = RecordRing::new(&slots);
        let mut seen = vec![0_u32; usize::from(PRODUCERS)];
        let mut copied = 0_u64;
        // Producers start together, so drops and publishes interleave.
        let start = std::sync::Barrier::new(usize::from(PRODUCERS));
        let mut numbers: Vec<u64> = std::thread::scope(|scope| {
            let producers: Vec<_> = (0..PRODUCERS)
                .map(|producer| {
                    let (ring, start) = (&ring, &start);
                    scope.spawn(move || {
                        start.wait();
                        (0..PER_PRODUCER)
                            .map(|n| {
                                let result = ring.publish(|_, slot| {
                                    slot[..2].copy_from_slice(&8_u16.to_le_bytes());
                                    slot[2] = producer;
                                    slot[3..5].copy_from_slice(&n.to_le_bytes());
                                    slot[5..8].fill(producer ^ 0xA5);
                                });
                                result.unwrap_or_else(|Full { sequence }| sequence)
                            })
                            .collect::<Vec<u64>>()
                    })
                })
                .collect();
            let mut out = [0_u8; 8 * 16];
            let mut last = vec![None::<u16>; usize::from(PRODUCERS)];
            let total = u64::from(PRODUCERS) * u64::from(PER_PRODUCER);
            // Drain until every attempt is accounted for, then until empty.
            loop {
                let done = copied + ring.dropped() >= total;
                let drained = ring.consumer().unwrap().drain(&mut out);
                for chunk in out[..drained.bytes].chunks_exact(8) {
                    let producer = usize::from(chunk[2]);
                    let n = u16::from_le_bytes([chunk[3], chunk[4]]);
                    assert!(
                        chunk[5..8].iter().all(|&b| b == chunk[2] ^ 0xA5),
                        "torn record {chunk:?}"
                    );
                    assert!(
                        last[producer].is_none_or(|previous| n > previous),
                        "per-producer order"
                    );
                    last[producer] = Some(n);
                    seen[producer] += 1;
                    copied += 1;
                }
                if done && drained.records == 0 {
                    break;
                }
            }
            producers
                .into_iter()
                .flat_map(|producer| producer.join().unwrap())
                .collect()
        });
        // Kept and dropped alike, every number from 1 was spent exactly once.
        numbers.sort_unstable();
        assert!(
            numbers.iter().copied().eq(1..=total_attempts),
            "numbers spent"
        );
        assert_eq!(
            copied + ring.dropped(),
            u64::from(PRODUCERS) * u64::from(PER_PRODUCER)
        );
        assert_eq!(seen.iter().map(|&n| u64::from(n)).sum::<u64>(), copied);
    }
}
