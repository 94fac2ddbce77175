//! kstack's driver/client protocol, defined once for both sides.
//!
//! The driver (`no_std`, kernel mode) and the client (user mode, and offline
//! analysis on any host) both depend on this crate; no layout, code or limit
//! is written anywhere else. Everything crosses the boundary as explicit
//! little-endian bytes, decoded with bounds checks: a kernel driver never
//! trusts a user buffer, and a client never trusts a driver reply.
//!
//! - [`Ioctl`]: control codes, required access, accepted buffer lengths.
//! - [`messages`]: status, configure, read and capture-now layouts.
//! - [`CaptureConfig`]: what to capture, validated here.
//! - [`record`]: the trace record, with an ETW-shaped frame part.
//! - [`module_record`]: image loads and process exits, which name user
//!   frames per process.
//! - [`ntstatus`]: the statuses the driver completes requests with.
//! - [`paging`]: `DisablePagingExecutive`, configured and in effect.
//! - [`user_part`]: what happened to each record's user-mode frames.
//! - [`thread_capture`]: other threads' stacks on request, through
//!   special kernel APCs.

#![cfg_attr(not(test), no_std)]

pub mod altitude;
pub mod config;
mod error;
pub mod host_routine;
pub mod ioctl;
mod limits;
pub mod messages;
pub mod module_record;
pub mod ntstatus;
pub mod paging;
pub mod record;
pub mod source;
pub mod source_facts;
pub mod thread_capture;
pub mod user_part;
mod wire;
mod wire_types;

pub use altitude::Altitude;
pub use config::{CaptureConfig, ConfigError, MAX_PROCESS_IDS, ProcessFilter};
pub use error::DecodeError;
pub use host_routine::HostRoutine;
pub use ioctl::{Access, Ioctl, RequestError};
pub use messages::{
    DriverImage, ReadHeader, SourceStatus, StackTableStatus, StatusResponse, ThreadCaptureStatus,
};
pub use module_record::{ModuleEvent, ModuleFlags, ModuleHeader, ModuleRecord};
pub use paging::{PagingExecutive, PagingInEffect};
pub use record::{
    Entry, MAX_FRAMES, MAX_RECORD_SIZE, MAX_SHARDS, MIN_RECORD_SIZE, RecordFlags, RecordHeader,
    RecordView, Records, by_id_record_size, decode_entry, decode_record, encode_record,
    record_flags, record_os_hash, record_size, record_size_field, record_timestamp,
    set_record_os_hash, stack_id,
};
pub use source::{Source, SourceSet};
pub use source_facts::SourceFacts;
pub use thread_capture::{
    CaptureThreadsError, CaptureThreadsReply, CaptureThreadsRequest, ThreadRequestOutcome,
};
pub use user_part::UserPart;

/// The protocol version. Bump it whenever any layout, code or meaning in
/// this crate changes; driver and client refuse to talk across versions.
pub const ABI_VERSION: u32 = 14;

/// The kstack release these crates belong to (major, minor, patch).
pub const KSTACK_VERSION: (u16, u16, u16) = (
    parse_version_part(env!("CARGO_PKG_VERSION_MAJOR")),
    parse_version_part(env!("CARGO_PKG_VERSION_MINOR")),
    parse_version_part(env!("CARGO_PKG_VERSION_PATCH")),
);

const fn parse_version_part(digits: &str) -> u16 {
    let digits = digits.as_bytes();
    let mut value: u16 = 0;
    let mut i = 0;
    while i < digits.len() {
        assert!(digits[i].is_ascii_digit(), "version parts are decimal");
        value = value * 10 + (digits[i] - b'0') as u16;
        i += 1;
    }
    value
}

/// The service name `sc.exe` knows the driver by.
pub const SERVICE_NAME: &str = "kstack";
/// The driver image's file name, in the package and in the service's
/// `binPath` (and `inf/kstack.inx`).
pub const DRIVER_FILE_NAME: &str = "kstack.sys";
/// The subkey of the service key that holds the driver's settings.
pub const PARAMETERS_KEY: &str = "Parameters";
/// The `REG_DWORD` under [`PARAMETERS_KEY`] that sets the ring's capacity in
/// KiB, over all its shards: 16 to 147456 (144 MiB), 9216 (9 MiB) when
/// absent, a value outside brought to the nearer bound; read at load (see
/// `kstack_driver_core::sharded_ring`). Status reports the capacity in
/// force, in bytes. (Up to ABI 5 the value counted 576-byte records.)
pub const RING_CAPACITY_VALUE: &str = "RingCapacity";
/// The `REG_DWORD` under [`PARAMETERS_KEY`] that sets the stack table's
/// entries (see [`RecordFlags::STACK_BY_ID`]): 4096 when absent, 0 turns
/// the table off, otherwise brought down to a power of two of at most
/// 65536; read at load. Each entry takes 544 bytes of non-paged pool
/// (4096: 2.1 MiB). Status reports the entries in force.
pub const STACK_TABLE_ENTRIES_VALUE: &str = "StackTableEntries";
/// The kernel name of the device object.
pub const DEVICE_NAME: &str = r"\Device\KStack";
/// The symbolic link that makes the device reachable from user mode.
pub const DOS_DEVICE_NAME: &str = r"\DosDevices\KStack";
/// The path user mode opens.
pub const USER_DEVICE_PATH: &str = r"\\.\KStack";

/// [`DEVICE_NAME`] as UTF-16, for a kernel `UNICODE_STRING`.
pub const DEVICE_NAME_UTF16: [u16; DEVICE_NAME.len()] = ascii_to_utf16(DEVICE_NAME);
/// [`DOS_DEVICE_NAME`] as UTF-16, for a kernel `UNICODE_STRING`.
pub const DOS_DEVICE_NAME_UTF16: [u16; DOS_DEVICE_NAME.len()] = ascii_to_utf16(DOS_DEVICE_NAME);

/// UTF-16 of an ASCII string, at compile time.
///
/// # Panics
/// When `text` is not `N` ASCII characters (a compile error in const use).
#[must_use]
pub const fn ascii_to_utf16<const N: usize>(text: &str) -> [u16; N] {
    let bytes = text.as_bytes();
    assert!(bytes.len() == N, "length must match");
    let mut out = [0; N];
    let mut i = 0;
    while i < N {
        assert!(bytes[i].is_ascii(), "ASCII only");
        out[i] = bytes[i] as u16;
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_parts_parse_every_digit() {
        assert_eq!(parse_version_part("0"), 0);
        assert_eq!(parse_version_part("7"), 7);
        assert_eq!(parse_version_part("123"), 123);
    }

    #[test]
    fn names_agree_with_each_other() {
        assert!(DOS_DEVICE_NAME.ends_with(DEVICE_NAME.rsplit('\\').next().unwrap()));
        assert!(USER_DEVICE_PATH.ends_with(DEVICE_NAME.rsplit('\\').next().unwrap()));
        assert_eq!(String::from_utf16(&DEVICE_NAME_UTF16).unwrap(), DEVICE_NAME);
        assert_eq!(
            String::from_utf16(&DOS_DEVICE_NAME_UTF16).unwrap(),
            DOS_DEVICE_NAME
        );
    }

    #[test]
    fn version_is_the_package_version() {
        let (major, minor, patch) = KSTACK_VERSION;
        assert_eq!(
            format!("{major}.{minor}.{patch}"),
            env!("CARGO_PKG_VERSION")
        );
    }
}
