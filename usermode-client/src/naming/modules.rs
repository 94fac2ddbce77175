//! Kernel modules (base, size, name), and which one holds an address
//! (frames are named after them by `symbolizer`).

use std::collections::BTreeMap;

use kstack_abi::{DRIVER_FILE_NAME, DriverImage};

use crate::naming::identity::ImageIdentity;

/// One loaded image.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Module {
    /// Where it is loaded.
    pub base: u64,
    /// Its size in bytes.
    pub size: u32,
    /// Its file name, e.g. `ntoskrnl.exe`.
    pub name: String,
}

impl Module {
    /// One past its last byte.
    #[must_use]
    pub fn end(&self) -> u64 {
        self.base.saturating_add(u64::from(self.size))
    }

    fn overlaps(&self, other: &Self) -> bool {
        self.base < other.end() && other.base < self.end()
    }

    /// kstack.sys as the driver reported it in its status, if it did.
    #[must_use]
    pub fn from_driver_image(image: DriverImage) -> Option<Self> {
        (image.base != 0 && image.size != 0).then(|| Self {
            base: image.base,
            size: image.size,
            name: DRIVER_FILE_NAME.to_owned(),
        })
    }
}

/// Modules sorted by base, never overlapping, looked up by address; each
/// with its image's identity where it was read (a saved capture's).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModuleMap {
    modules: Vec<Module>,
    /// By module base.
    identities: BTreeMap<u64, ImageIdentity>,
}

impl ModuleMap {
    /// The modules of `list`, sorted. Empty entries are left out, and of
    /// two overlapping entries the one listed first is kept.
    #[must_use]
    pub fn new(list: impl IntoIterator<Item = Module>) -> Self {
        let mut map = Self::default();
        for module in list {
            if module.size != 0 && !map.modules.iter().any(|kept| kept.overlaps(&module)) {
                map.modules.push(module);
            }
        }
        map.modules.sort_by_key(|module| module.base);
        map
    }

    /// Adds `module`, replacing whatever overlaps it: for a source known to
    /// be right (the driver's own image) over a list that may be stale or
    /// made up (Wine's system module list).
    #[must_use]
    pub fn with_authoritative(mut self, module: Module) -> Self {
        // The identity of the image it replaces carries over only when
        // that was the same image: the same base and name.
        let same_image = self.identities.remove(&module.base).filter(|_| {
            self.modules.iter().any(|kept| {
                kept.base == module.base && kept.name.eq_ignore_ascii_case(&module.name)
            })
        });
        for replaced in self.modules.iter().filter(|kept| kept.overlaps(&module)) {
            self.identities.remove(&replaced.base);
        }
        if let Some(identity) = same_image {
            self.identities.insert(module.base, identity);
        }
        self.modules.retain(|kept| !kept.overlaps(&module));
        let at = self.modules.partition_point(|kept| kept.base < module.base);
        self.modules.insert(at, module);
        self
    }

    /// Every module, by base address.
    #[must_use]
    pub fn modules(&self) -> &[Module] {
        &self.modules
    }

    /// Notes the identity of the image loaded at `base`; nothing when no
    /// module starts there.
    pub fn set_identity(&mut self, base: u64, identity: ImageIdentity) {
        if self.modules.iter().any(|module| module.base == base) {
            self.identities.insert(base, identity);
        }
    }

    /// The identity of `module`'s image, when it was read.
    #[must_use]
    pub fn identity(&self, module: &Module) -> Option<&ImageIdentity> {
        self.identities.get(&module.base)
    }

    /// The module holding `address` and the offset into it.
    #[must_use]
    pub fn find(&self, address: u64) -> Option<(&Module, u64)> {
        let after = self
            .modules
            .partition_point(|module| module.base <= address);
        let module = self.modules.get(after.checked_sub(1)?)?;
        (address < module.end()).then(|| (module, address - module.base))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub fn module(base: u64, size: u32, name: &str) -> Module {
        Module {
            base,
            size,
            name: name.to_owned(),
        }
    }

    pub fn sample_map() -> ModuleMap {
        ModuleMap::new([
            module(0xFFFF_F800_0000_0000, 0x100_0000, "ntoskrnl.exe"),
            module(0xFFFF_F801_2340_0000, 0x2_0000, "kstack.sys"),
        ])
    }

    #[test]
    fn overlaps_keep_the_first_entry_and_empty_entries_are_dropped() {
        let map = ModuleMap::new([
            module(0x2000, 0x1000, "b"),
            module(0x1000, 0x1800, "overlaps b"),
            module(0x1000, 0x1000, "a"),
            module(0x5000, 0, "empty"),
        ]);
        let names: Vec<_> = map.modules().iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
    }

    #[test]
    fn the_authoritative_entry_replaces_what_it_overlaps() {
        let map = ModuleMap::new([
            module(0x1_4000_0000, 0x10_0000, "kstack.exe"),
            module(0x7000_0000, 0x1000, "ntdll.dll"),
        ])
        .with_authoritative(module(0x1_4000_0000, 0x3_0000, "kstack.sys"));
        let name_at = |address| map.find(address).map(|(module, _)| module.name.as_str());
        assert_eq!(name_at(0x1_4000_0100), Some("kstack.sys"));
        assert_eq!(name_at(0x1_4008_0000), None, "the stale entry is gone");
        assert_eq!(name_at(0x7000_0010), Some("ntdll.dll"));
    }

    #[test]
    fn identities_belong_to_a_module_and_follow_only_the_same_image() {
        let identity = |timestamp| ImageIdentity {
            timestamp,
            size_of_image: 0x3_0000,
            debug: None,
        };
        let mut map = ModuleMap::new([
            module(0x1_4000_0000, 0x3_0000, "kstack.sys"),
            module(0x7000_0000, 0x1000, "ntdll.dll"),
        ]);
        map.set_identity(0x1_4000_0000, identity(1));
        map.set_identity(0x7000_0000, identity(2));
        map.set_identity(0x1234, identity(3));
        let kstack = module(0x1_4000_0000, 0x3_0000, "kstack.sys");
        assert_eq!(map.identity(&kstack), Some(&identity(1)));
        assert_eq!(map.identity(&module(0x1234, 1, "none")), None);
        // The driver's own report of itself keeps its image's identity.
        let map = map.with_authoritative(module(0x1_4000_0000, 0x3_0000, "KSTACK.SYS"));
        assert_eq!(map.identity(&kstack), Some(&identity(1)));
        // Another image over it drops it.
        let map = map.with_authoritative(module(0x1_4000_0000, 0x1000, "other.sys"));
        assert_eq!(map.identity(&kstack), None);
        assert_eq!(
            map.identity(&module(0x7000_0000, 0x1000, "ntdll.dll")),
            Some(&identity(2))
        );
    }

    #[test]
    fn the_driver_image_becomes_kstack_sys_unless_unknown() {
        let image = DriverImage {
            base: 0x1_4000_0000,
            size: 0x3_0000,
        };
        assert_eq!(
            Module::from_driver_image(image),
            Some(module(0x1_4000_0000, 0x3_0000, "kstack.sys"))
        );
        assert_eq!(Module::from_driver_image(DriverImage::default()), None);
    }
}
