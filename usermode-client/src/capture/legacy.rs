//! Reading captures of formats 1 to 6 (see `capture::format` for their
//! layout): one run of entries between the module lists and the trailer,
//! with no checksum. They are read whole, and any damage or cut is an
//! error, as before format 7.

use kstack_abi::{
    module_record::{decode_module_record, is_module_record},
    record_size_field,
};

use crate::{
    capture::{
        entry_walk::{EntryWalk, WalkedEntry},
        format::{
            CaptureError, END_MAGIC, HEADER_SIZE, MAGIC, OLD_HEADER_SIZE, OLD_TRAILER_SIZE,
            READABLE_ABIS, TRAILER_SIZE, read_modules,
        },
        trace::TraceRecord,
    },
    naming::{
        modules::ModuleMap,
        process_modules::{ModuleChange, ProcessModules},
    },
};

/// The last format without blocks.
pub const LAST_LEGACY_FORMAT: u32 = 6;

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
    /// Its format.
    format: u32,
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
        if !(1..=LAST_LEGACY_FORMAT).contains(&format) {
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
            format,
        })
    }

    /// Where its entries are in the bytes it was parsed from.
    #[must_use]
    pub const fn records_range(&self) -> core::ops::Range<usize> {
        self.records_at..self.records_at + self.records.len()
    }

    /// Its format.
    #[must_use]
    pub const fn format(&self) -> u32 {
        self.format
    }

    /// Every trace record in order, with its frames and (format 6) its
    /// sample facts, a repeated sample read as a copy of its thread's last
    /// thread-stack record with the entry's time and facts; a damaged
    /// record or entry (or one naming a stack not stored before it) ends
    /// the walk with its error, and so does a count that disagrees with
    /// the trailer's. Module records are counted and passed over
    /// (`processes` holds them).
    pub fn records(&self) -> impl Iterator<Item = Result<TraceRecord, CaptureError>> + 'a {
        let mut walk = LegacyWalk {
            declared: self.record_count,
            offset: self.records_at,
            rest: self.records,
            done: false,
            entries: EntryWalk::new(self.format),
        };
        core::iter::from_fn(move || walk.next_record())
    }
}

/// [`CaptureView::records`]'s place in the records.
struct LegacyWalk<'a> {
    declared: u64,
    offset: usize,
    rest: &'a [u8],
    done: bool,
    entries: EntryWalk,
}

impl LegacyWalk<'_> {
    fn next_record(&mut self) -> Option<Result<TraceRecord, CaptureError>> {
        while !self.done {
            if self.rest.is_empty() {
                self.done = true;
                let found = self.entries.entries;
                return (found != self.declared).then_some(Err(CaptureError::RecordCount {
                    declared: self.declared,
                    found,
                }));
            }
            match self.entries.next_entry(self.rest, self.offset) {
                Ok((entry, size)) => {
                    self.offset += size;
                    self.rest = &self.rest[size..];
                    // Module records were noted when the capture was
                    // parsed; a repeat is never lost here (no format
                    // before 7 is read tolerantly).
                    if let WalkedEntry::Record(record) = entry {
                        return Some(Ok(record));
                    }
                }
                Err(error) => {
                    self.done = true;
                    return Some(Err(error));
                }
            }
        }
        None
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
    for (module, identity) in read_modules(bytes, LAST_LEGACY_FORMAT, &mut section_at, count, read)?
    {
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

#[cfg(test)]
mod tests {
    use kstack_abi::{
        ABI_VERSION, DecodeError, MAX_RECORD_SIZE, RecordFlags, SourceFacts, encode_record,
    };

    use super::*;
    use crate::{
        capture::{
            block::{BlockKind, BlockReader, Piece},
            format::{FIXED_HEADER_SIZE, MODULE_ENTRY_SIZE},
            writer::{
                CaptureWriter,
                tests::{app_loading_capture, record, sample_records, sampled_records, saved},
            },
        },
        naming::modules::{Module, tests::sample_map},
    };

    /// The loaded images' identities of a capture without any: their count.
    const NO_LOADED_IMAGES: usize = 4;

    /// The same capture in format 6: what format 7 frames in blocks, in
    /// one run.
    pub fn format6(bytes: &[u8]) -> Vec<u8> {
        let mut blocks = BlockReader::new(&bytes[FIXED_HEADER_SIZE..], 0);
        let (mut start, mut processes, mut entries, mut loaded, mut end) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut process_count, mut loaded_count) = (0_u32, 0_u32);
        while let Some(piece) = blocks.next_piece().unwrap() {
            let Piece::Block(block) = piece else {
                panic!("damaged: {piece:?}");
            };
            let payload = block.payload;
            match block.kind {
                BlockKind::Start => start = payload.to_vec(),
                BlockKind::Process => {
                    process_count += 1;
                    processes.extend_from_slice(payload);
                }
                BlockKind::Entries => entries.extend_from_slice(payload),
                BlockKind::LoadedImages => {
                    loaded_count += u32::from_le_bytes(payload[..4].try_into().unwrap());
                    loaded.extend_from_slice(&payload[4..]);
                }
                BlockKind::End => end = payload.to_vec(),
            }
        }
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&LAST_LEGACY_FORMAT.to_le_bytes());
        out.extend_from_slice(&bytes[16..20]);
        out.extend_from_slice(&start[..4]);
        out.extend_from_slice(&process_count.to_le_bytes());
        out.extend_from_slice(&start[4..12]);
        out.extend_from_slice(&start[12..]);
        out.extend_from_slice(&processes);
        out.extend_from_slice(&entries);
        let mut section = loaded_count.to_le_bytes().to_vec();
        section.extend_from_slice(&loaded);
        out.extend_from_slice(&section);
        out.extend_from_slice(&END_MAGIC);
        out.extend_from_slice(&end);
        out.extend_from_slice(&(section.len() as u64).to_le_bytes());
        out
    }

    fn decoded(bytes: &[u8]) -> Result<(ModuleMap, Vec<TraceRecord>), CaptureError> {
        let view = CaptureView::parse(bytes)?;
        let records = view.records().collect::<Result<_, _>>()?;
        Ok((view.modules, records))
    }

    #[test]
    fn a_sample_entry_out_of_place_is_refused() {
        let records = sampled_records();
        // The repeat moved before its capture, and an entry alone that
        // says it follows a record.
        let bytes = format6(&saved(&sample_map(), &records));
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
        let bytes = format6(&writer.finish().unwrap().out);
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
    fn a_record_naming_a_stack_not_stored_before_it_is_an_error() {
        let mut by_id = record(1, SourceFacts::Timer, &[]);
        by_id.header.flags = RecordFlags::STACK_BY_ID;
        by_id.header.stack_id = 77;
        let mut bytes = format6(&saved(&ModuleMap::default(), &[]));
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
    fn loaded_images_identities_are_saved_at_the_end_and_read_back() {
        let (bytes, load, app) = app_loading_capture();
        let bytes = format6(&bytes);
        let module = load.module().unwrap();
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
        let bytes = format6(&saved(&sample_map(), &sample_records()));
        assert_eq!(
            decoded(b"{\"schema\":1}").unwrap_err(),
            CaptureError::NotACapture
        );
        let mut other_format = bytes.clone();
        other_format[8] = 8;
        let error = decoded(&other_format).unwrap_err();
        assert_eq!(error, CaptureError::FormatVersion(8));
        assert!(
            error.to_string().contains("reads versions 1 to 7"),
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
    fn every_cut_is_an_error_and_never_a_panic() {
        let bytes = format6(&saved(&sample_map(), &sample_records()));
        for cut in 0..bytes.len() {
            assert!(decoded(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let records_at = CaptureView::parse(&bytes).unwrap().records_at;
        let unfinished = &bytes[..records_at + kstack_abi::record::record_size(2)];
        assert_eq!(decoded(unfinished).unwrap_err(), CaptureError::Unfinished);
    }

    #[test]
    fn a_damaged_record_is_named_with_its_offset() {
        let mut bytes = format6(&saved(&sample_map(), &sample_records()));
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
        let mut bytes = format6(&saved(&sample_map(), &sample_records()));
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
        let mut bytes = format6(&saved(&map, &[]));
        let name_at = HEADER_SIZE + MODULE_ENTRY_SIZE;
        bytes[name_at] = 0xFF;
        assert_eq!(
            decoded(&bytes).unwrap_err(),
            CaptureError::ModuleName { index: 0 }
        );
    }
}
