//! Periodic sampling: a kernel timer whose DPC captures the stack it
//! interrupts, at `DISPATCH_LEVEL` (so only with `DisablePagingExecutive`=1,
//! which the configure request enforces).

use core::{cell::UnsafeCell, ptr};

use kstack_abi::SourceFacts;
use wdk_sys::{
    _TIMER_TYPE::NotificationTimer,
    KDPC, KTIMER, LARGE_INTEGER, NTSTATUS, PVOID, STATUS_SUCCESS,
    ntddk::{KeCancelTimer, KeFlushQueuedDpcs, KeInitializeDpc, KeInitializeTimerEx, KeSetTimerEx},
};

use crate::recorder;

/// The timer and its DPC, kept in the driver's non-paged state.
pub struct TimerSource {
    timer: UnsafeCell<KTIMER>,
    dpc: UnsafeCell<KDPC>,
}

/// The DPC routine.
///
/// Max IRQL: `DISPATCH_LEVEL` (DPCs run there).
unsafe extern "C" fn on_tick(
    _dpc: *mut KDPC,
    _context: PVOID,
    _argument1: PVOID,
    _argument2: PVOID,
) {
    recorder::record(|| Some(SourceFacts::Timer));
}

impl TimerSource {
    pub fn new() -> Self {
        Self {
            timer: UnsafeCell::new(KTIMER::default()),
            dpc: UnsafeCell::new(KDPC::default()),
        }
    }

    /// Initializes the kernel objects where they now live.
    ///
    /// Max IRQL: `PASSIVE_LEVEL` (for the timer, `DISPATCH_LEVEL` at most).
    pub fn initialize(&self) -> NTSTATUS {
        // SAFETY: the timer lives in the driver state until after `stop`.
        unsafe { KeInitializeTimerEx(self.timer.get(), NotificationTimer) };
        // SAFETY: as above for the DPC; the routine lives as long as the image.
        unsafe { KeInitializeDpc(self.dpc.get(), Some(on_tick), ptr::null_mut()) };
        STATUS_SUCCESS
    }

    /// Starts (or restarts) the timer: first tick after one period.
    ///
    /// Max IRQL: `DISPATCH_LEVEL`.
    pub fn start(&self, period_ms: u32) {
        let due = LARGE_INTEGER {
            QuadPart: -(i64::from(period_ms) * 10_000),
        };
        let period = i32::try_from(period_ms).unwrap_or(i32::MAX);
        // SAFETY: timer and DPC were initialized by `initialize`.
        let _ = unsafe { KeSetTimerEx(self.timer.get(), due, period, self.dpc.get()) };
    }

    /// Stops the timer and waits until no tick is queued or running.
    ///
    /// Max IRQL: `PASSIVE_LEVEL` (`KeFlushQueuedDpcs`).
    pub fn stop(&self) {
        // SAFETY: the timer was initialized by `initialize`.
        let _ = unsafe { KeCancelTimer(self.timer.get()) };
        // SAFETY: called at PASSIVE_LEVEL.
        unsafe { KeFlushQueuedDpcs() };
    }
}
