//! Toolhelp snapshots of what runs on this machine (Windows): the snapshot
//! handle that the process module listing (`naming::process_modules`)
//! uses, and the thread ids the thread listing falls back to
//! (`thread_list`) where `NtQuerySystemInformation` fails.

use windows_sys::Win32::{
    Foundation::{CloseHandle, GetLastError, HANDLE, INVALID_HANDLE_VALUE},
    System::Diagnostics::ToolHelp::{
        CreateToolhelp32Snapshot, TH32CS_SNAPTHREAD, THREADENTRY32, Thread32First, Thread32Next,
    },
};

/// A snapshot handle, closed when dropped.
pub(crate) struct Snapshot(pub(crate) HANDLE);

impl Snapshot {
    /// `CreateToolhelp32Snapshot(flags, process_id)`, or the Win32 error.
    pub(crate) fn take(flags: u32, process_id: u32) -> Result<Self, u32> {
        // SAFETY: no pointer arguments; the handle is checked below.
        let handle = unsafe { CreateToolhelp32Snapshot(flags, process_id) };
        if handle == INVALID_HANDLE_VALUE {
            // SAFETY: reads this thread's last error.
            Err(unsafe { GetLastError() })
        } else {
            Ok(Self(handle))
        }
    }
}

impl Drop for Snapshot {
    fn drop(&mut self) {
        // SAFETY: the handle came from CreateToolhelp32Snapshot and is
        // closed once.
        unsafe { CloseHandle(self.0) };
    }
}

/// Every thread of the system as (process id, thread id) (a thread snapshot
/// ignores its process argument and holds them all), or the Win32 error.
pub(crate) fn list_threads() -> Result<Vec<(u32, u32)>, u32> {
    let snapshot = Snapshot::take(TH32CS_SNAPTHREAD, 0)?;
    let mut entry = THREADENTRY32 {
        dwSize: u32::try_from(size_of::<THREADENTRY32>()).unwrap_or(u32::MAX),
        ..THREADENTRY32::default()
    };
    let mut threads = Vec::new();
    // SAFETY: `entry` is a THREADENTRY32 with dwSize set.
    let mut more = unsafe { Thread32First(snapshot.0, &raw mut entry) } != 0;
    while more {
        threads.push((entry.th32OwnerProcessID, entry.th32ThreadID));
        // SAFETY: as above.
        more = unsafe { Thread32Next(snapshot.0, &raw mut entry) } != 0;
    }
    Ok(threads)
}
