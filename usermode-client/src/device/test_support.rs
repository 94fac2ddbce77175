//! Driver replies built for scripted transports (feature `test-support`,
//! which only the crate's own tests turn on).

use kstack_abi::{
    Altitude, CaptureConfig, DriverImage, HostRoutine, MAX_RECORD_SIZE, PagingExecutive,
    ProcessFilter, ReadHeader, RecordFlags, RecordHeader, Source, SourceFacts, SourceStatus,
    StackTableStatus, StatusResponse, ThreadCaptureStatus, encode_record,
    messages::READ_HEADER_SIZE, stack_id,
};

/// One encoded record of `stack`'s stack (process 4, thread 8, shard 0,
/// time 0), with these facts and flags, holding `frames` (the stack, or
/// none for a record that names it).
///
/// # Panics
/// When `frames` holds more than a record can.
#[must_use]
pub fn record_bytes(
    sequence: u64,
    facts: SourceFacts,
    flags: RecordFlags,
    stack: &[u64],
    frames: &[u64],
) -> Vec<u8> {
    encoded_record(&record_header(sequence, facts, flags, stack), frames)
}

/// The header [`record_bytes`] gives its record, for a test to change
/// before [`encoded_record`].
#[must_use]
pub fn record_header(
    sequence: u64,
    facts: SourceFacts,
    flags: RecordFlags,
    stack: &[u64],
) -> RecordHeader {
    RecordHeader {
        sequence,
        timestamp: 0,
        process_id: 4,
        thread_id: 8,
        processor: 0,
        shard: 0,
        irql: 0,
        flags,
        user_frame_count: 0,
        user_part: kstack_abi::UserPart::Off,
        os_hash: 1,
        stack_id: stack_id(stack),
        facts,
    }
}

/// `header`'s record holding `frames`, encoded.
///
/// # Panics
/// When `frames` holds more than a record can, or fewer than the header's
/// user frames.
#[must_use]
pub fn encoded_record(header: &RecordHeader, frames: &[u64]) -> Vec<u8> {
    let mut out = vec![0; MAX_RECORD_SIZE];
    let size = encode_record(header, frames, &mut out).expect("at most MAX_FRAMES frames");
    out.truncate(size);
    out
}

/// A read reply: its header (declaring `declared` records, and `dropped`)
/// and `payload`.
///
/// # Panics
/// When the payload is over 4 GiB.
#[must_use]
pub fn read_reply(payload: &[u8], declared: u32, more_pending: bool, dropped: u64) -> Vec<u8> {
    let mut bytes = vec![0; READ_HEADER_SIZE];
    ReadHeader {
        record_count: declared,
        payload_bytes: u32::try_from(payload.len()).expect("a small payload"),
        more_pending,
        dropped,
    }
    .encode(&mut bytes);
    bytes.extend(payload);
    bytes
}

/// A status with every part set (two shards, a process filter, timer
/// sampling, a stack table in use, module records, thread ids requested
/// and none queued), as report and live view tests and the deliverables'
/// JSON check read it.
///
/// # Panics
/// Never: the process filter's lists are valid.
#[must_use]
pub fn sample_status() -> StatusResponse {
    let mut sources = [SourceStatus {
        available: true,
        captured: 1,
        sampled_out: 1,
        ..SourceStatus::ZERO
    }; Source::COUNT];
    // No thread capture was delivered: its source counted nothing.
    sources[Source::ThreadStack.index()] = SourceStatus {
        available: true,
        ..SourceStatus::ZERO
    };
    StatusResponse {
        driver_version: (0, 1, 0),
        paging_executive: PagingExecutive::NOT_SET,
        ring_capacity: 8192,
        ring_used: 3,
        ring_used_bytes: 288,
        ring_shards: 2,
        outstanding_allocations: 2,
        config: CaptureConfig {
            processes: ProcessFilter::new(&[4, 8], &[0]).unwrap(),
            sample_every: Source::ALL.map(|source| if source == Source::Timer { 10 } else { 1 }),
            ..CaptureConfig::default()
        },
        dropped: 0,
        cleared: 0,
        read: 6,
        sequences_spent: 9,
        sources,
        driver_image: DriverImage {
            base: 0x1_4000_0000,
            size: 0x3_0000,
        },
        object_altitude: Altitude {
            whole: 385_291,
            fraction: 0,
        },
        registry_altitude: Altitude::default(),
        stack_table: StackTableStatus {
            entries: 4096,
            used: 3,
            hits: 40,
            inserts: 3,
            ..StackTableStatus::default()
        },
        user_walk: HostRoutine::HostStub,
        process_key: HostRoutine::HostStub,
        module_records: 2,
        apc: HostRoutine::HostStub,
        apc_take_back: HostRoutine::NotExported,
        thread_captures: ThreadCaptureStatus {
            requested: 3,
            no_such_thread: 2,
            own: 1,
            slots: 256,
            ..ThreadCaptureStatus::default()
        },
    }
}

/// A driver whose ring never runs dry, for tests that kill the client in
/// the middle of a capture: each read returns [`EndlessDriver::BATCH`]
/// timer records numbered on from 1, over eight stacks, after writing the
/// last sequence number it hands out to its log (a line per read, written
/// through at once), so a test knows what was drained when it killed.
/// The Linux test build of `kstack` opens it in place of the device when
/// [`EndlessDriver::ENVIRONMENT_VARIABLE`] names the log.
pub struct EndlessDriver {
    next: u64,
    log: std::fs::File,
}

impl EndlessDriver {
    /// Records per read (about 52 KB: within the client's first read
    /// buffer).
    pub const BATCH: u64 = 500;
    /// The variable naming the log; the driver exists only when it is set.
    pub const ENVIRONMENT_VARIABLE: &str = "KSTACK_TEST_ENDLESS_DRIVER_LOG";

    /// The driver the environment asks for, if any.
    ///
    /// # Panics
    /// When the log cannot be created.
    #[must_use]
    pub fn from_environment() -> Option<Self> {
        let path = std::env::var_os(Self::ENVIRONMENT_VARIABLE)?;
        Some(Self {
            next: 1,
            log: std::fs::File::create(path).expect("the endless driver's log"),
        })
    }

    /// The stack of the record `sequence`.
    #[must_use]
    pub fn stack(sequence: u64) -> [u64; 3] {
        let stack = sequence % 8;
        [
            0xFFFF_F800_0000_1000 + stack,
            0xFFFF_F800_0000_2000,
            0xFFFF_F800_0000_3000,
        ]
    }
}

impl crate::device::transport::Transport for EndlessDriver {
    fn control(
        &mut self,
        code: u32,
        _input: &[u8],
        output: &mut [u8],
    ) -> crate::device::transport::Reply {
        use std::io::Write as _;
        let bytes = if code == kstack_abi::Ioctl::Status.code() {
            let mut bytes = vec![0; kstack_abi::messages::STATUS_RESPONSE_SIZE];
            sample_status().encode(&mut bytes);
            bytes
        } else if code == kstack_abi::Ioctl::Read.code() {
            let first = self.next;
            self.next += Self::BATCH;
            let records: Vec<u8> = (first..self.next)
                .flat_map(|sequence| {
                    let stack = Self::stack(sequence);
                    record_bytes(
                        sequence,
                        SourceFacts::Timer,
                        RecordFlags::NONE,
                        &stack,
                        &stack,
                    )
                })
                .collect();
            writeln!(self.log, "{}", self.next - 1).expect("the endless driver's log");
            read_reply(&records, u32::try_from(Self::BATCH).unwrap_or(0), false, 0)
        } else {
            return crate::device::transport::Reply {
                status: kstack_abi::ntstatus::STATUS_INVALID_DEVICE_REQUEST,
                information: 0,
            };
        };
        output[..bytes.len()].copy_from_slice(&bytes);
        crate::device::transport::Reply {
            status: kstack_abi::ntstatus::STATUS_SUCCESS,
            information: bytes.len(),
        }
    }
}
