//! Module records: the image loads and process exits the driver reports in
//! the ring beside the trace records, so a reader can keep each process's
//! module map over time and name user frames (`module+0xoffset`) after the
//! map of the record's own process as it was when the record was taken.
//!
//! The driver writes one for every image load its load-image callback sees
//! (user images and drivers), whether or not the image-load source is
//! enabled, and one for every process exit its process callback sees,
//! whether or not the process source is enabled. They are not filtered by
//! process and not sampled; they take sequence numbers from their shard's
//! numbering like trace records, so a gap in a shard's numbers may be a
//! lost module record too, and they are ordered by timestamp with the
//! trace records (see [`crate::ioctl::Ioctl::Read`]). Their own counter is
//! [`crate::StatusResponse::module_records`]. An image load is recorded
//! before the image-load source's own record of it, a process exit after
//! the process source's record of it, so a process's exit record is named
//! with its modules.
//!
//! Layout (little-endian, a multiple of 8 bytes; the fields a reader
//! orders and accounts records by are where a trace record has them):
//!
//! | offset | size | field |
//! |-------:|-----:|-------|
//! | 0  | 2 | `record_size`: bytes in this record, the path and its padding included |
//! | 2  | 1 | [`MODULE_RECORD_KIND`] (a trace record has its source there, 1 to 8: [`crate::Source`]'s wire values) |
//! | 3  | 1 | `event` ([`ModuleEvent`]) |
//! | 4  | 2 | `path_length`: UTF-16 code units in the path (0 for a process exit) |
//! | 6  | 2 | `flags` ([`ModuleFlags`]) |
//! | 8  | 8 | `sequence`, as for trace records |
//! | 16 | 8 | `timestamp`, as for trace records |
//! | 24 | 4 | `process_id`: the process the image was loaded into (0: a driver image) or the process that exited |
//! | 28 | 4 | `thread_id` of the current thread |
//! | 32 | 2 | `processor` the record was written on |
//! | 34 | 1 | `shard`: the ring shard that kept it |
//! | 35 | 1 | reserved, zero |
//! | 36 | 4 | `image_size` in bytes (0 for a process exit) |
//! | 40 | 8 | `image_base` (0 for a process exit) |
//! | 48 | 8 | `process_key`: the process's creation time (100 ns units since 1601-01-01 UTC, `PsGetProcessCreateTimeQuadPart`), 0 when not known (see below) |
//! | 56 | 2 × n | `path`: the image's full path as the kernel named it (UTF-16LE, no terminator), then zero padding to a multiple of 8 |
//!
//! A process id is reused once its process is gone; `process_key` tells
//! two processes with one id apart. It is 0 for a driver image, when the
//! driver cannot read creation times
//! ([`crate::StatusResponse::process_key`] says why), and when the loading
//! process could not be looked up. Paths longer than
//! [`MAX_MODULE_PATH`] units keep their last [`MAX_MODULE_PATH`] units (the
//! file name survives) with [`ModuleFlags::PATH_TRUNCATED`]; an image the
//! kernel gave no name has an empty path.
//!
//! # Example
//!
//! An image load of `C:\app.exe` (10 UTF-16 units, so 20 bytes of path
//! and 4 of padding: 80 bytes in all) at `0x7FF6_1230_0000`, `0x5_0000`
//! bytes, into process 4312, written by thread 77 on processor 1 into
//! shard 1 as its record 9, byte for byte:
//!
//! ```
//! use kstack_abi::{
//!     ModuleEvent, ModuleFlags, ModuleHeader,
//!     module_record::{decode_module_record, encode_module_record},
//! };
//!
//! let bytes: [u8; 80] = [
//!     0x50, 0x00, 0x80, 0x01, 0x0A, 0x00, 0x00, 0x00, // size 80, module record, image load, 10 path units, no flags
//!     0x09, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // sequence 9
//!     0x0F, 0x1E, 0x2D, 0x3C, 0x4F, 0x5A, 0xDB, 0x01, // timestamp 0x01DB_5A4F_3C2D_1E0F
//!     0xD8, 0x10, 0x00, 0x00, 0x4D, 0x00, 0x00, 0x00, // process 4312, thread 77
//!     0x01, 0x00, 0x01, 0x00, 0x00, 0x00, 0x05, 0x00, // processor 1, shard 1, reserved 0, image size 0x5_0000
//!     0x00, 0x00, 0x30, 0x12, 0xF6, 0x7F, 0x00, 0x00, // image base 0x7FF6_1230_0000
//!     0x44, 0x33, 0x22, 0x11, 0x40, 0x5A, 0xDB, 0x01, // process key 0x01DB_5A40_1122_3344
//!     0x43, 0x00, 0x3A, 0x00, 0x5C, 0x00, 0x61, 0x00, // "C:\a"
//!     0x70, 0x00, 0x70, 0x00, 0x2E, 0x00, 0x65, 0x00, // "pp.e"
//!     0x78, 0x00, 0x65, 0x00, 0x00, 0x00, 0x00, 0x00, // "xe", padding
//! ];
//! let (record, size) = decode_module_record(&bytes).unwrap();
//! let header = ModuleHeader {
//!     sequence: 9,
//!     timestamp: 0x01DB_5A4F_3C2D_1E0F,
//!     process_id: 4312,
//!     thread_id: 77,
//!     processor: 1,
//!     shard: 1,
//!     event: ModuleEvent::ImageLoad,
//!     flags: ModuleFlags::NONE,
//!     image_base: 0x7FF6_1230_0000,
//!     image_size: 0x5_0000,
//!     process_key: 0x01DB_5A40_1122_3344,
//! };
//! assert_eq!((record.header, size), (header, 80));
//! let path: Vec<u16> = record.path_units().collect();
//! assert_eq!(String::from_utf16(&path).unwrap(), r"C:\app.exe");
//!
//! // And the driver's side writes exactly these bytes.
//! let mut written = [0xAA_u8; 80];
//! assert_eq!(encode_module_record(&header, &path, &mut written), Ok(80));
//! assert_eq!(written, bytes);
//! ```

use crate::{
    MAX_RECORD_SIZE, MAX_SHARDS,
    error::DecodeError,
    wire::{Reader, Writer},
    wire_types::{wire_enum, wire_flags},
};

/// Byte 2 of a module record. Trace records have their source there
/// (1 to 8, [`crate::Source`]'s wire values).
pub const MODULE_RECORD_KIND: u8 = 0x80;

/// Byte 2 of an entry the driver never sends: kstack's capture files keep
/// entries of their own among the records with this value there (a
/// sample's thread facts, written by the client).
pub const FILE_ENTRY_KIND: u8 = 0xC0;
/// Bytes before the path.
pub const MODULE_HEADER_SIZE: usize = 56;
/// The most UTF-16 code units of path a module record holds: as many as
/// fit in the largest trace record.
pub const MAX_MODULE_PATH: usize = (MAX_RECORD_SIZE - MODULE_HEADER_SIZE) / 2;

wire_enum! {
/// What a module record reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ModuleEvent: u8 {
    /// An image was mapped: from its timestamp on, `image_base` to
    /// `image_base + image_size` in the process is this image, replacing
    /// whatever was reported there before (Windows reports no unloads).
    ImageLoad = 1,
    /// The process exited: its module map ends; a later record with its
    /// id is another process.
    ProcessExit = 2,
}
}

wire_flags! {
/// Module record flag bits.
pub struct ModuleFlags(u16) {
    /// The path was longer than [`MAX_MODULE_PATH`] units: the record keeps
    /// its end.
    const PATH_TRUNCATED = 1;
}
}

/// Everything in a module record but its path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ModuleHeader {
    /// Sequence number within its shard.
    pub sequence: u64,
    /// When it was written, as a trace record's timestamp.
    pub timestamp: u64,
    /// The process the image loaded into (0: a driver), or that exited.
    pub process_id: u32,
    /// The current thread.
    pub thread_id: u32,
    /// The processor it was written on.
    pub processor: u16,
    /// The ring shard that kept it.
    pub shard: u16,
    /// Load or exit.
    pub event: ModuleEvent,
    /// Flag bits.
    pub flags: ModuleFlags,
    /// The image's base (0 for an exit).
    pub image_base: u64,
    /// The image's size (0 for an exit).
    pub image_size: u32,
    /// The process's creation time, 0 when not known.
    pub process_key: u64,
}

/// A decoded module record whose path stays in the buffer it came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModuleRecord<'a> {
    /// Everything but the path.
    pub header: ModuleHeader,
    path: &'a [u8],
}

impl ModuleRecord<'_> {
    /// The path's UTF-16 code units.
    #[must_use]
    pub fn path_units(&self) -> impl ExactSizeIterator<Item = u16> + '_ {
        self.path
            .chunks_exact(2)
            .map(|unit| u16::from_le_bytes([unit[0], unit[1]]))
    }
}

/// The size of a module record with a path of `path_units` code units.
#[must_use]
pub const fn module_record_size(path_units: usize) -> usize {
    (MODULE_HEADER_SIZE + 2 * path_units).next_multiple_of(8)
}

/// Whether `header` and a path of `path_units` units make a record this
/// ABI defines: an exit has no image and no path; a path fits.
const fn consistent(header: &ModuleHeader, path_units: usize) -> bool {
    let exit_has_image = matches!(header.event, ModuleEvent::ProcessExit)
        && (header.image_base != 0 || header.image_size != 0 || path_units != 0);
    path_units <= MAX_MODULE_PATH && !exit_has_image && header.shard < MAX_SHARDS
}

/// Encodes a module record into the front of `out` and returns its size.
///
/// # Errors
/// [`DecodeError::InvalidModuleRecord`] for a header the layout does not
/// allow (see [`ModuleEvent`]) or a path past [`MAX_MODULE_PATH`], or
/// [`DecodeError::Truncated`] when `out` is too small.
pub fn encode_module_record(
    header: &ModuleHeader,
    path: &[u16],
    out: &mut [u8],
) -> Result<usize, DecodeError> {
    if !consistent(header, path.len()) {
        return Err(DecodeError::InvalidModuleRecord);
    }
    let size = module_record_size(path.len());
    let available = out.len();
    let out = out.get_mut(..size).ok_or(DecodeError::Truncated {
        needed: size,
        actual: available,
    })?;
    let mut w = Writer::new(out);
    #[expect(
        clippy::cast_possible_truncation,
        reason = "size <= MAX_RECORD_SIZE < u16::MAX and path.len() <= MAX_MODULE_PATH"
    )]
    {
        w.u16(0, size as u16);
        w.u16(4, path.len() as u16);
    }
    w.u8(2, MODULE_RECORD_KIND);
    w.u8(3, header.event as u8);
    w.u16(6, header.flags.bits());
    w.u64(8, header.sequence);
    w.u64(16, header.timestamp);
    w.u32(24, header.process_id);
    w.u32(28, header.thread_id);
    w.u16(32, header.processor);
    w.u8(34, u8::try_from(header.shard).unwrap_or(u8::MAX));
    w.u8(35, 0);
    w.u32(36, header.image_size);
    w.u64(40, header.image_base);
    w.u64(48, header.process_key);
    let mut at = MODULE_HEADER_SIZE;
    for &unit in path {
        w.u16(at, unit);
        at += 2;
    }
    while at < size {
        w.u8(at, 0);
        at += 1;
    }
    Ok(size)
}

/// Decodes the module record at the front of `bytes`; returns it and its
/// size.
///
/// # Errors
/// A [`DecodeError`] for a short buffer, another kind of record, a size
/// that disagrees with the path, or any field out of range.
pub fn decode_module_record(bytes: &[u8]) -> Result<(ModuleRecord<'_>, usize), DecodeError> {
    let r = Reader::new(bytes);
    let size = usize::from(r.u16(0)?);
    let kind = r.u8(2)?;
    if kind != MODULE_RECORD_KIND {
        return Err(DecodeError::UnknownSource { value: kind });
    }
    let path_units = usize::from(r.u16(4)?);
    if size != module_record_size(path_units) {
        return Err(DecodeError::InvalidModuleRecord);
    }
    if bytes.len() < size {
        return Err(DecodeError::Truncated {
            needed: size,
            actual: bytes.len(),
        });
    }
    let event_value = r.u8(3)?;
    let event = ModuleEvent::from_wire(event_value)
        .ok_or(DecodeError::UnknownModuleEvent { value: event_value })?;
    let flag_bits = r.u16(6)?;
    let flags = ModuleFlags::from_bits(flag_bits).ok_or(DecodeError::UnknownFlags {
        bits: u32::from(flag_bits),
    })?;
    let header = ModuleHeader {
        sequence: r.u64(8)?,
        timestamp: r.u64(16)?,
        process_id: r.u32(24)?,
        thread_id: r.u32(28)?,
        processor: r.u16(32)?,
        shard: u16::from(r.u8(34)?),
        event,
        flags,
        image_base: r.u64(40)?,
        image_size: r.u32(36)?,
        process_key: r.u64(48)?,
    };
    let path_end = MODULE_HEADER_SIZE + 2 * path_units;
    let padding_clear = bytes[path_end..size].iter().all(|&byte| byte == 0);
    if r.u8(35)? != 0 || !padding_clear || !consistent(&header, path_units) {
        return Err(DecodeError::InvalidModuleRecord);
    }
    Ok((
        ModuleRecord {
            header,
            path: &bytes[MODULE_HEADER_SIZE..path_end],
        },
        size,
    ))
}

/// Whether the encoded record at the front of `record` is a module record
/// (read without decoding the rest).
#[must_use]
pub fn is_module_record(record: &[u8]) -> bool {
    Reader::new(record).u8(2) == Ok(MODULE_RECORD_KIND)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn load(path_units: usize) -> ModuleHeader {
        ModuleHeader {
            sequence: 9,
            timestamp: 133_000_000_000_000_000,
            process_id: 4312,
            thread_id: 77,
            processor: 1,
            shard: 1,
            event: ModuleEvent::ImageLoad,
            flags: if path_units == MAX_MODULE_PATH {
                ModuleFlags::PATH_TRUNCATED
            } else {
                ModuleFlags::NONE
            },
            image_base: 0x7FF6_1230_0000,
            image_size: 0x5_0000,
            process_key: 133_000_000_000_000_123,
        }
    }

    fn round_trip(header: &ModuleHeader, path: &[u16]) -> (ModuleHeader, Vec<u16>, usize) {
        let mut out = [0xAA_u8; MAX_RECORD_SIZE];
        let size = encode_module_record(header, path, &mut out).unwrap();
        assert!(is_module_record(&out));
        let (record, used) = decode_module_record(&out).unwrap();
        assert_eq!(used, size);
        (record.header, record.path_units().collect(), used)
    }

    #[test]
    fn the_longest_path_fills_the_largest_record() {
        assert_eq!(MAX_MODULE_PATH, 256);
        assert_eq!(module_record_size(MAX_MODULE_PATH), MAX_RECORD_SIZE);
        assert_eq!(module_record_size(0), MODULE_HEADER_SIZE);
        assert_eq!(module_record_size(1), 64);
        assert_eq!(module_record_size(4), 64);
        assert_eq!(module_record_size(5), 72);
    }

    #[test]
    fn flags_are_checked_and_contained() {
        let truncated = ModuleFlags::PATH_TRUNCATED;
        assert_eq!(truncated.bits(), 1);
        assert_eq!(ModuleFlags::from_bits(1), Some(truncated));
        assert_eq!(ModuleFlags::from_bits(0), Some(ModuleFlags::NONE));
        assert_eq!(ModuleFlags::from_bits(2), None);
        assert_eq!(ModuleFlags::from_bits(3), None);
        assert!(truncated.contains(truncated));
        assert!(truncated.contains(ModuleFlags::NONE));
        assert!(!ModuleFlags::NONE.contains(truncated));
    }

    proptest! {
        #[test]
        fn loads_round_trip(
            path in proptest::collection::vec(any::<u16>(), 0..=MAX_MODULE_PATH),
            truncated in any::<bool>(),
        ) {
            let header = ModuleHeader {
                flags: if truncated { ModuleFlags::PATH_TRUNCATED } else { ModuleFlags::NONE },
                ..load(path.len())
            };
            let (decoded, units, size) = round_trip(&header, &path);
            prop_assert_eq!(decoded, header);
            prop_assert_eq!(units, path.clone());
            prop_assert_eq!(size, module_record_size(path.len()));
            prop_assert_eq!(size % 8, 0);
        }
    }

    #[test]
    fn exits_round_trip_and_carry_no_image() {
        let exit = ModuleHeader {
            event: ModuleEvent::ProcessExit,
            image_base: 0,
            image_size: 0,
            ..load(0)
        };
        assert_eq!(round_trip(&exit, &[]), (exit, Vec::new(), 56));
        let mut out = [0_u8; MAX_RECORD_SIZE];
        for bad in [
            ModuleHeader {
                image_base: 1,
                ..exit
            },
            ModuleHeader {
                image_size: 1,
                ..exit
            },
        ] {
            assert_eq!(
                encode_module_record(&bad, &[], &mut out),
                Err(DecodeError::InvalidModuleRecord)
            );
        }
        assert_eq!(
            encode_module_record(&exit, &[u16::from(b'a')], &mut out),
            Err(DecodeError::InvalidModuleRecord)
        );
        assert_eq!(
            encode_module_record(&load(0), &[0; MAX_MODULE_PATH + 1], &mut out),
            Err(DecodeError::InvalidModuleRecord)
        );
    }

    #[test]
    fn damaged_records_are_refused() {
        let path: Vec<u16> = "C:\\app.exe".encode_utf16().collect();
        let mut good = [0_u8; 80];
        let size = encode_module_record(&load(path.len()), &path, &mut good).unwrap();
        assert_eq!(size, 80);
        let damaged = |offset: usize, value: u8| {
            let mut bad = good;
            bad[offset] = value;
            decode_module_record(&bad).map(|(record, _)| record.header)
        };
        assert_eq!(
            damaged(3, 3),
            Err(DecodeError::UnknownModuleEvent { value: 3 })
        );
        assert_eq!(damaged(6, 2), Err(DecodeError::UnknownFlags { bits: 2 }));
        assert_eq!(damaged(4, 13), Err(DecodeError::InvalidModuleRecord));
        assert_eq!(damaged(35, 1), Err(DecodeError::InvalidModuleRecord));
        assert_eq!(damaged(79, 1), Err(DecodeError::InvalidModuleRecord));
        assert_eq!(damaged(34, 64), Err(DecodeError::InvalidModuleRecord));
        assert_eq!(damaged(2, 4), Err(DecodeError::UnknownSource { value: 4 }));
        assert_eq!(
            decode_module_record(&good[..79]).map(|(record, _)| record.header),
            Err(DecodeError::Truncated {
                needed: 80,
                actual: 79
            })
        );
    }
}
