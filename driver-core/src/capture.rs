//! From a callback's facts to a record in the ring: the enabled check, the
//! process filter, the paging policy and the walk, at the callback's own
//! IRQL; then the publish section: raised to `DISPATCH_LEVEL`, the shard of
//! the processor it then runs on, the timestamp, claim, copy and commit. A
//! capture writes only that shard's memory (its ring, sequence and
//! counters): nothing on this path is shared by all processors.
//!
//! Why the walk comes first: a walk at `PASSIVE_LEVEL` may take page faults
//! and be preempted, which is harmless into a local buffer. The section
//! after it cannot be descheduled on Windows, so no suspended or preempted
//! thread ever holds a claimed slot: a reader waits on a claimed slot at
//! most for one copy of a record by a running processor.

use kstack_abi::{
    Altitude, CaptureConfig, DriverImage, HostRoutine, MAX_FRAMES, PagingExecutive, RecordFlags,
    RecordHeader, Source, SourceFacts, UserPart, by_id_record_size, encode_record,
    ntstatus::{NtStatus, STATUS_NOT_SUPPORTED},
    record_size, stack_id,
};

use crate::{
    config_cell::{ConfigCell, EventConfig},
    kernel_stack::MIN_REMAINING_STACK,
    paging_policy::{DISPATCH_LEVEL, WalkDecision, walk_decision},
    platform::{Platform, Routine, UserWalkFailure},
    ring::Full,
    sharded_ring::{Counted, ShardedRing, Uncaptured},
    stack_table::{StackTable, Tabled},
    sync::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering},
    thread_captures::{self, Slot, ThreadCaptures},
    user_walk_guard::{Refused, UserWalkGuard},
};

/// Why a capture did not walk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NoWalk {
    /// The IRQL is too high for the paging policy.
    Irql,
    /// Too little kernel stack is left.
    Stack,
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
    /// The process filter left the current process out; counted.
    Filtered,
    /// The source's sampling did not keep this event; counted.
    SampledOut,
    /// The IRQL was too high for the paging policy; counted.
    SkippedIrql,
    /// Less kernel stack was left than [`MIN_REMAINING_STACK`]; counted.
    SkippedStack,
    /// Walked and published with this sequence number (of its shard).
    Published(u64),
    /// Walked, but the shard was full; the sequence number was spent, so
    /// the client sees the gap, and the drop was counted.
    Dropped(u64),
}

/// Everything the driver keeps while loaded. Lives in non-paged memory
/// allocated once at load; shared by callbacks and requests.
pub struct DriverCore<'a> {
    /// The ring, and per shard the sequence numbers and per-source counters.
    pub(crate) ring: ShardedRing<'a>,
    /// The stacks the ring's records name instead of carrying frames.
    pub(crate) table: StackTable<'a>,
    pub(crate) paging: PagingExecutive,
    pub(crate) image: DriverImage,
    /// Each source's registration status, set once at load.
    registrations: [AtomicI32; Source::COUNT],
    /// The altitudes the object and registry callbacks registered at
    /// (`Altitude::to_bits`), set once at load.
    altitudes: [AtomicU64; 2],
    config: ConfigCell,
    /// Records discarded by clear requests (written by the consumer only).
    pub(crate) cleared: AtomicU64,
    /// Serializes configure requests (a try-lock; never waits).
    pub(crate) configuring: AtomicBool,
    /// Whether each [`Routine`] can be called ([`HostRoutine`] wire
    /// values), set once at load.
    routines: [AtomicU32; Routine::COUNT],
    /// The threads walking their user stack now.
    user_walkers: &'a UserWalkGuard,
    /// The slots of capture-threads requests' APCs, and what became of
    /// their ids and APCs.
    pub(crate) thread_captures: ThreadCaptures<'a>,
}

/// A walked stack, before it is a record.
pub(crate) struct Stack {
    /// The kernel frames, then the user frames.
    frames: [u64; MAX_FRAMES as usize],
    count: usize,
    /// How many of the frames are the user part (the last ones).
    user_count: u8,
    user_part: UserPart,
    os_hash: u32,
    /// kstack's stack id of the frames, computed once they are all walked,
    /// before the publish section (it hashes every frame: no reason to do
    /// that at `DISPATCH_LEVEL`).
    id: u64,
    /// The IRQL the walk ran at (the callback's).
    irql: u8,
    flags: RecordFlags,
}

impl Stack {
    /// No frames yet.
    pub(crate) const EMPTY: Self = Self {
        frames: [0; MAX_FRAMES as usize],
        count: 0,
        user_count: 0,
        user_part: UserPart::Off,
        os_hash: 0,
        id: 0,
        irql: 0,
        flags: RecordFlags::NONE,
    };

    fn frames(&self) -> &[u64] {
        &self.frames[..self.count]
    }

    /// The record header for this stack; `sequence` and `timestamp` are
    /// the caller's to fill in.
    fn header(
        &self,
        facts: SourceFacts,
        (process_id, thread_id): (u32, u32),
        processor: u32,
        shard: u16,
    ) -> RecordHeader {
        RecordHeader {
            sequence: 0,
            timestamp: 0,
            process_id,
            thread_id,
            processor: u16::try_from(processor).unwrap_or(u16::MAX),
            shard,
            irql: self.irql,
            flags: self.flags,
            user_frame_count: self.user_count,
            user_part: self.user_part,
            os_hash: self.os_hash,
            stack_id: self.id,
            facts,
        }
    }

    /// The size of this stack's record.
    pub(crate) fn record_size(&self) -> usize {
        // At most MAX_FRAMES frames: the count fits a u16.
        record_size(u16::try_from(self.count).unwrap_or(MAX_FRAMES))
    }

    /// Encodes `header` and the frames into `out`, at least
    /// [`Stack::record_size`] bytes; returns the record's size.
    ///
    /// Inlined into the publish section: a frame of its own there adds to
    /// the capture path's deepest stack (`docs/kernel-stack.md`).
    #[expect(
        clippy::inline_always,
        reason = "the kernel stack bound; the optimizer stopped inlining it"
    )]
    #[inline(always)]
    pub(crate) fn encode(&self, header: &RecordHeader, out: &mut [u8]) -> usize {
        // Cannot fail: at most MAX_FRAMES frames, and callers pass at least
        // the record's size.
        encode_record(header, self.frames(), out).unwrap_or(0)
    }
}

/// Encodes the ring's form of a record whose stack is in the table's
/// `slot`: no frames, [`RecordFlags::STACK_BY_ID`], and the slot where
/// the OS hash goes (see `requests::read_out`). Returns its size.
fn by_id(header: &RecordHeader, slot: u32, out: &mut [u8]) -> usize {
    let ring_form = RecordHeader {
        flags: header.flags.union(RecordFlags::STACK_BY_ID),
        os_hash: slot,
        ..*header
    };
    // Cannot fail: no frames, and callers pass `by_id_record_size` bytes.
    encode_record(&ring_form, &[], out).unwrap_or(0)
}

impl<'a> DriverCore<'a> {
    /// The state at load: nothing enabled, default frame counts, and every
    /// source unavailable until [`DriverCore::set_registration`] says
    /// otherwise. `table` may have no entries (off). `image` is where the
    /// driver itself is loaded. `thread_slots` are the slots of
    /// capture-threads requests' APCs (none: every id is refused as
    /// `no_slot`). `user_walkers` is the user walks' re-entry guard (4 KiB,
    /// kept outside the core so that the core is small enough to be built
    /// on a kernel stack).
    #[must_use]
    pub fn new(
        ring: ShardedRing<'a>,
        table: StackTable<'a>,
        paging: PagingExecutive,
        image: DriverImage,
        thread_slots: &'a [Slot],
        user_walkers: &'a UserWalkGuard,
    ) -> Self {
        Self {
            ring,
            table,
            paging,
            image,
            registrations: core::array::from_fn(|_| AtomicI32::new(STATUS_NOT_SUPPORTED)),
            altitudes: core::array::from_fn(|_| AtomicU64::new(0)),
            config: ConfigCell::new(&CaptureConfig::default()),
            cleared: AtomicU64::new(0),
            configuring: AtomicBool::new(false),
            routines: core::array::from_fn(|_| AtomicU32::new(HostRoutine::NotExported as u32)),
            user_walkers,
            thread_captures: ThreadCaptures::new(thread_slots),
        }
    }

    /// The core with `slots` for capture-threads requests' APCs, in place
    /// of its own (tests).
    #[cfg(test)]
    #[must_use]
    pub fn with_thread_slots(mut self, slots: &'a [Slot]) -> Self {
        self.thread_captures = ThreadCaptures::new(slots);
        self
    }

    /// The APC in slot `index` is delivered (its kernel routine runs in
    /// its thread): counts the delivery, and returns the facts of its
    /// thread-stack event for [`DriverCore::capture`], which captures the
    /// thread's stack without the tracer's frames; or `None`, counted as
    /// `not_kept` with no walk, when the source was disabled since the
    /// request. The caller frees the slot after.
    ///
    /// Max IRQL: `APC_LEVEL`.
    // Never inlined: its clock arithmetic then has a frame of its own, gone
    // before the capture starts, instead of growing the APC routine's frame
    // under the whole capture path (docs/kernel-stack.md).
    #[inline(never)]
    pub fn thread_delivered(&self, platform: &impl Platform, index: usize) -> Option<SourceFacts> {
        let delivery = self.thread_captures.delivered(index, platform.timestamp());
        thread_captures::count(&self.thread_captures.counters.delivered);
        if delivery.late {
            thread_captures::count(&self.thread_captures.counters.late);
        }
        let (process_id, thread_id) = platform.current_ids();
        // Only what the event needs of the configuration: a whole copy
        // would cost the APC's routine stack the capture path has not got.
        if !self.event_config(Source::ThreadStack, process_id).enabled {
            self.count(platform, Source::ThreadStack, Uncaptured::NotKept);
            return None;
        }
        Some(SourceFacts::ThreadStack {
            target_process_id: process_id,
            target_thread_id: thread_id,
            tag: delivery.tag,
            delay: delivery.delay,
            late: delivery.late,
        })
    }

    /// The APC in slot `index` was run down (its rundown routine ran, which
    /// no known kernel does for a kernel APC). The caller frees the slot
    /// after.
    ///
    /// Max IRQL: `PASSIVE_LEVEL` (the rundown routine's).
    pub fn thread_run_down(&self) {
        thread_captures::count(&self.thread_captures.counters.run_down);
    }

    /// Records whether `routine` can be called (decided at load, before
    /// any source is registered).
    ///
    /// Max IRQL: any.
    pub fn set_routine(&self, routine: Routine, state: HostRoutine) {
        self.routines[routine as usize].store(state as u32, Ordering::Relaxed);
    }

    /// Whether `routine` can be called.
    ///
    /// Max IRQL: any.
    #[must_use]
    pub fn routine(&self, routine: Routine) -> HostRoutine {
        HostRoutine::from_wire(self.routines[routine as usize].load(Ordering::Relaxed))
            .unwrap_or_default()
    }

    /// Records how registering `source`'s callback went.
    ///
    /// Max IRQL: any.
    pub fn set_registration(&self, source: Source, registration: SourceRegistration) {
        self.registrations[source.index()].store(registration.status, Ordering::Relaxed);
    }

    /// Records the altitude `source`'s callback registered at (the object
    /// and registry sources have one; others are ignored).
    ///
    /// Max IRQL: any.
    pub fn set_altitude(&self, source: Source, altitude: Altitude) {
        if let Some(slot) = Self::altitude_slot(source) {
            self.altitudes[slot].store(altitude.to_bits(), Ordering::Relaxed);
        }
    }

    /// The altitude `source`'s callback registered at (none for sources
    /// without one, or not registered).
    ///
    /// Max IRQL: any.
    #[must_use]
    pub fn altitude(&self, source: Source) -> Altitude {
        Self::altitude_slot(source).map_or_else(Altitude::default, |slot| {
            Altitude::from_bits(self.altitudes[slot].load(Ordering::Relaxed))
        })
    }

    const fn altitude_slot(source: Source) -> Option<usize> {
        match source {
            Source::ObjectHandle => Some(0),
            Source::Registry => Some(1),
            _ => None,
        }
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

    /// The configuration in force (waits while a configure request writes
    /// it, at `DISPATCH_LEVEL`, see `ConfigCell`).
    ///
    /// Max IRQL: `DISPATCH_LEVEL`.
    #[must_use]
    pub fn config(&self) -> CaptureConfig {
        self.config.load()
    }

    /// Replaces the configuration, at `DISPATCH_LEVEL` so that callbacks
    /// never wait on a preempted writer. The caller holds `configuring`.
    ///
    /// Max IRQL: `DISPATCH_LEVEL`.
    pub(crate) fn set_config(&self, platform: &impl Platform, config: &CaptureConfig) {
        platform.at_dispatch(|_| self.config.write(config));
    }

    /// Captures the current stack for one event of `facts.source()`, if that
    /// source is enabled, the process filter matches and the paging policy
    /// allows a walk at the current IRQL.
    ///
    /// Max IRQL: `DISPATCH_LEVEL` (callbacks run at up to that level).
    pub fn capture(&self, platform: &impl Platform, facts: SourceFacts) -> CaptureOutcome {
        let source = facts.source();
        let ids = platform.current_ids();
        let config = self.event_config(source, ids.0);
        if !config.enabled {
            return CaptureOutcome::Disabled;
        }
        if !config.admitted {
            self.count(platform, source, Uncaptured::Filtered);
            return CaptureOutcome::Filtered;
        }
        if !self.sampled_in(platform, source, config.sample_every) {
            return CaptureOutcome::SampledOut;
        }
        let mut stack = Stack::EMPTY;
        match self.walk(platform, config, source, &mut stack) {
            Ok(()) => {}
            Err(NoWalk::Irql) => return CaptureOutcome::SkippedIrql,
            Err(NoWalk::Stack) => return CaptureOutcome::SkippedStack,
        }
        match self.publish(platform, &stack, facts, ids).0 {
            Ok(sequence) => CaptureOutcome::Published(sequence),
            Err(Full { sequence }) => CaptureOutcome::Dropped(sequence),
        }
    }

    /// What one event of `source` in `process_id` needs of the
    /// configuration in force (waits while a configure request writes it,
    /// at `DISPATCH_LEVEL`, see `ConfigCell`).
    ///
    /// Max IRQL: `DISPATCH_LEVEL`.
    pub(crate) fn event_config(&self, source: Source, process_id: u32) -> EventConfig {
        self.config.for_event(source, process_id)
    }

    /// Counts an event of `source` that does not enter the ring, in the
    /// shard of the processor it runs on now.
    ///
    /// Max IRQL: `DISPATCH_LEVEL`.
    pub(crate) fn count(&self, platform: &impl Platform, source: Source, why: Uncaptured) {
        self.ring.shard_for(platform.processor()).count(source, why);
    }

    /// Whether the source's 1-in-`every` sampling keeps this event, in the
    /// shard of the processor it runs on now; an event not kept is counted.
    ///
    /// Max IRQL: `DISPATCH_LEVEL`.
    fn sampled_in(&self, platform: &impl Platform, source: Source, every: u16) -> bool {
        every <= 1
            || self
                .ring
                .shard_for(platform.processor())
                .sample(source, every)
    }

    /// Walks the stack at the current IRQL into `stack` (the caller's, so
    /// the frames are on the kernel stack once, not copied out of this
    /// frame), or counts a skip when the paging policy forbids a walk here
    /// or too little kernel stack is left for one.
    ///
    /// # Errors
    /// Why it did not walk (counted for `source`).
    ///
    /// Max IRQL: `DISPATCH_LEVEL`.
    pub(crate) fn walk(
        &self,
        platform: &impl Platform,
        config: EventConfig,
        source: Source,
        stack: &mut Stack,
    ) -> Result<(), NoWalk> {
        let irql = platform.irql();
        if walk_decision(irql, self.paging) == WalkDecision::SkipIrql {
            self.count(platform, source, Uncaptured::SkippedIrql);
            return Err(NoWalk::Irql);
        }
        if platform.remaining_stack() < MIN_REMAINING_STACK {
            self.count(platform, source, Uncaptured::SkippedStack);
            return Err(NoWalk::Stack);
        }
        stack.irql = irql;
        let wanted = usize::from(config.frames_to_capture.min(MAX_FRAMES));
        let (count, os_hash) = if source == Source::ThreadStack {
            self.walk_thread(platform, wanted, &mut stack.frames)
        } else {
            let (count, os_hash) = platform.walk_stack(
                u32::from(config.frames_to_skip),
                &mut stack.frames[..wanted],
            );
            (count.min(wanted), os_hash)
        };
        stack.count = count;
        stack.os_hash = os_hash;
        stack.flags = if stack.count == wanted {
            RecordFlags::TRUNCATED
        } else {
            RecordFlags::NONE
        };
        stack.user_part = self.walk_user(platform, source, config.user_frames, stack);
        stack.id = stack_id(stack.frames());
        Ok(())
    }

    /// A thread's own kernel frames, as its APC's kernel routine walks
    /// them: the walk starts in kstack and in the kernel's APC dispatcher,
    /// so the frames inside kstack's image and the first frame after them
    /// (`KiDeliverApc`) are dropped, and at most `wanted` of the thread's
    /// frames are kept (`frames_to_skip` does not apply). An APC delivered
    /// from an interrupt also leaves `KiApcInterrupt` above the thread's
    /// frames.
    ///
    /// Max IRQL: `APC_LEVEL`.
    fn walk_thread(
        &self,
        platform: &impl Platform,
        wanted: usize,
        frames: &mut [u64],
    ) -> (usize, u32) {
        let (walked, os_hash) = platform.walk_stack(0, frames);
        let walked = walked.min(frames.len());
        let image = self.image.base..self.image.base.saturating_add(u64::from(self.image.size));
        let tracer = frames[..walked]
            .iter()
            .position(|frame| !image.contains(frame))
            .map_or(walked, |dispatcher| dispatcher + 1);
        let kept = (walked - tracer).min(wanted);
        frames.copy_within(tracer..tracer + kept, 0);
        (kept, os_hash)
    }

    /// Appends the user part to `stack` (its kernel part walked at
    /// `stack.irql`), where that is allowed; returns what happened to it.
    ///
    /// Max IRQL: `DISPATCH_LEVEL` (walks only below it).
    fn walk_user(
        &self,
        platform: &impl Platform,
        source: Source,
        wanted: u8,
        stack: &mut Stack,
    ) -> UserPart {
        if wanted == 0 {
            return UserPart::Off;
        }
        if self.routine(Routine::UserWalk) != HostRoutine::Available {
            return UserPart::Unavailable;
        }
        // A walk below DISPATCH_LEVEL may page the user stack in; at or
        // above it, it may not.
        if stack.irql >= DISPATCH_LEVEL {
            return UserPart::Irql;
        }
        let thread = platform.user_thread();
        if thread.system {
            return UserPart::SystemThread;
        }
        if thread.attached {
            return UserPart::Attached;
        }
        // A thread-stack capture interrupted the thread wherever it was: in
        // a critical region it may hold a lock a page-in of its user stack
        // needs. (A callback runs where the kernel documents it.)
        if source == Source::ThreadStack && thread.critical_region {
            return UserPart::CriticalRegion;
        }
        if thread.wow64 {
            stack.flags = stack.flags.union(RecordFlags::WOW64);
        }
        let room = (usize::from(MAX_FRAMES) - stack.count).min(usize::from(wanted));
        if room == 0 {
            return UserPart::Truncated;
        }
        let _walking = match self.user_walkers.enter(platform.current_ids().1) {
            Ok(walking) => walking,
            Err(Refused::Reentered) => return UserPart::Reentered,
            Err(Refused::Full) => return UserPart::GuardFull,
        };
        let user = &mut stack.frames[stack.count..stack.count + room];
        let count = match platform.walk_user_stack(user) {
            Ok(count) => count,
            Err(UserWalkFailure::Faulted) => return UserPart::Faulted,
            Err(UserWalkFailure::NoStack) => return UserPart::NoStack,
        };
        let count = count.min(room);
        stack.count += count;
        // At most MAX_FRAMES.
        stack.user_count = u8::try_from(count).unwrap_or(u8::MAX);
        if count == room {
            UserPart::Truncated
        } else {
            UserPart::Captured
        }
    }

    /// The publish section: at `DISPATCH_LEVEL`, into the shard of the
    /// processor it runs on, with the timestamp taken inside the ring's
    /// section. The stack goes to the table first (outside the ring's
    /// section, which readers wait on): a tabled stack's record carries no
    /// frames, and names its entry in place of the OS hash (a read puts the
    /// hash back). Returns the outcome and the record's header as a reader
    /// sees it (with the sequence number spent, also for a drop).
    ///
    /// Max IRQL: `DISPATCH_LEVEL`.
    pub(crate) fn publish(
        &self,
        platform: &impl Platform,
        stack: &Stack,
        facts: SourceFacts,
        ids: (u32, u32),
    ) -> (Result<u64, Full>, RecordHeader) {
        platform.at_dispatch(|processor| {
            let shard = self.ring.shard_for(processor);
            let mut header = stack.header(facts, ids, processor, shard.index());
            let tabled = self.table.enter(
                stack.frames(),
                header.stack_id,
                header.os_hash,
                shard.table_counters(),
            );
            let size = match tabled {
                Tabled::Slot(_) => by_id_record_size(&facts),
                Tabled::Inline => stack.record_size(),
            };
            let counted = Counted::Trace(facts.source(), stack.user_part);
            let result = shard.publish(counted, size, |sequence, record| {
                header.sequence = sequence;
                header.timestamp = platform.timestamp();
                match tabled {
                    Tabled::Slot(slot) => by_id(&header, slot, record),
                    Tabled::Inline => stack.encode(&header, record),
                };
            });
            if let Err(Full { sequence }) = result {
                header.sequence = sequence;
                header.timestamp = platform.timestamp();
                if let Tabled::Slot(slot) = tabled {
                    self.table.release(slot);
                }
            }
            (result, header)
        })
    }

    /// A record for `stack` that no ring keeps (a capture-now answered to
    /// its caller only: `facts` are the on-demand source's), stamped now;
    /// its user part is counted here.
    ///
    /// Max IRQL: `DISPATCH_LEVEL`.
    pub(crate) fn unkept(
        &self,
        platform: &impl Platform,
        stack: &Stack,
        facts: SourceFacts,
        ids: (u32, u32),
    ) -> RecordHeader {
        debug_assert_eq!(
            facts.source(),
            Source::OnDemand,
            "only capture-nows go unkept"
        );
        self.ring
            .shard_for(platform.processor())
            .count_answered_only(stack.user_part);
        let mut header = stack.header(facts, ids, platform.processor(), 0);
        header.flags = header.flags.union(RecordFlags::NOT_IN_RING);
        header.timestamp = platform.timestamp();
        header
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::{cell::Cell, vec::Vec};

    use kstack_abi::{
        DecodeError, Entry, ProcessFilter, Records, SourceSet,
        ntstatus::{STATUS_NOT_SUPPORTED, STATUS_SUCCESS},
        source_facts::Lifecycle,
    };

    use super::*;
    use crate::platform::UserThread;
    use crate::sharded_ring::tests::leaked_ring;
    use crate::stack_table::StackEntry;

    /// The fake platform's usual stack depth.
    const FAKE_DEPTH: u16 = 5;

    /// A ring each of whose `shards` shards holds exactly `records` records
    /// of the fake platform's usual stack.
    pub(crate) fn ring_of_records(records: usize, shards: usize) -> ShardedRing<'static> {
        let record_words = kstack_abi::record_size(FAKE_DEPTH) / crate::ring::WORD_SIZE;
        leaked_ring(records * shards * record_words, shards)
    }

    /// The machine's clock for every fake platform: it moves on by one tick
    /// per reading, so whatever a test does later is stamped later.
    static CLOCK: std::sync::atomic::AtomicU64 =
        std::sync::atomic::AtomicU64::new(133_000_000_000_000_000);

    /// Reads the fake machine's clock.
    pub(crate) fn tick() -> u64 {
        CLOCK.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    }

    /// A scripted kernel: fixed ids, a settable IRQL, processor and time,
    /// frames 0x1000, 0x2000, ... It notes what ran inside a publish
    /// section, and can move the thread to another processor when it
    /// raises (`processor_after_raise`), as a scheduler may before it.
    pub struct FakePlatform {
        pub irql: Cell<u8>,
        pub processor: Cell<u32>,
        pub processor_after_raise: Cell<Option<u32>>,
        pub process_id: Cell<u32>,
        pub stack_depth: usize,
        pub remaining_stack: Cell<usize>,
        pub walks: Cell<u32>,
        pub last_skip: Cell<u32>,
        pub in_section: Cell<bool>,
        /// Sections that raised the IRQL (entered below `DISPATCH_LEVEL`).
        pub raises: Cell<u32>,
        pub walks_in_section: Cell<u32>,
        pub stamps_in_section: Cell<u32>,
        pub user_thread: Cell<UserThread>,
        /// User frames the user walk finds (`0x7FF0_0000_1000`, ...), or
        /// why it finds none.
        pub user_depth: Cell<Result<usize, UserWalkFailure>>,
        pub user_walks: Cell<u32>,
    }

    impl Default for FakePlatform {
        fn default() -> Self {
            Self {
                irql: Cell::new(0),
                processor: Cell::new(1),
                processor_after_raise: Cell::new(None),
                process_id: Cell::new(4),
                stack_depth: FAKE_DEPTH.into(),
                remaining_stack: Cell::new(MIN_REMAINING_STACK),
                walks: Cell::new(0),
                last_skip: Cell::new(0),
                in_section: Cell::new(false),
                raises: Cell::new(0),
                walks_in_section: Cell::new(0),
                stamps_in_section: Cell::new(0),
                user_thread: Cell::new(UserThread::default()),
                user_depth: Cell::new(Ok(3)),
                user_walks: Cell::new(0),
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

        fn at_dispatch<R>(&self, section: impl FnOnce(u32) -> R) -> R {
            assert!(!self.in_section.get(), "sections do not nest");
            let irql = self.irql.get();
            if irql < 2 {
                self.raises.set(self.raises.get() + 1);
                self.irql.set(2);
                if let Some(processor) = self.processor_after_raise.get() {
                    self.processor.set(processor);
                }
            }
            self.in_section.set(true);
            let result = section(self.processor.get());
            self.in_section.set(false);
            self.irql.set(irql);
            result
        }

        fn timestamp(&self) -> u64 {
            if self.in_section.get() {
                self.stamps_in_section.set(self.stamps_in_section.get() + 1);
            }
            tick()
        }

        fn remaining_stack(&self) -> usize {
            self.remaining_stack.get()
        }

        fn walk_stack(&self, frames_to_skip: u32, frames: &mut [u64]) -> (usize, u32) {
            if self.in_section.get() {
                self.walks_in_section.set(self.walks_in_section.get() + 1);
            }
            self.walks.set(self.walks.get() + 1);
            self.last_skip.set(frames_to_skip);
            let count = self.stack_depth.min(frames.len());
            for (index, frame) in frames[..count].iter_mut().enumerate() {
                *frame = 0x1000 * (index as u64 + 1);
            }
            (count, 0xABCD)
        }

        fn user_thread(&self) -> UserThread {
            assert!(self.irql.get() < 2, "asked below DISPATCH_LEVEL only");
            self.user_thread.get()
        }

        fn walk_user_stack(&self, frames: &mut [u64]) -> Result<usize, UserWalkFailure> {
            let thread = self.user_thread.get();
            assert!(self.irql.get() < 2 && !thread.system && !thread.attached);
            self.user_walks.set(self.user_walks.get() + 1);
            let count = self.user_depth.get()?.min(frames.len());
            for (index, frame) in frames[..count].iter_mut().enumerate() {
                *frame = 0x7FF0_0000_1000 * (index as u64 + 1);
            }
            Ok(count)
        }
    }

    /// A core over `ring`, with the stack table off, whose sources
    /// registered as `registrations` say.
    pub fn registered_core(
        ring: ShardedRing<'static>,
        paging: PagingExecutive,
        registrations: [SourceRegistration; Source::COUNT],
    ) -> DriverCore<'static> {
        tabled_core(ring, 0, paging, registrations)
    }

    /// [`registered_core`] with a stack table of `entries` entries.
    pub fn tabled_core(
        ring: ShardedRing<'static>,
        entries: usize,
        paging: PagingExecutive,
        registrations: [SourceRegistration; Source::COUNT],
    ) -> DriverCore<'static> {
        let entries: &'static [StackEntry] =
            crate::test_support::keep((0..entries).map(|_| StackEntry::new()).collect::<Vec<_>>());
        let core = DriverCore::new(
            ring,
            StackTable::new(entries),
            paging,
            DriverImage::default(),
            &[],
            crate::test_support::keep(UserWalkGuard::new()),
        );
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
        let drained =
            core.ring
                .consumer()
                .unwrap()
                .drain(&mut out, kstack_abi::record_timestamp, u64::MAX);
        Records::new(&out[..drained.bytes])
            .map(
                |entry: Result<Entry<'_>, DecodeError>| match entry.unwrap() {
                    Entry::Trace(record) => (record.header, record.frames().collect()),
                    Entry::Module(record) => panic!("a module record: {record:?}"),
                },
            )
            .collect()
    }

    fn enable(core: &DriverCore<'_>, sources: SourceSet) {
        core.set_config(
            &FakePlatform::default(),
            &CaptureConfig {
                sources,
                ..CaptureConfig::default()
            },
        );
    }

    const PROCESS_EXIT: SourceFacts = SourceFacts::Process {
        event: Lifecycle::Exit,
        process_id: 8,
        parent_process_id: 0,
    };

    #[test]
    fn a_disabled_source_does_not_walk() {
        let ring = ring_of_records(4, 1);
        let core = registered_core(ring, PagingExecutive::NOT_SET, all_registered());
        let platform = FakePlatform::default();
        assert_eq!(
            core.capture(&platform, PROCESS_EXIT),
            CaptureOutcome::Disabled
        );
        assert_eq!(platform.walks.get(), 0);
    }

    #[test]
    fn an_enabled_source_publishes_a_complete_record() {
        let ring = ring_of_records(4, 1);
        let core = registered_core(ring, PagingExecutive::NOT_SET, all_registered());
        enable(&core, SourceSet::EMPTY.with(Source::Process));
        let platform = FakePlatform::default();
        assert_eq!(
            core.capture(&platform, PROCESS_EXIT),
            CaptureOutcome::Published(1)
        );
        assert_eq!(platform.walks.get(), 1, "one walk per capture");
        assert_eq!(
            core.capture(&platform, PROCESS_EXIT),
            CaptureOutcome::Published(2)
        );
        assert_eq!(platform.walks.get(), 2, "one walk per capture");
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
        assert_eq!(header.stack_id, stack_id(frames));
        assert_eq!(
            header.flags,
            RecordFlags::NONE,
            "5 frames of 32 asked for: not truncated"
        );
        assert_eq!(core.ring.captured(Source::Process), 2);
    }

    #[test]
    fn each_processor_publishes_into_its_shard_with_its_own_sequence() {
        let core = registered_core(
            ring_of_records(8, 2),
            PagingExecutive::NOT_SET,
            all_registered(),
        );
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
        // In time order, which is capture order, across the shards.
        assert_eq!(
            named,
            [(0, 1, 0), (1, 1, 1), (0, 2, 0), (0, 3, 2), (1, 2, 1)]
        );
        assert_eq!(core.ring.captured(Source::Process), 5);
    }

    /// One capture of `facts` under `config`, the core able to walk user
    /// stacks (`walk`) and `platform` as set; returns the record's header
    /// and frames, and what the status counts for the source.
    fn user_capture(
        walk: HostRoutine,
        config: &CaptureConfig,
        platform: &FakePlatform,
        facts: SourceFacts,
    ) -> (RecordHeader, Vec<u64>, [u64; UserPart::COUNT]) {
        let core = registered_core(
            ring_of_records(8, 1),
            PagingExecutive::decide(Some(1), Some(1), Some(2), false),
            all_registered(),
        );
        core.set_routine(Routine::UserWalk, walk);
        core.set_config(&FakePlatform::default(), config);
        assert!(matches!(
            core.capture(platform, facts),
            CaptureOutcome::Published(1)
        ));
        let (header, frames) = drain_all(&core).remove(0);
        (header, frames, core.ring.user_parts(facts.source()))
    }

    /// Issue 14's events-per-MiB measure on the host model, for what the
    /// issue names as the workload (a busy registry callback with a few
    /// stacks) under the default configuration, which keeps up to 30 user
    /// frames: 100 events of one stack of 16 kernel and 30 user frames
    /// take at least 5 times less ring with the table on than off. (Under
    /// Wine, which has no user walk, the drain bench's 16-frame stacks
    /// gain 3.57x: `docs/performance.md`.)
    #[test]
    fn a_repeated_registry_stack_with_its_user_part_takes_a_fifth_of_the_ring_tabled() {
        let facts = SourceFacts::Registry { notify_class: 1 };
        let ring_bytes = |entries| {
            let core = tabled_core(
                leaked_ring(64 * 1024 / crate::ring::WORD_SIZE, 1),
                entries,
                PagingExecutive::NOT_SET,
                all_registered(),
            );
            core.set_routine(Routine::UserWalk, HostRoutine::Available);
            enable(&core, SourceSet::EMPTY.with(Source::Registry));
            let platform = FakePlatform {
                stack_depth: 16,
                ..FakePlatform::default()
            };
            platform.user_depth.set(Ok(30));
            for _ in 0..100 {
                assert!(matches!(
                    core.capture(&platform, facts),
                    CaptureOutcome::Published(_)
                ));
            }
            core.ring.bytes_used()
        };
        let (off, on) = (ring_bytes(0), ring_bytes(8));
        assert_eq!(off, 100 * record_size(46), "72 + 8 x 46 = 440 bytes each");
        assert_eq!(on, 100 * 56, "the header, one fact word and the stack id");
        assert!(off >= 5 * on, "{off} bytes off, {on} on");
    }

    #[test]
    fn every_record_says_what_became_of_its_user_part_and_is_counted_once() {
        let all = CaptureConfig {
            sources: SourceSet::ALL,
            ..CaptureConfig::default()
        };
        let no_user_frames = CaptureConfig {
            user_frames: [0; Source::COUNT],
            ..all
        };
        let deep_kernel = CaptureConfig {
            frames_to_capture: MAX_FRAMES,
            ..all
        };
        let thread = |system, attached, wow64| UserThread {
            system,
            attached,
            wow64,
            critical_region: false,
        };
        let registry = SourceFacts::Registry { notify_class: 1 };
        // (why, walk, config, irql, thread, user depth, expected part, user frames, wow64)
        #[rustfmt::skip]
        let cases = [
            ("off", HostRoutine::Available, no_user_frames, 0, thread(false, false, false), Ok(3), UserPart::Off, 0, false),
            ("no routine", HostRoutine::NotExported, all, 0, thread(false, false, false), Ok(3), UserPart::Unavailable, 0, false),
            ("host stub", HostRoutine::HostStub, all, 0, thread(false, false, false), Ok(3), UserPart::Unavailable, 0, false),
            ("dispatch", HostRoutine::Available, all, 2, thread(false, false, false), Ok(3), UserPart::Irql, 0, false),
            ("system", HostRoutine::Available, all, 0, thread(true, false, true), Ok(3), UserPart::SystemThread, 0, false),
            ("attached", HostRoutine::Available, all, 0, thread(false, true, true), Ok(3), UserPart::Attached, 0, false),
            ("captured", HostRoutine::Available, all, 0, thread(false, false, false), Ok(3), UserPart::Captured, 3, false),
            ("apc level", HostRoutine::Available, all, 1, thread(false, false, true), Ok(3), UserPart::Captured, 3, true),
            ("faulted", HostRoutine::Available, all, 0, thread(false, false, true), Err(UserWalkFailure::Faulted), UserPart::Faulted, 0, true),
            ("no stack", HostRoutine::Available, all, 0, thread(false, false, true), Err(UserWalkFailure::NoStack), UserPart::NoStack, 0, true),
            ("capped", HostRoutine::Available, all, 0, thread(false, false, false), Ok(40), UserPart::Truncated, 30, false),
            ("no room", HostRoutine::Available, deep_kernel, 0, thread(false, false, false), Ok(3), UserPart::Truncated, 0, false),
        ];
        for (why, walk, config, irql, user_thread, depth, part, user_frames, wow64) in cases {
            let platform = FakePlatform {
                stack_depth: if why == "no room" { 62 } else { 5 },
                ..FakePlatform::default()
            };
            platform.irql.set(irql);
            platform.user_thread.set(user_thread);
            platform.user_depth.set(depth);
            let (header, frames, counted) = user_capture(walk, &config, &platform, registry);
            assert_eq!(header.user_part, part, "{why}");
            assert_eq!(usize::from(header.user_frame_count), user_frames, "{why}");
            let kernel = frames.len() - user_frames;
            assert!(
                frames[..kernel]
                    .iter()
                    .all(|&frame| frame < 0x7FF0_0000_0000),
                "{why}"
            );
            assert!(
                frames[kernel..]
                    .iter()
                    .all(|&frame| frame >= 0x7FF0_0000_0000),
                "{why}"
            );
            assert_eq!(header.stack_id, stack_id(&frames), "{why}: the whole stack");
            assert_eq!(header.flags.contains(RecordFlags::WOW64), wow64, "{why}");
            let mut expected = [0; UserPart::COUNT];
            expected[part.index()] = 1;
            assert_eq!(counted, expected, "{why}");
            let walked = match part {
                UserPart::Faulted | UserPart::NoStack => true,
                UserPart::Captured | UserPart::Truncated => user_frames > 0,
                _ => false,
            };
            assert_eq!(platform.user_walks.get() == 1, walked, "{why}");
        }
    }

    /// A thread-stack capture interrupted its thread wherever it was: inside
    /// a critical region it walks no user frames (the thread may hold a lock
    /// a page-in needs), counted apart; a callback there still walks.
    #[test]
    fn a_thread_stack_capture_in_a_critical_region_walks_no_user_frames() {
        let all = CaptureConfig {
            sources: SourceSet::ALL,
            ..CaptureConfig::default()
        };
        let thread_stack = SourceFacts::ThreadStack {
            target_process_id: 100,
            target_thread_id: 200,
            tag: 7,
            delay: 0,
            late: false,
        };
        let registry = SourceFacts::Registry { notify_class: 1 };
        for (critical_region, facts, part) in [
            (true, thread_stack, UserPart::CriticalRegion),
            (false, thread_stack, UserPart::Captured),
            (true, registry, UserPart::Captured),
        ] {
            let platform = FakePlatform::default();
            platform.irql.set(1);
            platform.user_thread.set(UserThread {
                critical_region,
                ..UserThread::default()
            });
            platform.user_depth.set(Ok(3));
            let (header, _, counted) = user_capture(HostRoutine::Available, &all, &platform, facts);
            let why = format!(
                "{:?} in a critical region: {critical_region}",
                facts.source()
            );
            assert_eq!(header.user_part, part, "{why}");
            assert_eq!(counted[part.index()], 1, "{why}");
            assert_eq!(
                platform.user_walks.get(),
                u32::from(part == UserPart::Captured),
                "{why}"
            );
        }
    }

    #[test]
    fn a_thread_already_walking_its_user_stack_is_not_walked_again() {
        let core = registered_core(
            ring_of_records(8, 1),
            PagingExecutive::NOT_SET,
            all_registered(),
        );
        core.set_routine(Routine::UserWalk, HostRoutine::Available);
        enable(&core, SourceSet::ALL);
        let platform = FakePlatform::default();
        // The fake platform's thread (id 200) in the middle of a user walk,
        // as when paging its stack in reaches a callback.
        let registry = SourceFacts::Registry { notify_class: 1 };
        let walking = core.user_walkers.enter(200).unwrap();
        core.capture(&platform, registry);
        drop(walking);
        core.capture(&platform, registry);
        let parts: Vec<_> = drain_all(&core)
            .iter()
            .map(|(header, _)| header.user_part)
            .collect();
        assert_eq!(parts, [UserPart::Reentered, UserPart::Captured]);
        assert_eq!(platform.user_walks.get(), 1);
        assert_eq!(
            core.user_walkers.marked(),
            0,
            "a walk leaves no mark behind"
        );
        let counted = core.ring.user_parts(Source::Registry);
        assert_eq!(
            (
                counted[UserPart::Reentered.index()],
                counted[UserPart::Captured.index()]
            ),
            (1, 1)
        );
    }

    #[test]
    fn a_full_walk_is_flagged_truncated_and_skip_is_passed_through() {
        let ring = ring_of_records(4, 1);
        let core = registered_core(ring, PagingExecutive::NOT_SET, all_registered());
        core.set_config(
            &FakePlatform::default(),
            &CaptureConfig {
                sources: SourceSet::ALL,
                frames_to_skip: 3,
                frames_to_capture: 2,
                ..CaptureConfig::default()
            },
        );
        let platform = FakePlatform::default();
        core.capture(&platform, SourceFacts::OnDemand { tag: 1 });
        assert_eq!(platform.last_skip.get(), 3);
        let (header, frames) = &drain_all(&core)[0];
        assert_eq!(frames.len(), 2);
        assert!(header.flags.contains(RecordFlags::TRUNCATED));
    }

    #[test]
    fn the_process_filter_keeps_other_processes_out() {
        let ring = ring_of_records(4, 1);
        let core = registered_core(ring, PagingExecutive::NOT_SET, all_registered());
        let platform = FakePlatform::default();
        core.set_config(
            &platform,
            &CaptureConfig {
                sources: SourceSet::ALL,
                processes: ProcessFilter::new(&[99, 98], &[]).unwrap(),
                ..CaptureConfig::default()
            },
        );
        assert_eq!(
            core.capture(&platform, PROCESS_EXIT),
            CaptureOutcome::Filtered
        );
        platform.process_id.set(99);
        assert_eq!(
            core.capture(&platform, PROCESS_EXIT),
            CaptureOutcome::Published(1)
        );
        core.set_config(
            &platform,
            &CaptureConfig {
                sources: SourceSet::ALL,
                processes: ProcessFilter::new(&[], &[99, 0]).unwrap(),
                ..CaptureConfig::default()
            },
        );
        assert_eq!(
            core.capture(&platform, PROCESS_EXIT),
            CaptureOutcome::Filtered,
            "excluded"
        );
        platform.process_id.set(5);
        assert_eq!(
            core.capture(&platform, PROCESS_EXIT),
            CaptureOutcome::Published(2)
        );
        assert_eq!(
            core.ring.uncaptured(Source::Process, Uncaptured::Filtered),
            2
        );
        assert_eq!(platform.walks.get(), 2, "a filtered event is not walked");
    }

    #[test]
    fn the_walk_comes_first_then_a_raised_section_on_the_processor_it_then_runs_on() {
        let core = registered_core(
            ring_of_records(8, 2),
            PagingExecutive::NOT_SET,
            all_registered(),
        );
        enable(&core, SourceSet::ALL);
        let platform = FakePlatform::default();
        // Walked on processor 0 at PASSIVE_LEVEL, then moved to 1 before
        // the raise took effect.
        platform.processor.set(0);
        platform.processor_after_raise.set(Some(1));
        assert_eq!(
            core.capture(&platform, PROCESS_EXIT),
            CaptureOutcome::Published(1)
        );
        assert_eq!(platform.walks.get(), 1);
        assert_eq!(
            platform.walks_in_section.get(),
            0,
            "walked before the section"
        );
        assert_eq!(platform.raises.get(), 1, "raised for the section");
        assert_eq!(platform.stamps_in_section.get(), 1, "stamped inside it");
        assert_eq!(platform.irql.get(), 0, "lowered back after");
        let (header, _) = &drain_all(&core)[0];
        assert_eq!(
            (header.processor, header.shard, header.irql),
            (1, 1, 0),
            "the processor after raising picks the shard; irql is the walk's"
        );
    }

    #[test]
    fn too_little_kernel_stack_skips_the_walk_and_counts_it() {
        let core = registered_core(
            ring_of_records(8, 1),
            PagingExecutive::NOT_SET,
            all_registered(),
        );
        enable(&core, SourceSet::ALL);
        let platform = FakePlatform::default();
        platform.remaining_stack.set(MIN_REMAINING_STACK - 1);
        assert_eq!(
            core.capture(&platform, PROCESS_EXIT),
            CaptureOutcome::SkippedStack
        );
        assert_eq!(platform.walks.get(), 0, "nothing walked");
        assert_eq!(core.ring.sequences_spent(), 0, "no number spent");
        assert_eq!(
            core.ring
                .uncaptured(Source::Process, Uncaptured::SkippedStack),
            1
        );
        platform.remaining_stack.set(MIN_REMAINING_STACK);
        assert_eq!(
            core.capture(&platform, PROCESS_EXIT),
            CaptureOutcome::Published(1),
            "exactly the minimum is enough"
        );
    }

    #[test]
    fn a_capture_at_dispatch_level_does_not_raise_again() {
        let core = registered_core(
            ring_of_records(8, 2),
            PagingExecutive::assumed(),
            all_registered(),
        );
        enable(&core, SourceSet::ALL);
        let platform = FakePlatform::default();
        platform.irql.set(2);
        assert_eq!(
            core.capture(&platform, SourceFacts::Timer),
            CaptureOutcome::Published(1)
        );
        assert_eq!(platform.raises.get(), 0);
        assert_eq!(platform.stamps_in_section.get(), 1);
        assert_eq!(platform.irql.get(), 2);
    }

    #[test]
    fn elevated_irql_walks_only_with_paging_executive_disabled_in_effect() {
        let since_boot = PagingExecutive::decide(Some(1), Some(2), Some(1), false);
        let before_boot = PagingExecutive::decide(Some(1), Some(1), Some(2), false);
        for (paging, expected) in [
            (PagingExecutive::NOT_SET, CaptureOutcome::SkippedIrql),
            (
                PagingExecutive::decide(Some(0), None, None, true),
                CaptureOutcome::SkippedIrql,
            ),
            (since_boot, CaptureOutcome::SkippedIrql),
            (before_boot, CaptureOutcome::Published(1)),
            (PagingExecutive::assumed(), CaptureOutcome::Published(1)),
        ] {
            let ring = ring_of_records(4, 1);
            let core = registered_core(ring, paging, all_registered());
            enable(&core, SourceSet::ALL);
            let platform = FakePlatform::default();
            platform.irql.set(2);
            assert_eq!(
                core.capture(&platform, SourceFacts::Timer),
                expected,
                "{paging:?}"
            );
            let skipped = core.ring.uncaptured(Source::Timer, Uncaptured::SkippedIrql);
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
        let ring = ring_of_records(2, 1);
        let core = registered_core(ring, PagingExecutive::NOT_SET, all_registered());
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

    /// The largest valid configuration: every field at its top.
    fn extreme_config() -> CaptureConfig {
        let ids = |base: u32| -> Vec<u32> { (0..8).map(|n| base - n).collect() };
        let sample_every = Source::ALL.map(|source| if source.is_request() { 1 } else { u16::MAX });
        CaptureConfig {
            sources: SourceSet::ALL,
            frames_to_skip: kstack_abi::config::MAX_FRAMES_TO_SKIP,
            frames_to_capture: MAX_FRAMES,
            processes: ProcessFilter::new(&ids(u32::MAX), &ids(u32::MAX - 8)).unwrap(),
            sample_every,
            timer_period_ms: 10_000,
            user_frames: Source::ALL.map(|source| {
                if source == Source::Timer {
                    0
                } else {
                    u8::try_from(MAX_FRAMES).unwrap()
                }
            }),
        }
    }

    #[test]
    fn config_cell_round_trips_every_valid_extreme() {
        let cell = ConfigCell::new(&CaptureConfig::default());
        assert_eq!(cell.load(), CaptureConfig::default());
        for config in [extreme_config(), CaptureConfig::default()] {
            cell.write(&config);
            assert_eq!(cell.load(), config);
        }
    }

    /// What `config` says of one event, from the whole configuration.
    fn expected_for_event(config: &CaptureConfig, source: Source, process_id: u32) -> EventConfig {
        EventConfig {
            enabled: config.sources.contains(source),
            admitted: config.processes.admits(process_id),
            sample_every: config.sample_every(source),
            frames_to_skip: config.frames_to_skip,
            frames_to_capture: config.frames_to_capture,
            user_frames: config.user_frames(source),
        }
    }

    #[test]
    fn an_event_reads_what_the_whole_configuration_says() {
        let cell = ConfigCell::new(&CaptureConfig::default());
        let only_nine = CaptureConfig {
            sources: SourceSet::EMPTY.with(Source::Registry),
            processes: ProcessFilter::new(&[9], &[]).unwrap(),
            ..CaptureConfig::default()
        };
        let without_nine = CaptureConfig {
            processes: ProcessFilter::new(&[], &[9]).unwrap(),
            ..only_nine
        };
        for config in [
            CaptureConfig::default(),
            extreme_config(),
            only_nine,
            without_nine,
        ] {
            cell.write(&config);
            for source in Source::ALL {
                for process_id in [0, 4, 9, u32::MAX, u32::MAX - 7, u32::MAX - 8, u32::MAX - 15] {
                    assert_eq!(
                        cell.for_event(source, process_id),
                        expected_for_event(&config, source, process_id),
                        "{source:?} in {process_id} under {config:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_reader_never_sees_a_mix_of_two_configurations() {
        let cell = ConfigCell::new(&CaptureConfig::default());
        let configs = [CaptureConfig::default(), extreme_config()];
        let rounds = if cfg!(miri) { 20 } else { 20_000 };
        std::thread::scope(|scope| {
            scope.spawn(|| {
                for round in 0..rounds {
                    cell.write(&configs[round % 2]);
                }
            });
            let events = configs.map(|config| expected_for_event(&config, Source::Timer, u32::MAX));
            for _ in 0..rounds {
                let seen = cell.load();
                assert!(configs.contains(&seen), "a mixed configuration: {seen:?}");
                let event = cell.for_event(Source::Timer, u32::MAX);
                assert!(
                    events.contains(&event),
                    "a mixed event configuration: {event:?}"
                );
            }
        });
    }

    #[test]
    fn sampling_keeps_the_first_then_every_nth_event_per_processor_and_counts_the_rest() {
        let ring = ring_of_records(8, 2);
        let core = registered_core(ring, PagingExecutive::NOT_SET, all_registered());
        let platform = FakePlatform::default();
        let mut sample_every = [1; Source::COUNT];
        sample_every[Source::Process.index()] = 3;
        core.set_config(
            &platform,
            &CaptureConfig {
                sources: SourceSet::ALL,
                sample_every,
                ..CaptureConfig::default()
            },
        );
        let outcomes: Vec<_> = [0, 0, 0, 0, 1, 1]
            .into_iter()
            .map(|processor| {
                platform.processor.set(processor);
                core.capture(&platform, PROCESS_EXIT)
            })
            .collect();
        assert_eq!(
            outcomes,
            [
                CaptureOutcome::Published(1),
                CaptureOutcome::SampledOut,
                CaptureOutcome::SampledOut,
                CaptureOutcome::Published(2),
                CaptureOutcome::Published(1),
                CaptureOutcome::SampledOut,
            ],
            "each processor keeps its 1st and 4th"
        );
        assert_eq!(
            core.ring
                .uncaptured(Source::Process, Uncaptured::SampledOut),
            3
        );
        assert_eq!(platform.walks.get(), 3, "no walk for an event sampled out");
        assert_eq!(
            core.capture(&platform, SourceFacts::Timer),
            CaptureOutcome::Published(2),
            "other sources keep every event"
        );
        assert_eq!(
            core.ring.uncaptured(Source::Timer, Uncaptured::SampledOut),
            0
        );
    }
}
