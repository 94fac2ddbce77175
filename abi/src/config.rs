//! The capture configuration: which sources run and how much stack each
//! record keeps. Validated here, once, for both sides.

use crate::{
    DecodeError, MAX_FRAMES, SourceSet,
    ntstatus::{
        NtStatus, STATUS_INVALID_PARAMETER_1, STATUS_INVALID_PARAMETER_2,
        STATUS_INVALID_PARAMETER_3, STATUS_INVALID_PARAMETER_4,
    },
    wire::{Reader, Writer},
};

/// Default `frames_to_skip`: keep every frame, kstack's own included, so
/// frame 0 is always the capture call and nothing is hidden by a guess.
pub const DEFAULT_FRAMES_TO_SKIP: u16 = 0;
/// Default `frames_to_capture`.
pub const DEFAULT_FRAMES_TO_CAPTURE: u16 = 32;
/// Default timer period: 10 ms, about 100 samples a second per enabled timer.
pub const DEFAULT_TIMER_PERIOD_MS: u32 = 10;
/// Timer period bounds, in milliseconds.
pub const TIMER_PERIOD_MS_RANGE: core::ops::RangeInclusive<u32> = 1..=10_000;
/// The most frames that may be skipped. With [`MAX_FRAMES`] this keeps
/// every walk's total under 128 frames.
pub const MAX_FRAMES_TO_SKIP: u16 = 64;

/// Encoded size of a [`CaptureConfig`].
pub const CAPTURE_CONFIG_SIZE: usize = 16;

/// What the driver captures. Wire layout (16 bytes): `sources` u32,
/// `frames_to_skip` u16, `frames_to_capture` u16, `process_filter` u32,
/// `timer_period_ms` u32.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CaptureConfig {
    /// Sources whose records enter the ring. A disabled source's events are
    /// not looked at (and not counted). Capture-now is a request, not an
    /// event: it always answers its caller with the caller's stack, and
    /// keeps the record in the ring only when [`crate::Source::OnDemand`] is
    /// enabled (otherwise the record is flagged `NOT_IN_RING` and counted
    /// as `not_kept`).
    pub sources: SourceSet,
    /// `RtlCaptureStackBackTrace`'s FramesToSkip.
    pub frames_to_skip: u16,
    /// `RtlCaptureStackBackTrace`'s FramesToCapture, 1 to [`MAX_FRAMES`].
    pub frames_to_capture: u16,
    /// Only records of this process id enter the ring; 0 admits every
    /// process. It applies to every source, capture-now included, and is
    /// checked against the process the callback runs in (the record's
    /// `process_id`), which for process, thread and image events need not
    /// be the process the event's facts name. An event
    /// left out is counted as `filtered` for its source; a capture-now
    /// from another process still answers its caller, flagged
    /// `NOT_IN_RING`.
    pub process_filter: u32,
    /// The timer source's period in milliseconds.
    pub timer_period_ms: u32,
}

impl Default for CaptureConfig {
    /// Nothing enabled; the default frame counts.
    fn default() -> Self {
        Self {
            sources: SourceSet::EMPTY,
            frames_to_skip: DEFAULT_FRAMES_TO_SKIP,
            frames_to_capture: DEFAULT_FRAMES_TO_CAPTURE,
            process_filter: 0,
            timer_period_ms: DEFAULT_TIMER_PERIOD_MS,
        }
    }
}

impl CaptureConfig {
    /// Whether a record of `process_id` may enter the ring under
    /// [`CaptureConfig::process_filter`].
    #[must_use]
    pub const fn admits_process(&self, process_id: u32) -> bool {
        self.process_filter == 0 || self.process_filter == process_id
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
        }
    }
}

impl CaptureConfig {
    /// Checks every field.
    ///
    /// # Errors
    /// The first field that is out of range.
    pub const fn validate(&self) -> Result<(), ConfigError> {
        if self.frames_to_skip > MAX_FRAMES_TO_SKIP {
            return Err(ConfigError::FramesToSkip {
                value: self.frames_to_skip,
            });
        }
        if self.frames_to_capture == 0 || self.frames_to_capture > MAX_FRAMES {
            return Err(ConfigError::FramesToCapture {
                value: self.frames_to_capture,
            });
        }
        if self.timer_period_ms < *TIMER_PERIOD_MS_RANGE.start()
            || self.timer_period_ms > *TIMER_PERIOD_MS_RANGE.end()
        {
            return Err(ConfigError::TimerPeriod {
                value: self.timer_period_ms,
            });
        }
        Ok(())
    }

    pub(crate) fn encode(&self, w: &mut Writer<'_>, at: usize) {
        w.u32(at, self.sources.bits());
        w.u16(at + 4, self.frames_to_skip);
        w.u16(at + 6, self.frames_to_capture);
        w.u32(at + 8, self.process_filter);
        w.u32(at + 12, self.timer_period_ms);
    }

    /// Decodes and validates the configuration at `at`.
    pub(crate) fn decode(r: Reader<'_>, at: usize) -> Result<Self, DecodeError> {
        let bits = r.u32(at)?;
        let sources = SourceSet::from_bits(bits).ok_or(ConfigError::UnknownSources {
            bits: bits & !SourceSet::ALL.bits(),
        })?;
        let config = Self {
            sources,
            frames_to_skip: r.u16(at + 4)?,
            frames_to_capture: r.u16(at + 6)?,
            process_filter: r.u32(at + 8)?,
            timer_period_ms: r.u32(at + 12)?,
        };
        config.validate()?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Source;

    #[test]
    fn the_process_filter_admits_its_process_or_every_process_when_0() {
        let mut config = CaptureConfig::default();
        assert!(
            config.admits_process(0) && config.admits_process(4) && config.admits_process(u32::MAX)
        );
        config.process_filter = 4;
        assert!(config.admits_process(4));
        assert!(!config.admits_process(0) && !config.admits_process(8));
    }

    #[test]
    fn errors_say_which_field_and_its_range() {
        let texts = [
            (
                ConfigError::UnknownSources { bits: 0x80 },
                "source bits 0x80 name no source",
            ),
            (
                ConfigError::FramesToSkip { value: 99 },
                "frames to skip is 99; the most is",
            ),
            (
                ConfigError::FramesToCapture { value: 0 },
                "frames to capture is 0; it must be 1 to",
            ),
            (
                ConfigError::TimerPeriod { value: 0 },
                "timer period is 0 ms; it must be",
            ),
        ];
        for (error, text) in texts {
            assert!(error.to_string().starts_with(text), "{error}");
        }
    }

    #[test]
    fn default_is_valid_and_captures_nothing() {
        let config = CaptureConfig::default();
        assert_eq!(config.validate(), Ok(()));
        assert_eq!(config.sources, SourceSet::EMPTY);
    }

    #[test]
    fn frame_bounds_are_enforced() {
        let at = |frames_to_skip, frames_to_capture| {
            CaptureConfig {
                frames_to_skip,
                frames_to_capture,
                ..CaptureConfig::default()
            }
            .validate()
        };
        assert_eq!(at(0, 1), Ok(()));
        assert_eq!(at(MAX_FRAMES_TO_SKIP, MAX_FRAMES), Ok(()));
        assert_eq!(at(0, 0), Err(ConfigError::FramesToCapture { value: 0 }));
        assert_eq!(
            at(0, MAX_FRAMES + 1),
            Err(ConfigError::FramesToCapture { value: 63 })
        );
        assert_eq!(
            at(MAX_FRAMES_TO_SKIP + 1, 1),
            Err(ConfigError::FramesToSkip { value: 65 })
        );
    }

    #[test]
    fn each_error_has_its_own_status() {
        let statuses = [
            ConfigError::UnknownSources { bits: 1 }.ntstatus(),
            ConfigError::FramesToSkip { value: 99 }.ntstatus(),
            ConfigError::FramesToCapture { value: 0 }.ntstatus(),
            ConfigError::TimerPeriod { value: 0 }.ntstatus(),
        ];
        for (i, a) in statuses.iter().enumerate() {
            for b in &statuses[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }

    #[test]
    fn timer_period_bounds_are_enforced() {
        let at = |timer_period_ms| {
            CaptureConfig {
                timer_period_ms,
                ..CaptureConfig::default()
            }
            .validate()
        };
        assert_eq!(at(1), Ok(()));
        assert_eq!(at(10_000), Ok(()));
        assert_eq!(at(0), Err(ConfigError::TimerPeriod { value: 0 }));
        assert_eq!(at(10_001), Err(ConfigError::TimerPeriod { value: 10_001 }));
    }

    #[test]
    fn decode_checks_every_field() {
        let config = CaptureConfig {
            sources: SourceSet::EMPTY.with(Source::Timer),
            frames_to_skip: 2,
            frames_to_capture: 16,
            process_filter: 4,
            timer_period_ms: 250,
        };
        let mut bytes = [0_u8; CAPTURE_CONFIG_SIZE];
        config.encode(&mut Writer::new(&mut bytes), 0);
        assert_eq!(CaptureConfig::decode(Reader::new(&bytes), 0), Ok(config));

        let mut bad = bytes;
        bad[0] |= 1;
        assert_eq!(
            CaptureConfig::decode(Reader::new(&bad), 0),
            Err(DecodeError::Config(ConfigError::UnknownSources { bits: 1 }))
        );
        let mut bad = bytes;
        bad[15] = 1;
        assert_eq!(
            CaptureConfig::decode(Reader::new(&bad), 0),
            Err(DecodeError::Config(ConfigError::TimerPeriod {
                value: 0x0100_00FA
            }))
        );
    }
}
