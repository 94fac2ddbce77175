//! The user-mode part of a record's stack: the frames of the thread that
//! caused the event, below its system call, walked after the kernel part
//! (`RtlWalkFrameChain` with `RTL_WALK_USER_MODE_STACK`).
//!
//! Every record says what happened to its user part ([`UserPart`]); the
//! status counts each outcome per source ([`crate::SourceStatus::user_parts`])
//! and says whether the driver can walk user stacks at all
//! ([`crate::StatusResponse::user_walk`]).

use crate::wire_types::wire_enum;

wire_enum! {
/// What happened to a record's user part. Its frames, if any, are the last
/// `user_frame_count` of the record's stack (see [`crate::RecordHeader`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum UserPart: u8 {
    /// Not asked for: the source's `user_frames` setting is 0 (see
    /// [`crate::CaptureConfig::user_frames`]). Every record of a driver
    /// before ABI 8 reads as this.
    #[default]
    Off = 0,
    /// Walked to its end: every user frame is in the record.
    Captured = 1,
    /// The walk filled the room it had (the source's `user_frames`, or what
    /// the kernel part left of [`crate::MAX_FRAMES`]): the stack may go on.
    Truncated = 2,
    /// The walk raised an exception (user memory unmapped or protected
    /// under it); the driver's exception scope caught it and the record
    /// keeps no user frames.
    Faulted = 3,
    /// Not walked: this thread was already walking its user stack (a
    /// callback reached while paging the stack in).
    Reentered = 4,
    /// Not walked: the callback ran at `DISPATCH_LEVEL` or above, where the
    /// user stack cannot be paged in. (The timer's records say `Off`: its
    /// `user_frames` is always 0.)
    Irql = 5,
    /// Not walked: a system thread has no user stack.
    SystemThread = 6,
    /// Not walked: the thread was attached to another process's address
    /// space, so its own user stack is not mapped.
    Attached = 7,
    /// Not walked: the driver cannot walk user stacks here (see
    /// [`crate::StatusResponse::user_walk`]).
    Unavailable = 8,
    /// Not walked: more threads were walking at once than the driver's
    /// re-entry guard tracks.
    GuardFull = 9,
    /// Not walked: the kernel could not give the walk a stack of its own
    /// (`KeExpandKernelStackAndCalloutEx` failed, which it does, without
    /// waiting, when no stack segment is free). The user walk never runs on
    /// the callback's stack: a page fault or an exception dispatched under
    /// it can take more than a callback has left (ABI 11).
    NoStack = 10,
    /// Not walked (thread-stack records only): the APC interrupted the
    /// thread inside a critical or guarded region (`KeAreApcsDisabled`).
    /// Special kernel APCs are delivered inside critical regions, where the
    /// thread may hold a lock (an executive resource, a pushlock) that
    /// paging its user stack in would need: a self-deadlock (ABI 14).
    CriticalRegion = 11,
}
}

impl UserPart {
    /// Its position in [`UserPart::ALL`] and in the status counters.
    #[must_use]
    pub const fn index(self) -> usize {
        self as usize
    }

    /// Its name in the client's output.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Captured => "captured",
            Self::Truncated => "truncated",
            Self::Faulted => "faulted",
            Self::Reentered => "reentered",
            Self::Irql => "irql",
            Self::SystemThread => "system_thread",
            Self::Attached => "attached",
            Self::Unavailable => "unavailable",
            Self::GuardFull => "guard_full",
            Self::NoStack => "no_stack",
            Self::CriticalRegion => "critical_region",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_values_round_trip_and_unknown_ones_are_refused() {
        for (index, part) in UserPart::ALL.into_iter().enumerate() {
            assert_eq!(part.index(), index);
            assert_eq!(UserPart::from_wire(part as u8), Some(part));
        }
        assert_eq!(UserPart::from_wire(12), None);
        let names: std::collections::BTreeSet<_> =
            UserPart::ALL.into_iter().map(UserPart::name).collect();
        assert_eq!(names.len(), UserPart::COUNT);
    }
}
