//! A driver for the thread-stack commands' tests (`kstack threads`,
//! `kstack sample`): it answers status, configure, capture-threads and read
//! requests, and can deliver the captures it queued, as a kernel whose
//! threads all run would.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use kstack_abi::{
    CaptureConfig, CaptureThreadsReply, CaptureThreadsRequest, HostRoutine, Ioctl, RecordFlags,
    RecordHeader, SourceFacts, StatusResponse, ThreadRequestOutcome, UserPart,
    messages::{STATUS_RESPONSE_SIZE, decode_configure_request},
    ntstatus::STATUS_SUCCESS,
    thread_capture::decode_capture_threads_request,
};
use kstack_client::device::{
    test_support::{encoded_record, read_reply, record_header, sample_status},
    transport::{Reply, Transport},
};

/// Every thread-stack record's frames: two kernel frames, one user frame.
pub const FRAMES: [u64; 3] = [
    0xFFFF_F800_0000_1000,
    0xFFFF_F800_0000_2000,
    0x7FF6_0000_3000,
];

/// Each thread id is queued unless `refused` says otherwise. Reads come
/// from `reads` while it holds any, then (with `delivers`) the records of
/// every queued thread not in `never_run`, each once, then nothing.
/// Configurations are kept.
pub struct FakeDriver {
    pub status: StatusResponse,
    pub refused: BTreeMap<u32, ThreadRequestOutcome>,
    pub reads: VecDeque<Vec<Vec<u8>>>,
    pub read_requests: usize,
    pub configured: Vec<CaptureConfig>,
    pub configure_status: i32,
    pub requests: Vec<CaptureThreadsRequest>,
    /// Queued captures become records for the next read.
    pub delivers: bool,
    /// Threads whose APC never runs.
    pub never_run: BTreeSet<u32>,
    /// Capture-threads requests from this one on (counted from 0) are
    /// refused as a whole with this status.
    pub refuse_from: Option<(usize, i32)>,
    delivered: Vec<Vec<u8>>,
    sequence: u64,
}

impl FakeDriver {
    pub fn new(reads: Vec<Vec<Vec<u8>>>) -> Self {
        Self {
            status: StatusResponse {
                apc: HostRoutine::Available,
                config: CaptureConfig::default(),
                ..sample_status()
            },
            refused: BTreeMap::new(),
            reads: reads.into(),
            read_requests: 0,
            configured: Vec::new(),
            configure_status: STATUS_SUCCESS,
            requests: Vec::new(),
            delivers: false,
            never_run: BTreeSet::new(),
            refuse_from: None,
            delivered: Vec::new(),
            sequence: 0,
        }
    }

    fn capture_threads(&mut self, input: &[u8]) -> Vec<u8> {
        let request = decode_capture_threads_request(input).unwrap();
        self.requests.push(request);
        let outcomes: Vec<_> = request
            .requested()
            .iter()
            .map(|id| {
                self.refused
                    .get(id)
                    .copied()
                    .unwrap_or(ThreadRequestOutcome::Queued)
            })
            .collect();
        for (&thread_id, &outcome) in request.requested().iter().zip(&outcomes) {
            if self.delivers
                && outcome == ThreadRequestOutcome::Queued
                && !self.never_run.contains(&thread_id)
            {
                self.sequence += 1;
                let record = thread_stack(self.sequence, request.tag, thread_id, false);
                self.delivered.push(record);
            }
        }
        let mut bytes = vec![0; 64];
        CaptureThreadsReply::new(&outcomes)
            .unwrap()
            .encode(&mut bytes);
        bytes
    }

    fn read(&mut self) -> Vec<u8> {
        self.read_requests += 1;
        let records = self
            .reads
            .pop_front()
            .unwrap_or_else(|| std::mem::take(&mut self.delivered));
        let count = u32::try_from(records.len()).unwrap();
        read_reply(&records.concat(), count, false, 0)
    }
}

impl Transport for FakeDriver {
    fn control(&mut self, code: u32, input: &[u8], output: &mut [u8]) -> Reply {
        let (status, bytes) = if code == Ioctl::Status.code() {
            let mut bytes = vec![0; STATUS_RESPONSE_SIZE];
            self.status.encode(&mut bytes);
            (STATUS_SUCCESS, bytes)
        } else if code == Ioctl::Configure.code() {
            let config = decode_configure_request(input).unwrap();
            self.configured.push(config);
            if self.configure_status == STATUS_SUCCESS {
                self.status.config = config;
            }
            (self.configure_status, Vec::new())
        } else if code == Ioctl::CaptureThreads.code() {
            match self.refuse_from {
                Some((first, status)) if self.requests.len() >= first => {
                    self.requests
                        .push(decode_capture_threads_request(input).unwrap());
                    (status, Vec::new())
                }
                _ => (STATUS_SUCCESS, self.capture_threads(input)),
            }
        } else {
            assert_eq!(code, Ioctl::Read.code());
            (STATUS_SUCCESS, self.read())
        };
        output[..bytes.len()].copy_from_slice(&bytes);
        Reply {
            status,
            information: bytes.len(),
        }
    }
}

/// The record of `thread_id` (of process 4) for a request of `tag`,
/// captured in that thread: [`FRAMES`].
pub fn thread_stack(sequence: u64, tag: u64, thread_id: u32, late: bool) -> Vec<u8> {
    let facts = SourceFacts::ThreadStack {
        target_process_id: 4,
        target_thread_id: thread_id,
        tag,
        delay: 12_345,
        late,
    };
    let header = RecordHeader {
        thread_id,
        // 2025-11-24T16:00:00Z.
        timestamp: 134_084_736_000_000_000,
        irql: 1,
        user_frame_count: 1,
        user_part: UserPart::Captured,
        ..record_header(sequence, facts, RecordFlags::NONE, &FRAMES)
    };
    encoded_record(&header, &FRAMES)
}
