//! The ABI's numeric limits, shared by the layouts, the validation and
//! the errors that name them.

/// The most frames one record holds, kernel and user part together. Kept
/// under 63, the limit on FramesToSkip + FramesToCapture that older Windows
/// releases document for `RtlCaptureStackBackTrace`.
pub const MAX_FRAMES: u16 = 62;
/// The most ring shards a driver keeps (one per processor up to this many).
pub const MAX_SHARDS: u16 = 64;
/// Timer period bounds, in milliseconds.
pub const TIMER_PERIOD_MS_RANGE: core::ops::RangeInclusive<u32> = 1..=10_000;
/// The most frames that may be skipped. With [`MAX_FRAMES`] this keeps
/// every walk's total under 128 frames.
pub const MAX_FRAMES_TO_SKIP: u16 = 64;
/// The most process ids each list of a configuration's process filter
/// holds.
pub const MAX_PROCESS_IDS: usize = 8;
/// The most thread ids one capture-threads request names
/// ([`crate::Ioctl::CaptureThreads`]).
pub const MAX_THREAD_CAPTURES: usize = 64;
/// The capture-threads slots the driver keeps, allocated at load: one per
/// APC queued and not yet delivered or run down, over all requests
/// ([`crate::messages::ThreadCaptureStatus::slots`]).
pub const THREAD_CAPTURE_SLOTS: u32 = 256;
/// A capture-threads request's `timeout_ms` bounds, in milliseconds.
pub const THREAD_CAPTURE_TIMEOUT_MS_RANGE: core::ops::RangeInclusive<u32> = 1..=60_000;
