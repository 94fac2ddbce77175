//! Saved captures (`kstack save`): the module list at save time, then the
//! records exactly as the ABI encodes them, so offline analysis (`--input`)
//! works on any host, Linux included, and symbolizes like a live session.
//!
//! Layout, little-endian:
//! - 0: magic `KSTKCAP\0`; 8: format version (u32, [`FORMAT_VERSION`]);
//!   12: the ABI version of the records (u32); 16: module count (u32);
//!   20: process count (u32; format 1: reserved, zero); (format 3) 24: when
//!   the processes were listed (u64, the record clock's units; all ones:
//!   not known).
//! - then per module: base (u64), size (u32), name length (u16), flags
//!   (u16; formats 1 to 3: reserved, zero), the name in UTF-8; then
//!   (format 4) when flags bit 0 is set, the image's identity: its
//!   timestamp (u32) and `SizeOfImage` (u32); when bit 1 is also set, its
//!   PDB's: GUID (16 bytes, as the `CodeView` record stores it), age (u32),
//!   PDB name length (u16), the PDB name in UTF-8 (see
//!   `naming::identity`);
//! - then (format 2) per process: its id (u32), its module count (u32),
//!   and its modules as above: the user-mode modules live commands named
//!   user frames after, so offline analysis names them the same;
//! - then records back to back, in kstack-abi's record layout: since ABI 7
//!   each stack is stored once, in the first record that has it (flagged
//!   `STACK_BY_ID`), and later records with the same stack name it by its
//!   id and hold no frames, exactly as the driver sends them to a reader;
//!   since ABI 9 the driver's module records are among them, as received,
//!   so offline analysis names user frames after the same time-ordered
//!   per-process maps as the live client;
//! - among the records (format 6), `kstack sample`'s own entries of a
//!   sample's thread facts (`capture::sample_entry`, byte 2
//!   `FILE_ENTRY_KIND`): one right after each record its requests asked
//!   for, and one alone for a sample that repeats its thread's last
//!   captured stack, which reads as a copy of the last thread-stack
//!   record of that thread before it, with the entry's time and facts;
//! - then (format 5) the identities of the images module records loaded,
//!   read while the capture was saved (the images of drivers and DLLs
//!   loaded during it, which no list at its start holds): a count (u32) and
//!   module entries as above, each with its identity;
//! - then the trailer: magic `KSTKEND\0`, the record count (u64, module
//!   records and (format 6) sample entries included) and (format 5) the
//!   length in bytes of the loaded images' identities (u64, their count
//!   included).
//!
//! The writer appends records as they arrive and the trailer last, so a
//! capture cut short (the machine stopped mid-write) is told apart from a
//! finished one, and a damaged record is named with its offset.

use std::{
    collections::HashMap,
    fmt,
    io::{self, Write},
    sync::Arc,
};

use kstack_abi::{
    ABI_VERSION, DecodeError, Entry, MAX_RECORD_SIZE, RecordFlags, SourceFacts, decode_entry,
    encode_record,
    module_record::{decode_module_record, encode_module_record, is_module_record},
    record_size_field,
};

use crate::{
    capture::{
        sample_entry::{self, SampleEntry, is_file_entry},
        trace::{StackMemory, TraceRecord},
    },
    naming::{
        identity::{DebugIdentity, ImageIdentity},
        modules::{Module, ModuleMap},
        process_modules::{ModuleChange, ProcessModules},
    },
};

/// The first bytes of every capture file.
pub const MAGIC: [u8; 8] = *b"KSTKCAP\0";
/// The version of this layout. Versions 1 (no process modules), 2 (no
/// listing time), 3 (no image identities), 4 (no identities of images
/// loaded during the capture) and 5 (no sample entries) still read.
pub const FORMAT_VERSION: u32 = 6;
/// The layouts this client reads.
const READABLE_FORMATS: core::ops::RangeInclusive<u32> = 1..=FORMAT_VERSION;
/// The ABI versions whose records this client reads: ABI 6 changed the
/// ring's units (bytes, not records) and the status, not the record layout,
/// so captures saved by the ABI 5 client read the same; ABI 7 added the
/// `STACK_BY_ID` flag, which older captures never set; ABI 9 added module
/// records, which older captures never hold; ABI 10 shortened records
/// without frames, whose older 72-byte form reads the same; ABI 11 added a
/// user-part outcome and ABI 12 the thread-stack source, which older
/// captures never hold; ABI 13 computes stack ids another way, and a
/// capture's ids are read as saved (the client groups by them and never
/// recomputes them), so each capture's are consistent in themselves;
/// ABI 14 added a user-part outcome (`critical_region`), which older
/// captures never hold, and changed only the status otherwise.
const READABLE_ABIS: core::ops::RangeInclusive<u32> = 5..=ABI_VERSION;
/// The first bytes of the trailer.
const END_MAGIC: [u8; 8] = *b"KSTKEND\0";
/// The header of format 3; formats 1 and 2 end it at 24.
const HEADER_SIZE: usize = 32;
const OLD_HEADER_SIZE: usize = 24;
const TRAILER_SIZE: usize = 24;
/// The trailer of formats 1 to 4: no loaded images' identities.
const OLD_TRAILER_SIZE: usize = 16;
const MODULE_ENTRY_SIZE: usize = 16;
/// Module entry flags (format 4): the image's identity follows the name.
const HAS_IMAGE_IDENTITY: u16 = 1;
/// ... and its PDB's identity follows that.
const HAS_DEBUG_IDENTITY: u16 = 2;

/// Why bytes are not a capture this client can read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CaptureError {
    /// The magic is missing: some other file.
    NotACapture,
    /// A capture layout from another kstack release.
    FormatVersion(u32),
    /// Records encoded by another ABI version.
    AbiVersion(u32),
    /// The header or module list ends early.
    Truncated,
    /// No trailer: the save was cut short.
    Unfinished,
    /// The trailer's record count is not the number of records.
    RecordCount {
        /// The trailer's count.
        declared: u64,
        /// Records found.
        found: u64,
    },
    /// A module name is not UTF-8.
    ModuleName {
        /// Its index in the list.
        index: usize,
    },
    /// A sample entry is malformed, or does not belong where it is.
    SampleEntry {
        /// Whole records before it.
        index: u64,
        /// Its byte offset in the file.
        offset: usize,
        /// What is wrong, in words.
        problem: &'static str,
    },
    /// A record does not decode.
    Record {
        /// Whole records before it.
        index: u64,
        /// Its byte offset in the file.
        offset: usize,
        /// What was wrong.
        error: DecodeError,
    },
}

impl fmt::Display for CaptureError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotACapture => write!(f, "not a kstack capture (written by `kstack save`)"),
            Self::FormatVersion(version) => write!(
                f,
                "capture format version {version}; this client reads versions {} to {}",
                READABLE_FORMATS.start(),
                READABLE_FORMATS.end()
            ),
            Self::AbiVersion(version) => write!(
                f,
                "the capture's records use ABI version {version}; this client reads ABI {} to {}: \
                 use the client of the release that saved it",
                READABLE_ABIS.start(),
                READABLE_ABIS.end()
            ),
            Self::Truncated => write!(f, "the capture's header or module list is cut short"),
            Self::Unfinished => write!(
                f,
                "the capture was not finished (no end marker): the save was cut short"
            ),
            Self::RecordCount { declared, found } => write!(
                f,
                "the capture's end marker counts {declared} records but it holds {found}"
            ),
            Self::ModuleName { index } => write!(f, "module {index}'s name is not UTF-8"),
            Self::Record {
                index,
                offset,
                error,
            } => write!(
                f,
                "record {index} (byte {offset}) is malformed: {error}; the capture is damaged"
            ),
            Self::SampleEntry {
                index,
                offset,
                problem,
            } => write!(
                f,
                "record {index} (byte {offset}) is {problem}; the capture is damaged"
            ),
        }
    }
}

impl std::error::Error for CaptureError {}

/// Writes a capture: the header and modules at once, records as appended.
pub struct CaptureWriter<W: Write> {
    out: W,
    records: u64,
    modules: u64,
    scratch: [u8; MAX_RECORD_SIZE],
    /// The frames stored so far under each stack id.
    stored: HashMap<u64, Arc<[u64]>>,
    /// The identities of images module records loaded, as noted.
    loaded_images: Vec<(Module, ImageIdentity)>,
    /// The stack id of the last thread-stack record of each thread, which
    /// a repeated sample of it names.
    last_thread_stack: HashMap<u32, u64>,
    /// Repeated samples written (no record of the driver's).
    repeated: u64,
    /// Sample entries written, repeated or after their record.
    samples: u64,
}

impl<W: Write> CaptureWriter<W> {
    /// Starts a capture with its kernel module list and no process.
    ///
    /// # Errors
    /// The writer's I/O error.
    pub fn new(out: W, modules: &ModuleMap) -> io::Result<Self> {
        Self::with_processes(out, modules, &ProcessModules::EMPTY)
    }

    /// Starts a capture with its kernel module list and the user-mode
    /// modules of each process.
    ///
    /// # Errors
    /// The writer's I/O error.
    pub fn with_processes(
        mut out: W,
        modules: &ModuleMap,
        processes: &ProcessModules,
    ) -> io::Result<Self> {
        let count = |count: usize| {
            u32::try_from(count).map_err(|_| io::Error::other("too many modules or processes"))
        };
        let mut header = [0_u8; HEADER_SIZE];
        header[..8].copy_from_slice(&MAGIC);
        header[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        header[12..16].copy_from_slice(&ABI_VERSION.to_le_bytes());
        header[16..20].copy_from_slice(&count(modules.modules().len())?.to_le_bytes());
        header[20..24].copy_from_slice(&count(processes.processes().count())?.to_le_bytes());
        header[24..32].copy_from_slice(&processes.listed_at().to_le_bytes());
        out.write_all(&header)?;
        write_modules(&mut out, modules)?;
        for (process_id, modules) in processes.processes() {
            out.write_all(&process_id.to_le_bytes())?;
            out.write_all(&count(modules.modules().len())?.to_le_bytes())?;
            write_modules(&mut out, modules)?;
        }
        Ok(Self {
            out,
            records: 0,
            modules: 0,
            scratch: [0; MAX_RECORD_SIZE],
            stored: HashMap::new(),
            loaded_images: Vec::new(),
            last_thread_stack: HashMap::new(),
            repeated: 0,
            samples: 0,
        })
    }

    /// Appends one record, and its sample entry when it has sample facts; a
    /// repeated sample is its entry alone.
    ///
    /// # Errors
    /// The writer's I/O error, a record with more frames than the ABI
    /// allows (which no driver reply decodes to), sample facts on a record
    /// that is not a thread stack, or a repeated sample of a stack that is
    /// not its thread's last one written.
    pub fn append(&mut self, record: &TraceRecord) -> io::Result<()> {
        let sampled = match (record.sample, record.header.facts) {
            (None, _) => None,
            (
                Some(facts),
                SourceFacts::ThreadStack {
                    target_thread_id,
                    target_process_id,
                    ..
                },
            ) => Some(SampleEntry {
                thread_id: target_thread_id,
                process_id: target_process_id,
                timestamp: if facts.repeated {
                    record.header.timestamp
                } else {
                    0
                },
                facts,
            }),
            (Some(_), _) => {
                return Err(io::Error::other(
                    "sample facts on a record that is not a thread stack",
                ));
            }
        };
        if let Some(entry) = sampled.filter(|entry| entry.facts.repeated) {
            if self.last_thread_stack.get(&entry.thread_id) != Some(&record.header.stack_id) {
                return Err(io::Error::other(format!(
                    "a repeated sample of thread {} that is not its last stack written",
                    entry.thread_id
                )));
            }
            self.repeated += 1;
            return self.write_sample_entry(&entry);
        }
        if let SourceFacts::ThreadStack {
            target_thread_id, ..
        } = record.header.facts
        {
            self.last_thread_stack
                .insert(target_thread_id, record.header.stack_id);
        }
        let mut header = record.header;
        let mut frames: &[u64] = &record.frames;
        // A stack of no frames stays as it is: a flagged record without
        // frames would name a stored stack.
        if !frames.is_empty() {
            header.flags = header.flags.union(RecordFlags::STACK_BY_ID);
            if self.stored.get(&header.stack_id).map(|stored| &stored[..]) == Some(frames) {
                frames = &[];
            } else {
                self.stored
                    .insert(header.stack_id, Arc::clone(&record.frames));
            }
        }
        let size = encode_record(&header, frames, &mut self.scratch)
            .map_err(|error| io::Error::other(error.to_string()))?;
        self.write(size)?;
        sampled.map_or(Ok(()), |entry| self.write_sample_entry(&entry))
    }

    fn write_sample_entry(&mut self, entry: &SampleEntry) -> io::Result<()> {
        self.out.write_all(&sample_entry::encode(entry))?;
        self.records += 1;
        self.samples += 1;
        Ok(())
    }

    /// Appends one module record.
    ///
    /// # Errors
    /// The writer's I/O error, or a record the ABI does not allow (which no
    /// driver reply decodes to).
    pub fn append_module(&mut self, change: &ModuleChange) -> io::Result<()> {
        let size = encode_module_record(&change.header, &change.path, &mut self.scratch)
            .map_err(|error| io::Error::other(error.to_string()))?;
        self.modules += 1;
        self.write(size)
    }

    /// Writes the record encoded in the scratch buffer.
    fn write(&mut self, size: usize) -> io::Result<()> {
        self.out.write_all(&self.scratch[..size])?;
        self.records += 1;
        Ok(())
    }

    /// Notes the identity of the image a module record loaded, saved with
    /// the capture when it is finished.
    pub fn note_loaded_identity(&mut self, module: Module, identity: ImageIdentity) {
        if !self.knows_loaded_image(&module) {
            self.loaded_images.push((module, identity));
        }
    }

    /// Whether `module`'s identity was noted.
    #[must_use]
    pub fn knows_loaded_image(&self, module: &Module) -> bool {
        self.loaded_images.iter().any(|(noted, _)| noted == module)
    }

    /// Records appended so far, module records included.
    #[must_use]
    pub const fn records(&self) -> u64 {
        self.records
    }

    /// Module records appended so far.
    #[must_use]
    pub const fn module_records(&self) -> u64 {
        self.modules
    }

    /// The driver's trace records appended so far (not module records,
    /// sample entries or repeated samples).
    #[must_use]
    pub const fn trace_records(&self) -> u64 {
        self.records - self.modules - self.samples
    }

    /// Repeated samples appended so far.
    #[must_use]
    pub const fn repeated_samples(&self) -> u64 {
        self.repeated
    }

    /// Writes the trailer, flushes and returns the writer.
    ///
    /// # Errors
    /// The writer's I/O error.
    pub fn finish(mut self) -> io::Result<W> {
        let mut section = Vec::new();
        let count = u32::try_from(self.loaded_images.len())
            .map_err(|_| io::Error::other("too many loaded images"))?;
        section.extend_from_slice(&count.to_le_bytes());
        write_entries(
            &mut section,
            self.loaded_images
                .iter()
                .map(|(module, identity)| (module, Some(identity))),
        )?;
        self.out.write_all(&section)?;
        self.out.write_all(&END_MAGIC)?;
        self.out.write_all(&self.records.to_le_bytes())?;
        self.out.write_all(&(section.len() as u64).to_le_bytes())?;
        self.out.flush()?;
        Ok(self.out)
    }
}

/// Writes each module's entry, name and identity.
fn write_modules(out: &mut impl Write, modules: &ModuleMap) -> io::Result<()> {
    write_entries(
        out,
        modules
            .modules()
            .iter()
            .map(|module| (module, modules.identity(module))),
    )
}

/// Writes each module's entry, name and identity, when it has one.
fn write_entries<'m>(
    out: &mut impl Write,
    entries: impl Iterator<Item = (&'m Module, Option<&'m ImageIdentity>)>,
) -> io::Result<()> {
    let length = |name: &str| {
        u16::try_from(name.len()).map_err(|_| io::Error::other(format!("name too long: {name}")))
    };
    for (module, identity) in entries {
        let flags = match identity {
            Some(ImageIdentity { debug: Some(_), .. }) => HAS_IMAGE_IDENTITY | HAS_DEBUG_IDENTITY,
            Some(_) => HAS_IMAGE_IDENTITY,
            None => 0,
        };
        let mut entry = [0_u8; MODULE_ENTRY_SIZE];
        entry[..8].copy_from_slice(&module.base.to_le_bytes());
        entry[8..12].copy_from_slice(&module.size.to_le_bytes());
        entry[12..14].copy_from_slice(&length(&module.name)?.to_le_bytes());
        entry[14..16].copy_from_slice(&flags.to_le_bytes());
        out.write_all(&entry)?;
        out.write_all(module.name.as_bytes())?;
        let Some(identity) = identity else {
            continue;
        };
        out.write_all(&identity.timestamp.to_le_bytes())?;
        out.write_all(&identity.size_of_image.to_le_bytes())?;
        if let Some(debug) = &identity.debug {
            out.write_all(&debug.guid)?;
            out.write_all(&debug.age.to_le_bytes())?;
            out.write_all(&length(&debug.pdb_name)?.to_le_bytes())?;
            out.write_all(debug.pdb_name.as_bytes())?;
        }
    }
    Ok(())
}

/// A capture read from bytes; its records decode as they are iterated.
#[derive(Debug)]
pub struct CaptureView<'a> {
    /// The module list saved with it.
    pub modules: ModuleMap,
    /// The user-mode modules of each process, saved with it (none in
    /// format 1), with the module records among its records noted.
    pub processes: ProcessModules,
    /// Records, as the trailer counts them.
    pub record_count: u64,
    records_at: usize,
    /// The records' bytes, from `records_at` to the trailer.
    records: &'a [u8],
    /// Whether sample entries may be among them (format 6).
    sample_entries: bool,
}

impl<'a> CaptureView<'a> {
    /// Reads the header and module list.
    ///
    /// # Errors
    /// A [`CaptureError`] for anything but a capture of this format and ABI.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, CaptureError> {
        if bytes.get(..8) != Some(&MAGIC[..]) {
            return Err(CaptureError::NotACapture);
        }
        let u32_at = |at: usize| -> Result<u32, CaptureError> {
            bytes
                .get(at..at + 4)
                .and_then(|word| word.try_into().ok())
                .map(u32::from_le_bytes)
                .ok_or(CaptureError::Truncated)
        };
        let format = u32_at(8)?;
        if !READABLE_FORMATS.contains(&format) {
            return Err(CaptureError::FormatVersion(format));
        }
        let abi = u32_at(12)?;
        if !READABLE_ABIS.contains(&abi) {
            return Err(CaptureError::AbiVersion(abi));
        }
        let count = u32_at(16)?;
        // Format 1 kept this word reserved, zero: no process.
        let process_count = u32_at(20)?;
        let (mut at, listed_at) = if format >= 3 {
            let listed_at = bytes
                .get(OLD_HEADER_SIZE..HEADER_SIZE)
                .and_then(|word| word.try_into().ok())
                .map(u64::from_le_bytes)
                .ok_or(CaptureError::Truncated)?;
            (HEADER_SIZE, listed_at)
        } else {
            (OLD_HEADER_SIZE, u64::MAX)
        };
        let mut read = 0;
        let entries = read_modules(bytes, format, &mut at, count, &mut read)?;
        let mut module_map = ModuleMap::new(entries.iter().map(|(module, _)| module.clone()));
        for (module, identity) in entries {
            if let Some(identity) = identity {
                module_map.set_identity(module.base, identity);
            }
        }
        let mut processes = ProcessModules::default();
        processes.set_listed_at(listed_at);
        for _ in 0..process_count {
            let process_id = u32_at(at)?;
            let count = u32_at(at + 4)?;
            at += 8;
            let entries = read_modules(bytes, format, &mut at, count, &mut read)?;
            processes.add(process_id, entries.iter().map(|(module, _)| module.clone()));
            for (module, identity) in entries {
                if let Some(identity) = identity {
                    processes.set_identity(process_id, module.base, identity);
                }
            }
        }
        let trailer_size = if format >= 5 {
            TRAILER_SIZE
        } else {
            OLD_TRAILER_SIZE
        };
        let trailer_at = bytes
            .len()
            .checked_sub(trailer_size)
            .filter(|&trailer_at| trailer_at >= at && bytes[trailer_at..][..8] == END_MAGIC)
            .ok_or(CaptureError::Unfinished)?;
        let records_end = if format >= 5 {
            read_loaded_images(bytes, at, trailer_at, &mut processes, &mut read)?
        } else {
            trailer_at
        };
        let records = &bytes[at..records_end];
        note_module_records(records, &mut processes);
        Ok(Self {
            modules: module_map,
            processes,
            record_count: u64::from_le_bytes(
                bytes[trailer_at + 8..trailer_at + 16]
                    .try_into()
                    .unwrap_or_default(),
            ),
            records_at: at,
            records,
            sample_entries: format >= 6,
        })
    }

    /// Every trace record in order, with its frames and (format 6) its
    /// sample facts, a repeated sample read as a copy of its thread's last
    /// thread-stack record with the entry's time and facts; a damaged
    /// record or entry (or one naming a stack not stored before it) ends
    /// the walk with its error, and so does a count that disagrees with
    /// the trailer's. Module records are counted and passed over
    /// (`processes` holds them).
    pub fn records(&self) -> impl Iterator<Item = Result<TraceRecord, CaptureError>> + 'a {
        let mut walk = RecordWalk {
            declared: self.record_count,
            offset: self.records_at,
            rest: self.records,
            found: 0,
            done: false,
            stacks: StackMemory::default(),
            sample_entries: self.sample_entries,
            last_thread_stack: HashMap::new(),
        };
        core::iter::from_fn(move || walk.next_record())
    }
}

/// [`CaptureView::records`]'s place in the records.
struct RecordWalk<'a> {
    declared: u64,
    offset: usize,
    rest: &'a [u8],
    found: u64,
    done: bool,
    stacks: StackMemory,
    sample_entries: bool,
    /// The last thread-stack record of each thread, by target thread id:
    /// what a repeated sample of it copies.
    last_thread_stack: HashMap<u32, TraceRecord>,
}

impl RecordWalk<'_> {
    fn next_record(&mut self) -> Option<Result<TraceRecord, CaptureError>> {
        while !self.done {
            if self.rest.is_empty() {
                self.done = true;
                return (self.found != self.declared).then_some(Err(CaptureError::RecordCount {
                    declared: self.declared,
                    found: self.found,
                }));
            }
            match self.next_entry() {
                Ok(Some(record)) => return Some(Ok(record)),
                Ok(None) => {}
                Err(error) => {
                    self.done = true;
                    return Some(Err(error));
                }
            }
        }
        None
    }

    /// The entry at the front: a trace record (with the sample entry that
    /// follows it), a repeated sample, or `None` for a module record.
    fn next_entry(&mut self) -> Result<Option<TraceRecord>, CaptureError> {
        if self.sample_entries && is_file_entry(self.rest) {
            let entry = self.sample_entry()?;
            if !entry.facts.repeated {
                return Err(self.misplaced("a sample entry without its record"));
            }
            let mut record = self
                .last_thread_stack
                .get(&entry.thread_id)
                .cloned()
                .ok_or_else(|| self.misplaced("a repeated sample of a thread never captured"))?;
            record.header.timestamp = entry.timestamp;
            record.sample = Some(entry.facts);
            self.advance(sample_entry::SAMPLE_ENTRY_SIZE);
            return Ok(Some(record));
        }
        let (entry, size) = decode_entry(self.rest).map_err(|error| CaptureError::Record {
            index: self.found,
            offset: self.offset,
            error,
        })?;
        let Entry::Trace(view) = entry else {
            self.advance(size);
            return Ok(None);
        };
        let mut record = self
            .stacks
            .resolve(&view)
            .map_err(|error| CaptureError::Record {
                index: self.found,
                offset: self.offset,
                error,
            })?;
        self.advance(size);
        let target = match record.header.facts {
            SourceFacts::ThreadStack {
                target_thread_id, ..
            } => Some(target_thread_id),
            _ => None,
        };
        if self.sample_entries && is_file_entry(self.rest) {
            let entry = self.sample_entry()?;
            if !entry.facts.repeated {
                if target != Some(entry.thread_id) {
                    return Err(self.misplaced("a sample entry after another thread's record"));
                }
                record.sample = Some(entry.facts);
                self.advance(sample_entry::SAMPLE_ENTRY_SIZE);
            }
        }
        if let Some(thread_id) = target {
            self.last_thread_stack.insert(thread_id, record.clone());
        }
        Ok(Some(record))
    }

    fn sample_entry(&self) -> Result<SampleEntry, CaptureError> {
        sample_entry::decode(self.rest).map_err(|problem| self.misplaced(problem))
    }

    fn misplaced(&self, problem: &'static str) -> CaptureError {
        CaptureError::SampleEntry {
            index: self.found,
            offset: self.offset,
            problem,
        }
    }

    fn advance(&mut self, size: usize) {
        self.offset += size;
        self.rest = &self.rest[size..];
        self.found += 1;
    }
}

/// Reads the loaded images' identities (format 5 on) that end before the
/// trailer at `trailer_at` into `processes`; returns where they start,
/// which is where the records end (the records start at `records_at`).
fn read_loaded_images(
    bytes: &[u8],
    records_at: usize,
    trailer_at: usize,
    processes: &mut ProcessModules,
    read: &mut usize,
) -> Result<usize, CaptureError> {
    let length = u64::from_le_bytes(bytes[trailer_at + 16..].try_into().unwrap_or_default());
    let loaded_at = usize::try_from(length)
        .ok()
        .and_then(|length| trailer_at.checked_sub(length))
        .filter(|&loaded_at| loaded_at >= records_at)
        .ok_or(CaptureError::Truncated)?;
    let count = bytes
        .get(loaded_at..loaded_at + 4)
        .and_then(|word| word.try_into().ok())
        .map(u32::from_le_bytes)
        .ok_or(CaptureError::Truncated)?;
    let mut section_at = loaded_at + 4;
    // Every format with this section has identities (format 4 on).
    for (module, identity) in read_modules(bytes, FORMAT_VERSION, &mut section_at, count, read)? {
        if let Some(identity) = identity {
            processes.set_loaded_identity(&module, identity);
        }
    }
    if section_at != trailer_at {
        return Err(CaptureError::Truncated);
    }
    Ok(loaded_at)
}

/// Notes the module records among `records` (a capture's record bytes) in
/// `processes`, stopping quietly at the first record that does not decode
/// (`CaptureView::records` reports it).
fn note_module_records(records: &[u8], processes: &mut ProcessModules) {
    // Trace records are skipped by their size alone: `records` decodes them.
    let mut rest = records;
    loop {
        let size = record_size_field(rest);
        if size == 0 {
            break;
        }
        if is_module_record(rest) {
            let Ok((record, _)) = decode_module_record(rest) else {
                break;
            };
            processes.note(ModuleChange::from(&record));
        }
        let Some(next) = rest.get(size..) else {
            break;
        };
        rest = next;
    }
}

/// Reads `count` module entries of a capture of `format` at `at`, moving
/// `at` past them: each module, with the identity read with it; `read`
/// counts every module read so far (errors name a module by it).
fn read_modules(
    bytes: &[u8],
    format: u32,
    at: &mut usize,
    count: u32,
    read: &mut usize,
) -> Result<Vec<(Module, Option<ImageIdentity>)>, CaptureError> {
    let mut modules = Vec::new();
    let mut take = |length: usize| -> Result<&[u8], CaptureError> {
        let taken = bytes
            .get(*at..*at + length)
            .ok_or(CaptureError::Truncated)?;
        *at += length;
        Ok(taken)
    };
    let name_of = |bytes: &[u8], index: usize| {
        String::from_utf8(bytes.to_vec()).map_err(|_| CaptureError::ModuleName { index })
    };
    let u32_of = |bytes: &[u8]| u32::from_le_bytes(bytes.try_into().unwrap_or_default());
    for _ in 0..count {
        let entry = take(MODULE_ENTRY_SIZE)?;
        let base = u64::from_le_bytes(entry[..8].try_into().unwrap_or_default());
        let size = u32_of(&entry[8..12]);
        let name_length = usize::from(u16::from_le_bytes([entry[12], entry[13]]));
        // Formats before 4 kept the flags word reserved, zero.
        let flags = if format >= 4 {
            u16::from_le_bytes([entry[14], entry[15]])
        } else {
            0
        };
        let name = name_of(take(name_length)?, *read)?;
        let identity = if flags & HAS_IMAGE_IDENTITY == 0 {
            None
        } else {
            let timestamp = u32_of(take(4)?);
            let size_of_image = u32_of(take(4)?);
            let debug = if flags & HAS_DEBUG_IDENTITY == 0 {
                None
            } else {
                let guid: [u8; 16] = take(16)?.try_into().unwrap_or_default();
                let age = u32_of(take(4)?);
                let pdb_length = take(2)?;
                let pdb_length = usize::from(u16::from_le_bytes([pdb_length[0], pdb_length[1]]));
                let pdb_name = name_of(take(pdb_length)?, *read)?;
                Some(DebugIdentity {
                    pdb_name,
                    guid,
                    age,
                })
            };
            Some(ImageIdentity {
                timestamp,
                size_of_image,
                debug,
            })
        };
        modules.push((Module { base, size, name }, identity));
        *read += 1;
    }
    Ok(modules)
}

#[cfg(test)]
pub(crate) mod tests {
    use kstack_abi::{RecordFlags, RecordHeader, SourceFacts, stack_id};

    use crate::{
        capture::trace::SampleFacts,
        thread_list::{ThreadState, WaitReason},
    };

    use kstack_abi::{ModuleEvent, ModuleFlags, ModuleHeader};

    use super::*;
    use crate::naming::modules::tests::sample_map;

    /// The loaded images' identities of a capture without any: their count.
    const NO_LOADED_IMAGES: usize = 4;

    pub fn record(sequence: u64, facts: SourceFacts, frames: &[u64]) -> TraceRecord {
        TraceRecord {
            header: RecordHeader {
                sequence,
                timestamp: 134_081_280_000_000_000 + sequence * 10_000,
                process_id: 4,
                thread_id: 8,
                processor: 0,
                shard: 0,
                irql: 2,
                flags: RecordFlags::NONE,
                user_frame_count: 0,
                user_part: kstack_abi::UserPart::Off,
                os_hash: 0x1234,
                stack_id: stack_id(frames),
                facts,
            },
            frames: frames.into(),
            sample: None,
        }
    }

    pub fn saved(modules: &ModuleMap, records: &[TraceRecord]) -> Vec<u8> {
        let mut writer = CaptureWriter::new(Vec::new(), modules).unwrap();
        for record in records {
            writer.append(record).unwrap();
        }
        assert_eq!(
            writer.trace_records() + writer.repeated_samples(),
            records.len() as u64
        );
        writer.finish().unwrap()
    }

    fn sample_records() -> Vec<TraceRecord> {
        vec![
            record(
                1,
                SourceFacts::Timer,
                &[0xFFFF_F801_2340_0010, 0xFFFF_F800_0000_0020],
            ),
            record(2, SourceFacts::OnDemand { tag: 9 }, &[0x42]),
            record(3, SourceFacts::Timer, &[]),
        ]
    }

    fn decoded(bytes: &[u8]) -> Result<(ModuleMap, Vec<TraceRecord>), CaptureError> {
        let view = CaptureView::parse(bytes)?;
        let records = view.records().collect::<Result<_, _>>()?;
        Ok((view.modules, records))
    }

    /// A thread-stack record of thread `thread_id` of process 100, asked for
    /// with tag 7.
    pub fn thread_stack(sequence: u64, thread_id: u32, frames: &[u64]) -> TraceRecord {
        let facts = SourceFacts::ThreadStack {
            target_process_id: 100,
            target_thread_id: thread_id,
            tag: 7,
            delay: 3,
            late: false,
        };
        record(sequence, facts, frames)
    }

    /// `record` as a sample whose thread was in `state`, charged
    /// `cpu_time` since its previous sample.
    pub fn sampled(record: TraceRecord, state: Option<ThreadState>, cpu_time: u64) -> TraceRecord {
        TraceRecord {
            sample: Some(SampleFacts {
                state,
                wait_reason: WaitReason(6),
                cpu_time,
                repeated: false,
            }),
            ..record
        }
    }

    /// A sample's records: thread 20's stack captured with facts, a timer
    /// record, thread 20 repeated twice, thread 21 captured without facts
    /// (a Toolhelp listing), thread 20 captured anew and repeated (a copy
    /// of that second capture, not the first).
    fn sampled_records() -> Vec<TraceRecord> {
        let facts = |repeated, cpu_time| SampleFacts {
            state: Some(ThreadState::WAITING),
            wait_reason: WaitReason(6),
            cpu_time,
            repeated,
        };
        let captured = TraceRecord {
            sample: Some(facts(false, 0)),
            ..thread_stack(1, 20, &[0xFFFF_F801_2340_0010, 0x7FF6_0000_1000])
        };
        let recaptured = TraceRecord {
            sample: Some(SampleFacts {
                state: None,
                ..facts(false, 25)
            }),
            ..thread_stack(4, 20, &[0x44])
        };
        let repeat = |timestamp, cpu_time| {
            let mut repeated = captured.clone();
            repeated.header.timestamp = timestamp;
            repeated.sample = Some(facts(true, cpu_time));
            repeated
        };
        vec![
            captured.clone(),
            record(2, SourceFacts::Timer, &[0x42]),
            repeat(134_081_280_000_500_000, 0),
            repeat(134_081_280_000_600_000, 10),
            thread_stack(3, 21, &[0x43]),
            recaptured.clone(),
            TraceRecord {
                header: RecordHeader {
                    timestamp: 134_081_280_000_900_000,
                    ..recaptured.header
                },
                sample: Some(SampleFacts {
                    state: None,
                    ..facts(true, 0)
                }),
                ..recaptured
            },
        ]
    }

    #[test]
    fn samples_round_trip_each_repeat_a_copy_of_its_threads_last_capture() {
        let records = sampled_records();
        let bytes = saved(&sample_map(), &records);
        assert_eq!(decoded(&bytes).unwrap().1, records);
        let view = CaptureView::parse(&bytes).unwrap();
        // Nine entries: 4 trace records, 2 sample entries after their
        // record, 3 repeated samples.
        assert_eq!(view.record_count, 9);
    }

    #[test]
    fn a_sample_entry_out_of_place_is_refused() {
        let records = sampled_records();
        let mut writer = CaptureWriter::new(Vec::new(), &sample_map()).unwrap();
        let error = writer.append(&records[2]).unwrap_err();
        assert!(error.to_string().contains("not its last stack"), "{error}");
        let mut other_source = records[1].clone();
        other_source.sample = records[0].sample;
        assert!(writer.append(&other_source).is_err());
        // The repeat moved before its capture, and an entry alone that
        // says it follows a record.
        let bytes = saved(&sample_map(), &records);
        let view = CaptureView::parse(&bytes).unwrap();
        let first = view.records_at;
        let record_size = record_size_field(&bytes[first..]);
        let entry = first + record_size;
        let mut moved = bytes.clone();
        moved.copy_within(entry..entry + 32, first);
        moved[first + 32..first + 32 + record_size]
            .copy_from_slice(&bytes[first..first + record_size]);
        let error = decoded(&moved).unwrap_err();
        assert!(
            matches!(error, CaptureError::SampleEntry { index: 0, .. }),
            "{error}"
        );
        assert!(error.to_string().contains("without its record"), "{error}");
        // Format 5 has no sample entries: one is a damaged record there.
        let mut five = bytes;
        five[8] = 5;
        assert!(matches!(
            decoded(&five).unwrap_err(),
            CaptureError::Record { index: 1, .. }
        ));
    }

    #[test]
    fn process_modules_round_trip_and_their_damage_is_named() {
        let mut processes = ProcessModules::default();
        let module = |base, name: &str| Module {
            base,
            size: 0x1_0000,
            name: name.to_owned(),
        };
        processes.add(
            100,
            [
                module(0x7FF6_0000_0000, "kstack.exe"),
                module(0x7FFE_0000_0000, "ntdll.dll"),
            ],
        );
        processes.add(200, [module(0x0040_0000, "reg.exe")]);
        let mut writer =
            CaptureWriter::with_processes(Vec::new(), &sample_map(), &processes).unwrap();
        for record in sample_records() {
            writer.append(&record).unwrap();
        }
        let bytes = writer.finish().unwrap();
        assert_eq!(&bytes[20..24], &2_u32.to_le_bytes(), "the process count");
        let view = CaptureView::parse(&bytes).unwrap();
        assert_eq!(view.processes, processes);
        assert_eq!(view.modules, sample_map());
        assert_eq!(
            view.records().collect::<Result<Vec<_>, _>>().unwrap(),
            sample_records()
        );
        // A process list cut short.
        let mut cut = bytes.clone();
        cut[20..24].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(CaptureView::parse(&cut).is_err());
        // A user module's name that is not UTF-8, named by its place among
        // all modules (the kernel's first).
        let kernel_modules = sample_map().modules().len();
        let name_at = bytes
            .windows(7)
            .position(|window| window == b"reg.exe")
            .unwrap();
        let mut bad_name = bytes;
        bad_name[name_at] = 0xFF;
        assert_eq!(
            CaptureView::parse(&bad_name).unwrap_err(),
            CaptureError::ModuleName {
                index: kernel_modules + 2
            }
        );
    }

    #[test]
    fn a_capture_round_trips_modules_and_records() {
        let bytes = saved(&sample_map(), &sample_records());
        assert_eq!(&bytes[..8], b"KSTKCAP\0");
        assert_eq!(decoded(&bytes), Ok((sample_map(), sample_records())));
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
        // bytes more (their three fact words), and the frames.
        let by_id = kstack_abi::by_id_record_size(&SourceFacts::Timer);
        assert_eq!(by_id, 48);
        assert_eq!(
            bytes.len(),
            HEADER_SIZE
                + 100 * by_id
                + 2 * (kstack_abi::record_size(0) - by_id)
                + 8 * (40 + 1)
                + NO_LOADED_IMAGES
                + TRAILER_SIZE
        );
    }

    #[test]
    fn a_record_naming_a_stack_not_stored_before_it_is_an_error() {
        let mut by_id = record(1, SourceFacts::Timer, &[]);
        by_id.header.flags = RecordFlags::STACK_BY_ID;
        by_id.header.stack_id = 77;
        let mut bytes = saved(&ModuleMap::default(), &[]);
        // The saved header and end around one record written by hand.
        let mut encoded = [0_u8; MAX_RECORD_SIZE];
        let size = encode_record(&by_id.header, &[], &mut encoded).unwrap();
        let mut end = bytes.split_off(HEADER_SIZE);
        end[NO_LOADED_IMAGES + 8..][..8].copy_from_slice(&1_u64.to_le_bytes());
        bytes.extend_from_slice(&encoded[..size]);
        bytes.extend_from_slice(&end);
        let error = decoded(&bytes).unwrap_err();
        assert_eq!(
            error,
            CaptureError::Record {
                index: 0,
                offset: HEADER_SIZE,
                error: DecodeError::UnknownStack { stack_id: 77 },
            }
        );
    }

    #[test]
    fn an_empty_capture_is_valid() {
        let bytes = saved(&ModuleMap::default(), &[]);
        assert_eq!(bytes.len(), HEADER_SIZE + NO_LOADED_IMAGES + TRAILER_SIZE);
        assert_eq!(decoded(&bytes), Ok((ModuleMap::default(), vec![])));
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
        let mut out = Vec::new();
        CaptureWriter::with_processes(&mut out, &modules, &processes)
            .unwrap()
            .finish()
            .unwrap();
        let view = CaptureView::parse(&out).unwrap();
        assert_eq!(view.modules.identity(&driver), Some(&kstack));
        assert_eq!(view.modules.identity(&ntoskrnl), Some(&no_pdb));
        let (_, app_map) = view.processes.processes().next().unwrap();
        assert_eq!(app_map.identity(&app), Some(&no_pdb));
        // Cut inside an identity: the module list is cut short.
        let cut = out.len() - TRAILER_SIZE - 20;
        let mut damaged = out[..cut].to_vec();
        damaged.extend_from_slice(&out[out.len() - TRAILER_SIZE..]);
        assert!(CaptureView::parse(&damaged).is_err());
    }

    #[test]
    fn loaded_images_identities_are_saved_at_the_end_and_read_back() {
        let app = ImageIdentity {
            timestamp: 0x6543_2100,
            size_of_image: 0x2_0000,
            debug: Some(DebugIdentity {
                pdb_name: "app.pdb".to_owned(),
                guid: *b"0123456789abcdef",
                age: 3,
            }),
        };
        let path: Vec<u16> = r"\??\C:\app\app.exe".encode_utf16().collect();
        let load = ModuleChange {
            header: ModuleHeader {
                sequence: 1,
                timestamp: 134_081_280_000_000_000,
                process_id: 4312,
                process_key: 77,
                thread_id: 8,
                processor: 0,
                shard: 0,
                event: ModuleEvent::ImageLoad,
                flags: ModuleFlags::NONE,
                image_base: 0x7FF6_0000_0000,
                image_size: 0x2_0000,
            },
            path,
        };
        let module = load.module().unwrap();
        let mut writer = CaptureWriter::new(Vec::new(), &sample_map()).unwrap();
        writer.append_module(&load).unwrap();
        for record in sample_records() {
            writer.append(&record).unwrap();
        }
        assert!(!writer.knows_loaded_image(&module));
        writer.note_loaded_identity(module.clone(), app.clone());
        writer.note_loaded_identity(module.clone(), app.clone());
        assert!(writer.knows_loaded_image(&module));
        let bytes = writer.finish().unwrap();
        let view = CaptureView::parse(&bytes).unwrap();
        assert_eq!(view.processes.identity(&module), Some(&app));
        assert_eq!(view.processes.changes(), [load]);
        assert_eq!(
            view.records().collect::<Result<Vec<_>, _>>().unwrap(),
            sample_records()
        );
        // Noted once: the count is 1.
        let loaded_length = u64::from_le_bytes(bytes[bytes.len() - 8..].try_into().unwrap());
        let loaded_at = bytes.len() - TRAILER_SIZE - usize::try_from(loaded_length).unwrap();
        assert_eq!(bytes[loaded_at..loaded_at + 4], 1_u32.to_le_bytes());
        // A length reaching before the records, or not ending at the
        // trailer, is damage.
        for wrong in [
            u64::MAX,
            bytes.len() as u64,
            loaded_length - 1,
            loaded_length + 1,
        ] {
            let mut damaged = bytes.clone();
            let at = damaged.len() - 8;
            damaged[at..].copy_from_slice(&wrong.to_le_bytes());
            assert!(CaptureView::parse(&damaged).is_err(), "length {wrong}");
        }
    }

    #[test]
    fn other_files_and_versions_are_refused_by_name() {
        let bytes = saved(&sample_map(), &sample_records());
        assert_eq!(
            decoded(b"{\"schema\":1}").unwrap_err(),
            CaptureError::NotACapture
        );
        let mut other_format = bytes.clone();
        other_format[8] = 7;
        let error = decoded(&other_format).unwrap_err();
        assert_eq!(error, CaptureError::FormatVersion(7));
        assert!(
            error.to_string().contains("reads versions 1 to 6"),
            "{error}"
        );
        // Formats 1 to 4 end without loaded images' identities: their
        // trailer is the magic and the record count.
        let old_format = |version: u8| {
            let mut old = bytes.clone();
            old[8] = version;
            old.truncate(old.len() - 8);
            let loaded_at = old.len() - OLD_TRAILER_SIZE - NO_LOADED_IMAGES;
            old.drain(loaded_at..loaded_at + NO_LOADED_IMAGES);
            old
        };
        // Formats 1 (its process count word reserved, zero) and 2 (no
        // listing time) still read: their header ends at 24. Format 3 had
        // no identities (its modules' flags word is zero).
        for old in [1, 2] {
            let mut old = old_format(old);
            old.drain(OLD_HEADER_SIZE..HEADER_SIZE);
            assert_eq!(decoded(&old).unwrap().1, sample_records());
        }
        for old in [3, 4] {
            assert_eq!(decoded(&old_format(old)).unwrap(), decoded(&bytes).unwrap());
        }
        // Format 5 is format 6 without sample entries.
        let mut five = bytes.clone();
        five[8] = 5;
        assert_eq!(decoded(&five).unwrap(), decoded(&bytes).unwrap());
        let mut other_abi = bytes.clone();
        other_abi[12..16].copy_from_slice(&(ABI_VERSION + 1).to_le_bytes());
        let error = decoded(&other_abi).unwrap_err();
        assert_eq!(error, CaptureError::AbiVersion(ABI_VERSION + 1));
        assert!(error.to_string().contains("ABI 5 to 14"), "{error}");
        let mut older_abi = bytes.clone();
        older_abi[12..16].copy_from_slice(&4_u32.to_le_bytes());
        assert_eq!(
            decoded(&older_abi).unwrap_err(),
            CaptureError::AbiVersion(4)
        );
        for previous in [5_u32, 11, 13] {
            let mut previous_abi = bytes.clone();
            previous_abi[12..16].copy_from_slice(&previous.to_le_bytes());
            assert_eq!(
                decoded(&previous_abi),
                decoded(&bytes),
                "ABI {previous}'s records are read as they are"
            );
        }
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

    #[test]
    fn every_cut_is_an_error_and_never_a_panic() {
        let bytes = saved(&sample_map(), &sample_records());
        for cut in 0..bytes.len() {
            assert!(decoded(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let records_at = CaptureView::parse(&bytes).unwrap().records_at;
        let unfinished = &bytes[..records_at + kstack_abi::record::record_size(2)];
        assert_eq!(decoded(unfinished).unwrap_err(), CaptureError::Unfinished);
    }

    #[test]
    fn a_damaged_record_is_named_with_its_offset() {
        let mut bytes = saved(&sample_map(), &sample_records());
        let records_at = CaptureView::parse(&bytes).unwrap().records_at;
        let second_at = records_at + kstack_abi::record::record_size(2);
        bytes[second_at + 2] = 0xEE; // an unknown source
        let error = decoded(&bytes).unwrap_err();
        assert!(
            matches!(error, CaptureError::Record { index: 1, offset, .. } if offset == second_at),
            "{error:?}"
        );
    }

    #[test]
    fn a_trailer_count_that_disagrees_is_an_error() {
        let mut bytes = saved(&sample_map(), &sample_records());
        let count_at = bytes.len() - 16;
        bytes[count_at] = 4;
        assert_eq!(
            decoded(&bytes).unwrap_err(),
            CaptureError::RecordCount {
                declared: 4,
                found: 3
            }
        );
    }

    #[test]
    fn a_module_name_that_is_not_utf8_is_refused() {
        let map = ModuleMap::new([Module {
            base: 0x1000,
            size: 0x1000,
            name: "a.sys".to_owned(),
        }]);
        let mut bytes = saved(&map, &[]);
        let name_at = HEADER_SIZE + MODULE_ENTRY_SIZE;
        bytes[name_at] = 0xFF;
        assert_eq!(
            decoded(&bytes).unwrap_err(),
            CaptureError::ModuleName { index: 0 }
        );
    }
}
