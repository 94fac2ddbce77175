//! Reading a saved capture of any format as a stream of entries, with an
//! account of its health.
//!
//! Format 7 is read block by block (`capture::block`), so memory grows
//! with the stacks and threads the capture holds, not with its size; a
//! damaged block is skipped and counted, and a file cut short is read up to
//! its last whole block. Formats 1 to 6 have no blocks: they are read
//! whole (`capture::legacy`), and any damage refuses them.
//!
//! What the reader counts ([`Health`]) keeps these identities:
//! - every entry the writer wrote is either read or lost: `entries read +
//!   entries lost = the end marker's count` for a finished capture
//!   (`entries lost` counts what damaged bytes and undecodable blocks
//!   held, known from the next intact block's count of entries before it);
//! - a record read whose stack was stored only in lost bytes is read, with
//!   no frames ([`TraceRecord::stack_lost`]), and counted in `stacks lost`;
//! - a repeated sample read after lost bytes whose thread has no capture
//!   read since is counted in `repeats lost` (it may copy a stack that the
//!   lost bytes replaced), and is not read.

use std::{
    collections::VecDeque,
    fmt,
    io::{self, Read},
};

use crate::{
    capture::{
        block::{BLOCK_HEADER_SIZE, Block, BlockKind, BlockReader, Piece},
        entry_walk::{EntryWalk, WalkedEntry},
        format::{
            CaptureError, FIXED_HEADER_SIZE, FORMAT_VERSION, MAGIC, READABLE_ABIS, read_modules,
        },
        legacy::{CaptureView, LAST_LEGACY_FORMAT},
        stack_table::counted,
        trace::TraceRecord,
    },
    naming::{
        identity::ImageIdentity,
        modules::{Module, ModuleMap},
        process_modules::{ModuleChange, ProcessModules},
    },
};

/// Why reading stopped.
#[derive(Debug)]
pub enum ReadError {
    /// The input's I/O error.
    Io(io::Error),
    /// Not a capture this client reads, or (formats 1 to 6) a damaged one.
    Capture(CaptureError),
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io(error) => error.fmt(f),
            Self::Capture(error) => error.fmt(f),
        }
    }
}

impl std::error::Error for ReadError {}

impl From<io::Error> for ReadError {
    fn from(error: io::Error) -> Self {
        Self::Io(error)
    }
}

impl From<CaptureError> for ReadError {
    fn from(error: CaptureError) -> Self {
        Self::Capture(error)
    }
}

/// One entry of a capture, in order.
#[derive(Debug, PartialEq, Eq)]
pub enum Item {
    /// A trace record (a repeated sample included).
    Record(TraceRecord),
    /// A module record (format 7; older formats note theirs in
    /// [`CaptureReader::processes`] when opened).
    Module(ModuleChange),
    /// Identities of images module records loaded (format 7; older formats
    /// note theirs when opened).
    LoadedImages(Vec<(Module, ImageIdentity)>),
}

/// Damaged bytes found, at most this many kept by offset (all counted).
const DAMAGE_KEPT: usize = 16;

/// What reading a capture found besides its entries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Health {
    /// The capture's format.
    pub format: u32,
    /// Intact blocks read (format 7).
    pub blocks: u64,
    /// Entries read: records, module records and sample entries.
    pub entries: u64,
    /// The first runs of damaged bytes skipped, as (offset, length).
    pub damaged: Vec<(u64, u64)>,
    /// Runs of damaged bytes skipped.
    pub damaged_runs: u64,
    /// Bytes in them.
    pub damaged_bytes: u64,
    /// Intact blocks whose entries did not decode (a writer's fault, never
    /// seen from kstack's), with the first one's error: the rest of each
    /// was skipped.
    pub undecodable: u64,
    /// The first undecodable entry's error.
    pub first_undecodable: Option<CaptureError>,
    /// Entries the writer wrote that were not read (damaged or
    /// undecodable), as the counts in the blocks after them tell.
    pub entries_lost: u64,
    /// Records read whose stack was stored only in lost bytes.
    pub stacks_lost: u64,
    /// Repeated samples not read: their thread's last capture may have
    /// been lost.
    pub repeats_lost: u64,
    /// Whether the kernel's module list was lost (frames are then named
    /// after no module).
    pub start_lost: bool,
    /// The end marker's count of entries, when it was read: the capture was
    /// finished.
    pub end_count: Option<u64>,
    /// Bytes at the end holding no whole block: the capture was cut short
    /// (or its end damaged), as (offset, length).
    pub tail: Option<(u64, u64)>,
    /// Intact blocks out of place: a module list after the entries began,
    /// or a count of entries before it that goes back (a block repeated,
    /// or another capture's); their contents were not read.
    pub out_of_place: u64,
    /// Bytes after the end marker (another capture appended, or junk):
    /// not read.
    pub after_end: u64,
    /// The shard and sequence number of the last trace record read (not a
    /// repeated sample, which keeps its copied record's).
    pub last_record: Option<(u16, u64)>,
}

impl Health {
    /// Whether the capture was read whole: finished, nothing damaged.
    #[must_use]
    pub fn is_whole(&self) -> bool {
        self.end_count == Some(self.entries.saturating_add(self.entries_lost))
            && self.tail.is_none()
            && self.damaged_runs == 0
            && self.undecodable == 0
            && self.entries_lost == 0
            && self.out_of_place == 0
            && self.after_end == 0
            && !self.start_lost
    }

    fn note_damage(&mut self, offset: u64, length: u64) {
        self.damaged_runs += 1;
        self.damaged_bytes += length;
        if self.damaged.len() < DAMAGE_KEPT {
            self.damaged.push((offset, length));
        }
    }

    /// Entries read or known lost so far.
    const fn accounted(&self) -> u64 {
        self.entries.saturating_add(self.entries_lost)
    }

    /// The entries before a block (or the end) that were not read.
    fn note_entries_before(&mut self, entries_before: u64) {
        self.entries_lost = self
            .entries_lost
            .saturating_add(entries_before.saturating_sub(self.accounted()));
    }
}

/// The problems, in words, each a sentence; empty for a whole capture.
impl fmt::Display for Health {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let after_last = || {
            self.last_record.map_or_else(
                || "before its first record".to_owned(),
                |(shard, sequence)| format!("after shard {shard}'s record sequence {sequence}"),
            )
        };
        let mut sentences = Vec::new();
        if self.start_lost {
            sentences.push(
                "its kernel module list was lost (damaged or cut): kernel frames are not named"
                    .to_owned(),
            );
        }
        if self.damaged_runs > 0 {
            let places: Vec<String> = self
                .damaged
                .iter()
                .map(|(offset, length)| format!("{length} at byte {offset}"))
                .collect();
            let more = if self.damaged_runs > self.damaged.len() as u64 {
                ", ..."
            } else {
                ""
            };
            sentences.push(format!(
                "{} damaged bytes skipped ({}{more})",
                self.damaged_bytes,
                places.join(", ")
            ));
        }
        if let Some(error) = &self.first_undecodable {
            sentences.push(format!(
                "{} skipped from an entry that does not decode: {error}",
                counted(self.undecodable, "block")
            ));
        }
        if self.entries_lost > 0 {
            sentences.push(format!(
                "{} lost with them (records, module records or sample facts)",
                counted(self.entries_lost, "entry")
            ));
        }
        if self.stacks_lost > 0 {
            sentences.push(format!(
                "{} read {} a stack stored only in the lost bytes: shown as [stack lost]",
                counted(self.stacks_lost, "record"),
                if self.stacks_lost == 1 {
                    "names"
                } else {
                    "name"
                }
            ));
        }
        if self.out_of_place > 0 {
            sentences.push(format!(
                "{} out of place (a module list after the entries began, or a count of entries \
                 that goes back: a block repeated, or another capture's) not read",
                counted(self.out_of_place, "intact block")
            ));
        }
        if self.repeats_lost > 0 {
            sentences.push(format!(
                "{} left out: their thread's last capture may have been lost",
                counted(self.repeats_lost, "repeated sample")
            ));
        }
        if let Some((offset, length)) = self.tail {
            sentences.push(format!(
                "it was cut short (no whole end marker; or its end is damaged): read up to its \
                 last whole block, {}; the last {} (from byte {offset}) hold no whole block",
                after_last(),
                counted(length, "byte")
            ));
        } else if self.end_count.is_none() && self.format > LAST_LEGACY_FORMAT {
            sentences.push(format!("it was cut short (no end marker) {}", after_last()));
        }
        if let Some(count) = self.end_count
            && count != self.accounted()
            && self.format > LAST_LEGACY_FORMAT
        {
            sentences.push(format!(
                "its end marker counts {} but {} were read or found lost",
                counted(count, "entry"),
                self.accounted()
            ));
        }
        if self.after_end > 0 {
            sentences.push(format!(
                "{} after its end marker (another capture appended, or other data) were not read",
                counted(self.after_end, "byte")
            ));
        }
        f.write_str(&sentences.join("; "))
    }
}

/// A capture being read: its module lists, then its entries in order.
pub struct CaptureReader<R> {
    /// The kernel's module list saved with it.
    pub modules: ModuleMap,
    /// The user-mode modules of each process listed at its start (and,
    /// formats 1 to 6, every module record and loaded image's identity).
    pub processes: ProcessModules,
    blocks: Option<BlockReader<R>>,
    /// Entries not yet read: a format 7 entries block, or a whole older
    /// capture.
    payload: Vec<u8>,
    at: usize,
    end: usize,
    /// The file offset of `payload[0]`.
    payload_offset: u64,
    /// Formats 1 to 6: the trailer's count, checked at the end.
    declared: Option<u64>,
    queued: VecDeque<Item>,
    walk: EntryWalk,
    health: Health,
    /// Whether the first entries, loaded images or end block was read:
    /// module lists after it are out of place.
    entries_began: bool,
    /// Whether the end marker was read: anything after it is not read.
    ended: bool,
    done: bool,
}

impl<R: Read> CaptureReader<R> {
    /// Opens a capture: reads its header and module lists.
    ///
    /// # Errors
    /// A [`ReadError`] for what is not a capture this client reads, for a
    /// damaged header, and for any damage in a capture of formats 1 to 6.
    pub fn open(mut input: R) -> Result<Self, ReadError> {
        let mut header = [0_u8; FIXED_HEADER_SIZE];
        let read = read_up_to(&mut input, &mut header)?;
        if read < 8 || header[..8] != MAGIC {
            return Err(CaptureError::NotACapture.into());
        }
        let word =
            |at: usize| u32::from_le_bytes(header[at..at + 4].try_into().unwrap_or_default());
        let format = word(8);
        // Formats before 7 kept a non-zero ABI version at 12.
        if format <= LAST_LEGACY_FORMAT && word(12) != 0 {
            let mut bytes = header[..read].to_vec();
            input.read_to_end(&mut bytes)?;
            return Self::legacy(bytes);
        }
        if read < FIXED_HEADER_SIZE {
            return Err(CaptureError::Truncated.into());
        }
        if word(20) != crc32c::crc32c(&header[..20]) {
            return Err(CaptureError::HeaderDamaged.into());
        }
        if format != FORMAT_VERSION {
            return Err(CaptureError::FormatVersion(format).into());
        }
        let abi = word(16);
        if !READABLE_ABIS.contains(&abi) {
            return Err(CaptureError::AbiVersion(abi).into());
        }
        let mut reader = Self {
            modules: ModuleMap::default(),
            processes: ProcessModules::default(),
            blocks: Some(BlockReader::new(input, FIXED_HEADER_SIZE as u64)),
            payload: Vec::new(),
            at: 0,
            end: 0,
            payload_offset: 0,
            declared: None,
            queued: VecDeque::new(),
            walk: EntryWalk::new(format),
            health: Health {
                format,
                start_lost: true,
                ..Health::default()
            },
            entries_began: false,
            ended: false,
            done: false,
        };
        // The module lists come first: read up to the first block of
        // anything else.
        while reader.at == reader.end && reader.queued.is_empty() && !reader.done {
            reader.take_piece()?;
        }
        Ok(reader)
    }

    fn legacy(bytes: Vec<u8>) -> Result<Self, ReadError> {
        let view = CaptureView::parse(&bytes)?;
        let (modules, processes) = (view.modules.clone(), view.processes.clone());
        let (declared, records, format) = (view.record_count, view.records_range(), view.format());
        Ok(Self {
            modules,
            processes,
            blocks: None,
            payload: bytes,
            at: records.start,
            end: records.end,
            payload_offset: 0,
            declared: Some(declared),
            queued: VecDeque::new(),
            walk: EntryWalk::new(format),
            health: Health {
                format,
                end_count: Some(declared),
                ..Health::default()
            },
            entries_began: true,
            ended: true,
            done: true,
        })
    }

    /// What reading found so far; after the last entry, all of it.
    #[must_use]
    pub const fn health(&self) -> &Health {
        &self.health
    }

    /// The next entry; `None` after the last.
    ///
    /// # Errors
    /// The input's I/O error; (formats 1 to 6) any damage.
    pub fn next_item(&mut self) -> Option<Result<Item, ReadError>> {
        loop {
            if let Some(item) = self.queued.pop_front() {
                return Some(Ok(item));
            }
            if self.at < self.end {
                match self.next_entry() {
                    Ok(Some(item)) => return Some(Ok(item)),
                    Ok(None) => continue,
                    Err(error) => return Some(Err(error)),
                }
            }
            if self.done {
                return self.check_legacy_count().map(Err);
            }
            if let Err(error) = self.take_piece() {
                self.done = true;
                return Some(Err(error));
            }
        }
    }

    /// The entry at `at`, `None` for one that is not read.
    fn next_entry(&mut self) -> Result<Option<Item>, ReadError> {
        let offset = usize::try_from(self.payload_offset).unwrap_or(usize::MAX) + self.at;
        match self
            .walk
            .next_entry(&self.payload[self.at..self.end], offset)
        {
            Ok((entry, size)) => {
                self.at += size;
                self.health.entries = self.walk.entries;
                Ok(match entry {
                    WalkedEntry::Record(record) => {
                        self.health.stacks_lost += u64::from(record.stack_lost());
                        if !record.sample.is_some_and(|facts| facts.repeated) {
                            self.health.last_record =
                                Some((record.header.shard, record.header.sequence));
                        }
                        Some(Item::Record(record))
                    }
                    WalkedEntry::Module(change) if self.blocks.is_some() => {
                        Some(Item::Module(change))
                    }
                    // Noted when a capture of formats 1 to 6 is opened.
                    WalkedEntry::Module(_) => None,
                    WalkedEntry::RepeatLost => {
                        self.health.repeats_lost += 1;
                        None
                    }
                })
            }
            Err(error) if self.blocks.is_none() => {
                self.at = self.end;
                Err(error.into())
            }
            Err(error) => {
                // The rest of the block is skipped; the next block's count
                // says how many entries it held.
                self.health.undecodable += 1;
                self.health.first_undecodable.get_or_insert(error);
                self.at = self.end;
                self.walk.forget_threads();
                Ok(None)
            }
        }
    }

    /// The next trace record, module records and loaded images'
    /// identities before it noted in [`CaptureReader::processes`]; `None`
    /// after the last.
    ///
    /// # Errors
    /// See [`CaptureReader::next_item`].
    pub fn next_record(&mut self) -> Option<Result<TraceRecord, ReadError>> {
        loop {
            match self.next_item()? {
                Ok(Item::Record(record)) => return Some(Ok(record)),
                Ok(Item::Module(change)) => self.processes.note(change),
                Ok(Item::LoadedImages(images)) => {
                    for (module, identity) in images {
                        self.processes.set_loaded_identity(&module, identity);
                    }
                }
                Err(error) => return Some(Err(error)),
            }
        }
    }

    fn check_legacy_count(&mut self) -> Option<ReadError> {
        let declared = self.declared.take()?;
        let found = self.walk.entries;
        (declared != found).then_some(CaptureError::RecordCount { declared, found }.into())
    }

    /// Reads the next block, damaged run or tail (format 7).
    fn take_piece(&mut self) -> Result<(), ReadError> {
        let Some(blocks) = self.blocks.as_mut() else {
            self.done = true;
            return Ok(());
        };
        let Some(piece) = blocks.next_piece()? else {
            self.done = true;
            return Ok(());
        };
        let health = &mut self.health;
        if self.ended {
            // Nothing follows the end marker in a capture written by one
            // writer: what does is said, and not read.
            health.after_end = health.after_end.saturating_add(match piece {
                Piece::Block(block) => (BLOCK_HEADER_SIZE + block.payload.len()) as u64,
                Piece::Damaged { length, .. } | Piece::Tail { length, .. } => length,
            });
            return Ok(());
        }
        match piece {
            Piece::Block(block) => {
                health.blocks += 1;
                let kind = block.kind;
                let in_place = match kind {
                    BlockKind::Start => !self.entries_began && health.start_lost,
                    BlockKind::Process => !self.entries_began,
                    BlockKind::Entries | BlockKind::LoadedImages | BlockKind::End => {
                        self.entries_began = true;
                        block.entries_before >= health.accounted()
                    }
                };
                if !in_place {
                    health.out_of_place += 1;
                    self.walk.forget_threads();
                    return Ok(());
                }
                if let Err(error) = take_block(
                    &block,
                    &mut self.modules,
                    &mut self.processes,
                    &mut self.queued,
                    health,
                ) {
                    health.undecodable += 1;
                    health.first_undecodable.get_or_insert(error);
                }
                match kind {
                    BlockKind::Entries => {
                        self.payload.clear();
                        self.payload.extend_from_slice(block.payload);
                        self.payload_offset = block.offset + BLOCK_HEADER_SIZE as u64;
                        self.at = 0;
                        self.end = self.payload.len();
                    }
                    BlockKind::End => self.ended = true,
                    _ => {}
                }
            }
            Piece::Damaged { offset, length } => {
                health.note_damage(offset, length);
                self.walk.forget_threads();
            }
            Piece::Tail { offset, length } => {
                health.tail = Some((offset, length));
                self.done = true;
            }
        }
        Ok(())
    }
}

/// What an intact block of format 7 says, taken into the reader's state
/// (an entries block's payload is taken by the caller).
fn take_block(
    block: &Block<'_>,
    modules: &mut ModuleMap,
    processes: &mut ProcessModules,
    queued: &mut VecDeque<Item>,
    health: &mut Health,
) -> Result<(), CaptureError> {
    let payload = block.payload;
    let u32_at = |at: usize| {
        payload
            .get(at..at + 4)
            .map(|word| u32::from_le_bytes(word.try_into().unwrap_or_default()))
            .ok_or(CaptureError::Truncated)
    };
    // Every module entry of format 7 may carry an identity; errors name
    // modules from 0 within each block.
    let mut named = 0;
    match block.kind {
        BlockKind::Start => {
            let count = u32_at(0)?;
            let listed_at = payload
                .get(4..12)
                .map(|word| u64::from_le_bytes(word.try_into().unwrap_or_default()))
                .ok_or(CaptureError::Truncated)?;
            let mut at = 12;
            let entries = read_modules(payload, FORMAT_VERSION, &mut at, count, &mut named)?;
            *modules = ModuleMap::new(entries.iter().map(|(module, _)| module.clone()));
            for (module, identity) in entries {
                if let Some(identity) = identity {
                    modules.set_identity(module.base, identity);
                }
            }
            processes.set_listed_at(listed_at);
            health.start_lost = false;
        }
        BlockKind::Process => {
            let process_id = u32_at(0)?;
            let count = u32_at(4)?;
            let mut at = 8;
            let entries = read_modules(payload, FORMAT_VERSION, &mut at, count, &mut named)?;
            processes.add(process_id, entries.iter().map(|(module, _)| module.clone()));
            for (module, identity) in entries {
                if let Some(identity) = identity {
                    processes.set_identity(process_id, module.base, identity);
                }
            }
        }
        BlockKind::LoadedImages => {
            health.note_entries_before(block.entries_before);
            let count = u32_at(0)?;
            let mut at = 4;
            let images = read_modules(payload, FORMAT_VERSION, &mut at, count, &mut named)?
                .into_iter()
                .filter_map(|(module, identity)| Some((module, identity?)))
                .collect();
            queued.push_back(Item::LoadedImages(images));
        }
        BlockKind::Entries => health.note_entries_before(block.entries_before),
        BlockKind::End => {
            let count = payload
                .get(..8)
                .map(|word| u64::from_le_bytes(word.try_into().unwrap_or_default()))
                .ok_or(CaptureError::Truncated)?;
            health.note_entries_before(count);
            health.end_count = Some(count);
        }
    }
    Ok(())
}

/// A capture read whole: what small captures and tests want at once.
#[derive(Debug)]
pub struct WholeCapture {
    /// The kernel's module list.
    pub modules: ModuleMap,
    /// Each process's modules, with every module record and loaded image's
    /// identity noted.
    pub processes: ProcessModules,
    /// Every trace record, in order.
    pub records: Vec<TraceRecord>,
    /// What reading found.
    pub health: Health,
}

/// Reads every entry of a capture into memory (for a large capture,
/// iterate [`CaptureReader::next_item`] instead).
///
/// # Errors
/// See [`CaptureReader::open`] and [`CaptureReader::next_item`].
pub fn read_whole(input: impl Read) -> Result<WholeCapture, ReadError> {
    let mut reader = CaptureReader::open(input)?;
    let mut records = Vec::new();
    while let Some(record) = reader.next_record() {
        records.push(record?);
    }
    Ok(WholeCapture {
        modules: reader.modules,
        processes: reader.processes,
        records,
        health: reader.health,
    })
}

/// Reads until `buffer` is full or the input ends; returns the bytes read.
fn read_up_to(input: &mut impl Read, buffer: &mut [u8]) -> io::Result<usize> {
    let mut read = 0;
    while read < buffer.len() {
        match input.read(&mut buffer[read..]) {
            Ok(0) => break,
            Ok(count) => read += count,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(read)
}

#[cfg(test)]
pub(crate) mod tests {
    use kstack_abi::{ABI_VERSION, RecordFlags, SourceFacts};
    use proptest::arbitrary::Arbitrary as _;

    use super::*;
    use crate::{
        capture::{
            block::{BLOCK_MAGIC, encode_block},
            writer::{
                BLOCK_TARGET, CaptureWriter,
                tests::{
                    app_loading_capture, record, sample_records, sampled_records, saved,
                    thread_stack,
                },
            },
        },
        naming::{identity::DebugIdentity, modules::tests::sample_map},
    };

    /// Reads every entry of `bytes`; a refusal is its [`CaptureError`].
    pub fn read_back(bytes: &[u8]) -> Result<WholeCapture, CaptureError> {
        read_whole(bytes).map_err(|error| match error {
            ReadError::Capture(error) => error,
            ReadError::Io(error) => panic!("{error}"),
        })
    }

    /// A capture of three batches (samples with repeats, then timer
    /// records), and the records written.
    fn batches() -> (Vec<u8>, Vec<TraceRecord>) {
        let sampled = sampled_records();
        let batches = [&sampled[..3], &sampled[3..], &sample_records()[..]];
        let mut writer = CaptureWriter::new(Vec::new(), &sample_map()).unwrap();
        for batch in batches {
            for record in batch {
                writer.append(record).unwrap();
            }
            writer.end_batch().unwrap();
        }
        (writer.finish().unwrap().out, batches.concat())
    }

    /// Whether `read` is `written`, or `written` with its stack lost.
    fn is_read_as(read: &TraceRecord, written: &TraceRecord) -> bool {
        if read == written {
            return true;
        }
        let mut header = read.header;
        header.flags = header.flags.without(RecordFlags::STACK_BY_ID);
        read.stack_lost() && header == written.header && read.sample == written.sample
    }

    /// Checks that `read` is `written` in order less some records, each
    /// whole or with its stack lost, and that the counts add up.
    fn check_prefix_or_subsequence(read: &WholeCapture, written: &[TraceRecord], context: &str) {
        let mut rest = written.iter();
        for record in &read.records {
            assert!(
                rest.any(|written| is_read_as(record, written)),
                "{context}: {record:?} read, not written there"
            );
        }
        let health = &read.health;
        assert_eq!(
            health.stacks_lost,
            read.records.iter().filter(|r| r.stack_lost()).count() as u64,
            "{context}"
        );
        if let Some(count) = health.end_count {
            assert_eq!(
                health.entries + health.entries_lost,
                count,
                "{context}: {health:?}"
            );
        }
    }

    #[test]
    fn a_cut_capture_reads_up_to_its_last_whole_block_and_says_where() {
        let (bytes, written) = batches();
        let whole = read_back(&bytes).unwrap();
        assert_eq!(whole.records, written);
        assert!(whole.health.is_whole());
        assert_eq!(whole.health.to_string(), "");
        let mut shown_at_each_cut = Vec::new();
        for cut in 0..bytes.len() {
            let Ok(read) = read_back(&bytes[..cut]) else {
                assert!(cut < FIXED_HEADER_SIZE, "cut at {cut} refused");
                continue;
            };
            check_prefix_or_subsequence(&read, &written, &format!("cut at {cut}"));
            assert_eq!(read.records, written[..read.records.len()], "a prefix");
            assert!(!read.health.is_whole(), "cut at {cut}");
            assert_eq!(read.health.damaged_runs, 0);
            assert!(
                read.health.to_string().contains("cut short"),
                "{}",
                read.health
            );
            shown_at_each_cut.push(read.records.len());
        }
        // Batches of 3, 4 and 3 records: each whole batch read once cut
        // after it.
        shown_at_each_cut.dedup();
        assert_eq!(shown_at_each_cut, [0, 3, 7, 10]);
        let cut = read_back(&bytes[..bytes.len() - 1]).unwrap();
        assert_eq!(cut.records, written, "only the end marker lost");
        assert!(
            cut.health
                .to_string()
                .contains("after shard 0's record sequence 3"),
            "{}",
            cut.health
        );
    }

    #[test]
    fn every_flipped_bit_is_found_and_costs_only_its_block() {
        let (bytes, written) = batches();
        for at in FIXED_HEADER_SIZE..bytes.len() {
            for bit in 0..8 {
                let mut damaged = bytes.clone();
                damaged[at] ^= 1 << bit;
                let context = format!("byte {at} bit {bit}");
                let read = read_back(&damaged).expect(&context);
                check_prefix_or_subsequence(&read, &written, &context);
                assert!(!read.health.is_whole(), "{context}: not found");
                assert!(!read.health.to_string().is_empty());
            }
        }
    }

    /// Where the first block after the start block begins (in these
    /// captures, the first entries block).
    fn first_entries_block(bytes: &[u8]) -> usize {
        bytes
            .windows(4)
            .enumerate()
            .filter(|(_, window)| *window == BLOCK_MAGIC)
            .map(|(at, _)| at)
            .nth(1)
            .unwrap()
    }

    /// A repeated sample of `captured` (a thread-stack record), without a
    /// thread state.
    fn repeat_of(captured: &TraceRecord) -> TraceRecord {
        TraceRecord {
            sample: Some(crate::capture::trace::SampleFacts {
                state: None,
                wait_reason: crate::thread_list::WaitReason(6),
                cpu_time: 0,
                repeated: true,
            }),
            ..captured.clone()
        }
    }

    /// The records of `sampled_records` and `sample_records` written in
    /// batches of the sizes `split` gives in turn, and the records.
    fn batched(split: &[usize]) -> (Vec<u8>, Vec<TraceRecord>) {
        let written: Vec<TraceRecord> = sampled_records()
            .into_iter()
            .chain(sample_records())
            .collect();
        let mut writer = CaptureWriter::new(Vec::new(), &sample_map()).unwrap();
        let mut sizes = split.iter().cycle();
        let mut rest = &written[..];
        while !rest.is_empty() {
            let size = (*sizes.next().unwrap()).min(rest.len());
            for record in &rest[..size] {
                writer.append(record).unwrap();
            }
            writer.end_batch().unwrap();
            rest = &rest[size..];
        }
        (writer.finish().unwrap().out, written)
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config::with_cases(2048))]

        /// Any bytes overwritten anywhere, and any cut: never a panic,
        /// never a record that was not written (each read whole, or with
        /// its stack lost), always said; only a damaged fixed header is
        /// refused.
        #[test]
        fn damage_anywhere_is_found_and_never_read_as_other_data(
            split in proptest::collection::vec(1_usize..5, 1..4),
            overwrites in proptest::collection::vec(
                (proptest::sample::Index::arbitrary(), proptest::num::u8::ANY),
                0..6,
            ),
            cut in proptest::option::of(proptest::sample::Index::arbitrary()),
        ) {
            let (bytes, written) = batched(&split);
            let mut damaged = bytes.clone();
            for (at, value) in &overwrites {
                let at = at.index(damaged.len());
                damaged[at] = *value;
            }
            if let Some(cut) = cut {
                let length = cut.index(damaged.len() + 1);
                damaged.truncate(length);
            }
            let header_touched = damaged.len() < FIXED_HEADER_SIZE
                || damaged[..FIXED_HEADER_SIZE] != bytes[..FIXED_HEADER_SIZE];
            match read_back(&damaged) {
                Err(error) => proptest::prop_assert!(header_touched, "refused: {error}"),
                Ok(read) => {
                    check_prefix_or_subsequence(&read, &written, "random damage");
                    if damaged == bytes {
                        proptest::prop_assert!(read.health.is_whole());
                        proptest::prop_assert_eq!(&read.records, &written);
                    } else {
                        proptest::prop_assert!(!read.health.is_whole(), "not found");
                        proptest::prop_assert!(!read.health.to_string().is_empty());
                    }
                }
            }
        }
    }

    #[test]
    fn a_stack_stored_in_a_lost_block_is_shown_lost_and_repeats_after_it_are_left_out() {
        let frames = [0xFFFF_F801_2340_0010, 0x7FF6_0000_1000];
        let captured = thread_stack(1, 20, &frames);
        let mut writer = CaptureWriter::new(Vec::new(), &sample_map()).unwrap();
        writer.append(&captured).unwrap();
        writer.end_batch().unwrap();
        let second_block = writer.written().len();
        let again = thread_stack(2, 20, &frames);
        let repeat = repeat_of(&again);
        writer.append(&again).unwrap();
        writer.end_batch().unwrap();
        let third_block = writer.written().len();
        writer.append(&repeat).unwrap();
        writer
            .append(&record(3, SourceFacts::Timer, &[0x42]))
            .unwrap();
        let bytes = writer.finish().unwrap().out;
        let damaged_at = |at: usize| {
            let mut damaged = bytes.clone();
            damaged[at + BLOCK_HEADER_SIZE + 5] ^= 0x10;
            read_back(&damaged).unwrap()
        };
        // The first entries block, which stored the stack, is damaged: the
        // second capture reads as lost, and so does its repeat (a copy of
        // it, never of an older capture).
        let first_entries = first_entries_block(&bytes);
        let read = damaged_at(first_entries);
        let shown: Vec<(u64, bool, bool)> = read
            .records
            .iter()
            .map(|r| (r.header.sequence, r.stack_lost(), r.sample.is_some()))
            .collect();
        assert_eq!(
            shown,
            [(2, true, false), (2, true, true), (3, false, false)]
        );
        let health = &read.health;
        assert_eq!(
            (health.stacks_lost, health.repeats_lost, health.entries_lost),
            (2, 0, 1)
        );
        assert_eq!(
            health.damaged,
            [(first_entries as u64, (second_block - first_entries) as u64)]
        );
        let text = health.to_string();
        for words in [
            "damaged bytes skipped",
            "1 entry lost",
            "2 records read name a stack stored only in the lost bytes",
        ] {
            assert!(text.contains(words), "{words}: {text}");
        }
        // The second entries block, the thread's last capture, is damaged:
        // its repeat is left out, and counted, not read as the first.
        let read = damaged_at(second_block);
        let shown: Vec<u64> = read.records.iter().map(|r| r.header.sequence).collect();
        assert_eq!(shown, [1, 3]);
        assert_eq!((read.health.stacks_lost, read.health.repeats_lost), (0, 1));
        assert!(
            read.health
                .to_string()
                .contains("1 repeated sample left out"),
            "{}",
            read.health
        );
        assert!(third_block > second_block);
    }

    #[test]
    fn a_batch_of_many_blocks_keeps_each_record_with_its_sample_entry() {
        // One batch of 20,000 samples fills several blocks; a record's
        // sample entry never starts the next (review 38, finding 1).
        let written: Vec<TraceRecord> = (1..=20_000_u64)
            .map(|sequence| {
                let thread = u32::try_from(sequence % 500).unwrap();
                let record = thread_stack(sequence, thread, &[sequence, sequence + 1]);
                crate::capture::writer::tests::sampled(
                    record,
                    Some(crate::thread_list::ThreadState::RUNNING),
                    1,
                )
            })
            .collect();
        let mut writer = CaptureWriter::new(Vec::new(), &ModuleMap::default()).unwrap();
        for record in &written {
            writer.append(record).unwrap();
        }
        writer.end_batch().unwrap();
        let read = read_back(&writer.finish().unwrap().out).unwrap();
        assert!(read.health.is_whole(), "{}", read.health);
        assert!(read.health.blocks > 4, "several blocks");
        assert_eq!(read.records, written);
    }

    #[test]
    fn a_repeat_never_copies_an_older_stack_of_its_thread() {
        // Thread 20's second capture names a stack another thread's record
        // stored, in the block that is damaged; its repeat reads as lost,
        // never as the first capture's stack (review 38, finding 2).
        let (s1, s2): (&[u64], &[u64]) = (&[0x1111, 0x1112], &[0x2222, 0x2223]);
        let mut writer = CaptureWriter::new(Vec::new(), &ModuleMap::default()).unwrap();
        writer.append(&thread_stack(1, 99, s2)).unwrap();
        writer.end_batch().unwrap();
        writer.append(&thread_stack(2, 20, s1)).unwrap();
        writer.end_batch().unwrap();
        let second = thread_stack(3, 20, s2);
        let repeat = repeat_of(&second);
        writer.append(&second).unwrap();
        writer.append(&repeat).unwrap();
        let mut bytes = writer.finish().unwrap().out;
        let first_entries = first_entries_block(&bytes);
        bytes[first_entries + BLOCK_HEADER_SIZE + 3] ^= 1;
        let read = read_back(&bytes).unwrap();
        for record in &read.records {
            assert!(
                record.stack_lost() || record.frames[..] == *s1 && record.header.sequence == 2,
                "{record:?}"
            );
        }
        assert_eq!(read.records.len(), 3);
        assert_eq!(read.health.stacks_lost, 2);
    }

    #[test]
    fn what_follows_the_end_and_blocks_out_of_place_are_said_not_read() {
        let bytes = saved(&sample_map(), &sample_records());
        // Another capture appended (`save - >> file`, twice).
        let appended = [&bytes[..], &bytes[..]].concat();
        let read = read_back(&appended).unwrap();
        assert_eq!(read.records, sample_records());
        assert_eq!(
            read.health.after_end,
            bytes.len() as u64,
            "the whole second capture"
        );
        assert!(!read.health.is_whole());
        assert!(
            read.health.to_string().contains("after its end marker"),
            "{}",
            read.health
        );
        // An entries block repeated: read once, the copy out of place.
        let mut blocks = BlockReader::new(&bytes[FIXED_HEADER_SIZE..], FIXED_HEADER_SIZE as u64);
        let mut entries = None;
        while let Some(piece) = blocks.next_piece().unwrap() {
            if let Piece::Block(block) = piece
                && block.kind == BlockKind::Entries
            {
                let start = usize::try_from(block.offset).unwrap();
                entries = Some(start..start + BLOCK_HEADER_SIZE + block.payload.len());
            }
        }
        let entries = entries.unwrap();
        let mut repeated = bytes[..entries.end].to_vec();
        repeated.extend_from_slice(&bytes[entries.clone()]);
        repeated.extend_from_slice(&bytes[entries.end..]);
        let read = read_back(&repeated).unwrap();
        assert_eq!(read.records, sample_records(), "each record once");
        assert_eq!(read.health.out_of_place, 1);
        assert!(!read.health.is_whole());
        // A count of entries no writer writes: no overflow, said.
        let mut huge = bytes[..entries.start].to_vec();
        encode_block(BlockKind::Entries, u64::MAX, &[], &mut huge).unwrap();
        encode_block(BlockKind::Entries, u64::MAX, &[], &mut huge).unwrap();
        encode_block(BlockKind::End, 3, &3_u64.to_le_bytes(), &mut huge).unwrap();
        let read = read_back(&huge).unwrap();
        assert!(!read.health.is_whole());
        assert!(read.health.out_of_place >= 1, "{:?}", read.health);
    }

    #[test]
    fn an_entry_that_does_not_decode_costs_the_rest_of_its_block_only() {
        let mut writer = CaptureWriter::new(Vec::new(), &sample_map()).unwrap();
        writer.end_batch().unwrap();
        let mut bytes = writer.written().clone();
        // An intact block holding a record and then bytes of no entry.
        let good = saved_entries(&[record(1, SourceFacts::Timer, &[1])]);
        let mut payload = good.clone();
        payload.extend_from_slice(&[0xEE; 40]);
        encode_block(BlockKind::Entries, 0, &payload, &mut bytes).unwrap();
        let after = saved_entries(&[record(2, SourceFacts::Timer, &[2])]);
        encode_block(BlockKind::Entries, 2, &after, &mut bytes).unwrap();
        encode_block(BlockKind::End, 3, &3_u64.to_le_bytes(), &mut bytes).unwrap();
        let read = read_back(&bytes).unwrap();
        let sequences: Vec<u64> = read.records.iter().map(|r| r.header.sequence).collect();
        assert_eq!(sequences, [1, 2]);
        assert_eq!(read.health.undecodable, 1);
        assert_eq!(read.health.entries_lost, 1);
        assert!(
            read.health.to_string().contains("does not decode"),
            "{}",
            read.health
        );
    }

    /// The entries a writer puts in a block for `records`.
    fn saved_entries(records: &[TraceRecord]) -> Vec<u8> {
        let mut writer = CaptureWriter::new(Vec::new(), &ModuleMap::default()).unwrap();
        for record in records {
            writer.append(record).unwrap();
        }
        let bytes = writer.finish().unwrap().out;
        let mut blocks = BlockReader::new(&bytes[FIXED_HEADER_SIZE..], 0);
        loop {
            if let Some(Piece::Block(block)) = blocks.next_piece().unwrap()
                && block.kind == BlockKind::Entries
            {
                return block.payload.to_vec();
            }
        }
    }

    /// A whole capture's module list and records.
    fn decoded(bytes: &[u8]) -> Result<(ModuleMap, Vec<TraceRecord>), CaptureError> {
        let read = read_back(bytes)?;
        assert!(read.health.is_whole(), "{}", read.health);
        Ok((read.modules, read.records))
    }

    #[test]
    fn samples_round_trip_each_repeat_a_copy_of_its_threads_last_capture() {
        let records = sampled_records();
        let bytes = saved(&sample_map(), &records);
        assert_eq!(decoded(&bytes).unwrap().1, records);
        // Nine entries: 4 trace records, 2 sample entries after their
        // record, 3 repeated samples.
        assert_eq!(read_back(&bytes).unwrap().health.end_count, Some(9));
    }

    #[test]
    fn each_stack_is_stored_once_and_records_get_it_back() {
        let deep: Vec<u64> = (1..=40)
            .map(|frame| 0xFFFF_F800_0000_0000 + frame)
            .collect();
        let records: Vec<TraceRecord> = (1..=100)
            .map(|sequence| {
                let frames = if sequence % 10 == 0 {
                    &[0x42][..]
                } else {
                    &deep[..]
                };
                record(sequence, SourceFacts::Timer, frames)
            })
            .collect();
        let bytes = saved(&ModuleMap::default(), &records);
        assert_eq!(decoded(&bytes), Ok((ModuleMap::default(), records)));
        // Two stacks stored once each: 100 timer records naming their
        // stack (48 bytes: no fact words), the two holding the frames 24
        // bytes more (their three fact words), and the frames, in one
        // entries block after the start block and before the end block.
        let by_id = kstack_abi::by_id_record_size(&SourceFacts::Timer);
        assert_eq!(by_id, 48);
        assert_eq!(
            bytes.len(),
            EMPTY_CAPTURE_SIZE
                + BLOCK_HEADER_SIZE
                + 100 * by_id
                + 2 * (kstack_abi::record_size(0) - by_id)
                + 8 * (40 + 1)
        );
    }

    /// A capture of no module and no record: the fixed header, the start
    /// block (module count and listing time) and the end block (a count).
    const EMPTY_CAPTURE_SIZE: usize =
        FIXED_HEADER_SIZE + BLOCK_HEADER_SIZE + 12 + BLOCK_HEADER_SIZE + 8;

    #[test]
    fn an_empty_capture_is_valid() {
        let bytes = saved(&ModuleMap::default(), &[]);
        assert_eq!(bytes.len(), EMPTY_CAPTURE_SIZE);
        assert_eq!(&bytes[..8], b"KSTKCAP\0");
        assert_eq!(&bytes[FIXED_HEADER_SIZE..][..4], &BLOCK_MAGIC);
        assert_eq!(decoded(&bytes), Ok((ModuleMap::default(), vec![])));
    }

    #[test]
    fn each_batch_is_written_whole_when_it_ends_and_big_ones_sooner() {
        let records: Vec<TraceRecord> = (1..=3)
            .map(|sequence| record(sequence, SourceFacts::Timer, &[sequence]))
            .collect();
        let mut writer = CaptureWriter::new(Vec::new(), &ModuleMap::default()).unwrap();
        let started = writer.written().len();
        writer.append(&records[0]).unwrap();
        assert_eq!(writer.written().len(), started, "held until the batch ends");
        writer.end_batch().unwrap();
        let first_batch = writer.written().len();
        assert!(first_batch > started);
        writer.end_batch().unwrap();
        assert_eq!(writer.written().len(), first_batch, "no empty block");
        writer.append(&records[1]).unwrap();
        writer.append(&records[2]).unwrap();
        writer.end_batch().unwrap();
        // What a killed writer leaves: every ended batch, read as cut.
        let cut = read_back(writer.written()).unwrap();
        assert_eq!(cut.records, records);
        assert_eq!(cut.health.end_count, None);
        assert_eq!(cut.health.tail, None);
        assert!(!cut.health.is_whole());
        // A batch bigger than a block is written in blocks as it comes.
        let mut writer = CaptureWriter::new(Vec::new(), &ModuleMap::default()).unwrap();
        let many = BLOCK_TARGET / kstack_abi::record_size(1) + 1;
        for sequence in 0..many as u64 {
            writer
                .append(&record(sequence, SourceFacts::Timer, &[sequence]))
                .unwrap();
        }
        assert!(
            writer.written().len() >= BLOCK_TARGET,
            "a full block is written"
        );
        let finished = writer.finish().unwrap();
        assert_eq!(finished.syncs, 1, "made durable when finished");
        assert_eq!(read_back(&finished.out).unwrap().records.len(), many);
    }

    #[test]
    fn image_identities_are_saved_with_their_modules_and_read_back() {
        let kstack = ImageIdentity {
            timestamp: 0x6543_2100,
            size_of_image: 0x2_0000,
            debug: Some(DebugIdentity {
                pdb_name: "kstack.pdb".to_owned(),
                guid: *b"0123456789abcdef",
                age: 3,
            }),
        };
        let no_pdb = ImageIdentity {
            timestamp: 7,
            size_of_image: 0x100_0000,
            debug: None,
        };
        let mut modules = sample_map();
        let [ntoskrnl, driver] = modules.modules() else {
            panic!("two modules");
        };
        let (ntoskrnl, driver) = (ntoskrnl.clone(), driver.clone());
        modules.set_identity(ntoskrnl.base, no_pdb.clone());
        modules.set_identity(driver.base, kstack.clone());
        let mut processes = ProcessModules::default();
        let app = Module {
            base: 0x7FF6_0000_0000,
            size: 0x1_0000,
            name: "app.exe".to_owned(),
        };
        processes.add(4312, [app.clone()]);
        processes.set_identity(4312, app.base, no_pdb.clone());
        let out = CaptureWriter::with_processes(Vec::new(), &modules, &processes)
            .unwrap()
            .finish()
            .unwrap()
            .out;
        let read = read_back(&out).unwrap();
        assert!(read.health.is_whole());
        assert_eq!(read.modules.identity(&driver), Some(&kstack));
        assert_eq!(read.modules.identity(&ntoskrnl), Some(&no_pdb));
        let (_, app_map) = read.processes.processes().next().unwrap();
        assert_eq!(app_map.identity(&app), Some(&no_pdb));
    }

    #[test]
    fn loaded_images_identities_are_written_before_their_batch_and_read_back() {
        let (bytes, load, app) = app_loading_capture();
        let module = load.module().unwrap();
        // Noted once, written once, before the entries.
        let mut reader = CaptureReader::open(&bytes[..]).unwrap();
        let Some(Ok(Item::LoadedImages(images))) = reader.next_item() else {
            panic!("the identities first");
        };
        assert_eq!(images, [(module.clone(), app.clone())]);
        assert_eq!(
            reader.next_item().unwrap().unwrap(),
            Item::Module(load.clone())
        );
        let read = read_back(&bytes).unwrap();
        assert_eq!(read.processes.identity(&module), Some(&app));
        assert_eq!(read.processes.changes(), [load]);
        assert_eq!(read.records, sample_records());
        assert!(read.health.is_whole());
    }

    #[test]
    fn a_damaged_fixed_header_or_another_version_is_refused_by_name() {
        let bytes = saved(&sample_map(), &sample_records());
        let refusal = |bytes: &[u8]| read_back(bytes).unwrap_err();
        assert_eq!(refusal(b"{\"schema\":1}"), CaptureError::NotACapture);
        assert_eq!(refusal(&bytes[..10]), CaptureError::Truncated);
        // Any bit of the version, the zero word, the ABI or the checksum.
        for at in 8..FIXED_HEADER_SIZE {
            for bit in 0..8 {
                let mut damaged = bytes.clone();
                damaged[at] ^= 1 << bit;
                assert_eq!(refusal(&damaged), CaptureError::HeaderDamaged, "{at}.{bit}");
            }
        }
        let with_header = |format: u32, abi: u32| {
            let mut other = bytes.clone();
            other[8..12].copy_from_slice(&format.to_le_bytes());
            other[16..20].copy_from_slice(&abi.to_le_bytes());
            let crc = crc32c::crc32c(&other[..20]);
            other[20..24].copy_from_slice(&crc.to_le_bytes());
            other
        };
        let error = refusal(&with_header(8, ABI_VERSION));
        assert_eq!(error, CaptureError::FormatVersion(8));
        assert!(
            error.to_string().contains("reads versions 1 to 7"),
            "{error}"
        );
        assert_eq!(
            refusal(&with_header(7, ABI_VERSION + 1)),
            CaptureError::AbiVersion(ABI_VERSION + 1)
        );
        assert_eq!(
            decoded(&with_header(7, 13)),
            decoded(&bytes),
            "an older ABI's records are read as they are"
        );
    }

    #[test]
    fn a_capture_round_trips_modules_and_records() {
        let bytes = saved(&sample_map(), &sample_records());
        assert_eq!(&bytes[..8], b"KSTKCAP\0");
        assert_eq!(decoded(&bytes), Ok((sample_map(), sample_records())));
    }

    #[test]
    fn a_thread_stack_record_round_trips() {
        let records = [record(
            1,
            SourceFacts::ThreadStack {
                target_process_id: 4,
                target_thread_id: 8,
                tag: 3,
                delay: 12_345,
                late: true,
            },
            &[0xFFFF_F801_2340_0010, 0x7FF6_0000_1000],
        )];
        let bytes = saved(&sample_map(), &records);
        assert_eq!(decoded(&bytes).unwrap().1, records);
    }
}
