//! Who writes the ring's shards, as the driver decided at load
//! ([`crate::StatusResponse::ring_writers`]).

use crate::wire_types::wire_enum;

wire_enum! {
/// Whether each shard is one processor's alone. Wire: a u32.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RingWriters: u32 {
    /// Any producer may meet another inside a shard's publish section: it
    /// takes the shard's writer word with a compare-and-swap (one locked
    /// instruction a record). The driver's choice under Wine (drivers run
    /// as threads of a process, preempted anywhere), where processors
    /// (possible ones included) outnumber the shards, and where the kernel
    /// lacks `KeIpiGenericCall` or `KeQueryMaximumProcessorCountEx`.
    #[default]
    Shared = 0,
    /// Each shard is one processor's, written only at `DISPATCH_LEVEL`:
    /// a publish takes no locked instruction, and each read first makes
    /// every processor's stores visible (`KeIpiGenericCall`) so its order
    /// across reads holds.
    Exclusive = 1,
}
}

impl RingWriters {
    /// The word status text and JSON show.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Shared => "shared",
            Self::Exclusive => "exclusive",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_values_round_trip_and_unknown_ones_are_refused() {
        for writers in [RingWriters::Shared, RingWriters::Exclusive] {
            assert_eq!(RingWriters::from_wire(writers as u32), Some(writers));
        }
        assert_eq!(RingWriters::from_wire(2), None);
    }
}
