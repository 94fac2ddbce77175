//! What `kstack top --live` shows, as pure state: records go in with
//! [`LiveTop::apply`], time moves on with [`LiveTop::tick`] (the caller's
//! clock, so tests choose it), and [`LiveTop::rows`] and
//! [`LiveTop::status_line`] say what to draw.

use std::{
    cmp::Ordering,
    collections::{HashMap, VecDeque},
    time::{Duration, Instant},
};

use kstack_abi::{Source, SourceSet, StatusResponse};

use crate::capture::{
    stack_table::{Origin, StackSummary, StackTable},
    trace::TraceRecord,
};

/// What rows are ordered by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortKey {
    /// Events per second over the last refresh interval, highest first.
    Rate,
    /// Records since the view started, most first.
    Count,
    /// Source (in [`Source::ALL`] order), then count.
    Source,
}

impl SortKey {
    /// The key's name, as the view shows it.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Rate => "rate",
            Self::Count => "count",
            Self::Source => "source",
        }
    }
}

/// Which records the rows count: the sources, and one process or all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Filter {
    /// Sources counted.
    pub sources: SourceSet,
    /// The only process counted (the record's process id); `None`: all.
    pub process_id: Option<u32>,
}

impl Default for Filter {
    fn default() -> Self {
        Self {
            sources: SourceSet::ALL,
            process_id: None,
        }
    }
}

impl Filter {
    /// Whether records from `origin` are counted.
    #[must_use]
    pub fn admits(&self, origin: &Origin) -> bool {
        self.sources.contains(origin.source)
            && self.process_id.is_none_or(|id| id == origin.process_id)
    }

    /// `sources all, pid all`, `sources timer,ondemand, pid 4`.
    #[must_use]
    pub fn describe(&self) -> String {
        let sources = if self.sources == SourceSet::ALL {
            "all".to_owned()
        } else if self.sources == SourceSet::EMPTY {
            "none".to_owned()
        } else {
            self.sources
                .iter()
                .map(Source::name)
                .collect::<Vec<_>>()
                .join(",")
        };
        let process = self
            .process_id
            .map_or_else(|| "all".to_owned(), |id| id.to_string());
        format!("sources {sources}, pid {process}")
    }

    /// The next source filter a key press steps to: all, then each source
    /// alone in [`Source::ALL`] order, then all again. A set of several
    /// sources (from `--source`) steps to all.
    #[must_use]
    pub fn next_source(self) -> Self {
        let alone = |source: Source| SourceSet::EMPTY.with(source);
        let sources = if self.sources == SourceSet::ALL {
            alone(Source::ALL[0])
        } else {
            Source::ALL
                .iter()
                .position(|&source| self.sources == alone(source))
                .and_then(|index| Source::ALL.get(index + 1))
                .map_or(SourceSet::ALL, |&next| alone(next))
        };
        Self { sources, ..self }
    }
}

/// One row of the view: one stack as one source captured it.
#[derive(Clone, Debug)]
pub struct Row<'a> {
    /// The stack (its id and frames; its counts are not filtered).
    pub stack: &'a StackSummary,
    /// The source this row counts.
    pub source: Source,
    /// Records the filter admits, since the view started.
    pub count: u64,
    /// Events per second over the last refresh interval.
    pub rate: f64,
    /// Events per second over the rate window (the last few intervals).
    pub window_rate: f64,
}

/// The driver's counters as the status line shows them: ring fill, drops
/// and reads from its latest status, and drops since the view started.
#[derive(Clone, Copy, Debug, Default)]
pub struct DriverCounters {
    latest: Option<Reported>,
    dropped_at_start: u64,
}

#[derive(Clone, Copy, Debug)]
struct Reported {
    ring_used: u32,
    ring_used_bytes: u32,
    ring_capacity: u32,
    dropped: u64,
    read: u64,
}

impl DriverCounters {
    /// Takes the counters of a status reply.
    pub const fn update(&mut self, status: &StatusResponse) {
        if self.latest.is_none() {
            self.dropped_at_start = status.dropped;
        }
        self.latest = Some(Reported {
            ring_used: status.ring_used,
            ring_used_bytes: status.ring_used_bytes,
            ring_capacity: status.ring_capacity,
            dropped: status.dropped,
            read: status.read,
        });
    }

    /// `ring 3 records in 1/8 KiB, 5 dropped (2 since start), 4 read`.
    #[must_use]
    pub fn text(&self) -> String {
        self.latest.map_or_else(
            || "no status from the driver yet".to_owned(),
            |latest| {
                format!(
                    "ring {} records in {}/{} KiB, {} dropped ({} since start), {} read",
                    latest.ring_used,
                    latest.ring_used_bytes.div_ceil(1024),
                    latest.ring_capacity / 1024,
                    latest.dropped,
                    latest.dropped.saturating_sub(self.dropped_at_start),
                    latest.read
                )
            },
        )
    }
}

/// Records seen between two ticks.
#[derive(Clone, Debug)]
struct Interval {
    start: Instant,
    end: Instant,
    table: StackTable,
}

impl Interval {
    fn seconds(&self) -> f64 {
        (self.end - self.start).as_secs_f64()
    }
}

/// The counts rows are drawn from, as of the last tick.
#[derive(Clone, Debug)]
struct Tally {
    /// Every record up to the last tick.
    total: StackTable,
    /// The intervals that end within the rate window of the last tick,
    /// oldest first.
    recent: VecDeque<Interval>,
}

/// The live view's state.
#[derive(Debug)]
pub struct LiveTop {
    window: Duration,
    sort: SortKey,
    filter: Filter,
    tally: Tally,
    /// Records applied since the last tick: counted at the next one, so
    /// the rows change once per refresh, not with every read.
    pending: Vec<TraceRecord>,
    last_tick: Instant,
    /// The tally at the moment of the pause, while paused.
    frozen: Option<Tally>,
    driver: DriverCounters,
}

impl LiveTop {
    /// A view starting at `started` with no records, averaging rates over
    /// `window`, counting what `filter` admits.
    #[must_use]
    pub fn new(started: Instant, window: Duration, filter: Filter) -> Self {
        Self {
            window,
            sort: SortKey::Rate,
            filter,
            tally: Tally {
                total: StackTable::default(),
                recent: VecDeque::new(),
            },
            pending: Vec::new(),
            last_tick: started,
            frozen: None,
            driver: DriverCounters::default(),
        }
    }

    /// Takes records read from the driver; they count from the next tick.
    pub fn apply(&mut self, records: &[TraceRecord]) {
        self.pending.extend_from_slice(records);
    }

    /// Ends the interval since the last tick at `now`: its records join the
    /// totals and the rates. A tick no later than the last closes nothing.
    pub fn tick(&mut self, now: Instant) {
        if now <= self.last_tick {
            return;
        }
        let mut table = StackTable::default();
        for record in self.pending.drain(..) {
            self.tally.total.add(&record);
            table.add(&record);
        }
        self.tally.recent.push_back(Interval {
            start: self.last_tick,
            end: now,
            table,
        });
        self.last_tick = now;
        if let Some(oldest_kept_end) = now.checked_sub(self.window) {
            while self
                .tally
                .recent
                .front()
                .is_some_and(|interval| interval.end <= oldest_kept_end)
            {
                self.tally.recent.pop_front();
            }
        }
    }

    /// Takes the driver's counters from its status reply.
    pub const fn set_driver_status(&mut self, status: &StatusResponse) {
        self.driver.update(status);
    }

    /// Orders rows by `key`.
    pub const fn sort_by(&mut self, key: SortKey) {
        self.sort = key;
    }

    /// What rows are ordered by.
    #[must_use]
    pub const fn sort(&self) -> SortKey {
        self.sort
    }

    /// Counts only what `filter` admits (records already in are
    /// re-counted: nothing is discarded).
    pub const fn set_filter(&mut self, filter: Filter) {
        self.filter = filter;
    }

    /// Which records the rows count.
    #[must_use]
    pub const fn filter(&self) -> Filter {
        self.filter
    }

    /// Freezes the rows as they are, or lets them move again. Records are
    /// still read and counted meanwhile, and show on resuming; sorting and
    /// filtering apply to the frozen rows too.
    pub fn toggle_pause(&mut self) {
        self.frozen = match self.frozen.take() {
            Some(_) => None,
            None => Some(self.tally.clone()),
        };
    }

    /// Whether the rows are frozen.
    #[must_use]
    pub const fn is_paused(&self) -> bool {
        self.frozen.is_some()
    }

    /// The rows to show, in sort order: one per stack and source that the
    /// filter admits records of.
    #[must_use]
    pub fn rows(&self) -> Vec<Row<'_>> {
        let tally = self.frozen.as_ref().unwrap_or(&self.tally);
        let (last, window) = self.rates(tally);
        let mut rows = Vec::new();
        for stack in tally.total.stacks() {
            for (source, count) in self.admitted(stack) {
                let key = (stack.stack_id, source);
                rows.push(Row {
                    stack,
                    source,
                    count,
                    rate: last.get(&key).copied().unwrap_or(0.0),
                    window_rate: window.get(&key).copied().unwrap_or(0.0),
                });
            }
        }
        rows.sort_unstable_by(|a, b| self.order(a, b));
        rows
    }

    /// Ring fill, drops and reads as the driver last reported them, and
    /// what this view received.
    #[must_use]
    pub fn status_line(&self) -> String {
        let paused = if self.is_paused() { " | PAUSED" } else { "" };
        format!(
            "{} | here: {}{paused}",
            self.driver.text(),
            self.tally.total.summary()
        )
    }

    /// Records of `stack` the filter admits, per source that has any.
    fn admitted(&self, stack: &StackSummary) -> impl Iterator<Item = (Source, u64)> {
        let mut per_source = [0; Source::COUNT];
        for (origin, count) in &stack.per_origin {
            if self.filter.admits(origin) {
                per_source[origin.source.index()] += count.records;
            }
        }
        Source::ALL
            .into_iter()
            .map(move |source| (source, per_source[source.index()]))
            .filter(|&(_, count)| count > 0)
    }

    /// Events per second per stack and source: over the last interval, and
    /// over the intervals in the window.
    fn rates(&self, tally: &Tally) -> (RateMap, RateMap) {
        let per_second = |intervals: &[&Interval]| {
            let seconds: f64 = intervals.iter().map(|interval| interval.seconds()).sum();
            let mut counts = HashMap::<_, u64>::new();
            for interval in intervals {
                for stack in interval.table.stacks() {
                    for (source, count) in self.admitted(stack) {
                        *counts.entry((stack.stack_id, source)).or_default() += count;
                    }
                }
            }
            #[expect(clippy::cast_precision_loss, reason = "a rate to one decimal")]
            counts
                .into_iter()
                .map(|(key, count)| (key, count as f64 / seconds))
                .collect::<RateMap>()
        };
        let window: Vec<_> = tally.recent.iter().collect();
        (
            per_second(&window[window.len().saturating_sub(1)..]),
            per_second(&window),
        )
    }

    fn order(&self, a: &Row<'_>, b: &Row<'_>) -> Ordering {
        let by_rate = || {
            b.rate
                .total_cmp(&a.rate)
                .then(b.window_rate.total_cmp(&a.window_rate))
        };
        let by_count = || b.count.cmp(&a.count);
        let first = match self.sort {
            SortKey::Rate => by_rate().then_with(by_count),
            SortKey::Count => by_count().then_with(by_rate),
            SortKey::Source => a.source.index().cmp(&b.source.index()).then_with(by_count),
        };
        first
            .then(a.stack.stack_id.cmp(&b.stack.stack_id))
            .then(a.source.index().cmp(&b.source.index()))
    }
}

/// Events per second by stack id and source.
type RateMap = HashMap<(u64, Source), f64>;

#[cfg(test)]
pub(crate) mod tests {
    use kstack_abi::SourceFacts;

    use super::*;
    use crate::{capture::writer::tests::record, device::test_support::sample_status};

    pub const LEAF: u64 = 0xFFFF_F801_2340_0010;
    pub const ROOT: u64 = 0xFFFF_F800_0000_0020;
    const OTHER: u64 = 0x42;

    pub fn timer(frames: &[u64]) -> TraceRecord {
        record(1, SourceFacts::Timer, frames)
    }

    pub fn ondemand(frames: &[u64]) -> TraceRecord {
        record(1, SourceFacts::OnDemand { tag: 1 }, frames)
    }

    fn in_process(process_id: u32, mut record: TraceRecord) -> TraceRecord {
        record.header.process_id = process_id;
        record
    }

    fn repeated(record: &TraceRecord, times: usize) -> Vec<TraceRecord> {
        vec![record.clone(); times]
    }

    fn seconds(value: f64) -> Duration {
        Duration::from_secs_f64(value)
    }

    /// A view started at `start` with a 3 s window, counting everything.
    pub fn view(start: Instant) -> LiveTop {
        LiveTop::new(start, seconds(3.0), Filter::default())
    }

    /// (stack's leaf frame, source, count, rate, window rate) per row.
    fn summary(model: &LiveTop) -> Vec<(u64, Source, u64, f64, f64)> {
        model
            .rows()
            .iter()
            .map(|row| {
                (
                    row.stack.frames[0],
                    row.source,
                    row.count,
                    row.rate,
                    row.window_rate,
                )
            })
            .collect()
    }

    #[test]
    fn records_count_per_stack_and_source_from_the_next_tick() {
        let start = Instant::now();
        let mut model = view(start);
        model.apply(&repeated(&timer(&[LEAF, ROOT]), 3));
        model.apply(&repeated(&ondemand(&[OTHER]), 2));
        model.apply(&[ondemand(&[LEAF, ROOT])]);
        assert!(model.rows().is_empty(), "nothing shows before a tick");
        model.tick(start);
        assert!(
            model.rows().is_empty(),
            "a tick at the start closes nothing"
        );
        model.tick(start + seconds(1.0));
        assert_eq!(
            summary(&model),
            [
                (LEAF, Source::Timer, 3, 3.0, 3.0),
                (OTHER, Source::OnDemand, 2, 2.0, 2.0),
                (LEAF, Source::OnDemand, 1, 1.0, 1.0),
            ]
        );
        assert_eq!(model.rows()[0].stack.frames, [LEAF, ROOT]);
    }

    #[test]
    fn rates_cover_the_last_interval_and_the_window() {
        let start = Instant::now();
        let at = |value| start + seconds(value);
        let mut model = view(start);
        let stack = timer(&[LEAF, ROOT]);
        let rates = |model: &LiveTop| {
            let rows = model.rows();
            (rows[0].count, rows[0].rate, rows[0].window_rate)
        };
        model.apply(&repeated(&stack, 4));
        model.tick(at(1.0));
        assert_eq!(rates(&model), (4, 4.0, 4.0));
        model.apply(&repeated(&stack, 2));
        model.tick(at(2.0));
        assert_eq!(rates(&model), (6, 2.0, 3.0), "6 records over 2 s");
        model.tick(at(3.0));
        assert_eq!(rates(&model), (6, 0.0, 2.0), "an idle interval");
        model.apply(&repeated(&stack, 3));
        model.tick(at(4.0));
        assert_eq!(
            rates(&model),
            (9, 3.0, 5.0 / 3.0),
            "the first interval left the 3 s window: 2 + 0 + 3 records over 3 s"
        );
        model.apply(std::slice::from_ref(&stack));
        model.tick(at(4.5));
        assert_eq!(
            rates(&model),
            (10, 2.0, 6.0 / 3.5),
            "1 record in half a second; the window keeps whole intervals ending \
             in its 3 s: 2 + 0 + 3 + 1 records over 3.5 s"
        );
    }

    #[test]
    fn rows_sort_by_rate_count_or_source() {
        let start = Instant::now();
        let mut model = view(start);
        // Many early timer records on one stack, a steady trickle of
        // capture-now records on another.
        model.apply(&repeated(&timer(&[LEAF, ROOT]), 10));
        model.apply(&[ondemand(&[OTHER])]);
        model.tick(start + seconds(1.0));
        model.apply(&repeated(&ondemand(&[OTHER]), 3));
        model.apply(&[record(
            1,
            SourceFacts::Registry { notify_class: 1 },
            &[ROOT],
        )]);
        model.tick(start + seconds(2.0));
        let order = |model: &LiveTop| -> Vec<_> {
            model
                .rows()
                .iter()
                .map(|row| (row.source, row.count))
                .collect()
        };
        assert_eq!(model.sort(), SortKey::Rate, "the default");
        assert_eq!(
            order(&model),
            [
                (Source::OnDemand, 4),
                (Source::Registry, 1),
                (Source::Timer, 10)
            ]
        );
        model.sort_by(SortKey::Count);
        assert_eq!(
            order(&model),
            [
                (Source::Timer, 10),
                (Source::OnDemand, 4),
                (Source::Registry, 1)
            ]
        );
        model.sort_by(SortKey::Source);
        assert_eq!(
            order(&model),
            [
                (Source::Registry, 1),
                (Source::Timer, 10),
                (Source::OnDemand, 4)
            ]
        );
    }

    #[test]
    fn the_filter_counts_only_its_sources_and_process() {
        let start = Instant::now();
        let mut model = view(start);
        model.apply(&[
            in_process(4, timer(&[LEAF, ROOT])),
            in_process(7, timer(&[LEAF, ROOT])),
            in_process(7, timer(&[LEAF, ROOT])),
            in_process(7, ondemand(&[LEAF, ROOT])),
            in_process(4, ondemand(&[OTHER])),
        ]);
        model.tick(start + seconds(1.0));
        let shown = |model: &LiveTop| -> Vec<_> {
            model
                .rows()
                .iter()
                .map(|row| (row.stack.frames[0], row.source, row.count, row.rate))
                .collect()
        };
        model.set_filter(Filter {
            sources: SourceSet::EMPTY.with(Source::Timer),
            process_id: None,
        });
        assert_eq!(shown(&model), [(LEAF, Source::Timer, 3, 3.0)]);
        model.set_filter(Filter {
            sources: SourceSet::ALL,
            process_id: Some(7),
        });
        assert_eq!(
            shown(&model),
            [
                (LEAF, Source::Timer, 2, 2.0),
                (LEAF, Source::OnDemand, 1, 1.0)
            ]
        );
        model.set_filter(Filter {
            sources: SourceSet::EMPTY.with(Source::OnDemand),
            process_id: Some(4),
        });
        assert_eq!(shown(&model), [(OTHER, Source::OnDemand, 1, 1.0)]);
        model.set_filter(Filter::default());
        assert_eq!(shown(&model).len(), 3, "nothing was discarded");
    }

    #[test]
    fn the_source_filter_steps_through_each_source_alone() {
        let mut filter = Filter {
            sources: SourceSet::ALL,
            process_id: Some(4),
        };
        let mut seen = Vec::new();
        for _ in 0..=Source::COUNT {
            filter = filter.next_source();
            seen.push(filter.sources);
            assert_eq!(filter.process_id, Some(4), "the process filter stays");
        }
        let mut expected: Vec<_> = Source::ALL
            .iter()
            .map(|&source| SourceSet::EMPTY.with(source))
            .collect();
        expected.push(SourceSet::ALL);
        assert_eq!(seen, expected);
        let several = Filter {
            sources: SourceSet::EMPTY.with(Source::Timer).with(Source::ImageLoad),
            process_id: None,
        };
        assert_eq!(several.next_source(), Filter::default());
        assert_eq!(several.describe(), "sources image,timer, pid all");
        assert_eq!(
            Filter {
                process_id: Some(4),
                ..Filter::default()
            }
            .describe(),
            "sources all, pid 4"
        );
    }

    #[test]
    fn a_pause_freezes_the_rows_until_resumed() {
        let start = Instant::now();
        let mut model = view(start);
        model.apply(&repeated(&timer(&[LEAF, ROOT]), 2));
        model.tick(start + seconds(1.0));
        model.toggle_pause();
        assert!(model.is_paused());
        model.apply(&repeated(&ondemand(&[OTHER]), 5));
        model.tick(start + seconds(2.0));
        let frozen = [(LEAF, Source::Timer, 2, 2.0, 2.0)];
        assert_eq!(summary(&model), frozen);
        model.sort_by(SortKey::Source);
        assert_eq!(summary(&model), frozen, "sorting frozen rows keeps them");
        assert!(
            model
                .status_line()
                .contains("here: 7 records, 2 unique stacks"),
            "reading went on: {}",
            model.status_line()
        );
        model.toggle_pause();
        assert!(!model.is_paused());
        assert_eq!(
            summary(&model),
            [
                (LEAF, Source::Timer, 2, 0.0, 1.0),
                (OTHER, Source::OnDemand, 5, 5.0, 2.5),
            ]
        );
    }

    #[test]
    fn the_status_line_shows_the_ring_drops_reads_and_the_pause() {
        let mut model = view(Instant::now());
        assert_eq!(
            model.status_line(),
            "no status from the driver yet | here: 0 records, 0 unique stacks"
        );
        let mut status = sample_status();
        status.dropped = 5;
        model.set_driver_status(&status);
        status.ring_used = 90;
        status.ring_used_bytes = 90 * 80;
        status.dropped = 7;
        status.read = 120;
        model.set_driver_status(&status);
        assert_eq!(
            model.status_line(),
            "ring 90 records in 8/8 KiB, 7 dropped (2 since start), 120 read | here: 0 records, 0 unique stacks"
        );
        model.toggle_pause();
        assert!(model.status_line().ends_with(" | PAUSED"));
    }
}
