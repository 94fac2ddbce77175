//! From a callback's facts to a record in the ring: the enabled check, the
//! process filter, the paging policy, the walk, both hashes, and publishing
//! into the shard of the processor the capture runs on. A capture writes
//! only that shard's memory (its ring, sequence and counters): nothing on
//! this path is shared by all processors.

use kstack_abi::{
    CaptureConfig, DriverImage, MAX_FRAMES, PagingExecutive, RecordFlags, RecordHeader, Source,
    SourceFacts, SourceSet, encode_record,
    ntstatus::{NtStatus, STATUS_NOT_SUPPORTED},
    stack_id,
};

use crate::{
    paging_policy::{WalkDecision, walk_decision},
    ring::Full,
    sharded_ring::{Shard, ShardedRing},
    sync::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering},
};

/// What the capture needs from the kernel. Every method is callable at up
/// to `DISPATCH_LEVEL`.
pub trait Platform {
    /// The current IRQL.
    fn irql(&self) -> u8;
    /// The current process and thread ids.
    fn current_ids(&self) -> (u32, u32);
    /// The current processor number.
    fn processor(&self) -> u32;
    /// System time, 100 ns units since 1601-01-01 UTC.
    fn system_time(&self) -> u64;
    /// `RtlCaptureStackBackTrace(frames_to_skip, frames.len(), frames, &hash)`:
    /// returns the frames written and the OS BackTraceHash.
    fn walk_stack(&self, frames_to_skip: u32, frames: &mut [u64]) -> (usize, u32);
}

/// How a source's registration at load went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SourceRegistration {
    /// The registration's NTSTATUS; the source is available when it succeeded.
    pub status: NtStatus,
}

impl SourceRegistration {
    /// Whether the source can be enabled.
    #[must_use]
    pub const fn available(self) -> bool {
        self.status >= 0
    }
}

/// What became of one event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaptureOutcome {
    /// The source is disabled.
    Disabled,
    /// The current process is not the one filtered for.
    Filtered,
    /// The IRQL was too high for the paging policy; counted.
    SkippedIrql,
    /// Walked and published with this sequence number (of its shard).
    Published(u64),
    /// Walked, but the shard was full; the sequence number was spent, so
    /// the client sees the gap, and the drop was counted.
    Dropped(u64),
}

/// The capture configuration, readable by callbacks in one atomic load.
/// Packed: sources (bits 0-7), frames to skip (8-15), frames to capture
/// (16-23), process filter (32-63). The timer period, which no callback
/// needs, sits beside it.
struct ConfigCell {
    packed: AtomicU64,
    timer_period_ms: AtomicU32,
}

impl ConfigCell {
    fn new(config: &CaptureConfig) -> Self {
        Self {
            packed: AtomicU64::new(Self::pack(config)),
            timer_period_ms: AtomicU32::new(config.timer_period_ms),
        }
    }

    fn pack(config: &CaptureConfig) -> u64 {
        u64::from(config.sources.bits())
            | u64::from(config.frames_to_skip) << 8
            | u64::from(config.frames_to_capture) << 16
            | u64::from(config.process_filter) << 32
    }

    /// Every field of a validated configuration fits its bits (sources < 2^8,
    /// skip <= 64, capture <= 62), so unpacking is exact.
    fn load(&self) -> CaptureConfig {
        let packed = self.packed.load(Ordering::Relaxed).to_le_bytes();
        CaptureConfig {
            sources: SourceSet::from_bits(u32::from(packed[0])).unwrap_or(SourceSet::EMPTY),
            frames_to_skip: u16::from(packed[1]),
            frames_to_capture: u16::from(packed[2]),
            process_filter: u32::from_le_bytes([packed[4], packed[5], packed[6], packed[7]]),
            timer_period_ms: self.timer_period_ms.load(Ordering::Relaxed),
        }
    }

    fn store(&self, config: &CaptureConfig) {
        self.timer_period_ms
            .store(config.timer_period_ms, Ordering::Relaxed);
        self.packed.store(Self::pack(config), Ordering::Relaxed);
    }
}

/// Everything the driver keeps while loaded. Lives in non-paged memory
/// allocated once at load; shared by callbacks and requests.
pub struct DriverCore<'a> {
    /// The ring, and per shard the sequence numbers and per-source counters.
    pub(crate) ring: ShardedRing<'a>,
    pub(crate) paging: PagingExecutive,
    pub(crate) image: DriverImage,
    /// Each source's registration status, set once at load.
    registrations: [AtomicI32; Source::COUNT],
    config: ConfigCell,
    /// Records discarded by clear requests (written by the consumer only).
    pub(crate) cleared: AtomicU64,
    /// Serializes configure requests (a try-lock; never waits).
    pub(crate) configuring: AtomicBool,
}

/// A walked stack and its record header, before it has a sequence number,
/// and the shard it goes to.
pub(crate) struct Walked<'s, 'a> {
    pub(crate) header: RecordHeader,
    pub(crate) frames: [u64; MAX_FRAMES as usize],
    pub(crate) frame_count: usize,
    pub(crate) shard: &'s Shard<'a>,
}

impl Walked<'_, '_> {
    pub(crate) fn frames(&self) -> &[u64] {
        &self.frames[..self.frame_count]
    }

    /// Encodes the record into a slot-sized buffer; returns its size.
    pub(crate) fn encode(&self, out: &mut [u8]) -> usize {
        // Cannot fail: at most MAX_FRAMES frames, and callers pass at least
        // MAX_RECORD_SIZE bytes.
        encode_record(&self.header, self.frames(), out).unwrap_or(0)
    }

    /// Publishes the record into its shard under the shard's next sequence
    /// number, which the header then carries too (also when the shard was
    /// full and the record dropped).
    ///
    /// # Errors
    /// [`Full`]: the shard dropped it (and counted the drop).
    ///
    /// Max IRQL: `DISPATCH_LEVEL`.
    pub(crate) fn publish(&mut self) -> Result<u64, Full> {
        let result = self.shard.publish(|sequence, slot| {
            self.header.sequence = sequence;
            self.encode(slot);
        });
        self.header.sequence = match result {
            Ok(sequence) | Err(Full { sequence }) => sequence,
        };
        result
    }
}

impl<'a> DriverCore<'a> {
    /// The state at load: nothing enabled, default frame counts, and every
    /// source unavailable until [`DriverCore::set_registration`] says
    /// otherwise. `image` is where the driver itself is loaded.
    #[must_use]
    pub fn new(ring: ShardedRing<'a>, paging: PagingExecutive, image: DriverImage) -> Self {
        Self {
            ring,
            paging,
            image,
            registrations: core::array::from_fn(|_| AtomicI32::new(STATUS_NOT_SUPPORTED)),
            config: ConfigCell::new(&CaptureConfig::default()),
            cleared: AtomicU64::new(0),
            configuring: AtomicBool::new(false),
        }
    }

    /// Records how registering `source`'s callback went.
    ///
    /// Max IRQL: any.
    pub fn set_registration(&self, source: Source, registration: SourceRegistration) {
        self.registrations[source.index()].store(registration.status, Ordering::Relaxed);
    }

    /// How registering `source`'s callback went.
    ///
    /// Max IRQL: any.
    #[must_use]
    pub fn registration(&self, source: Source) -> SourceRegistration {
        SourceRegistration {
            status: self.registrations[source.index()].load(Ordering::Relaxed),
        }
    }

    /// The configuration in force.
    ///
    /// Max IRQL: any.
    #[must_use]
    pub fn config(&self) -> CaptureConfig {
        self.config.load()
    }

    pub(crate) fn set_config(&self, config: &CaptureConfig) {
        self.config.store(config);
    }

    /// Captures the current stack for one event of `facts.source()`, if that
    /// source is enabled, the process filter matches and the paging policy
    /// allows a walk at the current IRQL.
    ///
    /// Max IRQL: `DISPATCH_LEVEL` (callbacks run at up to that level).
    pub fn capture(&self, platform: &impl Platform, facts: SourceFacts) -> CaptureOutcome {
        let config = self.config();
        let source = facts.source();
        if !config.sources.contains(source) {
            return CaptureOutcome::Disabled;
        }
        let ids = platform.current_ids();
        if config.process_filter != 0 && ids.0 != config.process_filter {
            return CaptureOutcome::Filtered;
        }
        let Some(mut walked) = self.walk(platform, &config, facts, ids) else {
            return CaptureOutcome::SkippedIrql;
        };
        match walked.publish() {
            Ok(sequence) => CaptureOutcome::Published(sequence),
            Err(Full { sequence }) => CaptureOutcome::Dropped(sequence),
        }
    }

    /// Walks the stack and fills in every header field but the sequence
    /// (`ids`: the current process and thread), or counts a skip when the
    /// paging policy forbids a walk here; both are counted in the shard of
    /// the current processor, which the record goes to.
    ///
    /// Max IRQL: `DISPATCH_LEVEL`.
    pub(crate) fn walk(
        &self,
        platform: &impl Platform,
        config: &CaptureConfig,
        facts: SourceFacts,
        (process_id, thread_id): (u32, u32),
    ) -> Option<Walked<'_, 'a>> {
        let source = facts.source();
        let processor = platform.processor();
        let shard = self.ring.shard_for(processor);
        let irql = platform.irql();
        if walk_decision(irql, self.paging) == WalkDecision::SkipIrql {
            shard.count_skipped_irql(source);
            return None;
        }
        let mut frames = [0_u64; MAX_FRAMES as usize];
        let wanted = usize::from(config.frames_to_capture.min(MAX_FRAMES));
        let (frame_count, os_hash) =
            platform.walk_stack(u32::from(config.frames_to_skip), &mut frames[..wanted]);
        let frame_count = frame_count.min(wanted);
        shard.count_captured(source);
        let flags = if frame_count == wanted {
            RecordFlags::TRUNCATED
        } else {
            RecordFlags::NONE
        };
        let header = RecordHeader {
            sequence: 0,
            timestamp: platform.system_time(),
            process_id,
            thread_id,
            processor: u16::try_from(processor).unwrap_or(u16::MAX),
            shard: shard.index(),
            irql,
            flags,
            os_hash,
            stack_id: stack_id(frames[..frame_count].iter().copied()),
            facts,
        };
        Some(Walked {
            header,
            frames,
            frame_count,
            shard,
        })
    }
}

#[cfg(all(test, not(loom)))]
pub(crate) mod tests {
    use std::{cell::Cell, vec::Vec};

    use kstack_abi::{
        DecodeError, RecordView, Records,
        ntstatus::{STATUS_NOT_SUPPORTED, STATUS_SUCCESS},
        source::Lifecycle,
    };

    use super::*;
    pub(crate) use crate::sharded_ring::tests::leaked_ring;

    /// A scripted kernel: fixed ids, a settable IRQL, processor and time,
    /// frames 0x1000, 0x2000, ...
    pub struct FakePlatform {
        pub irql: Cell<u8>,
        pub processor: Cell<u32>,
        pub time: Cell<u64>,
        pub process_id: Cell<u32>,
        pub stack_depth: usize,
        pub walks: Cell<u32>,
        pub last_skip: Cell<u32>,
    }

    impl Default for FakePlatform {
        fn default() -> Self {
            Self {
                irql: Cell::new(0),
                processor: Cell::new(1),
                time: Cell::new(133_000_000_000_000_000),
                process_id: Cell::new(4),
                stack_depth: 5,
                walks: Cell::new(0),
                last_skip: Cell::new(0),
            }
        }
    }

    impl Platform for FakePlatform {
        fn irql(&self) -> u8 {
            self.irql.get()
        }

        fn current_ids(&self) -> (u32, u32) {
            (self.process_id.get(), 200)
        }

        fn processor(&self) -> u32 {
            self.processor.get()
        }

        fn system_time(&self) -> u64 {
            self.time.get()
        }

        fn walk_stack(&self, frames_to_skip: u32, frames: &mut [u64]) -> (usize, u32) {
            self.walks.set(self.walks.get() + 1);
            self.last_skip.set(frames_to_skip);
            let count = self.stack_depth.min(frames.len());
            for (index, frame) in frames[..count].iter_mut().enumerate() {
                *frame = 0x1000 * (index as u64 + 1);
            }
            (count, 0xABCD)
        }
    }

    /// A core over `ring` whose sources registered as `registrations` say.
    pub fn registered_core(
        ring: ShardedRing<'static>,
        paging: PagingExecutive,
        registrations: [SourceRegistration; Source::COUNT],
    ) -> DriverCore<'static> {
        let core = DriverCore::new(ring, paging, DriverImage::default());
        for source in Source::ALL {
            core.set_registration(source, registrations[source.index()]);
        }
        core
    }

    pub fn all_registered() -> [SourceRegistration; Source::COUNT] {
        [SourceRegistration {
            status: STATUS_SUCCESS,
        }; Source::COUNT]
    }

    pub fn drain_all(core: &DriverCore<'_>) -> Vec<(RecordHeader, Vec<u64>)> {
        let mut out = vec![0_u8; 64 * kstack_abi::MAX_RECORD_SIZE];
        let drained = core
            .ring
            .consumer()
            .unwrap()
            .drain(&mut out, kstack_abi::record_timestamp);
        Records::new(&out[..drained.bytes])
            .map(|record: Result<RecordView<'_>, DecodeError>| {
                let record = record.unwrap();
                (record.header, record.frames().collect())
            })
            .collect()
    }

    fn enable(core: &DriverCore<'_>, sources: SourceSet) {
        core.set_config(&CaptureConfig {
            sources,
            ..CaptureConfig::default()
        });
    }

    const PROCESS_EXIT: SourceFacts = SourceFacts::Process {
        event: Lifecycle::Exit,
        process_id: 8,
        parent_process_id: 0,
    };

    #[test]
    fn a_disabled_source_does_not_walk() {
        let ring = leaked_ring(4, 1);
        let core = registered_core(ring, PagingExecutive::NotSet, all_registered());
        let platform = FakePlatform::default();
        assert_eq!(
            core.capture(&platform, PROCESS_EXIT),
            CaptureOutcome::Disabled
        );
        assert_eq!(platform.walks.get(), 0);
    }

    #[test]
    fn an_enabled_source_publishes_a_complete_record() {
        let ring = leaked_ring(4, 1);
        let core = registered_core(ring, PagingExecutive::NotSet, all_registered());
        enable(&core, SourceSet::EMPTY.with(Source::Process));
        let platform = FakePlatform::default();
        assert_eq!(
            core.capture(&platform, PROCESS_EXIT),
            CaptureOutcome::Published(1)
        );
        assert_eq!(
            core.capture(&platform, PROCESS_EXIT),
            CaptureOutcome::Published(2)
        );
        let records = drain_all(&core);
        assert_eq!(records.len(), 2);
        let (header, frames) = &records[0];
        assert_eq!(frames, &[0x1000, 0x2000, 0x3000, 0x4000, 0x5000]);
        assert_eq!(header.sequence, 1);
        assert_eq!(header.facts, PROCESS_EXIT);
        assert_eq!(
            (
                header.process_id,
                header.thread_id,
                header.processor,
                header.shard,
                header.irql
            ),
            (4, 200, 1, 0, 0),
            "processor 1 of a one-shard ring publishes into shard 0"
        );
        assert_eq!(header.os_hash, 0xABCD);
        assert_eq!(header.stack_id, stack_id(frames.iter().copied()));
        assert_eq!(
            header.flags,
            RecordFlags::NONE,
            "5 frames of 32 asked for: not truncated"
        );
        assert_eq!(core.ring.captured(Source::Process), 2);
    }

    #[test]
    fn each_processor_publishes_into_its_shard_with_its_own_sequence() {
        let core = registered_core(leaked_ring(8, 2), PagingExecutive::NotSet, all_registered());
        enable(&core, SourceSet::ALL);
        let platform = FakePlatform::default();
        let mut outcomes = Vec::new();
        for processor in [0, 1, 0, 2, 1] {
            platform.processor.set(processor);
            outcomes.push(core.capture(&platform, PROCESS_EXIT));
        }
        assert_eq!(
            outcomes,
            [1, 1, 2, 3, 2].map(CaptureOutcome::Published),
            "processor 2 shares shard 0"
        );
        let shards = core.ring.shards();
        assert_eq!(shards[0].ring().sequences_spent(), 3);
        assert_eq!(shards[1].ring().sequences_spent(), 2);
        let named: Vec<_> = drain_all(&core)
            .iter()
            .map(|(header, _)| (header.shard, header.sequence, header.processor))
            .collect();
        // One timestamp for all: the merge takes the lower shard first.
        assert_eq!(
            named,
            [(0, 1, 0), (0, 2, 0), (0, 3, 2), (1, 1, 1), (1, 2, 1)]
        );
        assert_eq!(core.ring.captured(Source::Process), 5);
    }

    #[test]
    fn a_full_walk_is_flagged_truncated_and_skip_is_passed_through() {
        let ring = leaked_ring(4, 1);
        let core = registered_core(ring, PagingExecutive::NotSet, all_registered());
        core.set_config(&CaptureConfig {
            sources: SourceSet::ALL,
            frames_to_skip: 3,
            frames_to_capture: 2,
            ..CaptureConfig::default()
        });
        let platform = FakePlatform::default();
        core.capture(&platform, SourceFacts::OnDemand { tag: 1 });
        assert_eq!(platform.last_skip.get(), 3);
        let (header, frames) = &drain_all(&core)[0];
        assert_eq!(frames.len(), 2);
        assert!(header.flags.contains(RecordFlags::TRUNCATED));
    }

    #[test]
    fn the_process_filter_keeps_other_processes_out() {
        let ring = leaked_ring(4, 1);
        let core = registered_core(ring, PagingExecutive::NotSet, all_registered());
        core.set_config(&CaptureConfig {
            sources: SourceSet::ALL,
            process_filter: 99,
            ..CaptureConfig::default()
        });
        let platform = FakePlatform::default();
        assert_eq!(
            core.capture(&platform, PROCESS_EXIT),
            CaptureOutcome::Filtered
        );
        platform.process_id.set(99);
        assert_eq!(
            core.capture(&platform, PROCESS_EXIT),
            CaptureOutcome::Published(1)
        );
    }

    #[test]
    fn elevated_irql_walks_only_with_paging_executive_disabled() {
        for (paging, expected) in [
            (PagingExecutive::NotSet, CaptureOutcome::SkippedIrql),
            (PagingExecutive::Value(0), CaptureOutcome::SkippedIrql),
            (PagingExecutive::Value(1), CaptureOutcome::Published(1)),
        ] {
            let ring = leaked_ring(4, 1);
            let core = registered_core(ring, paging, all_registered());
            enable(&core, SourceSet::ALL);
            let platform = FakePlatform::default();
            platform.irql.set(2);
            assert_eq!(
                core.capture(&platform, SourceFacts::Timer),
                expected,
                "{paging:?}"
            );
            let skipped = core.ring.skipped_irql(Source::Timer);
            assert_eq!(skipped, u64::from(expected == CaptureOutcome::SkippedIrql));
            if expected == CaptureOutcome::SkippedIrql {
                assert_eq!(platform.walks.get(), 0, "no walk when skipped");
                assert_eq!(
                    core.ring.sequences_spent(),
                    0,
                    "a skip spends no sequence number"
                );
            } else {
                assert_eq!(drain_all(&core)[0].0.irql, 2, "the record carries the IRQL");
            }
        }
    }

    #[test]
    fn drops_spend_sequence_numbers_so_gaps_equal_drops() {
        let ring = leaked_ring(2, 1);
        let core = registered_core(ring, PagingExecutive::NotSet, all_registered());
        enable(&core, SourceSet::ALL);
        let platform = FakePlatform::default();
        let outcomes: Vec<_> = (0..5)
            .map(|_| core.capture(&platform, PROCESS_EXIT))
            .collect();
        assert_eq!(
            outcomes,
            [
                CaptureOutcome::Published(1),
                CaptureOutcome::Published(2),
                CaptureOutcome::Dropped(3),
                CaptureOutcome::Dropped(4),
                CaptureOutcome::Dropped(5)
            ]
        );
        let sequences: Vec<_> = drain_all(&core)
            .iter()
            .map(|(header, _)| header.sequence)
            .collect();
        let gaps = core.ring.sequences_spent() - sequences.len() as u64;
        assert_eq!(gaps, core.ring.dropped());
    }

    #[test]
    fn unavailable_registrations_are_reported_as_such() {
        let mut registrations = all_registered();
        registrations[Source::Registry.index()] = SourceRegistration {
            status: STATUS_NOT_SUPPORTED,
        };
        assert!(!registrations[Source::Registry.index()].available());
        assert!(registrations[Source::Process.index()].available());
    }

    #[test]
    fn config_cell_round_trips_every_valid_extreme() {
        let cell = ConfigCell::new(&CaptureConfig::default());
        for config in [
            CaptureConfig::default(),
            CaptureConfig {
                sources: SourceSet::ALL,
                frames_to_skip: kstack_abi::config::MAX_FRAMES_TO_SKIP,
                frames_to_capture: MAX_FRAMES,
                process_filter: u32::MAX,
                timer_period_ms: 10_000,
            },
        ] {
            cell.store(&config);
            assert_eq!(cell.load(), config);
        }
    }
}
