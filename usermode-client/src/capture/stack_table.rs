//! Records grouped by stack id: what `kstack top` ranks, and what folded
//! stacks and flamegraphs are drawn from.

use std::{
    collections::{BTreeMap, HashMap},
    fmt::Write as _,
};

use kstack_abi::{RecordHeader, Source, SourceSet};
use serde_json::{Value, json};

use crate::{
    capture::trace::{LOST_STACK, TraceRecord, tracer_frames_note},
    clock::{cpu_time_text, system_time_text},
    naming::symbolizer::{Symbolizer, source_text},
    thread_list::{ThreadState, WaitReason},
};

/// When a stack was seen: its record's time, shard and sequence number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Sighting {
    /// System time, 100 ns units since 1601.
    pub timestamp: u64,
    /// The ring shard that kept the record.
    pub shard: u16,
    /// The record's sequence number in its shard (0: a capture-now record
    /// not kept).
    pub sequence: u64,
}

impl Sighting {
    const fn of(header: &RecordHeader) -> Self {
        Self {
            timestamp: header.timestamp,
            shard: header.shard,
            sequence: header.sequence,
        }
    }
}

/// What a record says about where its stack ran: the source, the process
/// and thread its callback ran in, and (a sample's) what that thread was
/// doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Origin {
    /// The source that captured it.
    pub source: Source,
    /// The record's process id.
    pub process_id: u32,
    /// The record's thread id.
    pub thread_id: u32,
    /// A sample's thread state when listed (`None`: not a sample, or
    /// listed without a state).
    pub state: Option<ThreadState>,
    /// A sample's wait reason, when its thread was waiting.
    pub wait_reason: Option<WaitReason>,
}

impl Origin {
    /// Where `record` says its stack ran.
    #[must_use]
    pub fn of(record: &TraceRecord) -> Self {
        let header = &record.header;
        let state = record.sample.and_then(|facts| facts.state);
        Self {
            source: header.facts.source(),
            process_id: header.process_id,
            thread_id: header.thread_id,
            state,
            wait_reason: record
                .sample
                .filter(|_| state == Some(ThreadState::WAITING))
                .map(|facts| facts.wait_reason),
        }
    }
}

/// The records of one stack from one [`Origin`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OriginCount {
    /// How many.
    pub records: u64,
    /// The CPU time their samples carry (100 ns units; 0 for records that
    /// are not samples).
    pub cpu_time: u64,
}

/// One frame of a stack as text shows it ([`StackSummary::frame_texts`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrameText {
    /// Its location, with ` at file:line` when the symbols have lines.
    pub line: String,
    /// The calls inlined there, `inlined function at file:line` each.
    pub inlined: Vec<String>,
    /// Whether it is a user-mode frame.
    pub user: bool,
}

/// One unique stack and what is known of its records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StackSummary {
    /// kstack's stack id.
    pub stack_id: u64,
    /// Its frames, most recent call first: the kernel part, then
    /// `user_frames` user frames.
    pub frames: Vec<u64>,
    /// How many of the frames, the last ones, are the user part.
    pub user_frames: usize,
    /// Records per source, in [`Source::ALL`] order.
    pub per_source: [u64; Source::COUNT],
    /// Records per source, process, thread and thread state (exporters
    /// label samples with them).
    pub per_origin: BTreeMap<Origin, OriginCount>,
    /// The earliest record.
    pub first: Sighting,
    /// The earliest record's process: the user frames are named after its
    /// modules at that record's time (see [`StackSummary::user_locations`]).
    pub first_process_id: u32,
    /// The latest record.
    pub last: Sighting,
    /// Whether its frames were lost with damaged bytes of a capture (see
    /// [`TraceRecord::stack_lost`]): it is shown as [`LOST_STACK`].
    pub lost: bool,
}

impl StackSummary {
    /// Its samples whose thread was running, and those whose thread was not
    /// (records without a thread state in neither).
    #[must_use]
    pub fn cpu_split(&self) -> (u64, u64) {
        let mut split = (0, 0);
        for (origin, count) in &self.per_origin {
            match origin.state.map(ThreadState::on_cpu) {
                Some(true) => split.0 += count.records,
                Some(false) => split.1 += count.records,
                None => {}
            }
        }
        split
    }

    /// The CPU time its samples carry, 100 ns units.
    #[must_use]
    pub fn cpu_time(&self) -> u64 {
        self.per_origin.values().map(|count| count.cpu_time).sum()
    }

    /// The kernel frames.
    #[must_use]
    pub fn kernel_frames(&self) -> &[u64] {
        &self.frames[..self.frames.len().saturating_sub(self.user_frames)]
    }

    /// The user frames.
    #[must_use]
    pub fn user_part(&self) -> &[u64] {
        &self.frames[self.kernel_frames().len()..]
    }

    /// The user frames named after the modules of the earliest record's
    /// process at its time (records of one stack share their user
    /// addresses, and a process loads an image at the same base as any
    /// other process of that boot, so another record's process names them
    /// the same but for an image only one of them has there).
    #[must_use]
    pub fn user_locations(&self, symbolizer: &Symbolizer) -> Vec<String> {
        self.user_part()
            .iter()
            .map(|&frame| self.user_location(symbolizer, frame))
            .collect()
    }

    /// One user frame, named as [`StackSummary::user_locations`] names it.
    #[must_use]
    pub fn user_location(&self, symbolizer: &Symbolizer, frame: u64) -> String {
        symbolizer
            .user_name_at(self.first_process_id, self.first.timestamp, frame)
            .unwrap_or_else(|| format!("{frame:#x}"))
    }

    /// The kernel frames shown: without kstack.sys's at the top, unless
    /// `symbolizer` shows them (see [`Symbolizer::hidden_tracer_frames`]).
    #[must_use]
    pub fn shown_kernel_frames(&self, symbolizer: &Symbolizer) -> &[u64] {
        let kernel = self.kernel_frames();
        &kernel[symbolizer.hidden_tracer_frames(kernel)..]
    }

    /// The frames shown: [`StackSummary::shown_kernel_frames`], then the
    /// user part.
    #[must_use]
    pub fn shown_frames(&self, symbolizer: &Symbolizer) -> &[u64] {
        &self.frames[symbolizer.hidden_tracer_frames(self.kernel_frames())..]
    }

    /// Every frame shown, outermost last, kernel frames named by the
    /// kernel's modules and user frames as
    /// [`StackSummary::user_locations`] names them.
    #[must_use]
    pub fn locations(&self, symbolizer: &Symbolizer) -> Vec<String> {
        if self.lost {
            return vec![LOST_STACK.to_owned()];
        }
        let mut locations = symbolizer.locations(self.shown_kernel_frames(symbolizer));
        locations.extend(self.user_locations(symbolizer));
        locations
    }

    /// Each frame shown, as text shows it: its location with ` at
    /// file:line`, the calls inlined there (`inlined function at
    /// file:line`, see `source_text`), and whether it is a user-mode frame.
    #[must_use]
    pub fn frame_texts(&self, symbolizer: &Symbolizer) -> Vec<FrameText> {
        if self.lost {
            return vec![FrameText {
                line: LOST_STACK.to_owned(),
                inlined: Vec::new(),
                user: false,
            }];
        }
        let kernel = self.shown_kernel_frames(symbolizer).len();
        let user = (self.first_process_id, self.first.timestamp);
        self.locations(symbolizer)
            .into_iter()
            .zip(self.shown_frames(symbolizer))
            .enumerate()
            .map(|(index, (location, &address))| {
                let process = (index >= kernel).then_some(user);
                let (at, inlined) = source_text(&symbolizer.source(process, address));
                FrameText {
                    line: format!("{location}{at}"),
                    inlined,
                    user: process.is_some(),
                }
            })
            .collect()
    }

    /// The calls a flame graph shows, most recent first, each with its
    /// frame's address: every frame shown as [`StackSummary::locations`]
    /// names it, preceded by the calls the symbols say were inlined at it
    /// (innermost first), each `module!function`.
    #[must_use]
    pub fn calls(&self, symbolizer: &Symbolizer) -> Vec<(u64, String)> {
        if self.lost {
            return vec![(0, LOST_STACK.to_owned())];
        }
        let kernel = self.shown_kernel_frames(symbolizer).len();
        let user = (self.first_process_id, self.first.timestamp);
        let mut calls = Vec::new();
        for (index, (&address, location)) in self
            .shown_frames(symbolizer)
            .iter()
            .zip(self.locations(symbolizer))
            .enumerate()
        {
            let process = (index >= kernel).then_some(user);
            if let Some(frame) = symbolizer.resolve_at(process, address)
                && let Some(function) = &frame.function
            {
                let inlined = &function.source[..function.source.len().saturating_sub(1)];
                for call in inlined {
                    if let Some(name) = &call.function {
                        calls.push((address, format!("{}!{name}", frame.module.name)));
                    }
                }
            }
            calls.push((address, location));
        }
        calls
    }

    /// Records with this stack.
    #[must_use]
    pub fn count(&self) -> u64 {
        self.per_source.iter().sum()
    }

    /// The sources that captured it.
    #[must_use]
    pub fn sources(&self) -> SourceSet {
        Source::ALL
            .into_iter()
            .filter(|source| self.per_source[source.index()] > 0)
            .collect()
    }
}

/// Unique stacks, by stack id.
#[derive(Clone, Debug, Default)]
pub struct StackTable {
    stacks: HashMap<u64, StackSummary>,
    records: u64,
}

impl StackTable {
    /// Counts one record (its frames are copied only when its stack is
    /// new).
    pub fn add(&mut self, record: &TraceRecord) {
        let header = &record.header;
        self.records += 1;
        let seen = Sighting::of(header);
        let summary = self
            .stacks
            .entry(header.stack_id)
            .or_insert_with(|| StackSummary {
                stack_id: header.stack_id,
                frames: record.frames.to_vec(),
                user_frames: usize::from(header.user_frame_count),
                per_source: [0; Source::COUNT],
                per_origin: BTreeMap::new(),
                first: seen,
                first_process_id: header.process_id,
                last: seen,
                lost: record.stack_lost(),
            });
        if summary.lost && !record.stack_lost() {
            // Another part of the capture stored the frames a damaged one
            // lost.
            summary.frames = record.frames.to_vec();
            summary.user_frames = usize::from(header.user_frame_count);
            summary.lost = false;
        }
        summary.per_source[header.facts.source().index()] += 1;
        let count = summary.per_origin.entry(Origin::of(record)).or_default();
        count.records += 1;
        count.cpu_time += record.sample.map_or(0, |facts| facts.cpu_time);
        if seen < summary.first {
            summary.first = seen;
            summary.first_process_id = header.process_id;
        }
        summary.last = summary.last.max(seen);
    }

    /// Records counted.
    #[must_use]
    pub const fn records(&self) -> u64 {
        self.records
    }

    /// Unique stacks.
    #[must_use]
    pub fn len(&self) -> usize {
        self.stacks.len()
    }

    /// Every unique stack, in no particular order.
    pub fn stacks(&self) -> impl Iterator<Item = &StackSummary> {
        self.stacks.values()
    }

    /// Whether no record was counted.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.stacks.is_empty()
    }

    /// The earliest and the latest record's system time (100 ns units
    /// since 1601); `None` when no record was counted.
    #[must_use]
    pub fn time_range(&self) -> Option<(u64, u64)> {
        let first = self
            .stacks
            .values()
            .map(|stack| stack.first.timestamp)
            .min()?;
        let last = self
            .stacks
            .values()
            .map(|stack| stack.last.timestamp)
            .max()?;
        Some((first, last))
    }

    /// `N records, M unique stacks`.
    #[must_use]
    pub fn summary(&self) -> String {
        format!(
            "{}, {}",
            counted(self.records, "record"),
            counted(self.stacks.len() as u64, "unique stack")
        )
    }

    /// Stacks by record count, most first; ties by stack id.
    #[must_use]
    pub fn ranked(&self) -> Vec<&StackSummary> {
        let mut ranked: Vec<_> = self.stacks.values().collect();
        ranked.sort_unstable_by(|a, b| b.count().cmp(&a.count()).then(a.stack_id.cmp(&b.stack_id)));
        ranked
    }

    /// Folded stacks, one line per stack, source and (for samples with a
    /// thread state) `on-cpu` or `off-cpu`, sorted: the source, that
    /// frame, then the frames outermost first, separated by `;`, a space
    /// and the record count. Flamegraph tools (inferno, FlameGraph) read
    /// this.
    #[must_use]
    pub fn folded(&self, symbolizer: &Symbolizer) -> Vec<String> {
        let mut lines = Vec::new();
        for summary in self.stacks.values() {
            let mut path = String::new();
            for (_, location) in summary.calls(symbolizer).iter().rev() {
                path.push(';');
                // `;` separates frames and the last space the count
                // (function names can hold both: `<A as B>::f`).
                path.push_str(&location.replace([';', ' '], "_"));
            }
            let mut groups: BTreeMap<(Source, Option<bool>), u64> = BTreeMap::new();
            for (origin, count) in &summary.per_origin {
                *groups
                    .entry((origin.source, origin.state.map(ThreadState::on_cpu)))
                    .or_default() += count.records;
            }
            for ((source, on_cpu), count) in groups {
                let state = match on_cpu {
                    None => "",
                    Some(true) => ";on-cpu",
                    Some(false) => ";off-cpu",
                };
                lines.push(format!("{}{state}{path} {count}", source.name()));
            }
        }
        lines.sort_unstable();
        lines
    }
}

/// How much of the table `kstack top` shows.
#[derive(Clone, Copy, Debug)]
pub struct TopLimits {
    /// Stacks shown.
    pub stacks: usize,
    /// Frames shown per stack.
    pub frames: usize,
}

/// The `kstack top` report.
#[must_use]
pub fn top_text(table: &StackTable, symbolizer: &Symbolizer, limits: TopLimits) -> String {
    let mut out = String::new();
    let ranked = table.ranked();
    let _ = writeln!(
        out,
        "{}{}",
        table.summary(),
        if ranked.len() > limits.stacks {
            format!(" (the {} most frequent shown)", limits.stacks)
        } else {
            String::new()
        }
    );
    for (rank, summary) in ranked.iter().take(limits.stacks).enumerate() {
        let count = summary.count();
        #[expect(clippy::cast_precision_loss, reason = "a percentage to one decimal")]
        let share = 100.0 * count as f64 / table.records().max(1) as f64;
        let _ = writeln!(
            out,
            "\n#{} {} ({share:.1}%) stack {:016x} sources {}\n    first {}\n    last  {}",
            rank + 1,
            counted(count, "record"),
            summary.stack_id,
            source_names(summary.sources()).join(","),
            sighting_text(summary.first),
            sighting_text(summary.last),
        );
        let (on_cpu, off_cpu) = summary.cpu_split();
        if on_cpu + off_cpu > 0 {
            #[expect(clippy::cast_precision_loss, reason = "a percentage to one decimal")]
            let on_share = 100.0 * on_cpu as f64 / (on_cpu + off_cpu) as f64;
            let _ = writeln!(
                out,
                "    on-CPU {on_cpu} ({on_share:.1}%), off-CPU {off_cpu} ({:.1}%), CPU time {}",
                100.0 - on_share,
                cpu_time_text(summary.cpu_time())
            );
        }
        if !summary.lost {
            out.push_str(&tracer_frames_note(
                symbolizer.hidden_tracer_frames(summary.kernel_frames()),
            ));
        }
        let frames = summary.frame_texts(symbolizer);
        let mut in_user = false;
        for (index, frame) in frames.iter().take(limits.frames).enumerate() {
            if frame.user && !in_user {
                out.push_str("  -- user mode --\n");
                in_user = true;
            }
            let _ = writeln!(out, "  {index:>2}  {}", frame.line);
            for call in &frame.inlined {
                let _ = writeln!(out, "        {call}");
            }
        }
        let hidden = frames.len().saturating_sub(limits.frames);
        if hidden > 0 {
            let _ = writeln!(out, "      ... {}", counted(hidden as u64, "more frame"));
        }
    }
    out
}

/// `kstack top --json`: one object per stack, most frequent first.
#[must_use]
pub fn top_json(table: &StackTable, symbolizer: &Symbolizer, limits: TopLimits) -> Vec<Value> {
    table
        .ranked()
        .into_iter()
        .take(limits.stacks)
        .map(|summary| {
            let per_source: serde_json::Map<String, Value> = Source::ALL
                .into_iter()
                .filter(|source| summary.per_source[source.index()] > 0)
                .map(|source| {
                    (
                        source.name().to_owned(),
                        json!(summary.per_source[source.index()]),
                    )
                })
                .collect();
            json!({
                "stack_id": format!("{:#018x}", summary.stack_id),
                "count": summary.count(),
                "sources": per_source,
                "first": sighting_json(summary.first),
                "last": sighting_json(summary.last),
                "tracer_frames": symbolizer.hidden_tracer_frames(summary.kernel_frames()),
                "frames": Symbolizer::hex(summary.shown_kernel_frames(symbolizer)),
                "locations": symbolizer.locations(summary.shown_kernel_frames(symbolizer)),
                "source_lines": symbolizer.sources_json(None, summary.shown_kernel_frames(symbolizer)),
                "user_frames": Symbolizer::hex(summary.user_part()),
                "user_locations": summary.user_locations(symbolizer),
                "user_source_lines": symbolizer.sources_json(
                    Some((summary.first_process_id, summary.first.timestamp)),
                    summary.user_part()
                ),
                "on_cpu": summary.cpu_split().0,
                "off_cpu": summary.cpu_split().1,
                "cpu_time_100ns": summary.cpu_time(),
            })
        })
        .collect()
}

/// `1 record`, `2 records`, `2 entries`.
#[must_use]
pub fn counted(count: u64, noun: &str) -> String {
    let consonant_y = noun
        .strip_suffix('y')
        .filter(|stem| !stem.ends_with(['a', 'e', 'i', 'o', 'u']));
    match (count, consonant_y) {
        (1, _) => format!("1 {noun}"),
        (_, Some(stem)) => format!("{count} {stem}ies"),
        _ => format!("{count} {noun}s"),
    }
}

fn source_names(sources: SourceSet) -> Vec<&'static str> {
    sources.iter().map(Source::name).collect()
}

fn sighting_text(seen: Sighting) -> String {
    let time = system_time_text(seen.timestamp).unwrap_or_else(|| "time unknown".to_owned());
    format!("{time} (#{} shard {})", seen.sequence, seen.shard)
}

fn sighting_json(seen: Sighting) -> Value {
    json!({
        "time": system_time_text(seen.timestamp),
        "shard": seen.shard,
        "sequence": seen.sequence,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use kstack_abi::SourceFacts;

    use super::*;
    use crate::{
        capture::{trace::TraceRecord, writer::tests::record},
        naming::{
            modules::{ModuleMap, tests::sample_map},
            symbolizer::tests::{DISPATCH, TableSource, with_dispatch},
        },
    };

    fn modules_only() -> Symbolizer {
        Symbolizer::new(sample_map()).showing_tracer_frames()
    }

    const LEAF: u64 = 0xFFFF_F801_2340_0010;
    const ROOT: u64 = 0xFFFF_F800_0000_0020;

    /// Names every address `f` with two calls inlined at it, as a PDB with
    /// line information does.
    pub struct Inlining;

    impl crate::naming::symbolizer::FunctionSource for Inlining {
        fn function(
            &mut self,
            _module: &crate::naming::modules::Module,
            _image: Option<&str>,
            _identity: Option<&crate::naming::identity::ImageIdentity>,
            _address: u64,
        ) -> Option<crate::naming::symbolizer::Function> {
            let frame = |function: &str, line| crate::naming::symbolizer::SourceFrame {
                function: Some(function.to_owned()),
                file: Some("f.rs".to_owned()),
                line: Some(line),
            };
            Some(crate::naming::symbolizer::Function {
                name: "f".to_owned(),
                offset: 0,
                source: vec![frame("innermost", 3), frame("middle", 2), frame("f", 1)],
            })
        }
    }

    #[test]
    fn flame_graph_calls_put_each_inlined_call_above_its_frame() {
        let symbolizer = Symbolizer::new(sample_map())
            .showing_tracer_frames()
            .with_functions(Box::new(Inlining));
        let table = table(&[record(1, SourceFacts::Timer, &[LEAF, ROOT])]);
        let stack = &table.ranked()[0];
        let calls: Vec<String> = stack
            .calls(&symbolizer)
            .into_iter()
            .map(|(_, name)| name)
            .collect();
        assert_eq!(
            calls,
            [
                "kstack.sys!innermost",
                "kstack.sys!middle",
                "kstack.sys!f+0x0",
                "ntoskrnl.exe!innermost",
                "ntoskrnl.exe!middle",
                "ntoskrnl.exe!f+0x0",
            ]
        );
        assert_eq!(
            table.folded(&symbolizer),
            [
                "timer;ntoskrnl.exe!f+0x0;ntoskrnl.exe!middle;ntoskrnl.exe!innermost;kstack.sys!f+0x0;\
              kstack.sys!middle;kstack.sys!innermost 1"
            ]
        );
    }

    fn table(records: &[TraceRecord]) -> StackTable {
        let mut table = StackTable::default();
        for record in records {
            table.add(record);
        }
        table
    }

    /// A record of `process_id` whose last frame is a user frame.
    fn with_user_frame(sequence: u64, process_id: u32) -> TraceRecord {
        let mut record = record(
            sequence,
            SourceFacts::OnDemand { tag: 0 },
            &[LEAF, 0x7FF6_0000_0010],
        );
        record.header.process_id = process_id;
        record.header.user_frame_count = 1;
        record
    }

    #[test]
    fn an_empty_table_says_so() {
        assert!(StackTable::default().is_empty());
        assert!(!table(&sample()).is_empty());
    }

    #[test]
    fn user_frames_are_named_after_the_earliest_records_process() {
        let mut processes = crate::naming::process_modules::ProcessModules::default();
        let module = |name: &str| crate::naming::modules::Module {
            base: 0x7FF6_0000_0000,
            size: 0x1000,
            name: name.to_owned(),
        };
        processes.add(100, [module("app.exe")]);
        processes.add(200, [module("other.exe")]);
        let symbolizer = modules_only().with_processes(processes);
        // Process 200's record arrives first but was taken later.
        let table = table(&[with_user_frame(5, 200), with_user_frame(3, 100)]);
        let stack = table.stacks().next().unwrap();
        assert_eq!(stack.count(), 2, "one stack");
        assert_eq!(stack.first_process_id, 100);
        assert_eq!(stack.user_locations(&symbolizer), ["app.exe+0x10"]);
        assert_eq!(
            stack.locations(&symbolizer),
            ["kstack.sys+0x10", "app.exe+0x10"]
        );
        assert!(
            top_text(
                &table,
                &symbolizer,
                TopLimits {
                    stacks: 1,
                    frames: 8
                }
            )
            .contains("  -- user mode --\n   1  app.exe+0x10\n")
        );
        assert_eq!(
            table.folded(&symbolizer),
            ["ondemand;app.exe+0x10;kstack.sys+0x10 2"]
        );
    }

    fn sample() -> Vec<TraceRecord> {
        vec![
            record(1, SourceFacts::Timer, &[LEAF, ROOT]),
            record(2, SourceFacts::OnDemand { tag: 1 }, &[0x42]),
            record(3, SourceFacts::Timer, &[LEAF, ROOT]),
            record(4, SourceFacts::OnDemand { tag: 2 }, &[LEAF, ROOT]),
        ]
    }

    #[test]
    fn a_lost_stack_is_shown_lost_until_a_record_brings_its_frames() {
        let frames = [0xFFFF_F800_0000_1000, 0xFFFF_F800_0000_2000];
        let whole = record(2, SourceFacts::Timer, &frames);
        let mut lost = whole.clone();
        lost.frames = [].into();
        lost.header.flags = kstack_abi::RecordFlags::STACK_BY_ID;
        assert!(lost.stack_lost());
        let symbolizer = modules_only();
        let mut table = StackTable::default();
        table.add(&lost);
        let summary = table.stacks().next().unwrap().clone();
        assert_eq!(summary.locations(&symbolizer), [LOST_STACK]);
        // A later part of the capture stores the frames again.
        table.add(&whole);
        let summary = table.stacks().next().unwrap();
        assert!(!summary.lost);
        assert_eq!(summary.count(), 2);
        assert_eq!(summary.frames, frames);
    }

    #[test]
    fn stacks_are_counted_per_source_with_first_and_last_seen() {
        let table = table(&sample());
        assert_eq!((table.records(), table.len()), (4, 2));
        let ranked = table.ranked();
        let top = ranked[0];
        assert_eq!(top.frames, [LEAF, ROOT]);
        assert_eq!(top.count(), 3);
        assert_eq!(top.per_source[Source::Timer.index()], 2);
        assert_eq!(top.per_source[Source::OnDemand.index()], 1);
        assert_eq!(
            top.sources(),
            SourceSet::EMPTY.with(Source::Timer).with(Source::OnDemand)
        );
        assert_eq!((top.first.sequence, top.last.sequence), (1, 4));
        assert_eq!(ranked[1].count(), 1);
    }

    #[test]
    fn stacks_are_counted_per_source_process_and_thread() {
        let mut records = sample();
        records[2].header.thread_id = 9;
        let table = table(&records);
        let origin = |source, thread_id| Origin {
            source,
            process_id: 4,
            thread_id,
            state: None,
            wait_reason: None,
        };
        let one = OriginCount {
            records: 1,
            cpu_time: 0,
        };
        assert_eq!(
            table.ranked()[0].per_origin,
            BTreeMap::from([
                (origin(Source::Timer, 8), one),
                (origin(Source::Timer, 9), one),
                (origin(Source::OnDemand, 8), one),
            ])
        );
    }

    #[test]
    fn the_time_range_spans_every_record() {
        assert_eq!(StackTable::default().time_range(), None);
        let records = sample();
        let (first, last) = table(&records).time_range().unwrap();
        assert_eq!(first, records[0].header.timestamp);
        assert_eq!(last, records[3].header.timestamp);
    }

    #[test]
    fn first_and_last_follow_time_not_arrival_order() {
        let mut records = sample();
        records.swap(0, 3);
        let table = table(&records);
        let top = table.ranked()[0];
        assert_eq!((top.first.sequence, top.last.sequence), (1, 4));
    }

    #[test]
    fn folded_lines_put_the_source_and_the_outermost_frame_first() {
        let folded = table(&sample()).folded(&modules_only());
        assert_eq!(
            folded,
            [
                "ondemand;0x42 1",
                "ondemand;ntoskrnl.exe+0x20;kstack.sys+0x10 1",
                "timer;ntoskrnl.exe+0x20;kstack.sys+0x10 2",
            ]
        );
    }

    #[test]
    fn separators_in_module_names_do_not_break_folded_lines() {
        let modules = ModuleMap::new([crate::naming::modules::Module {
            base: 0x1000,
            size: 0x1000,
            name: "odd;name here.sys".to_owned(),
        }]);
        let source = TableSource {
            functions: vec![(0x1800, "<a::B as c::D>::f;g")],
            asked: std::rc::Rc::default(),
        };
        let symbolizer = Symbolizer::new(modules).with_functions(Box::new(source));
        let folded = table(&[record(1, SourceFacts::Timer, &[0x1810, 0x1010])]).folded(&symbolizer);
        assert_eq!(
            folded,
            ["timer;odd_name_here.sys+0x10;odd_name_here.sys!<a::B_as_c::D>::f_g+0x10 1"]
        );
    }

    #[test]
    fn top_limits_stacks_and_frames() {
        let text = top_text(
            &table(&sample()),
            &modules_only(),
            TopLimits {
                stacks: 1,
                frames: 1,
            },
        );
        assert!(
            text.starts_with("4 records, 2 unique stacks (the 1 most frequent shown)\n"),
            "{text}"
        );
        assert!(text.contains("#1 3 records (75.0%)"), "{text}");
        assert!(text.contains("sources timer,ondemand"), "{text}");
        assert!(
            text.contains("   0  kstack.sys+0x10\n      ... 1 more frame\n"),
            "{text}"
        );
        assert!(!text.contains("#2"), "{text}");
    }

    #[test]
    fn top_names_functions_when_symbols_know_them() {
        let (symbolizer, _) = with_dispatch();
        let records = [
            record(1, SourceFacts::Timer, &[DISPATCH + 0x20, ROOT]),
            record(2, SourceFacts::Timer, &[DISPATCH + 0x20, ROOT]),
        ];
        let limits = TopLimits {
            stacks: 5,
            frames: 5,
        };
        let text = top_text(&table(&records), &symbolizer, limits);
        assert!(
            text.contains(
                "   0  kstack.sys!kstack::dispatch::dispatch+0x20\n   1  ntoskrnl.exe+0x20\n"
            ),
            "{text}"
        );
        let json = top_json(&table(&records), &symbolizer, limits);
        assert_eq!(
            json[0]["locations"],
            json!([
                "kstack.sys!kstack::dispatch::dispatch+0x20",
                "ntoskrnl.exe+0x20"
            ])
        );
        assert_eq!(
            table(&records).folded(&symbolizer),
            ["timer;ntoskrnl.exe+0x20;kstack.sys!kstack::dispatch::dispatch+0x20 2"]
        );
    }
}
