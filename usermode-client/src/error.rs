//! Everything that can go wrong talking to the driver, each with what to do
//! about it and its own exit code.

use std::fmt;

use kstack_abi::{
    ABI_VERSION, CaptureThreadsError, DecodeError, HostRoutine, Ioctl,
    ntstatus::{
        KSTACK_STATUS_NO_APC, KSTACK_STATUS_PAGING_EXECUTIVE_REQUIRED,
        KSTACK_STATUS_SOURCE_DISABLED, KSTACK_STATUS_STACK_TOO_LOW, NtStatus,
        STATUS_BUFFER_TOO_SMALL, STATUS_DEVICE_BUSY, STATUS_INVALID_BUFFER_SIZE,
        STATUS_INVALID_DEVICE_REQUEST, STATUS_INVALID_PARAMETER, STATUS_INVALID_PARAMETER_1,
        STATUS_INVALID_PARAMETER_2, STATUS_INVALID_PARAMETER_3, STATUS_INVALID_PARAMETER_4,
        STATUS_NOT_SUPPORTED, STATUS_REVISION_MISMATCH,
    },
};

use crate::{capture::format::CaptureError, thread_list::ThreadListError};

/// Win32 `ERROR_FILE_NOT_FOUND` / `ERROR_PATH_NOT_FOUND`: no such device.
const ERROR_FILE_NOT_FOUND: u32 = 2;
const ERROR_PATH_NOT_FOUND: u32 = 3;
/// Win32 `ERROR_ACCESS_DENIED`.
const ERROR_ACCESS_DENIED: u32 = 5;

/// Documented process exit codes (docs/client.md, "Exit codes").
pub mod exit_code {
    /// Command-line usage error (clap's code).
    pub const USAGE: u8 = 2;
    /// The driver is not installed or not running, or the command needs
    /// Windows.
    pub const DRIVER_UNAVAILABLE: u8 = 3;
    /// The device refused to open the handle (not elevated).
    pub const ACCESS_DENIED: u8 = 4;
    /// The driver refused the request.
    pub const REQUEST_REFUSED: u8 = 5;
    /// Driver and client speak different ABI versions.
    pub const ABI_MISMATCH: u8 = 6;
    /// The driver's reply could not be decoded.
    pub const MALFORMED_REPLY: u8 = 7;
    /// A file could not be read or written, or is not a usable capture.
    pub const FILE: u8 = 8;
    /// There were no records to analyze.
    pub const NO_RECORDS: u8 = 9;
    /// The command did its work, but a capture it read was cut short or
    /// damaged: what it lost is said on stderr, everything else was used.
    pub const INCOMPLETE_CAPTURE: u8 = 10;
}

/// A failure with its explanation.
#[derive(Debug, PartialEq, Eq)]
pub enum ClientError {
    /// Commands that talk to the driver need Windows (or Wine).
    #[cfg_attr(
        windows,
        allow(dead_code, reason = "only hosts without the device say this")
    )]
    NeedsWindows,
    /// `\\.\KStack` could not be opened.
    #[cfg_attr(
        not(windows),
        allow(dead_code, reason = "only the Windows transport opens the device")
    )]
    Open {
        /// The Win32 error.
        code: u32,
    },
    /// The driver completed a request with an error status.
    Refused {
        /// The request.
        request: Ioctl,
        /// The status.
        status: NtStatus,
    },
    /// The driver speaks another ABI version.
    AbiMismatch {
        /// The driver's version.
        driver: u32,
    },
    /// A configuration the driver would refuse, caught before sending.
    InvalidConfig(kstack_abi::ConfigError),
    /// A capture-threads request the driver would refuse, caught before
    /// sending.
    InvalidThreadRequest(CaptureThreadsError),
    /// The driver's status says it cannot queue the kernel APCs that
    /// capture other threads' stacks (Wine), so nothing was asked.
    NoApc {
        /// The driver's APC routine, as its status reports it.
        apc: HostRoutine,
    },
    /// The threads of a process could not be listed.
    ThreadList(ThreadListError),
    /// A read's header and records disagree.
    CountMismatch {
        /// Records the header declares.
        declared: u32,
        /// Records found.
        found: usize,
    },
    /// The driver's reply did not decode.
    Malformed {
        /// The request.
        request: Ioctl,
        /// What was wrong.
        error: DecodeError,
    },
    /// A file could not be read, created or written.
    File {
        /// The file.
        path: String,
        /// What was being done: `reading`, `creating`, `writing`.
        action: &'static str,
        /// The system's message.
        message: String,
    },
    /// An output file exists and `--force` was not given.
    Exists {
        /// The file.
        path: String,
    },
    /// An output path that is never written, `--force` or not.
    Unwritable {
        /// The path.
        path: String,
        /// Why: it is an input, or not a regular file.
        reason: &'static str,
    },
    /// A capture's per-process module maps were asked for, and it holds
    /// none: no listing of the processes, no module record.
    NoProcessModules {
        /// The capture.
        path: String,
    },
    /// A flamegraph or an export of no records was asked for.
    NoRecords {
        /// What was to be done with them: `draw`, `export`.
        to: &'static str,
    },
    /// A read on this reader failed earlier: the stacks that read carried
    /// count as sent to it, so it reads no more (a new handle does).
    ReaderFailed,
    /// A file is not a capture this client can read.
    Capture {
        /// The file.
        path: String,
        /// What is wrong with it.
        error: CaptureError,
    },
}

impl ClientError {
    /// The process exit code for this error.
    #[must_use]
    pub const fn exit_code(&self) -> u8 {
        match self {
            Self::Open {
                code: ERROR_ACCESS_DENIED,
            } => exit_code::ACCESS_DENIED,
            Self::NeedsWindows
            | Self::Open { .. }
            | Self::ThreadList(ThreadListError::NeedsWindows | ThreadListError::Snapshot { .. }) => {
                exit_code::DRIVER_UNAVAILABLE
            }
            Self::Refused { .. } | Self::NoApc { .. } => exit_code::REQUEST_REFUSED,
            Self::AbiMismatch { .. } => exit_code::ABI_MISMATCH,
            Self::InvalidConfig(_)
            | Self::InvalidThreadRequest(_)
            | Self::ThreadList(ThreadListError::NoThreads { .. }) => exit_code::USAGE,
            Self::Malformed { .. } | Self::CountMismatch { .. } | Self::ReaderFailed => {
                exit_code::MALFORMED_REPLY
            }
            Self::File { .. }
            | Self::Exists { .. }
            | Self::Unwritable { .. }
            | Self::Capture { .. } => exit_code::FILE,
            Self::NoRecords { .. } | Self::NoProcessModules { .. } => exit_code::NO_RECORDS,
        }
    }

    /// An I/O failure on `path`.
    #[must_use]
    pub fn file(path: &std::path::Path, action: &'static str, error: &std::io::Error) -> Self {
        Self::File {
            path: path.display().to_string(),
            action,
            message: error.to_string(),
        }
    }

    /// Classifies a decode failure of a reply to `request`.
    #[must_use]
    pub const fn from_reply(request: Ioctl, error: DecodeError) -> Self {
        match error {
            DecodeError::AbiVersion { theirs, .. } => Self::AbiMismatch { driver: theirs },
            error => Self::Malformed { request, error },
        }
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NeedsWindows => write!(
                f,
                "this command talks to the kstack driver and runs on Windows (or under Wine); \
                 offline analysis of saved captures works anywhere"
            ),
            Self::Open {
                code: ERROR_FILE_NOT_FOUND | ERROR_PATH_NOT_FOUND,
            } => write!(
                f,
                "the kstack driver is not running (\\\\.\\KStack does not exist). As Administrator:\n  \
                 sc.exe create kstack type= kernel start= demand binPath= C:\\path\\to\\kstack.sys\n  \
                 sc.exe start kstack"
            ),
            Self::Open {
                code: ERROR_ACCESS_DENIED,
            } => write!(
                f,
                "access denied opening \\\\.\\KStack: the device admits SYSTEM and Administrators only; \
                 run kstack from an elevated prompt"
            ),
            Self::Open { code } => write!(f, "cannot open \\\\.\\KStack: Win32 error {code}"),
            Self::Refused { request, status } => {
                write!(
                    f,
                    "the driver refused {}: {} (NTSTATUS {:#010x})",
                    request.name(),
                    explain(*status),
                    status
                )
            }
            Self::AbiMismatch { driver } => write!(
                f,
                "the driver speaks ABI version {driver}, this client {ABI_VERSION}: use the client built with \
                 the running kstack.sys"
            ),
            Self::InvalidConfig(error) => write!(f, "invalid configuration: {error}"),
            Self::InvalidThreadRequest(error) => {
                write!(f, "invalid capture-threads request: {error}")
            }
            Self::NoApc { apc } => write!(
                f,
                "the driver reports that {} {}: {}",
                kstack_abi::host_routine::APC_ROUTINE,
                apc.reason().unwrap_or("is not available"),
                explain(KSTACK_STATUS_NO_APC)
            ),
            Self::ThreadList(error) => error.fmt(f),
            Self::CountMismatch { declared, found } => write!(
                f,
                "the driver's read reply declares {declared} records but holds {found}"
            ),
            Self::Malformed { request, error } => {
                write!(
                    f,
                    "the driver's reply to {} is malformed: {error}",
                    request.name()
                )
            }
            Self::File {
                path,
                action,
                message,
            } => write!(f, "{action} {path}: {message}"),
            Self::Exists { path } => write!(
                f,
                "{path} exists; choose another name, or add --force to replace it"
            ),
            Self::Unwritable { path, reason } => {
                write!(f, "not writing {path}: {reason}; choose another name")
            }
            Self::Capture { path, error } => write!(f, "{path}: {error}"),
            Self::NoProcessModules { path } => write!(
                f,
                "{path} holds no user-mode module maps: no listing of the processes (a capture \
                 saved before format 2, or where none could be listed) and no module records; \
                 its user frames are named after no module"
            ),
            Self::NoRecords { to } => write!(
                f,
                "no records to {to}: enable a source (kstack config --enable timer), capture for a while \
                 (--duration 5), or {to} a saved capture (--input FILE)"
            ),
            Self::ReaderFailed => write!(
                f,
                "an earlier read on this handle failed, so stacks it carried may be missing from \
                 later reads; run the command again (a new handle gets every stack again)"
            ),
        }
    }
}

impl std::error::Error for ClientError {}

/// What a status from the driver means, in the driver's terms.
#[must_use]
pub fn explain(status: NtStatus) -> &'static str {
    match status {
        STATUS_INVALID_DEVICE_REQUEST => {
            "not a kstack request (is another driver answering \\\\.\\KStack?)"
        }
        STATUS_BUFFER_TOO_SMALL => "output buffer too small",
        STATUS_INVALID_BUFFER_SIZE => "a buffer has the wrong length for this request",
        STATUS_REVISION_MISMATCH => "the request's ABI version is not the driver's",
        STATUS_INVALID_PARAMETER => "a field is out of range",
        STATUS_INVALID_PARAMETER_1 => "unknown source in the source set",
        STATUS_INVALID_PARAMETER_2 => "frames to skip is out of range",
        STATUS_INVALID_PARAMETER_3 => "frames to capture is out of range",
        STATUS_INVALID_PARAMETER_4 => "the timer period is out of range",
        STATUS_DEVICE_BUSY => "another read, clear or configure request is in progress; try again",
        STATUS_NOT_SUPPORTED => "this kernel cannot provide that (the source is unavailable here)",
        KSTACK_STATUS_PAGING_EXECUTIVE_REQUIRED => {
            "the timer source walks stacks at DISPATCH_LEVEL, which is only safe when executive code cannot \
             be paged out. For a temporary diagnosis session set, as Administrator:\n  \
             reg add \"HKLM\\SYSTEM\\CurrentControlSet\\Control\\Session Manager\\Memory Management\" \
             /v DisablePagingExecutive /t REG_DWORD /d 1 /f\nthen reboot (the value applies from the next boot; \
             `kstack status` says whether it is in effect), and remove the value when done"
        }
        KSTACK_STATUS_STACK_TOO_LOW => {
            "the request reached the driver with less than 8 KiB of kernel stack left, too little for a \
             safe stack walk; nothing was walked (counted as skipped-stack in `kstack status`). Another \
             driver between this program and kstack (a filter) uses much of the stack: try again, or \
             capture from a callback source instead"
        }
        KSTACK_STATUS_SOURCE_DISABLED => {
            "the threadstack source is disabled, so no thread's stack was requested: enable it first \
             (kstack config --enable threadstack), then request again"
        }
        KSTACK_STATUS_NO_APC => {
            "this host cannot deliver the kernel APCs that capture other threads' stacks (under Wine, \
             KeInsertQueueApc is a stub that would end the host); nothing was queued. `kstack status` \
             shows why (apc)"
        }
        _ => "unexpected status",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_errors_say_what_to_do() {
        let missing = ClientError::Open {
            code: ERROR_FILE_NOT_FOUND,
        }
        .to_string();
        assert!(
            missing.contains("sc.exe create kstack") && missing.contains("sc.exe start kstack"),
            "{missing}"
        );
        let denied = ClientError::Open {
            code: ERROR_ACCESS_DENIED,
        };
        assert!(denied.to_string().contains("elevated"));
        assert_eq!(denied.exit_code(), exit_code::ACCESS_DENIED);
        assert_eq!(
            ClientError::Open {
                code: ERROR_PATH_NOT_FOUND
            }
            .exit_code(),
            exit_code::DRIVER_UNAVAILABLE
        );
    }

    #[test]
    fn abi_mismatch_shows_both_versions() {
        let error = ClientError::from_reply(
            Ioctl::Status,
            DecodeError::AbiVersion {
                ours: ABI_VERSION,
                theirs: 9,
            },
        );
        assert_eq!(error, ClientError::AbiMismatch { driver: 9 });
        let text = error.to_string();
        assert!(
            text.contains("ABI version 9") && text.contains(&format!("this client {ABI_VERSION}")),
            "{text}"
        );
        assert_eq!(error.exit_code(), exit_code::ABI_MISMATCH);
    }

    #[test]
    fn the_paging_refusal_explains_the_fix() {
        let text = ClientError::Refused {
            request: Ioctl::Configure,
            status: KSTACK_STATUS_PAGING_EXECUTIVE_REQUIRED,
        }
        .to_string();
        assert!(
            text.contains("DisablePagingExecutive /t REG_DWORD /d 1") && text.contains("reboot"),
            "{text}"
        );
        assert!(text.contains("0xe0b50001"), "{text}");
    }

    #[test]
    fn the_capture_threads_refusals_say_what_to_do() {
        let disabled = ClientError::Refused {
            request: Ioctl::CaptureThreads,
            status: KSTACK_STATUS_SOURCE_DISABLED,
        }
        .to_string();
        assert!(
            disabled.contains("--enable threadstack") && disabled.contains("0xe0b50004"),
            "{disabled}"
        );
        let no_apc = ClientError::Refused {
            request: Ioctl::CaptureThreads,
            status: KSTACK_STATUS_NO_APC,
        }
        .to_string();
        assert!(
            no_apc.contains("APCs") && no_apc.contains("Wine") && no_apc.contains("0xe0b50005"),
            "{no_apc}"
        );
    }

    #[test]
    fn a_host_without_apcs_is_explained_before_anything_is_asked() {
        let error = ClientError::NoApc {
            apc: HostRoutine::HostStub,
        };
        let text = error.to_string();
        assert!(
            text.contains("KeInsertQueueApc is exported by the host (Wine) only as a stub")
                && text.contains("under Wine")
                && text.contains("`kstack status` shows why"),
            "{text}"
        );
        assert_eq!(error.exit_code(), exit_code::REQUEST_REFUSED);
    }

    #[test]
    fn thread_listing_and_request_errors_have_their_exit_codes() {
        let missing = ClientError::ThreadList(ThreadListError::NoThreads { process_id: 9 });
        assert!(missing.to_string().contains("process 9"), "{missing}");
        assert_eq!(missing.exit_code(), exit_code::USAGE);
        assert_eq!(
            ClientError::ThreadList(ThreadListError::NeedsWindows).exit_code(),
            exit_code::DRIVER_UNAVAILABLE
        );
        let bad = ClientError::InvalidThreadRequest(CaptureThreadsError::Timeout { value: 0 });
        assert_eq!(
            bad.to_string(),
            "invalid capture-threads request: timeout is 0 ms; it must be 1 to 60000 ms"
        );
        assert_eq!(bad.exit_code(), exit_code::USAGE);
    }

    #[test]
    fn exit_codes_are_distinct() {
        let codes = [
            exit_code::USAGE,
            exit_code::DRIVER_UNAVAILABLE,
            exit_code::ACCESS_DENIED,
            exit_code::REQUEST_REFUSED,
            exit_code::ABI_MISMATCH,
            exit_code::MALFORMED_REPLY,
            exit_code::FILE,
            exit_code::NO_RECORDS,
            exit_code::INCOMPLETE_CAPTURE,
        ];
        for (i, a) in codes.iter().enumerate() {
            assert!(!codes[i + 1..].contains(a));
        }
    }
}
