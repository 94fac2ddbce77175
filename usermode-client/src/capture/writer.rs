//! Writing a capture (format 7, see `capture::format`): the header and
//! module lists at once, then each batch of entries as a block when the
//! batch ends, so a process killed at any point loses at most the batch in
//! hand, and what was written is made durable at a bounded interval.

use std::{
    collections::HashMap,
    fs::File,
    io::{self, Write},
    sync::Arc,
    time::{Duration, Instant},
};

use kstack_abi::{
    ABI_VERSION, MAX_RECORD_SIZE, RecordFlags, SourceFacts, encode_record,
    module_record::encode_module_record,
};

use crate::{
    capture::{
        block::{BlockKind, encode_block},
        format::{fixed_header, write_entries, write_modules},
        sample_entry::{self, SampleEntry},
        trace::TraceRecord,
    },
    naming::{
        identity::ImageIdentity,
        modules::{Module, ModuleMap},
        process_modules::{ModuleChange, ProcessModules},
    },
};

/// An entries block is written once it holds this many bytes, and at the
/// end of each batch whatever it holds.
pub(crate) const BLOCK_TARGET: usize = 256 << 10;

/// Where a capture is written: bytes that can be made durable.
pub trait CaptureOutput: Write {
    /// Makes what was written durable (on disk, for a file).
    ///
    /// # Errors
    /// The I/O error.
    fn sync(&mut self) -> io::Result<()>;
}

impl CaptureOutput for File {
    fn sync(&mut self) -> io::Result<()> {
        self.sync_data()
    }
}

/// Memory, and nowhere (benchmarks): nothing to make durable.
impl CaptureOutput for Vec<u8> {
    fn sync(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl CaptureOutput for io::Sink {
    fn sync(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// What [`CaptureWriter::finish`] returns.
#[derive(Debug)]
pub struct Finished<W> {
    /// The output.
    pub out: W,
    /// Times what was written was made durable, the last one included.
    pub syncs: u64,
}

/// Writes a capture: the header and module lists at once, then each batch
/// of entries as a block when [`CaptureWriter::end_batch`] is called.
pub struct CaptureWriter<W: CaptureOutput> {
    out: W,
    /// Entries appended, module records and sample entries included.
    entries: u64,
    /// Entries before the ones `pending` holds.
    written: u64,
    /// Encoded entries not yet written.
    pending: Vec<u8>,
    /// The blocks being written.
    frame: Vec<u8>,
    modules: u64,
    scratch: [u8; MAX_RECORD_SIZE],
    /// The frames stored so far under each stack id.
    stored: HashMap<u64, Arc<[u64]>>,
    /// The identities of images module records loaded, as noted.
    loaded_images: Vec<(Module, ImageIdentity)>,
    /// How many of them are written.
    written_images: usize,
    /// The stack id of the last thread-stack record of each thread, which
    /// a repeated sample of it names.
    last_thread_stack: HashMap<u32, u64>,
    /// Repeated samples written (no record of the driver's).
    repeated: u64,
    /// Sample entries written, repeated or after their record.
    samples: u64,
    /// How often written blocks are made durable; `None`: at the end only.
    sync_every: Option<Duration>,
    last_sync: Instant,
    /// Whether blocks were written since the last sync.
    unsynced: bool,
    syncs: u64,
    /// Bytes written to `out`.
    bytes: u64,
}

impl<W: CaptureOutput> CaptureWriter<W> {
    /// Starts a capture with its kernel module list and no process.
    ///
    /// # Errors
    /// The writer's I/O error.
    pub fn new(out: W, modules: &ModuleMap) -> io::Result<Self> {
        Self::with_processes(out, modules, &ProcessModules::EMPTY)
    }

    /// Starts a capture with its kernel module list and the user-mode
    /// modules of each process, written at once.
    ///
    /// # Errors
    /// The writer's I/O error, or more modules than the format counts.
    pub fn with_processes(
        mut out: W,
        modules: &ModuleMap,
        processes: &ProcessModules,
    ) -> io::Result<Self> {
        let count =
            |count: usize| u32::try_from(count).map_err(|_| io::Error::other("too many modules"));
        let mut frame = fixed_header(ABI_VERSION).to_vec();
        let mut payload = Vec::new();
        payload.extend_from_slice(&count(modules.modules().len())?.to_le_bytes());
        payload.extend_from_slice(&processes.listed_at().to_le_bytes());
        write_modules(&mut payload, modules)?;
        encode_block(BlockKind::Start, 0, &payload, &mut frame)?;
        for (process_id, modules) in processes.processes() {
            payload.clear();
            payload.extend_from_slice(&process_id.to_le_bytes());
            payload.extend_from_slice(&count(modules.modules().len())?.to_le_bytes());
            write_modules(&mut payload, modules)?;
            encode_block(BlockKind::Process, 0, &payload, &mut frame)?;
        }
        out.write_all(&frame)?;
        let bytes = frame.len() as u64;
        frame.clear();
        Ok(Self {
            out,
            entries: 0,
            written: 0,
            pending: Vec::new(),
            frame,
            modules: 0,
            scratch: [0; MAX_RECORD_SIZE],
            stored: HashMap::new(),
            loaded_images: Vec::new(),
            written_images: 0,
            last_thread_stack: HashMap::new(),
            repeated: 0,
            samples: 0,
            sync_every: None,
            last_sync: Instant::now(),
            unsynced: true,
            syncs: 0,
            bytes,
        })
    }

    /// Makes what was written durable at most `every` after it was
    /// written, checked at each [`CaptureWriter::end_batch`].
    #[must_use]
    pub fn syncing_every(self, every: Duration) -> Self {
        Self {
            sync_every: Some(every),
            ..self
        }
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
            self.push_sample_entry(&entry);
            return self.write_if_full();
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
        self.push(size);
        // A record and its sample entry share a block: the reader takes
        // an entry at a block's start for a repeat.
        if let Some(entry) = sampled {
            self.push_sample_entry(&entry);
        }
        self.write_if_full()
    }

    fn push_sample_entry(&mut self, entry: &SampleEntry) {
        let size = sample_entry::SAMPLE_ENTRY_SIZE;
        self.scratch[..size].copy_from_slice(&sample_entry::encode(entry));
        self.samples += 1;
        self.push(size);
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
        self.push(size);
        self.write_if_full()
    }

    /// Adds the entry encoded in the scratch buffer to the pending block.
    fn push(&mut self, size: usize) {
        self.pending.extend_from_slice(&self.scratch[..size]);
        self.entries += 1;
    }

    /// Writes the pending block once it is full (between whole entries:
    /// a record and its sample entry are one).
    fn write_if_full(&mut self) -> io::Result<()> {
        if self.pending.len() >= BLOCK_TARGET {
            self.write_pending()?;
        }
        Ok(())
    }

    /// Writes what was appended since the last batch ended, and makes it
    /// durable when a sync is due: after this returns, a process killed
    /// loses nothing appended before.
    ///
    /// # Errors
    /// The writer's I/O error.
    pub fn end_batch(&mut self) -> io::Result<()> {
        self.write_pending()?;
        if self.unsynced
            && self
                .sync_every
                .is_some_and(|every| self.last_sync.elapsed() >= every)
        {
            self.sync()?;
        }
        Ok(())
    }

    /// Writes the loaded images' identities noted since the last block,
    /// then the pending entries, each as a block, in one write.
    fn write_pending(&mut self) -> io::Result<()> {
        // Identities in blocks of about BLOCK_TARGET bytes each.
        while self.written_images < self.loaded_images.len() {
            let mut entries = Vec::new();
            let mut count: u32 = 0;
            for (module, identity) in &self.loaded_images[self.written_images..] {
                if entries.len() >= BLOCK_TARGET {
                    break;
                }
                write_entries(&mut entries, std::iter::once((module, Some(identity))))?;
                count += 1;
            }
            let mut payload = count.to_le_bytes().to_vec();
            payload.extend_from_slice(&entries);
            encode_block(
                BlockKind::LoadedImages,
                self.written,
                &payload,
                &mut self.frame,
            )?;
            self.written_images += count as usize;
        }
        if !self.pending.is_empty() {
            encode_block(
                BlockKind::Entries,
                self.written,
                &self.pending,
                &mut self.frame,
            )?;
            self.pending.clear();
            self.written = self.entries;
        }
        if !self.frame.is_empty() {
            self.out.write_all(&self.frame)?;
            self.out.flush()?;
            self.bytes += self.frame.len() as u64;
            self.frame.clear();
            self.unsynced = true;
        }
        Ok(())
    }

    fn sync(&mut self) -> io::Result<()> {
        self.out.sync()?;
        self.syncs += 1;
        self.last_sync = Instant::now();
        self.unsynced = false;
        Ok(())
    }

    /// Notes the identity of the image a module record loaded, written
    /// before the entries of this batch.
    pub fn note_loaded_identity(&mut self, module: Module, identity: ImageIdentity) {
        if !self.knows_loaded_image(&module) {
            self.loaded_images.push((module, identity));
        }
    }

    /// How often written blocks are made durable (`None`: at the end).
    #[must_use]
    pub const fn sync_interval(&self) -> Option<Duration> {
        self.sync_every
    }

    /// The identities noted so far.
    #[must_use]
    pub fn loaded_identities(&self) -> &[(Module, ImageIdentity)] {
        &self.loaded_images
    }

    /// Bytes written so far (what ended batches hold).
    #[must_use]
    pub const fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether `module`'s identity was noted.
    #[must_use]
    pub fn knows_loaded_image(&self, module: &Module) -> bool {
        self.loaded_images.iter().any(|(noted, _)| noted == module)
    }

    /// Entries appended so far: records, module records and sample
    /// entries.
    #[must_use]
    pub const fn records(&self) -> u64 {
        self.entries
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
        self.entries - self.modules - self.samples
    }

    /// Repeated samples appended so far.
    #[must_use]
    pub const fn repeated_samples(&self) -> u64 {
        self.repeated
    }

    /// What was written so far.
    #[cfg(test)]
    pub(crate) const fn written(&self) -> &W {
        &self.out
    }

    /// Times what was written was made durable so far.
    #[must_use]
    pub const fn syncs(&self) -> u64 {
        self.syncs
    }

    /// Writes what is pending and the end marker, and makes it all durable.
    ///
    /// # Errors
    /// The writer's I/O error.
    pub fn finish(mut self) -> io::Result<Finished<W>> {
        self.write_pending()?;
        encode_block(
            BlockKind::End,
            self.entries,
            &self.entries.to_le_bytes(),
            &mut self.frame,
        )?;
        self.out.write_all(&self.frame)?;
        self.out.flush()?;
        self.sync()?;
        Ok(Finished {
            out: self.out,
            syncs: self.syncs,
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use kstack_abi::{RecordFlags, RecordHeader, SourceFacts, stack_id};

    use kstack_abi::{ModuleEvent, ModuleFlags, ModuleHeader};

    use super::*;
    use crate::{
        capture::trace::SampleFacts,
        naming::{identity::DebugIdentity, modules::tests::sample_map},
        thread_list::{ThreadState, WaitReason},
    };

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
        writer.finish().unwrap().out
    }

    pub fn sample_records() -> Vec<TraceRecord> {
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
    pub fn sampled_records() -> Vec<TraceRecord> {
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
    fn the_writer_refuses_sample_facts_out_of_place() {
        let records = sampled_records();
        let mut writer = CaptureWriter::new(Vec::new(), &sample_map()).unwrap();
        let error = writer.append(&records[2]).unwrap_err();
        assert!(error.to_string().contains("not its last stack"), "{error}");
        let mut other_source = records[1].clone();
        other_source.sample = records[0].sample;
        assert!(writer.append(&other_source).is_err());
    }

    #[test]
    fn syncs_come_at_most_as_often_as_asked() {
        let mut writer = CaptureWriter::new(Vec::new(), &ModuleMap::default())
            .unwrap()
            .syncing_every(Duration::ZERO);
        for sequence in 1..=3 {
            writer
                .append(&record(sequence, SourceFacts::Timer, &[]))
                .unwrap();
            writer.end_batch().unwrap();
        }
        // Nothing new written: no sync.
        writer.end_batch().unwrap();
        assert_eq!(writer.syncs(), 3);
        let mut rare = CaptureWriter::new(Vec::new(), &ModuleMap::default())
            .unwrap()
            .syncing_every(Duration::from_hours(1));
        rare.append(&record(1, SourceFacts::Timer, &[])).unwrap();
        rare.end_batch().unwrap();
        assert_eq!(rare.syncs(), 0);
        assert_eq!(rare.finish().unwrap().syncs, 1);
    }

    /// A module record loading app.exe into process 4312, and its image's
    /// identity.
    fn app_load() -> (ModuleChange, ImageIdentity) {
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
        (load, app)
    }

    /// A capture of one batch: app.exe's module record (its image's
    /// identity noted twice, kept once) and [`sample_records`].
    pub fn app_loading_capture() -> (Vec<u8>, ModuleChange, ImageIdentity) {
        let (load, app) = app_load();
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
        writer.end_batch().unwrap();
        (writer.finish().unwrap().out, load, app)
    }
}
