//! One record ring: bounded, in bytes, with any number of producers and one
//! consumer. Records have the length they need (a multiple of 8 bytes, as
//! kstack-abi encodes them), so an event with a short stack takes little
//! room. The driver keeps one ring per processor shard
//! ([`crate::sharded_ring`]).
//!
//! Producers publish from kernel callbacks inside a *publish section*: the
//! capture has walked its stack already, has raised the IRQL to
//! `DISPATCH_LEVEL` and picked the shard of the processor it runs on, so on
//! Windows the section can be interrupted but never descheduled, and only
//! that processor writes its shard. A section takes the ring's writer word
//! (one compare-and-swap, even to odd), checks there is room for the
//! record, writes it at the tail, moves the tail past it, and gives the
//! writer word back (odd to even). The writer word is what keeps the ring
//! sound where a shard is not one processor's alone: processors past
//! [`kstack_abi::MAX_SHARDS`] share shards, and a host that does not model
//! IRQL (Wine, the host tests) can preempt a section. A second producer
//! then waits for the first to leave: on Windows at most one section of
//! another processor (a copy of at most [`MAX_RECORD_SIZE`] bytes at
//! `DISPATCH_LEVEL`, plus the interrupts it takes). Inside the section
//! everything is plain loads and stores: one locked instruction per record
//! in all. The timestamp is taken inside the section too
//! ([`RecordRing::publish`]'s `write`), so a ring's byte order is its
//! records' time order, and a reader can tell from the writer word whether
//! a publish that began before a given time may still be unwritten
//! ([`RecordRing::settle`]).
//!
//! The compare-and-swap stays where a shard is its processor's alone too:
//! its full fence is what lets a reader trust the writer word without
//! stopping the processors. (Until ABI 14 such shards moved the word with
//! plain stores, and every read first interrupted every processor with
//! `KeIpiGenericCall` instead; what a publish saved was not worth an
//! interrupt of every processor on every read: `docs/performance.md`,
//! "Issue 36: no exclusive shards".)
//!
//! A record never wraps: when it does not fit between the tail and the end
//! of the memory, the producer writes a *wrap mark* (a size word of 0)
//! there and the record at the start, and that skipped space counts as
//! used until the consumer passes it. So a record of up to half the
//! capacity always fits an empty ring.
//!
//! When the ring lacks room the newest record is dropped and counted; its
//! sequence number is spent all the same, so every number is a record kept
//! or a drop: a record's number is the records published before it plus
//! the drops before it plus one.
//!
//! Positions (`tail`, `head`) are byte counts since the ring was made, so
//! they only grow; `position % capacity` is the place in memory. The tail
//! is stored with Release after the record is written, and the consumer
//! reads only below the tail it loaded with Acquire; the head is stored
//! with Release after the consumer copied a record out, and a producer
//! writes only below the head it loaded with Acquire plus the capacity.
//!
//! The consumer side (read and clear requests, at `PASSIVE_LEVEL`) is one
//! holder at a time through [`RecordRing::consumer`], a try-lock that never
//! waits: a second concurrent reader is told the ring is busy. It never
//! blocks a producer.
//!
//! What producers write (the writer word, the tail, the counters) and what
//! the consumer writes (`head`, the try-lock) sit on cache lines of their
//! own, and each side keeps the other's position as it last loaded it: a
//! publish loads the head again only when the room it last saw seems
//! short, a reader loads the tail again only when it has caught up with
//! the one it saw. So a drain does not pull the producers' line away from
//! them on every record, nor a publish the reader's. (A benchmark of a
//! producer publishing while a reader drains was too bimodal on the
//! 2-vCPU benchmark machine to show the difference: `docs/performance.md`.)

use kstack_abi::MAX_RECORD_SIZE;

use crate::sync::{AtomicBool, AtomicU64, Ordering, Wait, spin_loop};

/// Bytes in a [`Word`]: every record is a whole number of words.
pub const WORD_SIZE: usize = 8;

/// The fewest words a ring can have: room for two one-word records, so that
/// "full" and "empty" are told apart by the positions alone.
pub const MIN_WORDS: usize = 2;

/// Ring capacity, in KiB over all shards, when the service's
/// `Parameters\RingCapacity` registry value is absent: 9 MiB of non-paged
/// pool, as much as the fixed 576-byte slots of ABI 5 took by default.
pub const DEFAULT_CAPACITY_KIB: u32 = 9 * 1024;
/// The capacities `RingCapacity` may choose, in KiB (16 KiB to 144 MiB).
pub const CAPACITY_RANGE_KIB: core::ops::RangeInclusive<u32> = 16..=144 * 1024;

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

/// The capacity in bytes for a `RingCapacity` setting in KiB: the default
/// when there is none, else the setting brought into
/// [`CAPACITY_RANGE_KIB`] (status shows the capacity in force).
#[must_use]
pub fn capacity_for_setting(setting_kib: Option<u32>) -> usize {
    let kib = setting_kib.map_or(DEFAULT_CAPACITY_KIB, |kib| {
        kib.clamp(*CAPACITY_RANGE_KIB.start(), *CAPACITY_RANGE_KIB.end())
    });
    // At most 144 MiB: fits a usize on every target kstack builds for.
    usize::try_from(kib).unwrap_or(usize::MAX / 1024) * 1024
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

/// Eight bytes of ring memory. The words of a ring lie side by side, so a
/// record's words are one byte range (under loom each word is a cell of its
/// own, so the model checks every access to each).
#[cfg(not(loom))]
#[repr(transparent)]
pub struct Word(core::cell::UnsafeCell<u64>);

/// Eight bytes of ring memory, as a loom cell.
#[cfg(loom)]
pub struct Word(loom::cell::UnsafeCell<u64>);

// SAFETY: a word is written only by the producer inside the ring's publish
// section, below the head it loaded plus the capacity, and read only by the
// one consumer below the tail it loaded; the Release/Acquire pairs on the
// tail and the head give each side exclusive access in turn.
unsafe impl Sync for Word {}

impl Word {
    /// A zeroed word.
    #[must_use]
    pub fn new() -> Self {
        #[cfg(not(loom))]
        return Self(core::cell::UnsafeCell::new(0));
        #[cfg(loom)]
        return Self(loom::cell::UnsafeCell::new(0));
    }
}

impl Default for Word {
    fn default() -> Self {
        Self::new()
    }
}

/// The first byte of `words` and how many bytes they hold: `Word` is a
/// transparent `UnsafeCell<u64>` and the words are contiguous, so the
/// pointer may be used for all of them (u8 has no alignment and no invalid
/// values).
#[cfg(not(loom))]
fn word_bytes(words: &[Word]) -> (*mut u8, usize) {
    let start =
        core::cell::UnsafeCell::raw_get(words.as_ptr().cast::<core::cell::UnsafeCell<u64>>());
    (start.cast::<u8>(), words.len() * WORD_SIZE)
}

/// Hands `write` the bytes of `words` to fill.
///
/// # Safety
/// The caller has exclusive access to `words` for the call.
#[cfg(not(loom))]
unsafe fn write_words(words: &[Word], write: impl FnOnce(&mut [u8])) {
    let (start, len) = word_bytes(words);
    // SAFETY: `word_bytes` covers exactly these words, which the caller has to itself.
    let bytes = unsafe { core::slice::from_raw_parts_mut(start, len) };
    write(bytes);
}

/// Hands `write` a copy of `words` and stores it back word by word.
///
/// # Safety
/// The caller has exclusive access to `words` for the call.
#[cfg(loom)]
unsafe fn write_words(words: &[Word], write: impl FnOnce(&mut [u8])) {
    let mut bytes = std::vec![0_u8; words.len() * WORD_SIZE];
    write(&mut bytes);
    for (word, value) in words.iter().zip(bytes.chunks_exact(WORD_SIZE)) {
        let value = u64::from_ne_bytes(value.try_into().unwrap_or_default());
        // SAFETY: the caller has exclusive access to the word.
        word.0.with_mut(|cell| unsafe { *cell = value });
    }
}

/// Hands `read` the bytes of `words`.
///
/// # Safety
/// No producer writes `words` for the call.
#[cfg(not(loom))]
unsafe fn read_words<R>(words: &[Word], read: impl FnOnce(&[u8]) -> R) -> R {
    let (start, len) = word_bytes(words);
    // SAFETY: `word_bytes` covers exactly these words; nobody writes them meanwhile.
    let bytes = unsafe { core::slice::from_raw_parts(start.cast_const(), len) };
    read(bytes)
}

/// Hands `read` a copy of `words`, read word by word.
///
/// # Safety
/// No producer writes `words` for the call.
#[cfg(loom)]
unsafe fn read_words<R>(words: &[Word], read: impl FnOnce(&[u8]) -> R) -> R {
    let bytes: std::vec::Vec<u8> = words
        .iter()
        // SAFETY: no producer writes the word meanwhile.
        .flat_map(|word| word.0.with(|cell| unsafe { *cell }).to_ne_bytes())
        .collect();
    read(&bytes)
}

/// The ring lacked room: the record was dropped (and counted), and its
/// sequence number spent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Full {
    /// The sequence number the dropped record would have had.
    pub sequence: u64,
}

/// What producers write.
struct ProducerSide<'a> {
    words: &'a [Word],
    /// The writer word: twice the sequence numbers spent (records written
    /// plus records dropped), plus one while a producer is inside a publish
    /// section. Even to odd on entering, odd to even on leaving: each
    /// section adds 2 in all, kept or dropped, so the word never returns
    /// to an earlier value, and a section's sequence number is what it
    /// finds there halved, plus one (numbers start at 1; 0 marks records
    /// not kept in any ring).
    writer: AtomicU64,
    /// The byte position after the last record written. Written inside
    /// sections only, with Release once the record is in place.
    tail: AtomicU64,
    /// Where the tail is in memory, as a word index (`tail % capacity / 8`),
    /// kept beside it so a publish places its record without a division.
    /// Written inside sections only.
    tail_word: AtomicU64,
    /// The consumer's head as a section last loaded it: never ahead of
    /// it. A publish checks its room against this first and loads the
    /// consumer's line only when that seems short, so producers do not
    /// pull that line from a draining reader on every record. Written
    /// inside sections only.
    head_seen: AtomicU64,
    /// Records dropped for want of room. Written inside sections only;
    /// the records written are the sequence numbers spent minus these.
    dropped: AtomicU64,
}

/// What the consumer writes. All but `active` are written only by the
/// holder of the consumer side (a [`Consumer`]); they stay here between
/// holders, so a [`Consumer`] is a reference and no more (a read holds one
/// per shard on its kernel stack).
struct ConsumerSide {
    /// The byte position of the next record the consumer copies out.
    head: AtomicU64,
    /// Where the head is in memory, as a word index (`head % capacity /
    /// 8`): reading a record needs no division.
    head_word: AtomicU64,
    /// The producers' tail as a holder last loaded it: the records below
    /// it are written. Loaded again only when the head reaches it, so a
    /// reader does not pull the producers' line on every record.
    tail_seen: AtomicU64,
    /// The oldest written record, once found ([`Front::packed`]; 0: not
    /// looked for since the head last moved): it stays where it is until
    /// the head moves past it, so a look then a take (the merge's way)
    /// find it once.
    front: AtomicU64,
    /// Records copied out or discarded.
    taken: AtomicU64,
    /// Set while a [`Consumer`] exists.
    active: AtomicBool,
}

/// The ring over caller-provided words (non-paged memory in the driver).
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

impl Section<'_> {
    /// The sequence number this section spends: the numbers spent before
    /// it (half the even word it found), plus one.
    const fn sequence(&self) -> u64 {
        self.word.div_ceil(2)
    }
}

impl Drop for Section<'_> {
    fn drop(&mut self) {
        // Release: what the section wrote is visible to whoever sees the
        // word move on.
        self.writer.store(self.word + 1, Ordering::Release);
    }
}

/// The size word at the front of every record (and of a wrap mark, where it
/// is 0).
fn size_word(bytes: &[u8]) -> usize {
    usize::from(u16::from_le_bytes([bytes[0], bytes[1]]))
}

/// How far the producers' count `ahead` is past the consumer's `behind`, at
/// most `bound` (the caller loads `behind` first, so a count that moves
/// meanwhile only makes the gap larger).
fn gap(behind: u64, ahead: u64, bound: usize) -> usize {
    usize::try_from(ahead.saturating_sub(behind))
        .unwrap_or(usize::MAX)
        .min(bound)
}

impl<'a> RecordRing<'a> {
    /// A ring over `words`, at least [`MIN_WORDS`] of them, whatever they
    /// hold.
    ///
    /// # Panics
    /// When there are too few words.
    #[must_use]
    pub fn new(words: &'a [Word]) -> Self {
        assert!(
            words.len() >= MIN_WORDS,
            "a ring needs at least {MIN_WORDS} words"
        );
        Self {
            producers: CacheAligned(ProducerSide {
                words,
                writer: AtomicU64::new(0),
                tail: AtomicU64::new(0),
                tail_word: AtomicU64::new(0),
                head_seen: AtomicU64::new(0),
                dropped: AtomicU64::new(0),
            }),
            consumer: CacheAligned(ConsumerSide {
                head: AtomicU64::new(0),
                head_word: AtomicU64::new(0),
                tail_seen: AtomicU64::new(0),
                front: AtomicU64::new(0),
                taken: AtomicU64::new(0),
                active: AtomicBool::new(false),
            }),
        }
    }

    /// The ring's size in bytes.
    ///
    /// Max IRQL: any.
    #[must_use]
    pub const fn capacity(&self) -> usize {
        self.producers.0.words.len() * WORD_SIZE
    }

    /// The most records the ring could ever hold at once (one per word):
    /// a bound for loops that must end while producers refill it.
    ///
    /// Max IRQL: any.
    #[must_use]
    pub const fn max_records(&self) -> usize {
        self.producers.0.words.len()
    }

    /// Where byte position `position` lies in memory, as a word index.
    /// A division: the publish and the consumer keep their word index
    /// beside their position instead, and call this only to start from one.
    #[expect(
        clippy::cast_possible_truncation,
        reason = "the remainder is below capacity(), a usize"
    )]
    fn word_index(&self, position: u64) -> usize {
        (position % self.capacity() as u64) as usize / WORD_SIZE
    }

    /// The word index after `words` words from `start` (which end at the
    /// end of the memory at most): back to 0 at the end.
    fn word_after(&self, start: usize, words: usize) -> usize {
        let next = start + words;
        if next == self.producers.words.len() {
            0
        } else {
            next
        }
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

    /// Publishes one record of `size` bytes under the ring's next sequence
    /// number, inside the publish section: `write` gets the number and the
    /// record's bytes to fill (the record's first two bytes must be its
    /// size, as kstack-abi encodes it; its timestamp is taken in `write`,
    /// inside the section). Returns the number.
    ///
    /// `size` is from 2 to [`MAX_RECORD_SIZE`] (a size outside is brought
    /// into that range); the record takes whole [`Word`]s, and after
    /// `write` the ring writes `size` into its first two bytes itself, so
    /// the consumer always finds the record's true length there.
    ///
    /// # Errors
    /// [`Full`] when the ring lacks room: the number is spent, the drop
    /// counter has been incremented, and `write` was not called.
    ///
    /// Max IRQL: `DISPATCH_LEVEL`; the driver calls it at `DISPATCH_LEVEL`,
    /// so the section is never descheduled.
    pub fn publish(&self, size: usize, write: impl FnOnce(u64, &mut [u8])) -> Result<u64, Full> {
        self.publish_counted(size, write, || {})
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
        size: usize,
        write: impl FnOnce(u64, &mut [u8]),
        count: impl FnOnce(),
    ) -> Result<u64, Full> {
        let size = size.clamp(2, MAX_RECORD_SIZE);
        let record_words = size.div_ceil(WORD_SIZE);
        let section = self.enter();
        count();
        let producers = &self.producers;
        let tail = producers.tail.load(Ordering::Relaxed);
        let sequence = section.sequence();
        let words = producers.words;
        // Below the word count: only this section writes it, from below.
        #[expect(clippy::cast_possible_truncation, reason = "a word index")]
        let offset = producers.tail_word.load(Ordering::Relaxed) as usize;
        debug_assert_eq!(offset, self.word_index(tail), "the tail's word");
        let words_to_end = words.len() - offset;
        let (start, skipped) = if record_words <= words_to_end {
            (offset, 0)
        } else {
            (0, words_to_end)
        };
        let needed = ((skipped + record_words) * WORD_SIZE) as u64;
        let fits = |head: u64| needed <= self.capacity() as u64 - (tail - head);
        // The head a section saw happened before this section (the same
        // processor's, or another's through the writer word's Release and
        // compare-and-swap), and so did the consumer's copies below it.
        if !fits(producers.head_seen.load(Ordering::Relaxed)) && !fits(self.refresh_head_seen()) {
            let dropped = producers.dropped.load(Ordering::Relaxed);
            producers.dropped.store(dropped + 1, Ordering::Relaxed);
            return Err(Full { sequence });
        }
        if skipped > 0 {
            // SAFETY: the space from the tail to the end is free (checked
            // above) and only this section writes it.
            unsafe { write_words(&words[offset..=offset], |mark| mark.fill(0)) };
        }
        // SAFETY: the record's words are free (checked above): the consumer
        // reads them only after the Release store of the tail below.
        unsafe {
            write_words(&words[start..start + record_words], |record| {
                let (record, _) = record.split_at_mut(size);
                write(sequence, record);
                #[expect(
                    clippy::cast_possible_truncation,
                    reason = "size <= MAX_RECORD_SIZE < u16::MAX"
                )]
                record[..2].copy_from_slice(&(size as u16).to_le_bytes());
            });
        }
        producers.tail_word.store(
            self.word_after(start, record_words) as u64,
            Ordering::Relaxed,
        );
        let new_tail = tail + ((skipped + record_words) * WORD_SIZE) as u64;
        producers.tail.store(new_tail, Ordering::Release);
        Ok(sequence)
    }

    /// Loads the consumer's head into `head_seen`, inside a section.
    fn refresh_head_seen(&self) -> u64 {
        // Acquire: the consumer's copies of everything below the head are
        // done, so that memory may be written again.
        let head = self.consumer.head.load(Ordering::Acquire);
        self.producers.head_seen.store(head, Ordering::Relaxed);
        head
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

    /// Records written and not yet copied out.
    ///
    /// Max IRQL: `DISPATCH_LEVEL`.
    #[must_use]
    pub fn len(&self) -> usize {
        // Taken first, then dropped before spent: whatever moves meanwhile
        // only makes the gap larger, never negative.
        let taken = self.consumer.taken.load(Ordering::Relaxed);
        let dropped = self.producers.dropped.load(Ordering::Relaxed);
        let written = self.sequences_spent().saturating_sub(dropped);
        gap(taken, written, self.max_records())
    }

    /// Bytes in use: records written and not yet copied out, and the space
    /// skipped before them at the end of the memory.
    ///
    /// Max IRQL: `DISPATCH_LEVEL`.
    #[must_use]
    pub fn bytes_used(&self) -> usize {
        // The head first: a tail that moves meanwhile only makes the gap
        // larger.
        let head = self.consumer.head.load(Ordering::Relaxed);
        let tail = self.producers.tail.load(Ordering::Relaxed);
        gap(head, tail, self.capacity())
    }

    /// Whether no record is waiting.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Records dropped for want of room.
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
        self.producers.writer.load(Ordering::Relaxed) / 2
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
            .map(|_| Consumer { ring: self })
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
        self.write(out, |room| {
            room.get_mut(..record.len())?.copy_from_slice(record);
            Some(record.len())
        })
    }

    /// Appends one record to `out` after what was written so far: `write`
    /// gets the room left and returns the bytes it wrote, or `None` when
    /// the record does not fit (then more is pending). Returns whether it
    /// was written.
    pub(crate) fn write(
        &mut self,
        out: &mut [u8],
        write: impl FnOnce(&mut [u8]) -> Option<usize>,
    ) -> bool {
        let Some(written) = out.get_mut(self.bytes..).and_then(write) else {
            self.more_pending = true;
            return false;
        };
        self.bytes += written;
        self.records += 1;
        true
    }
}

/// Exclusive access to the consumer side; released when dropped.
pub struct Consumer<'r, 'a> {
    ring: &'r RecordRing<'a>,
}

impl<'a> Consumer<'_, 'a> {
    /// The ring this consumer reads.
    #[must_use]
    pub const fn ring(&self) -> &RecordRing<'a> {
        self.ring
    }

    /// Copies whole records into `out`, oldest first, while they fit. At
    /// most one ring's worth per call, so a drain ends even while producers
    /// refill the ring behind it (then more is pending).
    ///
    /// Max IRQL: `DISPATCH_LEVEL` (the driver calls it at `PASSIVE_LEVEL`).
    pub fn drain(&mut self, out: &mut [u8]) -> Drained {
        let mut drained = Drained::default();
        for _ in 0..self.ring.max_records() {
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
        self.discard_each(|_| ())
    }

    /// [`Consumer::discard_all`], passing each record to `discard` first.
    ///
    /// Max IRQL: `DISPATCH_LEVEL`.
    pub fn discard_each(&mut self, mut discard: impl FnMut(&[u8])) -> u64 {
        let discarded = (0..self.ring.max_records())
            .take_while(|_| {
                self.take_front(|record| {
                    discard(record);
                    true
                })
                .is_some()
            })
            .count();
        discarded as u64
    }

    /// Where the oldest written record lies, past a wrap mark.
    fn front(&self) -> Option<Front> {
        let consumer = &self.ring.consumer;
        let head = consumer.head.load(Ordering::Relaxed);
        // Below the word count: only the holder writes it, from below.
        #[expect(clippy::cast_possible_truncation, reason = "a word index")]
        let head_word = consumer.head_word.load(Ordering::Relaxed) as usize;
        debug_assert_eq!(head_word, self.ring.word_index(head), "the head's word");
        if let Some(front) =
            Front::unpacked(consumer.front.load(Ordering::Relaxed), head, head_word)
        {
            return Some(front);
        }
        let mut tail = consumer.tail_seen.load(Ordering::Relaxed);
        if head == tail {
            // Acquire: pairs with the producer's Release store of the
            // tail, so every record below it is completely written.
            tail = self.ring.producers.tail.load(Ordering::Acquire);
            consumer.tail_seen.store(tail, Ordering::Relaxed);
            if head == tail {
                return None;
            }
        }
        let words = self.ring.producers.words;
        let (mut position, mut offset, mut words_to_end) =
            (head, head_word, words.len() - head_word);
        // SAFETY: the word at the head lies below the tail: written, and
        // not written again before the head moves past it.
        let mut size = unsafe { read_words(&words[offset..=offset], size_word) };
        if size == 0 {
            // A wrap mark: the record is at the start of the memory (a
            // producer writes the mark and the record in one section).
            position += (words_to_end * WORD_SIZE) as u64;
            if position >= tail {
                return None;
            }
            (offset, words_to_end) = (0, words.len());
            // SAFETY: as above, for the first word of the memory.
            size = unsafe { read_words(&words[..1], size_word) };
        }
        // The ring wrote the size word itself and the record fits before
        // the end and the tail; the bounds only keep indexing in range.
        let below_tail = usize::try_from(tail - position).unwrap_or(usize::MAX) / WORD_SIZE;
        let record_words = size
            .div_ceil(WORD_SIZE)
            .clamp(1, words_to_end.min(below_tail));
        let front = Front {
            position,
            offset,
            words: record_words,
            size: size.min(record_words * WORD_SIZE),
        };
        consumer.front.store(front.packed(head), Ordering::Relaxed);
        Some(front)
    }

    /// Runs `read` on the oldest record, if one is written.
    ///
    /// Max IRQL: `DISPATCH_LEVEL`.
    pub fn peek<R>(&self, read: impl FnOnce(&[u8]) -> R) -> Option<R> {
        let front = self.front()?;
        let words = &self.ring.producers.words[front.offset..front.offset + front.words];
        // SAFETY: the record lies below the tail: completely written, and no
        // producer writes it until `take_front` moves the head past it.
        Some(unsafe { read_words(words, |bytes| read(&bytes[..front.size])) })
    }

    /// Hands the oldest record, if one is written, to `take`, and frees its
    /// room when `take` returns true. Returns what `take` returned, or
    /// `None` when no written record was waiting.
    ///
    /// Max IRQL: `DISPATCH_LEVEL`.
    pub fn take_front(&mut self, take: impl FnOnce(&[u8]) -> bool) -> Option<bool> {
        let front = self.front()?;
        let words = &self.ring.producers.words[front.offset..front.offset + front.words];
        // SAFETY: as in `peek`.
        let taken = unsafe { read_words(words, |bytes| take(&bytes[..front.size])) };
        if taken {
            let consumer = &self.ring.consumer;
            consumer.front.store(0, Ordering::Relaxed);
            consumer.head_word.store(
                self.ring.word_after(front.offset, front.words) as u64,
                Ordering::Relaxed,
            );
            // Release: the copy above is done before a producer may write
            // these words again.
            consumer.head.store(
                front.position + (front.words * WORD_SIZE) as u64,
                Ordering::Release,
            );
            consumer.taken.store(
                consumer.taken.load(Ordering::Relaxed) + 1,
                Ordering::Relaxed,
            );
        }
        Some(taken)
    }
}

/// Where a written record lies.
struct Front {
    /// Its byte position (past a wrap mark before it).
    position: u64,
    /// Its first word's index.
    offset: usize,
    /// Its words.
    words: usize,
    /// Its size in bytes.
    size: usize,
}

impl Front {
    /// The front as one word, for a head at `head`: its size (bits 0-15),
    /// words (16-31, at least 1, so never 0 in all) and the words a wrap
    /// mark skipped before it (32-63; a shard has fewer than 2^32 words).
    fn packed(&self, head: u64) -> u64 {
        let skipped = (self.position - head) / WORD_SIZE as u64;
        skipped << 32 | (self.words as u64) << 16 | self.size as u64
    }

    /// The front `packed` for a head at `head` whose word index is
    /// `head_word`; `None` for 0.
    #[expect(
        clippy::cast_possible_truncation,
        reason = "fields of at most 16 and 32 bits"
    )]
    fn unpacked(packed: u64, head: u64, head_word: usize) -> Option<Self> {
        let words = usize::from((packed >> 16) as u16);
        (words > 0).then(|| {
            let skipped = packed >> 32;
            Self {
                position: head + skipped * WORD_SIZE as u64,
                // Only a wrap mark skips words, and the record is then at
                // the start of the memory.
                offset: if skipped == 0 { head_word } else { 0 },
                words,
                size: usize::from(packed as u16),
            }
        })
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

    fn words(count: usize) -> Vec<Word> {
        (0..count).map(|_| Word::new()).collect()
    }

    /// A fake record: its size word, then `fill` bytes up to `size`.
    pub(crate) fn record(fill: u8) -> impl FnOnce(u64, &mut [u8]) {
        move |_, record| {
            record[..2].fill(0xEE);
            record[2..].fill(fill);
        }
    }

    pub(crate) fn fake(size: u16, fill: u8) -> Vec<u8> {
        let mut bytes = vec![fill; usize::from(size)];
        bytes[..2].copy_from_slice(&size.to_le_bytes());
        bytes
    }

    #[test]
    fn capacity_settings_are_in_kib_defaulted_and_bounded() {
        assert_eq!(capacity_for_setting(None), 9 * 1024 * 1024);
        assert_eq!(capacity_for_setting(Some(0)), 16 * 1024);
        assert_eq!(capacity_for_setting(Some(100)), 100 * 1024);
        assert_eq!(capacity_for_setting(Some(u32::MAX)), 144 * 1024 * 1024);
    }

    #[test]
    fn publishes_and_drains_in_order() {
        let words = words(8);
        let ring = RecordRing::new(&words);
        assert_eq!(ring.capacity(), 64);
        assert_eq!(ring.publish(8, record(1)), Ok(1));
        assert_eq!(ring.publish(16, record(2)), Ok(2));
        assert_eq!((ring.len(), ring.bytes_used()), (2, 24));
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
        assert_eq!(&out[..8], fake(8, 1).as_slice(), "the ring wrote the size");
        assert_eq!(&out[8..24], fake(16, 2).as_slice());
        assert!(ring.is_empty());
        assert_eq!(ring.bytes_used(), 0);
    }

    #[test]
    fn a_record_takes_whole_words_and_keeps_its_own_size() {
        let words = words(4);
        let ring = RecordRing::new(&words);
        ring.publish(10, record(3)).unwrap();
        assert_eq!(ring.bytes_used(), 16, "10 bytes take two words");
        let mut out = [0_u8; 32];
        let drained = ring.consumer().unwrap().drain(&mut out);
        assert_eq!(&out[..drained.bytes], fake(10, 3).as_slice());
    }

    #[test]
    fn sizes_outside_the_range_are_brought_into_it() {
        let words = words(MAX_RECORD_SIZE / WORD_SIZE * 2);
        let ring = RecordRing::new(&words);
        ring.publish(0, record(1)).unwrap();
        ring.publish(MAX_RECORD_SIZE + 1, record(2)).unwrap();
        let mut out = vec![0_u8; 2 * MAX_RECORD_SIZE];
        let drained = ring.consumer().unwrap().drain(&mut out);
        assert_eq!(drained.bytes, 2 + MAX_RECORD_SIZE);
        assert_eq!(&out[..2], &2_u16.to_le_bytes());
    }

    #[test]
    fn a_record_that_would_cross_the_end_goes_to_the_start_after_a_wrap_mark() {
        let words = words(4);
        let ring = RecordRing::new(&words);
        ring.publish(8, record(1)).unwrap();
        ring.publish(16, record(2)).unwrap();
        let mut out = [0_u8; 64];
        let mut consumer = ring.consumer().unwrap();
        assert_eq!(consumer.take_front(|record| record[2] == 1), Some(true));
        // Tail at 24: one word left before the end, and two wanted. The
        // start is free only up to the head (8): no room for mark + record.
        assert_eq!(ring.publish(16, record(3)), Err(Full { sequence: 3 }));
        assert_eq!(consumer.drain(&mut out).records, 1);
        // Now empty at 24: the mark fills word 3, the record words 0-1.
        assert_eq!(ring.publish(16, record(4)), Ok(4));
        assert_eq!(ring.bytes_used(), 8 + 16, "the skipped word counts as used");
        let drained = consumer.drain(&mut out);
        assert_eq!(&out[..drained.bytes], fake(16, 4).as_slice());
        assert_eq!(ring.bytes_used(), 0);
        assert_eq!(ring.publish(16, record(5)), Ok(5), "on after the wrap");
    }

    #[test]
    fn a_full_ring_drops_the_newest_and_counts_it() {
        let words = words(2);
        let ring = RecordRing::new(&words);
        ring.publish(8, record(1)).unwrap();
        ring.publish(8, record(2)).unwrap();
        assert_eq!(ring.publish(8, record(3)), Err(Full { sequence: 3 }));
        assert_eq!(ring.dropped(), 1);
        let mut out = [0_u8; 64];
        ring.consumer().unwrap().drain(&mut out);
        assert_eq!(out[2], 1, "the oldest records stay; the newest was dropped");
        assert_eq!(out[10], 2);
        assert_eq!(ring.publish(8, record(4)), Ok(4), "the drop spent number 3");
        assert_eq!((ring.dropped(), ring.sequences_spent()), (1, 4));
    }

    #[test]
    fn half_the_capacity_always_fits_an_empty_ring() {
        let words = words(6);
        let ring = RecordRing::new(&words);
        let mut out = [0_u8; 64];
        for (step, size) in [8, 24, 16, 24, 24, 8, 24].into_iter().enumerate() {
            let fill = u8::try_from(step).unwrap();
            assert!(ring.publish(size, record(fill)).is_ok(), "step {step}");
            ring.consumer().unwrap().drain(&mut out);
            assert!(ring.is_empty() && ring.bytes_used() == 0);
        }
    }

    #[test]
    fn every_drop_spends_a_number_and_the_numbers_run_on() {
        let words = words(2);
        let ring = RecordRing::new(&words);
        ring.publish(8, record(1)).unwrap();
        ring.publish(8, record(2)).unwrap();
        // Past 2^16 natively; under Miri, which checks the accesses rather
        // than the arithmetic, a few hundred.
        let drops = if cfg!(miri) { 300 } else { 70_000 };
        for sequence in 3..3 + drops {
            assert_eq!(ring.publish(8, record(3)), Err(Full { sequence }));
        }
        assert_eq!((ring.dropped(), ring.sequences_spent()), (drops, drops + 2));
        ring.consumer().unwrap().discard_all();
        assert_eq!(ring.publish(8, record(4)), Ok(drops + 3));
    }

    #[test]
    fn the_writer_word_counts_sections_and_never_returns_to_an_earlier_value() {
        // A reader that saw a section inside tells its end from a later
        // section by the word having moved on: it must count sections.
        let words = words(2);
        let ring = RecordRing::new(&words);
        let word = || ring.producers.writer.load(Ordering::Relaxed);
        assert_eq!(word(), 0);
        for sections in 1..=3 {
            let section = ring.enter();
            assert_eq!(word(), 2 * sections - 1, "odd inside");
            assert_eq!(
                section.sequence(),
                sections,
                "half the word found, plus one"
            );
            drop(section);
            assert_eq!(word(), 2 * sections, "even outside, one step on");
            assert_eq!(ring.sequences_spent(), sections);
        }
    }

    #[test]
    fn a_reader_settles_when_no_section_is_inside_and_reports_one_that_stays() {
        let words = words(2);
        let ring = RecordRing::new(&words);
        assert!(ring.settle(), "no section: settled");
        let section = ring.enter();
        assert!(!ring.settle(), "a section that never leaves is reported");
        drop(section);
        assert!(ring.settle());
    }

    #[test]
    fn a_drain_never_splits_a_record() {
        let words = words(8);
        let ring = RecordRing::new(&words);
        ring.publish(16, record(1)).unwrap();
        ring.publish(16, record(2)).unwrap();
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
        let words = words(2);
        let ring = RecordRing::new(&words);
        let first = ring.consumer().unwrap();
        assert!(ring.consumer().is_none());
        drop(first);
        assert!(ring.consumer().is_some());
    }

    #[test]
    #[should_panic(expected = "at least 2 words")]
    fn one_word_is_too_few() {
        let words = words(1);
        let _ = RecordRing::new(&words);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Publish(u16),
        Drain(usize),
        Clear,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (2_u16..=64).prop_map(Op::Publish),
            2 => (0_usize..200).prop_map(Op::Drain),
            1 => Just(Op::Clear),
        ]
    }

    /// Bytes a record of `size` takes in the ring.
    fn footprint(size: usize) -> usize {
        size.div_ceil(WORD_SIZE) * WORD_SIZE
    }

    proptest! {
        /// The ring behaves as a bounded FIFO of variable-length records
        /// that never wrap: a record goes at the tail when it fits before
        /// the end, else at the start with the rest of the memory skipped,
        /// and is dropped (and counted) when that room is not free. Every
        /// publish is numbered in turn (drops included), and a drain never
        /// splits a record.
        #[test]
        fn behaves_like_a_bounded_fifo_of_records_that_never_wrap(
            words_count in 2_usize..24,
            ops in prop::collection::vec(op(), 0..60),
        ) {
            let words = words(words_count);
            let ring = RecordRing::new(&words);
            let capacity = words_count * WORD_SIZE;
            // The model: records waiting, with the bytes each took
            // (skipped space included), and the tail's place in memory.
            let mut model: VecDeque<(Vec<u8>, usize)> = VecDeque::new();
            let mut tail = 0_usize;
            let (mut model_dropped, mut model_spent) = (0, 0);
            for (step, op) in ops.into_iter().enumerate() {
                let fill = u8::try_from(step % 251).unwrap();
                match op {
                    Op::Publish(size) => {
                        let size = usize::from(size);
                        let result = ring.publish(size, record(fill));
                        model_spent += 1;
                        let used: usize = model.iter().map(|(_, taken)| taken).sum();
                        let to_end = capacity - tail % capacity;
                        let taken = if footprint(size) <= to_end {
                            footprint(size)
                        } else {
                            to_end + footprint(size)
                        };
                        if used + taken <= capacity {
                            prop_assert_eq!(result, Ok(model_spent));
                            model.push_back((fake(u16::try_from(size).unwrap(), fill), taken));
                            tail += taken;
                        } else {
                            prop_assert_eq!(result, Err(Full { sequence: model_spent }));
                            model_dropped += 1;
                        }
                    }
                    Op::Drain(room) => {
                        let mut out = vec![0_u8; room];
                        let drained = ring.consumer().unwrap().drain(&mut out);
                        let mut expected = Vec::new();
                        while model
                            .front()
                            .is_some_and(|(next, _)| expected.len() + next.len() <= room)
                        {
                            expected.extend(model.pop_front().unwrap().0);
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
                prop_assert_eq!(
                    ring.bytes_used(),
                    model.iter().map(|(_, taken)| taken).sum::<usize>()
                );
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
        let words = words(100);
        let ring = RecordRing::new(&words);
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
                                // 8 to 40 bytes, so records wrap at many places.
                                let size = 8 * (1 + usize::from(n % 5));
                                let result = ring.publish(size, |_, record| {
                                    record[2] = producer;
                                    record[3..5].copy_from_slice(&n.to_le_bytes());
                                    record[5..].fill(producer ^ 0xA5);
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
                for record in kstack_sized_records(&out[..drained.bytes]) {
                    let producer = usize::from(record[2]);
                    let n = u16::from_le_bytes([record[3], record[4]]);
                    assert_eq!(record.len(), 8 * (1 + usize::from(n % 5)), "size kept");
                    assert!(
                        record[5..].iter().all(|&b| b == record[2] ^ 0xA5),
                        "torn record {record:?}"
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
        assert_eq!(copied + ring.dropped(), total_attempts);
        assert_eq!(seen.iter().map(|&n| u64::from(n)).sum::<u64>(), copied);
    }

    /// The records packed in `bytes`, each led by its size word.
    fn kstack_sized_records(mut bytes: &[u8]) -> impl Iterator<Item = &[u8]> {
        core::iter::from_fn(move || {
            let size = size_word(bytes.get(..2)?);
            let (record, rest) = bytes.split_at(size);
            bytes = rest;
            Some(record)
        })
    }
}
