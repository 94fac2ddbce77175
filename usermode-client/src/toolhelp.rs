//! Toolhelp snapshots of what runs on this machine (Windows): the snapshot
//! handle that the process module listing (`naming::process_modules`) and
//! the thread listing share, and the thread listings `kstack threads --pid`
//! and `kstack sample` ask for. Off Windows there is nothing to list: the listing says so.

use std::fmt;

/// One thread of a listed process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessThread {
    /// The process it belongs to.
    pub process_id: u32,
    /// The thread.
    pub thread_id: u32,
}

/// Why a process's threads could not be listed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThreadListError {
    /// Off Windows there are no Windows threads to list.
    NeedsWindows,
    /// `CreateToolhelp32Snapshot` failed.
    Snapshot {
        /// The Win32 error.
        code: u32,
    },
    /// The snapshot holds no thread of this process: no process has the
    /// id (or it exited).
    NoThreads {
        /// The process asked for.
        process_id: u32,
    },
}

impl fmt::Display for ThreadListError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NeedsWindows => write!(
                f,
                "listing a process's threads needs Windows (or Wine): name the threads with --tid"
            ),
            Self::Snapshot { code } => write!(
                f,
                "cannot list the threads of the running processes (CreateToolhelp32Snapshot: \
                 Win32 error {code})"
            ),
            Self::NoThreads { process_id } => write!(
                f,
                "no thread of process {process_id} is running: no process has that id (or it \
                 exited)"
            ),
        }
    }
}

impl std::error::Error for ThreadListError {}

/// Every thread of each of `process_ids` (in the order given, each
/// process's threads in the system's order), listed from one snapshot.
///
/// # Errors
/// [`ThreadListError`]: the snapshot failed, a process has no thread in it,
/// or the host is not Windows.
pub fn threads_of(process_ids: &[u32]) -> Result<Vec<ProcessThread>, ThreadListError> {
    select(&platform::list_threads()?, process_ids)
}

/// Every thread of the machine, from one snapshot (`kstack sample` lists
/// them at every tick and keeps those of the processes it samples).
///
/// # Errors
/// [`ThreadListError`]: the snapshot failed, or the host is not Windows.
pub fn all_threads() -> Result<Vec<ProcessThread>, ThreadListError> {
    platform::list_threads()
}

/// The threads of `listed` that belong to `process_ids`, grouped by
/// process in the order given; a process asked for twice is listed once.
fn select(
    listed: &[ProcessThread],
    process_ids: &[u32],
) -> Result<Vec<ProcessThread>, ThreadListError> {
    let mut selected = Vec::new();
    for (index, &process_id) in process_ids.iter().enumerate() {
        if process_ids[..index].contains(&process_id) {
            continue;
        }
        let before = selected.len();
        selected.extend(
            listed
                .iter()
                .filter(|thread| thread.process_id == process_id),
        );
        if selected.len() == before {
            return Err(ThreadListError::NoThreads { process_id });
        }
    }
    Ok(selected)
}

#[cfg(windows)]
pub(crate) mod platform {
    use windows_sys::Win32::{
        Foundation::{CloseHandle, GetLastError, HANDLE, INVALID_HANDLE_VALUE},
        System::Diagnostics::ToolHelp::{
            CreateToolhelp32Snapshot, TH32CS_SNAPTHREAD, THREADENTRY32, Thread32First, Thread32Next,
        },
    };

    use super::{ProcessThread, ThreadListError};

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

    /// Every thread of the system (a thread snapshot ignores its process
    /// argument and holds them all).
    pub(super) fn list_threads() -> Result<Vec<ProcessThread>, ThreadListError> {
        let snapshot = Snapshot::take(TH32CS_SNAPTHREAD, 0)
            .map_err(|code| ThreadListError::Snapshot { code })?;
        let mut entry = THREADENTRY32 {
            dwSize: u32::try_from(size_of::<THREADENTRY32>()).unwrap_or(u32::MAX),
            ..THREADENTRY32::default()
        };
        let mut threads = Vec::new();
        // SAFETY: `entry` is a THREADENTRY32 with dwSize set.
        let mut more = unsafe { Thread32First(snapshot.0, &raw mut entry) } != 0;
        while more {
            threads.push(ProcessThread {
                process_id: entry.th32OwnerProcessID,
                thread_id: entry.th32ThreadID,
            });
            // SAFETY: as above.
            more = unsafe { Thread32Next(snapshot.0, &raw mut entry) } != 0;
        }
        Ok(threads)
    }
}

#[cfg(not(windows))]
mod platform {
    use super::{ProcessThread, ThreadListError};

    /// Off Windows there is no Toolhelp.
    pub(super) fn list_threads() -> Result<Vec<ProcessThread>, ThreadListError> {
        Err(ThreadListError::NeedsWindows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn thread(process_id: u32, thread_id: u32) -> ProcessThread {
        ProcessThread {
            process_id,
            thread_id,
        }
    }

    #[test]
    fn the_threads_of_each_process_asked_for_are_selected_in_its_order() {
        let listed = [
            thread(4, 8),
            thread(100, 104),
            thread(4, 12),
            thread(200, 204),
        ];
        assert_eq!(
            select(&listed, &[100, 4, 100]),
            Ok(vec![thread(100, 104), thread(4, 8), thread(4, 12)])
        );
        assert_eq!(
            select(&listed, &[4, 300]),
            Err(ThreadListError::NoThreads { process_id: 300 })
        );
    }

    #[cfg(not(windows))]
    #[test]
    fn off_windows_the_listing_says_it_needs_windows() {
        let error = threads_of(&[4]).unwrap_err();
        assert_eq!(error, ThreadListError::NeedsWindows);
        assert!(error.to_string().contains("--tid"), "{error}");
    }
}
