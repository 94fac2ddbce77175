//! A `kstack sample` capture (format 6: samples with their threads' facts,
//! repeated samples among them) through every analysis: `--on-cpu` and
//! `--off-cpu` partition its samples in `top`, `folded`, `flamegraph` and
//! each `export` format, and `go tool pprof` reads the profile's two sample
//! types and its state labels.

#[allow(
    dead_code,
    reason = "the synthetic capture there is the other test files'; this one writes its own"
)]
mod common;

use std::{path::Path, process::Command};

use common::{kstack, scratch_dir, stdout_of};
use kstack_abi::SourceFacts;
use kstack_client::{
    capture::{
        trace::{SampleFacts, TraceRecord},
        writer::CaptureWriter,
    },
    naming::modules::ModuleMap,
    thread_list::{ThreadState, WaitReason},
};
use serde_json::Value;

/// Thread 1 running (3 samples, 2.5 ms of CPU time between them), thread
/// 2 waiting (captured once, then repeated 4 times), thread 3 ready, and a
/// timer record: 10 records, 3 on-CPU, 6 off-CPU, 1 without a state.
fn write_sample_capture(path: &Path) {
    let sample = |sequence: u64, thread_id: u32, frame: u64, state, cpu_time, repeated| {
        let frames = [0xFFFF_F800_0000_0000 + frame, 0xFFFF_F800_0001_0000];
        TraceRecord {
            header: kstack_abi::RecordHeader {
                sequence,
                timestamp: 134_083_512_000_000_000 + sequence * 100_000,
                process_id: 500,
                thread_id,
                processor: 0,
                shard: 0,
                irql: 1,
                flags: kstack_abi::RecordFlags::NONE,
                user_frame_count: 0,
                user_part: kstack_abi::UserPart::Off,
                os_hash: 1,
                stack_id: kstack_abi::stack_id(&frames),
                facts: SourceFacts::ThreadStack {
                    target_process_id: 500,
                    target_thread_id: thread_id,
                    tag: 1,
                    delay: 0,
                    late: false,
                },
            },
            frames: frames.into(),
            sample: Some(SampleFacts {
                state: Some(state),
                wait_reason: WaitReason(6),
                cpu_time,
                repeated,
            }),
        }
    };
    let mut records = vec![
        sample(1, 1, 0x10, ThreadState::RUNNING, 0, false),
        sample(2, 2, 0x20, ThreadState::WAITING, 0, false),
        sample(3, 3, 0x30, ThreadState::READY, 0, false),
        sample(4, 1, 0x11, ThreadState::RUNNING, 10_000, false),
        sample(5, 1, 0x10, ThreadState::RUNNING, 15_000, false),
    ];
    for tick in 0..4 {
        let mut repeated = records[1].clone();
        repeated.header.timestamp += 1_000_000 * (tick + 1);
        repeated.sample = Some(SampleFacts {
            cpu_time: 0,
            repeated: true,
            ..repeated.sample.unwrap()
        });
        records.push(repeated);
    }
    let mut timer = sample(6, 9, 0x40, ThreadState::RUNNING, 0, false);
    timer.header.facts = SourceFacts::Timer;
    timer.sample = None;
    records.push(timer);
    let file = std::fs::File::create(path).unwrap();
    let mut writer = CaptureWriter::new(file, &ModuleMap::default()).unwrap();
    for record in &records {
        writer.append(record).unwrap();
    }
    writer.finish().unwrap();
}

fn with(base: &[&str], filter: &[&str]) -> Vec<String> {
    base.iter()
        .chain(filter)
        .map(|&arg| arg.to_owned())
        .collect()
}

fn run(args: &[String]) -> String {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    stdout_of(&args)
}

/// `kstack export --format FORMAT --input INPUT -o OUT --force` with
/// `filter`.
fn export(input: &str, format: &str, out: &Path, filter: &[&str]) {
    run(&with(
        &[
            "export",
            "--format",
            format,
            "--input",
            input,
            "-o",
            out.to_str().unwrap(),
            "--force",
        ],
        filter,
    ));
}

/// How many records `filter` counts over the capture `input`, the same in
/// every output: `top --json`, `folded`, `flamegraph`, and each export
/// format (Chrome trace events, speedscope, pprof as `go tool pprof` reads
/// it). Also the off-CPU graph's blue background.
fn counted_everywhere(input: &str, dir: &Path, filter: &[&str]) -> u64 {
    let top: u64 = run(&with(
        &["top", "--json", "--limit", "0", "--input", input],
        filter,
    ))
    .lines()
    .map(|line| {
        serde_json::from_str::<Value>(line).unwrap()["count"]
            .as_u64()
            .unwrap()
    })
    .sum();
    let folded: u64 = run(&with(&["folded", "--input", input], filter))
        .lines()
        .map(|line| line.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
        .sum();
    let svg_path = dir.join("graph.svg");
    run(&with(
        &[
            "flamegraph",
            "--input",
            input,
            "-o",
            svg_path.to_str().unwrap(),
            "--force",
        ],
        filter,
    ));
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    let drawn: u64 = svg
        .split_once("<title>all (")
        .and_then(|(_, rest)| rest.split_once(" records"))
        .map_or_else(
            || panic!("no root frame in the SVG"),
            |(count, _)| count.replace(',', "").parse().unwrap(),
        );
    assert_eq!(
        svg.contains("#e0e0ff"),
        filter == ["--off-cpu"] || (filter.first() == Some(&"--state") && filter[1] != "running"),
        "{filter:?}: off-CPU graphs, and only they, are drawn on blue"
    );
    let read_json = |path: &Path| -> Value {
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    };
    let trace_path = dir.join("trace.json");
    export(input, "chrome-trace", &trace_path, filter);
    let traced = read_json(&trace_path)["traceEvents"]
        .as_array()
        .unwrap()
        .len() as u64;
    let speedscope_path = dir.join("profile.speedscope.json");
    export(input, "speedscope", &speedscope_path, filter);
    let speedscope: u64 = read_json(&speedscope_path)["profiles"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|profile| profile["weights"].as_array().unwrap().clone())
        .map(|weight| weight.as_u64().unwrap())
        .sum();
    let profile = dir.join("profile.pb.gz");
    export(input, "pprof", &profile, filter);
    let (profiled, _) = pprof_total(&profile, &[]);
    assert_eq!(
        [folded, drawn, traced, speedscope, profiled],
        [top; 5],
        "{filter:?}: top, then folded, flamegraph, chrome trace, speedscope, pprof"
    );
    top
}

#[test]
fn on_and_off_cpu_partition_the_samples_in_every_output() {
    let dir = scratch_dir("sample-states");
    let capture = dir.join("sample.kstack");
    write_sample_capture(&capture);
    let input = capture.to_str().unwrap();
    let count = |filter: &[&str]| counted_everywhere(input, &dir, filter);
    let all = count(&[]);
    let (on, off) = (count(&["--on-cpu"]), count(&["--off-cpu"]));
    let by_state = ["running", "waiting", "ready"].map(|state| count(&["--state", state]));
    let output = kstack(&["top", "--off-cpu", "--input", input]);
    let stderr = said(&output.stderr);
    let without_state: u64 = stderr
        .split_once(" records without a thread state")
        .and_then(|(before, _)| before.rsplit_once(' '))
        .map_or_else(|| panic!("{stderr}"), |(_, count)| count.parse().unwrap());
    // The partition: on-CPU, off-CPU, and records without a state.
    assert_eq!(on + off + without_state, all, "{stderr}");
    assert_eq!((on, off), (by_state[0], by_state[1] + by_state[2]));
    // The capture's own figures.
    assert_eq!((all, on, off, without_state), (10, 3, 6, 1));
    assert!(
        stderr.contains("--off-cpu: 6 of 10 records counted; 3 samples in other states"),
        "{stderr}"
    );
    let top = run(&with(&["top", "--input", input], &[]));
    assert!(top.contains("on-CPU 0 (0.0%), off-CPU 5 (100.0%)"), "{top}");
    assert!(
        top.contains("on-CPU 2 (100.0%), off-CPU 0 (0.0%), CPU time 1.5 ms"),
        "{top}"
    );
}

/// What a command wrote to stderr, as one line (the text is fitted to the
/// terminal's width, so a phrase may be wrapped anywhere).
fn said(output: &[u8]) -> String {
    String::from_utf8_lossy(output)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// What `go tool pprof -top` shows of the profile with `options`: the
/// nodes' total ("accounting for N"), as a number and as printed.
fn pprof_total(profile: &Path, options: &[&str]) -> (u64, String) {
    let output = Command::new("go")
        .args(["tool", "pprof", "-top"])
        .args(options)
        .arg(profile)
        .env("TZ", "UTC")
        .output()
        .expect("go is needed to read the pprof export: apt-get install -y golang-go");
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let total = stdout
        .split_once("Showing nodes accounting for ")
        .and_then(|(_, rest)| rest.split_once(','))
        .map_or_else(
            || panic!("no total in:\n{stdout}"),
            |(total, _)| total.trim().to_owned(),
        );
    let number: String = total.chars().take_while(char::is_ascii_digit).collect();
    (number.parse().unwrap_or(0), total)
}

#[test]
fn go_tool_pprof_reads_both_sample_types_and_the_state_labels() {
    let dir = scratch_dir("sample-states-pprof");
    let capture = dir.join("sample.kstack");
    write_sample_capture(&capture);
    let profile = dir.join("profile.pb.gz");
    export(capture.to_str().unwrap(), "pprof", &profile, &[]);
    assert_eq!(pprof_total(&profile, &[]).0, 10, "samples by default");
    assert_eq!(pprof_total(&profile, &["-tagfocus=state=waiting"]).0, 5);
    assert_eq!(pprof_total(&profile, &["-tagfocus=state=running"]).0, 3);
    assert_eq!(
        pprof_total(&profile, &["-tagfocus=wait_reason=UserRequest"]).0,
        5
    );
    // 2.5 ms of CPU time, all of thread 1's.
    let (_, cpu) = pprof_total(&profile, &["-sample_index=cpu"]);
    assert_eq!(cpu, "2.50ms");
}
