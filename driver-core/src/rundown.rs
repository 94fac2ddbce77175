//! Rundown protection for kernel callbacks: callbacks enter before touching
//! driver state and leave when done; unload closes the gate and waits until
//! no callback is inside.
//!
//! kstack keeps its own instead of `ExAcquireRundownProtection` and friends
//! because Wine 8 exports those as stubs that abort the host process; one
//! implementation serves Windows and Wine alike.

use crate::sync::{AtomicU64, Ordering};

/// Set once unload has begun.
const CLOSED: u64 = 1 << 63;

/// The gate. The low 63 bits count callbacks inside.
pub struct Rundown {
    state: AtomicU64,
}

impl Rundown {
    /// An open gate with nobody inside.
    #[cfg(not(loom))]
    #[must_use]
    pub const fn new() -> Self {
        Self {
            state: AtomicU64::new(0),
        }
    }

    /// An open gate with nobody inside.
    #[cfg(loom)]
    #[must_use]
    pub fn new() -> Self {
        Self {
            state: AtomicU64::new(0),
        }
    }

    /// Enters, unless unload has begun.
    ///
    /// Max IRQL: any (one atomic add, never waits).
    #[must_use]
    pub fn enter(&self) -> Option<RundownGuard<'_>> {
        let previous = self.state.fetch_add(1, Ordering::Acquire);
        if previous & CLOSED != 0 {
            self.state.fetch_sub(1, Ordering::Release);
            return None;
        }
        Some(RundownGuard { rundown: self })
    }

    /// Closes the gate: from now on [`Rundown::enter`] fails.
    ///
    /// Max IRQL: any.
    pub fn close(&self) {
        self.state.fetch_or(CLOSED, Ordering::AcqRel);
    }

    /// Whether the gate is closed and nobody is inside: what unload waits
    /// for before freeing what callbacks use.
    ///
    /// Max IRQL: any.
    #[must_use]
    pub fn is_drained(&self) -> bool {
        self.state.load(Ordering::Acquire) == CLOSED
    }
}

#[cfg(not(loom))]
impl Default for Rundown {
    fn default() -> Self {
        Self::new()
    }
}

/// Proof of being inside; leaves when dropped.
pub struct RundownGuard<'a> {
    rundown: &'a Rundown,
}

impl Drop for RundownGuard<'_> {
    fn drop(&mut self) {
        self.rundown.state.fetch_sub(1, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enter_until_closed_then_drain() {
        let rundown = Rundown::new();
        let inside = rundown.enter().unwrap();
        rundown.close();
        assert!(rundown.enter().is_none(), "closed gate admits nobody");
        assert!(!rundown.is_drained(), "one callback still inside");
        drop(inside);
        assert!(rundown.is_drained());
    }

    #[test]
    fn an_open_gate_is_not_drained() {
        let rundown = Rundown::new();
        assert!(!rundown.is_drained());
        drop(rundown.enter());
        assert!(!rundown.is_drained());
    }
}
