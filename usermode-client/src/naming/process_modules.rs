//! User-mode modules, per process and over time: what names the user part
//! of a record's stack (`module+0xoffset`, the image's file name and the
//! offset into it).
//!
//! A user address means nothing without the module map of the process
//! that walked it, as it was then: two processes load different images at
//! one address, a process id is reused once its process is gone, and a DLL
//! unloaded and another loaded at its base take the same addresses. Two
//! sources build the maps:
//!
//! - the listing of the processes running when the client starts
//!   ([`list_running`], Windows: a Toolhelp snapshot per process; a
//!   process that cannot be read is a counted gap,
//!   [`ProcessModules::unreadable`], not an error);
//! - the driver's module records ([`ModuleChange`], see
//!   `kstack_abi::module_record`): every image load, with its path and the
//!   process's creation time as its key, and every process exit, ordered by
//!   timestamp with the trace records.
//!
//! A record is named with the map of its own process as it was at the
//! record's timestamp ([`ProcessModules::find`]): the module records of
//! that process up to then, latest load first, back to the process's start
//! (its id's previous exit, or a load with another process key); then, if
//! the listing was of that same process, the listing.

use std::collections::BTreeMap;

use kstack_abi::{ModuleEvent, ModuleFlags, ModuleHeader, ModuleRecord};

use crate::naming::{
    identity::ImageIdentity,
    modules::{Module, ModuleMap},
};

/// One module record as the client keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleChange {
    /// Everything but the path.
    pub header: ModuleHeader,
    /// The image's path as the kernel named it (UTF-16, possibly cut at
    /// its beginning: see `kstack_abi::ModuleFlags::PATH_TRUNCATED`).
    pub path: Vec<u16>,
}

impl From<&ModuleRecord<'_>> for ModuleChange {
    fn from(record: &ModuleRecord<'_>) -> Self {
        Self {
            header: record.header,
            path: record.path_units().collect(),
        }
    }
}

impl ModuleChange {
    /// The path as text (unpaired surrogates replaced).
    #[must_use]
    pub fn path_text(&self) -> String {
        String::from_utf16_lossy(&self.path)
    }

    /// The image's path as Win32 file functions (and dbghelp) open it, or
    /// `None` for a process exit, an unnamed image, or a path cut short.
    #[must_use]
    pub fn image_path(&self) -> Option<String> {
        if self.header.event != ModuleEvent::ImageLoad
            || self.header.flags.contains(ModuleFlags::PATH_TRUNCATED)
        {
            return None;
        }
        let system_root = std::env::var("SystemRoot").unwrap_or_else(|_| r"C:\Windows".to_owned());
        win32_path(&self.path_text(), &system_root)
    }

    /// The image as a module named by its file name (as Toolhelp names
    /// modules), or `None` for a process exit.
    #[must_use]
    pub fn module(&self) -> Option<Module> {
        if self.header.event != ModuleEvent::ImageLoad {
            return None;
        }
        let path = self.path_text();
        let name = path.rsplit(['\\', '/']).next().unwrap_or_default();
        Some(Module {
            base: self.header.image_base,
            size: self.header.image_size,
            name: name.to_owned(),
        })
    }
}

/// A kernel path (as the load-image callback gets it) as Win32 file
/// functions open it: `\??\C:\x` is `C:\x`, `\SystemRoot\x` is under
/// `system_root`, `\Device\...` goes through `\\?\GLOBALROOT`; a path
/// already in Win32 form is kept; `None` for an empty one.
#[must_use]
pub fn win32_path(kernel_path: &str, system_root: &str) -> Option<String> {
    if kernel_path.is_empty() {
        return None;
    }
    let lower = kernel_path.to_ascii_lowercase();
    Some(if let Some(rest) = kernel_path.strip_prefix(r"\??\") {
        rest.to_owned()
    } else if lower.starts_with(r"\systemroot\") {
        format!(r"{system_root}{}", &kernel_path[r"\SystemRoot".len()..])
    } else if kernel_path.starts_with('\\') && !kernel_path.starts_with(r"\\") {
        format!(r"\\?\GLOBALROOT{kernel_path}")
    } else {
        kernel_path.to_owned()
    })
}

/// The processes' modules: as listed at start, and as module records
/// changed them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessModules {
    listed: BTreeMap<u32, ModuleMap>,
    /// When the listing was taken (the record clock's units); `u64::MAX`:
    /// after every record (saved captures before format 3).
    listed_at: u64,
    unreadable: Vec<Unreadable>,
    /// Per process id, its module records in timestamp order, each with
    /// its module (`None`: an exit).
    changes: BTreeMap<u32, Vec<(ModuleHeader, Option<Module>)>>,
    /// Every module record noted, in the order noted.
    noted: Vec<ModuleChange>,
    /// Where each image is, by base and name: from the listing and the
    /// module records (for symbols).
    image_paths: BTreeMap<(u64, String), String>,
    /// The identities of images module records loaded, by base and name
    /// (read while the capture was saved).
    loaded_identities: BTreeMap<(u64, String), ImageIdentity>,
}

impl Default for ProcessModules {
    fn default() -> Self {
        Self::EMPTY
    }
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
        listed: BTreeMap::new(),
        listed_at: u64::MAX,
        unreadable: Vec::new(),
        changes: BTreeMap::new(),
        noted: Vec::new(),
        image_paths: BTreeMap::new(),
        loaded_identities: BTreeMap::new(),
    };

    /// Adds `process_id`'s modules to the listing (overlapping entries:
    /// the first listed is kept, as in [`ModuleMap::new`]).
    pub fn add(&mut self, process_id: u32, modules: impl IntoIterator<Item = Module>) {
        self.listed.insert(process_id, ModuleMap::new(modules));
    }

    /// Notes the identity of the image at `base` in `process_id`'s listing.
    pub fn set_identity(&mut self, process_id: u32, base: u64, identity: ImageIdentity) {
        if let Some(map) = self.listed.get_mut(&process_id) {
            map.set_identity(base, identity);
        }
    }

    /// Reads the identity of every listed image whose path is known, once
    /// per path, with `read` (a capture is about to be saved).
    pub fn identify_images(&mut self, mut read: impl FnMut(&str) -> Option<ImageIdentity>) {
        let mut read_before: BTreeMap<String, Option<ImageIdentity>> = BTreeMap::new();
        for map in self.listed.values_mut() {
            let found: Vec<(u64, ImageIdentity)> = map
                .modules()
                .iter()
                .filter_map(|module| {
                    let path = self.image_paths.get(&(module.base, module.name.clone()))?;
                    read_before
                        .entry(path.clone())
                        .or_insert_with(|| read(path))
                        .clone()
                        .map(|identity| (module.base, identity))
                })
                .collect();
            for (base, identity) in found {
                map.set_identity(base, identity);
            }
        }
    }

    /// Notes the identity of an image a module record loaded.
    pub fn set_loaded_identity(&mut self, module: &Module, identity: ImageIdentity) {
        self.loaded_identities
            .insert((module.base, module.name.clone()), identity);
    }

    /// The identity of an image, when it was read: a listed one (`module`
    /// as the listing has it), else one a module record loaded.
    #[must_use]
    pub fn identity(&self, module: &Module) -> Option<&ImageIdentity> {
        self.listed
            .values()
            .find_map(|map| {
                map.identity(module)
                    .filter(|_| map.modules().contains(module))
            })
            .or_else(|| {
                self.loaded_identities
                    .get(&(module.base, module.name.clone()))
            })
    }

    /// Notes where a listed image is on disk (Toolhelp's path).
    pub fn add_image_path(&mut self, module: &Module, path: String) {
        self.image_paths
            .insert((module.base, module.name.clone()), path);
    }

    /// Where `module` (a process's) is on disk, if the listing or a module
    /// record said.
    #[must_use]
    pub fn image_path(&self, module: &Module) -> Option<&str> {
        self.image_paths
            .get(&(module.base, module.name.clone()))
            .map(String::as_str)
    }

    /// Says when the listing was taken, in the record clock's units (100 ns
    /// since 1601): a listed process is the one its id named then.
    pub const fn set_listed_at(&mut self, listed_at: u64) {
        self.listed_at = listed_at;
    }

    /// When the listing was taken; `u64::MAX` when not known.
    #[must_use]
    pub const fn listed_at(&self) -> u64 {
        self.listed_at
    }

    /// Notes a process whose modules could not be listed.
    pub fn add_unreadable(&mut self, unreadable: Unreadable) {
        self.unreadable.push(unreadable);
    }

    /// Notes a module record (in any order: each process's records are
    /// kept in timestamp order).
    pub fn note(&mut self, change: ModuleChange) {
        if let Some((module, path)) = change.module().zip(change.image_path()) {
            self.image_paths.insert((module.base, module.name), path);
        }
        let changes = self.changes.entry(change.header.process_id).or_default();
        let at = changes.partition_point(|(kept, _)| kept.timestamp <= change.header.timestamp);
        changes.insert(at, (change.header, change.module()));
        self.noted.push(change);
    }

    /// The module of `process_id` holding `address` at `timestamp`, and
    /// the offset into it (see the module's documentation for the order).
    #[must_use]
    pub fn find(&self, process_id: u32, timestamp: u64, address: u64) -> Option<(&Module, u64)> {
        let changes = self.changes.get(&process_id).map_or(&[][..], Vec::as_slice);
        let (start, lives) = Self::life_at(changes, timestamp);
        let end = changes.partition_point(|(header, _)| header.timestamp <= timestamp);
        let loaded = changes[start..end]
            .iter()
            .rev()
            .filter_map(|(_, module)| module.as_ref())
            .find_map(|module| {
                (module.base <= address && address < module.end())
                    .then(|| (module, address - module.base))
            });
        loaded.or_else(|| {
            let (_, listed_lives) = Self::life_at(changes, self.listed_at);
            (lives == listed_lives)
                .then(|| self.listed.get(&process_id)?.find(address))
                .flatten()
        })
    }

    /// Where, in one id's records, the process alive at `timestamp` begins,
    /// and how many processes with the id began before it: a process ends
    /// at its exit, and at a load with another nonzero process key.
    fn life_at(changes: &[(ModuleHeader, Option<Module>)], timestamp: u64) -> (usize, usize) {
        let mut start = 0;
        let mut lives = 0;
        let mut key = 0;
        for (index, (header, _)) in changes.iter().enumerate() {
            if header.timestamp > timestamp {
                break;
            }
            match header.event {
                ModuleEvent::ProcessExit => {
                    (start, lives, key) = (index + 1, lives + 1, 0);
                }
                ModuleEvent::ImageLoad => {
                    if header.process_key != 0 && key != 0 && header.process_key != key {
                        (start, lives) = (index, lives + 1);
                    }
                    if header.process_key != 0 {
                        key = header.process_key;
                    }
                }
            }
        }
        (start, lives)
    }

    /// The processes listed, by id, with their modules.
    pub fn processes(&self) -> impl Iterator<Item = (u32, &ModuleMap)> {
        self.listed.iter().map(|(&id, map)| (id, map))
    }

    /// The module records noted, in the order noted.
    #[must_use]
    pub fn changes(&self) -> &[ModuleChange] {
        &self.noted
    }

    /// The processes that could not be read.
    #[must_use]
    pub fn unreadable(&self) -> &[Unreadable] {
        &self.unreadable
    }
}

/// Lists every running process's modules (Windows: Toolhelp snapshots,
/// 32-bit modules of WoW64 processes included), stamped with the time the
/// listing began.
#[cfg(windows)]
#[must_use]
pub fn list_running() -> ProcessModules {
    let listed_at = crate::clock::system_time_now();
    let mut listed = toolhelp::list();
    listed.set_listed_at(listed_at);
    listed
}

/// Off Windows there are no Windows processes to list.
#[cfg(not(windows))]
#[must_use]
pub fn list_running() -> ProcessModules {
    ProcessModules::default()
}

#[cfg(windows)]
mod toolhelp {
    use windows_sys::Win32::System::Diagnostics::ToolHelp::{
        MODULEENTRY32W, Module32FirstW, Module32NextW, PROCESSENTRY32W, Process32FirstW,
        Process32NextW, TH32CS_SNAPMODULE, TH32CS_SNAPMODULE32, TH32CS_SNAPPROCESS,
    };

    use super::{ProcessModules, Unreadable};
    use crate::{naming::modules::Module, toolhelp::Snapshot};

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
                Ok(modules) => {
                    for (module, path) in &modules {
                        found.add_image_path(module, path.clone());
                    }
                    found.add(process_id, modules.into_iter().map(|(module, _)| module));
                }
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

    /// The modules of one process, each with its path, or the Win32 error.
    fn modules(process_id: u32) -> Result<Vec<(Module, String)>, u32> {
        let snapshot = Snapshot::take(TH32CS_SNAPMODULE | TH32CS_SNAPMODULE32, process_id)?;
        let mut entry = MODULEENTRY32W {
            dwSize: u32::try_from(size_of::<MODULEENTRY32W>()).unwrap_or(u32::MAX),
            ..MODULEENTRY32W::default()
        };
        let mut modules = Vec::new();
        // SAFETY: `entry` is a MODULEENTRY32W with dwSize set.
        let mut more = unsafe { Module32FirstW(snapshot.0, &raw mut entry) } != 0;
        while more {
            let module = Module {
                base: entry.modBaseAddr.addr() as u64,
                size: entry.modBaseSize,
                name: text(&entry.szModule),
            };
            modules.push((module, text(&entry.szExePath)));
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
                .find(process_id, 0, address)
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
        assert_eq!(processes.find(4, 0, 0x1000), None);
    }

    fn load(
        process_id: u32,
        key: u64,
        at: u64,
        (base, size): (u64, u32),
        path: &str,
    ) -> ModuleChange {
        ModuleChange {
            header: ModuleHeader {
                sequence: at,
                timestamp: at,
                process_id,
                thread_id: 1,
                processor: 0,
                shard: 0,
                event: ModuleEvent::ImageLoad,
                flags: kstack_abi::ModuleFlags::NONE,
                image_base: base,
                image_size: size,
                process_key: key,
            },
            path: path.encode_utf16().collect(),
        }
    }

    fn exit(process_id: u32, at: u64) -> ModuleChange {
        let mut change = load(process_id, 0, at, (0, 0), "");
        change.header.event = ModuleEvent::ProcessExit;
        change
    }

    fn name_at(
        processes: &ProcessModules,
        process_id: u32,
        at: u64,
        address: u64,
    ) -> Option<String> {
        processes
            .find(process_id, at, address)
            .map(|(module, offset)| format!("{}+{offset:#x}", module.name))
    }

    #[test]
    fn a_change_applies_from_its_own_timestamp_on() {
        let mut processes = ProcessModules::default();
        processes.note(load(8, 0, 10, (0x1_0000, 0x1000), "a.dll"));
        processes.note(exit(8, 20));
        assert_eq!(name_at(&processes, 8, 9, 0x1_0001), None);
        assert_eq!(
            name_at(&processes, 8, 10, 0x1_0001).as_deref(),
            Some("a.dll+0x1")
        );
        assert_eq!(
            name_at(&processes, 8, 19, 0x1_0001).as_deref(),
            Some("a.dll+0x1")
        );
        assert_eq!(
            name_at(&processes, 8, 20, 0x1_0001),
            None,
            "stamped with the exit: after it"
        );
    }

    #[test]
    fn a_dll_loaded_where_another_was_names_only_later_records() {
        let mut processes = ProcessModules::default();
        processes.note(load(8, 0, 10, (0x1_0000, 0x1000), r"C:\Windows\old.dll"));
        processes.note(load(
            8,
            0,
            30,
            (0x1_0000, 0x2000),
            r"\Device\HarddiskVolume3\new.dll",
        ));
        assert_eq!(name_at(&processes, 8, 5, 0x1_0010), None, "before any load");
        assert_eq!(
            name_at(&processes, 8, 20, 0x1_0010).as_deref(),
            Some("old.dll+0x10")
        );
        assert_eq!(
            name_at(&processes, 8, 30, 0x1_0010).as_deref(),
            Some("new.dll+0x10")
        );
        assert_eq!(
            name_at(&processes, 8, 40, 0x1_1010).as_deref(),
            Some("new.dll+0x1010")
        );
        assert_eq!(
            name_at(&processes, 8, 20, 0x1_1010),
            None,
            "past old.dll's end"
        );
        assert_eq!(
            name_at(&processes, 9, 40, 0x1_0010),
            None,
            "another process"
        );
    }

    #[test]
    fn a_reused_process_id_starts_a_new_map_at_an_exit_or_a_new_key() {
        let mut processes = ProcessModules::default();
        // Noted out of order: each process's records are kept in time order.
        processes.note(exit(8, 20));
        processes.note(load(8, 0, 10, (0x1_0000, 0x1000), "first.exe"));
        processes.note(load(8, 0, 30, (0x2_0000, 0x1000), "second.exe"));
        assert_eq!(
            name_at(&processes, 8, 15, 0x1_0001).as_deref(),
            Some("first.exe+0x1")
        );
        assert_eq!(
            name_at(&processes, 8, 35, 0x1_0001),
            None,
            "first.exe exited"
        );
        assert_eq!(
            name_at(&processes, 8, 35, 0x2_0001).as_deref(),
            Some("second.exe+0x1")
        );

        // No exit seen (lost), but the creation-time keys differ.
        let mut keyed = ProcessModules::default();
        keyed.note(load(8, 111, 10, (0x1_0000, 0x1000), "first.exe"));
        keyed.note(load(8, 111, 12, (0x3_0000, 0x1000), "first.dll"));
        keyed.note(load(8, 222, 30, (0x2_0000, 0x1000), "second.exe"));
        assert_eq!(
            name_at(&keyed, 8, 20, 0x3_0001).as_deref(),
            Some("first.dll+0x1")
        );
        assert_eq!(
            name_at(&keyed, 8, 35, 0x3_0001),
            None,
            "first.dll was the other process's"
        );
        assert_eq!(
            name_at(&keyed, 8, 35, 0x2_0001).as_deref(),
            Some("second.exe+0x1")
        );
        assert_eq!(keyed.changes().len(), 3);
        // Listed during the first process: the second is not named by it.
        keyed.add(8, [module(0x4_0000, 0x1000, "listed.exe")]);
        keyed.set_listed_at(20);
        assert_eq!(
            name_at(&keyed, 8, 20, 0x4_0001).as_deref(),
            Some("listed.exe+0x1")
        );
        assert_eq!(
            name_at(&keyed, 8, 35, 0x4_0001),
            None,
            "another process since"
        );
    }

    #[test]
    fn the_listing_names_only_the_process_listed() {
        let mut processes = ProcessModules::default();
        processes.add(8, [module(0x5_0000, 0x1000, "listed.exe")]);
        processes.set_listed_at(50);
        // An earlier process with id 8 exited before the listing; the
        // listed one later loads a DLL; then it exits and the id is reused.
        processes.note(load(8, 0, 10, (0x5_0000, 0x1000), "earlier.exe"));
        processes.note(exit(8, 20));
        processes.note(load(8, 0, 60, (0x6_0000, 0x1000), "late.dll"));
        processes.note(exit(8, 70));
        assert_eq!(
            name_at(&processes, 8, 15, 0x5_0001).as_deref(),
            Some("earlier.exe+0x1")
        );
        assert_eq!(
            name_at(&processes, 8, 40, 0x5_0001).as_deref(),
            Some("listed.exe+0x1")
        );
        assert_eq!(
            name_at(&processes, 8, 65, 0x5_0001).as_deref(),
            Some("listed.exe+0x1")
        );
        assert_eq!(
            name_at(&processes, 8, 65, 0x6_0001).as_deref(),
            Some("late.dll+0x1")
        );
        assert_eq!(
            name_at(&processes, 8, 80, 0x5_0001),
            None,
            "the id's next process"
        );
        // Not knowing when the listing was taken, it names the id's last process.
        processes.set_listed_at(u64::MAX);
        assert_eq!(
            name_at(&processes, 8, 80, 0x5_0001).as_deref(),
            Some("listed.exe+0x1")
        );
        assert_eq!(name_at(&processes, 8, 40, 0x5_0001), None);
    }

    #[test]
    fn kernel_paths_become_paths_win32_opens() {
        let path = |text| win32_path(text, r"C:\Windows");
        assert_eq!(
            path(r"\??\C:\app\app.exe").as_deref(),
            Some(r"C:\app\app.exe")
        );
        assert_eq!(
            path(r"\SystemRoot\System32\ntdll.dll").as_deref(),
            Some(r"C:\Windows\System32\ntdll.dll")
        );
        assert_eq!(
            path(r"\Device\HarddiskVolume3\Windows\reg.exe").as_deref(),
            Some(r"\\?\GLOBALROOT\Device\HarddiskVolume3\Windows\reg.exe")
        );
        assert_eq!(path(r"C:\x.dll").as_deref(), Some(r"C:\x.dll"));
        assert_eq!(
            path(r"\\server\share\x.dll").as_deref(),
            Some(r"\\server\share\x.dll")
        );
        assert_eq!(path(""), None);

        let mut processes = ProcessModules::default();
        let mut cut = load(8, 0, 1, (0x2000, 0x10), r"\Device\HarddiskVolume3\y.dll");
        cut.header.flags = ModuleFlags::PATH_TRUNCATED;
        processes.note(cut);
        processes.note(load(
            8,
            0,
            2,
            (0x1000, 0x10),
            r"\Device\HarddiskVolume3\x.dll",
        ));
        processes.note(exit(8, 3));
        let module = |base, name: &str| Module {
            base,
            size: 0x10,
            name: name.to_owned(),
        };
        assert_eq!(
            processes.image_path(&module(0x1000, "x.dll")),
            Some(r"\\?\GLOBALROOT\Device\HarddiskVolume3\x.dll")
        );
        assert_eq!(
            processes.image_path(&module(0x2000, "y.dll")),
            None,
            "cut short"
        );
        assert_eq!(processes.image_path(&module(0x1000, "z.dll")), None);
        processes.add_image_path(&module(0x5000, "app.exe"), r"C:\app\app.exe".to_owned());
        assert_eq!(
            processes.image_path(&module(0x5000, "app.exe")),
            Some(r"C:\app\app.exe")
        );
    }

    #[test]
    fn module_names_are_the_paths_file_names() {
        let change = load(
            8,
            0,
            1,
            (0x1000, 0x10),
            r"\Device\HarddiskVolume3\Windows\System32\ntdll.dll",
        );
        assert_eq!(change.module().unwrap().name, "ntdll.dll");
        assert_eq!(load(8, 0, 1, (0x1000, 0x10), "").module().unwrap().name, "");
        assert_eq!(exit(8, 2).module(), None);
        assert!(change.path_text().starts_with(r"\Device\"));
    }
}
