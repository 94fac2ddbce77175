//! Image loads and process exits into the ring as module records (see
//! `kstack_abi::module_record`): what lets a reader name user frames after
//! the modules of the record's own process as they were at the time.
//!
//! The driver's load-image and process callbacks call
//! [`DriverCore::record_module`] whether or not their stack sources are
//! enabled; nothing filters or samples module records. Like a trace
//! record, one is written in its shard's publish section (raised to
//! `DISPATCH_LEVEL`), so its path must already be in non-paged memory: the
//! callback copies the end of the kernel's name onto its own stack first,
//! at `PASSIVE_LEVEL` ([`path_tail`] says which end).

use kstack_abi::{
    ModuleEvent, ModuleFlags, ModuleHeader,
    module_record::{MAX_MODULE_PATH, encode_module_record, module_record_size},
};

use crate::{capture::DriverCore, platform::Platform, ring::Full, sharded_ring::Counted};

/// What a callback knows of one image load or process exit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModuleFacts<'p> {
    event: ModuleEvent,
    process_id: u32,
    process_key: u64,
    image_base: u64,
    image_size: u32,
    path: &'p [u16],
    flags: ModuleFlags,
}

impl<'p> ModuleFacts<'p> {
    /// An image mapped into `process_id` (0: a driver). `path` is the end
    /// of the kernel's name for it (see [`path_tail`]), `truncated` whether
    /// its beginning was left out; a longer `path` keeps its last
    /// [`MAX_MODULE_PATH`] units.
    #[must_use]
    pub fn image_load(
        process_id: u32,
        process_key: u64,
        (image_base, image_size): (u64, u32),
        path: &'p [u16],
        truncated: bool,
    ) -> Self {
        let tail = &path[path_tail(path.len())..];
        let truncated = truncated || tail.len() < path.len();
        Self {
            event: ModuleEvent::ImageLoad,
            process_id,
            process_key,
            image_base,
            image_size,
            path: tail,
            flags: if truncated {
                ModuleFlags::PATH_TRUNCATED
            } else {
                ModuleFlags::NONE
            },
        }
    }

    /// `process_id`'s process exited.
    #[must_use]
    pub const fn process_exit(process_id: u32, process_key: u64) -> Self {
        Self {
            event: ModuleEvent::ProcessExit,
            process_id,
            process_key,
            image_base: 0,
            image_size: 0,
            path: &[],
            flags: ModuleFlags::NONE,
        }
    }
}

/// Where a module record's copy of a path of `length` UTF-16 units starts:
/// its last [`MAX_MODULE_PATH`] units are kept, so the file name survives.
///
/// Max IRQL: any.
#[must_use]
pub const fn path_tail(length: usize) -> usize {
    length.saturating_sub(MAX_MODULE_PATH)
}

impl DriverCore<'_> {
    /// Writes `facts` into the ring as a module record, in the shard of the
    /// processor the publish section runs on, and counts it there.
    ///
    /// # Errors
    /// [`Full`] when that shard lacks room; the drop is counted with the
    /// ring's drops and the sequence number is spent.
    ///
    /// Max IRQL: `DISPATCH_LEVEL` (the callbacks call it at
    /// `PASSIVE_LEVEL`); `facts.path` must be in non-paged memory.
    ///
    /// Never inlined: inlined into the process callback (ABI 12's build
    /// did so), its header and section grew that callback's frame, which
    /// every process event's capture and walk sit on
    /// (`docs/kernel-stack.md`).
    #[inline(never)]
    pub fn record_module(
        &self,
        platform: &impl Platform,
        facts: &ModuleFacts<'_>,
    ) -> Result<u64, Full> {
        let (_, thread_id) = platform.current_ids();
        platform.at_dispatch(|processor| {
            let shard = self.ring.shard_for(processor);
            let mut header = ModuleHeader {
                sequence: 0,
                timestamp: 0,
                process_id: facts.process_id,
                thread_id,
                processor: u16::try_from(processor).unwrap_or(u16::MAX),
                shard: shard.index(),
                event: facts.event,
                flags: facts.flags,
                image_base: facts.image_base,
                image_size: facts.image_size,
                process_key: facts.process_key,
            };
            let size = module_record_size(facts.path.len());
            shard.publish(Counted::Module, size, |sequence, record| {
                header.sequence = sequence;
                header.timestamp = platform.timestamp();
                // Cannot fail: the constructors keep exits imageless and
                // paths within MAX_MODULE_PATH, and the ring passes `size`
                // bytes.
                let _ = encode_module_record(&header, facts.path, record);
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use std::vec::Vec;

    use kstack_abi::{
        Entry, PagingExecutive, Records, module_record::MODULE_HEADER_SIZE, record_timestamp,
    };

    use super::*;
    use crate::capture::tests::{FakePlatform, all_registered, registered_core, ring_of_records};

    fn utf16(text: &str) -> Vec<u16> {
        text.encode_utf16().collect()
    }

    /// Every record in the ring, module records as (header, path).
    fn drain_modules(core: &DriverCore<'_>) -> Vec<(ModuleHeader, Vec<u16>)> {
        let mut out = vec![0_u8; 64 * kstack_abi::MAX_RECORD_SIZE];
        let drained = core
            .ring
            .consumer()
            .unwrap()
            .drain(&mut out, record_timestamp, u64::MAX);
        Records::new(&out[..drained.bytes])
            .map(|entry| match entry.unwrap() {
                Entry::Module(record) => (record.header, record.path_units().collect()),
                Entry::Trace(record) => panic!("a trace record: {record:?}"),
            })
            .collect()
    }

    #[test]
    fn loads_and_exits_are_recorded_whatever_the_configuration() {
        // Nothing enabled: module records do not depend on any source.
        let core = registered_core(
            ring_of_records(8, 2),
            PagingExecutive::NOT_SET,
            all_registered(),
        );
        let platform = FakePlatform::default();
        let path = utf16(r"\Device\HarddiskVolume3\Windows\System32\ntdll.dll");
        let load = ModuleFacts::image_load(4312, 77, (0x7FFA_0000_0000, 0x1F_0000), &path, false);
        let first = core.record_module(&platform, &load).unwrap();
        let second = core
            .record_module(&platform, &ModuleFacts::process_exit(4312, 77))
            .unwrap();
        assert_eq!(second, first + 1, "one shard's numbering");
        assert_eq!(core.ring.module_records(), 2);
        assert_eq!(core.ring.sequences_spent(), 2);
        assert_eq!(platform.raises.get(), 2, "each in a raised section");
        assert_eq!(platform.stamps_in_section.get(), 2, "stamped inside it");
        let records = drain_modules(&core);
        let (loaded, loaded_path) = &records[0];
        assert_eq!(
            (loaded.event, loaded.process_id, loaded.process_key),
            (ModuleEvent::ImageLoad, 4312, 77)
        );
        assert_eq!(
            (loaded.image_base, loaded.image_size),
            (0x7FFA_0000_0000, 0x1F_0000)
        );
        assert_eq!(
            (loaded.thread_id, loaded.shard, loaded.flags),
            (200, 1, ModuleFlags::NONE)
        );
        assert_eq!(loaded_path, &path);
        let (exited, exited_path) = &records[1];
        assert_eq!(
            (
                exited.event,
                exited.process_id,
                exited.image_base,
                exited.image_size
            ),
            (ModuleEvent::ProcessExit, 4312, 0, 0)
        );
        assert!(exited_path.is_empty());
        assert!(exited.timestamp > loaded.timestamp);
    }

    #[test]
    fn a_long_path_keeps_its_end() {
        let long: Vec<u16> = (0..u16::try_from(MAX_MODULE_PATH + 40).unwrap()).collect();
        assert_eq!(path_tail(long.len()), 40);
        assert_eq!(path_tail(MAX_MODULE_PATH), 0);
        assert_eq!(path_tail(3), 0);
        let facts = ModuleFacts::image_load(8, 0, (0x1000, 0x1000), &long, false);
        assert_eq!(facts.path, &long[40..]);
        assert_eq!(facts.flags, ModuleFlags::PATH_TRUNCATED);
        let cut_by_caller = ModuleFacts::image_load(8, 0, (0x1000, 0x1000), &long[40..], true);
        assert_eq!(cut_by_caller, facts);

        let core = registered_core(
            ring_of_records(8, 2),
            PagingExecutive::NOT_SET,
            all_registered(),
        );
        core.record_module(&FakePlatform::default(), &facts)
            .unwrap();
        let records = drain_modules(&core);
        assert_eq!(records[0].1, &long[40..]);
        assert_eq!(records[0].0.flags, ModuleFlags::PATH_TRUNCATED);
    }

    #[test]
    fn a_full_shard_drops_and_counts_the_record() {
        // Room for one header-only record per shard, not for a path.
        let core = registered_core(
            crate::sharded_ring::tests::leaked_ring(2 * MODULE_HEADER_SIZE / 8, 2),
            PagingExecutive::NOT_SET,
            all_registered(),
        );
        let platform = FakePlatform::default();
        let path = utf16("a.dll");
        let load = ModuleFacts::image_load(8, 0, (0x1000, 0x1000), &path, false);
        let Err(Full { sequence }) = core.record_module(&platform, &load) else {
            panic!("no room for a path");
        };
        assert_eq!(sequence, 1);
        assert_eq!(core.ring.module_records(), 1, "a drop is counted too");
        assert_eq!(core.ring.dropped(), 1);
        core.record_module(&platform, &ModuleFacts::process_exit(8, 0))
            .unwrap();
        assert_eq!(core.ring.sequences_spent(), 2);
    }
}
