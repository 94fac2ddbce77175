//! Host-test helpers (feature `test-support`, which only the crate's own
//! tests turn on; never in the driver).

use std::sync::{Mutex, PoisonError};

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
