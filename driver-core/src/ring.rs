//! One record ring: bounded, with any number of producers and one consumer.
//! The driver keeps one per processor shard ([`crate::sharded_ring`]).
//!
//! Producers publish from kernel callbacks inside a *publish section*: the
//! capture has walked its stack already, has raised the IRQL to
//! `DISPATCH_LEVEL` and picked the shard of the processor it runs on, so on
//! Windows the section can be interrupted but never descheduled, and only
//! that processor writes its shard. A section takes the ring's writer word
//! (one compare-and-swap, even to odd), claims the next slot and sequence
//! number, writes the record, releases the slot by advancing its stamp, and
//! gives the writer word back (odd to even). The writer word is what keeps
//! the ring sound where a shard is not one processor's alone: processors
//! past [`kstack_abi::MAX_SHARDS`] share shards, and a host that
//! does not model IRQL (Wine, the host tests) can preempt a section. A
//! second producer then waits for the first to leave: on Windows at most
//! one section of another processor (a copy of at most
//! [`MAX_RECORD_SIZE`] bytes at `DISPATCH_LEVEL`, plus the interrupts it
//! takes). Inside the section the claim is plain loads and stores: one
//! locked instruction per record in all. The timestamp is taken inside the
//! section too ([`RecordRing::publish`]'s `write`), so a ring's slot order
//! is its records' time order, and a reader can tell from the writer word
//! whether a publish that began before a given time may still be unwritten
//! ([`RecordRing::settle`]).
//!
//! When the ring is full the newest record is dropped and counted; its
//! sequence number is spent all the same, so every number is a record kept
//! or a drop: a record's number is its position plus the drops before it
//! plus one.
//!
//! Slot stamps (the bounded-queue scheme of D. Vyukov): a slot at position
//! `p` (index `p % capacity`) is free for `p` when its stamp is `p`, holds
//! `p`'s record when it is `p + 1`, and is free again for `p + capacity`
//! once the consumer has copied it out.
//!
//! The consumer side (read and clear requests, at `PASSIVE_LEVEL`) is one
//! holder at a time through [`RecordRing::consumer`], a try-lock that never
//! waits: a second concurrent reader is told the ring is busy. It never
//! blocks a producer.
//!
//! What producers write (the writer word, the position, the drop counter)
//! and what the consumer writes (`head`, the try-lock) sit on cache lines
//! of their own, so draining does not pull the producers' line away from
//! them.

use kstack_abi::MAX_RECORD_SIZE;

use crate::sync::{AtomicBool, AtomicU64, Ordering, UnsafeCell, Wait, spin_loop};

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

/// How many times a reader looks at a ring's writer word for a publish
/// section to end before it gives up on that ring for this read
/// ([`RecordRing::settle`]). On Windows a section ends within a copy of
/// one record (well under a microsecond, plus interrupts), far below this;
/// a section that outlasts it was preempted (possible only where IRQL is
/// not modelled, such as Wine).
#[cfg(not(loom))]
pub const SETTLE_SPINS: u32 = 4096;
/// Under loom every look is a yield the model explores: two suffice to see
/// both outcomes.
#[cfg(loom)]
pub const SETTLE_SPINS: u32 = 2;

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

// SAFETY: `record` is only written by the one producer inside the ring's
// publish section with the slot free for its position (stamp equal to it),
// and only read by the one consumer after that producer's Release store of
// the next stamp; the stamp protocol gives each side exclusive access in
// turn.
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
    /// Even while no producer is inside a publish section, odd while one
    /// is; each section adds 2 in all.
    writer: AtomicU64,
    /// The position the next record takes. Written inside sections only.
    tail: AtomicU64,
    /// Records dropped because the ring was full. Written inside sections
    /// only. Sequence numbers start at 1 (0 marks records not kept in any
    /// ring): a record's is `tail + dropped + 1` when it is claimed.
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

/// A producer inside the ring's publish section; leaving is dropping it.
struct Section<'r> {
    writer: &'r AtomicU64,
    /// The writer word this section set (odd).
    word: u64,
}

impl Drop for Section<'_> {
    fn drop(&mut self) {
        // Release: what the section wrote is visible to whoever sees the
        // word move on.
        self.writer.store(self.word + 1, Ordering::Release);
    }
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
                writer: AtomicU64::new(0),
                tail: AtomicU64::new(0),
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

    /// Enters the publish section, waiting while another producer is
    /// inside (on Windows only one that shares this ring's shard from
    /// another processor, for at most its own section).
    fn enter(&self) -> Section<'_> {
        let writer = &self.producers.writer;
        let mut word = writer.load(Ordering::Relaxed);
        let mut wait = Wait::new("another producer to leave the shard's publish section");
        loop {
            if word.is_multiple_of(2) {
                // SeqCst: a reader that saw the word even before this
                // section began knows the section's timestamp, taken
                // after this swap, is no earlier than the reader's clock
                // read before it looked (`settle`).
                match writer.compare_exchange_weak(
                    word,
                    word + 1,
                    Ordering::SeqCst,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        return Section {
                            writer,
                            word: word + 1,
                        };
                    }
                    Err(current) => word = current,
                }
            } else {
                wait.turn();
                word = writer.load(Ordering::Relaxed);
            }
        }
    }

    /// Publishes one record under the ring's next sequence number, inside
    /// the publish section: `write` gets the number and fills the claimed
    /// slot (the record's first two bytes must be its size, as kstack-abi
    /// encodes it; its timestamp is taken in `write`, inside the section).
    /// Returns the number.
    ///
    /// # Errors
    /// [`Full`] when no slot is free: the number is spent, the drop counter
    /// has been incremented, and `write` was not called.
    ///
    /// Max IRQL: `DISPATCH_LEVEL`; the driver calls it at `DISPATCH_LEVEL`,
    /// so the section is never descheduled.
    pub fn publish(
        &self,
        write: impl FnOnce(u64, &mut [u8; MAX_RECORD_SIZE]),
    ) -> Result<u64, Full> {
        self.publish_counted(write, || {})
    }

    /// [`RecordRing::publish`], running `count` inside the same section
    /// for the record, kept or dropped: a counter only `count` writes is
    /// then exact with plain loads and stores.
    ///
    /// # Errors
    /// As [`RecordRing::publish`].
    ///
    /// Max IRQL: `DISPATCH_LEVEL`.
    pub fn publish_counted(
        &self,
        write: impl FnOnce(u64, &mut [u8; MAX_RECORD_SIZE]),
        count: impl FnOnce(),
    ) -> Result<u64, Full> {
        let _section = self.enter();
        count();
        let producers = &self.producers;
        let position = producers.tail.load(Ordering::Relaxed);
        let dropped = producers.dropped.load(Ordering::Relaxed);
        let sequence = position + dropped + 1;
        let slot = self.slot(position);
        // Acquire: the consumer's copy of the slot's last record is done.
        if slot.stamp.load(Ordering::Acquire) != position {
            // The slot still holds the record from one lap ago.
            producers.dropped.store(dropped + 1, Ordering::Relaxed);
            return Err(Full { sequence });
        }
        slot.record.with_mut(|record| {
            // SAFETY: inside the section no other producer touches the
            // ring, and the consumer reads the slot only after the stamp
            // below.
            write(sequence, unsafe { &mut *record });
        });
        slot.stamp.store(position + 1, Ordering::Release);
        producers.tail.store(position + 1, Ordering::Relaxed);
        Ok(sequence)
    }

    /// Waits, boundedly, for a publish section that is under way now to
    /// end. Returns `true` when no section that began before this call is
    /// still inside (its record, if any, is then written), `false` when one
    /// still is after [`SETTLE_SPINS`] looks.
    ///
    /// Max IRQL: `DISPATCH_LEVEL` (the driver calls it at `PASSIVE_LEVEL`).
    pub fn settle(&self) -> bool {
        let writer = &self.producers.writer;
        let word = writer.load(Ordering::SeqCst);
        if word.is_multiple_of(2) {
            return true;
        }
        for _ in 0..SETTLE_SPINS {
            spin_loop();
            // Acquire: pairs with the section's Release on leaving.
            if writer.load(Ordering::Acquire) != word {
                return true;
            }
        }
        false
    }

    /// Records claimed and not yet copied out.
    ///
    /// Max IRQL: `DISPATCH_LEVEL`.
    #[must_use]
    pub fn len(&self) -> usize {
        let head = self.consumer.head.load(Ordering::Relaxed);
        let tail = self.producers.tail.load(Ordering::Relaxed);
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
    /// or cleared since) plus records dropped. Exact while no publish is
    /// under way; otherwise it may miss that one.
    ///
    /// Max IRQL: any.
    #[must_use]
    pub fn sequences_spent(&self) -> u64 {
        self.producers.tail.load(Ordering::Relaxed) + self.producers.dropped.load(Ordering::Relaxed)
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

impl<'a> Consumer<'_, 'a> {
    /// The ring this consumer reads.
    #[must_use]
    pub const fn ring(&self) -> &RecordRing<'a> {
        self.ring
    }

    /// Copies whole records into `out`, oldest first, while they fit. A
    /// record still being written ends the drain (it is read next time).
    /// At most one ring's worth per call, so a drain ends even while
    /// producers refill the ring behind it (then more is pending).
    ///
    /// Max IRQL: `DISPATCH_LEVEL` (the driver calls it at `PASSIVE_LEVEL`).
    pub fn drain(&mut self, out: &mut [u8]) -> Drained {
        let mut drained = Drained::default();
        for _ in 0..self.ring.capacity() {
            if self.take_front(|record| drained.copy(record, out)) != Some(true) {
                return drained;
            }
        }
        drained.more_pending = self.peek(|_| ()).is_some();
        drained
    }

    /// Discards every written record, up to one ring's worth (so a clear
    /// ends even while producers refill the ring); returns how many.
    ///
    /// Max IRQL: `DISPATCH_LEVEL`.
    pub fn discard_all(&mut self) -> u64 {
        let discarded = (0..self.ring.capacity())
            .take_while(|_| self.take_front(|_| true).is_some())
            .count();
        discarded as u64
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

#[cfg(test)]
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
        assert!(!ring.is_empty());
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
    fn every_drop_spends_a_number_and_the_numbers_run_on() {
        let slots = slots(2);
        let ring = RecordRing::new(&slots);
        ring.publish(record(8, 1)).unwrap();
        ring.publish(record(8, 2)).unwrap();
        // Past 2^16 natively; under Miri, which checks the accesses rather
        // than the arithmetic, a few hundred.
        let drops = if cfg!(miri) { 300 } else { 70_000 };
        for sequence in 3..3 + drops {
            assert_eq!(ring.publish(record(8, 3)), Err(Full { sequence }));
        }
        assert_eq!((ring.dropped(), ring.sequences_spent()), (drops, drops + 2));
        ring.consumer().unwrap().discard_all();
        assert_eq!(ring.publish(record(8, 4)), Ok(drops + 3));
    }

    #[test]
    fn the_writer_word_never_returns_to_an_earlier_value() {
        // A reader that saw a section inside tells its end from a later
        // section by the word having moved on: it must count sections.
        let slots = slots(2);
        let ring = RecordRing::new(&slots);
        let word = || ring.producers.writer.load(Ordering::Relaxed);
        assert_eq!(word(), 0);
        for sections in 1..=3 {
            let section = ring.enter();
            assert_eq!(word(), 2 * sections - 1, "odd inside");
            drop(section);
            assert_eq!(word(), 2 * sections, "even outside, one step on");
        }
    }

    #[test]
    fn a_reader_settles_when_no_section_is_inside_and_reports_one_that_stays() {
        let slots = slots(2);
        let ring = RecordRing::new(&slots);
        assert!(ring.settle(), "no section: settled");
        let section = ring.enter();
        assert!(!ring.settle(), "a section that never leaves is reported");
        drop(section);
        assert!(ring.settle());
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
        // Miri interprets every access: fewer records, the same contention.
        const PER_PRODUCER: u16 = if cfg!(miri) { 50 } else { 20_000 };
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
            let mut wait = Wait::new("every attempt to be drained or dropped");
            loop {
                wait.turn();
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
