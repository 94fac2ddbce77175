//! The trace record: who, where, when, both hashes, and the frames.
//!
//! Layout (little-endian, every record a multiple of 8 bytes):
//!
//! | offset | size | field |
//! |-------:|-----:|-------|
//! | 0  | 2 | `record_size`: bytes in this record, header and frames |
//! | 2  | 1 | `source` ([`Source`] wire value) |
//! | 3  | 1 | `irql` at capture |
//! | 4  | 1 | `frame_count`: the frames in this record, kernel part then user part |
//! | 5  | 1 | `user_frame_count`: how many of the stack's frames, the last ones, are the user part |
//! | 6  | 2 | `flags` ([`RecordFlags`]) |
//! | 8  | 8 | `sequence`: per shard and driver load, from 1; a gap is a record dropped or cleared |
//! | 16 | 8 | `timestamp`: 100 ns units since 1601-01-01 UTC: the system time at driver load plus the time elapsed since on the performance counter, taken inside the publish section (see below) |
//! | 24 | 4 | `process_id` of the current process |
//! | 28 | 4 | `thread_id` of the current thread |
//! | 32 | 2 | `processor` the capture ran on |
//! | 34 | 1 | `shard`: the ring shard that kept it, below [`MAX_SHARDS`] |
//! | 35 | 1 | `user_part`: what happened to the user part ([`UserPart`]) |
//! | 36 | 4 | `os_hash`: `RtlCaptureStackBackTrace`'s BackTraceHash, as returned |
//! | 40 | 24 | three fact words ([`SourceFacts`]) |
//! | 64 | 8 | `match_id`: kstack's 64-bit [`stack_id`] of the frames |
//! | 72 | 8 × n | `addresses`: frame 0 is the return address of the most recent call |
//!
//! A record that names its stack instead of carrying it (flag
//! [`RecordFlags::STACK_BY_ID`], `frame_count` 0) is shorter (ABI 10): its
//! fact words stop after the last one that is not zero (a word left out
//! reads as 0), and `match_id` follows them. Its size, 48 to 72 bytes
//! ([`by_id_record_size`]), says how many fact words it keeps: `(size - 48)
//! / 8`, so the `match_id` sits at `size - 8`. A timer event's record is 48
//! bytes, a registry or capture-now event's 56, a thread-stack event's 72
//! (64 when its `delay` is 0 and it is not late). Bytes 0 to 39 are as
//! above. (Until ABI 9 such records always kept their three fact words: 72
//! bytes, which read the same way.)
//!
//! The driver keeps one ring shard per processor, each numbering its own
//! records: `(shard, sequence)` names a record, and each shard's numbers
//! have gaps only where that shard dropped or cleared records. A record
//! returned to a capture-now caller without being kept (flag
//! [`RecordFlags::NOT_IN_RING`]) has sequence 0 and shard 0, whichever
//! processor it ran on. Processor numbers fit 16
//! bits (Windows supports at most 2048 logical processors); a larger one
//! would be written as 65535.
//!
//! The timestamp is monotonic: a change of the system clock after the
//! driver loaded does not move it (it then differs from the system clock
//! by that change), and it never goes backwards on any processor. A kept
//! record takes it inside its shard's publish section, after claiming its
//! slot, at `DISPATCH_LEVEL` on the processor its `processor` names; the
//! record's `irql` is the callback's IRQL, where the stack was walked,
//! before the section. Reads return records in timestamp order: within a
//! read, across shards, and from one read to the next (a read returns only
//! records stamped before it began, and every such record that is still in
//! the ring; see `kstack_abi::ioctl::Ioctl::Read`).
//!
//! Bytes 64.. are shaped like ETW's `EVENT_EXTENDED_ITEM_STACK_TRACE64`
//! (`MatchId`, then `Address[]`). ETW's `MatchId` pairs a kernel stack with
//! the user-mode half of the same event; a kstack record holds both halves
//! in one address list (the kernel frames, then `user_frame_count` user
//! frames), so that slot holds the stack id of the whole list, equal for
//! identical stacks. The user part of a WoW64 thread (flag
//! [`RecordFlags::WOW64`]) is what the walk returned for it.
//!
//! ABI 5 to 7 records read as ABI 8 records: their `frame_count` was a u16
//! below 63 and their `shard` a u16 below 64, so bytes 5 and 35 are 0 (no
//! user frames, [`UserPart::Off`]).

pub use crate::limits::{MAX_FRAMES, MAX_SHARDS};
use crate::{
    Source, SourceFacts,
    error::DecodeError,
    module_record::{ModuleRecord, decode_module_record, is_module_record},
    user_part::UserPart,
    wire::{Reader, Writer},
    wire_types::wire_flags,
};

/// Bytes before the frame part.
pub const RECORD_HEADER_SIZE: usize = 64;
/// Bytes of `match_id` before the addresses.
const MATCH_ID_SIZE: usize = 8;
/// The size of a record with `MAX_FRAMES` frames.
pub const MAX_RECORD_SIZE: usize = record_size(MAX_FRAMES);
/// Offset of `flags` in a record.
const FLAGS_OFFSET: usize = 6;
/// Offset of `os_hash` in a record.
const OS_HASH_OFFSET: usize = 36;
/// Offset of `timestamp` in a record.
const TIMESTAMP_OFFSET: usize = 16;

/// The size of a record with `frame_count` frames.
#[must_use]
pub const fn record_size(frame_count: u16) -> usize {
    RECORD_HEADER_SIZE + MATCH_ID_SIZE + 8 * frame_count as usize
}

/// Bytes before the fact words.
const FACTS_OFFSET: usize = 40;
/// The smallest record: one naming its stack, without fact words.
pub const MIN_RECORD_SIZE: usize = FACTS_OFFSET + MATCH_ID_SIZE;
/// The fact words every record has room for.
const FACT_WORDS: usize = 3;

/// The size of a record with these facts that names its stack
/// ([`RecordFlags::STACK_BY_ID`]) and carries no frames: the fact words up
/// to the last one that is not zero, then the stack id.
#[must_use]
pub const fn by_id_record_size(facts: &SourceFacts) -> usize {
    MIN_RECORD_SIZE + 8 * kept_fact_words(&facts.to_words())
}

/// How many of `words` a record without frames keeps: up to the last one
/// that is not zero.
const fn kept_fact_words(words: &[u64; FACT_WORDS]) -> usize {
    let mut kept = FACT_WORDS;
    while kept > 0 && words[kept - 1] == 0 {
        kept -= 1;
    }
    kept
}

wire_flags! {
/// Record flag bits.
pub struct RecordFlags(u16) {
    /// The kernel walk filled every frame asked for: the kernel stack may go
    /// deeper.
    const TRUNCATED = 1;
    /// A capture-now record returned to its caller but not kept in the ring
    /// (the on-demand source was disabled, or the process filter left the
    /// caller out, see [`crate::Ioctl::CaptureNow`]); its sequence and its
    /// shard are 0.
    const NOT_IN_RING = 2;
    /// The record's stack is the stack table's entry for its `match_id`
    /// (the stack id). Without frames the record is shorter (ABI 10: see
    /// the layout above). With frames, the record carries the entry's frames:
    /// a reader remembers them for that id, replacing what it remembered
    /// (the table may have rewritten the entry). Without frames
    /// (`frame_count` 0), its stack is the one the reader remembers for
    /// the id. Records without this flag carry their own frames and change
    /// nothing remembered (one may have a table entry's id with other
    /// frames: a counted collision). A record whose walk found no frames
    /// never has this flag.
    ///
    /// The guarantee (ABI 7): for every record without frames that a read
    /// returns to a reader (a file object), an earlier record returned to
    /// the same reader, the latest flagged one with that `match_id` and
    /// frames, carried its stack. (Records lost on the way to the reader,
    /// such as a read whose output buffer the I/O manager could not copy
    /// back, may take such frames with them.)
    ///
    /// Which flagged records carry frames: the driver remembers, per table
    /// entry, whether the frames went out in the current *run*, the reads
    /// of one reader back to back. A read writes the entry's frames into
    /// the first flagged record of that entry it returns in the run, and
    /// returns the entry's later records of the run without them. A run
    /// ends when a read comes from another reader than the previous read,
    /// or when the previous read's reader closes its handle; an entry
    /// rewritten with another stack (an eviction) goes out again within a
    /// run. So a reader reading alone gets each stack's frames once per
    /// entry; two readers taking turns each get the frames again in the
    /// first read after the other's. Clears, overflows and records left
    /// for a later read do not end a run.
    ///
    /// Capture-now replies never have this flag and always carry their
    /// frames ([`crate::Ioctl::CaptureNow`]).
    const STACK_BY_ID = 4;
    /// The process is a 32-bit (WoW64) process on 64-bit Windows. The
    /// driver asks only when it is about to walk the user stack, so the flag
    /// can be set only on records whose user part is captured, truncated,
    /// faulted, reentered, `guard_full` or `no_stack`.
    const WOW64 = 8;
}
}

/// Everything in a record but its frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordHeader {
    /// Sequence number within its shard, per driver load, from 1; 0 in a
    /// record no shard kept ([`RecordFlags::NOT_IN_RING`]).
    pub sequence: u64,
    /// System time of the capture, 100 ns units since 1601-01-01 UTC.
    pub timestamp: u64,
    /// The current process at capture.
    pub process_id: u32,
    /// The current thread at capture.
    pub thread_id: u32,
    /// The processor the capture ran on.
    pub processor: u16,
    /// The ring shard that kept it (for a capture-now reply whose ring copy
    /// was dropped, the shard that dropped it); 0 in a record no shard
    /// kept ([`RecordFlags::NOT_IN_RING`]).
    pub shard: u16,
    /// The IRQL at capture.
    pub irql: u8,
    /// Flag bits.
    pub flags: RecordFlags,
    /// How many of the stack's frames, the last ones, are its user part.
    /// For a record without frames ([`RecordFlags::STACK_BY_ID`],
    /// `frame_count` 0) it describes the remembered stack.
    pub user_frame_count: u8,
    /// What happened to the user part.
    pub user_part: UserPart,
    /// The OS BackTraceHash, as `RtlCaptureStackBackTrace` returned it.
    pub os_hash: u32,
    /// kstack's 64-bit stack id of the frames (see [`stack_id`]).
    pub stack_id: u64,
    /// The source and what it knew.
    pub facts: SourceFacts,
}

/// A decoded record whose frames stay in the buffer they came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordView<'a> {
    /// Everything but the frames.
    pub header: RecordHeader,
    addresses: &'a [u8],
}

impl RecordView<'_> {
    /// The source that captured this record.
    #[must_use]
    pub const fn source(&self) -> Source {
        self.header.facts.source()
    }

    /// How many frames the record holds.
    #[must_use]
    pub const fn frame_count(&self) -> usize {
        self.addresses.len() / 8
    }

    /// How many of the record's frames are kernel frames (all of them
    /// but the user part).
    #[must_use]
    pub const fn kernel_frame_count(&self) -> usize {
        self.frame_count()
            .saturating_sub(self.header.user_frame_count as usize)
    }

    /// The return addresses, most recent call first.
    #[must_use]
    pub fn frames(&self) -> impl ExactSizeIterator<Item = u64> + '_ {
        self.addresses
            .chunks_exact(8)
            .map(|word| u64::from_le_bytes(word.try_into().unwrap_or_default()))
    }
}

/// kstack's stack id: a 64-bit hash of the frame addresses, equal for equal
/// frame lists. The OS BackTraceHash is only 32 bits (a plain sum of the
/// addresses on Windows, another function under Wine), too weak to group by.
///
/// Frame `i` goes into lane `i % 8`, each lane a multiply-rotate chain (as
/// `FxHash`) from zero; the lanes, each rotated by 8 bits more than the one
/// before, are xored with the count times another odd constant, and murmur3's
/// finaliser spreads every bit over every bit. The lanes do not wait for
/// each other, so a 32-frame stack is a chain of 4 multiplies, not 32
/// (ABI 7 to 12 chained every frame, and gave other ids). Every step is a
/// bijection of the value it changes, so two lists of one length that
/// differ in one frame never share an id. No frames hash to 0.
#[must_use]
pub fn stack_id(frames: &[u64]) -> u64 {
    const K: u64 = 0x517C_C1B7_2722_0A95;
    // Another odd constant: with K, one frame of 1 would cancel its count.
    const COUNT_K: u64 = 0x9E37_79B9_7F4A_7C15;
    const LANES: usize = 8;
    let step = |lane: &mut u64, frame: &u64| *lane = (lane.rotate_left(5) ^ frame).wrapping_mul(K);
    let mut lanes = [0_u64; LANES];
    let mut chunks = frames.chunks_exact(LANES);
    for chunk in &mut chunks {
        lanes
            .iter_mut()
            .zip(chunk)
            .for_each(|(lane, frame)| step(lane, frame));
    }
    lanes
        .iter_mut()
        .zip(chunks.remainder())
        .for_each(|(lane, frame)| step(lane, frame));
    let count = frames.len() as u64;
    let mut h = lanes
        .iter()
        .zip((0..u32::MAX).step_by(8))
        .fold(count.wrapping_mul(COUNT_K), |h, (lane, bits)| {
            h ^ lane.rotate_left(bits)
        });
    h ^= h >> 33;
    h = h.wrapping_mul(0xFF51_AFD7_ED55_8CCD);
    h ^= h >> 33;
    h = h.wrapping_mul(0xC4CE_B9FE_1A85_EC53);
    h ^ (h >> 33)
}

/// Encodes a record into the front of `out` and returns its size.
///
/// # Errors
/// [`DecodeError::TooManyFrames`] past [`MAX_FRAMES`], or
/// [`DecodeError::Truncated`] when `out` is too small.
pub fn encode_record(
    header: &RecordHeader,
    frames: &[u64],
    out: &mut [u8],
) -> Result<usize, DecodeError> {
    let frame_count = u8::try_from(frames.len())
        .ok()
        .filter(|&count| u16::from(count) <= MAX_FRAMES)
        .ok_or(DecodeError::TooManyFrames {
            count: frames.len(),
        })?;
    let words = header.facts.to_words();
    let (size, kept_words) = if frame_count == 0 && header.flags.contains(RecordFlags::STACK_BY_ID)
    {
        let kept = kept_fact_words(&words);
        (MIN_RECORD_SIZE + 8 * kept, kept)
    } else {
        (record_size(frame_count.into()), FACT_WORDS)
    };
    let available = out.len();
    let out = out.get_mut(..size).ok_or(DecodeError::Truncated {
        needed: size,
        actual: available,
    })?;
    let mut w = Writer::new(out);
    #[expect(
        clippy::cast_possible_truncation,
        reason = "size <= MAX_RECORD_SIZE < u16::MAX"
    )]
    w.u16(0, size as u16);
    w.u8(2, header.facts.source() as u8);
    w.u8(3, header.irql);
    w.u8(4, frame_count);
    w.u8(5, header.user_frame_count);
    w.u16(6, header.flags.bits());
    w.u64(8, header.sequence);
    w.u64(TIMESTAMP_OFFSET, header.timestamp);
    w.u32(24, header.process_id);
    w.u32(28, header.thread_id);
    w.u16(32, header.processor);
    w.u8(34, u8::try_from(header.shard).unwrap_or(u8::MAX));
    w.u8(35, header.user_part as u8);
    w.u32(OS_HASH_OFFSET, header.os_hash);
    // Each word at its fixed place when the record keeps it: three fixed
    // writes the optimizer keeps straight (a loop over the kept words cost
    // the 32-frame publish about 4 ns, docs/performance.md).
    let [a, b, c] = words;
    let end = FACTS_OFFSET + 8 * kept_words;
    for (offset, word) in [
        (FACTS_OFFSET, a),
        (FACTS_OFFSET + 8, b),
        (FACTS_OFFSET + 16, c),
    ] {
        if offset < end {
            w.u64(offset, word);
        }
    }
    w.u64(end, header.stack_id);
    for (index, &frame) in frames.iter().enumerate() {
        w.u64(RECORD_HEADER_SIZE + MATCH_ID_SIZE + 8 * index, frame);
    }
    Ok(size)
}

/// Decodes the record at the front of `bytes`; returns it and its size.
///
/// # Errors
/// A [`DecodeError`] for a short buffer, a size that disagrees with the
/// frame count, or any field out of range.
pub fn decode_record(bytes: &[u8]) -> Result<(RecordView<'_>, usize), DecodeError> {
    let r = Reader::new(bytes);
    let size = usize::from(r.u16(0)?);
    let frame_count = u16::from(r.u8(4)?);
    if frame_count > MAX_FRAMES {
        return Err(DecodeError::TooManyFrames {
            count: usize::from(frame_count),
        });
    }
    let flag_bits = r.u16(6)?;
    let flags = RecordFlags::from_bits(flag_bits).ok_or(DecodeError::UnknownFlags {
        bits: u32::from(flag_bits),
    })?;
    let without_frames = frame_count == 0 && flags.contains(RecordFlags::STACK_BY_ID);
    let kept_words = if without_frames {
        // 48 to 72 bytes: the fact words it keeps, then the stack id.
        size.checked_sub(MIN_RECORD_SIZE)
            .filter(|words| words % 8 == 0 && words / 8 <= FACT_WORDS)
            .map(|words| words / 8)
    } else {
        (size == record_size(frame_count)).then_some(FACT_WORDS)
    }
    .ok_or(DecodeError::RecordSizeMismatch { size, frame_count })?;
    if bytes.len() < size {
        return Err(DecodeError::Truncated {
            needed: size,
            actual: bytes.len(),
        });
    }
    let source_value = r.u8(2)?;
    let source = Source::from_wire(source_value).ok_or(DecodeError::UnknownSource {
        value: source_value,
    })?;
    let shard = u16::from(r.u8(34)?);
    if shard >= MAX_SHARDS {
        return Err(DecodeError::ShardOutOfRange { shard });
    }
    let user_frame_count = r.u8(5)?;
    let user_limit = if without_frames {
        MAX_FRAMES
    } else {
        frame_count
    };
    if u16::from(user_frame_count) > user_limit {
        return Err(DecodeError::UserFrames {
            user_frame_count,
            frame_count,
        });
    }
    let user_value = r.u8(35)?;
    let user_part = UserPart::from_wire(user_value)
        .ok_or(DecodeError::UnknownUserPart { value: user_value })?;
    // A word the record does not keep reads as 0 (see `encode_record`).
    let end = FACTS_OFFSET + 8 * kept_words;
    let word = |offset: usize| {
        if offset < end { r.u64(offset) } else { Ok(0) }
    };
    let words = [
        word(FACTS_OFFSET)?,
        word(FACTS_OFFSET + 8)?,
        word(FACTS_OFFSET + 16)?,
    ];
    let header = RecordHeader {
        sequence: r.u64(8)?,
        timestamp: r.u64(TIMESTAMP_OFFSET)?,
        process_id: r.u32(24)?,
        thread_id: r.u32(28)?,
        processor: r.u16(32)?,
        shard,
        irql: r.u8(3)?,
        flags,
        user_frame_count,
        user_part,
        os_hash: r.u32(OS_HASH_OFFSET)?,
        stack_id: r.u64(end)?,
        facts: SourceFacts::from_words(source, words)?,
    };
    let addresses = bytes
        .get(RECORD_HEADER_SIZE + MATCH_ID_SIZE..size)
        .unwrap_or_default();
    Ok((RecordView { header, addresses }, size))
}

/// The size field of an encoded record of either kind (its first two
/// bytes), read without decoding the rest, for skipping over records; 0
/// when `record` is too short to hold one.
#[must_use]
pub fn record_size_field(record: &[u8]) -> usize {
    Reader::new(record).u16(0).map_or(0, usize::from)
}

/// The timestamp of an encoded record, read without decoding the rest (the
/// driver merges its shards by it); 0 when `record` is too short to hold one.
#[must_use]
pub fn record_timestamp(record: &[u8]) -> u64 {
    Reader::new(record).u64(TIMESTAMP_OFFSET).unwrap_or(0)
}

/// The flags of an encoded trace record, read without decoding the rest
/// (the driver reads tabled records differently); none when `record` is a
/// module record, too short, or has undefined bits.
#[must_use]
pub fn record_flags(record: &[u8]) -> RecordFlags {
    if is_module_record(record) {
        return RecordFlags::NONE;
    }
    Reader::new(record)
        .u16(FLAGS_OFFSET)
        .ok()
        .and_then(RecordFlags::from_bits)
        .unwrap_or(RecordFlags::NONE)
}

/// The `os_hash` of an encoded record, read without decoding the rest (the
/// driver's ring keeps a tabled record's table slot there); 0 when
/// `record` is too short to hold one.
#[must_use]
pub fn record_os_hash(record: &[u8]) -> u32 {
    Reader::new(record).u32(OS_HASH_OFFSET).unwrap_or(0)
}

/// Writes `os_hash` into an encoded record (the driver puts a tabled
/// record's hash back on its way to a reader); a record too short to hold
/// one is left alone.
pub fn set_record_os_hash(record: &mut [u8], os_hash: u32) {
    if let Some(field) = record.get_mut(OS_HASH_OFFSET..OS_HASH_OFFSET + 4) {
        field.copy_from_slice(&os_hash.to_le_bytes());
    }
}

/// One record of a read payload: a trace record, or a module record (see
/// [`crate::module_record`]), told apart by byte 2.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry<'a> {
    /// A stack and the facts of the event that took it.
    Trace(RecordView<'a>),
    /// An image load or a process exit.
    Module(ModuleRecord<'a>),
}

impl<'a> Entry<'a> {
    /// The trace record, if this is one.
    #[must_use]
    pub const fn trace(self) -> Option<RecordView<'a>> {
        match self {
            Self::Trace(record) => Some(record),
            Self::Module(_) => None,
        }
    }
}

/// Decodes the record of either kind at the front of `bytes`; returns it
/// and its size.
///
/// # Errors
/// As [`decode_record`] or [`decode_module_record`].
pub fn decode_entry(bytes: &[u8]) -> Result<(Entry<'_>, usize), DecodeError> {
    if is_module_record(bytes) {
        decode_module_record(bytes).map(|(record, size)| (Entry::Module(record), size))
    } else {
        decode_record(bytes).map(|(record, size)| (Entry::Trace(record), size))
    }
}

/// Walks the whole records packed back to back in a read payload.
pub struct Records<'a> {
    rest: &'a [u8],
}

impl<'a> Records<'a> {
    /// Records packed in `payload`.
    #[must_use]
    pub const fn new(payload: &'a [u8]) -> Self {
        Self { rest: payload }
    }
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<Entry<'a>, DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        match decode_entry(self.rest) {
            Ok((record, size)) => {
                self.rest = &self.rest[size..];
                Some(Ok(record))
            }
            Err(error) => {
                // One bad record makes the rest unreadable: stop after it.
                self.rest = &[];
                Some(Err(error))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::{
        module_record::{
            MAX_MODULE_PATH, ModuleEvent, ModuleFlags, ModuleHeader, encode_module_record,
        },
        source_facts::{HandleOperation, Lifecycle, ObjectKind},
    };

    fn sample_header(facts: SourceFacts, frames: &[u64]) -> RecordHeader {
        RecordHeader {
            sequence: 41,
            timestamp: 133_000_000_000_000_000,
            process_id: 4,
            thread_id: 128,
            processor: 1,
            shard: 3,
            irql: 2,
            flags: RecordFlags::TRUNCATED,
            user_frame_count: 0,
            user_part: UserPart::Irql,
            os_hash: 0xDEAD_BEEF,
            stack_id: stack_id(frames),
            facts,
        }
    }

    #[test]
    fn flags_combine_and_contain_bit_by_bit() {
        let both = RecordFlags::TRUNCATED.union(RecordFlags::NOT_IN_RING);
        assert_eq!(both.bits(), 3);
        assert_eq!(
            RecordFlags::TRUNCATED.union(RecordFlags::TRUNCATED).bits(),
            1
        );
        assert!(both.contains(RecordFlags::TRUNCATED) && both.contains(RecordFlags::NOT_IN_RING));
        assert!(!RecordFlags::TRUNCATED.contains(RecordFlags::NOT_IN_RING));
        assert!(!RecordFlags::TRUNCATED.contains(both));
        assert!(RecordFlags::default().contains(RecordFlags::default()));
    }

    #[test]
    fn a_view_counts_its_frames() {
        let frames = [0x1111, 0x2222, 0x3333];
        let header = sample_header(SourceFacts::OnDemand { tag: 1 }, &frames);
        let mut out = [0_u8; 128];
        let size = encode_record(&header, &frames, &mut out).unwrap();
        let (view, _) = decode_record(&out[..size]).unwrap();
        assert_eq!(view.frame_count(), 3);
        assert!(view.frames().eq(frames));
    }

    #[test]
    fn stack_ids_are_the_documented_hash() {
        // Pinned values: clients and saved captures group by these ids, so a
        // change of the hash is a change of the ABI.
        assert_eq!(stack_id(&[]), STACK_ID_OF_NOTHING);
        assert_eq!(stack_id(&[0x1000]), STACK_ID_OF_ONE_FRAME);
        assert_eq!(stack_id(&[0x1000, 0x2000]), STACK_ID_OF_TWO_FRAMES);
        // Frames whose bits overlap the running hash: xor is not or.
        assert_eq!(stack_id(&[u64::MAX; 3]), 0x2f73_a34d_ad65_7cf6);
        assert_eq!(stack_id(&[u64::MAX, 1]), 0x4430_3027_1567_c9dc);
        // One lane's chain, mixed with the count 1: not 0, as nothing is.
        assert_eq!(stack_id(&[1]), 0x5f45_3c96_d85f_ba1b);
        assert_ne!(
            stack_id(&[0x2000, 0x1000]),
            STACK_ID_OF_TWO_FRAMES,
            "order matters"
        );
        assert_ne!(
            stack_id(&[0x1000, 0x2000, 0]),
            STACK_ID_OF_TWO_FRAMES,
            "length matters"
        );
    }

    const STACK_ID_OF_NOTHING: u64 = 0;
    const STACK_ID_OF_ONE_FRAME: u64 = 0x2d69_5e84_5a22_e7ab;
    const STACK_ID_OF_TWO_FRAMES: u64 = 0xf311_b405_08a1_9681;

    #[test]
    fn layout_matches_the_documented_offsets() {
        let frames = [0x1111, 0x2222];
        let header = RecordHeader {
            user_frame_count: 1,
            user_part: UserPart::Truncated,
            flags: RecordFlags::TRUNCATED.union(RecordFlags::WOW64),
            ..sample_header(SourceFacts::OnDemand { tag: 0xABCD }, &frames)
        };
        let mut out = [0xFF_u8; 100];
        let size = encode_record(&header, &frames, &mut out).unwrap();
        assert_eq!(size, 88);
        assert_eq!(&out[0..2], &88_u16.to_le_bytes());
        assert_eq!(out[2], Source::OnDemand as u8);
        assert_eq!(out[3], 2);
        assert_eq!(out[4], 2);
        assert_eq!(out[5], 1);
        assert_eq!(&out[6..8], &9_u16.to_le_bytes());
        assert_eq!(&out[8..16], &41_u64.to_le_bytes());
        assert_eq!(&out[16..24], &header.timestamp.to_le_bytes());
        assert_eq!(record_timestamp(&out), header.timestamp);
        assert_eq!(&out[32..34], &1_u16.to_le_bytes());
        assert_eq!(out[34], 3);
        assert_eq!(out[35], UserPart::Truncated as u8);
        assert_eq!(&out[36..40], &0xDEAD_BEEF_u32.to_le_bytes());
        assert_eq!(&out[40..48], &0xABCD_u64.to_le_bytes());
        assert_eq!(&out[64..72], &header.stack_id.to_le_bytes());
        assert_eq!(&out[72..80], &0x1111_u64.to_le_bytes());
        assert_eq!(&out[80..88], &0x2222_u64.to_le_bytes());
        assert_eq!(out[88], 0xFF, "nothing written past the record");
        assert_eq!(MAX_RECORD_SIZE, 568);
        assert_eq!(MAX_RECORD_SIZE % 8, 0);
    }

    #[test]
    fn a_record_naming_its_stack_keeps_its_facts_up_to_the_last_nonzero_word_then_the_id() {
        let thread_stack = |delay, late| SourceFacts::ThreadStack {
            target_process_id: 4,
            target_thread_id: 8,
            tag: 0,
            delay,
            late,
        };
        let process = SourceFacts::Process {
            event: Lifecycle::Create,
            process_id: 0,
            parent_process_id: 4,
        };
        let exit = SourceFacts::Process {
            event: Lifecycle::Exit,
            process_id: 0,
            parent_process_id: 0,
        };
        for (facts, size) in [
            (SourceFacts::Timer, MIN_RECORD_SIZE),
            (SourceFacts::Registry { notify_class: 0 }, 48),
            (SourceFacts::Registry { notify_class: 7 }, 56),
            (SourceFacts::OnDemand { tag: 9 }, 56),
            (exit, 56),
            (process, 72),
            (thread_stack(0, false), 64),
            (thread_stack(1, false), 72),
            (thread_stack(0, true), 72),
        ] {
            let header = RecordHeader {
                flags: RecordFlags::STACK_BY_ID,
                user_frame_count: 5,
                ..sample_header(facts, &[0x1111])
            };
            assert_eq!(by_id_record_size(&facts), size, "{facts:?}");
            let mut out = [0xFF_u8; 80];
            assert_eq!(encode_record(&header, &[], &mut out), Ok(size));
            assert_eq!(&out[0..2], &u16::try_from(size).unwrap().to_le_bytes());
            assert_eq!(out[4], 0, "no frames");
            assert_eq!(&out[36..40], &0xDEAD_BEEF_u32.to_le_bytes());
            assert_eq!(&out[size - 8..size], &header.stack_id.to_le_bytes());
            assert_eq!(out[size], 0xFF, "nothing written past the record");
            let (view, used) = decode_record(&out).unwrap();
            assert_eq!((view.header, used, view.frame_count()), (header, size, 0));
        }
        // The same facts with frames keep all three words.
        let header = RecordHeader {
            flags: RecordFlags::STACK_BY_ID,
            ..sample_header(SourceFacts::Timer, &[0x1111])
        };
        let mut out = [0_u8; 80];
        assert_eq!(encode_record(&header, &[0x1111], &mut out), Ok(80));
    }

    #[test]
    fn an_abi_9_record_naming_its_stack_reads_the_same() {
        // Until ABI 9 a record without frames kept its three fact words
        // (saved captures hold such records): 72 bytes, the id at 64.
        let mut old = [0_u8; 72];
        old[0..2].copy_from_slice(&72_u16.to_le_bytes());
        old[2] = Source::OnDemand as u8;
        old[6..8].copy_from_slice(&RecordFlags::STACK_BY_ID.bits().to_le_bytes());
        old[40..48].copy_from_slice(&9_u64.to_le_bytes());
        old[64..72].copy_from_slice(&0x1234_u64.to_le_bytes());
        let (view, size) = decode_record(&old).unwrap();
        assert_eq!(size, 72);
        assert_eq!(view.header.facts, SourceFacts::OnDemand { tag: 9 });
        assert_eq!(view.header.stack_id, 0x1234);
        assert_eq!(view.frame_count(), 0);
    }

    #[test]
    fn an_abi_7_record_reads_as_one_without_a_user_part() {
        // ABI 7's layout: frame_count u16 at 4, shard u16 at 34.
        let mut old = [0_u8; 80];
        old[0..2].copy_from_slice(&80_u16.to_le_bytes());
        old[2] = Source::Timer as u8;
        old[4..6].copy_from_slice(&1_u16.to_le_bytes());
        old[34..36].copy_from_slice(&63_u16.to_le_bytes());
        old[72..80].copy_from_slice(&0xFFFF_F800_0000_1000_u64.to_le_bytes());
        let (view, size) = decode_record(&old).unwrap();
        assert_eq!(size, 80);
        assert_eq!(view.header.shard, 63);
        assert_eq!(view.header.user_frame_count, 0);
        assert_eq!(view.header.user_part, UserPart::Off);
        assert_eq!(view.kernel_frame_count(), 1);
    }

    #[test]
    fn encode_refuses_too_many_frames_and_short_buffers() {
        let frames = [0_u64; MAX_FRAMES as usize + 1];
        let header = sample_header(SourceFacts::Timer, &frames);
        let mut out = [0_u8; 1024];
        assert_eq!(
            encode_record(&header, &frames, &mut out),
            Err(DecodeError::TooManyFrames { count: 63 })
        );
        assert_eq!(
            encode_record(&header, &frames[..2], &mut out[..87]),
            Err(DecodeError::Truncated {
                needed: 88,
                actual: 87
            })
        );
    }

    #[test]
    fn decode_rejects_inconsistent_records() {
        let frames = [1_u64, 2, 3];
        let header = sample_header(SourceFacts::Timer, &frames);
        let mut good = [0_u8; 96];
        encode_record(&header, &frames, &mut good).unwrap();

        assert_eq!(
            decode_record(&good[..95]),
            Err(DecodeError::Truncated {
                needed: 96,
                actual: 95
            })
        );
        let mut bad = good;
        bad[0] = 88;
        assert_eq!(
            decode_record(&bad),
            Err(DecodeError::RecordSizeMismatch {
                size: 88,
                frame_count: 3
            })
        );
        let mut bad = good;
        bad[2] = 9;
        assert_eq!(
            decode_record(&bad),
            Err(DecodeError::UnknownSource { value: 9 })
        );
        let mut bad = good;
        bad[6] = 16;
        assert_eq!(
            decode_record(&bad),
            Err(DecodeError::UnknownFlags { bits: 16 })
        );
        let mut bad = good;
        bad[5] = 4;
        assert_eq!(
            decode_record(&bad),
            Err(DecodeError::UserFrames {
                user_frame_count: 4,
                frame_count: 3
            })
        );
        let mut bad = good;
        bad[35] = 12;
        assert_eq!(
            decode_record(&bad),
            Err(DecodeError::UnknownUserPart { value: 12 })
        );
        let mut bad = good;
        bad[34] = 64;
        assert_eq!(
            decode_record(&bad),
            Err(DecodeError::ShardOutOfRange { shard: MAX_SHARDS })
        );
        let mut bad = good;
        bad[40] = 1;
        assert_eq!(
            decode_record(&bad),
            Err(DecodeError::InvalidFacts {
                source: Source::Timer
            })
        );
        // A record naming its stack without frames: 48 to 72 bytes, in
        // steps of 8.
        let mut by_id = [0_u8; 96];
        let header = RecordHeader {
            flags: RecordFlags::STACK_BY_ID,
            ..header
        };
        assert_eq!(encode_record(&header, &[], &mut by_id), Ok(48));
        for size in [40_u16, 52, 80] {
            by_id[0..2].copy_from_slice(&size.to_le_bytes());
            assert_eq!(
                decode_record(&by_id),
                Err(DecodeError::RecordSizeMismatch {
                    size: size.into(),
                    frame_count: 0
                })
            );
        }
        by_id[0..2].copy_from_slice(&56_u16.to_le_bytes());
        by_id[40] = 1;
        assert_eq!(
            decode_record(&by_id),
            Err(DecodeError::InvalidFacts {
                source: Source::Timer
            }),
            "a kept word the source does not use"
        );
    }

    #[test]
    fn records_iterates_a_packed_payload_and_stops_at_damage() {
        let mut payload = [0_u8; 256];
        let a = sample_header(SourceFacts::Registry { notify_class: 3 }, &[7]);
        let b = sample_header(
            SourceFacts::ObjectHandle {
                operation: HandleOperation::Create,
                object: ObjectKind::Process,
                desired_access: 0x1000,
                target_process_id: 8,
            },
            &[8, 9],
        );
        let exit = ModuleHeader {
            sequence: 42,
            timestamp: 133_000_000_000_000_001,
            process_id: 8,
            thread_id: 9,
            processor: 0,
            shard: 0,
            event: ModuleEvent::ProcessExit,
            flags: ModuleFlags::NONE,
            image_base: 0,
            image_size: 0,
            process_key: 0,
        };
        let used_a = encode_record(&a, &[7], &mut payload).unwrap();
        let used_m = encode_module_record(&exit, &[], &mut payload[used_a..]).unwrap();
        let used = used_a + used_m;
        let used_b = encode_record(&b, &[8, 9], &mut payload[used..]).unwrap();
        assert_eq!(record_flags(&payload[used_a..]), RecordFlags::NONE);
        assert_eq!(record_size_field(&payload[used_a..]), used_m);
        assert_eq!(record_size_field(&payload), used_a);
        assert_eq!(record_size_field(&payload[..1]), 0);
        assert_eq!(record_timestamp(&payload[used_a..]), exit.timestamp);
        let decoded: Vec<_> = Records::new(&payload[..used + used_b])
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(decoded.len(), 3);
        assert!(matches!(decoded[0], Entry::Trace(view) if view.header == a));
        assert!(matches!(decoded[1], Entry::Module(record) if record.header == exit));
        assert!(
            matches!(decoded[2], Entry::Trace(view) if view.frames().collect::<Vec<_>>() == [8, 9])
        );

        let mut damaged = Records::new(&payload[..used + used_b - 1]);
        assert!(damaged.next().unwrap().is_ok());
        assert!(damaged.next().unwrap().is_ok());
        assert!(damaged.next().unwrap().is_err());
        assert!(damaged.next().is_none(), "nothing after damage");
    }

    /// Stacks as kstack sees them: 32 return addresses in a few kernel
    /// images (an xorshift's offsets below 8 MiB into each), and around
    /// them what tells real stacks apart: every frame moved by a few
    /// instructions (a sampled leaf, a different call site), every length
    /// from 1 to 62 (a deeper or shallower call), neighbours swapped, user
    /// frames below.
    fn real_looking_stacks() -> Vec<Vec<u64>> {
        const IMAGES: [u64; 4] = [
            0xFFFF_F803_1A40_0000,
            0xFFFF_F803_1E20_0000,
            0xFFFF_F803_2C10_0000,
            0xFFFF_F803_3B80_0000,
        ];
        let mut state = 0x9E37_79B9_7F4A_7C15_u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut stacks = Vec::new();
        for _ in 0..64 {
            let base: Vec<u64> = (0..62)
                .map(|index| IMAGES[(next() % 4) as usize] + ((next() & 0x7F_FFFF) ^ index))
                .collect();
            for length in 1..=base.len() {
                stacks.push(base[..length].to_vec());
            }
            let stack = &base[..32];
            for index in 0..stack.len() {
                for delta in [1_u64, 2, 4, 8, 16, 0x40, 0x1000] {
                    let mut moved = stack.to_vec();
                    moved[index] = moved[index].wrapping_add(delta);
                    stacks.push(moved);
                }
                if index + 1 < stack.len() {
                    let mut swapped = stack.to_vec();
                    swapped.swap(index, index + 1);
                    stacks.push(swapped);
                }
            }
            for user in 0..30_u64 {
                let mut with_user = stack.to_vec();
                with_user.extend((0..=user).map(|frame| 0x7FF6_1000_0000 + frame * 0x40 + user));
                stacks.push(with_user);
            }
        }
        stacks.sort();
        stacks.dedup();
        stacks
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "arithmetic over thousands of stacks, nothing unsafe: minutes under Miri"
    )]
    fn real_looking_stacks_get_distinct_ids() {
        let stacks = real_looking_stacks();
        assert!(stacks.len() > 20_000, "{} stacks", stacks.len());
        let mut ids: Vec<u64> = stacks.iter().map(|stack| stack_id(stack)).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), stacks.len(), "colliding ids");
        // Nor in their low 32 bits, which a table of fewer entries indexes by.
        let mut low: Vec<u64> = ids.iter().map(|&id| id & 0xFFFF_FFFF).collect();
        low.sort_unstable();
        low.dedup();
        assert!(
            stacks.len() - low.len() <= 1,
            "{} low-half collisions",
            stacks.len() - low.len()
        );
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "arithmetic over thousands of stacks, nothing unsafe: minutes under Miri"
    )]
    fn every_frame_bit_moves_half_the_id_bits() {
        // Flipping one bit of one frame of a 32-frame stack flips each id bit
        // with probability one half: over all 32 x 64 flips, the mean is
        // near 32 bits and no flip moves fewer than 10.
        let stack: Vec<u64> = real_looking_stacks()
            .into_iter()
            .find(|stack| stack.len() == 32)
            .unwrap();
        let id = stack_id(&stack);
        let mut total = 0;
        for index in 0..stack.len() {
            for bit in 0..64 {
                let mut flipped = stack.clone();
                flipped[index] ^= 1 << bit;
                let moved = (stack_id(&flipped) ^ id).count_ones();
                assert!(moved >= 10, "frame {index} bit {bit}: {moved} bits");
                total += moved;
            }
        }
        let mean = f64::from(total) / f64::from(32 * 64);
        assert!((31.0..=33.0).contains(&mean), "mean {mean}");
    }

    #[test]
    fn stack_id_tells_order_length_and_content_apart() {
        let base = stack_id(&[1, 2, 3]);
        assert_eq!(base, stack_id(&[1, 2, 3]));
        assert_ne!(base, stack_id(&[3, 2, 1]));
        assert_ne!(base, stack_id(&[1, 2]));
        assert_ne!(base, stack_id(&[1, 2, 3, 0]));
        assert_ne!(stack_id(&[]), stack_id(&[0]));
        assert_ne!(stack_id(&[]), stack_id(&[1]));
    }

    fn any_facts() -> impl Strategy<Value = SourceFacts> {
        let lifecycle = prop_oneof![Just(Lifecycle::Create), Just(Lifecycle::Exit)];
        prop_oneof![
            (lifecycle.clone(), any::<u32>(), any::<u32>()).prop_map(
                |(event, process_id, parent_process_id)| {
                    SourceFacts::Process {
                        event,
                        process_id,
                        parent_process_id,
                    }
                }
            ),
            (lifecycle, any::<u32>(), any::<u32>()).prop_map(|(event, process_id, thread_id)| {
                SourceFacts::Thread {
                    event,
                    process_id,
                    thread_id,
                }
            }),
            (any::<u64>(), any::<u64>(), any::<u32>()).prop_map(
                |(image_base, image_size, process_id)| {
                    SourceFacts::ImageLoad {
                        image_base,
                        image_size,
                        process_id,
                    }
                }
            ),
            any::<u32>().prop_map(|notify_class| SourceFacts::Registry { notify_class }),
            (any::<bool>(), any::<bool>(), any::<u32>(), any::<u32>()).prop_map(
                |(duplicate, thread, desired_access, target_process_id)| {
                    SourceFacts::ObjectHandle {
                        operation: if duplicate {
                            HandleOperation::Duplicate
                        } else {
                            HandleOperation::Create
                        },
                        object: if thread {
                            ObjectKind::Thread
                        } else {
                            ObjectKind::Process
                        },
                        desired_access,
                        target_process_id,
                    }
                }
            ),
            Just(SourceFacts::Timer),
            any::<u64>().prop_map(|tag| SourceFacts::OnDemand { tag }),
            (
                any::<u32>(),
                any::<u32>(),
                any::<u64>(),
                any::<u32>(),
                any::<bool>()
            )
                .prop_map(|(target_process_id, target_thread_id, tag, delay, late)| {
                    SourceFacts::ThreadStack {
                        target_process_id,
                        target_thread_id,
                        tag,
                        delay,
                        late,
                    }
                }),
        ]
    }

    proptest! {
        /// Each step of the hash is a bijection of what it changes, so a
        /// list that differs in one frame has another id.
        #[test]
        fn one_frame_changed_changes_the_id(
            frames in prop::collection::vec(any::<u64>(), 1..=MAX_FRAMES as usize),
            index: prop::sample::Index,
            other: u64,
        ) {
            let index = index.index(frames.len());
            prop_assume!(other != frames[index]);
            let mut changed = frames.clone();
            changed[index] = other;
            prop_assert_ne!(
                stack_id(&frames),
                stack_id(&changed)
            );
        }

        #[test]
        fn any_record_round_trips(
            facts in any_facts(),
            frames in prop::collection::vec(any::<u64>(), 0..=MAX_FRAMES as usize),
            sequence: u64, timestamp: u64, process_id: u32, thread_id: u32, processor: u16,
            shard in 0..MAX_SHARDS, irql: u8, truncated: bool, wow64: bool, by_id: bool,
            os_hash: u32, user_share in 0.0..=1.0_f64, user_part in 0..UserPart::COUNT,
        ) {
            #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss,
                reason = "a share of at most 62 frames")]
            let user_frame_count = (frames.len() as f64 * user_share) as u8;
            let mut flags = if truncated { RecordFlags::TRUNCATED } else { RecordFlags::NONE };
            if wow64 {
                flags = flags.union(RecordFlags::WOW64);
            }
            if by_id {
                flags = flags.union(RecordFlags::STACK_BY_ID);
            }
            let header = RecordHeader {
                sequence, timestamp, process_id, thread_id, processor, shard, irql, flags,
                user_frame_count, user_part: UserPart::ALL[user_part],
                os_hash, stack_id: stack_id(&frames), facts,
            };
            let mut out = [0_u8; MAX_RECORD_SIZE];
            let size = encode_record(&header, &frames, &mut out).unwrap();
            prop_assert_eq!(size % 8, 0);
            if by_id && frames.is_empty() {
                prop_assert_eq!(size, by_id_record_size(&facts));
            }
            let (view, used) = decode_record(&out[..size]).unwrap();
            prop_assert_eq!(used, size);
            prop_assert_eq!(view.header, header);
            prop_assert_eq!(view.frames().collect::<Vec<_>>(), frames);
        }

        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..700)) {
            for entry in Records::new(&bytes).flatten() {
                match entry {
                    Entry::Trace(record) => prop_assert!(record.frame_count() <= MAX_FRAMES as usize),
                    Entry::Module(record) => prop_assert!(record.path_units().len() <= MAX_MODULE_PATH),
                }
            }
        }
    }
}
