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
    /// Sources (bits 0-7), frames to skip (8-15) and to capture (16-23),
    /// the include and exclude list lengths (24-31, 32-39): every field
    /// of a validated configuration fits its bits.
    packed: AtomicU64,
    timer_period_ms: AtomicU32,
    sample_every: [AtomicU32; Source::COUNT],
    /// `user_frames`, one byte per source.
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
        let packed = self.packed.load(Ordering::Relaxed).to_le_bytes();
        EventConfig {
            enabled: SourceSet::from_bits(u32::from(packed[0]))
                .is_some_and(|sources| sources.contains(source)),
            admitted: admitted(
                process_id,
                stored_ids(&self.include, packed[3]),
                stored_ids(&self.exclude, packed[4]),
            ),
            sample_every: u16::try_from(self.sample_every[source.index()].load(Ordering::Relaxed))
                .unwrap_or(1),
            frames_to_skip: u16::from(packed[1]),
            frames_to_capture: u16::from(packed[2]),
            user_frames: self.user_frames.load(Ordering::Relaxed).to_le_bytes()[source.index()],
        }
    }

    /// Reads every field (the caller checks they belong together).
    fn read(&self) -> CaptureConfig {
        let packed = self.packed.load(Ordering::Relaxed).to_le_bytes();
        let list = |ids: &[AtomicU32; MAX_PROCESS_IDS], len: u8| {
            let mut copy = [0; MAX_PROCESS_IDS];
            let len = usize::from(len).min(MAX_PROCESS_IDS);
            for (id, cell) in copy.iter_mut().zip(ids).take(len) {
                *id = cell.load(Ordering::Relaxed);
            }
            (copy, len)
        };
        let (include, include_len) = list(&self.include, packed[3]);
        let (exclude, exclude_len) = list(&self.exclude, packed[4]);
        CaptureConfig {
            sources: SourceSet::from_bits(u32::from(packed[0])).unwrap_or(SourceSet::EMPTY),
            frames_to_skip: u16::from(packed[1]),
            frames_to_capture: u16::from(packed[2]),
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
        let packed = u64::from(config.sources.bits())
            | u64::from(config.frames_to_skip) << 8
            | u64::from(config.frames_to_capture) << 16
            | (include.len() as u64) << 24
            | (exclude.len() as u64) << 32;
        self.packed.store(packed, Ordering::Relaxed);
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
