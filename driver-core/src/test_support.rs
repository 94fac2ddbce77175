//! Host-test helpers (feature `test-support`, which only the crate's own
//! tests turn on; never in the driver).

use std::sync::{Mutex, PoisonError};

use kstack_abi::StackTableStatus;

use crate::stack_table::{StackEntry, StackTable, TableCounters, Tabled};

/// Everything [`keep`] was given, reachable from here until the test run
/// ends: a deliberate leak, which Miri's leak check does not count because
/// the memory is still reachable from a static.
static KEPT: Mutex<Vec<&'static dyn Sync>> = Mutex::new(Vec::new());

/// Keeps `value` for the rest of the run and lends it out for as long: what
/// test threads share (a ring, its slots, a flag) then outlives them all,
/// as the driver's rings outlive every callback.
///
/// # Panics
/// Never: a poisoned list (a test panicked while pushing) is used as is.
pub fn keep<T: Sync + 'static>(value: T) -> &'static T {
    let kept: &'static T = Box::leak(Box::new(value));
    KEPT.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(kept);
    kept
}

/// A stack table of kept entries and one shard's lookup counters: the
/// tests' table, used as a [`StackTable`] through `Deref`.
pub struct TestTable {
    table: StackTable<'static>,
    counters: TableCounters,
}

impl TestTable {
    /// The OS hash every stack here is entered with.
    pub const OS_HASH: u32 = 7;

    /// A table of `entries` entries (a power of two), kept for the run.
    #[must_use]
    pub fn new(entries: usize) -> &'static Self {
        let entries: &'static [StackEntry] =
            keep((0..entries).map(|_| StackEntry::new()).collect::<Vec<_>>());
        keep(Self {
            table: StackTable::new(entries),
            counters: TableCounters::default(),
        })
    }

    /// Enters `frames` under `id`, counted in this table's counters.
    pub fn enter(&self, frames: &[u64], id: u64) -> Tabled {
        self.table.enter(frames, id, Self::OS_HASH, &self.counters)
    }

    /// The status, with this table's counters.
    #[must_use]
    pub fn status(&self) -> StackTableStatus {
        self.table.status(core::iter::once(&self.counters))
    }
}

impl core::ops::Deref for TestTable {
    type Target = StackTable<'static>;

    fn deref(&self) -> &Self::Target {
        &self.table
    }
}
