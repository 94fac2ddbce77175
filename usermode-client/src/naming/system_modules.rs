//! The kernel's loaded-module list, as `NtQuerySystemInformation`
//! (`SystemModuleInformation`) returns it: an `RTL_PROCESS_MODULES`.
//!
//! The layout is parsed here, portably, so it is tested on any host; only
//! [`query`] (Windows) calls the system. On Windows 11 24H2 and later the
//! kernel addresses in that list are zero unless the caller holds
//! `SeDebugPrivilege`, which [`query`] enables first (Administrators have it).
//! Wine returns a short, made-up list, so the client always adds kstack.sys
//! as the driver itself reports it (see `ModuleMap::with_authoritative`).

use std::path::PathBuf;

use crate::naming::modules::Module;

/// One entry of the kernel's list: the module, and its path as the
/// kernel spells it (`\SystemRoot\system32\ntoskrnl.exe`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SystemModule {
    /// Base, size and file name.
    pub module: Module,
    /// `FullPathName`.
    pub path: String,
}

/// Where a kernel path (`FullPathName`) is as a Win32 path, given the
/// Windows folder (`%SystemRoot%`, e.g. `C:\Windows`): `\SystemRoot\...`
/// under it, `\??\C:\...` and `C:\...` as they are, and a rooted path
/// (`\Windows\...`) on the Windows folder's drive; `None` for anything
/// else (a device path).
#[must_use]
pub fn win32_path(kernel_path: &str, system_root: &str) -> Option<PathBuf> {
    let lower = kernel_path.to_ascii_lowercase();
    let has_drive = |path: &str| {
        let bytes = path.as_bytes();
        bytes.len() >= 3 && bytes[0].is_ascii_alphabetic() && bytes[1] == b':' && bytes[2] == b'\\'
    };
    if lower.starts_with("\\systemroot\\") {
        let rest = &kernel_path["\\SystemRoot".len()..];
        return Some(PathBuf::from(format!(
            "{}{rest}",
            system_root.trim_end_matches('\\')
        )));
    }
    for prefix in ["\\??\\", "\\\\?\\"] {
        if let Some(rest) = kernel_path.strip_prefix(prefix) {
            return has_drive(rest).then(|| PathBuf::from(rest));
        }
    }
    if has_drive(kernel_path) {
        return Some(PathBuf::from(kernel_path));
    }
    let drive = system_root
        .get(..2)
        .filter(|drive| has_drive(&format!("{drive}\\")))?;
    (kernel_path.starts_with('\\') && !kernel_path.starts_with("\\Device\\"))
        .then(|| PathBuf::from(format!("{drive}{kernel_path}")))
}

/// `RTL_PROCESS_MODULES.Modules` starts here (x64: a ULONG count, padded).
const MODULES_OFFSET: usize = 8;
/// `sizeof(RTL_PROCESS_MODULE_INFORMATION)` on x64.
const ENTRY_SIZE: usize = 296;
const IMAGE_BASE: usize = 16;
const IMAGE_SIZE: usize = 24;
const OFFSET_TO_FILE_NAME: usize = 38;
const FULL_PATH_NAME: usize = 40;
const FULL_PATH_NAME_SIZE: usize = 256;

/// Why a module list could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModuleListError {
    /// The reply is shorter than its module count says.
    Truncated {
        /// Modules announced.
        count: u32,
        /// Bytes received.
        bytes: usize,
    },
    /// The system call failed with this NTSTATUS.
    Query(i32),
}

impl std::fmt::Display for ModuleListError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Self::Truncated { count, bytes } => write!(
                f,
                "the system module list announces {count} modules but has only {bytes} bytes"
            ),
            Self::Query(status) => write!(
                f,
                "NtQuerySystemInformation(SystemModuleInformation) failed with {status:#010x}"
            ),
        }
    }
}

impl std::error::Error for ModuleListError {}

/// Parses an x64 `RTL_PROCESS_MODULES`. Names are the file-name part of
/// `FullPathName` (ANSI; anything not UTF-8 is replaced).
///
/// # Errors
/// [`ModuleListError::Truncated`] when `bytes` cannot hold what it announces.
pub fn parse(bytes: &[u8]) -> Result<Vec<SystemModule>, ModuleListError> {
    let truncated = |count| ModuleListError::Truncated {
        count,
        bytes: bytes.len(),
    };
    let count = bytes
        .first_chunk::<4>()
        .map(|count| u32::from_le_bytes(*count))
        .ok_or_else(|| truncated(0))?;
    let entries = usize::try_from(count)
        .ok()
        .and_then(|count| count.checked_mul(ENTRY_SIZE))
        .and_then(|size| bytes.get(MODULES_OFFSET..)?.get(..size))
        .ok_or_else(|| truncated(count))?;
    Ok(entries.chunks_exact(ENTRY_SIZE).map(parse_entry).collect())
}

fn parse_entry(entry: &[u8]) -> SystemModule {
    let u64_at = |at: usize| u64::from_le_bytes(entry[at..at + 8].try_into().unwrap_or_default());
    let u32_at = |at: usize| u32::from_le_bytes(entry[at..at + 4].try_into().unwrap_or_default());
    let path = &entry[FULL_PATH_NAME..FULL_PATH_NAME + FULL_PATH_NAME_SIZE];
    let path = &path[..path
        .iter()
        .position(|&byte| byte == 0)
        .unwrap_or(path.len())];
    let file_name_at = usize::from(u16::from_le_bytes([
        entry[OFFSET_TO_FILE_NAME],
        entry[OFFSET_TO_FILE_NAME + 1],
    ]));
    let name = path
        .get(file_name_at..)
        .filter(|name| !name.is_empty())
        .unwrap_or(path);
    SystemModule {
        module: Module {
            base: u64_at(IMAGE_BASE),
            size: u32_at(IMAGE_SIZE),
            name: String::from_utf8_lossy(name).into_owned(),
        },
        path: String::from_utf8_lossy(path).into_owned(),
    }
}

/// Asks the kernel for its module list.
///
/// # Errors
/// The failing NTSTATUS, or a malformed reply.
#[cfg(windows)]
pub fn query() -> Result<Vec<SystemModule>, ModuleListError> {
    /// Undocumented but stable since NT 3.1; windows-sys does not name it.
    const SYSTEM_MODULE_INFORMATION: i32 = 11;
    privilege::enable_debug();
    parse(
        &crate::system_information::query(SYSTEM_MODULE_INFORMATION)
            .map_err(ModuleListError::Query)?,
    )
}

#[cfg(windows)]
mod privilege {
    use windows_sys::Win32::{
        Foundation::{CloseHandle, HANDLE, LUID},
        Security::{
            AdjustTokenPrivileges, LUID_AND_ATTRIBUTES, LookupPrivilegeValueW,
            SE_PRIVILEGE_ENABLED, TOKEN_ADJUST_PRIVILEGES, TOKEN_PRIVILEGES,
        },
        System::Threading::{GetCurrentProcess, OpenProcessToken},
    };

    /// Enables `SeDebugPrivilege` in this process's token when it holds
    /// it, so the module list has its kernel addresses (Windows 11 24H2+).
    /// Without it the list has zero addresses, which name nothing: not an
    /// error worth stopping for.
    pub fn enable_debug() {
        let name: Vec<u16> = "SeDebugPrivilege\0".encode_utf16().collect();
        let mut luid = LUID {
            LowPart: 0,
            HighPart: 0,
        };
        // SAFETY: `name` is NUL-terminated; `luid` is a valid out pointer.
        if unsafe { LookupPrivilegeValueW(std::ptr::null(), name.as_ptr(), &raw mut luid) } == 0 {
            return;
        }
        let mut token: HANDLE = std::ptr::null_mut();
        // SAFETY: the pseudo handle of this process; `token` is an out pointer.
        let process = unsafe { GetCurrentProcess() };
        // SAFETY: as above; the token is closed below.
        if unsafe { OpenProcessToken(process, TOKEN_ADJUST_PRIVILEGES, &raw mut token) } == 0 {
            return;
        }
        let privileges = TOKEN_PRIVILEGES {
            PrivilegeCount: 1,
            Privileges: [LUID_AND_ATTRIBUTES {
                Luid: luid,
                Attributes: SE_PRIVILEGE_ENABLED,
            }],
        };
        // SAFETY: `token` was opened with TOKEN_ADJUST_PRIVILEGES; the
        // previous-state outputs are optional and left null.
        unsafe {
            AdjustTokenPrivileges(
                token,
                0,
                &raw const privileges,
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            );
        }
        // SAFETY: opened above, closed once.
        unsafe { CloseHandle(token) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An `RTL_PROCESS_MODULES` as the kernel lays it out.
    fn encoded(modules: &[(u64, u32, &str, u16)]) -> Vec<u8> {
        let mut bytes = vec![0; MODULES_OFFSET + ENTRY_SIZE * modules.len()];
        let count = u32::try_from(modules.len()).unwrap();
        bytes[..4].copy_from_slice(&count.to_le_bytes());
        for (index, &(base, size, path, file_name_at)) in modules.iter().enumerate() {
            let entry = &mut bytes[MODULES_OFFSET + ENTRY_SIZE * index..][..ENTRY_SIZE];
            entry[8..16].copy_from_slice(&base.to_le_bytes()); // MappedBase
            entry[IMAGE_BASE..IMAGE_BASE + 8].copy_from_slice(&base.to_le_bytes());
            entry[IMAGE_SIZE..IMAGE_SIZE + 4].copy_from_slice(&size.to_le_bytes());
            entry[OFFSET_TO_FILE_NAME..OFFSET_TO_FILE_NAME + 2]
                .copy_from_slice(&file_name_at.to_le_bytes());
            entry[FULL_PATH_NAME..FULL_PATH_NAME + path.len()].copy_from_slice(path.as_bytes());
        }
        bytes
    }

    #[test]
    fn modules_are_read_with_their_file_names() {
        let bytes = encoded(&[
            (
                0xFFFF_F800_0000_0000,
                0x100_0000,
                r"\SystemRoot\system32\ntoskrnl.exe",
                21,
            ),
            (
                0xFFFF_F801_2340_0000,
                0x2_0000,
                r"\??\C:\kstack\kstack.sys",
                14,
            ),
        ]);
        let modules = parse(&bytes).unwrap();
        assert_eq!(modules.len(), 2);
        assert_eq!(modules[0].module.name, "ntoskrnl.exe");
        assert_eq!(modules[0].module.base, 0xFFFF_F800_0000_0000);
        assert_eq!(modules[0].module.size, 0x100_0000);
        assert_eq!(modules[0].path, r"\SystemRoot\system32\ntoskrnl.exe");
        assert_eq!(modules[1].module.name, "kstack.sys");
    }

    #[test]
    fn kernel_paths_become_win32_paths_or_none() {
        let root = r"C:\Windows";
        let path = |kernel| win32_path(kernel, root).map(|path| path.display().to_string());
        assert_eq!(
            path(r"\SystemRoot\system32\ntoskrnl.exe").as_deref(),
            Some(r"C:\Windows\system32\ntoskrnl.exe")
        );
        assert_eq!(
            path(r"\systemroot\System32\drivers\kstack.sys").as_deref(),
            Some(r"C:\Windows\System32\drivers\kstack.sys")
        );
        assert_eq!(
            path(r"\??\D:\kstack\kstack.sys").as_deref(),
            Some(r"D:\kstack\kstack.sys")
        );
        assert_eq!(path(r"E:\x.sys").as_deref(), Some(r"E:\x.sys"));
        assert_eq!(
            path(r"\Windows\System32\drivers\ACPI.sys").as_deref(),
            Some(r"C:\Windows\System32\drivers\ACPI.sys")
        );
        assert_eq!(path(r"\Device\HarddiskVolume3\x.sys"), None);
        assert_eq!(path("hal.dll"), None);
        assert_eq!(path(r"\??\UNC\server\x.sys"), None);
    }

    #[test]
    fn a_bad_file_name_offset_keeps_the_whole_path() {
        let modules = parse(&encoded(&[(0x1000, 0x1000, "hal.dll", 200)])).unwrap();
        assert_eq!(modules[0].module.name, "hal.dll");
    }

    #[test]
    fn a_short_reply_is_an_error_not_a_panic() {
        let bytes = encoded(&[(0x1000, 0x1000, "a.sys", 0), (0x2000, 0x1000, "b.sys", 0)]);
        for cut in [0, 3, 8, bytes.len() - 1] {
            assert!(
                matches!(parse(&bytes[..cut]), Err(ModuleListError::Truncated { .. })),
                "cut at {cut}"
            );
        }
        let mut huge = bytes.clone();
        huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(parse(&huge).is_err());
        assert_eq!(parse(&encoded(&[])).unwrap(), []);
    }
}
