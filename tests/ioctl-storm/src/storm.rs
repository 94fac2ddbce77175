//! The storm itself (Windows and Wine only).

use std::process::ExitCode;

use kstack_abi::{
    CaptureConfig, CaptureThreadsRequest, Ioctl, MAX_RECORD_SIZE, Source, SourceSet,
    StatusResponse,
    ioctl::{MAX_INPUT_LENGTH, MIN_READ_BUFFER},
    messages::{STATUS_RESPONSE_SIZE, encode_capture_now_request, encode_configure_request},
    ntstatus::NtStatus,
    thread_capture::{
        CAPTURE_THREADS_REPLY_SIZE, MAX_THREAD_CAPTURES, THREAD_CAPTURE_SLOTS,
        ThreadRequestOutcome, encode_capture_threads_request,
    },
};
use kstack_client::device::{Device, session, transport::Transport};
use kstack_driver_core::{
    Caller, DriverCore, Platform, Routine, ShardedRing, SourceControl, SourceRegistration,
    StackTable, UserThread, UserWalkFailure, Word,
    sharded_ring::{ring_words, shards_over},
    thread_captures::Slot,
    user_walk_guard::UserWalkGuard,
};

/// A user-mode stand-in for the kernel, for the reference's capture-now.
struct UserPlatform;

impl Platform for UserPlatform {
    fn irql(&self) -> u8 {
        0
    }

    fn current_ids(&self) -> (u32, u32) {
        (std::process::id(), 0)
    }

    fn processor(&self) -> u32 {
        0
    }

    fn at_dispatch<R>(&self, section: impl FnOnce(u32) -> R) -> R {
        section(0)
    }

    fn timestamp(&self) -> u64 {
        0
    }

    fn remaining_stack(&self) -> usize {
        usize::MAX
    }

    fn walk_stack(&self, _frames_to_skip: u32, frames: &mut [u64]) -> (usize, u32) {
        frames.fill(0x1000);
        (frames.len(), 0)
    }

    fn user_thread(&self) -> UserThread {
        UserThread::default()
    }

    fn walk_user_stack(&self, _frames: &mut [u64]) -> Result<usize, UserWalkFailure> {
        Ok(0)
    }
}

/// The reference has no timer to start, and no threads: every thread id
/// names none (the storm sends odd ids, which no Windows thread has).
struct NoTimer;

impl SourceControl for NoTimer {
    fn set_timer(&self, _period_ms: Option<u32>) {}

    fn queue_thread_capture(
        &self,
        _thread_id: u32,
        _slot: usize,
    ) -> Result<(), ThreadRequestOutcome> {
        Err(ThreadRequestOutcome::NoSuchThread)
    }
}

/// xorshift64*: small, seeded, reproducible.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, bound: usize) -> usize {
        usize::try_from(self.next() % bound as u64).unwrap_or(0)
    }

    fn bytes(&mut self, length: usize) -> Vec<u8> {
        (0..length).map(|_| self.next().to_le_bytes()[0]).collect()
    }
}

/// One request: a control code, its input, and its output length.
struct Request {
    code: u32,
    input: Vec<u8>,
    output_length: usize,
}

fn generate(random: &mut Random) -> Request {
    let valid = Ioctl::ALL[random.below(Ioctl::ALL.len())];
    match random.below(10) {
        // Any code at all, any small buffers.
        0 | 1 => Request {
            code: u32::try_from(random.next() >> 32).unwrap_or(0),
            input: {
                let length = random.below(MAX_INPUT_LENGTH * 2);
                random.bytes(length)
            },
            output_length: random.below(1024),
        },
        // kstack's codes with lengths of every kind.
        2..=5 => Request {
            code: valid.code(),
            input: {
                let length = random.below(MAX_INPUT_LENGTH * 2);
                random.bytes(length)
            },
            output_length: random.below(MIN_READ_BUFFER + 64),
        },
        // Well-formed requests with a few bytes damaged.
        _ => {
            let mut input = match valid {
                Ioctl::Configure => {
                    let config = CaptureConfig {
                        sources: SourceSet::from_bits(
                            u32::try_from(random.next() & u64::from(SourceSet::ALL.bits()))
                                .unwrap_or(0),
                        )
                        .unwrap_or(SourceSet::EMPTY)
                        .without(Source::Timer),
                        frames_to_skip: u16::try_from(random.below(70)).unwrap_or(0),
                        frames_to_capture: u16::try_from(random.below(70)).unwrap_or(0),
                        timer_period_ms: u32::try_from(random.below(12_000)).unwrap_or(0),
                        sample_every: Source::ALL
                            .map(|_| u16::try_from(random.below(3)).unwrap_or(1)),
                        ..CaptureConfig::default()
                    };
                    encode_configure_request(&config).to_vec()
                }
                Ioctl::CaptureNow => encode_capture_now_request(random.next()).to_vec(),
                Ioctl::CaptureThreads => capture_threads_request(random),
                Ioctl::Status | Ioctl::Read | Ioctl::Clear => Vec::new(),
            };
            for _ in 0..random.below(3) {
                if !input.is_empty() {
                    let at = random.below(input.len());
                    input[at] = random.bytes(1)[0];
                }
            }
            let output_length = match valid {
                Ioctl::Status => STATUS_RESPONSE_SIZE,
                Ioctl::Read => MIN_READ_BUFFER,
                Ioctl::CaptureNow => MAX_RECORD_SIZE,
                Ioctl::CaptureThreads => CAPTURE_THREADS_REPLY_SIZE,
                Ioctl::Configure | Ioctl::Clear => 0,
            };
            Request {
                code: valid.code(),
                input,
                output_length,
            }
        }
    }
}

/// A capture-threads request of 0 to 65 ids, not checked: each id odd, so
/// no thread has it (Windows' thread ids are multiples of 4) and no APC
/// ever reaches a real thread, or now and then 0; any timeout up to past
/// the bound.
fn capture_threads_request(random: &mut Random) -> Vec<u8> {
    let ids: Vec<u32> = (0..random.below(MAX_THREAD_CAPTURES + 2))
        .map(|_| {
            if random.below(16) == 0 {
                0
            } else {
                u32::try_from(random.next() >> 33).unwrap_or(0) * 2 + 1
            }
        })
        .collect();
    let timeout_ms = u32::try_from(random.below(70_000)).unwrap_or(0);
    let request = CaptureThreadsRequest::unchecked(random.next(), timeout_ms, &ids);
    encode_capture_threads_request(&request).to_vec()
}

/// What the reference answers.
fn expected(reference: &DriverCore<'_>, request: &Request) -> NtStatus {
    match DriverCore::admit(request.code, request.input.len(), request.output_length) {
        Err(status) => status,
        Ok(ioctl) => {
            let mut output = vec![0; request.output_length];
            reference
                .serve(
                    ioctl,
                    &request.input,
                    &mut output,
                    &UserPlatform,
                    &NoTimer,
                    Caller::default(),
                )
                .0
        }
    }
}

fn argument(position: usize, default: u64) -> u64 {
    std::env::args()
        .nth(position)
        .and_then(|text| text.parse().ok())
        .unwrap_or(default)
}

pub fn run() -> ExitCode {
    let cases = argument(1, 10_000);
    let mut random = Random(argument(2, 1) | 1);
    let mut device = match Device::open() {
        Ok(device) => device,
        Err(error) => {
            eprintln!("kstack-ioctl-storm: {error}");
            return ExitCode::FAILURE;
        }
    };
    let status = match session::status(&mut device) {
        Ok(status) => status,
        Err(error) => {
            eprintln!("kstack-ioctl-storm: {error}");
            return ExitCode::FAILURE;
        }
    };
    let words: Vec<Word> = ring_words(16 * MAX_RECORD_SIZE).collect();
    let shards: Vec<_> = shards_over(&words, 1).collect();
    // The table is off: requests answer the same either way.
    let walkers = UserWalkGuard::new();
    let slots: Vec<Slot> = (0..THREAD_CAPTURE_SLOTS).map(|_| Slot::new()).collect();
    let reference = DriverCore::new(
        ShardedRing::new(&shards),
        StackTable::new(&[]),
        status.paging_executive,
        status.driver_image,
        &slots,
        &walkers,
    );
    for source in Source::ALL {
        let registration = SourceRegistration {
            status: status.sources[source.index()].registration,
        };
        reference.set_registration(source, registration);
    }
    reference.set_routine(Routine::Apc, status.apc);
    let mut mismatches = 0_u64;
    for case in 0..cases {
        let request = generate(&mut random);
        let wanted = expected(&reference, &request);
        let mut output = vec![0; request.output_length];
        let reply = device.control(request.code, &request.input, &mut output);
        if reply.status != wanted {
            mismatches += 1;
            if mismatches <= 10 {
                eprintln!(
                    "case {case}: code {:#010x}, input {:02x?}, output {} bytes: driver {:#010x}, reference {:#010x}",
                    request.code, request.input, request.output_length, reply.status, wanted
                );
            }
        }
    }
    // Leave nothing enabled, and prove the driver still serves.
    let reset = session::configure(&mut device, &CaptureConfig::default());
    let still_serving: Result<StatusResponse, _> = session::status(&mut device);
    println!(
        "{cases} cases, {mismatches} mismatches, driver still serving: {}",
        still_serving.is_ok() && reset.is_ok()
    );
    if mismatches == 0 && still_serving.is_ok() && reset.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
