//! The capture file format (`kstack save`, `kstack sample`): the module
//! lists at save time, then the records exactly as the ABI encodes them, so
//! offline analysis (`--input`) works on any host, Linux included, and
//! symbolizes like a live session. Here: the layout, what this client
//! reads, its errors, and the module entries' encoding; `capture::writer`
//! writes it, `capture::reader` reads it.
//!
//! Format 7 (this client writes it), little-endian:
//! - 0: magic `KSTKCAP\0`; 8: format version (u32, [`FORMAT_VERSION`]);
//!   12: zero (where formats 1 to 6 kept the records' ABI version, which is
//!   never zero); 16: the ABI version of the records (u32); 20: CRC32C of
//!   bytes 0 to 20 (u32). A damaged fixed header refuses the file.
//! - then blocks (`capture::block`: magic, CRC32C, kind, length, entries
//!   before it, payload), written as the capture goes:
//!   - `Start`, first: the kernel's module count (u32), when the processes
//!     were listed (u64, the record clock's units; all ones: not known),
//!     and the module entries;
//!   - one `Process` per running process listed at the start: its id
//!     (u32), its module count (u32) and its module entries: the user-mode
//!     modules live commands named user frames after;
//!   - `Entries`, one or more per batch the driver returned, each written
//!     whole before the next read: entries back to back (below);
//!   - `LoadedImages`, right before the entries block whose module records
//!     loaded them: a count (u32) and module entries each with its
//!     identity, read while the capture was saved (the images of drivers
//!     and DLLs loaded during it, which no list at its start holds);
//!   - `End`, last: the count of entries (u64). A file without it was cut
//!     short; it reads up to its last whole block.
//! - A module entry: base (u64), size (u32), name length (u16), flags
//!   (u16), the name in UTF-8; when flags bit 0 is set, the image's
//!   identity: its timestamp (u32) and `SizeOfImage` (u32); when bit 1 is
//!   also set, its PDB's: GUID (16 bytes, as the `CodeView` record stores
//!   it), age (u32), PDB name length (u16), the PDB name in UTF-8 (see
//!   `naming::identity`).
//! - Entries, in kstack-abi's record layout: each stack is stored once, in
//!   the first record that has it (flagged `STACK_BY_ID`), and later
//!   records with the same stack name it by its id and hold no frames,
//!   exactly as the driver sends them to a reader; the driver's module
//!   records are among them, as received, so offline analysis names user
//!   frames after the same time-ordered per-process maps as the live
//!   client; and `kstack sample`'s own entries of a sample's thread facts
//!   (`capture::sample_entry`, byte 2 `FILE_ENTRY_KIND`): one right after
//!   each record its requests asked for, and one alone for a sample that
//!   repeats its thread's last captured stack, which reads as a copy of the
//!   last thread-stack record of that thread before it, with the entry's
//!   time and facts.
//!
//! A damaged block is skipped and reading goes on at the next intact one
//! (`capture::reader` counts what was lost): a record whose stack was
//! stored only in lost bytes reads with no frames, as lost, and a repeated
//! sample whose thread's last capture may have been lost is left out and
//! counted.
//!
//! Formats 1 to 6 (`capture::legacy` reads them) hold the same parts in one
//! run without checksums: 0: magic; 8: format version; 12: the ABI
//! version; 16: module count (u32); 20: process count (u32; format 1:
//! reserved, zero); (format 3 on) 24: when the processes were listed (u64);
//! the module entries (flags zero before format 4); (format 2 on) per
//! process its id, module count and module entries; the entries (sample
//! entries from format 6); (format 5 on) the loaded images' count and
//! entries; then the trailer: magic `KSTKEND\0`, the count of entries (u64)
//! and (format 5 on) the length in bytes of the loaded images' part (u64).

use std::{
    fmt,
    io::{self, Write},
};

use kstack_abi::{ABI_VERSION, DecodeError};

use crate::naming::{
    identity::{DebugIdentity, ImageIdentity},
    modules::{Module, ModuleMap},
};

/// The first bytes of every capture file.
pub const MAGIC: [u8; 8] = *b"KSTKCAP\0";
/// The version of this layout. Versions 1 (no process modules), 2 (no
/// listing time), 3 (no image identities), 4 (no identities of images
/// loaded during the capture), 5 (no sample entries) and 6 (no blocks)
/// still read.
pub const FORMAT_VERSION: u32 = 7;
/// The layouts this client reads.
pub(crate) const READABLE_FORMATS: core::ops::RangeInclusive<u32> = 1..=FORMAT_VERSION;
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
pub(crate) const READABLE_ABIS: core::ops::RangeInclusive<u32> = 5..=ABI_VERSION;
/// Format 7's fixed header: magic, version, zero, ABI, CRC32C.
pub(crate) const FIXED_HEADER_SIZE: usize = 24;
/// The first bytes of the trailer (formats 1 to 6).
pub(crate) const END_MAGIC: [u8; 8] = *b"KSTKEND\0";
/// The header of formats 3 to 6; formats 1 and 2 end it at 24.
pub(crate) const HEADER_SIZE: usize = 32;
pub(crate) const OLD_HEADER_SIZE: usize = 24;
/// The trailer of formats 5 and 6.
pub(crate) const TRAILER_SIZE: usize = 24;
/// The trailer of formats 1 to 4: no loaded images' identities.
pub(crate) const OLD_TRAILER_SIZE: usize = 16;
pub(crate) const MODULE_ENTRY_SIZE: usize = 16;
/// Module entry flags (format 4 on): the image's identity follows the name.
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
    /// Format 7's fixed header does not match its checksum.
    HeaderDamaged,
    /// The header or module list ends early.
    Truncated,
    /// No trailer: the save was cut short (formats 1 to 6).
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
            Self::HeaderDamaged => write!(
                f,
                "the capture's first 24 bytes (its version) are damaged: nothing in it can be read \
                 with confidence"
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

/// Format 7's fixed header for records of `abi`.
pub(crate) fn fixed_header(abi: u32) -> [u8; FIXED_HEADER_SIZE] {
    let mut header = [0_u8; FIXED_HEADER_SIZE];
    header[..8].copy_from_slice(&MAGIC);
    header[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    header[16..20].copy_from_slice(&abi.to_le_bytes());
    let crc = crc32c::crc32c(&header[..20]);
    header[20..].copy_from_slice(&crc.to_le_bytes());
    header
}

/// Writes each module's entry, name and identity.
pub(crate) fn write_modules(out: &mut impl Write, modules: &ModuleMap) -> io::Result<()> {
    write_entries(
        out,
        modules
            .modules()
            .iter()
            .map(|module| (module, modules.identity(module))),
    )
}

/// Writes each module's entry, name and identity, when it has one.
pub(crate) fn write_entries<'m>(
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

/// Reads `count` module entries of a capture of `format` at `at`, moving
/// `at` past them: each module, with the identity read with it; `read`
/// counts every module read so far (errors name a module by it).
pub(crate) fn read_modules(
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
