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
//! - A thread that has not run since its stack was captured is not
//!   interrupted: its sample repeats that stack ([`TickPlan::repeated`]).
//!   Two captures in a row must show the same stack, each taken in the
//!   thread's wait (at the listing after it: waiting, in the same wait
//!   reason as at the request, switched to exactly once more, the APC's
//!   own switch-in, no CPU time); then while the thread stays waiting
//!   with that switch count and CPU time, its samples repeat that stack.
//!   The reasons, and what the listing cannot see, are in
//!   docs/thread-stacks.md ("Threads that have not run"). Without facts (a
//!   Toolhelp listing, Wine) every thread is asked for.
//!
//! The identities [`SampleCounts`] keeps, checked by its tests:
//! `listed = eligible + skipped_pending`;
//! `eligible = requested + repeated + skipped_over_bound + unsent`;
//! `requested = queued + refused` (the refusals by outcome);
//! `queued = captured + awaited` (awaited: no record yet; at the end,
//! unanswered); `late <= captured`; `expected_ticks = ticks + missed_ticks`.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant},
};

use kstack_abi::{SourceFacts, ThreadRequestOutcome, thread_capture::THREAD_CAPTURE_SLOTS};

use crate::{
    capture::trace::{SampleFacts, TraceRecord},
    thread_list::{ProcessThread, ThreadFacts},
};

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
    /// Of `listed`, those listed without a state (Toolhelp, or Wine): they
    /// are never repeated, always asked for.
    pub without_state: u64,
    /// Listed threads skipped because their last request, younger than
    /// the timeout, was not answered yet.
    pub skipped_pending: u64,
    /// Listed threads that could be asked for: `listed - skipped_pending`.
    pub eligible: u64,
    /// Eligible threads left for a later tick by the per-tick bound.
    pub skipped_over_bound: u64,
    /// Threads asked for, each answered with an outcome.
    pub requested: u64,
    /// Threads not asked for because they had not run since their stack
    /// was captured: each a sample repeating that stack, without an APC.
    pub repeated: u64,
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

/// One tick's work: the tag every request of the tick carries, the
/// threads to ask for, in order, and the samples that repeat a stack.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TickPlan {
    /// The requests' tag: the sample's session in the high half, the tick
    /// in the low half.
    pub tag: u64,
    /// The threads to ask for (possibly none).
    pub thread_ids: Vec<u32>,
    /// The samples of the threads that had not run since their last
    /// capture: each a copy of the thread's last thread-stack record read,
    /// with the listing's time and the sample's facts (`repeated` set).
    pub repeated: Vec<TraceRecord>,
}

/// What a record read during a sample is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordOwner {
    /// The capture one of this sample's requests asked for, with the
    /// sample's facts where the listing had them.
    ThisSample(Option<SampleFacts>),
    /// Anything else.
    Other,
}

/// A capture read, until the next listing settles whether it was taken in
/// the thread's wait.
#[derive(Clone, Copy, Debug)]
struct Delivered {
    /// The thread's facts at the request.
    asked: ThreadFacts,
    /// The stack captured.
    stack_id: u64,
    /// The driver flagged it late: the APC waited past the timeout.
    late: bool,
}

/// What the sampler remembers of one listed thread.
#[derive(Clone, Debug, Default)]
struct History {
    /// Which thread this is: its creation time (ids are reused).
    create_time: u64,
    /// Its last thread-stack record read (of any request): what a
    /// repeated sample copies, as a capture file's reader does.
    last_record: Option<TraceRecord>,
    /// CPU time at the listing of its last sample written.
    sampled_cpu: Option<u64>,
    /// This sample's capture read last, until the next listing.
    delivered: Option<Delivered>,
    /// The stack of its last capture that settled as taken in its wait.
    in_wait: Option<u64>,
    /// The facts at the listing after its second capture in a row taken
    /// in one wait with one stack: while they hold, that is its stack.
    unchanged_since: Option<ThreadFacts>,
}

impl History {
    /// Settles, at the first listing after a capture was read, whether the
    /// capture was taken in the thread's wait: waiting at the request and
    /// now, in the same wait reason, switched to exactly once in between
    /// (the APC's delivery: ReactOS `KiSwapContextResume` counts each
    /// switch-in, and the wait loop re-waits after a kernel APC,
    /// `ke/wait.c`), no CPU time charged, the APC not held back past the
    /// timeout. Two such captures in a row with the same stack start the
    /// repeats: a wait that ended before the APC came (the APC then
    /// interrupts the running thread) or an APC held back by the wait
    /// (`APC_LEVEL`, a guarded region) both also show one switch-in, but
    /// not the same stack twice (an APC interrupt's stack is not a
    /// delivery in a wait).
    fn settle(&mut self, now: &ThreadFacts) {
        let Some(Delivered {
            asked,
            stack_id,
            late,
        }) = self.delivered.take()
        else {
            return;
        };
        let in_wait = !late
            && asked.waiting()
            && now.waiting()
            && now.wait_reason == asked.wait_reason
            && now.context_switches == asked.context_switches.wrapping_add(1)
            && now.cpu_time() == asked.cpu_time();
        self.unchanged_since = (in_wait && self.in_wait == Some(stack_id)).then_some(*now);
        self.in_wait = in_wait.then_some(stack_id);
    }

    /// Whether the thread has not run since [`Self::unchanged_since`]:
    /// waiting, never switched to, no CPU time charged. Once it ran, its
    /// next two captures must agree again.
    fn still(&mut self, now: &ThreadFacts) -> bool {
        let Some(since) = self.unchanged_since else {
            return false;
        };
        let still = now.waiting()
            && now.wait_reason == since.wait_reason
            && now.context_switches == since.context_switches
            && now.cpu_time() == since.cpu_time();
        if !still {
            self.unchanged_since = None;
            self.in_wait = None;
        }
        still
    }

    /// The CPU time a sample at `cpu` carries, and notes it as sampled.
    fn sample_cpu(&mut self, cpu: u64) -> u64 {
        let since = self
            .sampled_cpu
            .map_or(0, |before| cpu.saturating_sub(before));
        self.sampled_cpu = Some(self.sampled_cpu.map_or(cpu, |before| before.max(cpu)));
        since
    }
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
    /// when it was asked for and the thread's facts then.
    awaited: BTreeMap<(u32, u32), (Instant, Option<ThreadFacts>)>,
    /// The thread ids listed at the last tick, with their facts.
    listed: BTreeMap<u32, Option<ThreadFacts>>,
    history: BTreeMap<u32, History>,
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
            listed: BTreeMap::new(),
            history: BTreeMap::new(),
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
    /// more than the selection: the rest is passed over), listed at `time`
    /// on the records' clock: which threads to ask for, which samples
    /// repeat a stack, and the counts of the others.
    pub fn plan(&mut self, now: Instant, time: u64, listed: &[ProcessThread]) -> TickPlan {
        self.advance_clock(now);
        let candidates: BTreeMap<u32, (u32, Option<ThreadFacts>)> = listed
            .iter()
            .filter(|thread| self.selection.contains(thread.process_id))
            .map(|thread| (thread.thread_id, (thread.process_id, thread.facts)))
            .collect();
        self.follow(&candidates);
        let timeout = self.settings.timeout();
        let held_back: BTreeSet<u32> = self
            .awaited
            .iter()
            .filter(|&(_, &(asked, _))| now.saturating_duration_since(asked) < timeout)
            .map(|(&(thread_id, _), _)| thread_id)
            .collect();
        let mut eligible = Vec::new();
        let mut repeated = Vec::new();
        for (&thread_id, &(_, facts)) in &candidates {
            let history = self.history.entry(thread_id).or_default();
            if let Some(facts) = &facts {
                if history.create_time != facts.create_time {
                    // Another thread with a reused id: nothing of the old one
                    // applies.
                    *history = History {
                        create_time: facts.create_time,
                        ..History::default()
                    };
                }
                history.settle(facts);
            }
            if held_back.contains(&thread_id) {
                continue;
            }
            match (facts, history.last_record.clone()) {
                (Some(facts), Some(mut record)) if history.still(&facts) => {
                    record.header.timestamp = time;
                    record.sample = Some(SampleFacts {
                        state: facts.state,
                        wait_reason: facts.wait_reason,
                        cpu_time: history.sample_cpu(facts.cpu_time()),
                        repeated: true,
                    });
                    repeated.push(record);
                }
                _ => eligible.push(thread_id),
            }
        }
        let listed_count = candidates.len() as u64;
        let eligible_count = (eligible.len() + repeated.len()) as u64;
        self.counts.listed += listed_count;
        self.counts.without_state += candidates
            .values()
            .filter(|(_, facts)| facts.is_none_or(|facts| facts.state.is_none()))
            .count() as u64;
        self.counts.skipped_pending += listed_count - eligible_count;
        self.counts.eligible += eligible_count;
        self.counts.repeated += repeated.len() as u64;
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
            repeated,
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

    /// Notes which threads came and went since the last tick; a thread
    /// gone is forgotten (its id may be reused).
    fn follow(&mut self, candidates: &BTreeMap<u32, (u32, Option<ThreadFacts>)>) {
        let gone: Vec<u32> = self
            .listed
            .keys()
            .filter(|thread_id| !candidates.contains_key(thread_id))
            .copied()
            .collect();
        self.counts.threads_gone += gone.len() as u64;
        for thread_id in gone {
            self.history.remove(&thread_id);
        }
        for &thread_id in candidates.keys() {
            if self.seen.insert(thread_id) {
                self.counts.threads_seen += 1;
            }
        }
        self.listed = candidates
            .iter()
            .map(|(&thread_id, &(_, facts))| (thread_id, facts))
            .collect();
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
                    let facts = self.listed.get(&thread_id).copied().flatten();
                    self.awaited.insert((thread_id, tick), (asked, facts));
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

    /// Notes one record read, giving it its sample's facts when this
    /// sample asked for it (and the listing had facts); says whether it
    /// did. A thread-stack record of a listed thread is kept: a repeated
    /// sample of it copies the last one.
    pub fn note_record(&mut self, record: &mut TraceRecord) -> RecordOwner {
        let SourceFacts::ThreadStack {
            tag,
            target_thread_id,
            late,
            ..
        } = record.header.facts
        else {
            return self.other_record();
        };
        let (session, tick) = Self::tag_halves(tag);
        let asked = if session == self.session {
            self.awaited.remove(&(target_thread_id, tick))
        } else {
            None
        };
        let history = self.history.get_mut(&target_thread_id);
        if let Some((_, Some(asked))) = asked {
            // A thread no longer listed (it ended) keeps its facts; its CPU
            // time since the previous sample is then not known.
            let cpu_time = history.map_or(0, |history| {
                history.delivered = Some(Delivered {
                    asked,
                    stack_id: record.header.stack_id,
                    late,
                });
                history.sample_cpu(asked.cpu_time())
            });
            record.sample = Some(SampleFacts {
                state: asked.state,
                wait_reason: asked.wait_reason,
                cpu_time,
                repeated: false,
            });
        }
        if let Some(history) = self.history.get_mut(&target_thread_id) {
            history.last_record = Some(record.clone());
        }
        let Some(_) = asked else {
            return self.other_record();
        };
        self.counts.captured += 1;
        self.counts.late += u64::from(late);
        self.counts.awaited = self.awaited.len() as u64;
        RecordOwner::ThisSample(record.sample)
    }

    fn other_record(&mut self) -> RecordOwner {
        self.counts.other_records += 1;
        RecordOwner::Other
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
    use std::collections::VecDeque;

    use proptest::prelude::*;

    use super::*;
    use crate::thread_list::{ThreadState, WaitReason};

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

    /// The listing's time on the records' clock (any value).
    const TIME: u64 = 134_083_512_000_000_000;

    /// A record of `facts` whose one frame is `stack`.
    fn trace(facts: SourceFacts, stack: u64) -> TraceRecord {
        let mut record = crate::capture::writer::tests::record(1, facts, &[stack]);
        record.header.process_id = PROCESS;
        record
    }

    /// The thread-stack record of a request.
    fn record(tag: u64, thread_id: u32, late: bool) -> TraceRecord {
        stack_record(tag, thread_id, late, 0)
    }

    fn stack_record(tag: u64, thread_id: u32, late: bool, stack: u64) -> TraceRecord {
        trace(
            SourceFacts::ThreadStack {
                target_process_id: PROCESS,
                target_thread_id: thread_id,
                tag,
                delay: 0,
                late,
            },
            stack,
        )
    }

    fn ms(count: u64) -> Duration {
        Duration::from_millis(count)
    }

    /// Plans a tick at `now`, every id queued, every record back at once.
    fn answered_tick(sampler: &mut Sampler, now: Instant, listed: &[ProcessThread]) -> Vec<u32> {
        let plan = sampler.plan(now, TIME, listed);
        sampler.answered(
            &plan,
            &vec![ThreadRequestOutcome::Queued; plan.thread_ids.len()],
            now,
        );
        for &thread_id in &plan.thread_ids {
            assert_eq!(
                sampler.note_record(&mut record(plan.tag, thread_id, false)),
                RecordOwner::ThisSample(None)
            );
        }
        plan.thread_ids
    }

    #[test]
    fn ticks_fall_on_the_grid_and_passed_grid_points_count_as_missed() {
        let start = Instant::now();
        let mut sampler = sampler(8, start);
        assert_eq!(sampler.until_next_tick(start), Duration::ZERO);
        sampler.plan(start, TIME, &[]);
        assert_eq!(sampler.until_next_tick(start + ms(3)), ms(7));
        // Late by 25 ms: the points at 10 and 20 ms passed; the tick runs once.
        sampler.plan(start + ms(25), TIME, &[]);
        assert_eq!(sampler.until_next_tick(start + ms(25)), ms(5));
        sampler.plan(start + ms(31), TIME, &[]);
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
        let first = sampler.plan(start, TIME, &listed);
        let queued = [ThreadRequestOutcome::Queued; 2];
        sampler.answered(&first, &queued, start);
        sampler.note_record(&mut record(first.tag, 9, false));
        // Thread 7's APC has not run: held back for the 50 ms timeout.
        let second = sampler.plan(start + ms(10), TIME, &listed);
        assert_eq!(second.thread_ids, [9]);
        assert_eq!(sampler.counts().skipped_pending, 1);
        sampler.answered(&second, &queued[..1], start + ms(10));
        sampler.note_record(&mut record(second.tag, 9, false));
        let later = sampler.plan(start + ms(50), TIME, &listed);
        assert_eq!(
            later.thread_ids,
            [7, 9],
            "the timeout passed: 7 is asked for again"
        );
        // The first request's record comes late: still this sample's.
        assert_eq!(
            sampler.note_record(&mut record(first.tag, 7, true)),
            RecordOwner::ThisSample(None)
        );
        let counts = sampler.counts();
        assert_eq!((counts.captured, counts.late, counts.awaited), (3, 1, 0));
        assert!(!sampler.awaiting());
    }

    #[test]
    fn records_of_other_requests_and_sources_are_not_this_samples() {
        let start = Instant::now();
        let mut sampler = sampler(8, start);
        let plan = sampler.plan(start, TIME, &threads(PROCESS, &[7]));
        sampler.answered(&plan, &[ThreadRequestOutcome::Queued], start);
        let other_session = (u64::from(SESSION) + 1) << 32;
        let others = [
            record(other_session, 7, false),
            record(plan.tag + 1, 7, false),
            record(plan.tag, 8, false),
            trace(SourceFacts::OnDemand { tag: plan.tag }, 0),
        ];
        for mut other in others {
            assert_eq!(
                sampler.note_record(&mut other),
                RecordOwner::Other,
                "{other:?}"
            );
        }
        assert_eq!(
            sampler.note_record(&mut record(plan.tag, 7, false)),
            RecordOwner::ThisSample(None)
        );
        // A second record for the same request is not counted twice.
        assert_eq!(
            sampler.note_record(&mut record(plan.tag, 7, false)),
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
        let plan = sampler.plan(start, TIME, &threads(PROCESS, &[1, 2, 3]));
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
                let plan = sampler.plan(now, TIME, &listed);
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
                        prop_assert_eq!(sampler.note_record(&mut record(tag, thread_id, late)), RecordOwner::ThisSample(None));
                    } else {
                        still.push((tag, thread_id));
                    }
                }
                outstanding = still;
                now += ms(step.advance_ms);
                let counts = *sampler.counts();
                prop_assert_eq!(counts.listed, counts.eligible + counts.skipped_pending);
                prop_assert_eq!(counts.eligible, counts.requested + counts.repeated + counts.skipped_over_bound + counts.unsent);
                prop_assert_eq!(counts.requested, counts.queued + counts.refused());
                prop_assert_eq!(counts.queued, counts.captured + counts.awaited);
                prop_assert_eq!(counts.awaited, outstanding.len() as u64);
                prop_assert!(counts.late <= counts.captured);
            }
            let counts = sampler.counts();
            prop_assert_eq!(sampler.expected_ticks(last_tick), counts.ticks + counts.missed_ticks);
        }

        /// Against a model of threads that wait, run, are preempted, spin
        /// without switching, exit, and are switched to by the sampler's
        /// own APC, with the two cases that also show one switch-in: a wait
        /// that ends between the listing and the APC (the APC then
        /// interrupts the running thread, which waits again elsewhere), and
        /// a wait that holds the APC back (a guarded region: it runs when
        /// the wait ends). A repeated sample's stack is always what an APC
        /// queued at that listing would capture (the thread's stack; for a
        /// thread whose waits hold APCs back, where it takes them); a
        /// thread that only sleeps is not interrupted again once two of
        /// its captures were read; and each thread's samples carry all of
        /// its CPU time between its first and last sample.
        ///
        /// Not modelled: a wait satisfied in the very switch-in that runs
        /// the APC (docs/thread-stacks.md names that blind spot).
        #[test]
        fn a_thread_is_interrupted_only_when_it_ran(
            kinds in prop::collection::vec(0..4_u8, 1..8),
            steps in prop::collection::vec(
                (
                    prop::collection::vec(0..8_u8, 8),
                    prop::collection::vec(prop::bool::weighted(0.2), 8),
                    0..6_usize,
                    0..40_u64,
                ),
                1..40,
            ),
        ) {
            let start = Instant::now();
            let mut sampler = sampler(4, start);
            let mut threads: Vec<ModelThread> = kinds
                .iter()
                .enumerate()
                .map(|(index, &kind)| ModelThread::new(index, kind))
                .collect();
            let mut delivered: VecDeque<(u64, u32, u64)> = VecDeque::new();
            // Per thread: captures read since the last listing, and the
            // listings in a row that followed a read with no request
            // outstanding (each settles one capture).
            let mut read_since_listing: BTreeMap<u32, usize> = BTreeMap::new();
            let mut clean_settles: BTreeMap<u32, usize> = BTreeMap::new();
            let mut outstanding: BTreeMap<u32, usize> = BTreeMap::new();
            let mut sampled_cpu: BTreeMap<u32, (u64, u64, u64)> = BTreeMap::new();
            let mut fresh = 1000;
            let mut now = start;
            for (actions, races, reads, advance) in &steps {
                for (thread, &action) in threads.iter_mut().zip(actions) {
                    delivered.extend(thread.act(action, &mut fresh));
                }
                threads.retain(|thread| thread.alive);
                now += sampler.until_next_tick(now);
                for thread in &threads {
                    let busy = outstanding.get(&thread.id).copied().unwrap_or(0) > 0;
                    let read = read_since_listing.remove(&thread.id).unwrap_or(0) > 0;
                    let settles = clean_settles.entry(thread.id).or_default();
                    if busy {
                        *settles = 0;
                    } else if read {
                        *settles += 1;
                    }
                }
                let listed: Vec<ProcessThread> = threads.iter().map(ModelThread::listed).collect();
                let plan = sampler.plan(now, TIME, &listed);
                for repeat in &plan.repeated {
                    let SourceFacts::ThreadStack { target_thread_id, .. } = repeat.header.facts else {
                        panic!("a repeated sample of another source: {repeat:?}");
                    };
                    let thread = threads.iter().find(|thread| thread.id == target_thread_id).unwrap();
                    prop_assert_eq!(&repeat.frames[..], &[thread.observed()], "repeated a stale stack");
                    prop_assert_eq!(repeat.header.timestamp, TIME);
                    let facts = repeat.sample.unwrap();
                    prop_assert!(facts.repeated);
                    note_cpu(&mut sampled_cpu, thread.id, thread.cpu, facts.cpu_time);
                }
                for &thread_id in &plan.thread_ids {
                    let index = threads.iter().position(|thread| thread.id == thread_id).unwrap();
                    let thread = &mut threads[index];
                    prop_assert!(
                        !(thread.kind == SLEEPER
                            && clean_settles.get(&thread_id).copied().unwrap_or(0) >= 2),
                        "a sleeping thread whose stack was read twice was interrupted again"
                    );
                    thread.cpu_at_request.insert(plan.tag, thread.cpu);
                    if races[index] {
                        thread.wake_before_the_apc(&mut fresh);
                    }
                    if let Some(stack) = thread.deliver(plan.tag, &mut fresh) {
                        delivered.push_back((plan.tag, thread_id, stack));
                    }
                    *outstanding.entry(thread_id).or_default() += 1;
                }
                sampler.answered(&plan, &vec![ThreadRequestOutcome::Queued; plan.thread_ids.len()], now);
                for _ in 0..*reads {
                    let Some((tag, thread_id, stack)) = delivered.pop_front() else { break };
                    *outstanding.get_mut(&thread_id).unwrap() -= 1;
                    let mut read = stack_record(tag, thread_id, false, stack);
                    if let RecordOwner::ThisSample(Some(facts)) = sampler.note_record(&mut read) {
                        prop_assert_eq!(read.sample, Some(facts));
                        prop_assert!(!facts.repeated);
                        let cpu = threads.iter().find(|thread| thread.id == thread_id).map(|thread| thread.cpu_at_request.get(&tag).copied()).unwrap_or_default();
                        if let Some(cpu) = cpu {
                            note_cpu(&mut sampled_cpu, thread_id, cpu, facts.cpu_time);
                        }
                    }
                    *read_since_listing.entry(thread_id).or_default() += 1;
                }
                now += ms(*advance);
                let counts = *sampler.counts();
                prop_assert_eq!(counts.eligible, counts.requested + counts.repeated + counts.skipped_over_bound + counts.unsent);
            }
            for (thread_id, (first, last, carried)) in sampled_cpu {
                prop_assert_eq!(carried, last - first, "thread {}'s CPU time", thread_id);
            }
        }
    }

    const SLEEPER: u8 = 0;
    const WORKER: u8 = 1;
    const SPINNER: u8 = 2;
    /// Waits in a guarded region: an APC waits until the wait ends, then
    /// runs where the thread goes on (`post_wait`), and the thread waits
    /// again.
    const GUARDED: u8 = 3;

    /// A thread as the kernel keeps it: what the listing shows, and the
    /// stack it would show now.
    #[derive(Debug)]
    struct ModelThread {
        id: u32,
        kind: u8,
        state: ThreadState,
        wait_reason: WaitReason,
        switches: u32,
        cpu: u64,
        stack: u64,
        /// A guarded waiter's stack where it takes APCs, after its wait.
        post_wait: u64,
        /// A guarded waiter's requests whose APCs wait for its wait to end.
        held_back: Vec<u64>,
        /// Its wait ended after the listing; the APC finds it running.
        woke_before_the_apc: bool,
        alive: bool,
        /// Its CPU time at each request's listing, by the request's tag.
        cpu_at_request: BTreeMap<u64, u64>,
    }

    impl ModelThread {
        fn new(index: usize, kind: u8) -> Self {
            let index = u64::try_from(index).unwrap();
            Self {
                id: u32::try_from(index).unwrap() + 1,
                kind,
                state: if kind == SPINNER {
                    ThreadState::RUNNING
                } else {
                    ThreadState::WAITING
                },
                wait_reason: WaitReason(6),
                switches: 1,
                cpu: 0,
                stack: index,
                post_wait: 500 + index,
                held_back: Vec::new(),
                woke_before_the_apc: false,
                alive: true,
                cpu_at_request: BTreeMap::new(),
            }
        }

        /// What an APC queued now would capture.
        fn observed(&self) -> u64 {
            if self.kind == GUARDED {
                self.post_wait
            } else {
                self.stack
            }
        }

        /// One step of its own life; the captures of APCs it held back and
        /// now runs. A worker's switch-in may be charged no CPU time (time
        /// is charged per clock tick).
        fn act(&mut self, action: u8, fresh: &mut u64) -> Vec<(u64, u32, u64)> {
            *fresh += 1;
            match (self.kind, action) {
                (_, 7) if self.kind != SLEEPER && self.held_back.is_empty() => self.alive = false,
                (WORKER, 1..=3) => {
                    self.switches += 1;
                    self.cpu += u64::from(action - 1);
                    self.stack = *fresh;
                    self.state = ThreadState::WAITING;
                    self.wait_reason = WaitReason(if action == 3 { 13 } else { 6 });
                }
                (WORKER, 4) => {
                    self.switches += 1;
                    self.stack = *fresh;
                    self.state = ThreadState::READY;
                }
                (WORKER, 5) => {
                    self.switches += 1;
                    self.cpu += 1;
                    self.stack = *fresh;
                    self.state = ThreadState::RUNNING;
                }
                (SPINNER, _) => {
                    self.cpu += 1;
                    self.stack = *fresh;
                }
                (GUARDED, 1..=3) => {
                    // Its wait ends: switched to, it takes the APCs held
                    // back after it, then waits again where it was.
                    self.switches += 1;
                    let id = self.id;
                    let post_wait = self.post_wait;
                    return self
                        .held_back
                        .drain(..)
                        .map(|tag| (tag, id, post_wait))
                        .collect();
                }
                _ => {}
            }
            Vec::new()
        }

        /// A waiting worker's wait ends after the listing, before the APC
        /// comes: it runs (switched to), somewhere new.
        fn wake_before_the_apc(&mut self, fresh: &mut u64) {
            if self.kind == WORKER && self.state == ThreadState::WAITING {
                *fresh += 1;
                self.switches += 1;
                self.stack = *fresh;
                self.state = ThreadState::RUNNING;
                self.woke_before_the_apc = true;
            }
        }

        /// The sampler's APC: a waiting thread is switched to for it and
        /// waits again where it was; a ready one runs it when switched to,
        /// and runs on; a running one is interrupted (and, if its wait had
        /// just ended, then blocks again elsewhere, in the same wait
        /// reason); a guarded waiter holds it back. Returns the stack
        /// captured now, if any.
        fn deliver(&mut self, tag: u64, fresh: &mut u64) -> Option<u64> {
            if self.kind == GUARDED {
                self.held_back.push(tag);
                return None;
            }
            let captured = self.stack;
            if self.state == ThreadState::READY {
                self.switches += 1;
                self.state = ThreadState::RUNNING;
            } else if self.state == ThreadState::WAITING {
                self.switches += 1;
            } else if std::mem::take(&mut self.woke_before_the_apc) {
                *fresh += 1;
                self.stack = *fresh;
                self.state = ThreadState::WAITING;
            }
            Some(captured)
        }

        fn listed(&self) -> ProcessThread {
            ProcessThread {
                process_id: PROCESS,
                thread_id: self.id,
                facts: Some(ThreadFacts {
                    state: Some(self.state),
                    wait_reason: self.wait_reason,
                    context_switches: self.switches,
                    kernel_time: self.cpu,
                    user_time: 0,
                    create_time: 0,
                }),
            }
        }
    }

    /// Adds one sample's CPU time to `thread_id`'s account: (CPU time at
    /// its first sample, at its last, the samples' sum).
    fn note_cpu(
        accounts: &mut BTreeMap<u32, (u64, u64, u64)>,
        thread_id: u32,
        cpu: u64,
        carried: u64,
    ) {
        let account = accounts.entry(thread_id).or_insert((cpu, cpu, 0));
        account.1 = account.1.max(cpu);
        account.2 += carried;
    }
}
