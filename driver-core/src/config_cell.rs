//! The capture configuration in force, as callbacks read it and configure
//! requests write it: a sequence lock over atomics ([`ConfigCell`]), and
//! the few words one event needs of it ([`EventConfig`]).

use kstack_abi::{
    CaptureConfig, MAX_PROCESS_IDS, ProcessFilter, Source, SourceSet, config::admitted,
};

use crate::sync::{AtomicU32, AtomicU64, Ordering, Wait, fence};

/// The capture configuration, read by callbacks at up to `DISPATCH_LEVEL`
/// and written by configure requests, as a sequence lock: a writer makes
/// `version` odd, writes the fields, and makes it even again; a reader
/// copies the fields between two equal even readings of `version`, so it
/// never acts on a mix of two configurations. Every field is an atomic, so
/// a reader racing a writer reads stale values, never torn memory, and
/// throws them away. The writer runs at `DISPATCH_LEVEL` (configure
/// requests are one at a time), so on Windows a reader waits at most for
/// one copy of these few words by a running processor.
pub(crate) struct ConfigCell {
    version: AtomicU64,
    /// Sources (bits 0-15), frames to skip (16-23) and to capture (24-31),
    /// the include and exclude list lengths (32-39, 40-47): every field
    /// of a validated configuration fits its bits (see [`Packed`]).
    packed: AtomicU64,
    timer_period_ms: AtomicU32,
    sample_every: [AtomicU32; Source::COUNT],
    /// `user_frames`, one byte per source (8 sources: every byte).
    user_frames: AtomicU64,
    include: [AtomicU32; MAX_PROCESS_IDS],
    exclude: [AtomicU32; MAX_PROCESS_IDS],
}

impl ConfigCell {
    pub(crate) fn new(config: &CaptureConfig) -> Self {
        let cell = Self {
            version: AtomicU64::new(0),
            packed: AtomicU64::new(0),
            timer_period_ms: AtomicU32::new(0),
            sample_every: core::array::from_fn(|_| AtomicU32::new(1)),
            user_frames: AtomicU64::new(0),
            include: core::array::from_fn(|_| AtomicU32::new(0)),
            exclude: core::array::from_fn(|_| AtomicU32::new(0)),
        };
        cell.write(config);
        cell
    }

    /// The configuration in force.
    ///
    /// Max IRQL: `DISPATCH_LEVEL`.
    pub(crate) fn load(&self) -> CaptureConfig {
        self.consistent(|| self.read())
    }

    /// What one event of `source` in `process_id` needs of the
    /// configuration in force: a few words, the process lists checked in
    /// place.
    ///
    /// Max IRQL: `DISPATCH_LEVEL`.
    pub(crate) fn for_event(&self, source: Source, process_id: u32) -> EventConfig {
        self.consistent(|| self.read_for_event(source, process_id))
    }

    /// `read`'s result from fields that belong together: read again while
    /// a writer is (or was, meanwhile) at work.
    fn consistent<R>(&self, read: impl Fn() -> R) -> R {
        let mut wait = Wait::new("a configure to finish writing the configuration");
        loop {
            // Acquire: the fields read below are no older than this version.
            let version = self.version.load(Ordering::Acquire);
            if version.is_multiple_of(2) {
                let value = read();
                // Acquire: the field loads above complete before the check.
                fence(Ordering::Acquire);
                if self.version.load(Ordering::Relaxed) == version {
                    return value;
                }
            }
            wait.turn();
        }
    }

    /// Reads what one event needs (the caller checks it belongs together).
    fn read_for_event(&self, source: Source, process_id: u32) -> EventConfig {
        let packed = Packed::from_word(self.packed.load(Ordering::Relaxed));
        EventConfig {
            enabled: packed.sources.contains(source),
            admitted: admitted(
                process_id,
                stored_ids(&self.include, packed.include_len),
                stored_ids(&self.exclude, packed.exclude_len),
            ),
            sample_every: u16::try_from(self.sample_every[source.index()].load(Ordering::Relaxed))
                .unwrap_or(1),
            frames_to_skip: packed.frames_to_skip,
            frames_to_capture: packed.frames_to_capture,
            user_frames: self.user_frames.load(Ordering::Relaxed).to_le_bytes()[source.index()],
        }
    }

    /// Reads every field (the caller checks they belong together).
    fn read(&self) -> CaptureConfig {
        let packed = Packed::from_word(self.packed.load(Ordering::Relaxed));
        let list = |ids: &[AtomicU32; MAX_PROCESS_IDS], len: u8| {
            let mut copy = [0; MAX_PROCESS_IDS];
            let len = usize::from(len).min(MAX_PROCESS_IDS);
            for (id, cell) in copy.iter_mut().zip(ids).take(len) {
                *id = cell.load(Ordering::Relaxed);
            }
            (copy, len)
        };
        let (include, include_len) = list(&self.include, packed.include_len);
        let (exclude, exclude_len) = list(&self.exclude, packed.exclude_len);
        CaptureConfig {
            sources: packed.sources,
            frames_to_skip: packed.frames_to_skip,
            frames_to_capture: packed.frames_to_capture,
            // Not validated again: `write` stored a valid filter, and a
            // torn read is thrown away by `load`.
            processes: ProcessFilter::from_stored(&include[..include_len], &exclude[..exclude_len]),
            sample_every: core::array::from_fn(|index| {
                u16::try_from(self.sample_every[index].load(Ordering::Relaxed)).unwrap_or(1)
            }),
            timer_period_ms: self.timer_period_ms.load(Ordering::Relaxed),
            user_frames: {
                let bytes = self.user_frames.load(Ordering::Relaxed).to_le_bytes();
                core::array::from_fn(|index| bytes[index])
            },
        }
    }

    /// Replaces the configuration. One writer at a time (the caller's
    /// `configuring` lock), at `DISPATCH_LEVEL`.
    pub(crate) fn write(&self, config: &CaptureConfig) {
        let version = self.version.load(Ordering::Relaxed);
        self.version.store(version + 1, Ordering::Relaxed);
        // Release: a reader that sees any field below also sees the odd
        // version (and retries).
        fence(Ordering::Release);
        let include = config.processes.include();
        let exclude = config.processes.exclude();
        let packed = Packed {
            sources: config.sources,
            frames_to_skip: config.frames_to_skip,
            frames_to_capture: config.frames_to_capture,
            // At most MAX_PROCESS_IDS (8) each.
            include_len: u8::try_from(include.len()).unwrap_or(u8::MAX),
            exclude_len: u8::try_from(exclude.len()).unwrap_or(u8::MAX),
        };
        self.packed.store(packed.to_word(), Ordering::Relaxed);
        self.timer_period_ms
            .store(config.timer_period_ms, Ordering::Relaxed);
        for (cell, &every) in self.sample_every.iter().zip(&config.sample_every) {
            cell.store(u32::from(every), Ordering::Relaxed);
        }
        let mut user_frames = [0; 8];
        user_frames[..Source::COUNT].copy_from_slice(&config.user_frames);
        self.user_frames
            .store(u64::from_le_bytes(user_frames), Ordering::Relaxed);
        for (cells, ids) in [(&self.include, include), (&self.exclude, exclude)] {
            for (cell, &id) in cells.iter().zip(ids) {
                cell.store(id, Ordering::Relaxed);
            }
        }
        // Release: the fields are written before the version is even again.
        self.version.store(version + 2, Ordering::Release);
    }
}

// Every source's bit fits the two bytes `Packed` gives the sources.
const _: () = assert!(SourceSet::ALL.bits() <= 0xFFFF);

/// The configuration's small fields, as one word of [`ConfigCell`].
struct Packed {
    sources: SourceSet,
    frames_to_skip: u16,
    frames_to_capture: u16,
    include_len: u8,
    exclude_len: u8,
}

impl Packed {
    /// The word: sources in bytes 0 and 1, frames to skip and to capture
    /// in bytes 2 and 3 (a validated configuration's are at most 64), the
    /// list lengths in bytes 4 and 5.
    fn to_word(&self) -> u64 {
        let [sources_low, sources_high, ..] = self.sources.bits().to_le_bytes();
        let narrow = |value: u16| u8::try_from(value).unwrap_or(u8::MAX);
        u64::from_le_bytes([
            sources_low,
            sources_high,
            narrow(self.frames_to_skip),
            narrow(self.frames_to_capture),
            self.include_len,
            self.exclude_len,
            0,
            0,
        ])
    }

    /// The fields of a word [`Packed::to_word`] made (source bits it never
    /// writes would read as no source).
    fn from_word(word: u64) -> Self {
        let bytes = word.to_le_bytes();
        Self {
            sources: SourceSet::from_bits(u32::from(u16::from_le_bytes([bytes[0], bytes[1]])))
                .unwrap_or(SourceSet::EMPTY),
            frames_to_skip: u16::from(bytes[2]),
            frames_to_capture: u16::from(bytes[3]),
            include_len: bytes[4],
            exclude_len: bytes[5],
        }
    }
}

/// The first `len` process ids of a stored list, as they are loaded.
fn stored_ids(cells: &[AtomicU32; MAX_PROCESS_IDS], len: u8) -> impl Iterator<Item = u32> + '_ {
    cells
        .iter()
        .take(usize::from(len))
        .map(|cell| cell.load(Ordering::Relaxed))
}

/// What one event needs of the configuration in force
/// ([`DriverCore::event_config`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct EventConfig {
    /// Its source is enabled.
    pub(crate) enabled: bool,
    /// The process lists admit its process.
    pub(crate) admitted: bool,
    /// Its source's 1-in-N rate.
    pub(crate) sample_every: u16,
    pub(crate) frames_to_skip: u16,
    pub(crate) frames_to_capture: u16,
    /// Its source's most user frames.
    pub(crate) user_frames: u8,
}
