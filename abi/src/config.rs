//! The capture configuration: which sources run, for which processes, how
//! many of their events are kept, and how much stack each record keeps.
//! Validated here, once, for both sides.

pub use crate::{
    error::ConfigError,
    limits::{MAX_FRAMES_TO_SKIP, MAX_PROCESS_IDS, TIMER_PERIOD_MS_RANGE},
};
use crate::{
    error::DecodeError,
    limits::MAX_FRAMES,
    source::{Source, SourceSet},
    wire::{Reader, Writer},
};

/// Default `frames_to_skip`: keep every frame, kstack's own included, so
/// frame 0 is always the capture call and nothing is hidden by a guess.
pub const DEFAULT_FRAMES_TO_SKIP: u16 = 0;
/// Default `frames_to_capture`.
pub const DEFAULT_FRAMES_TO_CAPTURE: u16 = 32;
/// Default `user_frames` of the sources that walk the user stack unless
/// told not to (see [`default_user_frames`]): with
/// [`DEFAULT_FRAMES_TO_CAPTURE`] kernel frames, a whole record of
/// [`MAX_FRAMES`].
pub const DEFAULT_USER_FRAMES: u8 = 30;

/// A source's `user_frames` in [`CaptureConfig::default`].
///
/// [`DEFAULT_USER_FRAMES`] for the registry, on-demand and thread-stack
/// sources; 0 (off, opt-in) for the others. The thread-stack source walks
/// in the captured thread's own context at `APC_LEVEL`, where a page fault
/// can be taken: a hard fault there blocks only that thread, which is not
/// inside anyone's callback. 0 for:
/// - process, thread, image-load and object-handle callbacks: Microsoft's
///   rules for `PsSetCreateProcessNotifyRoutineEx`,
///   `PsSetCreateThreadNotifyRoutine`, `PsSetLoadImageNotifyRoutine` and
///   `ObRegisterCallbacks` forbid blocking in them, and a user walk blocks
///   whenever a user page it reads is not resident (a hard fault waits for
///   the disk). A blocked callback also holds up whoever waits for it:
///   removing the notify routine, and so unloading the driver, waits for
///   every callback still running. A user who wants these stacks anyway
///   sets `user_frames` for the source (`kstack config --user-frames
///   image=30`), knowing the callback may wait on paging I/O.
/// - the timer: its DPC runs at `DISPATCH_LEVEL` on whatever thread it
///   interrupted; it must be 0 ([`CaptureConfig::validate`]).
#[must_use]
pub const fn default_user_frames(source: Source) -> u8 {
    match source {
        Source::Registry | Source::OnDemand | Source::ThreadStack => DEFAULT_USER_FRAMES,
        Source::Process
        | Source::Thread
        | Source::ImageLoad
        | Source::ObjectHandle
        | Source::Timer => 0,
    }
}
/// Default timer period: 10 ms, about 100 samples a second per enabled timer.
pub const DEFAULT_TIMER_PERIOD_MS: u32 = 10;

/// Encoded size of a [`CaptureConfig`].
pub const CAPTURE_CONFIG_SIZE: usize = 104;
/// Offset of `sample_every` in an encoded [`CaptureConfig`]: one u16 per
/// source in [`Source::ALL`] order (8 sources fill its 16 bytes).
const SAMPLE_EVERY_OFFSET: usize = 16;
/// Offset of the include list (`MAX_PROCESS_IDS` u32, unused ones 0).
const INCLUDE_OFFSET: usize = 32;
/// Offset of the exclude list (`MAX_PROCESS_IDS` u32, unused ones 0).
const EXCLUDE_OFFSET: usize = INCLUDE_OFFSET + 4 * MAX_PROCESS_IDS;
/// Offset of `user_frames`: one u8 per source in [`Source::ALL`] order
/// (8 sources fill its 8 bytes).
const USER_FRAMES_OFFSET: usize = EXCLUDE_OFFSET + 4 * MAX_PROCESS_IDS;

/// Which processes' events the sources keep, by the process the callback
/// runs in (the record's `process_id`; for process, thread and image events
/// that need not be the process the event's facts name; timer samples on
/// an idle processor run in the idle process, id 0).
///
/// An event is admitted when the include list is empty or holds its
/// process id, and the exclude list does not. Each list holds up to
/// [`MAX_PROCESS_IDS`] ids; an id may not be in both.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessFilter {
    include: [u32; MAX_PROCESS_IDS],
    include_len: u8,
    exclude: [u32; MAX_PROCESS_IDS],
    exclude_len: u8,
}

impl ProcessFilter {
    /// Admits every process.
    pub const ALL: Self = Self {
        include: [0; MAX_PROCESS_IDS],
        include_len: 0,
        exclude: [0; MAX_PROCESS_IDS],
        exclude_len: 0,
    };

    /// A filter keeping `include` (every process when empty) minus
    /// `exclude`. Repeated ids count once.
    ///
    /// # Errors
    /// [`ConfigError::Processes`] when a list has more than
    /// [`MAX_PROCESS_IDS`] distinct ids or an id is in both.
    pub fn new(include: &[u32], exclude: &[u32]) -> Result<Self, ConfigError> {
        let mut filter = Self::ALL;
        for &id in include {
            if !filter.include().contains(&id) {
                filter.include_len = push(&mut filter.include, filter.include_len, id)?;
            }
        }
        for &id in exclude {
            if filter.include().contains(&id) {
                return Err(ConfigError::Processes);
            }
            if !filter.exclude().contains(&id) {
                filter.exclude_len = push(&mut filter.exclude, filter.exclude_len, id)?;
            }
        }
        Ok(filter)
    }

    /// The filter a validated configuration stored as these lists (the
    /// driver reads its configuration back this way on every capture), not
    /// checked again: ids past [`MAX_PROCESS_IDS`] are left out, and an id
    /// in both lists is excluded.
    #[must_use]
    pub fn from_stored(include: &[u32], exclude: &[u32]) -> Self {
        let mut filter = Self::ALL;
        for (list, len, ids) in [
            (&mut filter.include, &mut filter.include_len, include),
            (&mut filter.exclude, &mut filter.exclude_len, exclude),
        ] {
            let ids = &ids[..ids.len().min(MAX_PROCESS_IDS)];
            list[..ids.len()].copy_from_slice(ids);
            // At most MAX_PROCESS_IDS (8).
            *len = u8::try_from(ids.len()).unwrap_or(u8::MAX);
        }
        filter
    }

    /// The ids admitted; empty: every process not excluded.
    #[must_use]
    pub fn include(&self) -> &[u32] {
        &self.include[..usize::from(self.include_len)]
    }

    /// The ids left out.
    #[must_use]
    pub fn exclude(&self) -> &[u32] {
        &self.exclude[..usize::from(self.exclude_len)]
    }

    /// Whether an event of `process_id` is admitted.
    #[must_use]
    pub fn admits(&self, process_id: u32) -> bool {
        admitted(
            process_id,
            self.include().iter().copied(),
            self.exclude().iter().copied(),
        )
    }
}

/// Whether an event of `process_id` passes an `include` list (empty: every
/// process) and an `exclude` list, given as any iterators, so the driver
/// checks the lists it stores without copying them out.
#[must_use]
pub fn admitted(
    process_id: u32,
    include: impl IntoIterator<Item = u32>,
    exclude: impl IntoIterator<Item = u32>,
) -> bool {
    let mut include = include.into_iter().peekable();
    (include.peek().is_none() || include.any(|id| id == process_id))
        && !exclude.into_iter().any(|id| id == process_id)
}

/// Puts `id` after the `len` ids of `list`; returns the new length.
fn push(list: &mut [u32; MAX_PROCESS_IDS], len: u8, id: u32) -> Result<u8, ConfigError> {
    let slot = list
        .get_mut(usize::from(len))
        .ok_or(ConfigError::Processes)?;
    *slot = id;
    Ok(len + 1)
}

/// What the driver captures.
///
/// Wire layout ([`CAPTURE_CONFIG_SIZE`], 104 bytes, little-endian; at
/// offset 8 of a configure request, after its prefix, and at offset 32 of
/// the status response):
///
/// | offset | size | field | status when out of range |
/// |-------:|-----:|-------|--------------------------|
/// | 0   | 4     | `sources` ([`SourceSet`]: bit `n` is the source with wire value `n`) | `STATUS_INVALID_PARAMETER_1` |
/// | 4   | 2     | `frames_to_skip` | `_2` |
/// | 6   | 2     | `frames_to_capture` | `_3` |
/// | 8   | 4     | `timer_period_ms` | `_4` |
/// | 12  | 1     | include list length, 0 to [`MAX_PROCESS_IDS`] | `_5` |
/// | 13  | 1     | exclude list length, 0 to [`MAX_PROCESS_IDS`] | `_5` |
/// | 14  | 2     | reserved | ignored |
/// | 16  | 2 × 8 | `sample_every`, one u16 per source in [`Source::ALL`] order | `_6` |
/// | 32  | 4 × 8 | include list: the first `length` entries are process ids | `_5` (an id in both lists) |
/// | 64  | 4 × 8 | exclude list, as the include list | `_5` |
/// | 96  | 1 × 8 | `user_frames`, one u8 per source in [`Source::ALL`] order | `_7` |
///
/// (Until ABI 11 there were 7 sources: bytes 30 and 31, and byte 103, were
/// reserved.)
///
/// Reserved bytes and list entries past a list's length are written as
/// zeros and never looked at: a configure request with other values there
/// is accepted as if they were zeros (and status reports them as zeros).
/// A process id repeated within one list counts once (status then reports
/// the list without the repeat).
///
/// When several fields are out of range, the request fails with the status
/// of the lowest-numbered one (`STATUS_INVALID_PARAMETER_1` first, `_7`
/// last); within `sample_every` and within `user_frames`, the first source
/// in [`Source::ALL`] order names the error. Before any field, the request
/// must have the right length (`STATUS_INVALID_BUFFER_SIZE`), this ABI
/// version (`STATUS_REVISION_MISMATCH`) and a `size` word equal to its
/// length (`STATUS_INVALID_BUFFER_SIZE`); after every field, see
/// [`crate::Ioctl::Configure`] for what the driver checks against its own
/// state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CaptureConfig {
    /// Sources whose records enter the ring. A disabled source's events are
    /// not looked at (and not counted). Capture-now is a request, not an
    /// event: it always answers its caller with the caller's stack, and
    /// keeps the record in the ring only when [`crate::Source::OnDemand`] is
    /// enabled (otherwise the record is flagged `NOT_IN_RING` and counted
    /// as `not_kept`, whatever `processes` says of the caller).
    pub sources: SourceSet,
    /// `RtlCaptureStackBackTrace`'s FramesToSkip.
    pub frames_to_skip: u16,
    /// `RtlCaptureStackBackTrace`'s FramesToCapture, 1 to [`MAX_FRAMES`].
    pub frames_to_capture: u16,
    /// Which processes' records enter the ring. It applies to every
    /// source, capture-now included: before sampling and before the walk,
    /// but for capture-now, which walks first (see
    /// [`crate::Ioctl::CaptureNow`]).
    /// An event left out is counted as `filtered` for its source; a
    /// capture-now from a process left out still answers its caller,
    /// flagged `NOT_IN_RING`, and is counted as `filtered` only while the
    /// on-demand source is enabled (as `not_kept` while it is disabled).
    pub processes: ProcessFilter,
    /// Per source, in [`Source::ALL`] order: keep one event in this many
    /// (1: every event), after the process filter and before the walk.
    /// Each processor counts its own events of each source and keeps the
    /// first and then every N-th, so over all processors the share kept is
    /// about 1/N. An event not kept is counted as `sampled_out` for its
    /// source. 1 to 65535; the on-demand and thread-stack sources' must be
    /// 1 (their events are requests, always answered).
    pub sample_every: [u16; Source::COUNT],
    /// The timer source's period in milliseconds.
    pub timer_period_ms: u32,
    /// Per source, in [`Source::ALL`] order: the most user-mode frames to
    /// walk after the kernel frames (0: none, the record's user part is
    /// [`crate::UserPart::Off`]). A record holds at most [`MAX_FRAMES`]
    /// frames in all, so the user part gets at most what the kernel part
    /// left. 0 to [`MAX_FRAMES`]; the timer's must be 0 (it runs in a DPC,
    /// at `DISPATCH_LEVEL`, on whatever thread was interrupted).
    pub user_frames: [u8; Source::COUNT],
}

impl Default for CaptureConfig {
    /// Nothing enabled; the default frame counts.
    fn default() -> Self {
        Self {
            sources: SourceSet::EMPTY,
            frames_to_skip: DEFAULT_FRAMES_TO_SKIP,
            frames_to_capture: DEFAULT_FRAMES_TO_CAPTURE,
            processes: ProcessFilter::ALL,
            sample_every: [1; Source::COUNT],
            timer_period_ms: DEFAULT_TIMER_PERIOD_MS,
            user_frames: Source::ALL.map(default_user_frames),
        }
    }
}

impl CaptureConfig {
    /// Checks every field, as the driver does (see the type's docs for
    /// the order; `sources` and the process lists are valid by
    /// construction here).
    ///
    /// # Errors
    /// The lowest-numbered field that is out of range.
    pub const fn validate(&self) -> Result<(), ConfigError> {
        match self.validate_scalars() {
            Ok(()) => self.validate_per_source(),
            Err(error) => Err(error),
        }
    }

    /// Checks fields 2 to 4: the frame counts and the timer period.
    const fn validate_scalars(&self) -> Result<(), ConfigError> {
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

    /// Checks fields 6 and 7: every source's `sample_every`, then every
    /// source's `user_frames`.
    const fn validate_per_source(&self) -> Result<(), ConfigError> {
        let mut index = 0;
        while index < Source::COUNT {
            let (source, value) = (Source::ALL[index], self.sample_every[index]);
            if value == 0 || (value != 1 && source.is_request()) {
                return Err(ConfigError::SampleEvery { source, value });
            }
            index += 1;
        }
        let mut index = 0;
        while index < Source::COUNT {
            let (source, value) = (Source::ALL[index], self.user_frames[index]);
            if value as u16 > MAX_FRAMES || (value != 0 && matches!(source, Source::Timer)) {
                return Err(ConfigError::UserFrames { source, value });
            }
            index += 1;
        }
        Ok(())
    }

    /// One event of `source` in how many is kept.
    #[must_use]
    pub const fn sample_every(&self, source: Source) -> u16 {
        self.sample_every[source.index()]
    }

    /// The most user frames `source` walks.
    #[must_use]
    pub const fn user_frames(&self, source: Source) -> u8 {
        self.user_frames[source.index()]
    }

    pub(crate) fn encode(&self, w: &mut Writer<'_>, at: usize) {
        w.u32(at, self.sources.bits());
        w.u16(at + 4, self.frames_to_skip);
        w.u16(at + 6, self.frames_to_capture);
        w.u32(at + 8, self.timer_period_ms);
        w.u8(at + 12, self.processes.include_len);
        w.u8(at + 13, self.processes.exclude_len);
        w.u16(at + 14, 0);
        for index in 0..8 {
            let value = self.sample_every.get(index).copied().unwrap_or(0);
            w.u16(at + SAMPLE_EVERY_OFFSET + 2 * index, value);
        }
        for index in 0..MAX_PROCESS_IDS {
            w.u32(
                at + INCLUDE_OFFSET + 4 * index,
                self.processes.include[index],
            );
            w.u32(
                at + EXCLUDE_OFFSET + 4 * index,
                self.processes.exclude[index],
            );
        }
        for index in 0..8 {
            let value = self.user_frames.get(index).copied().unwrap_or(0);
            w.u8(at + USER_FRAMES_OFFSET + index, value);
        }
    }

    /// Decodes and validates the configuration at `at`, field by field in
    /// the order of their statuses (see the type's docs). Reserved bytes
    /// and unused list entries are not looked at.
    pub(crate) fn decode(r: Reader<'_>, at: usize) -> Result<Self, DecodeError> {
        let bits = r.u32(at)?;
        let sources = SourceSet::from_bits(bits).ok_or(ConfigError::UnknownSources {
            bits: bits & !SourceSet::ALL.bits(),
        })?;
        let mut sample_every = [0; Source::COUNT];
        for (index, value) in sample_every.iter_mut().enumerate() {
            *value = r.u16(at + SAMPLE_EVERY_OFFSET + 2 * index)?;
        }
        let mut user_frames = [0; Source::COUNT];
        for (index, value) in user_frames.iter_mut().enumerate() {
            *value = r.u8(at + USER_FRAMES_OFFSET + index)?;
        }
        let mut config = Self {
            sources,
            frames_to_skip: r.u16(at + 4)?,
            frames_to_capture: r.u16(at + 6)?,
            processes: ProcessFilter::ALL,
            sample_every,
            timer_period_ms: r.u32(at + 8)?,
            user_frames,
        };
        config.validate_scalars()?;
        let list =
            |offset: usize, len: u8| -> Result<([u32; MAX_PROCESS_IDS], usize), DecodeError> {
                let len = usize::from(len);
                if len > MAX_PROCESS_IDS {
                    return Err(ConfigError::Processes.into());
                }
                let mut ids = [0; MAX_PROCESS_IDS];
                for (index, id) in ids.iter_mut().enumerate().take(len) {
                    *id = r.u32(at + offset + 4 * index)?;
                }
                Ok((ids, len))
            };
        let (include, include_len) = list(INCLUDE_OFFSET, r.u8(at + 12)?)?;
        let (exclude, exclude_len) = list(EXCLUDE_OFFSET, r.u8(at + 13)?)?;
        config.processes = ProcessFilter::new(&include[..include_len], &exclude[..exclude_len])?;
        config.validate_per_source()?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Source;

    #[test]
    fn the_process_filter_admits_the_included_minus_the_excluded() {
        let every = ProcessFilter::ALL;
        assert!(every.admits(0) && every.admits(4) && every.admits(u32::MAX));
        let some = ProcessFilter::new(&[4, 8, 4], &[]).unwrap();
        assert_eq!(some.include(), [4, 8], "repeats count once");
        assert!(some.admits(4) && some.admits(8));
        assert!(!some.admits(0) && !some.admits(5));
        let but_idle = ProcessFilter::new(&[], &[0, 4]).unwrap();
        assert!(!but_idle.admits(0) && !but_idle.admits(4) && but_idle.admits(8));
        assert_eq!(
            ProcessFilter::new(&[4], &[4]),
            Err(ConfigError::Processes),
            "both"
        );
        let full: Vec<u32> = (1..=8).collect();
        assert!(
            ProcessFilter::new(&full, &full.iter().map(|id| id + 8).collect::<Vec<_>>()).is_ok()
        );
        assert_eq!(
            ProcessFilter::from_stored(&[4, 8], &[0]),
            ProcessFilter::new(&[4, 8], &[0]).unwrap(),
            "a stored filter reads back as made"
        );
        let too_many: Vec<u32> = (1..=9).collect();
        assert_eq!(
            ProcessFilter::from_stored(&too_many, &[]).include(),
            &too_many[..8]
        );
        assert_eq!(
            ProcessFilter::new(&too_many, &[]),
            Err(ConfigError::Processes)
        );
        assert_eq!(
            ProcessFilter::new(&[], &too_many),
            Err(ConfigError::Processes)
        );
    }

    #[test]
    fn sampling_is_1_to_65535_and_1_for_the_request_sources() {
        let at = |source: Source, value| {
            let mut config = CaptureConfig::default();
            config.sample_every[source.index()] = value;
            config.validate()
        };
        assert_eq!(at(Source::Timer, 1), Ok(()));
        assert_eq!(at(Source::Registry, u16::MAX), Ok(()));
        assert_eq!(
            at(Source::Timer, 0),
            Err(ConfigError::SampleEvery {
                source: Source::Timer,
                value: 0
            })
        );
        for request in [Source::OnDemand, Source::ThreadStack] {
            assert_eq!(at(request, 1), Ok(()));
            assert_eq!(
                at(request, 2),
                Err(ConfigError::SampleEvery {
                    source: request,
                    value: 2
                })
            );
        }
        assert_eq!(CaptureConfig::default().sample_every(Source::ImageLoad), 1);
    }

    #[test]
    fn user_frames_are_0_to_62_and_0_for_the_timer() {
        let at = |source: Source, value| {
            let mut config = CaptureConfig::default();
            config.user_frames[source.index()] = value;
            config.validate()
        };
        assert_eq!(at(Source::Registry, 0), Ok(()));
        assert_eq!(at(Source::Registry, 62), Ok(()));
        assert_eq!(
            at(Source::Registry, 63),
            Err(ConfigError::UserFrames {
                source: Source::Registry,
                value: 63
            })
        );
        assert_eq!(at(Source::Timer, 0), Ok(()));
        let refused = at(Source::Timer, 1).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "timer walks 1 user frames; it must be 0 to 62 (0 for timer)"
        );
        let defaults = CaptureConfig::default();
        let walking_by_default: Vec<_> = Source::ALL
            .into_iter()
            .filter(|&source| defaults.user_frames(source) == DEFAULT_USER_FRAMES)
            .collect();
        assert_eq!(
            walking_by_default,
            [Source::Registry, Source::OnDemand, Source::ThreadStack]
        );
        assert!(
            Source::ALL
                .into_iter()
                .filter(|source| !walking_by_default.contains(source))
                .all(|source| defaults.user_frames(source) == 0),
            "Ps and Ob callbacks and the timer walk no user frames by default"
        );
        assert_eq!(defaults.validate(), Ok(()));
        assert_eq!(
            DEFAULT_FRAMES_TO_CAPTURE + u16::from(DEFAULT_USER_FRAMES),
            MAX_FRAMES,
            "the defaults fill a record"
        );
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
            (
                ConfigError::Processes,
                "a process list holds more than 8 ids",
            ),
            (
                ConfigError::SampleEvery {
                    source: Source::Timer,
                    value: 0,
                },
                "timer keeps one event in 0; it must be 1 to 65535",
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
            ConfigError::Processes.ntstatus(),
            ConfigError::SampleEvery {
                source: Source::Timer,
                value: 0,
            }
            .ntstatus(),
            ConfigError::UserFrames {
                source: Source::Timer,
                value: 1,
            }
            .ntstatus(),
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

    /// A configuration whose every field holds a value no other field
    /// holds, and its encoding over bytes that were not zero.
    fn distinct_config() -> (CaptureConfig, [u8; CAPTURE_CONFIG_SIZE]) {
        let config = CaptureConfig {
            sources: SourceSet::from_bits(0b1010_0100).unwrap(),
            frames_to_skip: 0x0021,
            frames_to_capture: 0x0022,
            processes: ProcessFilter::new(&[0x0101_0101, 0x0202_0202], &[0x0303_0303]).unwrap(),
            sample_every: [0x0A01, 0x0A02, 0x0A03, 0x0A04, 0x0A05, 0x0A06, 1, 1],
            timer_period_ms: 0x0000_1234,
            user_frames: [0x31, 0x32, 0x33, 0x34, 0x35, 0, 0x37, 0x38],
        };
        let mut bytes = [0xAA_u8; CAPTURE_CONFIG_SIZE];
        config.encode(&mut Writer::new(&mut bytes), 0);
        (config, bytes)
    }

    #[test]
    fn the_documented_layout_table_is_the_encoding() {
        let (config, bytes) = distinct_config();
        assert_eq!(CAPTURE_CONFIG_SIZE, 104);
        // Each row of `CaptureConfig`'s table: offset, then its bytes.
        let rows: [(usize, &[u8]); 11] = [
            (0, &0b1010_0100_u32.to_le_bytes()),
            (4, &[0x21, 0]),
            (6, &[0x22, 0]),
            (8, &[0x34, 0x12, 0, 0]),
            (12, &[2]),
            (13, &[1]),
            (14, &[0, 0]),
            (16, &[1, 10, 2, 10, 3, 10, 4, 10, 5, 10, 6, 10, 1, 0, 1, 0]),
            (
                32,
                &[
                    1, 1, 1, 1, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                    0, 0, 0, 0, 0, 0,
                ],
            ),
            (
                64,
                &[
                    3, 3, 3, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                    0, 0, 0, 0, 0, 0,
                ],
            ),
            (96, &[0x31, 0x32, 0x33, 0x34, 0x35, 0, 0x37, 0x38]),
        ];
        crate::wire::assert_layout(&bytes, rows);
        assert_eq!(CaptureConfig::decode(Reader::new(&bytes), 0), Ok(config));
    }

    #[test]
    fn reserved_bytes_and_unused_list_entries_are_ignored() {
        let (config, bytes) = distinct_config();
        let mut noisy = bytes;
        // The reserved bytes, and the list entries past each list's length.
        for range in [14..16, 40..64, 68..96] {
            noisy[range].fill(0xFF);
        }
        assert_eq!(CaptureConfig::decode(Reader::new(&noisy), 0), Ok(config));
        let mut again = [0xAA_u8; CAPTURE_CONFIG_SIZE];
        config.encode(&mut Writer::new(&mut again), 0);
        assert_eq!(again, bytes, "written back as zeros");
    }

    #[test]
    fn an_id_repeated_in_a_list_counts_once() {
        let (_, mut bytes) = distinct_config();
        // Include list 0x0101_0101, 0x0202_0202, 0x0101_0101.
        bytes[12] = 3;
        bytes[40..44].copy_from_slice(&0x0101_0101_u32.to_le_bytes());
        let config = CaptureConfig::decode(Reader::new(&bytes), 0).unwrap();
        assert_eq!(config.processes.include(), [0x0101_0101, 0x0202_0202]);
        let mut reported = [0_u8; CAPTURE_CONFIG_SIZE];
        config.encode(&mut Writer::new(&mut reported), 0);
        assert_eq!((reported[12], &reported[40..44]), (2, &[0_u8; 4][..]));
    }

    #[test]
    fn of_two_bad_fields_the_lowest_numbered_names_the_error() {
        // Bytes written at an offset, each putting one field out of range.
        type Damage = (usize, &'static [u8]);
        let (_, good) = distinct_config();
        let unknown_source: Damage = (0, &[0b1010_0101]);
        let skip_too_many: Damage = (4, &[65]);
        let capture_none: Damage = (6, &[0]);
        let timer_zero: Damage = (8, &[0, 0]);
        let include_too_long: Damage = (12, &[9]);
        // The excluded id becomes the first included one.
        let both_lists: Damage = (64, &[1, 1, 1, 1]);
        let process_never_sampled: Damage = (16, &[0, 0]);
        let thread_stack_sampled: Damage = (30, &[2]);
        let process_user_too_deep: Damage = (96, &[63]);
        let thread_stack_user_too_deep: Damage = (103, &[63]);
        let decode = |damage: &[Damage]| {
            let mut bytes = good;
            for &(offset, values) in damage {
                bytes[offset..offset + values.len()].copy_from_slice(values);
            }
            match CaptureConfig::decode(Reader::new(&bytes), 0) {
                Err(DecodeError::Config(error)) => error,
                other => panic!("{damage:?}: {other:?}"),
            }
        };
        let cases: [(&[Damage], ConfigError); 9] = [
            (
                &[process_user_too_deep, unknown_source],
                ConfigError::UnknownSources { bits: 1 },
            ),
            (
                &[capture_none, skip_too_many],
                ConfigError::FramesToSkip { value: 65 },
            ),
            (
                &[timer_zero, capture_none],
                ConfigError::FramesToCapture { value: 0 },
            ),
            (
                &[include_too_long, timer_zero],
                ConfigError::TimerPeriod { value: 0 },
            ),
            (
                &[both_lists, skip_too_many],
                ConfigError::FramesToSkip { value: 65 },
            ),
            (&[process_never_sampled, both_lists], ConfigError::Processes),
            (
                // The last source's rate before the first source's frames.
                &[process_user_too_deep, thread_stack_sampled],
                ConfigError::SampleEvery {
                    source: Source::ThreadStack,
                    value: 2,
                },
            ),
            (
                &[thread_stack_sampled, process_never_sampled],
                ConfigError::SampleEvery {
                    source: Source::Process,
                    value: 0,
                },
            ),
            (
                &[thread_stack_user_too_deep, process_user_too_deep],
                ConfigError::UserFrames {
                    source: Source::Process,
                    value: 63,
                },
            ),
        ];
        for (damage, expected) in cases {
            assert_eq!(decode(damage), expected, "{damage:?}");
        }
    }

    #[test]
    fn decode_checks_every_field() {
        let mut sample_every = [1; Source::COUNT];
        sample_every[Source::Registry.index()] = 100;
        let config = CaptureConfig {
            sources: SourceSet::EMPTY.with(Source::Timer),
            frames_to_skip: 2,
            frames_to_capture: 16,
            processes: ProcessFilter::new(&[4, 0x1234_5678], &[0]).unwrap(),
            sample_every,
            timer_period_ms: 250,
            user_frames: [0, 1, 2, 3, 62, 0, 9, 10],
        };
        let mut bytes = [0xAA_u8; CAPTURE_CONFIG_SIZE];
        config.encode(&mut Writer::new(&mut bytes), 0);
        assert_eq!(CaptureConfig::decode(Reader::new(&bytes), 0), Ok(config));
        // The documented offsets.
        assert_eq!(&bytes[8..12], &250_u32.to_le_bytes());
        assert_eq!(&bytes[12..16], &[2, 1, 0, 0]);
        assert_eq!(
            &bytes[16 + 2 * Source::Registry.index()..][..2],
            &100_u16.to_le_bytes()
        );
        assert_eq!(
            &bytes[30..32],
            &1_u16.to_le_bytes(),
            "the last source's rate"
        );
        assert_eq!(&bytes[32..40], &[4, 0, 0, 0, 0x78, 0x56, 0x34, 0x12]);
        assert!(
            bytes[40..64].iter().all(|&byte| byte == 0),
            "unused entries"
        );
        assert_eq!(&bytes[64..68], &0_u32.to_le_bytes());

        let mut bad = bytes;
        bad[12] = 9;
        assert_eq!(
            CaptureConfig::decode(Reader::new(&bad), 0),
            Err(DecodeError::Config(ConfigError::Processes))
        );
        let mut bad = bytes;
        bad[13] = 1;
        bad[64] = 4;
        assert_eq!(
            CaptureConfig::decode(Reader::new(&bad), 0),
            Err(DecodeError::Config(ConfigError::Processes)),
            "4 both included and excluded"
        );
        let mut bad = bytes;
        bad[16..18].fill(0);
        assert_eq!(
            CaptureConfig::decode(Reader::new(&bad), 0),
            Err(DecodeError::Config(ConfigError::SampleEvery {
                source: Source::ALL[0],
                value: 0
            }))
        );

        let mut bad = bytes;
        bad[0] |= 1;
        assert_eq!(
            CaptureConfig::decode(Reader::new(&bad), 0),
            Err(DecodeError::Config(ConfigError::UnknownSources { bits: 1 }))
        );
        let mut bad = bytes;
        bad[11] = 1;
        assert_eq!(
            CaptureConfig::decode(Reader::new(&bad), 0),
            Err(DecodeError::Config(ConfigError::TimerPeriod {
                value: 0x0100_00FA
            }))
        );
    }
}
