//! Kernel routines the driver looks up at load and uses only where the
//! host implements them: the kernel may not export one (an older Windows),
//! and Wine 8 exports some only as stubs that end the host process when
//! called. The driver tells Wine by Wine's own `wine_ntoskrnl_main_loop`
//! export and never calls such a stub; status says, per routine, which case
//! holds ([`crate::StatusResponse::user_walk`],
//! [`crate::StatusResponse::process_key`], [`crate::StatusResponse::apc`]).

/// The routine that walks user stacks.
pub const USER_WALK_ROUTINE: &str = "RtlWalkFrameChain";
/// The routine that reads a process's creation time (a module record's
/// `process_key`).
pub const PROCESS_KEY_ROUTINE: &str = "PsGetProcessCreateTimeQuadPart";
/// The routine that queues the special kernel APCs of capture-threads
/// requests ([`crate::Ioctl::CaptureThreads`]); the driver needs it to
/// deliver them at all.
pub const APC_ROUTINE: &str = "KeInsertQueueApc";
/// The routine unload takes queued capture-threads APCs back with
/// ([`crate::StatusResponse::apc_take_back`]).
pub const APC_TAKE_BACK_ROUTINE: &str = "KeRemoveQueueApc";

use crate::wire_types::wire_enum;

wire_enum! {
/// Whether the driver can call a routine, decided once at load. Wire: a
/// u32.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HostRoutine: u32 {
    /// The routine is there and implemented.
    Available = 0,
    /// The kernel does not export the routine.
    #[default]
    NotExported = 1,
    /// The host exports it only as a stub that ends the host when called
    /// (Wine); the driver never calls it.
    HostStub = 2,
}
}

impl HostRoutine {
    /// Why the routine cannot be used (to follow its name: "X is not
    /// exported by the kernel"), or `None` when it can.
    #[must_use]
    pub const fn reason(self) -> Option<&'static str> {
        match self {
            Self::Available => None,
            Self::NotExported => Some("is not exported by the kernel"),
            Self::HostStub => Some("is exported by the host (Wine) only as a stub"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_values_round_trip_and_unknown_ones_are_refused() {
        for routine in [
            HostRoutine::Available,
            HostRoutine::NotExported,
            HostRoutine::HostStub,
        ] {
            assert_eq!(HostRoutine::from_wire(routine as u32), Some(routine));
            assert_eq!(
                routine.reason().is_none(),
                routine == HostRoutine::Available
            );
        }
        assert_eq!(HostRoutine::from_wire(3), None);
    }
}
