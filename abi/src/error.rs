//! The ABI's errors: what a request or a reply broke when decoded, and
//! why a configuration was refused, each with the status the driver
//! completes a refused request with.

use crate::{
    limits::{
        MAX_FRAMES, MAX_FRAMES_TO_SKIP, MAX_PROCESS_IDS, MAX_SHARDS, MAX_THREAD_CAPTURES,
        THREAD_CAPTURE_TIMEOUT_MS_RANGE, TIMER_PERIOD_MS_RANGE,
    },
    ntstatus::{
        NtStatus, STATUS_INVALID_BUFFER_SIZE, STATUS_INVALID_PARAMETER, STATUS_INVALID_PARAMETER_1,
        STATUS_INVALID_PARAMETER_2, STATUS_INVALID_PARAMETER_3, STATUS_INVALID_PARAMETER_4,
        STATUS_INVALID_PARAMETER_5, STATUS_INVALID_PARAMETER_6, STATUS_INVALID_PARAMETER_7,
        STATUS_REVISION_MISMATCH,
    },
    source::Source,
};

/// Why bytes could not be decoded: a request the driver refuses, or a reply
/// the client cannot trust.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// Fewer bytes than the layout needs.
    Truncated {
        /// Bytes needed.
        needed: usize,
        /// Bytes present.
        actual: usize,
    },
    /// A message that must be exactly `expected` bytes is not.
    Length {
        /// Its size.
        expected: usize,
        /// Bytes present.
        actual: usize,
    },
    /// The other side speaks another ABI version.
    AbiVersion {
        /// This side's [`crate::ABI_VERSION`].
        ours: u32,
        /// The version in the message.
        theirs: u32,
    },
    /// The message's `size` word disagrees with its layout.
    SizeField {
        /// The layout's size.
        expected: usize,
        /// The size the message declares.
        declared: u32,
    },
    /// A configuration field is out of range.
    Config(ConfigError),
    /// A capture-threads request's field is out of range.
    CaptureThreads(CaptureThreadsError),
    /// A record claims more frames than a record can hold.
    TooManyFrames {
        /// The claimed count.
        count: usize,
    },
    /// A record's size does not match its frame count.
    RecordSizeMismatch {
        /// The record's size word.
        size: usize,
        /// Its frame count.
        frame_count: u16,
    },
    /// A record names a shard past [`MAX_SHARDS`].
    ShardOutOfRange {
        /// The shard it names.
        shard: u16,
    },
    /// A record names no known source.
    UnknownSource {
        /// The wire value.
        value: u8,
    },
    /// Flag bits this version does not define.
    UnknownFlags {
        /// The bits received.
        bits: u32,
    },
    /// A record's fact words are not valid for its source.
    InvalidFacts {
        /// The record's source.
        source: Source,
    },
    /// A status's paging state is unknown or contradicts its value.
    PagingState {
        /// The state's wire value.
        value: u32,
    },
    /// A record without frames ([`crate::RecordFlags::STACK_BY_ID`]) names a stack
    /// id that no earlier record carried frames for.
    UnknownStack {
        /// The stack id.
        stack_id: u64,
    },
    /// A record's user part is longer than its stack.
    UserFrames {
        /// The record's `user_frame_count`.
        user_frame_count: u8,
        /// Its `frame_count`.
        frame_count: u16,
    },
    /// A record's `user_part` is no known [`crate::UserPart`].
    UnknownUserPart {
        /// The wire value.
        value: u8,
    },
    /// A status names a routine state that is no [`crate::HostRoutine`].
    HostRoutine {
        /// The wire value.
        value: u32,
    },
    /// A test fault-probe request names no known target.
    UnknownProbeTarget {
        /// The target word received.
        value: u64,
    },
    /// A module record's event value is not a [`crate::ModuleEvent`].
    UnknownModuleEvent {
        /// The value.
        value: u8,
    },
    /// A module record whose size disagrees with its path, whose path is
    /// too long, whose padding or reserved byte is not zero, whose shard
    /// is out of range, or a process exit that names an image.
    InvalidModuleRecord,
    /// A capture-threads reply's byte at `index` is no
    /// [`crate::thread_capture::ThreadRequestOutcome`] where the request
    /// named a thread, or not 0 after the request's last thread.
    ThreadOutcome {
        /// The byte's offset in the reply.
        index: usize,
        /// Its value.
        value: u8,
    },
}

impl From<ConfigError> for DecodeError {
    fn from(error: ConfigError) -> Self {
        Self::Config(error)
    }
}

impl From<CaptureThreadsError> for DecodeError {
    fn from(error: CaptureThreadsError) -> Self {
        Self::CaptureThreads(error)
    }
}

impl DecodeError {
    /// The status the driver completes a request with when its input fails
    /// to decode.
    #[must_use]
    pub const fn ntstatus(self) -> NtStatus {
        match self {
            Self::AbiVersion { .. } => STATUS_REVISION_MISMATCH,
            Self::Config(error) => error.ntstatus(),
            Self::Truncated { .. } | Self::Length { .. } | Self::SizeField { .. } => {
                STATUS_INVALID_BUFFER_SIZE
            }
            Self::TooManyFrames { .. }
            | Self::RecordSizeMismatch { .. }
            | Self::ShardOutOfRange { .. }
            | Self::UnknownSource { .. }
            | Self::UnknownFlags { .. }
            | Self::InvalidFacts { .. }
            | Self::PagingState { .. }
            | Self::UnknownStack { .. }
            | Self::UserFrames { .. }
            | Self::UnknownUserPart { .. }
            | Self::HostRoutine { .. }
            | Self::UnknownProbeTarget { .. }
            | Self::UnknownModuleEvent { .. }
            | Self::InvalidModuleRecord
            | Self::CaptureThreads(_)
            | Self::ThreadOutcome { .. } => STATUS_INVALID_PARAMETER,
        }
    }
}

impl core::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            Self::Truncated { needed, actual } => {
                write!(f, "truncated: {actual} bytes where {needed} are needed")
            }
            Self::Length { expected, actual } => {
                write!(f, "{actual} bytes where exactly {expected} are expected")
            }
            Self::AbiVersion { ours, theirs } => {
                write!(
                    f,
                    "ABI version mismatch: this side speaks {ours}, the other side {theirs}"
                )
            }
            Self::SizeField { expected, declared } => {
                write!(
                    f,
                    "message declares {declared} bytes; its layout has {expected}"
                )
            }
            Self::Config(error) => write!(f, "invalid configuration: {error}"),
            Self::CaptureThreads(error) => write!(f, "invalid capture-threads request: {error}"),
            Self::TooManyFrames { count } => {
                write!(f, "{count} frames; a record holds at most {MAX_FRAMES}")
            }
            Self::RecordSizeMismatch { size, frame_count } => {
                write!(f, "record of {size} bytes cannot hold {frame_count} frames")
            }
            Self::ShardOutOfRange { shard } => {
                write!(f, "shard {shard}; a driver keeps at most {MAX_SHARDS}")
            }
            Self::UnknownSource { value } => write!(f, "unknown source {value}"),
            Self::UnknownFlags { bits } => write!(f, "unknown flag bits {bits:#x}"),
            Self::InvalidFacts { source } => {
                write!(f, "invalid facts for a {} record", source.name())
            }
            Self::PagingState { value } => write!(
                f,
                "paging state {value} is unknown or contradicts the DisablePagingExecutive value"
            ),
            Self::UnknownStack { stack_id } => write!(
                f,
                "a record names stack {stack_id:#018x}, whose frames no earlier record carried"
            ),
            Self::UserFrames {
                user_frame_count,
                frame_count,
            } => write!(
                f,
                "a record says {user_frame_count} of its {frame_count} frames are user frames"
            ),
            Self::UnknownUserPart { value } => write!(f, "unknown user-part state {value}"),
            Self::HostRoutine { value } => write!(f, "unknown host-routine state {value}"),
            Self::UnknownProbeTarget { value } => {
                write!(f, "unknown fault-probe target {value}")
            }
            Self::UnknownModuleEvent { value } => write!(f, "unknown module event {value}"),
            Self::InvalidModuleRecord => write!(
                f,
                "a module record's size, path, padding, shard or image contradicts its layout"
            ),
            Self::ThreadOutcome { index, value } => write!(
                f,
                "byte {index} of a capture-threads reply is {value}: no outcome, or padding not 0"
            ),
        }
    }
}

/// Why a capture-threads request's fields were refused (see
/// [`crate::thread_capture::CaptureThreadsRequest`]); the driver completes
/// the request with `STATUS_INVALID_PARAMETER`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaptureThreadsError {
    /// `timeout_ms` is outside [`THREAD_CAPTURE_TIMEOUT_MS_RANGE`].
    Timeout {
        /// The value given.
        value: u32,
    },
    /// `count` is 0 or above [`MAX_THREAD_CAPTURES`].
    Count {
        /// The value given.
        count: u32,
    },
    /// A requested thread id is 0 (no thread has it).
    ZeroThreadId {
        /// Its position in the request's list.
        index: usize,
    },
}

impl core::fmt::Display for CaptureThreadsError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            Self::Timeout { value } => write!(
                f,
                "timeout is {value} ms; it must be {} to {} ms",
                THREAD_CAPTURE_TIMEOUT_MS_RANGE.start(),
                THREAD_CAPTURE_TIMEOUT_MS_RANGE.end()
            ),
            Self::Count { count } => write!(
                f,
                "{count} thread ids; a request names 1 to {MAX_THREAD_CAPTURES}"
            ),
            Self::ZeroThreadId { index } => write!(f, "thread id {index} of the list is 0"),
        }
    }
}

/// Why a configuration was refused. Each maps to its own NTSTATUS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// `sources` has bits that name no source.
    UnknownSources {
        /// The offending bits.
        bits: u32,
    },
    /// `frames_to_skip` is above [`MAX_FRAMES_TO_SKIP`].
    FramesToSkip {
        /// The value given.
        value: u16,
    },
    /// `frames_to_capture` is 0 or above [`MAX_FRAMES`].
    FramesToCapture {
        /// The value given.
        value: u16,
    },
    /// `timer_period_ms` is outside [`TIMER_PERIOD_MS_RANGE`].
    TimerPeriod {
        /// The value given.
        value: u32,
    },
    /// A process list is longer than [`MAX_PROCESS_IDS`], or an id is in
    /// both.
    Processes,
    /// A source's `sample_every` is 0, or the on-demand or thread-stack
    /// source's is not 1.
    SampleEvery {
        /// The source.
        source: Source,
        /// The value given.
        value: u16,
    },
    /// A source's `user_frames` is above [`MAX_FRAMES`], or the timer's is
    /// not 0.
    UserFrames {
        /// The source.
        source: Source,
        /// The value given.
        value: u8,
    },
}

impl ConfigError {
    /// The status the driver completes the request with.
    #[must_use]
    pub const fn ntstatus(self) -> NtStatus {
        match self {
            Self::UnknownSources { .. } => STATUS_INVALID_PARAMETER_1,
            Self::FramesToSkip { .. } => STATUS_INVALID_PARAMETER_2,
            Self::FramesToCapture { .. } => STATUS_INVALID_PARAMETER_3,
            Self::TimerPeriod { .. } => STATUS_INVALID_PARAMETER_4,
            Self::Processes => STATUS_INVALID_PARAMETER_5,
            Self::SampleEvery { .. } => STATUS_INVALID_PARAMETER_6,
            Self::UserFrames { .. } => STATUS_INVALID_PARAMETER_7,
        }
    }
}

impl core::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            Self::UnknownSources { bits } => write!(f, "source bits {bits:#x} name no source"),
            Self::FramesToSkip { value } => {
                write!(
                    f,
                    "frames to skip is {value}; the most is {MAX_FRAMES_TO_SKIP}"
                )
            }
            Self::FramesToCapture { value } => {
                write!(
                    f,
                    "frames to capture is {value}; it must be 1 to {MAX_FRAMES}"
                )
            }
            Self::TimerPeriod { value } => write!(
                f,
                "timer period is {value} ms; it must be {} to {} ms",
                TIMER_PERIOD_MS_RANGE.start(),
                TIMER_PERIOD_MS_RANGE.end()
            ),
            Self::Processes => write!(
                f,
                "a process list holds more than {MAX_PROCESS_IDS} ids, or an id is both included and \
                 excluded"
            ),
            Self::SampleEvery { source, value } => write!(
                f,
                "{} keeps one event in {value}; it must be 1 to 65535 (1 for ondemand and \
                 threadstack)",
                source.name()
            ),
            Self::UserFrames { source, value } => write!(
                f,
                "{} walks {value} user frames; it must be 0 to {MAX_FRAMES} (0 for timer)",
                source.name()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ABI_VERSION;

    #[test]
    fn decode_errors_say_what_was_wrong() {
        let texts = [
            (
                DecodeError::Truncated {
                    needed: 8,
                    actual: 2,
                },
                "truncated: 2 bytes where 8 are needed",
            ),
            (
                DecodeError::Length {
                    expected: 24,
                    actual: 25,
                },
                "25 bytes where exactly 24 are expected",
            ),
            (
                DecodeError::AbiVersion { ours: 5, theirs: 4 },
                "ABI version mismatch: this side speaks 5, the other side 4",
            ),
            (
                DecodeError::SizeField {
                    expected: 24,
                    declared: 9,
                },
                "message declares 9 bytes; its layout has 24",
            ),
            (DecodeError::UnknownSource { value: 9 }, "unknown source 9"),
            (
                DecodeError::UnknownFlags { bits: 0x10 },
                "unknown flag bits 0x10",
            ),
            (
                DecodeError::PagingState { value: 7 },
                "paging state 7 is unknown or contradicts the DisablePagingExecutive value",
            ),
        ];
        for (error, text) in texts {
            assert_eq!(error.to_string(), text);
        }
    }

    #[test]
    fn decode_errors_map_to_request_statuses() {
        assert_eq!(
            DecodeError::AbiVersion {
                ours: ABI_VERSION,
                theirs: 0xEE
            }
            .ntstatus(),
            STATUS_REVISION_MISMATCH
        );
        assert_eq!(
            DecodeError::Length {
                expected: 1,
                actual: 2
            }
            .ntstatus(),
            STATUS_INVALID_BUFFER_SIZE
        );
        assert_eq!(
            DecodeError::Config(ConfigError::FramesToCapture { value: 0 }).ntstatus(),
            ConfigError::FramesToCapture { value: 0 }.ntstatus()
        );
    }
}
