//! Serving the IOCTLs. Every length, code and field is checked with
//! kstack-abi before it is used; a refused request changes nothing.

use kstack_abi::{
    CaptureConfig, HostRoutine, Ioctl, KSTACK_VERSION, MAX_FRAMES, ReadHeader, RecordFlags,
    RequestError, Source, SourceFacts, SourceStatus, StatusResponse, decode_record, encode_record,
    messages::{READ_HEADER_SIZE, decode_capture_now_request, decode_configure_request},
    ntstatus::{
        KSTACK_STATUS_NO_APC, KSTACK_STATUS_PAGING_EXECUTIVE_REQUIRED,
        KSTACK_STATUS_SOURCE_DISABLED, KSTACK_STATUS_STACK_TOO_LOW, NtStatus,
        STATUS_BUFFER_OVERFLOW, STATUS_DEVICE_BUSY, STATUS_INVALID_PARAMETER, STATUS_NOT_SUPPORTED,
        STATUS_SUCCESS,
    },
    record_flags, record_os_hash, record_timestamp, set_record_os_hash,
    thread_capture::{
        CaptureThreadsReply, MAX_THREAD_CAPTURES, ThreadRequestOutcome,
        decode_capture_threads_request,
    },
};

use crate::{
    capture::{DriverCore, NoWalk, Stack},
    paging_policy,
    platform::{Platform, Routine},
    sharded_ring::{Shard, Uncaptured},
    sync::Ordering,
    thread_captures::{self, Requested},
};

/// Record-clock ticks (100 ns) in a millisecond.
const TICKS_PER_MILLISECOND: u64 = 10_000;

/// Who sent a request, and what the driver holds outside the core.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Caller {
    /// The reader: the file object the request came on (its address). Reads
    /// from one reader get each table stack once (see
    /// `kstack_abi::RecordFlags::STACK_BY_ID`).
    pub reader: u64,
    /// Pool allocations the driver holds now (for the status).
    pub pool_allocations: u32,
}

/// What requests change outside the core.
pub trait SourceControl {
    /// Starts the periodic timer with this period (restarting it if it
    /// runs), or stops it (`None`) and waits for its DPC to finish.
    ///
    /// Max IRQL: `PASSIVE_LEVEL`.
    fn set_timer(&self, period_ms: Option<u32>);

    /// Queues the special kernel APC of thread-capture slot `slot` (armed)
    /// to thread `thread_id`, with the references it needs.
    ///
    /// # Errors
    /// What went wrong when it could not; then no routine will run for the
    /// slot.
    ///
    /// Max IRQL: `PASSIVE_LEVEL`.
    fn queue_thread_capture(&self, thread_id: u32, slot: usize)
    -> Result<(), ThreadRequestOutcome>;
}

/// A request's status and the bytes written to its output buffer.
pub type Served = (NtStatus, usize);

impl DriverCore<'_> {
    /// Step one of a request: which request it is, and whether its buffer
    /// lengths are acceptable. After this the input is at most
    /// [`kstack_abi::ioctl::MAX_INPUT_LENGTH`] bytes.
    ///
    /// # Errors
    /// The status to complete the request with.
    ///
    /// Max IRQL: any.
    pub fn admit(code: u32, input_length: usize, output_length: usize) -> Result<Ioctl, NtStatus> {
        let ioctl = Ioctl::from_code(code).ok_or(RequestError::UnknownCode { code }.ntstatus())?;
        ioctl
            .check_lengths(input_length, output_length)
            .map_err(RequestError::ntstatus)?;
        Ok(ioctl)
    }

    /// Step two: serves an admitted request. `input` must be a copy (with
    /// METHOD_BUFFERED the output buffer is the same memory as the input).
    ///
    /// Max IRQL: `PASSIVE_LEVEL`.
    pub fn serve(
        &self,
        ioctl: Ioctl,
        input: &[u8],
        output: &mut [u8],
        platform: &impl Platform,
        control: &impl SourceControl,
        caller: Caller,
    ) -> Served {
        match ioctl {
            Ioctl::Status => self.serve_status(output, caller.pool_allocations),
            Ioctl::Configure => (self.configure(input, platform, control), 0),
            Ioctl::Read => self.read(output, platform, caller.reader),
            Ioctl::Clear => (self.clear(), 0),
            Ioctl::CaptureNow => self.capture_now(input, output, platform),
            Ioctl::CaptureThreads => self.capture_threads(input, output, platform, control),
        }
    }

    /// Forgets `reader` (a file object being closed) as the last reader,
    /// so that a new file object at the same address is a new reader.
    ///
    /// Max IRQL: `DISPATCH_LEVEL` (the driver calls it at `PASSIVE_LEVEL`).
    pub fn reader_closed(&self, reader: u64) {
        self.table.reader_closed(reader);
    }

    /// The status response.
    ///
    /// Max IRQL: `DISPATCH_LEVEL`.
    #[must_use]
    pub fn status(&self, pool_allocations: u32) -> StatusResponse {
        let sources = Source::ALL.map(|source| SourceStatus {
            registration: self.registration(source).status,
            available: self.registration(source).available(),
            ..self.ring.source_counts(source)
        });
        StatusResponse {
            driver_version: KSTACK_VERSION,
            paging_executive: self.paging,
            ring_capacity: u32::try_from(self.ring.capacity()).unwrap_or(u32::MAX),
            ring_used: u32::try_from(self.ring.len()).unwrap_or(u32::MAX),
            ring_used_bytes: u32::try_from(self.ring.bytes_used()).unwrap_or(u32::MAX),
            ring_shards: u32::try_from(self.ring.shards().len()).unwrap_or(u32::MAX),
            outstanding_allocations: pool_allocations,
            config: self.config(),
            dropped: self.ring.dropped(),
            cleared: self.cleared.load(Ordering::Relaxed),
            read: self.ring.read(),
            sequences_spent: self.ring.sequences_spent(),
            sources,
            driver_image: self.image,
            object_altitude: self.altitude(Source::ObjectHandle),
            registry_altitude: self.altitude(Source::Registry),
            stack_table: self
                .table
                .status(self.ring.shards().iter().map(Shard::table_counters)),
            user_walk: self.routine(Routine::UserWalk),
            process_key: self.routine(Routine::ProcessKey),
            module_records: self.ring.module_records(),
            apc: self.routine(Routine::Apc),
            apc_take_back: self.routine(Routine::ApcTakeBack),
            thread_captures: self.thread_captures.status(),
        }
    }

    /// Writes the status response.
    ///
    /// Never inlined, as every request but the two that walk: the status
    /// (over 600 bytes) and the decoded configuration stay out of the
    /// dispatch routine's frame, which a capture-now walk sits on top of
    /// (`docs/kernel-stack.md`).
    #[inline(never)]
    fn serve_status(&self, output: &mut [u8], pool_allocations: u32) -> Served {
        let (written, complete) = self.status(pool_allocations).encode(output);
        (
            if complete {
                STATUS_SUCCESS
            } else {
                STATUS_BUFFER_OVERFLOW
            },
            written,
        )
    }

    /// Applies a configure request, or refuses it and changes nothing.
    /// Never inlined (see [`DriverCore::serve_status`]).
    #[inline(never)]
    fn configure(
        &self,
        input: &[u8],
        platform: &impl Platform,
        control: &impl SourceControl,
    ) -> NtStatus {
        let config = match decode_configure_request(input) {
            Ok(config) => config,
            Err(error) => return error.ntstatus(),
        };
        if config
            .sources
            .iter()
            .any(|source| !self.registration(source).available())
        {
            return STATUS_NOT_SUPPORTED;
        }
        if let Err(status) = paging_policy::check_sources(config.sources, self.paging) {
            return status;
        }
        if self
            .configuring
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return STATUS_DEVICE_BUSY;
        }
        let previous = self.config();
        self.set_config(platform, &config);
        match timer_change(&previous, &config) {
            TimerChange::Keep => {}
            TimerChange::Start(period) => control.set_timer(Some(period)),
            TimerChange::Stop => control.set_timer(None),
        }
        self.configuring.store(false, Ordering::Release);
        STATUS_SUCCESS
    }

    /// Drains whole records of every shard stamped before the read began,
    /// oldest first by timestamp, after a read header; a tabled record as
    /// [`DriverCore::read_out`] writes it. Never inlined (see
    /// [`DriverCore::serve_status`]).
    #[inline(never)]
    fn read(&self, output: &mut [u8], platform: &impl Platform, reader: u64) -> Served {
        let Some(mut consumer) = self.ring.consumer() else {
            return (STATUS_DEVICE_BUSY, 0);
        };
        let epoch = self.table.begin_read(reader);
        let cut = consumer.cut(platform.timestamp());
        let (header, payload) = output.split_at_mut(READ_HEADER_SIZE);
        let drained = consumer.drain_with(payload, record_timestamp, cut, |record, room| {
            self.read_out(record, room, epoch)
        });
        ReadHeader {
            record_count: drained.records,
            payload_bytes: u32::try_from(drained.bytes).unwrap_or(u32::MAX),
            more_pending: drained.more_pending,
            dropped: self.ring.dropped(),
        }
        .encode(header);
        (STATUS_SUCCESS, READ_HEADER_SIZE + drained.bytes)
    }

    /// Writes `record` into `room` as the reader of `epoch` receives it,
    /// and returns its size, or `None` when it does not fit. A tabled
    /// record gets its OS hash back, and the table's frames when this
    /// reader lacks them; then it gives back its reference on the entry.
    ///
    /// Max IRQL: `DISPATCH_LEVEL` (the driver calls it at `PASSIVE_LEVEL`).
    fn read_out(&self, record: &[u8], room: &mut [u8], epoch: u64) -> Option<usize> {
        let copy = |room: &mut [u8]| {
            room.get_mut(..record.len())?.copy_from_slice(record);
            Some(record.len())
        };
        let Some(slot) = tabled_slot(record) else {
            return copy(room);
        };
        if let Some(os_hash) = self.table.received(slot, epoch) {
            let size = copy(room)?;
            set_record_os_hash(room, os_hash);
            self.table.release(slot);
            return Some(size);
        }
        let mut frames = [0_u64; MAX_FRAMES as usize];
        let found = decode_record(record)
            .ok()
            .and_then(|(view, _)| Some((view.header, self.table.frames_for(slot, &mut frames)?)));
        // Never in practice: a record naming no entry goes out as it is.
        let Some((mut header, (os_hash, count))) = found else {
            return copy(room);
        };
        header.os_hash = os_hash;
        let size = encode_record(&header, &frames[..count], room).ok()?;
        self.table.sent(slot, epoch);
        self.table.release(slot);
        Some(size)
    }

    /// Discards every record in every shard and counts them; tabled ones
    /// give back their references.
    fn clear(&self) -> NtStatus {
        let Some(mut consumer) = self.ring.consumer() else {
            return STATUS_DEVICE_BUSY;
        };
        let discarded = consumer.discard_each(|record| {
            if let Some(slot) = tabled_slot(record) {
                self.table.release(slot);
            }
        });
        self.cleared.fetch_add(discarded, Ordering::Relaxed);
        STATUS_SUCCESS
    }

    /// Walks the caller's stack and returns the record; keeps it in the ring
    /// too when the on-demand source is enabled and the process filter
    /// admits the caller, else counts it as not kept or filtered.
    ///
    /// Never inlined: its frames stay out of the dispatch routine's frame,
    /// so the other requests' frames do not add to the walk's stack
    /// (`docs/kernel-stack.md`).
    #[inline(never)]
    fn capture_now(&self, input: &[u8], output: &mut [u8], platform: &impl Platform) -> Served {
        let tag = match decode_capture_now_request(input) {
            Ok(tag) => tag,
            Err(error) => return (error.ntstatus(), 0),
        };
        let facts = SourceFacts::OnDemand { tag };
        let ids = platform.current_ids();
        let config = self.event_config(Source::OnDemand, ids.0);
        let mut stack = Stack::EMPTY;
        match self.walk(platform, config, Source::OnDemand, &mut stack) {
            Ok(()) => {}
            Err(NoWalk::Irql) => return (KSTACK_STATUS_PAGING_EXECUTIVE_REQUIRED, 0),
            Err(NoWalk::Stack) => return (KSTACK_STATUS_STACK_TOO_LOW, 0),
        }
        let left_out = if !config.enabled {
            Some(Uncaptured::NotKept)
        } else if !config.admitted {
            Some(Uncaptured::Filtered)
        } else {
            None
        };
        let header = match left_out {
            // A full shard drops the ring's copy (counted); the caller
            // still gets it, with the sequence number it spent.
            None => self.publish(platform, &stack, facts, ids).1,
            Some(why) => {
                self.count(platform, Source::OnDemand, why);
                self.unkept(platform, &stack, facts, ids)
            }
        };
        (STATUS_SUCCESS, stack.encode(&header, output))
    }

    /// Checks a capture-threads request against its layout and the
    /// driver's state, in the order `kstack_abi::Ioctl::CaptureThreads`
    /// documents; a refused request queues and counts nothing.
    ///
    /// Never inlined (see [`DriverCore::serve_status`]).
    ///
    /// Max IRQL: `PASSIVE_LEVEL`.
    #[inline(never)]
    fn capture_threads(
        &self,
        input: &[u8],
        output: &mut [u8],
        platform: &impl Platform,
        control: &impl SourceControl,
    ) -> Served {
        let request = match decode_capture_threads_request(input) {
            Ok(request) => request,
            Err(error) => return (error.ntstatus(), 0),
        };
        if self.routine(Routine::Apc) != HostRoutine::Available {
            return (KSTACK_STATUS_NO_APC, 0);
        }
        if !self.config().sources.contains(Source::ThreadStack) {
            return (KSTACK_STATUS_SOURCE_DISABLED, 0);
        }
        let requested = Requested {
            tag: request.tag,
            at: platform.timestamp(),
            timeout: u64::from(request.timeout_ms) * TICKS_PER_MILLISECOND,
        };
        let own = platform.current_ids().1;
        let mut outcomes = [ThreadRequestOutcome::Queued; MAX_THREAD_CAPTURES];
        for (outcome, &thread_id) in outcomes.iter_mut().zip(request.requested()) {
            *outcome = self.queue_thread_capture(thread_id, own, requested, control);
            let counters = &self.thread_captures.counters;
            thread_captures::count(&counters.requested);
            thread_captures::count(match outcome {
                ThreadRequestOutcome::Queued => &counters.queued,
                ThreadRequestOutcome::NoSuchThread => &counters.no_such_thread,
                ThreadRequestOutcome::NoSlot => &counters.no_slot,
                ThreadRequestOutcome::NotQueued => &counters.not_queued,
                ThreadRequestOutcome::SystemThread => &counters.refused_system_thread,
                ThreadRequestOutcome::Own => &counters.own,
            });
        }
        let reply = CaptureThreadsReply::new(&outcomes[..request.requested().len()]);
        match reply {
            Some(reply) => (STATUS_SUCCESS, reply.encode(output)),
            None => (STATUS_INVALID_PARAMETER, 0),
        }
    }

    /// One thread id of a capture-threads request: a slot armed with the
    /// request and the APC queued through `control`, or why not.
    ///
    /// Max IRQL: `PASSIVE_LEVEL`.
    fn queue_thread_capture(
        &self,
        thread_id: u32,
        own: u32,
        requested: Requested,
        control: &impl SourceControl,
    ) -> ThreadRequestOutcome {
        if thread_id == own {
            return ThreadRequestOutcome::Own;
        }
        let Some(slot) = self.thread_captures.arm(requested) else {
            return ThreadRequestOutcome::NoSlot;
        };
        match control.queue_thread_capture(thread_id, slot) {
            Ok(()) => ThreadRequestOutcome::Queued,
            Err(outcome) => {
                self.thread_captures.refused(slot);
                outcome
            }
        }
    }
}

/// The stack table slot a ring record names, if its stack is tabled (the
/// ring keeps the slot where the OS hash goes, see `capture::by_id`).
///
/// Max IRQL: any.
fn tabled_slot(record: &[u8]) -> Option<u32> {
    record_flags(record)
        .contains(RecordFlags::STACK_BY_ID)
        .then(|| record_os_hash(record))
}

/// What the timer must do when the configuration changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TimerChange {
    /// Nothing.
    Keep,
    /// Start, or restart with this period (ms).
    Start(u32),
    /// Stop.
    Stop,
}

fn timer_change(previous: &CaptureConfig, next: &CaptureConfig) -> TimerChange {
    let was = previous
        .sources
        .contains(Source::Timer)
        .then_some(previous.timer_period_ms);
    let will = next
        .sources
        .contains(Source::Timer)
        .then_some(next.timer_period_ms);
    match will {
        _ if was == will => TimerChange::Keep,
        Some(period) => TimerChange::Start(period),
        None => TimerChange::Stop,
    }
}

#[cfg(test)]
mod tests {
    use std::{cell::RefCell, vec::Vec};

    use kstack_abi::{
        MAX_RECORD_SIZE, PagingExecutive, ProcessFilter, RecordFlags, SourceSet, decode_record,
        ioctl::MIN_READ_BUFFER,
        messages::{
            CAPTURE_NOW_REQUEST_SIZE, STATUS_RESPONSE_SIZE, encode_capture_now_request,
            encode_configure_request,
        },
        ntstatus::{
            STATUS_BUFFER_TOO_SMALL, STATUS_INVALID_BUFFER_SIZE, STATUS_INVALID_DEVICE_REQUEST,
            STATUS_INVALID_PARAMETER_3, STATUS_REVISION_MISMATCH,
        },
    };

    use proptest::prelude::*;

    use super::*;
    use crate::{
        CaptureOutcome, SourceRegistration,
        capture::tests::{FakePlatform, all_registered, registered_core, ring_of_records},
    };

    /// The driver's side of requests, faked: the timer's starts and stops,
    /// and the thread-capture APCs queued (thread id, slot). Thread ids
    /// from 1000 up name no thread, 4 is a system thread, 5 is exiting (the
    /// kernel refuses its APC); any other id takes its APC.
    #[derive(Default)]
    struct TimerLog(RefCell<Vec<Option<u32>>>, RefCell<Vec<(u32, usize)>>);

    impl SourceControl for TimerLog {
        fn set_timer(&self, period_ms: Option<u32>) {
            self.0.borrow_mut().push(period_ms);
        }

        fn queue_thread_capture(
            &self,
            thread_id: u32,
            slot: usize,
        ) -> Result<(), ThreadRequestOutcome> {
            match thread_id {
                1000.. => Err(ThreadRequestOutcome::NoSuchThread),
                4 => Err(ThreadRequestOutcome::SystemThread),
                5 => Err(ThreadRequestOutcome::NotQueued),
                _ => {
                    self.1.borrow_mut().push((thread_id, slot));
                    Ok(())
                }
            }
        }
    }

    /// Runs one request through both steps, as the driver does.
    fn request(
        core: &DriverCore<'_>,
        ioctl_code: u32,
        input: &[u8],
        output: &mut [u8],
        timer: &TimerLog,
    ) -> Served {
        match DriverCore::admit(ioctl_code, input.len(), output.len()) {
            Ok(ioctl) => core.serve(
                ioctl,
                input,
                output,
                &FakePlatform::default(),
                timer,
                Caller {
                    reader: 1,
                    pool_allocations: 3,
                },
            ),
            Err(status) => (status, 0),
        }
    }

    fn enable(core: &DriverCore<'_>, sources: SourceSet, timer: &TimerLog) -> NtStatus {
        configure(
            core,
            &CaptureConfig {
                sources,
                ..CaptureConfig::default()
            },
            timer,
        )
    }

    fn configure(core: &DriverCore<'_>, config: &CaptureConfig, timer: &TimerLog) -> NtStatus {
        request(
            core,
            Ioctl::Configure.code(),
            &encode_configure_request(config),
            &mut [],
            timer,
        )
        .0
    }

    fn status(core: &DriverCore<'_>) -> StatusResponse {
        let mut out = [0_u8; STATUS_RESPONSE_SIZE];
        let (result, written) = request(
            core,
            Ioctl::Status.code(),
            &[],
            &mut out,
            &TimerLog::default(),
        );
        assert_eq!((result, written), (STATUS_SUCCESS, STATUS_RESPONSE_SIZE));
        StatusResponse::decode(&out).unwrap()
    }

    /// A clear request, which must succeed; then the status.
    fn clear(core: &DriverCore<'_>, timer: &TimerLog) -> StatusResponse {
        assert_eq!(
            request(core, Ioctl::Clear.code(), &[], &mut [], timer),
            (STATUS_SUCCESS, 0)
        );
        status(core)
    }

    fn timer_config(period: u32) -> CaptureConfig {
        CaptureConfig {
            sources: SourceSet::EMPTY.with(Source::Timer),
            timer_period_ms: period,
            ..CaptureConfig::default()
        }
    }

    #[test]
    fn admit_checks_code_and_lengths_first() {
        assert_eq!(
            DriverCore::admit(0x1234, 0, 0),
            Err(STATUS_INVALID_DEVICE_REQUEST)
        );
        assert_eq!(
            DriverCore::admit(Ioctl::Read.code(), 0, 10),
            Err(STATUS_BUFFER_TOO_SMALL)
        );
        assert_eq!(
            DriverCore::admit(Ioctl::Configure.code(), 3, 0),
            Err(STATUS_INVALID_BUFFER_SIZE)
        );
        assert_eq!(
            DriverCore::admit(Ioctl::Status.code(), 0, 8),
            Ok(Ioctl::Status)
        );
    }

    #[test]
    fn status_reports_the_state() {
        let ring = ring_of_records(8, 1);
        let mut registrations = all_registered();
        registrations[Source::Registry.index()] = SourceRegistration {
            status: STATUS_NOT_SUPPORTED,
        };
        let core = registered_core(ring, PagingExecutive::assumed(), registrations);
        let at = kstack_abi::Altitude {
            whole: 385_291,
            fraction: 1,
        };
        core.set_altitude(Source::ObjectHandle, at);
        core.set_altitude(Source::Timer, at);
        let status = status(&core);
        assert_eq!(
            (status.object_altitude, status.registry_altitude),
            (at, kstack_abi::Altitude::default()),
            "only the object and registry sources have an altitude"
        );
        assert_eq!(
            core.altitude(Source::Timer),
            kstack_abi::Altitude::default()
        );
        let registry_at = kstack_abi::Altitude {
            whole: 385_290,
            fraction: 2,
        };
        core.set_altitude(Source::Registry, registry_at);
        assert_eq!(
            (
                core.altitude(Source::Registry),
                core.altitude(Source::ObjectHandle)
            ),
            (registry_at, at),
            "each source its own altitude"
        );
        assert_eq!(
            (status.ring_capacity, status.ring_shards),
            (8 * 112, 1),
            "bytes: 8 records of 5 frames"
        );
        assert_eq!(status.paging_executive, PagingExecutive::assumed());
        assert_eq!(status.outstanding_allocations, 3);
        assert_eq!(status.sequences_spent, 0);
        assert!(!status.sources[Source::Registry.index()].available);
        assert_eq!(
            status.sources[Source::Registry.index()].registration,
            STATUS_NOT_SUPPORTED
        );
        assert!(status.sources[Source::Process.index()].available);
    }

    #[test]
    fn configure_round_trips_and_bad_configs_change_nothing() {
        let ring = ring_of_records(8, 1);
        let core = registered_core(ring, PagingExecutive::NOT_SET, all_registered());
        let timer = TimerLog::default();
        let wanted = CaptureConfig {
            sources: SourceSet::EMPTY
                .with(Source::Process)
                .with(Source::ImageLoad),
            frames_to_skip: 1,
            frames_to_capture: 40,
            processes: ProcessFilter::new(&[8], &[0]).unwrap(),
            sample_every: Source::ALL.map(|source| if source.is_request() { 1 } else { 2 }),
            timer_period_ms: 20,
            user_frames: [1, 2, 3, 4, 5, 0, 62, 7],
        };
        assert_eq!(configure(&core, &wanted, &timer), STATUS_SUCCESS);
        assert_eq!(status(&core).config, wanted);

        let mut bad = encode_configure_request(&wanted);
        bad[0] = 0xEE; // an ABI version no release has
        assert_eq!(
            request(&core, Ioctl::Configure.code(), &bad, &mut [], &timer).0,
            STATUS_REVISION_MISMATCH
        );
        let too_many = CaptureConfig {
            frames_to_capture: 63,
            ..wanted
        };
        assert_eq!(
            configure(&core, &too_many, &timer),
            STATUS_INVALID_PARAMETER_3
        );
        assert_eq!(
            status(&core).config,
            wanted,
            "refused requests change nothing"
        );
        assert!(timer.0.borrow().is_empty());
    }

    #[test]
    fn unavailable_sources_cannot_be_enabled() {
        let ring = ring_of_records(8, 1);
        let mut registrations = all_registered();
        registrations[Source::Registry.index()] = SourceRegistration {
            status: STATUS_NOT_SUPPORTED,
        };
        let core = registered_core(ring, PagingExecutive::NOT_SET, registrations);
        let config = CaptureConfig {
            sources: SourceSet::EMPTY.with(Source::Registry),
            ..CaptureConfig::default()
        };
        assert_eq!(
            configure(&core, &config, &TimerLog::default()),
            STATUS_NOT_SUPPORTED
        );
        assert_eq!(status(&core).config, CaptureConfig::default());
    }

    #[test]
    fn the_timer_needs_paging_executive_disabled_and_is_started_and_stopped() {
        let refused_ring = ring_of_records(8, 1);
        let refused = registered_core(refused_ring, PagingExecutive::NOT_SET, all_registered());
        let timer = TimerLog::default();
        assert_eq!(
            configure(&refused, &timer_config(10), &timer),
            KSTACK_STATUS_PAGING_EXECUTIVE_REQUIRED
        );
        assert!(timer.0.borrow().is_empty());

        let ring = ring_of_records(8, 1);
        let core = registered_core(ring, PagingExecutive::assumed(), all_registered());
        assert_eq!(configure(&core, &timer_config(10), &timer), STATUS_SUCCESS);
        assert_eq!(
            configure(&core, &timer_config(10), &timer),
            STATUS_SUCCESS,
            "unchanged: no restart"
        );
        assert_eq!(configure(&core, &timer_config(50), &timer), STATUS_SUCCESS);
        assert_eq!(
            configure(&core, &CaptureConfig::default(), &timer),
            STATUS_SUCCESS
        );
        assert_eq!(*timer.0.borrow(), [Some(10), Some(50), None]);
    }

    #[test]
    fn read_returns_whole_records_after_a_header() {
        let ring = ring_of_records(8, 1);
        let core = registered_core(ring, PagingExecutive::NOT_SET, all_registered());
        let timer = TimerLog::default();
        enable(&core, SourceSet::ALL.without(Source::Timer), &timer);
        let platform = FakePlatform::default();
        for _ in 0..3 {
            core.capture(&platform, SourceFacts::Registry { notify_class: 1 });
        }
        let mut out = vec![0_u8; MIN_READ_BUFFER];
        let (result, written) = request(&core, Ioctl::Read.code(), &[], &mut out, &timer);
        assert_eq!(result, STATUS_SUCCESS);
        let (header, _) = ReadHeader::decode(&out[..written]).unwrap();
        // 5-frame records are 112 bytes: the minimum buffer (one largest
        // record) holds five of them, so all three come out at once.
        assert_eq!(header.record_count, 3);
        assert_eq!(header.payload_bytes, 3 * 112);
        for _ in 0..2 {
            core.capture(&platform, SourceFacts::Registry { notify_class: 1 });
        }
        let mut big = vec![0_u8; 64 * 1024];
        let (_, written) = request(&core, Ioctl::Read.code(), &[], &mut big, &timer);
        let (header, records) = ReadHeader::decode(&big[..written]).unwrap();
        assert_eq!(header.record_count, 2);
        assert!(!header.more_pending);
        assert_eq!(records.count(), 2);
    }

    #[test]
    fn a_tabled_event_takes_only_its_facts_and_stack_id_in_the_ring() {
        let core = crate::capture::tests::tabled_core(
            ring_of_records(8, 1),
            8,
            PagingExecutive::NOT_SET,
            all_registered(),
        );
        let timer = TimerLog::default();
        enable(&core, SourceSet::EMPTY.with(Source::Registry), &timer);
        let platform = FakePlatform::default();
        let facts = SourceFacts::Registry { notify_class: 1 };
        for _ in 0..3 {
            core.capture(&platform, facts);
        }
        // The fake walk's 5 frames are in the table: every record names
        // them with one fact word, 56 bytes, where 112 would carry them.
        let now = status(&core);
        assert_eq!((now.ring_used, now.ring_used_bytes), (3, 3 * 56));
        assert_eq!(kstack_abi::by_id_record_size(&facts), 56);
        let mut out = vec![0_u8; MIN_READ_BUFFER];
        let (_, written) = request(&core, Ioctl::Read.code(), &[], &mut out, &timer);
        let (header, records) = ReadHeader::decode(&out[..written]).unwrap();
        // The first this reader receives carries the frames.
        assert_eq!(header.payload_bytes, 112 + 2 * 56);
        let frames: Vec<usize> = records
            .map(|entry| entry.unwrap().trace().unwrap().frame_count())
            .collect();
        assert_eq!(frames, [5, 0, 0]);
    }

    #[test]
    fn read_and_clear_cover_every_shard() {
        let core = registered_core(
            ring_of_records(16, 2),
            PagingExecutive::NOT_SET,
            all_registered(),
        );
        let timer = TimerLog::default();
        enable(&core, SourceSet::EMPTY.with(Source::Registry), &timer);
        let platform = FakePlatform::default();
        let capture_on = |processors: &[u32]| {
            for &processor in processors {
                platform.processor.set(processor);
                core.capture(&platform, SourceFacts::Registry { notify_class: 1 });
            }
        };
        capture_on(&[1, 0, 1, 1, 0, 0, 1]);
        let before = status(&core);
        assert_eq!(
            (
                before.ring_shards,
                before.ring_used,
                before.sequences_spent,
                before.sources[Source::Registry.index()].captured
            ),
            (2, 7, 7, 7)
        );
        // The smallest read holds five 112-byte records: the five oldest,
        // in time order across the shards; two wait.
        let mut out = vec![0_u8; MIN_READ_BUFFER];
        let (_, written) = request(&core, Ioctl::Read.code(), &[], &mut out, &timer);
        let (header, records) = ReadHeader::decode(&out[..written]).unwrap();
        assert!(header.more_pending);
        let named: Vec<_> = records
            .map(|record| {
                let record = record.unwrap().trace().unwrap();
                (record.header.shard, record.header.sequence)
            })
            .collect();
        assert_eq!(named, [(1, 1), (0, 1), (1, 2), (1, 3), (0, 2)]);
        capture_on(&[0, 0]);
        let after = clear(&core, &timer);
        assert_eq!(
            (after.cleared, after.ring_used, after.sequences_spent),
            (4, 0, 9),
            "the two left from the read and the two new ones"
        );
    }

    #[test]
    fn clear_discards_and_counts() {
        let ring = ring_of_records(8, 1);
        let core = registered_core(ring, PagingExecutive::NOT_SET, all_registered());
        let timer = TimerLog::default();
        enable(&core, SourceSet::EMPTY.with(Source::Thread), &timer);
        let platform = FakePlatform::default();
        let facts = SourceFacts::Thread {
            event: kstack_abi::source_facts::Lifecycle::Create,
            process_id: 4,
            thread_id: 8,
        };
        core.capture(&platform, facts);
        core.capture(&platform, facts);
        let status = clear(&core, &timer);
        assert_eq!(
            (status.cleared, status.ring_used, status.sequences_spent),
            (2, 0, 2)
        );
    }

    #[test]
    fn busy_consumers_are_told_so() {
        let ring = ring_of_records(8, 2);
        let core = registered_core(ring, PagingExecutive::NOT_SET, all_registered());
        // A reader holding any shard makes the device busy for another.
        let _held = core.ring.shards()[1].ring().consumer().unwrap();
        let mut out = vec![0_u8; MIN_READ_BUFFER];
        let timer = TimerLog::default();
        assert_eq!(
            request(&core, Ioctl::Read.code(), &[], &mut out, &timer).0,
            STATUS_DEVICE_BUSY
        );
        assert_eq!(
            request(&core, Ioctl::Clear.code(), &[], &mut [], &timer).0,
            STATUS_DEVICE_BUSY
        );
    }

    #[test]
    fn capture_now_with_too_little_stack_is_refused_and_counted() {
        let core = registered_core(
            ring_of_records(8, 1),
            PagingExecutive::NOT_SET,
            all_registered(),
        );
        let timer = TimerLog::default();
        enable(&core, SourceSet::EMPTY.with(Source::OnDemand), &timer);
        let platform = FakePlatform::default();
        platform
            .remaining_stack
            .set(crate::kernel_stack::MIN_REMAINING_STACK - 8);
        let input = encode_capture_now_request(3);
        let mut out = [0_u8; MAX_RECORD_SIZE];
        let admitted = DriverCore::admit(Ioctl::CaptureNow.code(), input.len(), out.len()).unwrap();
        assert_eq!(
            core.serve(
                admitted,
                &input,
                &mut out,
                &platform,
                &timer,
                Caller::default()
            ),
            (KSTACK_STATUS_STACK_TOO_LOW, 0)
        );
        assert_eq!(platform.walks.get(), 0);
        let counted = status(&core).sources[Source::OnDemand.index()];
        assert_eq!((counted.skipped_stack, counted.captured), (1, 0));
    }

    #[test]
    fn capture_now_returns_the_record_and_keeps_it_only_when_enabled() {
        let ring = ring_of_records(8, 1);
        let core = registered_core(ring, PagingExecutive::NOT_SET, all_registered());
        let timer = TimerLog::default();
        let mut out = [0_u8; MAX_RECORD_SIZE];
        let input = encode_capture_now_request(77);
        assert_eq!(input.len(), CAPTURE_NOW_REQUEST_SIZE);
        let (result, written) = request(&core, Ioctl::CaptureNow.code(), &input, &mut out, &timer);
        assert_eq!(result, STATUS_SUCCESS);
        let (record, _) = decode_record(&out[..written]).unwrap();
        assert_eq!(record.header.facts, SourceFacts::OnDemand { tag: 77 });
        assert!(record.header.flags.contains(RecordFlags::NOT_IN_RING));
        assert_eq!(record.header.sequence, 0);
        assert!(core.ring.is_empty());

        enable(&core, SourceSet::EMPTY.with(Source::OnDemand), &timer);
        let (_, written) = request(&core, Ioctl::CaptureNow.code(), &input, &mut out, &timer);
        let (record, _) = decode_record(&out[..written]).unwrap();
        assert_eq!(record.header.sequence, 1);
        assert!(!record.header.flags.contains(RecordFlags::NOT_IN_RING));
        assert_eq!(core.ring.len(), 1);
        let counted = status(&core).sources[Source::OnDemand.index()];
        assert_eq!(
            (counted.captured, counted.not_kept, counted.filtered),
            (1, 1, 0)
        );

        configure(
            &core,
            &CaptureConfig {
                sources: SourceSet::EMPTY.with(Source::OnDemand),
                processes: ProcessFilter::new(&[5], &[]).unwrap(),
                ..CaptureConfig::default()
            },
            &timer,
        );
        let (result, written) = request(&core, Ioctl::CaptureNow.code(), &input, &mut out, &timer);
        assert_eq!(result, STATUS_SUCCESS, "the caller is answered");
        let (record, _) = decode_record(&out[..written]).unwrap();
        assert!(record.header.flags.contains(RecordFlags::NOT_IN_RING));
        assert_eq!(core.ring.len(), 1, "process 4 is not 5: not kept");
        let counted = status(&core).sources[Source::OnDemand.index()];
        assert_eq!(
            (counted.captured, counted.not_kept, counted.filtered),
            (1, 1, 1)
        );
    }

    /// Facts of an event of a callback source (see [`CALLBACK_SOURCES`]).
    fn facts_of(source: Source) -> SourceFacts {
        match source {
            Source::Process => SourceFacts::Process {
                event: kstack_abi::source_facts::Lifecycle::Create,
                process_id: 30,
                parent_process_id: 4,
            },
            Source::Thread => SourceFacts::Thread {
                event: kstack_abi::source_facts::Lifecycle::Exit,
                process_id: 30,
                thread_id: 31,
            },
            Source::ImageLoad => SourceFacts::ImageLoad {
                image_base: 0x1_4000_0000,
                image_size: 0x1000,
                process_id: 30,
            },
            Source::Registry => SourceFacts::Registry { notify_class: 1 },
            Source::ObjectHandle => SourceFacts::ObjectHandle {
                operation: kstack_abi::source_facts::HandleOperation::Create,
                object: kstack_abi::source_facts::ObjectKind::Process,
                desired_access: 0x1000,
                target_process_id: 30,
            },
            Source::Timer => SourceFacts::Timer,
            Source::OnDemand | Source::ThreadStack => {
                unreachable!("{source:?}'s events come from requests")
            }
        }
    }

    /// The positions in `Source::ALL` of the sources whose events come
    /// from kernel callbacks: all but the request sources, which are last.
    const CALLBACK_SOURCES: core::ops::Range<usize> = 0..Source::OnDemand.index();

    #[derive(Clone, Debug)]
    enum Step {
        Event {
            source: usize,
            processor: u32,
            irql: u8,
            process_id: u32,
            low_stack: bool,
        },
        CaptureNow {
            processor: u32,
            process_id: u32,
        },
        Configure {
            sources: u32,
            include_four: bool,
            exclude_nine: bool,
            sample_every: u16,
        },
        Read(usize),
        Clear,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            6 => (CALLBACK_SOURCES, 0_u32..3, prop_oneof![Just(0_u8), Just(2_u8)], prop_oneof![Just(4_u32), Just(9_u32)], proptest::bool::weighted(0.2))
                .prop_map(|(source, processor, irql, process_id, low_stack)| Step::Event { source, processor, irql, process_id, low_stack }),
            2 => (0_u32..3, prop_oneof![Just(4_u32), Just(9_u32)])
                .prop_map(|(processor, process_id)| Step::CaptureNow { processor, process_id }),
            1 => (0_u32..1 << Source::COUNT, any::<bool>(), any::<bool>(), 1_u16..4)
                .prop_map(|(sources, include_four, exclude_nine, sample_every)| Step::Configure { sources, include_four, exclude_nine, sample_every }),
            2 => (MIN_READ_BUFFER..MIN_READ_BUFFER * 3).prop_map(Step::Read),
            1 => Just(Step::Clear),
        ]
    }

    /// The status the request proptests check after every step
    /// (`counters_add_up_after_every_step`,
    /// `every_record_a_reader_receives_has_its_stack`): the status request's
    /// reply, decoded as a client decodes it. Under Miri, the core's status
    /// that request encodes: encoding and decoding its 1,648 bytes take about
    /// 55,000 of the interpreter's basic blocks, more than a step and the
    /// gathering of the counters together. Miri still checks both, in
    /// `status_round_trips_and_has_the_documented_size` (kstack-abi) and this
    /// module's other status tests.
    fn counted_status(core: &DriverCore<'_>) -> StatusResponse {
        if cfg!(miri) {
            core.status(0)
        } else {
            status(core)
        }
    }

    proptest! {
        /// Events of every source at either IRQL from two processes,
        /// capture-now, configure, reads and clears in any order: after
        /// every step each event is counted under exactly one counter, and
        /// the ABI's identities hold: the sources' `captured` add up to the
        /// sequence numbers spent, which are read + waiting + dropped +
        /// cleared. Reads come out in timestamp order, across reads too.
        #[test]
        fn counters_add_up_after_every_step(steps in proptest::collection::vec(step(), 0..60)) {
            // A small ring on two shards, so drops happen.
            let core = registered_core(ring_of_records(6, 2), PagingExecutive::assumed(), all_registered());
            core.set_routine(Routine::UserWalk, kstack_abi::HostRoutine::Available);
            let timer = TimerLog::default();
            let platform = FakePlatform::default();
            let mut events = [0_u64; Source::COUNT];
            let mut last_read = 0;
            for step in steps {
                match step {
                    Step::Event { source, processor, irql, process_id, low_stack } => {
                        let source = Source::ALL[source];
                        platform.processor.set(processor);
                        platform.irql.set(irql);
                        platform.process_id.set(process_id);
                        platform.remaining_stack.set(if low_stack { 4096 } else { 1 << 20 });
                        if core.capture(&platform, facts_of(source)) != CaptureOutcome::Disabled {
                            events[source.index()] += 1;
                        }
                        platform.irql.set(0);
                        platform.remaining_stack.set(1 << 20);
                    }
                    Step::CaptureNow { processor, process_id } => {
                        platform.processor.set(processor);
                        platform.process_id.set(process_id);
                        let mut out = [0_u8; MAX_RECORD_SIZE];
                        let input = encode_capture_now_request(1);
                        let admitted = DriverCore::admit(Ioctl::CaptureNow.code(), input.len(), out.len()).unwrap();
                        let (result, _) = core.serve(admitted, &input, &mut out, &platform, &timer, Caller::default());
                        prop_assert_eq!(result, STATUS_SUCCESS);
                        events[Source::OnDemand.index()] += 1;
                    }
                    Step::Configure { sources, include_four, exclude_nine, sample_every } => {
                        let include: &[u32] = if include_four { &[4] } else { &[] };
                        let exclude: &[u32] = if exclude_nine { &[9] } else { &[] };
                        let config = CaptureConfig {
                            sources: Source::ALL
                                .into_iter()
                                .filter(|source| sources & (1 << source.index()) != 0)
                                .fold(SourceSet::EMPTY, SourceSet::with),
                            processes: ProcessFilter::new(include, exclude).unwrap(),
                            sample_every: Source::ALL.map(|source| {
                                if source.is_request() { 1 } else { sample_every }
                            }),
                            ..CaptureConfig::default()
                        };
                        prop_assert_eq!(configure(&core, &config, &timer), STATUS_SUCCESS);
                    }
                    Step::Read(room) => {
                        let mut out = vec![0_u8; room];
                        let admitted = DriverCore::admit(Ioctl::Read.code(), 0, room).unwrap();
                        let (result, written) = core.serve(admitted, &[], &mut out, &platform, &timer, Caller::default());
                        prop_assert_eq!(result, STATUS_SUCCESS);
                        let (_, records) = ReadHeader::decode(&out[..written]).unwrap();
                        for record in records {
                            let timestamp = record.unwrap().trace().unwrap().header.timestamp;
                            prop_assert!(timestamp >= last_read, "read order");
                            last_read = timestamp;
                        }
                    }
                    Step::Clear => {
                        let _ = request(&core, Ioctl::Clear.code(), &[], &mut [], &timer);
                    }
                }
                let now = counted_status(&core);
                let captured: u64 = now.sources.iter().map(|source| source.captured).sum();
                prop_assert_eq!(captured, now.sequences_spent);
                prop_assert_eq!(
                    now.sequences_spent,
                    now.read + u64::from(now.ring_used) + now.dropped + now.cleared
                );
                for source in Source::ALL {
                    let counted = now.sources[source.index()];
                    prop_assert_eq!(
                        counted.captured
                            + counted.skipped_irql
                            + counted.skipped_stack
                            + counted.filtered
                            + counted.not_kept
                            + counted.sampled_out,
                        events[source.index()],
                        "{:?}: every event under exactly one counter", source
                    );
                    let answered_filtered = if source == Source::OnDemand { counted.filtered } else { 0 };
                    prop_assert_eq!(
                        counted.user_parts.iter().sum::<u64>(),
                        counted.captured + counted.not_kept + answered_filtered,
                        "{:?}: every record's user part counted once", source
                    );
                }
            }
        }
    }

    /// A kernel for threads: each thread its own processor number, no
    /// IRQL, one clock for all that moves on with every reading.
    struct ThreadPlatform {
        processor: u32,
    }

    impl Platform for ThreadPlatform {
        fn irql(&self) -> u8 {
            0
        }

        fn current_ids(&self) -> (u32, u32) {
            (4, self.processor)
        }

        fn processor(&self) -> u32 {
            self.processor
        }

        fn at_dispatch<R>(&self, section: impl FnOnce(u32) -> R) -> R {
            section(self.processor)
        }

        fn timestamp(&self) -> u64 {
            let now = crate::capture::tests::tick();
            // Preempted right after reading the clock now and then, as a
            // host that does not model IRQL can be: a stamp must still
            // not be overtaken.
            if now.is_multiple_of(4) {
                std::thread::yield_now();
            }
            now
        }

        fn remaining_stack(&self) -> usize {
            crate::kernel_stack::MIN_REMAINING_STACK
        }

        fn walk_stack(&self, _frames_to_skip: u32, frames: &mut [u64]) -> (usize, u32) {
            std::thread::yield_now();
            frames[0] = u64::from(self.processor);
            (1, 0)
        }

        fn user_thread(&self) -> crate::UserThread {
            crate::UserThread::default()
        }

        fn walk_user_stack(&self, _frames: &mut [u64]) -> Result<usize, crate::UserWalkFailure> {
            Ok(0)
        }
    }

    /// Six publisher threads on a ring of two small shards (three threads
    /// per shard, so publish sections contend and shards overflow), and a
    /// reader draining through read requests meanwhile with a buffer of a
    /// few records: every record read is stamped no earlier than the one
    /// before it, across all reads; each shard's numbers come in order; and
    /// at the end every event is a record read or a drop.
    #[test]
    fn concurrent_publishers_are_read_in_time_order() {
        const PUBLISHERS: u32 = 6;
        // Miri interprets every access: fewer events, the same contention.
        const EACH: u64 = if cfg!(miri) { 20 } else { 3000 };
        // Shards of 896 bytes: 11 of these one-frame records (80 bytes)
        // each, so the publishers outrun the reader.
        let core = registered_core(
            ring_of_records(8, 2),
            PagingExecutive::NOT_SET,
            all_registered(),
        );
        let timer = TimerLog::default();
        enable(&core, SourceSet::EMPTY.with(Source::Registry), &timer);
        let finished = std::sync::atomic::AtomicU32::new(0);
        let reader = ThreadPlatform { processor: 99 };
        let mut out = vec![0_u8; MIN_READ_BUFFER];
        let (mut last, mut read) = (0, 0_u64);
        let mut last_sequence = [0_u64; 2];
        std::thread::scope(|scope| {
            for processor in 0..PUBLISHERS {
                let (core, finished) = (&core, &finished);
                scope.spawn(move || {
                    let platform = ThreadPlatform { processor };
                    for _ in 0..EACH {
                        core.capture(&platform, SourceFacts::Registry { notify_class: 1 });
                    }
                    finished.fetch_add(1, std::sync::atomic::Ordering::Release);
                });
            }
            let mut wait = crate::Wait::new("the publishers to finish and every record to be read");
            loop {
                wait.turn();
                let done = finished.load(std::sync::atomic::Ordering::Acquire) == PUBLISHERS;
                let admitted = DriverCore::admit(Ioctl::Read.code(), 0, out.len()).unwrap();
                let (result, written) =
                    core.serve(admitted, &[], &mut out, &reader, &timer, Caller::default());
                assert_eq!(result, STATUS_SUCCESS);
                let (header, records) = ReadHeader::decode(&out[..written]).unwrap();
                for record in records {
                    let record = record.unwrap().trace().unwrap().header;
                    assert!(
                        record.timestamp >= last,
                        "a record older than one read before it"
                    );
                    last = record.timestamp;
                    let shard = usize::from(record.shard);
                    assert!(record.sequence > last_sequence[shard], "shard order");
                    last_sequence[shard] = record.sequence;
                    read += 1;
                }
                if done && !header.more_pending && core.ring.is_empty() {
                    break;
                }
            }
        });
        let now = status(&core);
        assert_eq!(read, now.read);
        assert_eq!(read + now.dropped, u64::from(PUBLISHERS) * EACH);
        assert_eq!(now.sequences_spent, u64::from(PUBLISHERS) * EACH);
        assert!(
            now.dropped > 0 && read > 0,
            "{read} read, {} dropped",
            now.dropped
        );
    }

    #[test]
    fn timer_change_table() {
        let off = CaptureConfig::default();
        let slow_but_off = CaptureConfig {
            timer_period_ms: 99,
            ..off
        };
        assert_eq!(timer_change(&off, &off), TimerChange::Keep);
        assert_eq!(timer_change(&off, &timer_config(5)), TimerChange::Start(5));
        assert_eq!(
            timer_change(&timer_config(5), &timer_config(5)),
            TimerChange::Keep
        );
        assert_eq!(
            timer_change(&timer_config(5), &timer_config(6)),
            TimerChange::Start(6)
        );
        assert_eq!(timer_change(&timer_config(5), &off), TimerChange::Stop);
        // A period change while the timer is off does nothing.
        assert_eq!(timer_change(&off, &slow_but_off), TimerChange::Keep);
    }

    #[derive(Clone, Debug)]
    enum TableStep {
        /// A registry event on this processor with a stack this deep.
        Capture {
            processor: u32,
            depth: u8,
        },
        /// A read by reader 1 or 2 with this much room.
        Read {
            reader: u64,
            room: usize,
        },
        Clear,
        /// An image load into this process on this processor.
        Module {
            processor: u32,
            process_id: u32,
        },
    }

    fn table_step() -> impl Strategy<Value = TableStep> {
        prop_oneof![
            // Depth 0: a walk that found no frames.
            6 => (0_u32..2, 0_u8..7).prop_map(|(processor, depth)| TableStep::Capture { processor, depth }),
            2 => (1_u64..3, MIN_READ_BUFFER..4 * MIN_READ_BUFFER)
                .prop_map(|(reader, room)| TableStep::Read { reader, room }),
            1 => Just(TableStep::Clear),
            1 => (0_u32..2, 1_u32..1000)
                .prop_map(|(processor, process_id)| TableStep::Module { processor, process_id }),
        ]
    }

    /// The path of the image the guarantee test loads into `process_id`.
    fn module_path(process_id: u32) -> Vec<u16> {
        format!(r"C:\image-{process_id}.dll")
            .encode_utf16()
            .collect()
    }

    /// The fake platform's frames for a stack `depth` deep.
    fn fake_frames(depth: u8) -> Vec<u64> {
        (1..=u64::from(depth)).map(|frame| 0x1000 * frame).collect()
    }

    proptest! {
        /// The stack table's guarantee (`RecordFlags::STACK_BY_ID`): with a
        /// table small enough to fill and evict, a ring small enough to
        /// overflow, two readers taking turns and clears, every record a
        /// reader receives resolves, through what that reader received
        /// before, to exactly the stack its event walked; the lookup
        /// outcomes add up to the records that entered the ring; module
        /// records in between reach the readers as they were written; and
        /// once the ring is empty no entry is held.
        #[test]
        fn every_record_a_reader_receives_has_its_stack(
            entries in prop_oneof![Just(1_usize), Just(2), Just(8)],
            // Miri interprets every access: shorter runs there.
            steps in proptest::collection::vec(table_step(), 1..if cfg!(miri) { 40 } else { 120 }),
        ) {
            let core = crate::capture::tests::tabled_core(
                ring_of_records(6, 2),
                entries,
                PagingExecutive::NOT_SET,
                all_registered(),
            );
            let timer = TimerLog::default();
            enable(&core, SourceSet::EMPTY.with(Source::Registry), &timer);
            let mut remembered: [std::collections::HashMap<u64, Vec<u64>>; 2] = Default::default();
            let mut received = 0_u64;
            let mut read_until_empty = false;
            for step in steps.iter().cloned().chain(core::iter::once(TableStep::Read { reader: 1, room: 64 * 1024 })) {
                match step {
                    TableStep::Capture { processor, depth } => {
                        let platform = FakePlatform { stack_depth: usize::from(depth), ..FakePlatform::default() };
                        platform.processor.set(processor);
                        core.capture(&platform, SourceFacts::Registry { notify_class: u32::from(depth) });
                    }
                    TableStep::Read { reader, room } => {
                        let mut out = vec![0_u8; room];
                        let admitted = DriverCore::admit(Ioctl::Read.code(), 0, room).unwrap();
                        let caller = Caller { reader, pool_allocations: 0 };
                        let (result, written) = core.serve(admitted, &[], &mut out, &FakePlatform::default(), &timer, caller);
                        prop_assert_eq!(result, STATUS_SUCCESS);
                        let (header, records) = ReadHeader::decode(&out[..written]).unwrap();
                        read_until_empty = !header.more_pending;
                        let map = &mut remembered[usize::try_from(reader - 1).unwrap()];
                        for entry in records {
                            received += 1;
                            let record = match entry.unwrap() {
                                kstack_abi::Entry::Trace(record) => record,
                                kstack_abi::Entry::Module(module) => {
                                    let path: Vec<u16> = module.path_units().collect();
                                    prop_assert_eq!(path, module_path(module.header.process_id));
                                    prop_assert_eq!(module.header.image_base, u64::from(module.header.process_id) << 16);
                                    continue;
                                }
                            };
                            prop_assert_eq!(record.header.os_hash, 0xABCD, "the OS hash is put back");
                            let own: Vec<u64> = record.frames().collect();
                            let stack = if !record.header.flags.contains(RecordFlags::STACK_BY_ID) {
                                own
                            } else if own.is_empty() {
                                let known = map.get(&record.header.stack_id).cloned();
                                prop_assert!(known.is_some(), "a record names a stack its reader was never sent");
                                known.unwrap_or_default()
                            } else {
                                map.insert(record.header.stack_id, own.clone());
                                own
                            };
                            let SourceFacts::Registry { notify_class } = record.header.facts else {
                                panic!("a registry record");
                            };
                            prop_assert_eq!(stack, fake_frames(u8::try_from(notify_class).unwrap()));
                        }
                    }
                    TableStep::Clear => {
                        let _ = request(&core, Ioctl::Clear.code(), &[], &mut [], &timer);
                    }
                    TableStep::Module { processor, process_id } => {
                        let platform = FakePlatform::default();
                        platform.processor.set(processor);
                        let path = module_path(process_id);
                        let facts = crate::ModuleFacts::image_load(process_id, 0, (u64::from(process_id) << 16, 0x1000), &path, false);
                        let _ = core.record_module(&platform, &facts);
                    }
                }
                let now = counted_status(&core);
                let table = now.stack_table;
                let captured: u64 = now.sources.iter().map(|source| source.captured).sum();
                prop_assert_eq!(
                    table.hits + table.inserts + table.collisions + table.full + table.busy + table.empty,
                    captured
                );
                prop_assert_eq!(u64::from(table.used), table.inserts - table.evictions);
                prop_assert_eq!(captured + now.module_records, now.sequences_spent);
                prop_assert_eq!(
                    now.read + u64::from(now.ring_used) + now.dropped + now.cleared,
                    now.sequences_spent
                );
            }
            prop_assert!(read_until_empty);
            prop_assert_eq!(status(&core).read, received);
            prop_assert_eq!(core.table.references(), 0, "no entry held once the ring is empty");
        }
    }

    /// What the ABI's docs promise a client, pinned where the driver
    /// decides it: each test fails if the driver's behaviour moves away from
    /// the sentence of `kstack_abi` it names.
    mod contract {
        use kstack_abi::{
            RecordHeader, StackTableStatus,
            messages::CONFIGURE_REQUEST_SIZE,
            ntstatus::{STATUS_INVALID_PARAMETER_1, STATUS_INVALID_PARAMETER_5},
        };

        use super::*;

        /// A capture-now by `platform`'s thread: its status and the record
        /// it returned.
        fn capture_now(
            core: &DriverCore<'_>,
            platform: &FakePlatform,
        ) -> (NtStatus, Option<(RecordHeader, usize)>) {
            let input = encode_capture_now_request(7);
            let mut out = [0_u8; MAX_RECORD_SIZE];
            let admitted =
                DriverCore::admit(Ioctl::CaptureNow.code(), input.len(), out.len()).unwrap();
            let caller = Caller::default();
            let (result, written) = core.serve(
                admitted,
                &input,
                &mut out,
                platform,
                &TimerLog::default(),
                caller,
            );
            let record = (written > 0).then(|| {
                let (view, size) = decode_record(&out[..written]).unwrap();
                assert_eq!(size, written);
                (view.header, view.frame_count())
            });
            (result, record)
        }

        /// A read by `reader`: each record's flags and frame count.
        fn read_as(core: &DriverCore<'_>, reader: u64) -> Vec<(RecordFlags, usize)> {
            let mut out = vec![0_u8; 64 * 1024];
            let admitted = DriverCore::admit(Ioctl::Read.code(), 0, out.len()).unwrap();
            let caller = Caller {
                reader,
                pool_allocations: 0,
            };
            let (result, written) = core.serve(
                admitted,
                &[],
                &mut out,
                &FakePlatform::default(),
                &TimerLog::default(),
                caller,
            );
            assert_eq!(result, STATUS_SUCCESS);
            let (header, records) = ReadHeader::decode(&out[..written]).unwrap();
            assert!(!header.more_pending);
            records
                .map(|entry| {
                    let record = entry.unwrap().trace().unwrap();
                    (record.header.flags, record.frame_count())
                })
                .collect()
        }

        /// A core on a one-shard ring of 8 records, with a stack table of
        /// `entries` (0: off), every source registered.
        fn core_with_table(entries: usize) -> DriverCore<'static> {
            crate::capture::tests::tabled_core(
                ring_of_records(8, 1),
                entries,
                PagingExecutive::NOT_SET,
                all_registered(),
            )
        }

        fn on_demand(processes: ProcessFilter, enabled: bool) -> CaptureConfig {
            CaptureConfig {
                sources: if enabled {
                    SourceSet::EMPTY.with(Source::OnDemand)
                } else {
                    SourceSet::EMPTY
                },
                processes,
                ..CaptureConfig::default()
            }
        }

        /// `RecordHeader::shard`, `RecordFlags::NOT_IN_RING`: a capture-now
        /// no shard keeps has shard 0 and sequence 0, whichever processor
        /// it ran on; one kept has its shard's.
        #[test]
        fn a_capture_now_not_kept_has_shard_0_and_sequence_0() {
            let core = registered_core(
                ring_of_records(8, 2),
                PagingExecutive::NOT_SET,
                all_registered(),
            );
            let timer = TimerLog::default();
            let platform = FakePlatform::default();
            platform.processor.set(1);
            let excluded = ProcessFilter::new(&[], &[4]).unwrap();
            for config in [
                on_demand(ProcessFilter::ALL, false),
                on_demand(excluded, true),
            ] {
                assert_eq!(configure(&core, &config, &timer), STATUS_SUCCESS);
                let (result, record) = capture_now(&core, &platform);
                let (header, _) = record.unwrap();
                assert_eq!(result, STATUS_SUCCESS);
                assert!(header.flags.contains(RecordFlags::NOT_IN_RING));
                assert_eq!((header.shard, header.sequence, header.processor), (0, 0, 1));
            }
            assert!(core.ring.is_empty());
            configure(&core, &on_demand(ProcessFilter::ALL, true), &timer);
            let (header, _) = capture_now(&core, &platform).1.unwrap();
            assert!(!header.flags.contains(RecordFlags::NOT_IN_RING));
            assert_eq!((header.shard, header.sequence), (1, 1), "kept by shard 1");
        }

        /// `Ioctl::CaptureNow`: a kept capture-now whose shard is full is
        /// still answered, with the shard and the sequence number it spent.
        #[test]
        fn a_capture_now_dropped_from_a_full_shard_names_what_it_spent() {
            let core = registered_core(
                ring_of_records(1, 2),
                PagingExecutive::NOT_SET,
                all_registered(),
            );
            configure(
                &core,
                &on_demand(ProcessFilter::ALL, true),
                &TimerLog::default(),
            );
            let platform = FakePlatform::default();
            let kept = capture_now(&core, &platform).1.unwrap().0;
            let (result, dropped) = capture_now(&core, &platform);
            let dropped = dropped.unwrap().0;
            assert_eq!(result, STATUS_SUCCESS);
            assert_eq!((kept.shard, kept.sequence), (1, 1));
            assert_eq!((dropped.shard, dropped.sequence), (1, 2));
            assert!(!dropped.flags.contains(RecordFlags::NOT_IN_RING));
            let now = status(&core);
            assert_eq!((now.dropped, now.ring_used), (1, 1));
        }

        /// `SourceStatus::not_kept`: on-demand disabled and the caller
        /// excluded is `not_kept`, not `filtered`; enabled and excluded is
        /// `filtered`. `Ioctl::CaptureNow`: the walk's checks come first,
        /// and move `skipped_stack` of a disabled source too.
        #[test]
        fn a_capture_now_counts_disabled_before_filtered_and_the_stack_check_before_both() {
            let core = core_with_table(0);
            let timer = TimerLog::default();
            let platform = FakePlatform::default();
            let excluded = ProcessFilter::new(&[], &[4]).unwrap();
            let counted = |core: &DriverCore<'_>| {
                let now = status(core).sources[Source::OnDemand.index()];
                (now.not_kept, now.filtered, now.skipped_stack, now.captured)
            };
            configure(&core, &on_demand(excluded, false), &timer);
            assert_eq!(capture_now(&core, &platform).0, STATUS_SUCCESS);
            assert_eq!(counted(&core), (1, 0, 0, 0), "disabled wins over excluded");
            configure(&core, &on_demand(excluded, true), &timer);
            capture_now(&core, &platform);
            assert_eq!(counted(&core), (1, 1, 0, 0));

            platform
                .remaining_stack
                .set(crate::kernel_stack::MIN_REMAINING_STACK - 8);
            for enabled in [false, true] {
                configure(&core, &on_demand(excluded, enabled), &timer);
                assert_eq!(
                    capture_now(&core, &platform),
                    (KSTACK_STATUS_STACK_TOO_LOW, None)
                );
            }
            assert_eq!(
                counted(&core),
                (1, 1, 2, 0),
                "too little stack, whether disabled or excluded"
            );
        }

        /// `Ioctl::CaptureNow`, `RecordFlags::STACK_BY_ID`: the reply always
        /// carries its frames and never names its stack, even when the
        /// ring's copy does.
        #[test]
        fn a_capture_now_reply_carries_its_frames_while_its_ring_copy_names_them() {
            let core = core_with_table(8);
            configure(
                &core,
                &on_demand(ProcessFilter::ALL, true),
                &TimerLog::default(),
            );
            let platform = FakePlatform::default();
            for _ in 0..3 {
                let (header, frames) = capture_now(&core, &platform).1.unwrap();
                assert_eq!(frames, 5);
                assert!(!header.flags.contains(RecordFlags::STACK_BY_ID));
                assert_eq!(header.os_hash, 0xABCD, "the walk's hash, not a slot");
            }
            let table = status(&core).stack_table;
            assert_eq!((table.inserts, table.hits), (1, 2));
            let by_id = RecordFlags::STACK_BY_ID;
            assert_eq!(read_as(&core, 1), [(by_id, 5), (by_id, 0), (by_id, 0)]);
        }

        /// `RecordFlags::STACK_BY_ID`: a reader's run of reads gets each
        /// entry's frames once; a read by another reader, or the last
        /// reader's close, ends the run; a clear or another reader's close
        /// does not.
        #[test]
        fn readers_taking_turns_each_get_the_frames_again_after_the_other() {
            let core = core_with_table(8);
            let timer = TimerLog::default();
            enable(&core, SourceSet::EMPTY.with(Source::Registry), &timer);
            let platform = FakePlatform::default();
            let event = || {
                core.capture(&platform, SourceFacts::Registry { notify_class: 1 });
            };
            let frames_read = |reader| -> Vec<usize> {
                read_as(&core, reader)
                    .into_iter()
                    .map(|(flags, frames)| {
                        assert!(flags.contains(RecordFlags::STACK_BY_ID));
                        frames
                    })
                    .collect()
            };
            let (a, b) = (0xA000, 0xB000);
            event();
            event();
            assert_eq!(frames_read(a), [5, 0], "the first of the run carries them");
            event();
            assert_eq!(frames_read(a), [0], "the same run");
            event();
            assert_eq!(frames_read(b), [5], "another reader");
            event();
            assert_eq!(frames_read(a), [5], "a's new run, after b's read");
            core.reader_closed(b);
            event();
            assert_eq!(frames_read(a), [0], "b was not the last reader");
            assert_eq!(
                request(&core, Ioctl::Clear.code(), &[], &mut [], &timer).0,
                STATUS_SUCCESS
            );
            event();
            assert_eq!(frames_read(a), [0], "a clear ends no run");
            core.reader_closed(a);
            event();
            assert_eq!(frames_read(a), [5], "a closed: its address is a new reader");
            assert_eq!(status(&core).stack_table.sent, 4);
        }

        /// `StackTableStatus`: with the table off nothing is looked up, an
        /// empty walk included, and no record names its stack.
        #[test]
        fn with_the_table_off_its_counters_stay_zero() {
            let core = core_with_table(0);
            let timer = TimerLog::default();
            enable(&core, SourceSet::EMPTY.with(Source::Registry), &timer);
            for depth in [5, 5, 0] {
                let platform = FakePlatform {
                    stack_depth: depth,
                    ..FakePlatform::default()
                };
                core.capture(&platform, SourceFacts::Registry { notify_class: 1 });
            }
            let records = read_as(&core, 1);
            assert_eq!(records.len(), 3);
            assert!(
                records
                    .iter()
                    .all(|(flags, _)| !flags.contains(RecordFlags::STACK_BY_ID))
            );
            assert_eq!(status(&core).stack_table, StackTableStatus::default());
        }

        /// `Ioctl::Configure`: an accepted configuration leaves the ring's
        /// records and the counters as they are.
        #[test]
        fn a_configure_request_keeps_the_ring_and_the_counters() {
            let core = core_with_table(0);
            let timer = TimerLog::default();
            enable(&core, SourceSet::EMPTY.with(Source::Registry), &timer);
            let platform = FakePlatform::default();
            for _ in 0..2 {
                core.capture(&platform, SourceFacts::Registry { notify_class: 1 });
            }
            let before = status(&core);
            assert_eq!(
                configure(&core, &CaptureConfig::default(), &timer),
                STATUS_SUCCESS
            );
            let after = status(&core);
            assert_eq!(after.config, CaptureConfig::default());
            assert_eq!(
                (after.ring_used, after.sources, after.sequences_spent),
                (2, before.sources, before.sequences_spent)
            );
            assert_eq!(read_as(&core, 1).len(), 2);
        }

        /// `CaptureConfig`: reserved configuration bytes are accepted
        /// whatever they hold, and status reports them as zeros.
        #[test]
        fn reserved_configuration_bytes_are_ignored_and_reported_as_zeros() {
            let core = core_with_table(0);
            let timer = TimerLog::default();
            let wanted = on_demand(ProcessFilter::new(&[8], &[]).unwrap(), true);
            let mut input = encode_configure_request(&wanted);
            assert_eq!(input.len(), CONFIGURE_REQUEST_SIZE);
            // Configuration bytes 14-15 (the only ones left since ABI 12),
            // after the prefix.
            for offset in [22, 23] {
                input[offset] = 0xFF;
            }
            let result = request(&core, Ioctl::Configure.code(), &input, &mut [], &timer);
            assert_eq!(result, (STATUS_SUCCESS, 0));
            assert_eq!(status(&core).config, wanted);
            let mut out = [0xAA_u8; STATUS_RESPONSE_SIZE];
            request(&core, Ioctl::Status.code(), &[], &mut out, &timer);
            assert_eq!([out[32 + 14], out[32 + 15]], [0; 2]);
        }

        /// `CaptureConfig`, `Ioctl::Configure`: of two bad fields the
        /// lowest-numbered names the status; the fields before the
        /// driver's own checks.
        #[test]
        fn a_configure_request_fails_with_its_first_failing_check() {
            let mut registrations = all_registered();
            registrations[Source::Registry.index()] = SourceRegistration {
                status: STATUS_NOT_SUPPORTED,
            };
            let core = registered_core(
                ring_of_records(8, 1),
                PagingExecutive::NOT_SET,
                registrations,
            );
            let timer = TimerLog::default();
            let unavailable_and_timer = CaptureConfig {
                sources: SourceSet::EMPTY.with(Source::Registry).with(Source::Timer),
                ..CaptureConfig::default()
            };
            let mut input = encode_configure_request(&unavailable_and_timer);
            // Frames to capture 0 (field 3), an include list of 9 (field 5).
            input[8 + 6] = 0;
            input[8 + 12] = 9;
            let configure_bytes =
                |input: &[u8]| request(&core, Ioctl::Configure.code(), input, &mut [], &timer).0;
            assert_eq!(configure_bytes(&input), STATUS_INVALID_PARAMETER_3);
            input[8 + 6] = 16;
            assert_eq!(configure_bytes(&input), STATUS_INVALID_PARAMETER_5);
            input[8] |= 1;
            assert_eq!(configure_bytes(&input), STATUS_INVALID_PARAMETER_1);
            assert_eq!(
                configure(&core, &unavailable_and_timer, &timer),
                STATUS_NOT_SUPPORTED,
                "an unavailable source before the paging policy"
            );
            assert_eq!(status(&core).config, CaptureConfig::default());
        }
    }

    /// `Ioctl::CaptureThreads`: the request-level checks, in their
    /// documented order; a refused request queues and counts nothing.
    mod capture_threads {
        use kstack_abi::{
            CaptureThreadsRequest, DriverImage, ThreadCaptureStatus,
            ntstatus::{STATUS_INVALID_BUFFER_SIZE, STATUS_INVALID_PARAMETER},
            thread_capture::{
                CAPTURE_THREADS_REPLY_SIZE, CAPTURE_THREADS_REQUEST_SIZE,
                encode_capture_threads_request,
            },
        };

        use super::*;
        use crate::{
            StackTable, capture::tests::drain_all, test_support::keep, thread_captures::Slot,
            user_walk_guard::UserWalkGuard,
        };

        /// A core with every source registered, the thread-stack source
        /// enabled or not, and the APC routine in `apc`'s state.
        fn core_with(thread_stack: bool, apc: HostRoutine) -> DriverCore<'static> {
            let core = registered_core(
                ring_of_records(8, 1),
                PagingExecutive::NOT_SET,
                all_registered(),
            );
            core.set_routine(Routine::Apc, apc);
            let sources = if thread_stack {
                SourceSet::EMPTY.with(Source::ThreadStack)
            } else {
                SourceSet::EMPTY
            };
            assert_eq!(enable(&core, sources, &TimerLog::default()), STATUS_SUCCESS);
            core
        }

        /// A capture-threads request of `input`: its status and the bytes
        /// returned; the status after it must show nothing counted.
        fn capture_threads(core: &DriverCore<'_>, input: &[u8]) -> Served {
            let mut out = [0xAA_u8; CAPTURE_THREADS_REPLY_SIZE];
            let served = request(
                core,
                Ioctl::CaptureThreads.code(),
                input,
                &mut out,
                &TimerLog::default(),
            );
            let after = status(core);
            assert_eq!(after.thread_captures, ThreadCaptureStatus::default());
            assert_eq!(after.sources[Source::ThreadStack.index()].captured, 0);
            assert_eq!(after.ring_used, 0, "nothing captured");
            served
        }

        fn good_request() -> [u8; CAPTURE_THREADS_REQUEST_SIZE] {
            encode_capture_threads_request(&CaptureThreadsRequest::new(1, 1000, &[8, 12]).unwrap())
        }

        #[test]
        fn a_request_while_the_source_is_disabled_is_refused() {
            let core = core_with(false, HostRoutine::Available);
            assert_eq!(
                capture_threads(&core, &good_request()),
                (KSTACK_STATUS_SOURCE_DISABLED, 0)
            );
        }

        /// Where APCs cannot be queued, every request gets that reason,
        /// whether the source is on or off (it cannot be enabled there).
        #[test]
        fn a_host_without_apc_delivery_refuses_every_request_first() {
            for enabled in [true, false] {
                for apc in [HostRoutine::NotExported, HostRoutine::HostStub] {
                    let core = core_with(enabled, apc);
                    assert_eq!(
                        capture_threads(&core, &good_request()),
                        (KSTACK_STATUS_NO_APC, 0),
                        "{apc:?}, source enabled {enabled}"
                    );
                }
            }
        }

        #[test]
        fn a_bad_request_is_refused_before_the_driver_state_is_looked_at() {
            let core = core_with(false, HostRoutine::NotExported);
            let good = good_request();
            let mut other_abi = good;
            other_abi[0] ^= 0xFF;
            let mut no_ids = good;
            no_ids[20] = 0;
            let mut zero_id = good;
            zero_id[28..32].fill(0);
            let mut no_timeout = good;
            no_timeout[16..20].fill(0);
            for (input, expected) in [
                (
                    &good[..CAPTURE_THREADS_REQUEST_SIZE - 1],
                    STATUS_INVALID_BUFFER_SIZE,
                ),
                (&other_abi[..], STATUS_REVISION_MISMATCH),
                (&no_ids[..], STATUS_INVALID_PARAMETER),
                (&zero_id[..], STATUS_INVALID_PARAMETER),
                (&no_timeout[..], STATUS_INVALID_PARAMETER),
            ] {
                assert_eq!(capture_threads(&core, input), (expected, 0));
            }
            let mut small = [0_u8; CAPTURE_THREADS_REPLY_SIZE - 1];
            let served = request(
                &core,
                Ioctl::CaptureThreads.code(),
                &good,
                &mut small,
                &TimerLog::default(),
            );
            assert_eq!(served, (STATUS_BUFFER_TOO_SMALL, 0));
        }

        #[test]
        fn status_reports_the_apc_routine_and_every_counter_in_its_place() {
            let core = core_with(true, HostRoutine::HostStub);
            assert_eq!(status(&core).apc, HostRoutine::HostStub);
            core.set_routine(Routine::Apc, HostRoutine::Available);
            assert_eq!(status(&core).apc, HostRoutine::Available);
            let core =
                core.with_thread_slots(keep((0..3).map(|_| Slot::new()).collect::<Vec<_>>()));
            let captures = &core.thread_captures;
            let counters = &captures.counters;
            for (value, counter) in [
                &counters.requested,
                &counters.queued,
                &counters.no_such_thread,
                &counters.no_slot,
                &counters.not_queued,
                &counters.refused_system_thread,
                &counters.own,
                &counters.delivered,
                &counters.run_down,
                &counters.late,
            ]
            .into_iter()
            .enumerate()
            {
                counter.store(100 + value as u64, Ordering::Relaxed);
            }
            for tag in 0..2 {
                captures.arm(requested(tag)).expect("a free slot");
            }
            let mut expected: [u64; 12] = core::array::from_fn(|value| 100 + value as u64);
            expected[10] = 2;
            expected[11] = 3;
            assert_eq!(
                status(&core).thread_captures.fields(),
                expected,
                "in ThreadCaptureStatus::FIELD_NAMES order, in_flight and slots from the slots"
            );
        }

        fn requested(tag: u64) -> Requested {
            Requested {
                tag,
                at: 0,
                timeout: 10_000,
            }
        }

        /// [`core_with`] (the source on, APCs deliverable) with `slots`
        /// slots.
        fn core_with_slots(slots: usize) -> DriverCore<'static> {
            core_with(true, HostRoutine::Available)
                .with_thread_slots(keep((0..slots).map(|_| Slot::new()).collect::<Vec<_>>()))
        }

        /// Sends a capture-threads request for `ids` from `platform`'s
        /// thread: its status and the outcome of each id.
        fn send(
            core: &DriverCore<'_>,
            platform: &FakePlatform,
            control: &TimerLog,
            ids: &[u32],
        ) -> (NtStatus, Vec<ThreadRequestOutcome>) {
            let input =
                encode_capture_threads_request(&CaptureThreadsRequest::new(77, 5, ids).unwrap());
            let mut out = [0_u8; CAPTURE_THREADS_REPLY_SIZE];
            let (status, written) = core.serve(
                Ioctl::CaptureThreads,
                &input,
                &mut out,
                platform,
                control,
                Caller::default(),
            );
            assert_eq!(
                written,
                if status == STATUS_SUCCESS {
                    CAPTURE_THREADS_REPLY_SIZE
                } else {
                    0
                }
            );
            let outcomes = CaptureThreadsReply::decode(&out, ids.len())
                .map(|reply| reply.outcomes().to_vec())
                .unwrap_or_default();
            (status, outcomes)
        }

        #[test]
        fn each_id_is_queued_or_says_why_not_and_is_counted_once() {
            use ThreadRequestOutcome::{
                NoSlot, NoSuchThread, NotQueued, Own, Queued, SystemThread,
            };
            let core = core_with_slots(3);
            let platform = FakePlatform::default();
            let own = platform.current_ids().1;
            let control = TimerLog::default();
            let (status, outcomes) = send(
                &core,
                &platform,
                &control,
                &[8, own, 1001, 4, 5, 12, 16, 20],
            );
            assert_eq!(status, STATUS_SUCCESS);
            assert_eq!(
                outcomes,
                [
                    Queued,
                    Own,
                    NoSuchThread,
                    SystemThread,
                    NotQueued,
                    Queued,
                    Queued,
                    NoSlot
                ]
            );
            let queued = control.1.borrow().clone();
            assert_eq!(
                queued.iter().map(|&(id, _)| id).collect::<Vec<_>>(),
                [8, 12, 16]
            );
            let mut slots: Vec<usize> = queued.iter().map(|&(_, slot)| slot).collect();
            slots.sort_unstable();
            assert_eq!(
                slots,
                [0, 1, 2],
                "each APC its own slot, the refused ones freed again"
            );
            let counted = status_of(&core).thread_captures;
            assert_eq!(
                (
                    counted.requested,
                    counted.queued,
                    counted.own,
                    counted.no_such_thread
                ),
                (8, 3, 1, 1)
            );
            assert_eq!(
                (
                    counted.refused_system_thread,
                    counted.not_queued,
                    counted.no_slot,
                    counted.in_flight
                ),
                (1, 1, 1, 3)
            );
            assert_eq!(
                counted.requested,
                counted.queued
                    + counted.no_such_thread
                    + counted.no_slot
                    + counted.not_queued
                    + counted.refused_system_thread
                    + counted.own
            );
        }

        fn status_of(core: &DriverCore<'_>) -> StatusResponse {
            status(core)
        }

        #[test]
        fn a_delivered_apc_records_the_thread_without_the_tracer_frames() {
            let core = DriverCore::new(
                ring_of_records(8, 1),
                StackTable::new(&[]),
                PagingExecutive::NOT_SET,
                DriverImage {
                    base: 0x1000,
                    size: 0x3000,
                },
                keep([Slot::new(), Slot::new()]),
                keep(UserWalkGuard::new()),
            );
            for source in Source::ALL {
                core.set_registration(source, all_registered()[source.index()]);
            }
            core.set_routine(Routine::Apc, HostRoutine::Available);
            assert_eq!(
                enable(
                    &core,
                    SourceSet::EMPTY.with(Source::ThreadStack),
                    &TimerLog::default()
                ),
                STATUS_SUCCESS
            );
            let platform = FakePlatform {
                stack_depth: 9,
                ..FakePlatform::default()
            };
            let control = TimerLog::default();
            assert_eq!(
                send(&core, &platform, &control, &[8]).1,
                [ThreadRequestOutcome::Queued]
            );
            let slot = control.1.borrow()[0].1;
            // The walk: kstack's frames 0x1000..0x3000 (in the image), then
            // the APC dispatcher 0x4000, then the thread's 0x5000..0x9000.
            let facts = core
                .thread_delivered(&platform, slot)
                .expect("the source is on");
            assert!(matches!(
                core.capture(&platform, facts),
                CaptureOutcome::Published(_)
            ));
            core.thread_captures.release(slot);
            let records = drain_all(&core);
            assert_eq!(records.len(), 1);
            let (header, frames) = &records[0];
            assert_eq!(frames, &[0x5000, 0x6000, 0x7000, 0x8000, 0x9000]);
            let (process_id, thread_id) = platform.current_ids();
            assert!(matches!(
                header.facts,
                SourceFacts::ThreadStack { target_process_id, target_thread_id, tag: 77, late: false, .. }
                    if (target_process_id, target_thread_id) == (process_id, thread_id)
            ));
            let counted = status_of(&core).thread_captures;
            assert_eq!(
                (
                    counted.queued,
                    counted.delivered,
                    counted.late,
                    counted.in_flight
                ),
                (1, 1, 0, 0)
            );
        }

        #[test]
        fn lateness_is_against_the_timeout_and_run_downs_and_deliveries_to_a_disabled_source_are_counted()
         {
            let core = core_with_slots(2);
            let platform = FakePlatform::default();
            let control = TimerLog::default();
            send(&core, &platform, &control, &[8, 12]);
            let (late, run_down) = (control.1.borrow()[0].1, control.1.borrow()[1].1);
            // The request's timeout is 5 ms; the fake clock ticks 1 per stamp.
            let slots = &core.thread_captures;
            assert!(
                slots.delivered(late, u64::MAX).late,
                "a capture after the timeout is late"
            );
            core.thread_run_down();
            slots.release(run_down);
            assert_eq!(
                enable(&core, SourceSet::EMPTY, &TimerLog::default()),
                STATUS_SUCCESS
            );
            assert_eq!(core.thread_delivered(&platform, late), None);
            slots.release(late);
            let status = status_of(&core);
            let counted = status.thread_captures;
            assert_eq!(
                (counted.delivered, counted.run_down, counted.in_flight),
                (1, 1, 0)
            );
            assert_eq!(
                counted.queued,
                counted.delivered + counted.run_down + counted.in_flight
            );
            let source = &status.sources[Source::ThreadStack.index()];
            assert_eq!(
                (source.captured, source.not_kept),
                (0, 1),
                "delivered after the source was disabled"
            );
        }
    }
}
