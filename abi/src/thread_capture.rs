//! Thread stacks on request ([`crate::Ioctl::CaptureThreads`]): the
//! request naming the threads, the reply saying what became of each, and
//! the status counters that account for every one
//! ([`crate::messages::ThreadCaptureStatus`]).
//!
//! A request names up to [`MAX_THREAD_CAPTURES`] thread ids. For each, the
//! driver queues a special kernel APC to the thread; the APC runs in that
//! thread at `APC_LEVEL` and captures its stack, kernel and user part, as
//! one event of [`crate::Source::ThreadStack`] through the ordinary capture
//! path (process filter, ring, stack table, per-source counters). The
//! reply comes back at once, before any APC ran: the records only reach
//! the client through reads ([`crate::Ioctl::Read`]), matched to the
//! request by their facts' `tag` and `target_thread_id`
//! ([`crate::SourceFacts::ThreadStack`]).

pub use crate::{
    error::CaptureThreadsError,
    limits::{MAX_THREAD_CAPTURES, THREAD_CAPTURE_SLOTS, THREAD_CAPTURE_TIMEOUT_MS_RANGE},
};
use crate::{
    error::DecodeError,
    messages::{STATUS_PREFIX_SIZE, check_exact_length, encode_request, request_body},
    wire::{Reader, Writer},
    wire_types::wire_enum,
};

/// The capture-threads request: the prefix, then `tag` (u64), `timeout_ms`
/// (u32), `count` (u32), then [`MAX_THREAD_CAPTURES`] thread ids (u32).
pub const CAPTURE_THREADS_REQUEST_SIZE: usize = STATUS_PREFIX_SIZE + 16 + 4 * MAX_THREAD_CAPTURES;
/// The capture-threads reply: one [`ThreadRequestOutcome`] byte per
/// possible thread id.
pub const CAPTURE_THREADS_REPLY_SIZE: usize = MAX_THREAD_CAPTURES;
/// Offset of `timeout_ms` in the request.
const TIMEOUT_OFFSET: usize = STATUS_PREFIX_SIZE + 8;
/// Offset of `count` in the request.
const COUNT_OFFSET: usize = TIMEOUT_OFFSET + 4;
/// Offset of the thread ids in the request.
const THREAD_IDS_OFFSET: usize = COUNT_OFFSET + 4;

/// A capture-threads request: which threads' stacks to capture.
///
/// Layout ([`CAPTURE_THREADS_REQUEST_SIZE`], 280 bytes, little-endian):
///
/// | offset | size | field |
/// |-------:|-----:|-------|
/// | 0  | 4 | `abi_version` |
/// | 4  | 4 | `size`: 280 |
/// | 8  | 8 | `tag` |
/// | 16 | 4 | `timeout_ms`, in [`THREAD_CAPTURE_TIMEOUT_MS_RANGE`] (1 to 60000) |
/// | 20 | 4 | `count`: how many thread ids follow, 1 to [`MAX_THREAD_CAPTURES`] (64) |
/// | 24 | 4 × 64 | `thread_ids`: the first `count` are the threads to capture, each not 0 |
///
/// Entries past `count` are written as zeros and never looked at. An id
/// may repeat: each entry is its own request for a capture (one APC each).
/// The driver checks, in this order, and refuses the whole request with
/// the first failure (nothing queued, nothing counted): the length
/// (`STATUS_INVALID_BUFFER_SIZE`), the ABI version
/// (`STATUS_REVISION_MISMATCH`), the `size` word
/// (`STATUS_INVALID_BUFFER_SIZE`), then `timeout_ms`, `count` and the ids
/// in order ([`CaptureThreadsError`], each `STATUS_INVALID_PARAMETER`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CaptureThreadsRequest {
    /// The caller's tag: every record the request causes carries it in its
    /// facts ([`crate::SourceFacts::ThreadStack::tag`]), so a client tells
    /// its own captures from others'.
    pub tag: u64,
    /// How long the caller means to wait for the captures, in
    /// milliseconds. Not a cancellation: a capture that runs later is
    /// still recorded, flagged `late` and counted as
    /// [`crate::messages::ThreadCaptureStatus::late`].
    pub timeout_ms: u32,
    /// How many of `thread_ids` are requested: 1 to
    /// [`MAX_THREAD_CAPTURES`].
    pub count: u32,
    /// The thread ids; the first `count` are requested and must not be 0.
    pub thread_ids: [u32; MAX_THREAD_CAPTURES],
}

impl CaptureThreadsRequest {
    /// A checked request for `thread_ids`, in this order.
    ///
    /// # Errors
    /// The first field out of range (see [`CaptureThreadsRequest::validate`]).
    pub fn new(tag: u64, timeout_ms: u32, thread_ids: &[u32]) -> Result<Self, CaptureThreadsError> {
        let request = Self::unchecked(tag, timeout_ms, thread_ids);
        request.validate().map(|()| request)
    }

    /// The request for `thread_ids` as given, not checked (a test sends
    /// what the driver must refuse this way): `count` is their number (at
    /// most `u32::MAX`), of which the first [`MAX_THREAD_CAPTURES`] are
    /// kept.
    #[must_use]
    pub fn unchecked(tag: u64, timeout_ms: u32, thread_ids: &[u32]) -> Self {
        let mut request = Self {
            tag,
            timeout_ms,
            count: u32::try_from(thread_ids.len()).unwrap_or(u32::MAX),
            thread_ids: [0; MAX_THREAD_CAPTURES],
        };
        let kept = thread_ids.len().min(MAX_THREAD_CAPTURES);
        request.thread_ids[..kept].copy_from_slice(&thread_ids[..kept]);
        request
    }

    /// Checks the fields in layout order, as the driver does.
    ///
    /// # Errors
    /// The first field out of range: `timeout_ms` outside
    /// [`THREAD_CAPTURE_TIMEOUT_MS_RANGE`], `count` 0 or above
    /// [`MAX_THREAD_CAPTURES`], then the first requested id that is 0.
    pub fn validate(&self) -> Result<(), CaptureThreadsError> {
        if !THREAD_CAPTURE_TIMEOUT_MS_RANGE.contains(&self.timeout_ms) {
            return Err(CaptureThreadsError::Timeout {
                value: self.timeout_ms,
            });
        }
        if self.count == 0 || self.count as usize > MAX_THREAD_CAPTURES {
            return Err(CaptureThreadsError::Count { count: self.count });
        }
        match self.requested().iter().position(|&id| id == 0) {
            Some(index) => Err(CaptureThreadsError::ZeroThreadId { index }),
            None => Ok(()),
        }
    }

    /// The requested thread ids, in request order: the first `count` (all
    /// of `thread_ids` when `count` is above [`MAX_THREAD_CAPTURES`]).
    #[must_use]
    pub fn requested(&self) -> &[u32] {
        let count = usize::try_from(self.count).unwrap_or(usize::MAX);
        &self.thread_ids[..count.min(MAX_THREAD_CAPTURES)]
    }
}

/// The capture-threads request's bytes, its fields written as they are
/// (checked or not: a test sends what the driver must refuse this way);
/// entries past `count` are written as zeros.
#[must_use]
pub fn encode_capture_threads_request(
    request: &CaptureThreadsRequest,
) -> [u8; CAPTURE_THREADS_REQUEST_SIZE] {
    encode_request(|w| {
        w.u64(STATUS_PREFIX_SIZE, request.tag);
        w.u32(TIMEOUT_OFFSET, request.timeout_ms);
        w.u32(COUNT_OFFSET, request.count);
        for (index, &id) in request.requested().iter().enumerate() {
            w.u32(THREAD_IDS_OFFSET + 4 * index, id);
        }
    })
}

/// Decodes and checks a capture-threads request.
///
/// # Errors
/// A [`DecodeError`] (a field out of range is
/// [`DecodeError::CaptureThreads`]); [`DecodeError::ntstatus`] gives the
/// status to return.
pub fn decode_capture_threads_request(bytes: &[u8]) -> Result<CaptureThreadsRequest, DecodeError> {
    let r = request_body(bytes, CAPTURE_THREADS_REQUEST_SIZE)?;
    let mut request = CaptureThreadsRequest {
        tag: r.u64(STATUS_PREFIX_SIZE)?,
        timeout_ms: r.u32(TIMEOUT_OFFSET)?,
        count: r.u32(COUNT_OFFSET)?,
        thread_ids: [0; MAX_THREAD_CAPTURES],
    };
    let count = request.requested().len();
    for (index, id) in request.thread_ids[..count].iter_mut().enumerate() {
        *id = r.u32(THREAD_IDS_OFFSET + 4 * index)?;
    }
    request.validate()?;
    Ok(request)
}

wire_enum! {
/// What became of one thread id of an accepted capture-threads request.
/// Wire: a u8; 0 is none (the reply's padding).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ThreadRequestOutcome: u8 {
    /// An APC is queued to the thread: its record comes when the thread
    /// next runs APCs (or none, if the thread exits first: counted as
    /// [`crate::messages::ThreadCaptureStatus::run_down`]).
    Queued = 1,
    /// No thread has this id (it may have exited).
    NoSuchThread = 2,
    /// Every one of the driver's [`THREAD_CAPTURE_SLOTS`] slots holds an
    /// APC not yet delivered: try again later.
    NoSlot = 3,
    /// The kernel refused the APC (`KeInsertQueueApc` returned FALSE): the
    /// thread is exiting.
    NotQueued = 4,
    /// A system thread: kstack queues no APC to system threads (they have
    /// no user stack, and may never come to a state where APCs are
    /// delivered).
    SystemThread = 5,
    /// The requesting thread itself: use capture-now
    /// ([`crate::Ioctl::CaptureNow`]) for its stack.
    Own = 6,
}
}

impl ThreadRequestOutcome {
    /// Its name in the client's output.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::NoSuchThread => "no_such_thread",
            Self::NoSlot => "no_slot",
            Self::NotQueued => "not_queued",
            Self::SystemThread => "system_thread",
            Self::Own => "own",
        }
    }
}

/// The capture-threads reply: one outcome per requested thread id, in
/// request order.
///
/// Layout ([`CAPTURE_THREADS_REPLY_SIZE`], 64 bytes): byte `i` is the
/// [`ThreadRequestOutcome`] of the request's id `i` for `i` below the
/// request's `count`; the bytes after are 0. The driver returns exactly
/// these 64 bytes (the output buffer must hold at least that many).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CaptureThreadsReply {
    outcomes: [ThreadRequestOutcome; MAX_THREAD_CAPTURES],
    count: usize,
}

impl CaptureThreadsReply {
    /// The reply with these outcomes, in request order; none when there
    /// are more than [`MAX_THREAD_CAPTURES`].
    #[must_use]
    pub fn new(outcomes: &[ThreadRequestOutcome]) -> Option<Self> {
        let mut reply = Self {
            outcomes: [ThreadRequestOutcome::Queued; MAX_THREAD_CAPTURES],
            count: outcomes.len(),
        };
        reply
            .outcomes
            .get_mut(..outcomes.len())?
            .copy_from_slice(outcomes);
        Some(reply)
    }

    /// The outcomes, in request order.
    #[must_use]
    pub fn outcomes(&self) -> &[ThreadRequestOutcome] {
        &self.outcomes[..self.count]
    }

    /// Writes the reply into the front of `out`, at least
    /// [`CAPTURE_THREADS_REPLY_SIZE`] bytes (as
    /// [`crate::Ioctl::check_lengths`] ensures); returns the bytes written.
    pub fn encode(&self, out: &mut [u8]) -> usize {
        let mut w = Writer::new(out);
        for index in 0..CAPTURE_THREADS_REPLY_SIZE {
            let outcome = self
                .outcomes()
                .get(index)
                .map_or(0, |&outcome| outcome as u8);
            w.u8(index, outcome);
        }
        CAPTURE_THREADS_REPLY_SIZE
    }

    /// Decodes the reply to a request of `count` thread ids.
    ///
    /// # Errors
    /// [`DecodeError::Length`] unless `bytes` is the whole reply;
    /// [`CaptureThreadsError::Count`] for a `count` no request has;
    /// [`DecodeError::ThreadOutcome`] for a byte that is no outcome within
    /// `count`, or not 0 after it.
    pub fn decode(bytes: &[u8], count: usize) -> Result<Self, DecodeError> {
        check_exact_length(bytes, CAPTURE_THREADS_REPLY_SIZE)?;
        if !(1..=MAX_THREAD_CAPTURES).contains(&count) {
            return Err(CaptureThreadsError::Count {
                count: u32::try_from(count).unwrap_or(u32::MAX),
            }
            .into());
        }
        let r = Reader::new(bytes);
        let mut reply = Self {
            outcomes: [ThreadRequestOutcome::Queued; MAX_THREAD_CAPTURES],
            count,
        };
        for index in 0..CAPTURE_THREADS_REPLY_SIZE {
            let value = r.u8(index)?;
            let wrong = DecodeError::ThreadOutcome { index, value };
            if index < count {
                reply.outcomes[index] = ThreadRequestOutcome::from_wire(value).ok_or(wrong)?;
            } else if value != 0 {
                return Err(wrong);
            }
        }
        Ok(reply)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::{
        ABI_VERSION,
        ntstatus::{
            STATUS_INVALID_BUFFER_SIZE, STATUS_INVALID_PARAMETER, STATUS_REVISION_MISMATCH,
        },
    };

    fn sample() -> CaptureThreadsRequest {
        CaptureThreadsRequest::new(0x0102_0304_0506_0708, 1000, &[4, 0x0A0B_0C0D, 4]).unwrap()
    }

    #[test]
    fn sizes_are_the_documented_ones() {
        assert_eq!(CAPTURE_THREADS_REQUEST_SIZE, 280);
        assert_eq!(CAPTURE_THREADS_REPLY_SIZE, 64);
        assert_eq!(MAX_THREAD_CAPTURES, 64);
        assert_eq!(THREAD_CAPTURE_SLOTS, 256);
        assert_eq!(THREAD_CAPTURE_TIMEOUT_MS_RANGE, 1..=60_000);
    }

    #[test]
    fn the_documented_request_layout_table_is_the_encoding() {
        let bytes = encode_capture_threads_request(&sample());
        let mut ids = Vec::new();
        for id in [4_u32, 0x0A0B_0C0D, 4] {
            ids.extend(id.to_le_bytes());
        }
        ids.resize(4 * MAX_THREAD_CAPTURES, 0);
        let rows: [(usize, &[u8]); 6] = [
            (0, &ABI_VERSION.to_le_bytes()),
            (4, &280_u32.to_le_bytes()),
            (8, &0x0102_0304_0506_0708_u64.to_le_bytes()),
            (16, &1000_u32.to_le_bytes()),
            (20, &3_u32.to_le_bytes()),
            (24, &ids),
        ];
        crate::wire::assert_layout(&bytes, rows);
        assert_eq!(decode_capture_threads_request(&bytes), Ok(sample()));
        assert_eq!(sample().requested(), [4, 0x0A0B_0C0D, 4], "repeats kept");
    }

    #[test]
    fn new_refuses_bad_counts_zero_ids_and_timeouts_out_of_range() {
        use CaptureThreadsError::*;
        let ids: Vec<u32> = (1..=65).collect();
        assert!(CaptureThreadsRequest::new(0, 1, &ids[..64]).is_ok());
        assert!(CaptureThreadsRequest::new(0, 60_000, &[1]).is_ok());
        assert_eq!(
            CaptureThreadsRequest::new(0, 1, &ids),
            Err(Count { count: 65 })
        );
        assert_eq!(
            CaptureThreadsRequest::new(0, 1, &[]),
            Err(Count { count: 0 })
        );
        assert_eq!(
            CaptureThreadsRequest::new(0, 1, &[5, 0, 0]),
            Err(ZeroThreadId { index: 1 })
        );
        assert_eq!(
            CaptureThreadsRequest::new(0, 0, &[5]),
            Err(Timeout { value: 0 })
        );
        assert_eq!(
            CaptureThreadsRequest::new(0, 60_001, &[5]),
            Err(Timeout { value: 60_001 })
        );
        // Layout order: the timeout, then the count, then the ids.
        assert_eq!(
            CaptureThreadsRequest::new(0, 0, &[]),
            Err(Timeout { value: 0 })
        );
        assert_eq!(
            CaptureThreadsRequest::new(0, 1, &ids.iter().map(|_| 0).collect::<Vec<_>>()),
            Err(Count { count: 65 })
        );
    }

    #[test]
    fn decode_refuses_wrong_sizes_versions_and_fields() {
        let good = encode_capture_threads_request(&sample());
        for length in [0, 279, 281] {
            let mut bytes = good.to_vec();
            bytes.resize(length, 0);
            assert_eq!(
                decode_capture_threads_request(&bytes),
                Err(DecodeError::Length {
                    expected: 280,
                    actual: length
                })
            );
        }
        let mut bad = good;
        bad[0] = 11;
        let error = decode_capture_threads_request(&bad).unwrap_err();
        assert_eq!(
            (error, error.ntstatus()),
            (
                DecodeError::AbiVersion {
                    ours: ABI_VERSION,
                    theirs: 11
                },
                STATUS_REVISION_MISMATCH
            )
        );
        let mut bad = good;
        bad[5] = 0;
        let error = decode_capture_threads_request(&bad).unwrap_err();
        assert_eq!(
            (error, error.ntstatus()),
            (
                DecodeError::SizeField {
                    expected: 280,
                    declared: 24
                },
                STATUS_INVALID_BUFFER_SIZE
            )
        );
        let field = |offset: usize, value: u32| {
            let mut bytes = good;
            bytes[offset..offset + 4].copy_from_slice(&value.to_le_bytes());
            decode_capture_threads_request(&bytes)
        };
        for (offset, value, expected) in [
            (16, 0, CaptureThreadsError::Timeout { value: 0 }),
            (16, 60_001, CaptureThreadsError::Timeout { value: 60_001 }),
            (20, 0, CaptureThreadsError::Count { count: 0 }),
            (20, 65, CaptureThreadsError::Count { count: 65 }),
            (20, u32::MAX, CaptureThreadsError::Count { count: u32::MAX }),
            (28, 0, CaptureThreadsError::ZeroThreadId { index: 1 }),
            // The fourth id is 0: within a count of 4, refused.
            (20, 4, CaptureThreadsError::ZeroThreadId { index: 3 }),
        ] {
            let error = field(offset, value).unwrap_err();
            assert_eq!(error, DecodeError::CaptureThreads(expected));
            assert_eq!(error.ntstatus(), STATUS_INVALID_PARAMETER);
        }
        // Entries past the count are not looked at.
        assert_eq!(field(24 + 4 * 63, 0xFFFF_FFFF), Ok(sample()));
    }

    #[test]
    fn unchecked_fields_encode_as_they_are_for_the_driver_to_refuse() {
        let request = CaptureThreadsRequest::unchecked(1, 1000, &[7; MAX_THREAD_CAPTURES + 1]);
        assert_eq!(request.thread_ids, [7; MAX_THREAD_CAPTURES]);
        let bytes = encode_capture_threads_request(&request);
        assert_eq!(&bytes[20..24], &65_u32.to_le_bytes());
        assert_eq!(request.requested().len(), MAX_THREAD_CAPTURES);
        assert_eq!(
            decode_capture_threads_request(&bytes),
            Err(DecodeError::CaptureThreads(CaptureThreadsError::Count {
                count: 65
            }))
        );
    }

    #[test]
    fn outcomes_have_distinct_names_and_unknown_values_are_refused() {
        for (index, outcome) in ThreadRequestOutcome::ALL.into_iter().enumerate() {
            assert_eq!(outcome as usize, index + 1);
            assert_eq!(
                ThreadRequestOutcome::from_wire(outcome as u8),
                Some(outcome)
            );
        }
        assert_eq!(ThreadRequestOutcome::from_wire(0), None, "the padding");
        assert_eq!(ThreadRequestOutcome::from_wire(7), None);
        let names: std::collections::BTreeSet<_> = ThreadRequestOutcome::ALL
            .into_iter()
            .map(ThreadRequestOutcome::name)
            .collect();
        assert_eq!(names.len(), ThreadRequestOutcome::COUNT);
    }

    #[test]
    fn a_reply_is_one_byte_per_id_then_zeros() {
        use ThreadRequestOutcome::*;
        let outcomes = [Queued, NoSuchThread, NoSlot, NotQueued, SystemThread, Own];
        let reply = CaptureThreadsReply::new(&outcomes).unwrap();
        let mut out = [0xAA_u8; 70];
        assert_eq!(reply.encode(&mut out), 64);
        assert_eq!(&out[..6], &[1, 2, 3, 4, 5, 6]);
        assert!(out[6..64].iter().all(|&byte| byte == 0));
        assert_eq!(out[64], 0xAA, "nothing past the reply");
        let decoded = CaptureThreadsReply::decode(&out[..64], 6).unwrap();
        assert_eq!((decoded, decoded.outcomes()), (reply, &outcomes[..]));
        assert_eq!(CaptureThreadsReply::new(&[Queued; 65]), None);
        assert!(CaptureThreadsReply::new(&[Queued; 64]).is_some());
    }

    #[test]
    fn a_damaged_reply_is_an_error() {
        let mut good = [0_u8; 64];
        CaptureThreadsReply::new(&[ThreadRequestOutcome::Own; 3])
            .unwrap()
            .encode(&mut good);
        assert_eq!(
            CaptureThreadsReply::decode(&good[..63], 3),
            Err(DecodeError::Length {
                expected: 64,
                actual: 63
            })
        );
        for count in [0, 65] {
            assert_eq!(
                CaptureThreadsReply::decode(&good, count),
                Err(DecodeError::CaptureThreads(CaptureThreadsError::Count {
                    count: u32::try_from(count).unwrap()
                }))
            );
        }
        assert_eq!(
            CaptureThreadsReply::decode(&good, 4),
            Err(DecodeError::ThreadOutcome { index: 3, value: 0 }),
            "an id without an outcome"
        );
        assert_eq!(
            CaptureThreadsReply::decode(&good, 2),
            Err(DecodeError::ThreadOutcome { index: 2, value: 6 }),
            "an outcome past the count"
        );
        let mut unknown = good;
        unknown[1] = 7;
        assert_eq!(
            CaptureThreadsReply::decode(&unknown, 3),
            Err(DecodeError::ThreadOutcome { index: 1, value: 7 })
        );
    }

    #[test]
    fn errors_say_what_was_wrong() {
        for (error, text) in [
            (
                CaptureThreadsError::Timeout { value: 0 },
                "timeout is 0 ms; it must be 1 to 60000 ms",
            ),
            (
                CaptureThreadsError::Count { count: 65 },
                "65 thread ids; a request names 1 to 64",
            ),
            (
                CaptureThreadsError::ZeroThreadId { index: 2 },
                "thread id 2 of the list is 0",
            ),
        ] {
            assert_eq!(error.to_string(), text);
        }
        assert_eq!(
            DecodeError::ThreadOutcome { index: 9, value: 1 }.to_string(),
            "byte 9 of a capture-threads reply is 1: no outcome, or padding not 0"
        );
    }

    proptest! {
        #[test]
        fn any_valid_request_round_trips(
            tag: u64,
            timeout_ms in THREAD_CAPTURE_TIMEOUT_MS_RANGE,
            ids in prop::collection::vec(1..=u32::MAX, 1..=MAX_THREAD_CAPTURES),
        ) {
            let request = CaptureThreadsRequest::new(tag, timeout_ms, &ids).unwrap();
            let bytes = encode_capture_threads_request(&request);
            let decoded = decode_capture_threads_request(&bytes).unwrap();
            prop_assert_eq!(decoded, request);
            prop_assert_eq!(decoded.requested(), &ids[..]);
        }

        #[test]
        fn any_reply_round_trips(
            outcomes in prop::collection::vec(
                prop::sample::select(ThreadRequestOutcome::ALL.to_vec()),
                1..=MAX_THREAD_CAPTURES,
            ),
        ) {
            let reply = CaptureThreadsReply::new(&outcomes).unwrap();
            let mut bytes = [0_u8; CAPTURE_THREADS_REPLY_SIZE];
            reply.encode(&mut bytes);
            let decoded = CaptureThreadsReply::decode(&bytes, outcomes.len()).unwrap();
            prop_assert_eq!(decoded.outcomes(), &outcomes[..]);
        }

        #[test]
        fn decoding_arbitrary_bytes_never_panics(
            bytes in prop::collection::vec(any::<u8>(), 0..300),
            count in 0..70_usize,
        ) {
            if let Ok(request) = decode_capture_threads_request(&bytes) {
                prop_assert!(request.validate().is_ok());
            }
            if let Ok(reply) = CaptureThreadsReply::decode(&bytes, count) {
                prop_assert_eq!(reply.outcomes().len(), count);
            }
        }
    }
}
