//! pprof profiles (profile.proto, gzipped), what `go tool pprof`,
//! Pyroscope and Grafana read: a sample per stack and where it ran
//! (source, process, thread, and a `kstack sample` thread's state and wait
//! reason) with two values, its record count (`samples`) and the CPU time
//! its samples carry (`cpu`, nanoseconds), a location per frame address in
//! its module's mapping, and a function per name.

use std::{
    collections::HashMap,
    io::{self, Write},
};

use flate2::{Compression, write::GzEncoder};
use prost::Message as _;

use crate::{
    capture::{
        stack_table::{StackSummary, StackTable},
        trace::LOST_STACK,
    },
    clock::system_time_unix_nanos,
    naming::{
        modules::Module,
        symbolizer::{ResolvedFrame, Symbolizer},
    },
};

/// The messages of profile.proto (package perftools.profiles, in
/// google/pprof) that kstack writes, with that file's field numbers. Only
/// the fields kstack sets are declared: proto3 readers take the others as
/// their defaults.
mod proto {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Profile {
        #[prost(message, repeated, tag = "1")]
        pub sample_type: Vec<ValueType>,
        #[prost(message, repeated, tag = "2")]
        pub sample: Vec<Sample>,
        #[prost(message, repeated, tag = "3")]
        pub mapping: Vec<Mapping>,
        #[prost(message, repeated, tag = "4")]
        pub location: Vec<Location>,
        #[prost(message, repeated, tag = "5")]
        pub function: Vec<Function>,
        /// Every string the other messages name, by index; "" first.
        #[prost(string, repeated, tag = "6")]
        pub string_table: Vec<String>,
        #[prost(int64, tag = "9")]
        pub time_nanos: i64,
        #[prost(int64, tag = "10")]
        pub duration_nanos: i64,
        #[prost(int64, repeated, tag = "13")]
        pub comment: Vec<i64>,
        /// The sample type readers show first, by its type's string.
        #[prost(int64, tag = "14")]
        pub default_sample_type: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ValueType {
        #[prost(int64, tag = "1")]
        pub r#type: i64,
        #[prost(int64, tag = "2")]
        pub unit: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        /// The leaf first.
        #[prost(uint64, repeated, tag = "1")]
        pub location_id: Vec<u64>,
        #[prost(int64, repeated, tag = "2")]
        pub value: Vec<i64>,
        #[prost(message, repeated, tag = "3")]
        pub label: Vec<Label>,
    }

    /// A string label (profile.proto's numeric `num` is left out: a zero
    /// there, as in process id 0, reads as no label at all).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Label {
        #[prost(int64, tag = "1")]
        pub key: i64,
        #[prost(int64, tag = "2")]
        pub str: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Mapping {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub memory_start: u64,
        #[prost(uint64, tag = "3")]
        pub memory_limit: u64,
        #[prost(int64, tag = "5")]
        pub filename: i64,
        #[prost(bool, tag = "7")]
        pub has_functions: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Location {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        /// 0: no module holds the address.
        #[prost(uint64, tag = "2")]
        pub mapping_id: u64,
        #[prost(uint64, tag = "3")]
        pub address: u64,
        #[prost(message, repeated, tag = "4")]
        pub line: Vec<Line>,
    }

    /// One function at a location: with inlining, the inlined calls
    /// first and the function holding the address last.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Line {
        #[prost(uint64, tag = "1")]
        pub function_id: u64,
        /// 0: not known.
        #[prost(int64, tag = "2")]
        pub line: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Function {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(int64, tag = "2")]
        pub name: i64,
        #[prost(int64, tag = "3")]
        pub system_name: i64,
        /// The source file, when the symbols have lines (0: none).
        #[prost(int64, tag = "4")]
        pub filename: i64,
    }
}

/// Writes the stacks of `table` as a gzipped pprof profile.
///
/// Every location has a function: `module!function` where symbols name
/// one (pprof then groups a function's addresses), else the frame's
/// `kstack top` name (`module+0xoffset`, or the bare address outside every
/// module). Mappings say they have functions, so pprof does not look for
/// the Windows images on this machine to symbolize them again.
///
/// # Errors
/// The I/O error of `out`.
pub fn write(table: &StackTable, symbolizer: &Symbolizer, out: impl Write) -> io::Result<()> {
    let mut gzip = GzEncoder::new(out, Compression::default());
    gzip.write_all(&profile(table, symbolizer).encode_to_vec())?;
    gzip.finish()?.flush()
}

fn profile(table: &StackTable, symbolizer: &Symbolizer) -> proto::Profile {
    let mut builder = Builder::new(symbolizer);
    let samples_type = builder.strings.id("samples");
    let count = builder.strings.id("count");
    let cpu_type = builder.strings.id("cpu");
    let nanoseconds = builder.strings.id("nanoseconds");
    let state_key = builder.strings.id("state");
    let wait_key = builder.strings.id("wait_reason");
    let source_key = builder.strings.id("source");
    let process_key = builder.strings.id("process_id");
    let thread_key = builder.strings.id("thread_id");
    let mut samples = Vec::new();
    for stack in table.ranked() {
        let kernel = stack.shown_kernel_frames(symbolizer).len();
        let location_id: Vec<u64> = if stack.lost {
            vec![builder.lost_location_id()]
        } else {
            stack
                .shown_frames(symbolizer)
                .iter()
                .enumerate()
                .map(|(index, &address)| {
                    if index < kernel {
                        builder.location_id(address)
                    } else {
                        builder.user_location_id(stack, address)
                    }
                })
                .collect()
        };
        // Records of the stack per source, process, thread and state: one
        // sample each, so pprof can focus on any of them (-tagfocus).
        for (origin, count) in &stack.per_origin {
            let mut label = vec![
                proto::Label {
                    key: source_key,
                    str: builder.strings.id(origin.source.name()),
                },
                proto::Label {
                    key: process_key,
                    str: builder.strings.id(&origin.process_id.to_string()),
                },
                proto::Label {
                    key: thread_key,
                    str: builder.strings.id(&origin.thread_id.to_string()),
                },
            ];
            if let Some(state) = origin.state {
                label.push(proto::Label {
                    key: state_key,
                    str: builder.strings.id(&state.name()),
                });
            }
            if let Some(reason) = origin.wait_reason {
                label.push(proto::Label {
                    key: wait_key,
                    str: builder.strings.id(&reason.name()),
                });
            }
            samples.push(proto::Sample {
                location_id: location_id.clone(),
                value: vec![
                    i64::try_from(count.records).unwrap_or(i64::MAX),
                    i64::try_from(count.cpu_time.saturating_mul(100)).unwrap_or(i64::MAX),
                ],
                label,
            });
        }
    }
    let (first, last) = table.time_range().unwrap_or_default();
    let nanos = |nanos: u64| i64::try_from(nanos).unwrap_or(i64::MAX);
    let comment = builder.strings.id(&format!("kstack: {}", table.summary()));
    proto::Profile {
        sample_type: vec![
            proto::ValueType {
                r#type: samples_type,
                unit: count,
            },
            proto::ValueType {
                r#type: cpu_type,
                unit: nanoseconds,
            },
        ],
        default_sample_type: samples_type,
        sample: samples,
        mapping: builder.mappings,
        location: builder.locations,
        function: builder.functions,
        time_nanos: system_time_unix_nanos(first).map_or(0, nanos),
        duration_nanos: nanos(last.saturating_sub(first).saturating_mul(100)),
        comment: vec![comment],
        string_table: builder.strings.table,
    }
}

/// The profile's tables, each entry made once and found again by what it
/// stands for.
struct Builder<'a> {
    symbolizer: &'a Symbolizer,
    strings: Strings,
    mappings: Vec<proto::Mapping>,
    /// By base and file name: processes map other images at one base.
    mapping_ids: HashMap<(u64, String), u64>,
    functions: Vec<proto::Function>,
    function_ids: HashMap<(String, Option<String>), u64>,
    locations: Vec<proto::Location>,
    location_ids: HashMap<u64, u64>,
    /// User frames named after a process's module, by address and name.
    user_location_ids: HashMap<(u64, String), u64>,
    /// The location of stacks lost with damaged bytes, once made.
    lost_location_id: Option<u64>,
}

impl<'a> Builder<'a> {
    fn new(symbolizer: &'a Symbolizer) -> Self {
        Self {
            symbolizer,
            strings: Strings::new(),
            mappings: Vec::new(),
            mapping_ids: HashMap::new(),
            functions: Vec::new(),
            function_ids: HashMap::new(),
            locations: Vec::new(),
            location_ids: HashMap::new(),
            user_location_ids: HashMap::new(),
            lost_location_id: None,
        }
    }

    /// The location of one of `stack`'s user frames: in the module of the
    /// stack's process holding it (as `kstack top` names it), else as any
    /// frame.
    fn user_location_id(&mut self, stack: &StackSummary, address: u64) -> u64 {
        let symbolizer = self.symbolizer;
        let Some(frame) =
            symbolizer.resolve_user(stack.first_process_id, stack.first.timestamp, address)
        else {
            return self.location_id(address);
        };
        let key = (address, frame.name());
        if let Some(&id) = self.user_location_ids.get(&key) {
            return id;
        }
        let mapping_id = self.mapping_id(frame.module);
        let lines = self.lines(Some(&frame), &key.1);
        let id = self.add_location(mapping_id, address, lines);
        self.user_location_ids.insert(key, id);
        id
    }

    /// A location's lines: each source frame the symbols give (inlined
    /// calls first, as profile.proto orders them), each function named
    /// `module!function` with its file; else one line of the frame's
    /// function, or of `name` (its `kstack top` name) when none is known.
    fn lines(&mut self, frame: Option<&ResolvedFrame<'_>>, name: &str) -> Vec<proto::Line> {
        let source = frame
            .and_then(|frame| frame.function.as_ref())
            .map_or(&[][..], |function| &function.source[..]);
        if let Some(module) = frame.map(|frame| &frame.module.name)
            && source.iter().all(|source| source.function.is_some())
            && !source.is_empty()
        {
            return source
                .iter()
                .map(|source| {
                    let function = format!("{module}!{}", source.function.as_deref().unwrap_or(""));
                    proto::Line {
                        function_id: self.function_id(function, source.file.as_deref()),
                        line: source.line.map_or(0, i64::from),
                    }
                })
                .collect();
        }
        let function = frame
            .and_then(ResolvedFrame::function_name)
            .unwrap_or_else(|| name.to_owned());
        vec![proto::Line {
            function_id: self.function_id(function, None),
            line: 0,
        }]
    }

    /// A new location of `address` in a mapping, with its lines; its id.
    fn add_location(&mut self, mapping_id: u64, address: u64, line: Vec<proto::Line>) -> u64 {
        let id = next_id(&self.locations);
        self.locations.push(proto::Location {
            id,
            mapping_id,
            address,
            line,
        });
        id
    }

    /// The location of a frame address.
    /// The one location of a stack whose frames were lost: no address,
    /// named [`LOST_STACK`].
    fn lost_location_id(&mut self) -> u64 {
        if let Some(id) = self.lost_location_id {
            return id;
        }
        let lines = self.lines(None, LOST_STACK);
        let id = self.add_location(0, 0, lines);
        self.lost_location_id = Some(id);
        id
    }

    fn location_id(&mut self, address: u64) -> u64 {
        if let Some(&id) = self.location_ids.get(&address) {
            return id;
        }
        let symbolizer = self.symbolizer;
        let resolved = symbolizer.resolve(address);
        let mapping_id = resolved
            .as_ref()
            .map_or(0, |frame| self.mapping_id(frame.module));
        let lines = self.lines(resolved.as_ref(), &symbolizer.location(address));
        let id = self.add_location(mapping_id, address, lines);
        self.location_ids.insert(address, id);
        id
    }

    fn mapping_id(&mut self, module: &Module) -> u64 {
        let key = (module.base, module.name.clone());
        if let Some(&id) = self.mapping_ids.get(&key) {
            return id;
        }
        let id = next_id(&self.mappings);
        self.mappings.push(proto::Mapping {
            id,
            memory_start: module.base,
            memory_limit: module.end(),
            filename: self.strings.id(&module.name),
            has_functions: true,
        });
        self.mapping_ids.insert(key, id);
        id
    }

    /// The function `name` in `file`, one entry each.
    fn function_id(&mut self, name: String, file: Option<&str>) -> u64 {
        let key = (name, file.map(str::to_owned));
        if let Some(&id) = self.function_ids.get(&key) {
            return id;
        }
        let id = next_id(&self.functions);
        let name_id = self.strings.id(&key.0);
        let filename = file.map_or(0, |file| self.strings.id(file));
        self.functions.push(proto::Function {
            id,
            name: name_id,
            system_name: name_id,
            filename,
        });
        self.function_ids.insert(key, id);
        id
    }
}

/// Ids count from 1 (0 means none in profile.proto).
fn next_id<T>(table: &[T]) -> u64 {
    table.len() as u64 + 1
}

/// The string table: every string once, "" at index 0 as profile.proto
/// requires.
struct Strings {
    table: Vec<String>,
    ids: HashMap<String, i64>,
}

impl Strings {
    fn new() -> Self {
        Self {
            table: vec![String::new()],
            ids: HashMap::from([(String::new(), 0)]),
        }
    }

    fn id(&mut self, text: &str) -> i64 {
        if let Some(&id) = self.ids.get(text) {
            return id;
        }
        let id = i64::try_from(self.table.len()).unwrap_or(i64::MAX);
        self.table.push(text.to_owned());
        self.ids.insert(text.to_owned(), id);
        id
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read as _;

    use kstack_abi::SourceFacts;

    use super::*;
    use crate::{
        capture::{
            trace::TraceRecord,
            writer::tests::{record, sampled, thread_stack},
        },
        naming::{
            modules::tests::sample_map,
            symbolizer::tests::{DISPATCH, with_dispatch},
        },
        thread_list::ThreadState,
    };

    const NT_FRAME: u64 = 0xFFFF_F800_0000_0020;

    fn table(records: &[TraceRecord]) -> StackTable {
        let mut table = StackTable::default();
        for record in records {
            table.add(record);
        }
        table
    }

    fn decoded(table: &StackTable, symbolizer: &Symbolizer) -> proto::Profile {
        let mut gzipped = Vec::new();
        write(table, symbolizer, &mut gzipped).unwrap();
        let mut bytes = Vec::new();
        flate2::read::GzDecoder::new(&gzipped[..])
            .read_to_end(&mut bytes)
            .unwrap();
        proto::Profile::decode(&bytes[..]).unwrap()
    }

    fn string(profile: &proto::Profile, id: i64) -> &str {
        &profile.string_table[usize::try_from(id).unwrap()]
    }

    fn function_name(profile: &proto::Profile, location_id: u64) -> &str {
        let location = &profile.location[usize::try_from(location_id - 1).unwrap()];
        let function =
            &profile.function[usize::try_from(location.line[0].function_id - 1).unwrap()];
        string(profile, function.name)
    }

    #[test]
    fn a_user_address_named_after_two_processes_modules_is_two_locations() {
        const USER: u64 = 0x7FF6_0000_0010;
        let mut processes = crate::naming::process_modules::ProcessModules::default();
        for (process_id, name) in [(100, "app.exe"), (200, "other.exe")] {
            processes.add(
                process_id,
                [Module {
                    base: 0x7FF6_0000_0000,
                    size: 0x1000,
                    name: name.to_owned(),
                }],
            );
        }
        let symbolizer = Symbolizer::new(sample_map())
            .showing_tracer_frames()
            .with_processes(processes);
        let mut records = Vec::new();
        for (sequence, process_id, kernel) in [(1, 100, NT_FRAME), (2, 200, NT_FRAME + 8)] {
            let mut record = record(sequence, SourceFacts::OnDemand { tag: 0 }, &[kernel, USER]);
            record.header.process_id = process_id;
            record.header.user_frame_count = 1;
            records.push(record);
        }
        let profile = decoded(&table(&records), &symbolizer);
        let user: Vec<(&str, &str)> = profile
            .location
            .iter()
            .filter(|location| location.address == USER)
            .map(|location| {
                let mapping = &profile.mapping[usize::try_from(location.mapping_id - 1).unwrap()];
                (
                    function_name(&profile, location.id),
                    string(&profile, mapping.filename),
                )
            })
            .collect();
        assert_eq!(
            user.iter()
                .copied()
                .collect::<std::collections::BTreeSet<_>>(),
            [("app.exe+0x10", "app.exe"), ("other.exe+0x10", "other.exe")].into()
        );
    }

    #[test]
    fn samples_count_records_per_stack_source_process_and_thread() {
        let mut other_thread = record(3, SourceFacts::Timer, &[DISPATCH + 0x20, NT_FRAME]);
        other_thread.header.process_id = 0;
        other_thread.header.thread_id = 77;
        let records = [
            record(1, SourceFacts::Timer, &[DISPATCH + 0x20, NT_FRAME]),
            record(2, SourceFacts::Timer, &[DISPATCH + 0x20, NT_FRAME]),
            other_thread,
            record(4, SourceFacts::OnDemand { tag: 1 }, &[0x42]),
        ];
        let profile = decoded(
            &table(&records),
            &Symbolizer::new(sample_map()).showing_tracer_frames(),
        );
        assert_eq!(profile.string_table[0], "");
        assert_eq!(string(&profile, profile.sample_type[0].r#type), "samples");
        assert_eq!(string(&profile, profile.sample_type[0].unit), "count");
        let described: Vec<(Vec<&str>, i64, String)> = profile
            .sample
            .iter()
            .map(|sample| {
                let labels = labels(&profile, sample).join(",");
                let names = sample
                    .location_id
                    .iter()
                    .map(|&id| function_name(&profile, id))
                    .collect();
                (names, sample.value[0], labels)
            })
            .collect();
        assert_eq!(
            described,
            [
                (
                    vec!["kstack.sys+0x1020", "ntoskrnl.exe+0x20"],
                    1,
                    "source=timer,process_id=0,thread_id=77".to_owned()
                ),
                (
                    vec!["kstack.sys+0x1020", "ntoskrnl.exe+0x20"],
                    2,
                    "source=timer,process_id=4,thread_id=8".to_owned()
                ),
                (
                    vec!["0x42"],
                    1,
                    "source=ondemand,process_id=4,thread_id=8".to_owned()
                ),
            ]
        );
    }

    /// A sample's labels, `key=value` each.
    fn labels(profile: &proto::Profile, sample: &proto::Sample) -> Vec<String> {
        sample
            .label
            .iter()
            .map(|label| {
                format!(
                    "{}={}",
                    string(profile, label.key),
                    string(profile, label.str)
                )
            })
            .collect()
    }

    #[test]
    fn samples_carry_their_cpu_time_and_their_threads_state() {
        let sample = |sequence, state, cpu_time| {
            sampled(
                thread_stack(sequence, 8, &[NT_FRAME]),
                Some(state),
                cpu_time,
            )
        };
        let records = [
            sample(1, ThreadState::WAITING, 3),
            sample(2, ThreadState::WAITING, 4),
            sample(3, ThreadState::RUNNING, 150_000),
        ];
        let profile = decoded(
            &table(&records),
            &Symbolizer::new(sample_map()).showing_tracer_frames(),
        );
        let types: Vec<(&str, &str)> = profile
            .sample_type
            .iter()
            .map(|kind| (string(&profile, kind.r#type), string(&profile, kind.unit)))
            .collect();
        assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
        assert_eq!(string(&profile, profile.default_sample_type), "samples");
        let mut described: Vec<(Vec<i64>, Vec<String>)> = profile
            .sample
            .iter()
            .map(|sample| (sample.value.clone(), labels(&profile, sample)[3..].to_vec()))
            .collect();
        described.sort();
        assert_eq!(
            described,
            [
                (vec![1, 15_000_000], vec!["state=running".to_owned()]),
                (
                    vec![2, 700],
                    vec![
                        "state=waiting".to_owned(),
                        "wait_reason=UserRequest".to_owned()
                    ]
                ),
            ]
        );
    }

    #[test]
    fn locations_sit_in_their_module_mapping_and_the_time_range_is_kept() {
        let records = [
            record(1, SourceFacts::Timer, &[DISPATCH + 0x20, NT_FRAME]),
            record(5, SourceFacts::OnDemand { tag: 1 }, &[0x42]),
        ];
        let profile = decoded(
            &table(&records),
            &Symbolizer::new(sample_map()).showing_tracer_frames(),
        );
        let mappings: Vec<_> = profile
            .mapping
            .iter()
            .map(|mapping| {
                (
                    string(&profile, mapping.filename),
                    mapping.memory_start,
                    mapping.memory_limit,
                    mapping.has_functions,
                )
            })
            .collect();
        assert_eq!(
            mappings,
            [
                (
                    "kstack.sys",
                    0xFFFF_F801_2340_0000,
                    0xFFFF_F801_2342_0000,
                    true
                ),
                (
                    "ntoskrnl.exe",
                    0xFFFF_F800_0000_0000,
                    0xFFFF_F800_0100_0000,
                    true
                ),
            ]
        );
        let by_address = |address| {
            profile
                .location
                .iter()
                .find(|location| location.address == address)
                .unwrap()
        };
        assert_eq!(by_address(DISPATCH + 0x20).mapping_id, 1);
        assert_eq!(by_address(NT_FRAME).mapping_id, 2);
        assert_eq!(by_address(0x42).mapping_id, 0, "no module, no mapping");
        let (first, last) = (records[0].header.timestamp, records[1].header.timestamp);
        assert_eq!(
            profile.time_nanos,
            i64::try_from(system_time_unix_nanos(first).unwrap()).unwrap()
        );
        assert_eq!(
            profile.duration_nanos,
            i64::try_from((last - first) * 100).unwrap()
        );
        assert_eq!(
            string(&profile, profile.comment[0]),
            "kstack: 2 records, 2 unique stacks"
        );
    }

    #[test]
    fn known_functions_group_their_addresses() {
        let (symbolizer, _) = with_dispatch();
        let records = [
            record(1, SourceFacts::Timer, &[DISPATCH + 0x20, NT_FRAME]),
            record(2, SourceFacts::Timer, &[DISPATCH + 0x48, NT_FRAME]),
        ];
        let profile = decoded(&table(&records), &symbolizer);
        assert_eq!(profile.location.len(), 3, "one location per address");
        let names: Vec<_> = profile
            .function
            .iter()
            .map(|function| string(&profile, function.name))
            .collect();
        assert_eq!(
            names,
            ["kstack.sys!kstack::dispatch::dispatch", "ntoskrnl.exe+0x20"]
        );
    }
}
