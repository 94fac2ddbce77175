//! Reading a capture's entries in order: trace records (each given its
//! frames back through the stack table), module records, and (format 6
//! on) `kstack sample`'s entries of a sample's thread facts. The same walk
//! reads the one run of entries of formats 1 to 6 and each entries block
//! of format 7.

use std::collections::HashMap;

use kstack_abi::{DecodeError, Entry, SourceFacts, decode_entry};

use crate::{
    capture::{
        format::CaptureError,
        sample_entry::{self, SampleEntry, is_file_entry},
        trace::{StackMemory, TraceRecord},
    },
    naming::process_modules::ModuleChange,
};

/// One entry read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WalkedEntry {
    /// A trace record with its frames and sample facts, or a repeated
    /// sample read as a copy of its thread's last thread-stack record with
    /// the entry's time and facts.
    Record(TraceRecord),
    /// A module record.
    Module(ModuleChange),
    /// A repeated sample of a thread whose last capture was lost with
    /// damaged bytes (see [`EntryWalk::forget_threads`]): left out.
    RepeatLost,
}

/// The walk's memory: stacks stored so far, each thread's last capture,
/// and entries read.
#[derive(Default)]
pub struct EntryWalk {
    stacks: StackMemory,
    /// The last thread-stack record of each thread, by target thread id:
    /// what a repeated sample of it copies.
    last_thread_stack: HashMap<u32, TraceRecord>,
    /// Whether sample entries may be among the entries (format 6 on).
    sample_entries: bool,
    /// Whether a record naming a stack never stored, and a repeat of a
    /// thread not captured since [`EntryWalk::forget_threads`], are
    /// read as lost rather than refused (format 7, whose damaged blocks
    /// may have held them).
    tolerant: bool,
    /// Entries read so far.
    pub entries: u64,
}

impl EntryWalk {
    /// A walk of a capture of `format`.
    #[must_use]
    pub fn new(format: u32) -> Self {
        Self {
            sample_entries: format >= 6,
            tolerant: format >= 7,
            ..Self::default()
        }
    }

    /// Forgets each thread's last capture: bytes were lost that may have
    /// held a later one, which a repeated sample after them copies.
    pub fn forget_threads(&mut self) {
        self.last_thread_stack.clear();
    }

    /// The entry at the front of `bytes` (at byte `offset` of the file)
    /// and its size, the sample entry that follows a trace record
    /// included.
    ///
    /// # Errors
    /// A [`CaptureError`] naming the entry that does not decode or does
    /// not belong where it is.
    pub fn next_entry(
        &mut self,
        bytes: &[u8],
        offset: usize,
    ) -> Result<(WalkedEntry, usize), CaptureError> {
        let at = Place {
            index: self.entries,
            offset,
        };
        if self.sample_entries && is_file_entry(bytes) {
            let entry = at.sample_entry(bytes)?;
            if !entry.facts.repeated {
                return Err(at.misplaced("a sample entry without its record"));
            }
            let walked = match self.last_thread_stack.get(&entry.thread_id) {
                Some(last) => {
                    let mut record = last.clone();
                    record.header.timestamp = entry.timestamp;
                    record.sample = Some(entry.facts);
                    WalkedEntry::Record(record)
                }
                None if self.tolerant => WalkedEntry::RepeatLost,
                None => return Err(at.misplaced("a repeated sample of a thread never captured")),
            };
            self.entries += 1;
            return Ok((walked, sample_entry::SAMPLE_ENTRY_SIZE));
        }
        let (entry, size) = decode_entry(bytes).map_err(|error| at.record(error))?;
        let view = match entry {
            Entry::Trace(view) => view,
            Entry::Module(record) => {
                self.entries += 1;
                return Ok((WalkedEntry::Module(ModuleChange::from(&record)), size));
            }
        };
        let mut record = match self.stacks.resolve(&view) {
            Err(DecodeError::UnknownStack { .. }) if self.tolerant => {
                // Shown as a stack whose frames were lost.
                TraceRecord {
                    header: view.header,
                    frames: [].into(),
                    sample: None,
                }
            }
            resolved => resolved.map_err(|error| at.record(error))?,
        };
        let target = match record.header.facts {
            SourceFacts::ThreadStack {
                target_thread_id, ..
            } => Some(target_thread_id),
            _ => None,
        };
        let mut taken = size;
        let following = &bytes[size..];
        if self.sample_entries && is_file_entry(following) {
            let after = Place {
                index: self.entries + 1,
                offset: offset + size,
            };
            let entry = after.sample_entry(following)?;
            if !entry.facts.repeated {
                if target != Some(entry.thread_id) {
                    return Err(after.misplaced("a sample entry after another thread's record"));
                }
                record.sample = Some(entry.facts);
                taken += sample_entry::SAMPLE_ENTRY_SIZE;
                self.entries += 1;
            }
        }
        self.entries += 1;
        // A capture whose stack was lost is still the thread's last: a
        // repeat of it reads as lost too, never as an older stack.
        if let Some(thread_id) = target {
            self.last_thread_stack.insert(thread_id, record.clone());
        }
        Ok((WalkedEntry::Record(record), taken))
    }
}

/// Where an entry is, for errors.
struct Place {
    index: u64,
    offset: usize,
}

impl Place {
    fn sample_entry(&self, bytes: &[u8]) -> Result<SampleEntry, CaptureError> {
        sample_entry::decode(bytes).map_err(|problem| self.misplaced(problem))
    }

    const fn misplaced(&self, problem: &'static str) -> CaptureError {
        CaptureError::SampleEntry {
            index: self.index,
            offset: self.offset,
            problem,
        }
    }

    const fn record(&self, error: DecodeError) -> CaptureError {
        CaptureError::Record {
            index: self.index,
            offset: self.offset,
            error,
        }
    }
}
