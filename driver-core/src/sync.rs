//! Atomics and cells, from `core` normally and from loom under `--cfg loom`
//! so the model checker sees every access.

#[cfg(loom)]
pub use loom::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};

#[cfg(not(loom))]
pub use core::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering, fence};
#[cfg(loom)]
pub use loom::sync::atomic::fence;

#[cfg(not(loom))]
pub use core::cell::UnsafeCell;
#[cfg(loom)]
pub use loom::cell::UnsafeCell;

/// Between a sequentially consistent read-modify-write and a sequentially
/// consistent load of another location, where the other side writes that
/// location, then a `SeqCst` fence, then loads the first (the store-buffer
/// pattern): nothing. In C++20's model one of the two loads sees the other
/// side's write: `S`, the one total order of `SeqCst` operations and
/// fences, puts this side's write before its load, and if both loads
/// missed, the coherence rules would put the other side's fence both after
/// this side's load and before its write in `S`. On x64 the
/// read-modify-write is a locked instruction (a full barrier) and the load
/// a plain one. Loom models `SeqCst` accesses as only acquire/release (its
/// documented limit), so under loom this is the `SeqCst` fence loom does
/// model, and the model checks that form.
#[cfg(not(loom))]
pub fn seq_cst_accesses_ordered() {}

/// Under loom: a `SeqCst` fence (see the non-loom definition).
#[cfg(loom)]
pub fn seq_cst_accesses_ordered() {
    fence(Ordering::SeqCst);
}

/// One turn of a wait for another thread: the processor's spin hint, and a
/// yield under loom so the model lets the other thread run.
#[cfg(not(loom))]
pub fn spin_loop() {
    core::hint::spin_loop();
}

/// One turn of a wait for another thread (loom: a yield).
#[cfg(loom)]
pub fn spin_loop() {
    loom::thread::yield_now();
}

/// How long a host test may wait on another thread before it fails. Miri
/// runs about a thousand times slower, on a clock that ticks with the
/// instructions it interprets.
#[cfg(all(feature = "test-support", not(loom)))]
pub const WAIT_DEADLINE: std::time::Duration =
    std::time::Duration::from_secs(if cfg!(miri) { 600 } else { 10 });

/// Set when a wait passed [`WAIT_DEADLINE`]: from then on every wait in the
/// test process fails at once, so the cases a proptest shrinks through (or
/// the next tests over the same broken code) do not wait out the deadline
/// again each.
#[cfg(all(feature = "test-support", not(loom)))]
static DEADLINE_PASSED: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);

/// A wait on other threads, one [`Wait::turn`] at a time. In the driver a
/// turn is the processor's spin hint (under loom a yield, and loom bounds
/// the model). In host tests (feature `test-support`) a wait longer than
/// [`WAIT_DEADLINE`] panics, saying what it waited for, and so does every
/// wait after it in the process: a broken claim, section or drain then
/// fails the suite in seconds instead of hanging it.
#[derive(Debug)]
pub struct Wait {
    #[cfg(all(feature = "test-support", not(loom)))]
    what: &'static str,
    #[cfg(all(feature = "test-support", not(loom)))]
    /// When the first turn was taken: a wait that never turns (the
    /// uncontended case, every publish) reads no clock.
    started: Option<std::time::Instant>,
}

impl Wait {
    /// Starts a wait for `what`.
    ///
    /// Max IRQL: any.
    #[must_use]
    #[cfg_attr(
        not(all(feature = "test-support", not(loom))),
        expect(unused_variables, reason = "only host tests name their waits")
    )]
    pub fn new(what: &'static str) -> Self {
        Self {
            #[cfg(all(feature = "test-support", not(loom)))]
            what,
            #[cfg(all(feature = "test-support", not(loom)))]
            started: None,
        }
    }

    /// One turn of the wait.
    ///
    /// Max IRQL: any.
    ///
    /// # Panics
    /// In host tests, past [`WAIT_DEADLINE`].
    pub fn turn(&mut self) {
        spin_loop();
        #[cfg(all(feature = "test-support", not(loom)))]
        {
            use core::sync::atomic::Ordering::Relaxed;
            assert!(
                !DEADLINE_PASSED.load(Relaxed),
                "waiting for {}: an earlier wait in this test process passed its deadline",
                self.what
            );
            let started = *self.started.get_or_insert_with(std::time::Instant::now);
            if started.elapsed() >= WAIT_DEADLINE {
                DEADLINE_PASSED.store(true, Relaxed);
                panic!("waited more than {WAIT_DEADLINE:?} for {}", self.what);
            }
        }
    }
}
