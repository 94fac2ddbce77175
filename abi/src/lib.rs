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

#![cfg_attr(not(test), no_std)]

pub mod altitude;
pub mod config;
pub mod host_routine;
pub mod ioctl;
pub mod messages;
pub mod module_record;
pub mod ntstatus;
pub mod paging;
pub mod record;
pub mod source;
pub mod user_part;
mod wire;

pub use altitude::Altitude;
pub use config::{CaptureConfig, ConfigError, MAX_PROCESS_IDS, ProcessFilter};
pub use host_routine::HostRoutine;
pub use ioctl::{Access, Ioctl, RequestError};
pub use messages::{DriverImage, ReadHeader, SourceStatus, StackTableStatus, StatusResponse};
pub use module_record::{ModuleEvent, ModuleFlags, ModuleHeader, ModuleRecord};
pub use paging::{PagingExecutive, PagingInEffect};
pub use record::{
    Entry, MAX_FRAMES, MAX_RECORD_SIZE, MAX_SHARDS, MIN_RECORD_SIZE, RecordFlags, RecordHeader,
    RecordView, Records, by_id_record_size, decode_entry, decode_record, encode_record,
    record_flags, record_os_hash, record_size, record_size_field, record_timestamp,
    set_record_os_hash, stack_id,
};
pub use source::{Source, SourceFacts, SourceSet};
pub use user_part::UserPart;

use crate::ntstatus::{
    NtStatus, STATUS_INVALID_BUFFER_SIZE, STATUS_INVALID_PARAMETER, STATUS_REVISION_MISMATCH,
};

/// The protocol version. Bump it whenever any layout, code or meaning in
/// this crate changes; driver and client refuse to talk across versions.
pub const ABI_VERSION: u32 = 11;

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

/// Why bytes could not be decoded: a request the driver refuses, or a reply
/// the client cannot trust.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// Fewer bytes than the layout needs.
    Truncated {
        /// Bytes needed.
        needed: usize,
        /// Bytes present.
        actual: usize,
    },
    /// A message that must be exactly `expected` bytes is not.
    Length {
        /// Its size.
        expected: usize,
        /// Bytes present.
        actual: usize,
    },
    /// The other side speaks another ABI version.
    AbiVersion {
        /// This side's [`ABI_VERSION`].
        ours: u32,
        /// The version in the message.
        theirs: u32,
    },
    /// The message's `size` word disagrees with its layout.
    SizeField {
        /// The layout's size.
        expected: usize,
        /// The size the message declares.
        declared: u32,
    },
    /// A configuration field is out of range.
    Config(ConfigError),
    /// A record claims more frames than a record can hold.
    TooManyFrames {
        /// The claimed count.
        count: usize,
    },
    /// A record's size does not match its frame count.
    RecordSizeMismatch {
        /// The record's size word.
        size: usize,
        /// Its frame count.
        frame_count: u16,
    },
    /// A record names a shard past [`MAX_SHARDS`].
    ShardOutOfRange {
        /// The shard it names.
        shard: u16,
    },
    /// A record names no known source.
    UnknownSource {
        /// The wire value.
        value: u8,
    },
    /// Flag bits this version does not define.
    UnknownFlags {
        /// The bits received.
        bits: u32,
    },
    /// A record's fact words are not valid for its source.
    InvalidFacts {
        /// The record's source.
        source: Source,
    },
    /// A status's paging state is unknown or contradicts its value.
    PagingState {
        /// The state's wire value.
        value: u32,
    },
    /// A record without frames ([`RecordFlags::STACK_BY_ID`]) names a stack
    /// id that no earlier record carried frames for.
    UnknownStack {
        /// The stack id.
        stack_id: u64,
    },
    /// A record's user part is longer than its stack.
    UserFrames {
        /// The record's `user_frame_count`.
        user_frame_count: u8,
        /// Its `frame_count`.
        frame_count: u16,
    },
    /// A record's `user_part` is no known [`UserPart`].
    UnknownUserPart {
        /// The wire value.
        value: u8,
    },
    /// A status names a routine state that is no [`HostRoutine`].
    HostRoutine {
        /// The wire value.
        value: u32,
    },
    /// A test fault-probe request names no known target.
    UnknownProbeTarget {
        /// The target word received.
        value: u64,
    },
    /// A module record's event value is not a [`ModuleEvent`].
    UnknownModuleEvent {
        /// The value.
        value: u8,
    },
    /// A module record whose size disagrees with its path, whose path is
    /// too long, whose padding or reserved byte is not zero, whose shard
    /// is out of range, or a process exit that names an image.
    InvalidModuleRecord,
}

impl From<ConfigError> for DecodeError {
    fn from(error: ConfigError) -> Self {
        Self::Config(error)
    }
}

impl DecodeError {
    /// The status the driver completes a request with when its input fails
    /// to decode.
    #[must_use]
    pub const fn ntstatus(self) -> NtStatus {
        match self {
            Self::AbiVersion { .. } => STATUS_REVISION_MISMATCH,
            Self::Config(error) => error.ntstatus(),
            Self::Truncated { .. } | Self::Length { .. } | Self::SizeField { .. } => {
                STATUS_INVALID_BUFFER_SIZE
            }
            Self::TooManyFrames { .. }
            | Self::RecordSizeMismatch { .. }
            | Self::ShardOutOfRange { .. }
            | Self::UnknownSource { .. }
            | Self::UnknownFlags { .. }
            | Self::InvalidFacts { .. }
            | Self::PagingState { .. }
            | Self::UnknownStack { .. }
            | Self::UserFrames { .. }
            | Self::UnknownUserPart { .. }
            | Self::HostRoutine { .. }
            | Self::UnknownProbeTarget { .. }
            | Self::UnknownModuleEvent { .. }
            | Self::InvalidModuleRecord => STATUS_INVALID_PARAMETER,
        }
    }
}

impl core::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            Self::Truncated { needed, actual } => {
                write!(f, "truncated: {actual} bytes where {needed} are needed")
            }
            Self::Length { expected, actual } => {
                write!(f, "{actual} bytes where exactly {expected} are expected")
            }
            Self::AbiVersion { ours, theirs } => {
                write!(
                    f,
                    "ABI version mismatch: this side speaks {ours}, the other side {theirs}"
                )
            }
            Self::SizeField { expected, declared } => {
                write!(
                    f,
                    "message declares {declared} bytes; its layout has {expected}"
                )
            }
            Self::Config(error) => write!(f, "invalid configuration: {error}"),
            Self::TooManyFrames { count } => {
                write!(f, "{count} frames; a record holds at most {MAX_FRAMES}")
            }
            Self::RecordSizeMismatch { size, frame_count } => {
                write!(f, "record of {size} bytes cannot hold {frame_count} frames")
            }
            Self::ShardOutOfRange { shard } => {
                write!(f, "shard {shard}; a driver keeps at most {MAX_SHARDS}")
            }
            Self::UnknownSource { value } => write!(f, "unknown source {value}"),
            Self::UnknownFlags { bits } => write!(f, "unknown flag bits {bits:#x}"),
            Self::InvalidFacts { source } => {
                write!(f, "invalid facts for a {} record", source.name())
            }
            Self::PagingState { value } => write!(
                f,
                "paging state {value} is unknown or contradicts the DisablePagingExecutive value"
            ),
            Self::UnknownStack { stack_id } => write!(
                f,
                "a record names stack {stack_id:#018x}, whose frames no earlier record carried"
            ),
            Self::UserFrames {
                user_frame_count,
                frame_count,
            } => write!(
                f,
                "a record says {user_frame_count} of its {frame_count} frames are user frames"
            ),
            Self::UnknownUserPart { value } => write!(f, "unknown user-part state {value}"),
            Self::HostRoutine { value } => write!(f, "unknown host-routine state {value}"),
            Self::UnknownProbeTarget { value } => {
                write!(f, "unknown fault-probe target {value}")
            }
            Self::UnknownModuleEvent { value } => write!(f, "unknown module event {value}"),
            Self::InvalidModuleRecord => write!(
                f,
                "a module record's size, path, padding, shard or image contradicts its layout"
            ),
        }
    }
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
    fn decode_errors_say_what_was_wrong() {
        let texts = [
            (
                DecodeError::Truncated {
                    needed: 8,
                    actual: 2,
                },
                "truncated: 2 bytes where 8 are needed",
            ),
            (
                DecodeError::Length {
                    expected: 24,
                    actual: 25,
                },
                "25 bytes where exactly 24 are expected",
            ),
            (
                DecodeError::AbiVersion { ours: 5, theirs: 4 },
                "ABI version mismatch: this side speaks 5, the other side 4",
            ),
            (
                DecodeError::SizeField {
                    expected: 24,
                    declared: 9,
                },
                "message declares 9 bytes; its layout has 24",
            ),
            (DecodeError::UnknownSource { value: 9 }, "unknown source 9"),
            (
                DecodeError::UnknownFlags { bits: 0x10 },
                "unknown flag bits 0x10",
            ),
            (
                DecodeError::PagingState { value: 7 },
                "paging state 7 is unknown or contradicts the DisablePagingExecutive value",
            ),
        ];
        for (error, text) in texts {
            assert_eq!(error.to_string(), text);
        }
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

    #[test]
    fn decode_errors_map_to_request_statuses() {
        assert_eq!(
            DecodeError::AbiVersion {
                ours: ABI_VERSION,
                theirs: 0xEE
            }
            .ntstatus(),
            STATUS_REVISION_MISMATCH
        );
        assert_eq!(
            DecodeError::Length {
                expected: 1,
                actual: 2
            }
            .ntstatus(),
            STATUS_INVALID_BUFFER_SIZE
        );
        assert_eq!(
            DecodeError::Config(ConfigError::FramesToCapture { value: 0 }).ntstatus(),
            ConfigError::FramesToCapture { value: 0 }.ntstatus()
        );
    }
}
