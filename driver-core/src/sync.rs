//! Atomics and cells, from `core` normally and from loom under `--cfg loom`
//! so the model checker sees every access.

#[cfg(loom)]
pub use loom::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};

#[cfg(not(loom))]
pub use core::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering, fence};
#[cfg(loom)]
pub use loom::sync::atomic::fence;

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

/// An `UnsafeCell` with loom's closure-based access, so the same code runs
/// under the model checker.
#[cfg(not(loom))]
#[derive(Debug)]
pub struct UnsafeCell<T>(core::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    /// Wraps `value`.
    pub const fn new(value: T) -> Self {
        Self(core::cell::UnsafeCell::new(value))
    }

    /// Runs `f` with a shared pointer to the contents.
    pub fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    /// Runs `f` with a mutable pointer to the contents.
    pub fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

#[cfg(loom)]
pub use loom::cell::UnsafeCell;
