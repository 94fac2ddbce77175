//! The one way into the ring: every source's callback hands its facts to
//! [`record`], which captures the stack through the core if the driver is
//! loaded and not unloading. The recorder knows nothing of the sources or
//! of the rest of the loaded driver, so sources depend on it alone (and no
//! module imports in a circle).
//!
//! The recorder is published once the driver's state is made and taken
//! back at unload behind the rundown gate, which also guards the rest of
//! the state (`loaded`): callbacks and requests enter the gate, unload
//! closes it and waits until it is drained before freeing anything.

use core::{
    ptr,
    sync::atomic::{AtomicPtr, Ordering},
};

use kstack_abi::SourceFacts;
use kstack_driver_core::{CaptureOutcome, DriverCore, ModuleFacts, Rundown};

use crate::{
    kernel::{Clock, KernelPlatform},
    routines::Routines,
};

/// What a capture needs: the core (ring, counters, configuration) and the
/// kernel it runs on.
pub struct Recorder {
    pub core: DriverCore<'static>,
    pub routines: Routines,
    /// The record clock, started at load.
    pub clock: Clock,
}

impl Recorder {
    /// The kernel, as the core's capture and requests use it.
    ///
    /// Max IRQL: any.
    pub fn platform(&self) -> KernelPlatform<'_> {
        KernelPlatform {
            routines: &self.routines,
            clock: &self.clock,
        }
    }
}

/// The published recorder; null before load publishes it and after unload
/// takes it back.
static RECORDER: AtomicPtr<Recorder> = AtomicPtr::new(ptr::null_mut());
/// Callbacks and requests enter this before using the driver's state.
static RUNDOWN: Rundown = Rundown::new();

/// Runs `inside` within the rundown gate, unless unload has begun.
///
/// Max IRQL: `DISPATCH_LEVEL`.
pub fn inside_gate<R>(inside: impl FnOnce() -> R) -> Option<R> {
    let _inside = RUNDOWN.enter()?;
    Some(inside())
}

/// Runs `use_recorder` with the published recorder, unless the driver is
/// not loaded or unload has begun.
///
/// Max IRQL: `DISPATCH_LEVEL`.
pub fn with_recorder<R>(use_recorder: impl FnOnce(&Recorder) -> R) -> Option<R> {
    inside_gate(|| {
        // SAFETY: the pointer is either null or the published recorder,
        // which unload frees only after the gate has drained.
        let recorder = unsafe { RECORDER.load(Ordering::Acquire).as_ref() }?;
        Some(use_recorder(recorder))
    })
    .flatten()
}

/// Captures one event for a source's callback: `facts` runs only when the
/// driver is loaded.
///
/// Max IRQL: `DISPATCH_LEVEL`.
pub fn record(facts: impl FnOnce() -> Option<SourceFacts>) -> Option<CaptureOutcome> {
    with_recorder(|recorder| Some(recorder.core.capture(&recorder.platform(), facts()?))).flatten()
}

/// The thread-stack event of the APC in slot `index`, in its thread: its
/// capture, unless unload has begun (then not even counted).
///
/// Max IRQL: `APC_LEVEL`.
pub fn capture_thread(index: usize) {
    let _ = with_recorder(|recorder| {
        let platform = recorder.platform();
        if let Some(facts) = recorder.core.thread_delivered(&platform, index) {
            recorder.core.capture(&platform, facts);
        }
    });
}

/// An APC of the thread-stack source was run down, counted unless unload
/// has begun.
///
/// Max IRQL: `PASSIVE_LEVEL`.
pub fn thread_run_down() {
    let _ = with_recorder(|recorder| recorder.core.thread_run_down());
}

/// Writes one module record for a load-image or process callback (see
/// `kstack_driver_core::module_records`): `facts` runs only when the driver
/// is loaded, with the routines it may need (the process key's).
///
/// Max IRQL: `PASSIVE_LEVEL` (`facts` may look a process up).
pub fn record_module<'p>(facts: impl FnOnce(&Routines) -> ModuleFacts<'p>) {
    with_recorder(|recorder| {
        let facts = facts(&recorder.routines);
        // A drop is counted by the ring; the callback has nothing to add.
        let _ = recorder.core.record_module(&recorder.platform(), &facts);
    });
}

/// Publishes the recorder; it must stay allocated until [`retire`] has
/// returned.
///
/// Max IRQL: `PASSIVE_LEVEL`.
pub fn publish(recorder: &'static Recorder) {
    RECORDER.store(ptr::from_ref(recorder).cast_mut(), Ordering::Release);
}

/// Closes the gate: no callback or request enters from now on.
///
/// Max IRQL: `PASSIVE_LEVEL`.
pub fn close_gate() {
    RUNDOWN.close();
}

/// Whether no callback or request is inside the gate any more.
///
/// Max IRQL: `PASSIVE_LEVEL`.
pub fn gate_drained() -> bool {
    RUNDOWN.is_drained()
}

/// Takes the recorder back, once the gate is closed and drained.
///
/// Max IRQL: `PASSIVE_LEVEL`.
pub fn retire() {
    RECORDER.store(ptr::null_mut(), Ordering::Release);
}
