//! What identifies a module's image and its symbols, so a capture can be
//! named on another machine, later: the image's timestamp and size (how a
//! symbol server files the image) and its `CodeView` record, the PDB's name,
//! GUID and age (how it files the PDB). Read from the image's PE headers and
//! debug directory, on any host.

use std::{
    fmt::{self, Write as _},
    fs::File,
    path::Path,
};

use object::{Object as _, read::pe::PeFile64};

/// An image's identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageIdentity {
    /// `IMAGE_FILE_HEADER.TimeDateStamp`.
    pub timestamp: u32,
    /// `IMAGE_OPTIONAL_HEADER.SizeOfImage`.
    pub size_of_image: u32,
    /// Its PDB's identity, when the image has a `CodeView` (`RSDS`) record.
    pub debug: Option<DebugIdentity>,
}

/// A PDB's identity, as the image's `CodeView` record gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DebugIdentity {
    /// The PDB's file name (the record holds the build's path; only the
    /// name is kept, which is what symbol servers file it under).
    pub pdb_name: String,
    /// The PDB's GUID, as the record stores it (the first three fields
    /// little-endian).
    pub guid: [u8; 16],
    /// The PDB's age.
    pub age: u32,
}

impl DebugIdentity {
    /// The GUID and age as a symbol server's folder names them: the GUID's
    /// 32 hex digits as its text form prints them, then the age in hex,
    /// upper case (`name.pdb/<this>/name.pdb`).
    #[must_use]
    pub fn symbol_server_key(&self) -> String {
        format!("{}{:X}", self.guid_text(), self.age)
    }

    /// The GUID's 32 hex digits, upper case, as its text form orders them.
    #[must_use]
    pub fn guid_text(&self) -> String {
        let g = &self.guid;
        let data1 = u32::from_le_bytes([g[0], g[1], g[2], g[3]]);
        let data2 = u16::from_le_bytes([g[4], g[5]]);
        let data3 = u16::from_le_bytes([g[6], g[7]]);
        let mut text = format!("{data1:08X}{data2:04X}{data3:04X}");
        for byte in &g[8..] {
            let _ = write!(text, "{byte:02X}");
        }
        text
    }
}

impl fmt::Display for ImageIdentity {
    /// `timestamp 0x…, size 0x…, pdb kstack.pdb <GUID><age>` (or `no pdb`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "timestamp {:#010x}, size {:#x}, ",
            self.timestamp, self.size_of_image
        )?;
        match &self.debug {
            Some(debug) => write!(f, "pdb {} {}", debug.pdb_name, debug.symbol_server_key()),
            None => f.write_str("no pdb"),
        }
    }
}

/// The identity of the PE32+ image in `data` (a file's bytes), or why not.
///
/// # Errors
/// The PE parser's message: not a 64-bit PE image, or a damaged header or
/// debug directory.
pub fn of_image<'data, R: object::ReadRef<'data>>(data: R) -> Result<ImageIdentity, String> {
    let image = PeFile64::parse(data).map_err(|error| error.to_string())?;
    let headers = image.nt_headers();
    let debug = image
        .pdb_info()
        .map_err(|error| error.to_string())?
        .map(|codeview| {
            let path = String::from_utf8_lossy(codeview.path());
            let pdb_name = path
                .rsplit(['\\', '/'])
                .next()
                .unwrap_or_default()
                .to_owned();
            DebugIdentity {
                pdb_name,
                guid: codeview.guid(),
                age: codeview.age(),
            }
        });
    Ok(ImageIdentity {
        timestamp: headers
            .file_header
            .time_date_stamp
            .get(object::LittleEndian),
        size_of_image: headers
            .optional_header
            .size_of_image
            .get(object::LittleEndian),
        debug,
    })
}

/// The identity of the image file at `path`, reading only the headers and
/// the debug directory (a kernel image is megabytes), or why not.
///
/// # Errors
/// The file cannot be opened, or [`of_image`]'s errors.
pub fn of_file(path: &Path) -> Result<ImageIdentity, String> {
    let file = File::open(path).map_err(|error| format!("{}: {error}", path.display()))?;
    let cache = object::ReadCache::new(file);
    of_image(&cache).map_err(|error| format!("{}: {error}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_symbol_server_key_is_the_guid_text_then_the_age() {
        let identity = DebugIdentity {
            pdb_name: "kstack.pdb".to_owned(),
            // {3A1C2F8E-4B5D-6E7F-8091-A2B3C4D5E6F7} as stored.
            guid: [
                0x8E, 0x2F, 0x1C, 0x3A, 0x5D, 0x4B, 0x7F, 0x6E, 0x80, 0x91, 0xA2, 0xB3, 0xC4, 0xD5,
                0xE6, 0xF7,
            ],
            age: 0x1B,
        };
        assert_eq!(
            identity.symbol_server_key(),
            "3A1C2F8E4B5D6E7F8091A2B3C4D5E6F71B"
        );
        let image = ImageIdentity {
            timestamp: 0x6543_2100,
            size_of_image: 0x13000,
            debug: Some(identity),
        };
        assert_eq!(
            image.to_string(),
            "timestamp 0x65432100, size 0x13000, pdb kstack.pdb 3A1C2F8E4B5D6E7F8091A2B3C4D5E6F71B"
        );
    }

    #[test]
    fn what_is_not_a_pe_image_says_so() {
        assert!(of_image(&b"MZ not really"[..]).is_err());
        assert!(of_file(Path::new("/nonexistent/kstack.sys")).is_err());
    }
}
