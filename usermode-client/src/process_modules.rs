//! User-mode modules, per process: what names the user part of a record's
//! stack (`module+0xoffset`, the image's file name and the offset into it).
//!
//! A user address means nothing without the module map of the process
//! that walked it: two processes load different images at one address.
//! So the maps are kept per process id and looked up with the record's
//! `process_id`. Today they come from listing the processes running when
//! the client starts ([`list_running`], Windows: a Toolhelp snapshot per
//! process); a process that cannot be read (access denied, protected, gone
//! meanwhile) is a counted gap ([`ProcessModules::unreadable`]), not an
//! error. Processes started after the listing, and DLLs loaded after it,
//! stay unnamed until the driver reports image loads with the records.

use std::collections::BTreeMap;

use crate::modules::{Module, ModuleMap};

/// One process's modules, as listed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessModules {
    maps: BTreeMap<u32, ModuleMap>,
    unreadable: Vec<Unreadable>,
}

/// A process whose modules could not be listed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unreadable {
    /// Its id.
    pub process_id: u32,
    /// Its image name, as the process list gives it.
    pub name: String,
    /// The Win32 error that stopped the listing.
    pub error: u32,
}

impl ProcessModules {
    /// No process.
    pub const EMPTY: Self = Self {
        maps: BTreeMap::new(),
        unreadable: Vec::new(),
    };

    /// Adds `process_id`'s modules (overlapping entries: the first listed
    /// is kept, as in [`ModuleMap::new`]).
    pub fn add(&mut self, process_id: u32, modules: impl IntoIterator<Item = Module>) {
        self.maps.insert(process_id, ModuleMap::new(modules));
    }

    /// Notes a process whose modules could not be listed.
    pub fn add_unreadable(&mut self, unreadable: Unreadable) {
        self.unreadable.push(unreadable);
    }

    /// The module of `process_id` holding `address`, and the offset into
    /// it.
    #[must_use]
    pub fn find(&self, process_id: u32, address: u64) -> Option<(&Module, u64)> {
        self.maps.get(&process_id)?.find(address)
    }

    /// The processes listed, by id, with their modules.
    pub fn processes(&self) -> impl Iterator<Item = (u32, &ModuleMap)> {
        self.maps.iter().map(|(&id, map)| (id, map))
    }

    /// The processes that could not be read.
    #[must_use]
    pub fn unreadable(&self) -> &[Unreadable] {
        &self.unreadable
    }
}

/// Lists every running process's modules (Windows: Toolhelp snapshots,
/// 32-bit modules of WoW64 processes included).
#[cfg(windows)]
#[must_use]
pub fn list_running() -> ProcessModules {
    toolhelp::list()
}

/// Off Windows there are no Windows processes to list.
#[cfg(not(windows))]
#[must_use]
pub fn list_running() -> ProcessModules {
    ProcessModules::default()
}

#[cfg(windows)]
mod toolhelp {
    use windows_sys::Win32::{
        Foundation::{CloseHandle, GetLastError, HANDLE, INVALID_HANDLE_VALUE},
        System::Diagnostics::ToolHelp::{
            CreateToolhelp32Snapshot, MODULEENTRY32W, Module32FirstW, Module32NextW,
            PROCESSENTRY32W, Process32FirstW, Process32NextW, TH32CS_SNAPMODULE,
            TH32CS_SNAPMODULE32, TH32CS_SNAPPROCESS,
        },
    };

    use super::{ProcessModules, Unreadable};
    use crate::modules::Module;

    /// A snapshot handle, closed when dropped.
    struct Snapshot(HANDLE);

    impl Snapshot {
        /// `CreateToolhelp32Snapshot(flags, process_id)`, or the Win32 error.
        fn take(flags: u32, process_id: u32) -> Result<Self, u32> {
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

    /// A NUL-terminated UTF-16 buffer as a string.
    fn text(units: &[u16]) -> String {
        let end = units
            .iter()
            .position(|&unit| unit == 0)
            .unwrap_or(units.len());
        String::from_utf16_lossy(&units[..end])
    }

    pub fn list() -> ProcessModules {
        let mut found = ProcessModules::default();
        let Ok(processes) = Snapshot::take(TH32CS_SNAPPROCESS, 0) else {
            return found;
        };
        let mut entry = PROCESSENTRY32W {
            dwSize: u32::try_from(size_of::<PROCESSENTRY32W>()).unwrap_or(u32::MAX),
            ..PROCESSENTRY32W::default()
        };
        // SAFETY: `entry` is a PROCESSENTRY32W with dwSize set.
        let mut more = unsafe { Process32FirstW(processes.0, &raw mut entry) } != 0;
        while more {
            let process_id = entry.th32ProcessID;
            match modules(process_id) {
                Ok(modules) => found.add(process_id, modules),
                Err(error) => found.add_unreadable(Unreadable {
                    process_id,
                    name: text(&entry.szExeFile),
                    error,
                }),
            }
            // SAFETY: as above.
            more = unsafe { Process32NextW(processes.0, &raw mut entry) } != 0;
        }
        found
    }

    /// The modules of one process, or the Win32 error.
    fn modules(process_id: u32) -> Result<Vec<Module>, u32> {
        let snapshot = Snapshot::take(TH32CS_SNAPMODULE | TH32CS_SNAPMODULE32, process_id)?;
        let mut entry = MODULEENTRY32W {
            dwSize: u32::try_from(size_of::<MODULEENTRY32W>()).unwrap_or(u32::MAX),
            ..MODULEENTRY32W::default()
        };
        let mut modules = Vec::new();
        // SAFETY: `entry` is a MODULEENTRY32W with dwSize set.
        let mut more = unsafe { Module32FirstW(snapshot.0, &raw mut entry) } != 0;
        while more {
            modules.push(Module {
                base: entry.modBaseAddr.addr() as u64,
                size: entry.modBaseSize,
                name: text(&entry.szModule),
            });
            // SAFETY: as above.
            more = unsafe { Module32NextW(snapshot.0, &raw mut entry) } != 0;
        }
        Ok(modules)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn module(base: u64, size: u32, name: &str) -> Module {
        Module {
            base,
            size,
            name: name.to_owned(),
        }
    }

    #[test]
    fn each_process_names_its_own_addresses() {
        let mut processes = ProcessModules::default();
        processes.add(
            100,
            [
                module(0x7FF6_0000_0000, 0x1_0000, "kstack.exe"),
                module(0x7FFE_0000_0000, 0x20_0000, "ntdll.dll"),
            ],
        );
        // Another process with another image at the same address.
        processes.add(200, [module(0x7FF6_0000_0000, 0x8000, "reg.exe")]);
        let named = |process_id, address| {
            processes
                .find(process_id, address)
                .map(|(module, offset)| format!("{}+{offset:#x}", module.name))
        };
        assert_eq!(
            named(100, 0x7FF6_0000_1234).as_deref(),
            Some("kstack.exe+0x1234")
        );
        assert_eq!(
            named(200, 0x7FF6_0000_1234).as_deref(),
            Some("reg.exe+0x1234")
        );
        assert_eq!(named(200, 0x7FF6_0000_9000), None, "past reg.exe's end");
        assert_eq!(
            named(100, 0x7FFE_0000_0010).as_deref(),
            Some("ntdll.dll+0x10")
        );
        assert_eq!(named(300, 0x7FF6_0000_1234), None, "a process not listed");
        assert_eq!(processes.processes().count(), 2);
    }

    #[test]
    fn unreadable_processes_are_kept_as_gaps() {
        let mut processes = ProcessModules::default();
        processes.add_unreadable(Unreadable {
            process_id: 4,
            name: "System".to_owned(),
            error: 5,
        });
        assert_eq!(processes.unreadable().len(), 1);
        assert_eq!(processes.find(4, 0x1000), None);
    }
}
