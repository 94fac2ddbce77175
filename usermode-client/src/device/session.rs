//! Conversations with the driver over any [`Transport`]: build the request
//! with kstack-abi, check the reply's status, decode it with kstack-abi.

use kstack_abi::{
    CaptureConfig, CaptureThreadsReply, CaptureThreadsRequest, Entry, Ioctl, MAX_RECORD_SIZE,
    ReadHeader, StatusResponse, ThreadRequestOutcome, decode_record,
    ioctl::MIN_READ_BUFFER,
    messages::{STATUS_RESPONSE_SIZE, encode_capture_now_request, encode_configure_request},
    ntstatus::{NtStatus, STATUS_BUFFER_OVERFLOW, STATUS_BUFFER_TOO_SMALL, STATUS_SUCCESS},
    thread_capture::{
        CAPTURE_THREADS_REPLY_SIZE, CaptureThreadsError, MAX_THREAD_CAPTURES,
        encode_capture_threads_request,
    },
};

use std::{
    collections::BTreeMap,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use crate::{
    capture::trace::{StackMemory, TraceRecord},
    device::transport::Transport,
    error::ClientError,
    naming::process_modules::ModuleChange,
};

/// Asks for the driver's status. A driver of another ABI version is
/// reported as a mismatch, whatever its status layout.
///
/// # Errors
/// [`ClientError`] for a refusal, a version mismatch or a malformed reply.
pub fn status(transport: &mut impl Transport) -> Result<StatusResponse, ClientError> {
    let mut output = [0_u8; STATUS_RESPONSE_SIZE];
    let reply = transport.control(Ioctl::Status.code(), &[], &mut output);
    // STATUS_BUFFER_OVERFLOW: the driver's status is larger than ours, so it
    // wrote the version prefix only; decoding that reports the mismatch.
    if reply.status != STATUS_SUCCESS && reply.status != STATUS_BUFFER_OVERFLOW {
        return Err(ClientError::Refused {
            request: Ioctl::Status,
            status: reply.status,
        });
    }
    let written = output.get(..reply.information).unwrap_or(&output);
    StatusResponse::decode(written).map_err(|error| ClientError::from_reply(Ioctl::Status, error))
}

/// Sends a request that returns nothing.
fn command(
    transport: &mut impl Transport,
    request: Ioctl,
    input: &[u8],
) -> Result<(), ClientError> {
    let reply = transport.control(request.code(), input, &mut []);
    check(request, reply.status)
}

/// Sends a request whose reply the driver writes into `output`; returns
/// the bytes it wrote.
fn ask<'a>(
    transport: &mut impl Transport,
    request: Ioctl,
    input: &[u8],
    output: &'a mut [u8],
) -> Result<&'a [u8], ClientError> {
    let reply = transport.control(request.code(), input, output);
    check(request, reply.status)?;
    let output: &'a [u8] = output;
    Ok(output.get(..reply.information).unwrap_or(output))
}

fn check(request: Ioctl, status: NtStatus) -> Result<(), ClientError> {
    if status == STATUS_SUCCESS {
        Ok(())
    } else {
        Err(ClientError::Refused { request, status })
    }
}

/// Replaces the capture configuration. The client validates it first with
/// the same code the driver uses, so a bad value is explained before
/// anything is sent.
///
/// # Errors
/// [`ClientError::InvalidConfig`], or the driver's refusal.
pub fn configure(
    transport: &mut impl Transport,
    config: &CaptureConfig,
) -> Result<(), ClientError> {
    config.validate().map_err(ClientError::InvalidConfig)?;
    command(
        transport,
        Ioctl::Configure,
        &encode_configure_request(config),
    )
}

/// Discards every record in the ring.
///
/// # Errors
/// The driver's refusal (busy while another reader drains).
pub fn clear(transport: &mut impl Transport) -> Result<(), ClientError> {
    command(transport, Ioctl::Clear, &[])
}

/// Captures the calling request's stack in the driver.
///
/// # Errors
/// The driver's refusal or a malformed reply.
pub fn capture_now(transport: &mut impl Transport, tag: u64) -> Result<TraceRecord, ClientError> {
    let mut output = [0_u8; MAX_RECORD_SIZE];
    let written = ask(
        transport,
        Ioctl::CaptureNow,
        &encode_capture_now_request(tag),
        &mut output,
    )?;
    let (record, _) = decode_record(written)
        .map_err(|error| ClientError::from_reply(Ioctl::CaptureNow, error))?;
    Ok(TraceRecord::from(&record))
}

/// Asks the driver to capture the stacks of `thread_ids`, each in its own
/// thread through a special kernel APC; returns what became of each id, in
/// order. The ids go in requests of at most [`MAX_THREAD_CAPTURES`], all
/// with `tag` and `timeout_ms`, every one checked before the first is
/// sent. The captures themselves come later, through reads: records of
/// `Source::ThreadStack` whose facts carry `tag` and the thread's id.
///
/// # Errors
/// [`ClientError::InvalidThreadRequest`] (nothing sent); a request's
/// refusal (the requests before it were served: their APCs stay queued)
/// or a malformed reply.
pub fn capture_threads(
    transport: &mut impl Transport,
    tag: u64,
    timeout_ms: u32,
    thread_ids: &[u32],
) -> Result<Vec<ThreadRequestOutcome>, ClientError> {
    if thread_ids.is_empty() {
        return Err(ClientError::InvalidThreadRequest(
            CaptureThreadsError::Count { count: 0 },
        ));
    }
    let requests = thread_ids
        .chunks(MAX_THREAD_CAPTURES)
        .map(|chunk| CaptureThreadsRequest::new(tag, timeout_ms, chunk))
        .collect::<Result<Vec<_>, _>>()
        .map_err(ClientError::InvalidThreadRequest)?;
    let mut outcomes = Vec::with_capacity(thread_ids.len());
    for request in &requests {
        let mut output = [0_u8; CAPTURE_THREADS_REPLY_SIZE];
        let written = ask(
            transport,
            Ioctl::CaptureThreads,
            &encode_capture_threads_request(request),
            &mut output,
        )?;
        let decoded = CaptureThreadsReply::decode(written, request.requested().len())
            .map_err(|error| ClientError::from_reply(Ioctl::CaptureThreads, error))?;
        outcomes.extend_from_slice(decoded.outcomes());
    }
    Ok(outcomes)
}

/// The largest read buffer the reader grows to.
const MAX_READ_BUFFER: usize = 4 << 20;

/// Drains the ring through a buffer that grows while reads come back full,
/// giving each record its frames from the stacks this reader was sent (one
/// reader per device handle).
pub struct Reader {
    buffer: Vec<u8>,
    stacks: StackMemory,
    /// A recycled batch's record memory, for the next read to fill.
    spare: Vec<TraceRecord>,
    /// A read failed: the stacks it carried count as sent to this reader
    /// though they never arrived, so it reads no more (see
    /// `kstack_abi::Ioctl::Read`).
    failed: bool,
}

/// What one read returned.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Batch {
    /// The trace records, in ring order.
    pub records: Vec<TraceRecord>,
    /// The module records, in ring order (see `kstack_abi::module_record`).
    pub modules: Vec<ModuleChange>,
    /// Records were still waiting when the buffer filled.
    pub more_pending: bool,
    /// The driver's drop counter at the time of the read.
    pub dropped: u64,
}

impl Default for Reader {
    fn default() -> Self {
        Self {
            buffer: vec![0; 64 << 10],
            stacks: StackMemory::default(),
            spare: Vec::new(),
            failed: false,
        }
    }
}

impl Reader {
    /// Reads once: whole records only, every one checked, each with its
    /// frames. After a failed read the reader refuses to read again: a new
    /// handle and a new reader go on (`kstack_abi::Ioctl::Read`).
    ///
    /// # Errors
    /// The driver's refusal, or a malformed reply (a record that does not
    /// decode, a count that disagrees with the records);
    /// [`ClientError::ReaderFailed`] once a read has failed.
    pub fn read(&mut self, transport: &mut impl Transport) -> Result<Batch, ClientError> {
        if self.failed {
            return Err(ClientError::ReaderFailed);
        }
        let batch = self.read_once(transport);
        self.failed = batch.is_err();
        batch
    }

    /// One read, as [`Reader::read`] describes it.
    fn read_once(&mut self, transport: &mut impl Transport) -> Result<Batch, ClientError> {
        let reply = transport.control(Ioctl::Read.code(), &[], &mut self.buffer);
        if reply.status == STATUS_BUFFER_TOO_SMALL {
            self.grow();
        }
        check(Ioctl::Read, reply.status)?;
        let malformed = |error| ClientError::from_reply(Ioctl::Read, error);
        let written = self.buffer.get(..reply.information).unwrap_or(&self.buffer);
        let (header, entries) = ReadHeader::decode(written).map_err(malformed)?;
        // At most one allocation for the records (none when a recycled
        // batch has room).
        let mut records = std::mem::take(&mut self.spare);
        records.reserve(records_room(header.record_count, written.len()));
        let mut modules = Vec::new();
        for entry in entries {
            match entry.map_err(malformed)? {
                Entry::Trace(view) => records.push(self.stacks.resolve(&view).map_err(malformed)?),
                Entry::Module(record) => modules.push(ModuleChange::from(&record)),
            }
        }
        let found = records.len() + modules.len();
        if found != header.record_count as usize {
            return Err(ClientError::CountMismatch {
                declared: header.record_count,
                found,
            });
        }
        if header.more_pending {
            self.grow();
        }
        Ok(Batch {
            records,
            modules,
            more_pending: header.more_pending,
            dropped: header.dropped,
        })
    }

    /// Gives a batch's record memory back for the next read to fill: a
    /// reader draining in a loop then allocates once, not once per read.
    pub fn recycle(&mut self, batch: Batch) {
        let mut records = batch.records;
        records.clear();
        self.spare = records;
    }

    fn grow(&mut self) {
        let size = (self.buffer.len() * 2).clamp(MIN_READ_BUFFER, MAX_READ_BUFFER);
        self.buffer.resize(size, 0);
    }
}

/// Room for the records of a reply of `bytes` whose header declares
/// `declared`: never more than the bytes can hold, whatever the count says.
fn records_room(declared: u32, bytes: usize) -> usize {
    (declared as usize).min(bytes / kstack_abi::MIN_RECORD_SIZE)
}

/// Accounts for sequence numbers across reads, per ring shard (each shard
/// numbers its own records): every number a shard spent is a record
/// received, dropped (shard full) or cleared.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SequenceTracker {
    shards: BTreeMap<u16, ShardSpan>,
}

/// What one shard's records showed: the lowest and highest numbers, and
/// how many arrived.
#[derive(Debug, PartialEq, Eq)]
struct ShardSpan {
    lowest: u64,
    highest: u64,
    received: u64,
}

impl SequenceTracker {
    /// Notes one received record of `shard` (records not kept in the ring
    /// carry sequence 0).
    pub fn note(&mut self, shard: u16, sequence: u64) {
        if sequence == 0 {
            return;
        }
        let span = self.shards.entry(shard).or_insert(ShardSpan {
            lowest: sequence,
            highest: sequence,
            received: 0,
        });
        span.lowest = span.lowest.min(sequence);
        span.highest = span.highest.max(sequence);
        span.received += 1;
    }

    /// Records received, over all shards (not counting those kept out of
    /// the ring).
    #[must_use]
    pub fn received(&self) -> u64 {
        self.shards.values().map(|span| span.received).sum()
    }

    /// Sequence numbers that never arrived between the lowest and highest
    /// seen of each shard, over all shards.
    #[must_use]
    pub fn gaps(&self) -> u64 {
        self.shards
            .values()
            .map(|span| (span.highest - span.lowest + 1).saturating_sub(span.received))
            .sum()
    }
}

/// How long [`follow`] reads.
#[derive(Clone, Copy, Debug)]
pub enum Follow {
    /// Until the ring is empty once.
    UntilDrained,
    /// Until the stop flag is set or the deadline (if any) passes, pausing
    /// `interval` whenever the ring is empty.
    UntilStopped {
        /// When to stop regardless of the flag.
        deadline: Option<Instant>,
        /// The pause when the ring is empty.
        interval: Duration,
    },
}

/// What a [`follow`] saw, for the summary on the way out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FollowSummary {
    /// Trace records received.
    pub received: u64,
    /// Module records received.
    pub modules: u64,
    /// Sequence numbers between the first and last received of each shard
    /// that never arrived (dropped or cleared), over all shards.
    pub gaps: u64,
    /// Records the driver dropped (ring full) while following.
    pub dropped: u64,
}

/// A reader that keeps account of what it read, for a [`FollowSummary`]:
/// what [`follow`] reads with, and what a command that reads between
/// other requests (`kstack sample`) reads with.
#[derive(Default)]
pub struct Follower {
    reader: Reader,
    tracker: SequenceTracker,
    modules: u64,
    dropped_at_start: Option<u64>,
    dropped: u64,
}

impl Follower {
    /// Reads once ([`Reader::read`]) and notes the batch; hand it back with
    /// [`Follower::recycle`] when done with it.
    ///
    /// # Errors
    /// As [`Reader::read`].
    pub fn read(&mut self, transport: &mut impl Transport) -> Result<Batch, ClientError> {
        let batch = self.reader.read(transport)?;
        for record in &batch.records {
            self.tracker
                .note(record.header.shard, record.header.sequence);
        }
        // Module records spend their shard's numbers too.
        for change in &batch.modules {
            self.tracker
                .note(change.header.shard, change.header.sequence);
        }
        self.modules += batch.modules.len() as u64;
        self.dropped_at_start.get_or_insert(batch.dropped);
        self.dropped = batch.dropped;
        Ok(batch)
    }

    /// Gives a batch's memory back ([`Reader::recycle`]).
    pub fn recycle(&mut self, batch: Batch) {
        self.reader.recycle(batch);
    }

    /// What was read so far.
    #[must_use]
    pub fn summary(&self) -> FollowSummary {
        FollowSummary {
            received: self.tracker.received() - self.modules,
            modules: self.modules,
            gaps: self.tracker.gaps(),
            dropped: self.dropped - self.dropped_at_start.unwrap_or(self.dropped),
        }
    }
}

/// Reads batches and hands each to `each`, as `how` says.
///
/// # Errors
/// A read's [`ClientError`], or the first error `each` returns.
pub fn follow(
    transport: &mut impl Transport,
    how: Follow,
    stop: &AtomicBool,
    mut each: impl FnMut(&Batch) -> Result<(), ClientError>,
) -> Result<FollowSummary, ClientError> {
    let mut follower = Follower::default();
    loop {
        if let Follow::UntilStopped { deadline, .. } = how
            && (stop.load(Ordering::Relaxed) || deadline.is_some_and(|at| Instant::now() >= at))
        {
            break;
        }
        let batch = follower.read(transport)?;
        each(&batch)?;
        let more_pending = batch.more_pending;
        follower.recycle(batch);
        if !more_pending {
            match how {
                Follow::UntilDrained => break,
                Follow::UntilStopped { interval, .. } => std::thread::sleep(interval),
            }
        }
    }
    Ok(follower.summary())
}

#[cfg(test)]
pub(crate) mod tests {
    use kstack_abi::{
        ABI_VERSION, CaptureConfig, DecodeError,
        ntstatus::{NtStatus, STATUS_INVALID_DEVICE_REQUEST},
    };

    use kstack_abi::{
        RecordFlags, SourceFacts, SourceSet,
        ntstatus::{KSTACK_STATUS_PAGING_EXECUTIVE_REQUIRED, STATUS_DEVICE_BUSY},
    };

    use super::*;
    use crate::device::test_support::sample_status;
    use crate::device::transport::Reply;

    /// Answers every request with fixed bytes and a status.
    pub struct Scripted {
        pub status: NtStatus,
        pub bytes: Vec<u8>,
        pub requests: Vec<u32>,
    }

    impl Transport for Scripted {
        fn control(&mut self, code: u32, _input: &[u8], output: &mut [u8]) -> Reply {
            self.requests.push(code);
            let written = self.bytes.len().min(output.len());
            output[..written].copy_from_slice(&self.bytes[..written]);
            Reply {
                status: self.status,
                information: written,
            }
        }
    }

    fn encoded(status: &StatusResponse) -> Vec<u8> {
        let mut bytes = vec![0; STATUS_RESPONSE_SIZE];
        status.encode(&mut bytes);
        bytes
    }

    #[test]
    fn a_good_reply_decodes() {
        let mut driver = Scripted {
            status: STATUS_SUCCESS,
            bytes: encoded(&sample_status()),
            requests: vec![],
        };
        assert_eq!(status(&mut driver), Ok(sample_status()));
        assert_eq!(driver.requests, [Ioctl::Status.code()]);
    }

    #[test]
    fn a_newer_driver_is_a_version_mismatch() {
        // A driver whose status is larger sends its prefix only.
        let mut prefix = (ABI_VERSION + 1).to_le_bytes().to_vec();
        prefix.extend_from_slice(&512_u32.to_le_bytes());
        let mut driver = Scripted {
            status: STATUS_BUFFER_OVERFLOW,
            bytes: prefix,
            requests: vec![],
        };
        assert_eq!(
            status(&mut driver),
            Err(ClientError::AbiMismatch {
                driver: ABI_VERSION + 1
            })
        );
    }

    #[test]
    fn refusals_and_garbage_are_errors_not_panics() {
        let mut refused = Scripted {
            status: STATUS_INVALID_DEVICE_REQUEST,
            bytes: vec![],
            requests: vec![],
        };
        assert_eq!(
            status(&mut refused),
            Err(ClientError::Refused {
                request: Ioctl::Status,
                status: STATUS_INVALID_DEVICE_REQUEST
            })
        );
        let mut truncated = encoded(&sample_status());
        truncated.truncate(100);
        let mut short = Scripted {
            status: STATUS_SUCCESS,
            bytes: truncated,
            requests: vec![],
        };
        assert!(matches!(
            status(&mut short),
            Err(ClientError::Malformed { .. })
        ));
        for length in 0..STATUS_RESPONSE_SIZE {
            let mut bytes = encoded(&sample_status());
            bytes.truncate(length);
            let mut driver = Scripted {
                status: STATUS_SUCCESS,
                bytes,
                requests: vec![],
            };
            assert!(status(&mut driver).is_err(), "{length} bytes");
        }
        let mut empty = Scripted {
            status: STATUS_SUCCESS,
            bytes: vec![],
            requests: vec![],
        };
        assert_eq!(
            status(&mut empty),
            Err(ClientError::Malformed {
                request: Ioctl::Status,
                error: DecodeError::Truncated {
                    needed: 4,
                    actual: 0
                }
            })
        );
    }

    const FRAMES: [u64; 2] = [0xFFFF_F800_0000_1000_u64, 0xFFFF_F800_0000_2000];

    fn record_bytes(sequence: u64) -> Vec<u8> {
        record_bytes_as(sequence, RecordFlags::NONE, &FRAMES)
    }

    /// A record of [`FRAMES`]'s stack with these flags, holding `frames`.
    fn record_bytes_as(sequence: u64, flags: RecordFlags, frames: &[u64]) -> Vec<u8> {
        crate::device::test_support::record_bytes(
            sequence,
            SourceFacts::OnDemand { tag: 3 },
            flags,
            &FRAMES,
            frames,
        )
    }

    fn read_reply(sequences: &[u64], declared: u32, more_pending: bool) -> Vec<u8> {
        let payload: Vec<u8> = sequences
            .iter()
            .flat_map(|&sequence| record_bytes(sequence))
            .collect();
        reply_of(&payload, declared, more_pending)
    }

    fn reply_of(payload: &[u8], declared: u32, more_pending: bool) -> Vec<u8> {
        crate::device::test_support::read_reply(payload, declared, more_pending, 2)
    }

    #[test]
    fn records_naming_their_stack_get_the_frames_this_reader_was_sent() {
        let by_id = RecordFlags::STACK_BY_ID;
        let first = [
            record_bytes_as(1, by_id, &FRAMES),
            record_bytes_as(2, by_id, &[]),
        ]
        .concat();
        let mut driver = Scripted {
            status: STATUS_SUCCESS,
            bytes: reply_of(&first, 2, false),
            requests: vec![],
        };
        let mut reader = Reader::default();
        let batch = reader.read(&mut driver).unwrap();
        for record in &batch.records {
            assert_eq!(*record.frames, FRAMES);
            assert_eq!(record.header.flags, RecordFlags::NONE);
        }
        // A later read still resolves through what this reader was sent.
        driver.bytes = reply_of(&record_bytes_as(3, by_id, &[]), 1, false);
        assert_eq!(*reader.read(&mut driver).unwrap().records[0].frames, FRAMES);
        // Another reader was never sent the stack: a malformed reply.
        assert!(matches!(
            Reader::default().read(&mut driver),
            Err(ClientError::Malformed { .. })
        ));
    }

    #[test]
    fn a_read_decodes_every_record_and_grows_when_full() {
        let mut driver = Scripted {
            status: STATUS_SUCCESS,
            bytes: read_reply(&[1, 2], 2, true),
            requests: vec![],
        };
        let mut reader = Reader::default();
        let before = reader.buffer.len();
        let batch = reader.read(&mut driver).unwrap();
        assert_eq!(
            batch
                .records
                .iter()
                .map(|r| r.header.sequence)
                .collect::<Vec<_>>(),
            [1, 2]
        );
        assert!(batch.more_pending);
        assert_eq!(batch.dropped, 2);
        assert_eq!(reader.buffer.len(), before * 2);
    }

    #[test]
    fn a_recycled_batch_is_refilled_in_place_by_the_next_read() {
        let mut driver = Scripted {
            status: STATUS_SUCCESS,
            bytes: read_reply(&(1..=10).collect::<Vec<_>>(), 10, false),
            requests: vec![],
        };
        let mut reader = Reader::default();
        let first = reader.read(&mut driver).unwrap();
        let (memory, room) = (first.records.as_ptr(), first.records.capacity());
        reader.recycle(first);
        driver.bytes = read_reply(&[3], 1, false);
        let second = reader.read(&mut driver).unwrap();
        assert_eq!(
            (second.records.as_ptr(), second.records.capacity()),
            (memory, room),
            "the same allocation"
        );
        let sequences: Vec<u64> = second.records.iter().map(|r| r.header.sequence).collect();
        assert_eq!(sequences, [3], "nothing of the recycled batch left");
    }

    #[test]
    fn a_declared_count_reserves_no_more_than_the_bytes_hold() {
        let smallest = kstack_abi::MIN_RECORD_SIZE;
        assert_eq!(records_room(3, 100 * smallest), 3);
        assert_eq!(records_room(u32::MAX, 100 * smallest + smallest - 1), 100);
        assert_eq!(records_room(u32::MAX, 0), 0);
    }

    #[test]
    fn a_read_whose_count_disagrees_is_an_error() {
        let mut driver = Scripted {
            status: STATUS_SUCCESS,
            bytes: read_reply(&[1, 2], 3, false),
            requests: vec![],
        };
        assert_eq!(
            Reader::default().read(&mut driver),
            Err(ClientError::CountMismatch {
                declared: 3,
                found: 2
            })
        );
        let mut bytes = read_reply(&[1], 1, false);
        bytes.truncate(bytes.len() - 1);
        let mut truncated = Scripted {
            status: STATUS_SUCCESS,
            bytes,
            requests: vec![],
        };
        assert!(matches!(
            Reader::default().read(&mut truncated),
            Err(ClientError::Malformed { .. })
        ));
        let mut busy = Scripted {
            status: STATUS_DEVICE_BUSY,
            bytes: vec![],
            requests: vec![],
        };
        assert_eq!(
            Reader::default().read(&mut busy),
            Err(ClientError::Refused {
                request: Ioctl::Read,
                status: STATUS_DEVICE_BUSY
            })
        );
    }

    /// A read the caller never got (here: the copy back into its buffer
    /// failed: the I/O manager completes the request with
    /// `STATUS_ACCESS_VIOLATION`, 0xC0000005) may have carried stacks the
    /// driver now counts as sent to this reader: the reader refuses to
    /// read again, without asking the driver, and says why.
    #[test]
    fn after_a_failed_read_the_reader_reads_no_more() {
        let mut lost = Scripted {
            status: 0xC000_0005_u32.cast_signed(),
            bytes: vec![],
            requests: vec![],
        };
        let mut reader = Reader::default();
        assert!(matches!(
            reader.read(&mut lost),
            Err(ClientError::Refused { .. })
        ));
        let mut good = Scripted {
            status: STATUS_SUCCESS,
            bytes: read_reply(&[1], 1, false),
            requests: vec![],
        };
        assert_eq!(reader.read(&mut good), Err(ClientError::ReaderFailed));
        assert!(good.requests.is_empty(), "no request after the failure");
        assert!(
            ClientError::ReaderFailed
                .to_string()
                .contains("run the command again")
        );
        let mut fresh = Reader::default();
        assert_eq!(
            fresh.read(&mut good).map(|batch| batch.records.len()),
            Ok(1)
        );
    }

    /// Answers reads with one scripted reply after another.
    struct Replies(std::collections::VecDeque<Vec<u8>>);

    impl Transport for Replies {
        fn control(&mut self, _code: u32, _input: &[u8], output: &mut [u8]) -> Reply {
            let bytes = self.0.pop_front().expect("no more scripted replies");
            output[..bytes.len()].copy_from_slice(&bytes);
            Reply {
                status: STATUS_SUCCESS,
                information: bytes.len(),
            }
        }
    }

    /// A module record: `process_id` exited.
    fn exit_bytes(sequence: u64, process_id: u32) -> Vec<u8> {
        let header = kstack_abi::ModuleHeader {
            sequence,
            timestamp: 1,
            process_id,
            thread_id: 2,
            processor: 0,
            shard: 0,
            event: kstack_abi::ModuleEvent::ProcessExit,
            flags: kstack_abi::ModuleFlags::NONE,
            image_base: 0,
            image_size: 0,
            process_key: 0,
        };
        let mut bytes = vec![0; 56];
        kstack_abi::module_record::encode_module_record(&header, &[], &mut bytes).unwrap();
        bytes
    }

    #[test]
    fn follow_until_drained_reads_while_more_is_pending_and_counts_gaps() {
        // Sequence 3 is a module record, 5 never arrives, 6 is the last.
        let mut second: Vec<u8> = exit_bytes(3, 77);
        second.extend(record_bytes(4));
        second.extend(record_bytes(6));
        let mut driver =
            Replies([read_reply(&[1, 2], 2, true), reply_of(&second, 3, false)].into());
        let mut seen = Vec::new();
        let mut exits = Vec::new();
        let summary = follow(
            &mut driver,
            Follow::UntilDrained,
            &AtomicBool::new(false),
            |batch| {
                seen.extend(batch.records.iter().map(|record| record.header.sequence));
                exits.extend(batch.modules.iter().map(|change| change.header.process_id));
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(seen, [1, 2, 4, 6]);
        assert_eq!(exits, [77]);
        assert_eq!(
            summary,
            FollowSummary {
                received: 4,
                modules: 1,
                gaps: 1,
                dropped: 0
            }
        );
        assert!(driver.0.is_empty());
    }

    #[test]
    fn follow_stops_on_the_flag_and_passes_on_errors() {
        let mut driver = Replies([read_reply(&[1], 1, false)].into());
        let until_stopped = Follow::UntilStopped {
            deadline: None,
            interval: Duration::ZERO,
        };
        let summary = follow(&mut driver, until_stopped, &AtomicBool::new(true), |_| {
            Ok(())
        })
        .unwrap();
        assert_eq!(summary, FollowSummary::default());
        assert_eq!(driver.0.len(), 1, "a set flag reads nothing");
        let failure = ClientError::Exists {
            path: "x".to_owned(),
        };
        let result = follow(
            &mut driver,
            Follow::UntilDrained,
            &AtomicBool::new(false),
            |_| {
                Err(ClientError::Exists {
                    path: "x".to_owned(),
                })
            },
        );
        assert_eq!(result, Err(failure));
    }

    #[test]
    fn capture_now_decodes_the_record() {
        let mut driver = Scripted {
            status: STATUS_SUCCESS,
            bytes: record_bytes(0),
            requests: vec![],
        };
        let record = capture_now(&mut driver, 3).unwrap();
        assert_eq!(record.header.facts, SourceFacts::OnDemand { tag: 3 });
        assert_eq!(record.frames.len(), 2);
        assert_eq!(driver.requests, [Ioctl::CaptureNow.code()]);
    }

    /// Answers capture-threads requests as a driver would: each id's
    /// outcome by `outcome`, or every request refused with `refusal`.
    struct ThreadDriver {
        outcome: fn(u32) -> ThreadRequestOutcome,
        refusal: Option<NtStatus>,
        requests: Vec<kstack_abi::CaptureThreadsRequest>,
    }

    impl ThreadDriver {
        fn new(outcome: fn(u32) -> ThreadRequestOutcome) -> Self {
            Self {
                outcome,
                refusal: None,
                requests: Vec::new(),
            }
        }
    }

    impl Transport for ThreadDriver {
        fn control(&mut self, code: u32, input: &[u8], output: &mut [u8]) -> Reply {
            assert_eq!(code, Ioctl::CaptureThreads.code());
            let request = kstack_abi::thread_capture::decode_capture_threads_request(input)
                .expect("the client sends only valid requests");
            self.requests.push(request);
            if let Some(status) = self.refusal {
                return Reply {
                    status,
                    information: 0,
                };
            }
            let outcomes: Vec<_> = request
                .requested()
                .iter()
                .map(|&id| (self.outcome)(id))
                .collect();
            Reply {
                status: STATUS_SUCCESS,
                information: CaptureThreadsReply::new(&outcomes).unwrap().encode(output),
            }
        }
    }

    /// Odd ids name no thread; even ones are queued.
    fn odd_ones_missing(id: u32) -> ThreadRequestOutcome {
        if id % 2 == 1 {
            ThreadRequestOutcome::NoSuchThread
        } else {
            ThreadRequestOutcome::Queued
        }
    }

    #[test]
    fn capture_threads_sends_64_ids_a_request_and_decodes_each_outcome_in_order() {
        let ids: Vec<u32> = (1..=130).collect();
        let mut driver = ThreadDriver::new(odd_ones_missing);
        let outcomes = capture_threads(&mut driver, 0xABCD, 250, &ids).unwrap();
        let expected: Vec<_> = ids.iter().map(|&id| odd_ones_missing(id)).collect();
        assert_eq!(outcomes, expected);
        let sent: Vec<&[u32]> = driver
            .requests
            .iter()
            .map(kstack_abi::CaptureThreadsRequest::requested)
            .collect();
        assert_eq!(sent, [&ids[..64], &ids[64..128], &ids[128..]]);
        assert!(
            driver
                .requests
                .iter()
                .all(|request| (request.tag, request.timeout_ms) == (0xABCD, 250)),
            "every request carries the tag and the timeout"
        );
        let mut one = ThreadDriver::new(|_| ThreadRequestOutcome::SystemThread);
        assert_eq!(
            capture_threads(&mut one, 1, 1000, &[4]),
            Ok(vec![ThreadRequestOutcome::SystemThread])
        );
    }

    #[test]
    fn capture_threads_checks_every_request_before_sending_any() {
        let mut driver = ThreadDriver::new(odd_ones_missing);
        let mut ids: Vec<u32> = (1..=70).collect();
        ids[66] = 0;
        assert_eq!(
            capture_threads(&mut driver, 1, 1000, &ids),
            Err(ClientError::InvalidThreadRequest(
                CaptureThreadsError::ZeroThreadId { index: 2 }
            ))
        );
        assert_eq!(
            capture_threads(&mut driver, 1, 0, &[2]),
            Err(ClientError::InvalidThreadRequest(
                CaptureThreadsError::Timeout { value: 0 }
            ))
        );
        assert_eq!(
            capture_threads(&mut driver, 1, 1000, &[]),
            Err(ClientError::InvalidThreadRequest(
                CaptureThreadsError::Count { count: 0 }
            ))
        );
        assert!(driver.requests.is_empty(), "nothing sent");
    }

    #[test]
    fn a_refused_capture_threads_request_says_why() {
        let mut driver = ThreadDriver::new(odd_ones_missing);
        driver.refusal = Some(kstack_abi::ntstatus::KSTACK_STATUS_SOURCE_DISABLED);
        let error = capture_threads(&mut driver, 1, 1000, &[2, 4]).unwrap_err();
        assert_eq!(
            error,
            ClientError::Refused {
                request: Ioctl::CaptureThreads,
                status: kstack_abi::ntstatus::KSTACK_STATUS_SOURCE_DISABLED
            }
        );
        let text = error.to_string();
        assert!(
            text.contains("refused capture-threads")
                && text.contains("kstack config --enable threadstack"),
            "{text}"
        );
        assert_eq!(driver.requests.len(), 1, "no request after a refusal");
        // A reply that is not the whole 64 bytes does not decode.
        let mut short = Scripted {
            status: STATUS_SUCCESS,
            bytes: vec![1; 3],
            requests: vec![],
        };
        assert!(matches!(
            capture_threads(&mut short, 1, 1000, &[2, 4, 6]),
            Err(ClientError::Malformed {
                request: Ioctl::CaptureThreads,
                ..
            })
        ));
    }

    #[test]
    fn configure_validates_before_sending() {
        let mut driver = Scripted {
            status: STATUS_SUCCESS,
            bytes: vec![],
            requests: vec![],
        };
        let bad = CaptureConfig {
            frames_to_capture: 0,
            ..CaptureConfig::default()
        };
        assert!(matches!(
            configure(&mut driver, &bad),
            Err(ClientError::InvalidConfig(_))
        ));
        assert!(driver.requests.is_empty(), "nothing sent");
        let timer = CaptureConfig {
            sources: SourceSet::ALL,
            ..CaptureConfig::default()
        };
        let mut refusing = Scripted {
            status: KSTACK_STATUS_PAGING_EXECUTIVE_REQUIRED,
            bytes: vec![],
            requests: vec![],
        };
        assert_eq!(
            configure(&mut refusing, &timer),
            Err(ClientError::Refused {
                request: Ioctl::Configure,
                status: KSTACK_STATUS_PAGING_EXECUTIVE_REQUIRED
            })
        );
    }

    #[test]
    fn sequence_tracker_counts_gaps() {
        let mut tracker = SequenceTracker::default();
        assert_eq!(tracker.gaps(), 0);
        for sequence in [3, 5, 4, 9, 0] {
            tracker.note(0, sequence);
        }
        assert_eq!(tracker.received(), 4);
        assert_eq!(tracker.gaps(), 3, "6, 7 and 8 never arrived");
    }

    #[test]
    fn sequence_tracker_counts_gaps_per_shard() {
        let mut tracker = SequenceTracker::default();
        // Shard 0 lost its number 2; shard 1's number 2 does not fill it.
        for (shard, sequence) in [(0, 1), (1, 2), (0, 3), (1, 1), (1, 3)] {
            tracker.note(shard, sequence);
        }
        assert_eq!(tracker.received(), 5);
        assert_eq!(tracker.gaps(), 1);
        tracker.note(1, 6);
        assert_eq!(tracker.gaps(), 3, "and shard 1's 4 and 5");
    }
}
