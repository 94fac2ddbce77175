//! Sampling chosen processes' threads (`kstack sample`): which threads
//! each tick asks the driver for (`kstack_abi::Ioctl::CaptureThreads`),
//! and an account of every thread not asked for and every request not
//! answered, by reason. No I/O here: the command lists the threads, sends
//! the requests and reads the records; the second kernel host's bridge
//! drives the same sampler against the real driver.
//!
//! The rules, each kept so a sample stays bounded whatever the machine
//! does:
//! - Ticks fall on a fixed grid (`start + k / hz`). A tick that comes when
//!   one or more grid points already passed runs once and counts the
//!   passed ones as missed: a slow round never bunches ticks.
//! - Each tick asks for at most `threads_per_tick` threads. When more are
//!   eligible, the tick goes on from the thread id after the last one
//!   asked for, wrapping, so every thread gets its turn.
//! - A thread is asked for once at a time: while its last request is
//!   younger than the timeout and unanswered, it is skipped (counted). A
//!   request older than the timeout stops holding its thread back but is
//!   still awaited: its record, if it comes, counts as captured.
//! - Every thread is followed: the threads of the chosen processes are
//!   listed anew each tick, so threads that start are sampled from their
//!   first tick and threads that end stop being asked for.
//!
//! The identities [`SampleCounts`] keeps, checked by its tests:
//! `listed = eligible + skipped_pending`;
//! `eligible = requested + skipped_over_bound + unsent`;
//! `requested = queued + refused` (the refusals by outcome);
//! `queued = captured + awaited` (awaited: no record yet; at the end,
//! unanswered); `late <= captured`; `expected_ticks = ticks + missed_ticks`.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant},
};

use kstack_abi::{SourceFacts, ThreadRequestOutcome, thread_capture::THREAD_CAPTURE_SLOTS};

use crate::thread_list::ProcessThread;

/// The ticks per second a sample may ask for.
pub const HZ_RANGE: core::ops::RangeInclusive<u32> = 1..=1000;
/// The most threads one tick asks for: every APC slot of the driver.
pub const MAX_THREADS_PER_TICK: u32 = THREAD_CAPTURE_SLOTS;

/// Which processes are sampled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selection {
    /// These processes' threads.
    Processes(BTreeSet<u32>),
    /// Every process's threads but these (the idle and system processes,
    /// whose threads the driver refuses, and the sampler's own).
    AllBut(BTreeSet<u32>),
}

impl Selection {
    fn contains(&self, process_id: u32) -> bool {
        match self {
            Self::Processes(chosen) => chosen.contains(&process_id),
            Self::AllBut(left_out) => !left_out.contains(&process_id),
        }
    }
}

/// How a sample runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SampleSettings {
    /// Ticks per second, in [`HZ_RANGE`].
    pub hz: u32,
    /// The most threads a tick asks for, 1 to [`MAX_THREADS_PER_TICK`].
    pub threads_per_tick: u32,
    /// How long a request holds its thread back, in milliseconds; also
    /// the request's `timeout_ms` (records after it are flagged late).
    pub timeout_ms: u32,
}

impl SampleSettings {
    /// The time between ticks.
    #[must_use]
    pub fn period(&self) -> Duration {
        Duration::from_secs(1) / self.hz.max(1)
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(u64::from(self.timeout_ms))
    }
}

/// Everything a sample counted. See the module's identities.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SampleCounts {
    /// Ticks run.
    pub ticks: u64,
    /// Grid points that passed while the previous tick's work ran.
    pub missed_ticks: u64,
    /// Threads of the chosen processes listed at a tick, over all ticks.
    pub listed: u64,
    /// Listed threads skipped because their last request, younger than
    /// the timeout, was not answered yet.
    pub skipped_pending: u64,
    /// Listed threads that could be asked for: `listed - skipped_pending`.
    pub eligible: u64,
    /// Eligible threads left for a later tick by the per-tick bound.
    pub skipped_over_bound: u64,
    /// Threads asked for, each answered with an outcome.
    pub requested: u64,
    /// Threads planned but not asked for: their request was refused as a
    /// whole (the driver unloading, the source turned off), which ends the
    /// sample.
    pub unsent: u64,
    /// Requests the driver queued an APC for.
    pub queued: u64,
    /// Requests refused, by outcome (every outcome but `Queued`).
    pub no_such_thread: u64,
    /// All of the driver's APC slots were in use.
    pub no_slot: u64,
    /// The kernel refused the APC (the thread was exiting).
    pub not_queued: u64,
    /// A system thread.
    pub system_thread: u64,
    /// The requesting thread itself.
    pub own: u64,
    /// Records of this sample's requests received.
    pub captured: u64,
    /// Of `captured`, those the driver flagged late (after the timeout).
    pub late: u64,
    /// Queued requests whose record has not come (yet).
    pub awaited: u64,
    /// Records read that are not this sample's (other sources, other
    /// requests): kept too, and counted here.
    pub other_records: u64,
    /// Different threads ever listed.
    pub threads_seen: u64,
    /// Threads listed at one tick and not at a later one (they ended, or
    /// their process did).
    pub threads_gone: u64,
}

impl SampleCounts {
    /// The refused requests: every outcome but `Queued`.
    #[must_use]
    pub const fn refused(&self) -> u64 {
        self.no_such_thread + self.no_slot + self.not_queued + self.system_thread + self.own
    }
}

/// One tick's requests: the tag every request of the tick carries, and
/// the threads, in the order to ask for them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TickPlan {
    /// The requests' tag: the sample's session in the high half, the tick
    /// in the low half.
    pub tag: u64,
    /// The threads to ask for (possibly none).
    pub thread_ids: Vec<u32>,
}

/// What a record read during a sample is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordOwner {
    /// The capture one of this sample's requests asked for.
    ThisSample,
    /// Anything else.
    Other,
}

/// The sampler's state: its clock, the requests awaited, the threads
/// listed at the last tick, and the counts.
#[derive(Debug)]
pub struct Sampler {
    settings: SampleSettings,
    selection: Selection,
    session: u32,
    start: Instant,
    /// The next grid point's index.
    next_tick: u64,
    /// The tick number the next plan carries in its tag.
    tick: u32,
    /// (thread id, tick) of every queued request without a record, with
    /// when it was asked for.
    awaited: BTreeMap<(u32, u32), Instant>,
    /// The thread ids listed at the last tick.
    listed: BTreeSet<u32>,
    seen: BTreeSet<u32>,
    /// The last thread id asked for: the next tick goes on after it.
    cursor: u32,
    counts: SampleCounts,
}

impl Sampler {
    /// A sample starting at `start`; `session` goes in every tag's high
    /// half so records of other requests are told apart.
    #[must_use]
    pub fn new(
        settings: SampleSettings,
        selection: Selection,
        session: u32,
        start: Instant,
    ) -> Self {
        Self {
            settings,
            selection,
            session,
            start,
            next_tick: 0,
            tick: 0,
            awaited: BTreeMap::new(),
            listed: BTreeSet::new(),
            seen: BTreeSet::new(),
            cursor: 0,
            counts: SampleCounts::default(),
        }
    }

    /// How long until the next tick is due (zero: due now).
    #[must_use]
    pub fn until_next_tick(&self, now: Instant) -> Duration {
        let due = self.start + self.grid_point(self.next_tick);
        due.saturating_duration_since(now)
    }

    fn grid_point(&self, index: u64) -> Duration {
        let period = u64::try_from(self.settings.period().as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(period.saturating_mul(index))
    }

    /// The tick at `now`, over `listed` (every thread of the machine, or
    /// more than the selection: the rest is passed over): which threads to
    /// ask for, and the counts of the others.
    pub fn plan(&mut self, now: Instant, listed: &[ProcessThread]) -> TickPlan {
        self.advance_clock(now);
        let candidates: BTreeSet<u32> = listed
            .iter()
            .filter(|thread| self.selection.contains(thread.process_id))
            .map(|thread| thread.thread_id)
            .collect();
        self.follow(&candidates);
        let timeout = self.settings.timeout();
        let held_back: BTreeSet<u32> = self
            .awaited
            .iter()
            .filter(|&(_, &asked)| now.saturating_duration_since(asked) < timeout)
            .map(|(&(thread_id, _), _)| thread_id)
            .collect();
        let eligible: Vec<u32> = candidates.difference(&held_back).copied().collect();
        self.counts.listed += candidates.len() as u64;
        self.counts.skipped_pending += (candidates.len() - eligible.len()) as u64;
        self.counts.eligible += eligible.len() as u64;
        // After the last thread asked for, then from the start.
        let resume = eligible.partition_point(|&id| id <= self.cursor);
        let bound = self.settings.threads_per_tick as usize;
        let thread_ids: Vec<u32> = eligible[resume..]
            .iter()
            .chain(&eligible[..resume])
            .take(bound)
            .copied()
            .collect();
        self.counts.skipped_over_bound += (eligible.len() - thread_ids.len()) as u64;
        if let Some(&last) = thread_ids.last() {
            self.cursor = last;
        }
        let plan = TickPlan {
            tag: self.tag(self.tick),
            thread_ids,
        };
        self.tick = self.tick.wrapping_add(1);
        plan
    }

    /// Counts this tick and the grid points passed since the last one, and
    /// moves the next tick to the first grid point after `now`.
    fn advance_clock(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.start);
        let period = self.settings.period().as_nanos().max(1);
        let current = u64::try_from(elapsed.as_nanos() / period).unwrap_or(u64::MAX);
        let current = current.max(self.next_tick);
        self.counts.ticks += 1;
        self.counts.missed_ticks += current - self.next_tick;
        self.next_tick = current + 1;
    }

    /// Notes which threads came and went since the last tick.
    fn follow(&mut self, candidates: &BTreeSet<u32>) {
        self.counts.threads_gone += self.listed.difference(candidates).count() as u64;
        for &thread_id in candidates {
            if self.seen.insert(thread_id) {
                self.counts.threads_seen += 1;
            }
        }
        self.listed.clone_from(candidates);
    }

    fn tag(&self, tick: u32) -> u64 {
        (u64::from(self.session) << 32) | u64::from(tick)
    }

    /// A tag's (session, tick) halves.
    fn tag_halves(tag: u64) -> (u32, u32) {
        let half = |bits: u64| u32::try_from(bits & u64::from(u32::MAX)).unwrap_or(u32::MAX);
        (half(tag >> 32), half(tag))
    }

    /// The driver's answer to `plan`'s requests, sent at `asked`: one
    /// outcome per thread id, in order. Fewer when a request was refused
    /// as a whole (which ends a sample): the ids without an outcome count
    /// as unsent.
    pub fn answered(&mut self, plan: &TickPlan, outcomes: &[ThreadRequestOutcome], asked: Instant) {
        let answered = outcomes.len().min(plan.thread_ids.len());
        self.counts.requested += answered as u64;
        self.counts.unsent += (plan.thread_ids.len() - answered) as u64;
        let (_, tick) = Self::tag_halves(plan.tag);
        for (&thread_id, &outcome) in plan.thread_ids.iter().zip(outcomes) {
            let counter = match outcome {
                ThreadRequestOutcome::Queued => {
                    self.awaited.insert((thread_id, tick), asked);
                    &mut self.counts.queued
                }
                ThreadRequestOutcome::NoSuchThread => &mut self.counts.no_such_thread,
                ThreadRequestOutcome::NoSlot => &mut self.counts.no_slot,
                ThreadRequestOutcome::NotQueued => &mut self.counts.not_queued,
                ThreadRequestOutcome::SystemThread => &mut self.counts.system_thread,
                ThreadRequestOutcome::Own => &mut self.counts.own,
            };
            *counter += 1;
        }
        self.counts.awaited = self.awaited.len() as u64;
    }

    /// Notes one record read; says whether this sample asked for it.
    pub fn note_record(&mut self, facts: &SourceFacts) -> RecordOwner {
        let owner = match *facts {
            SourceFacts::ThreadStack {
                tag,
                target_thread_id,
                late,
                ..
            } if Self::tag_halves(tag).0 == self.session
                && self
                    .awaited
                    .remove(&(target_thread_id, Self::tag_halves(tag).1))
                    .is_some() =>
            {
                self.counts.captured += 1;
                self.counts.late += u64::from(late);
                RecordOwner::ThisSample
            }
            _ => {
                self.counts.other_records += 1;
                RecordOwner::Other
            }
        };
        self.counts.awaited = self.awaited.len() as u64;
        owner
    }

    /// Whether every chosen process has ended: the last tick listed none of
    /// their threads (never, with [`Selection::AllBut`]).
    #[must_use]
    pub fn selection_ended(&self) -> bool {
        matches!(self.selection, Selection::Processes(_))
            && self.counts.ticks > 0
            && self.listed.is_empty()
    }

    /// Whether any queued request still awaits its record.
    #[must_use]
    pub fn awaiting(&self) -> bool {
        !self.awaited.is_empty()
    }

    /// The counts so far.
    #[must_use]
    pub const fn counts(&self) -> &SampleCounts {
        &self.counts
    }

    /// The grid points from the start up to `end`, both included: after a
    /// tick at `end`, `ticks + missed_ticks`.
    #[must_use]
    pub fn expected_ticks(&self, end: Instant) -> u64 {
        let elapsed = end.saturating_duration_since(self.start).as_nanos();
        let period = self.settings.period().as_nanos().max(1);
        u64::try_from(elapsed / period + 1).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const SESSION: u32 = 0x5A;
    const PROCESS: u32 = 100;

    fn settings(threads_per_tick: u32) -> SampleSettings {
        SampleSettings {
            hz: 100,
            threads_per_tick,
            timeout_ms: 50,
        }
    }

    fn sampler(threads_per_tick: u32, start: Instant) -> Sampler {
        Sampler::new(
            settings(threads_per_tick),
            Selection::Processes(BTreeSet::from([PROCESS])),
            SESSION,
            start,
        )
    }

    fn threads(process_id: u32, ids: &[u32]) -> Vec<ProcessThread> {
        ids.iter()
            .map(|&thread_id| ProcessThread {
                process_id,
                thread_id,
                facts: None,
            })
            .collect()
    }

    fn record(tag: u64, thread_id: u32, late: bool) -> SourceFacts {
        SourceFacts::ThreadStack {
            target_process_id: PROCESS,
            target_thread_id: thread_id,
            tag,
            delay: 0,
            late,
        }
    }

    fn ms(count: u64) -> Duration {
        Duration::from_millis(count)
    }

    /// Plans a tick at `now`, every id queued, every record back at once.
    fn answered_tick(sampler: &mut Sampler, now: Instant, listed: &[ProcessThread]) -> Vec<u32> {
        let plan = sampler.plan(now, listed);
        sampler.answered(
            &plan,
            &vec![ThreadRequestOutcome::Queued; plan.thread_ids.len()],
            now,
        );
        for &thread_id in &plan.thread_ids {
            assert_eq!(
                sampler.note_record(&record(plan.tag, thread_id, false)),
                RecordOwner::ThisSample
            );
        }
        plan.thread_ids
    }

    #[test]
    fn ticks_fall_on_the_grid_and_passed_grid_points_count_as_missed() {
        let start = Instant::now();
        let mut sampler = sampler(8, start);
        assert_eq!(sampler.until_next_tick(start), Duration::ZERO);
        sampler.plan(start, &[]);
        assert_eq!(sampler.until_next_tick(start + ms(3)), ms(7));
        // Late by 25 ms: the points at 10 and 20 ms passed; the tick runs once.
        sampler.plan(start + ms(25), &[]);
        assert_eq!(sampler.until_next_tick(start + ms(25)), ms(5));
        sampler.plan(start + ms(31), &[]);
        let counts = sampler.counts();
        assert_eq!((counts.ticks, counts.missed_ticks), (3, 1));
        assert_eq!(sampler.expected_ticks(start + ms(31)), 4);
    }

    #[test]
    fn the_bound_leaves_threads_for_the_next_tick_in_turn() {
        let start = Instant::now();
        let mut sampler = sampler(2, start);
        let listed = threads(PROCESS, &[50, 10, 40, 30, 20]);
        let asked: Vec<Vec<u32>> = (0..4)
            .map(|tick| answered_tick(&mut sampler, start + ms(10 * tick), &listed))
            .collect();
        assert_eq!(asked, [[10, 20], [30, 40], [50, 10], [20, 30]]);
        let counts = sampler.counts();
        assert_eq!(
            (counts.eligible, counts.requested, counts.skipped_over_bound),
            (20, 8, 12)
        );
        assert_eq!((counts.captured, counts.awaited), (8, 0));
    }

    #[test]
    fn a_thread_is_held_back_while_its_request_is_younger_than_the_timeout() {
        let start = Instant::now();
        let mut sampler = sampler(8, start);
        let listed = threads(PROCESS, &[7, 9]);
        let first = sampler.plan(start, &listed);
        let queued = [ThreadRequestOutcome::Queued; 2];
        sampler.answered(&first, &queued, start);
        sampler.note_record(&record(first.tag, 9, false));
        // Thread 7's APC has not run: held back for the 50 ms timeout.
        let second = sampler.plan(start + ms(10), &listed);
        assert_eq!(second.thread_ids, [9]);
        assert_eq!(sampler.counts().skipped_pending, 1);
        sampler.answered(&second, &queued[..1], start + ms(10));
        sampler.note_record(&record(second.tag, 9, false));
        let later = sampler.plan(start + ms(50), &listed);
        assert_eq!(
            later.thread_ids,
            [7, 9],
            "the timeout passed: 7 is asked for again"
        );
        // The first request's record comes late: still this sample's.
        assert_eq!(
            sampler.note_record(&record(first.tag, 7, true)),
            RecordOwner::ThisSample
        );
        let counts = sampler.counts();
        assert_eq!((counts.captured, counts.late, counts.awaited), (3, 1, 0));
        assert!(!sampler.awaiting());
    }

    #[test]
    fn records_of_other_requests_and_sources_are_not_this_samples() {
        let start = Instant::now();
        let mut sampler = sampler(8, start);
        let plan = sampler.plan(start, &threads(PROCESS, &[7]));
        sampler.answered(&plan, &[ThreadRequestOutcome::Queued], start);
        let other_session = (u64::from(SESSION) + 1) << 32;
        let others = [
            record(other_session, 7, false),
            record(plan.tag + 1, 7, false),
            record(plan.tag, 8, false),
            SourceFacts::OnDemand { tag: plan.tag },
        ];
        for facts in &others {
            assert_eq!(sampler.note_record(facts), RecordOwner::Other, "{facts:?}");
        }
        assert_eq!(
            sampler.note_record(&record(plan.tag, 7, false)),
            RecordOwner::ThisSample
        );
        // A second record for the same request is not counted twice.
        assert_eq!(
            sampler.note_record(&record(plan.tag, 7, false)),
            RecordOwner::Other
        );
        assert_eq!(
            (sampler.counts().captured, sampler.counts().other_records),
            (1, 5)
        );
    }

    #[test]
    fn threads_are_followed_as_they_come_and_go() {
        let start = Instant::now();
        let mut sampler = sampler(8, start);
        let mut listed = threads(PROCESS, &[1, 2]);
        listed.extend(threads(PROCESS + 1, &[3]));
        assert_eq!(answered_tick(&mut sampler, start, &listed), [1, 2]);
        let listed = threads(PROCESS, &[2, 4]);
        assert_eq!(answered_tick(&mut sampler, start + ms(10), &listed), [4, 2]);
        let counts = sampler.counts();
        assert_eq!((counts.threads_seen, counts.threads_gone), (3, 1));
        assert!(!sampler.selection_ended());
        answered_tick(&mut sampler, start + ms(20), &threads(PROCESS + 1, &[3]));
        assert!(
            sampler.selection_ended(),
            "no thread of process {PROCESS} is left"
        );
        let mut everyone = Sampler::new(
            settings(8),
            Selection::AllBut(BTreeSet::from([PROCESS])),
            SESSION,
            start,
        );
        assert_eq!(
            answered_tick(&mut everyone, start, &listed),
            Vec::<u32>::new()
        );
        assert!(!everyone.selection_ended(), "--all never ends by itself");
    }

    #[test]
    fn a_request_refused_as_a_whole_leaves_its_ids_unsent() {
        let start = Instant::now();
        let mut sampler = sampler(8, start);
        let plan = sampler.plan(start, &threads(PROCESS, &[1, 2, 3]));
        sampler.answered(&plan, &[ThreadRequestOutcome::NoSlot], start);
        let counts = sampler.counts();
        assert_eq!(
            (
                counts.requested,
                counts.no_slot,
                counts.unsent,
                counts.awaited
            ),
            (1, 1, 2, 0)
        );
    }

    /// One tick of a random run: the threads listed, each asked-for id's
    /// outcome, which records come back, and how far the clock moves.
    #[derive(Debug, Clone)]
    struct Step {
        listed: Vec<(bool, u32)>,
        outcomes: Vec<u8>,
        answered: Vec<bool>,
        late: Vec<bool>,
        advance_ms: u64,
        whole_request_refused: bool,
    }

    fn step() -> impl Strategy<Value = Step> {
        (
            prop::collection::vec((any::<bool>(), 1..40_u32), 0..30),
            prop::collection::vec(1..=6_u8, 30),
            prop::collection::vec(any::<bool>(), 30),
            prop::collection::vec(any::<bool>(), 30),
            0..40_u64,
            prop::bool::weighted(0.05),
        )
            .prop_map(
                |(listed, outcomes, answered, late, advance_ms, whole_request_refused)| Step {
                    listed,
                    outcomes,
                    answered,
                    late,
                    advance_ms,
                    whole_request_refused,
                },
            )
    }

    proptest! {
        /// Whatever the listings, outcomes, records and timing, the counts
        /// keep the module's identities, a tick never asks for more than
        /// its bound nor for a thread held back, and every request is
        /// either captured or still awaited.
        #[test]
        fn the_counts_keep_their_identities(
            steps in prop::collection::vec(step(), 1..40),
            bound in 1..6_u32,
        ) {
            let start = Instant::now();
            let mut sampler = sampler(bound, start);
            let mut now = start;
            let mut last_tick = start;
            let mut outstanding: Vec<(u64, u32)> = Vec::new();
            for step in &steps {
                let listed: Vec<ProcessThread> = step
                    .listed
                    .iter()
                    .map(|&(chosen, thread_id)| ProcessThread {
                        process_id: if chosen { PROCESS } else { PROCESS + 1 },
                        thread_id,
                        facts: None,
                    })
                    .collect();
                // As the command does: never before the tick is due.
                now += sampler.until_next_tick(now);
                last_tick = now;
                let plan = sampler.plan(now, &listed);
                prop_assert!(plan.thread_ids.len() <= bound as usize);
                let outcomes: Vec<ThreadRequestOutcome> = plan
                    .thread_ids
                    .iter()
                    .zip(&step.outcomes)
                    .map(|(_, &wire)| ThreadRequestOutcome::from_wire(wire).unwrap())
                    .take(if step.whole_request_refused { 0 } else { usize::MAX })
                    .collect();
                sampler.answered(&plan, &outcomes, now);
                for (&thread_id, &outcome) in plan.thread_ids.iter().zip(&outcomes) {
                    if outcome == ThreadRequestOutcome::Queued {
                        outstanding.push((plan.tag, thread_id));
                    }
                }
                let mut still = Vec::new();
                for (index, (tag, thread_id)) in outstanding.drain(..).enumerate() {
                    if step.answered[index % 30] {
                        let late = step.late[index % 30];
                        prop_assert_eq!(sampler.note_record(&record(tag, thread_id, late)), RecordOwner::ThisSample);
                    } else {
                        still.push((tag, thread_id));
                    }
                }
                outstanding = still;
                now += ms(step.advance_ms);
                let counts = *sampler.counts();
                prop_assert_eq!(counts.listed, counts.eligible + counts.skipped_pending);
                prop_assert_eq!(counts.eligible, counts.requested + counts.skipped_over_bound + counts.unsent);
                prop_assert_eq!(counts.requested, counts.queued + counts.refused());
                prop_assert_eq!(counts.queued, counts.captured + counts.awaited);
                prop_assert_eq!(counts.awaited, outstanding.len() as u64);
                prop_assert!(counts.late <= counts.captured);
            }
            let counts = sampler.counts();
            prop_assert_eq!(sampler.expected_ticks(last_tick), counts.ticks + counts.missed_ticks);
        }
    }
}
