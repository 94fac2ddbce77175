//! Where a stack comes from: the capture sources and sets of them. What
//! each source records about its event is `source_facts`.

use crate::wire_types::wire_enum;

wire_enum! {
/// A kernel callback (or request) that captures stacks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Source: u8 {
    /// Process create/exit (`PsSetCreateProcessNotifyRoutineEx`).
    Process = 1,
    /// Thread create/exit (`PsSetCreateThreadNotifyRoutine`).
    Thread = 2,
    /// Image load (`PsSetLoadImageNotifyRoutine`).
    ImageLoad = 3,
    /// Registry operations (`CmRegisterCallbackEx`).
    Registry = 4,
    /// Handle operations on processes and threads (`ObRegisterCallbacks`).
    ObjectHandle = 5,
    /// Periodic sampling from a timer DPC (`KeSetTimerEx`), at DISPATCH_LEVEL.
    Timer = 6,
    /// The capture-now request: the stack of the calling request.
    OnDemand = 7,
    /// A thread's stack on request ([`crate::Ioctl::CaptureThreads`]):
    /// captured in the thread by a special kernel APC, at `APC_LEVEL`.
    ThreadStack = 8,
}
}

// `Source::ALL` is every source in wire order; per-source arrays have
// `Source::COUNT` entries, indexed by `Source::index`.
impl Source {
    /// Position in per-source arrays (0-based).
    #[must_use]
    pub const fn index(self) -> usize {
        self as usize - 1
    }

    /// The name used on the command line and in JSON output.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Process => "process",
            Self::Thread => "thread",
            Self::ImageLoad => "image",
            Self::Registry => "registry",
            Self::ObjectHandle => "object",
            Self::Timer => "timer",
            Self::OnDemand => "ondemand",
            Self::ThreadStack => "threadstack",
        }
    }

    /// The source called `name` (see [`Source::name`]).
    #[must_use]
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|source| source.name() == name)
    }

    /// Whether the source's events are requests, each answered, so never
    /// sampled (its `sample_every` must be 1): capture-now and
    /// capture-threads.
    #[must_use]
    pub const fn is_request(self) -> bool {
        matches!(self, Self::OnDemand | Self::ThreadStack)
    }

    /// Whether the source's callback runs at DISPATCH_LEVEL, where a stack
    /// walk is only safe when executive code cannot be paged out.
    #[must_use]
    pub const fn runs_at_dispatch_level(self) -> bool {
        matches!(self, Self::Timer)
    }
}

/// A set of sources, as a bit mask (bit `n` is the source with wire value `n`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SourceSet(u32);

impl SourceSet {
    /// No source.
    pub const EMPTY: Self = Self(0);
    /// Every source.
    pub const ALL: Self = {
        let mut bits = 0;
        let mut i = 0;
        while i < Source::COUNT {
            bits |= 1 << Source::ALL[i] as u32;
            i += 1;
        }
        Self(bits)
    };

    /// The set with these bits, if every bit names a source.
    #[must_use]
    pub const fn from_bits(bits: u32) -> Option<Self> {
        if bits & !Self::ALL.0 == 0 {
            Some(Self(bits))
        } else {
            None
        }
    }

    /// The wire bit mask.
    #[must_use]
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// Whether `source` is in the set.
    #[must_use]
    pub const fn contains(self, source: Source) -> bool {
        self.0 & (1 << source as u32) != 0
    }

    /// The set with `source` added.
    #[must_use]
    pub const fn with(self, source: Source) -> Self {
        Self(self.0 | 1 << source as u32)
    }

    /// The set with `source` removed.
    #[must_use]
    pub const fn without(self, source: Source) -> Self {
        Self(self.0 & !(1 << source as u32))
    }

    /// The sources in the set, in wire order.
    pub fn iter(self) -> impl Iterator<Item = Source> {
        Source::ALL
            .into_iter()
            .filter(move |source| self.contains(*source))
    }
}

impl FromIterator<Source> for SourceSet {
    fn from_iter<I: IntoIterator<Item = Source>>(sources: I) -> Self {
        sources.into_iter().fold(Self::EMPTY, Self::with)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adding_a_source_twice_keeps_it() {
        let set = SourceSet::EMPTY.with(Source::Timer).with(Source::Timer);
        assert!(set.contains(Source::Timer));
        assert_eq!(set, SourceSet::EMPTY.with(Source::Timer));
    }

    #[test]
    fn wire_values_index_and_names_round_trip() {
        for (position, source) in Source::ALL.into_iter().enumerate() {
            assert_eq!(source.index(), position);
            assert_eq!(Source::from_wire(source as u8), Some(source));
            assert_eq!(Source::from_name(source.name()), Some(source));
        }
        assert_eq!(Source::from_wire(0), None);
        assert_eq!(Source::from_wire(9), None);
        assert_eq!(Source::from_name("Process"), None, "names are exact");
    }

    #[test]
    fn only_the_timer_runs_at_dispatch_level() {
        let elevated: SourceSet = Source::ALL
            .into_iter()
            .filter(|s| s.runs_at_dispatch_level())
            .collect();
        assert_eq!(elevated, SourceSet::EMPTY.with(Source::Timer));
    }

    #[test]
    fn only_capture_now_and_capture_threads_are_requests() {
        let requests: SourceSet = Source::ALL.into_iter().filter(|s| s.is_request()).collect();
        assert_eq!(
            requests,
            SourceSet::EMPTY
                .with(Source::OnDemand)
                .with(Source::ThreadStack)
        );
    }

    #[test]
    fn source_set_rejects_unknown_bits() {
        assert_eq!(SourceSet::ALL.bits(), 0b1_1111_1110);
        assert_eq!(SourceSet::from_bits(0b1_1111_1110), Some(SourceSet::ALL));
        assert_eq!(SourceSet::from_bits(1), None, "bit 0 is no source");
        assert_eq!(SourceSet::from_bits(1 << 9), None);
        let set = SourceSet::EMPTY
            .with(Source::Timer)
            .with(Source::Process)
            .without(Source::Process);
        assert_eq!(set.iter().collect::<Vec<_>>(), [Source::Timer]);
    }
}
