//! The capture-threads counters (`kstack_abi::ThreadCaptureStatus`, whose
//! docs give their identities): what became of each thread id of the
//! accepted requests, and of each APC queued.

use kstack_abi::ThreadCaptureStatus;

use crate::sync::{AtomicU64, Ordering};

/// One atomic per field of [`ThreadCaptureStatus`], from load on.
pub(crate) struct ThreadCaptureCounters {
    /// Thread ids named by accepted requests.
    pub(crate) requested: AtomicU64,
    /// APCs queued.
    pub(crate) queued: AtomicU64,
    /// Ids no thread had.
    pub(crate) no_such_thread: AtomicU64,
    /// Ids refused because every slot was in use.
    pub(crate) no_slot: AtomicU64,
    /// Ids whose APC the kernel refused.
    pub(crate) not_queued: AtomicU64,
    /// Ids of system threads.
    pub(crate) refused_system_thread: AtomicU64,
    /// Ids of the requesting thread itself.
    pub(crate) own: AtomicU64,
    /// APCs whose kernel routine ran.
    pub(crate) delivered: AtomicU64,
    /// APCs run down at their thread's exit.
    pub(crate) run_down: AtomicU64,
    /// Delivered APCs that ran after their request's timeout.
    pub(crate) late: AtomicU64,
    /// APCs queued and not yet delivered or run down.
    pub(crate) in_flight: AtomicU64,
    /// The slots the driver keeps.
    pub(crate) slots: AtomicU64,
}

impl ThreadCaptureCounters {
    /// Every counter 0.
    pub(crate) fn new() -> Self {
        Self {
            requested: AtomicU64::new(0),
            queued: AtomicU64::new(0),
            no_such_thread: AtomicU64::new(0),
            no_slot: AtomicU64::new(0),
            not_queued: AtomicU64::new(0),
            refused_system_thread: AtomicU64::new(0),
            own: AtomicU64::new(0),
            delivered: AtomicU64::new(0),
            run_down: AtomicU64::new(0),
            late: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            slots: AtomicU64::new(0),
        }
    }

    /// The counters now, each read on its own.
    ///
    /// Max IRQL: any.
    pub(crate) fn status(&self) -> ThreadCaptureStatus {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        ThreadCaptureStatus {
            requested: load(&self.requested),
            queued: load(&self.queued),
            no_such_thread: load(&self.no_such_thread),
            no_slot: load(&self.no_slot),
            not_queued: load(&self.not_queued),
            refused_system_thread: load(&self.refused_system_thread),
            own: load(&self.own),
            delivered: load(&self.delivered),
            run_down: load(&self.run_down),
            late: load(&self.late),
            in_flight: load(&self.in_flight),
            slots: load(&self.slots),
        }
    }
}
