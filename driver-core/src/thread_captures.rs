//! Thread captures: the bookkeeping of the special kernel APCs a
//! `CaptureThreads` request queues, one slot per APC that may still run.
//!
//! # Design
//!
//! A request names threads. For each, the driver claims a free slot, writes
//! the request's facts into it (tag, when, timeout), and queues a special
//! kernel APC to the thread, whose `KAPC` lies in the slot's part of the
//! driver's block (a special APC has no context: the routine finds the slot
//! from the `KAPC`'s address). The kernel later runs exactly one of the
//! APC's two routines: the kernel routine, in the thread at `APC_LEVEL` (the
//! capture: delivered; Windows also delivers in an exiting thread's exit
//! path), or the rundown routine (run down: a defence, no known kernel runs
//! kernel APCs down); or unload takes the APC back and runs neither. Each
//! reads the slot's facts and frees it. There is no lock and no wait: a
//! claim is one compare-and-swap, a release one store.
//!
//! # Invariants
//!
//! - A slot is `FREE`, `CLAIMED` (one request owns it and writes its facts)
//!   or `QUEUED` (its APC is in the kernel's queue, or about to be). Only a
//!   compare-and-swap from `FREE` claims it, so no two requests own one slot.
//! - A request marks its slot `QUEUED` (Release, after writing the facts)
//!   *before* it hands the APC to the kernel: once `KeInsertQueueApc` returns
//!   TRUE the APC may already have run on another processor, and its routine
//!   must find the slot armed. If the kernel refuses the APC (the thread is
//!   exiting), no routine will run and the request frees the slot itself.
//! - A routine reads the facts after its Acquire of `QUEUED` and frees the
//!   slot (Release) last, so it reads this request's facts, never a later
//!   one's, and the next claim sees the slot only after the routine is done
//!   with it.
//! - While the driver is loaded every queued APC ends as exactly one of
//!   delivered and run down (unload takes APCs back only once no status
//!   can be read), so once no request is being served and no routine runs,
//!   `queued = delivered + run_down + in_flight`, where `in_flight` is the
//!   number of slots not free.
//!
//! The kernel's own objects (the KAPC each slot pairs with, the references
//! on the thread and on kstack's device that keep the APC's routines
//! mapped) are the driver's; this module knows slots by index only.

use kstack_abi::ThreadCaptureStatus;

use crate::sync::{AtomicU32, AtomicU64, Ordering};

const FREE: u32 = 0;
const CLAIMED: u32 = 1;
const QUEUED: u32 = 2;

/// One APC's bookkeeping.
pub struct Slot {
    state: AtomicU32,
    tag: AtomicU64,
    requested_at: AtomicU64,
    timeout: AtomicU64,
}

impl Slot {
    /// A free slot.
    #[cfg(not(loom))]
    #[must_use]
    pub const fn new() -> Self {
        Self {
            state: AtomicU32::new(FREE),
            tag: AtomicU64::new(0),
            requested_at: AtomicU64::new(0),
            timeout: AtomicU64::new(0),
        }
    }

    /// A free slot.
    #[cfg(loom)]
    #[must_use]
    pub fn new() -> Self {
        Self {
            state: AtomicU32::new(FREE),
            tag: AtomicU64::new(0),
            requested_at: AtomicU64::new(0),
            timeout: AtomicU64::new(0),
        }
    }
}

impl Slot {
    /// Frees the slot: the routine's last touch of it (see
    /// [`ThreadCaptures::release`]).
    ///
    /// Max IRQL: any.
    pub fn release(&self) {
        self.state.store(FREE, Ordering::Release);
    }
}

impl Default for Slot {
    fn default() -> Self {
        Self::new()
    }
}

/// Who frees the slots' memory when unload cannot wait for every APC: the
/// count of APCs that may still run a routine, and whether unload has
/// given up waiting. Unload waits (bounded) for the count to reach 0; if a
/// thread never lets its APC run, unload abandons the memory instead of
/// freeing it, and the last routine to finish frees it. Exactly one of
/// them frees: unload when nothing was pending as it abandoned, else the
/// routine that took the count from 1 to 0 after. All-zero bytes are its
/// initial state (nothing pending, not abandoned).
pub struct Retirement {
    state: AtomicU64,
}

/// Set in [`Retirement`]'s state once unload has given up waiting.
const ABANDONED: u64 = 1 << 63;

impl Retirement {
    /// Nothing pending, not abandoned.
    #[cfg(not(loom))]
    #[must_use]
    pub const fn new() -> Self {
        Self {
            state: AtomicU64::new(0),
        }
    }

    /// Nothing pending, not abandoned.
    #[cfg(loom)]
    #[must_use]
    pub fn new() -> Self {
        Self {
            state: AtomicU64::new(0),
        }
    }

    /// An APC is about to be queued: one more that may run a routine.
    ///
    /// Max IRQL: any.
    pub fn queued(&self) {
        self.state.fetch_add(1, Ordering::AcqRel);
    }

    /// An APC is done (its routine finished, or the kernel refused it):
    /// whether the caller must now free the memory (it was the last, and
    /// unload abandoned it).
    ///
    /// Max IRQL: any.
    #[must_use]
    pub fn done(&self) -> bool {
        self.state.fetch_sub(1, Ordering::AcqRel) == ABANDONED | 1
    }

    /// How many APCs may still run a routine.
    ///
    /// Max IRQL: any.
    #[must_use]
    pub fn pending(&self) -> u64 {
        self.state.load(Ordering::Acquire) & !ABANDONED
    }

    /// Unload gives up waiting: whether it must free the memory now
    /// (nothing was pending); otherwise the last routine will.
    ///
    /// Max IRQL: any.
    #[must_use]
    pub fn abandon(&self) -> bool {
        self.state.fetch_or(ABANDONED, Ordering::AcqRel) & !ABANDONED == 0
    }
}

impl Default for Retirement {
    fn default() -> Self {
        Self::new()
    }
}

/// What a request wrote into its slot, as the APC's routine reads it back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Requested {
    /// The request's tag, as given.
    pub tag: u64,
    /// When the request queued the APC (the record clock, 100 ns units).
    pub at: u64,
    /// The request's timeout, in 100 ns units.
    pub timeout: u64,
}

/// What became of a delivered APC's capture, against its request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Delivery {
    /// The request's tag.
    pub tag: u64,
    /// From the request to the capture, in 100 ns units, saturating.
    pub delay: u32,
    /// Whether the capture ran after the request's timeout.
    pub late: bool,
}

/// The slots, over memory the driver allocated with its state, and the
/// counters of `kstack_abi::ThreadCaptureStatus` (whose docs give their
/// identities).
pub struct ThreadCaptures<'a> {
    slots: &'a [Slot],
    /// Where the next claim starts looking, so claims spread over the table.
    next: AtomicU32,
    pub(crate) counters: ThreadCaptureCounters,
}

/// One atomic per counted field of [`ThreadCaptureStatus`], from load on
/// (`in_flight` and `slots` are read off the slots).
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
    /// APCs run down (their rundown routine ran; a defence, see
    /// `kstack_abi::ThreadCaptureStatus::run_down`).
    pub(crate) run_down: AtomicU64,
    /// Delivered APCs that ran after their request's timeout.
    pub(crate) late: AtomicU64,
}

impl ThreadCaptureCounters {
    /// Every counter 0.
    fn new() -> Self {
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
        }
    }
}

/// Adds one to `counter`.
///
/// Max IRQL: any.
pub(crate) fn count(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl<'a> ThreadCaptures<'a> {
    /// The bookkeeping over `slots`, all free.
    ///
    /// Max IRQL: any.
    #[must_use]
    pub fn new(slots: &'a [Slot]) -> Self {
        Self {
            slots,
            next: AtomicU32::new(0),
            counters: ThreadCaptureCounters::new(),
        }
    }

    /// The counters now, each read on its own, and the slots in use.
    ///
    /// Max IRQL: any.
    #[must_use]
    pub fn status(&self) -> ThreadCaptureStatus {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let counters = &self.counters;
        ThreadCaptureStatus {
            requested: load(&counters.requested),
            queued: load(&counters.queued),
            no_such_thread: load(&counters.no_such_thread),
            no_slot: load(&counters.no_slot),
            not_queued: load(&counters.not_queued),
            refused_system_thread: load(&counters.refused_system_thread),
            own: load(&counters.own),
            delivered: load(&counters.delivered),
            run_down: load(&counters.run_down),
            late: load(&counters.late),
            in_flight: self.in_flight() as u64,
            slots: self.slots.len() as u64,
        }
    }

    /// Claims a free slot for `requested` and arms it: its index, or `None`
    /// when every slot is in use. The caller then queues the APC, and calls
    /// [`ThreadCaptures::refused`] if the kernel did not take it.
    ///
    /// Max IRQL: `DISPATCH_LEVEL` (a bounded scan, never a wait).
    pub fn arm(&self, requested: Requested) -> Option<usize> {
        let count = self.slots.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed) as usize;
        (0..count)
            .map(|step| (start + step) % count)
            .find(|&index| {
                let slot = &self.slots[index];
                if slot
                    .state
                    .compare_exchange(FREE, CLAIMED, Ordering::Acquire, Ordering::Relaxed)
                    .is_err()
                {
                    return false;
                }
                slot.tag.store(requested.tag, Ordering::Relaxed);
                slot.requested_at.store(requested.at, Ordering::Relaxed);
                slot.timeout.store(requested.timeout, Ordering::Relaxed);
                slot.state.store(QUEUED, Ordering::Release);
                true
            })
    }

    /// The kernel refused the APC armed in slot `index`: no routine will
    /// run for it, so the slot is free again.
    ///
    /// Max IRQL: any.
    pub fn refused(&self, index: usize) {
        self.release(index);
    }

    /// The APC of slot `index` is being delivered at `now` (its kernel
    /// routine runs): what its capture records of the request. The caller
    /// captures, then calls [`ThreadCaptures::release`].
    ///
    /// # Panics
    /// In host builds, when the slot is not armed (a routine for an APC
    /// kstack never queued: a driver bug).
    ///
    /// Max IRQL: `APC_LEVEL` (the kernel routine's).
    #[must_use]
    pub fn delivered(&self, index: usize, now: u64) -> Delivery {
        let requested = self.requested(index);
        let delay = now.saturating_sub(requested.at);
        Delivery {
            tag: requested.tag,
            delay: u32::try_from(delay).unwrap_or(u32::MAX),
            late: delay > requested.timeout,
        }
    }

    /// What the request wrote into slot `index`, read after the routine's
    /// Acquire of the armed state.
    ///
    /// Max IRQL: any.
    #[must_use]
    pub fn requested(&self, index: usize) -> Requested {
        let slot = &self.slots[index];
        let state = slot.state.load(Ordering::Acquire);
        debug_assert_eq!(
            state, QUEUED,
            "a routine ran for slot {index}, which is not armed"
        );
        Requested {
            tag: slot.tag.load(Ordering::Relaxed),
            at: slot.requested_at.load(Ordering::Relaxed),
            timeout: slot.timeout.load(Ordering::Relaxed),
        }
    }

    /// The APC of slot `index` is done (delivered and captured, or run
    /// down): the slot is free for another request. The routine's last
    /// touch of the slot.
    ///
    /// Max IRQL: any.
    pub fn release(&self, index: usize) {
        self.slots[index].release();
    }

    /// How many slots are not free: APCs queued whose routine has not
    /// finished (and, while a request is served, its claims).
    ///
    /// Max IRQL: any.
    #[must_use]
    pub fn in_flight(&self) -> usize {
        self.slots
            .iter()
            .filter(|slot| slot.state.load(Ordering::Acquire) != FREE)
            .count()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn slots(count: usize) -> Vec<Slot> {
        (0..count).map(|_| Slot::new()).collect()
    }

    fn requested(tag: u64) -> Requested {
        Requested {
            tag,
            at: 1_000,
            timeout: 500,
        }
    }

    #[test]
    fn every_slot_is_claimed_once_then_none_is_left() {
        let slots = slots(4);
        let table = ThreadCaptures::new(&slots);
        let mut claimed: Vec<usize> = (0..4)
            .map(|tag| table.arm(requested(tag)).expect("a free slot"))
            .collect();
        claimed.sort_unstable();
        assert_eq!(claimed, [0, 1, 2, 3]);
        assert_eq!(table.arm(requested(9)), None);
        assert_eq!(table.in_flight(), 4);
        table.release(2);
        assert_eq!(table.arm(requested(10)), Some(2));
    }

    #[test]
    fn a_refused_apc_frees_its_slot() {
        let slots = slots(1);
        let table = ThreadCaptures::new(&slots);
        let index = table.arm(requested(1)).expect("a free slot");
        table.refused(index);
        assert_eq!(table.in_flight(), 0);
        assert_eq!(table.arm(requested(2)), Some(index));
    }

    #[test]
    fn the_memory_is_freed_once_by_unload_or_by_the_last_routine() {
        let retirement = Retirement::new();
        assert!(retirement.abandon(), "nothing pending: unload frees");
        let retirement = Retirement::new();
        retirement.queued();
        retirement.queued();
        assert!(!retirement.done(), "not abandoned: unload will free");
        assert_eq!(retirement.pending(), 1);
        assert!(!retirement.abandon(), "one pending: its routine will free");
        assert!(
            retirement.done(),
            "the last routine after unload gave up frees"
        );
    }

    #[test]
    fn a_delivery_reads_its_request_and_says_whether_it_is_late() {
        let slots = slots(2);
        let table = ThreadCaptures::new(&slots);
        let index = table.arm(requested(77)).expect("a free slot");
        assert_eq!(
            table.delivered(index, 1_400),
            Delivery {
                tag: 77,
                delay: 400,
                late: false
            }
        );
        assert!(table.delivered(index, 1_501).late);
        assert_eq!(table.delivered(index, u64::MAX).delay, u32::MAX);
        assert_eq!(table.delivered(index, 0).delay, 0);
        table.release(index);
        assert_eq!(table.in_flight(), 0);
    }
}
