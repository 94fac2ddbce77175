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
