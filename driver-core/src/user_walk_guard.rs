//! The re-entry guard of user-stack walks: which threads are walking their
//! user stack now.
//!
//! A user walk reads the thread's user stack, which may be paged out;
//! paging it in runs file-system and memory-manager code on the same
//! thread, which can reach another of kstack's callbacks (an image load, a
//! registry operation, a handle). That nested capture must not walk the
//! user stack again: it would nest another walk, and another fault,
//! inside the first. So a thread marks itself before walking and clears
//! the mark after; a capture that finds its thread marked skips its user
//! walk ([`kstack_abi::UserPart::Reentered`]).
//!
//! Kernel threads have no storage a driver may hang such a mark on, so the
//! marks live in a fixed table allocated with the driver (no allocation
//! after load), keyed by thread id: open addressing over a window of
//! [`PROBES`] slots from the id's hash. A thread only ever finds its own
//! id where it put it (ids of live threads are unique, and a thread clears
//! its mark before it can exit), so a mark seen is this thread's walk. A
//! window with no free slot means more threads are walking at once near
//! that hash than the window holds: the walk is skipped and counted
//! ([`kstack_abi::UserPart::GuardFull`]), never waited for.
//!
//! Safe at any IRQL: atomics only, no waiting. All-zero bytes are an empty
//! guard (a slot holding 0 is free), so the driver makes it in zeroed pool.

use crate::sync::{AtomicU32, Ordering};

/// Slots in the table: far more than threads walking at once (a walk runs
/// below `DISPATCH_LEVEL`, so walkers are at most the threads inside
/// kstack's callbacks at one time). Under loom, where each slot is a
/// modelled atomic on a coroutine's small stack, 16: the scenarios' two
/// threads need no more.
pub const SLOTS: usize = if cfg!(loom) { 16 } else { 1024 };
/// Slots looked at per thread.
pub const PROBES: usize = 8;

/// Why a thread may not walk now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// This thread is already walking.
    Reentered,
    /// No free slot in the thread's window.
    Full,
}

/// The threads walking now.
pub struct UserWalkGuard {
    /// Thread id + 1 of a walking thread, or 0 when free.
    slots: [AtomicU32; SLOTS],
}

/// The mark of one walking thread; dropping it clears the mark.
#[must_use]
pub struct Walking<'a> {
    slot: &'a AtomicU32,
}

impl Drop for Walking<'_> {
    fn drop(&mut self) {
        // Release: nothing of the walk is ordered after it; the slot is
        // free for any thread from here.
        self.slot.store(0, Ordering::Release);
    }
}

impl UserWalkGuard {
    /// No thread walking.
    #[must_use]
    pub fn new() -> Self {
        Self {
            slots: core::array::from_fn(|_| AtomicU32::new(0)),
        }
    }

    /// Marks `thread_id` as walking until the returned mark is dropped.
    ///
    /// # Errors
    /// [`Refused::Reentered`] when this thread is walking already (its mark
    /// is in its window), [`Refused::Full`] when its window has no free
    /// slot (thread id `u32::MAX`, never a real one, is refused so too).
    ///
    /// Max IRQL: any.
    pub fn enter(&self, thread_id: u32) -> Result<Walking<'_>, Refused> {
        let key = thread_id.checked_add(1).ok_or(Refused::Full)?;
        let window = || {
            let start = window_start(thread_id);
            (0..PROBES).map(move |probe| &self.slots[(start + probe) % SLOTS])
        };
        // Only this thread writes its own key, so if it is in the window it
        // was put there by a walk of this thread still under way.
        if window().any(|slot| slot.load(Ordering::Relaxed) == key) {
            return Err(Refused::Reentered);
        }
        for slot in window() {
            // Acquire: pairs with the release of the mark that freed it.
            if slot
                .compare_exchange(0, key, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return Ok(Walking { slot });
            }
        }
        Err(Refused::Full)
    }

    /// Slots marked now (for tests and status checks).
    ///
    /// Max IRQL: any.
    #[must_use]
    pub fn marked(&self) -> usize {
        self.slots
            .iter()
            .filter(|slot| slot.load(Ordering::Relaxed) != 0)
            .count()
    }
}

impl Default for UserWalkGuard {
    fn default() -> Self {
        Self::new()
    }
}

/// The first slot of `thread_id`'s window. Windows thread ids are multiples
/// of 4, so the id is mixed before taking the slot. (Public for the
/// concurrency scenarios, which pick threads sharing a window.)
#[must_use]
pub fn window_start(thread_id: u32) -> usize {
    let mixed = thread_id.wrapping_mul(0x9E37_79B9);
    (mixed >> 22) as usize % SLOTS
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `count` thread ids (multiples of 4, as Windows makes them) whose
    /// window starts at `start`, from the first million ids (about a
    /// thousand start at each slot): bounded, so a broken `window_start`
    /// fails the test instead of searching for ever.
    fn threads_starting_at(start: usize, count: usize) -> Vec<u32> {
        let sharing: Vec<u32> = (1..1 << 20)
            .map(|n| n * 4)
            .filter(|&id| window_start(id) == start)
            .take(count)
            .collect();
        assert_eq!(sharing.len(), count, "thread ids starting at {start}");
        sharing
    }

    #[test]
    fn a_thread_walking_is_refused_a_second_walk_until_it_is_done() {
        let guard = UserWalkGuard::new();
        let first = guard.enter(4).unwrap();
        assert_eq!(guard.enter(4).err(), Some(Refused::Reentered));
        let other = guard.enter(8).unwrap();
        assert_eq!(guard.marked(), 2);
        drop(first);
        assert_eq!(guard.marked(), 1);
        let again = guard.enter(4).unwrap();
        drop((again, other));
        assert_eq!(guard.marked(), 0);
    }

    #[test]
    fn a_full_window_refuses_and_never_mistakes_another_thread_for_this_one() {
        let guard = UserWalkGuard::new();
        // PROBES + 1 thread ids sharing one window.
        let sharing = threads_starting_at(window_start(4), PROBES + 1);
        let marks: Vec<_> = sharing[..PROBES]
            .iter()
            .map(|&id| guard.enter(id).unwrap())
            .collect();
        let last = sharing[PROBES];
        assert_eq!(guard.enter(last).err(), Some(Refused::Full));
        assert_eq!(guard.enter(sharing[0]).err(), Some(Refused::Reentered));
        drop(marks);
        assert!(guard.enter(last).is_ok());
        assert_eq!(guard.enter(u32::MAX).err(), Some(Refused::Full));
    }

    #[test]
    fn windows_at_either_end_of_the_table_hold_a_whole_window() {
        for start in [0, 1, SLOTS - 1] {
            let guard = UserWalkGuard::new();
            let sharing = threads_starting_at(start, PROBES + 1);
            let marks: Vec<_> = sharing[..PROBES]
                .iter()
                .map(|&id| guard.enter(id).unwrap())
                .collect();
            // The window: PROBES slots from its start, past the last slot
            // on to the first.
            let window: Vec<usize> = (start..SLOTS).chain(0..start).take(PROBES).collect();
            for (slot, &id) in window.iter().zip(&sharing) {
                assert_eq!(guard.slots[*slot].load(Ordering::Relaxed), id + 1);
            }
            assert_eq!(guard.enter(sharing[PROBES]).err(), Some(Refused::Full));
            for &id in &sharing[..PROBES] {
                assert_eq!(guard.enter(id).err(), Some(Refused::Reentered));
            }
            drop(marks);
            assert_eq!(guard.marked(), 0);
        }
    }

    #[test]
    fn windows_spread_thread_ids_and_start_in_the_table() {
        let starts: std::collections::BTreeSet<usize> =
            (1..=1024_u32).map(|n| window_start(n * 4)).collect();
        assert!(starts.len() > SLOTS / 2, "{} distinct starts", starts.len());
        let last = starts.iter().copied().chain([window_start(u32::MAX)]).max();
        assert!(last < Some(SLOTS), "a window starts at slot {last:?}");
    }
}
