//! The offline commands (`--input FILE`) run as the real `kstack` binary
//! over a capture written here, and their outputs compared with the files
//! in `tests/golden/`. Set `KSTACK_UPDATE_GOLDEN=1` to rewrite those files
//! after an intended change, then review the diff.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

use kstack_abi::{
    RecordFlags, RecordHeader, SourceFacts,
    source::{HandleOperation, Lifecycle, ObjectKind},
    stack_id,
};
use kstack_client::{
    capture_file::CaptureWriter,
    modules::{Module, ModuleMap},
    trace::TraceRecord,
};

const NT: u64 = 0xFFFF_F806_2A00_0000;
const KSTACK: u64 = 0xFFFF_F806_3110_0000;
const FLTMGR: u64 = 0xFFFF_F806_2C40_0000;

fn modules() -> ModuleMap {
    ModuleMap::new([
        Module {
            base: NT,
            size: 0x104_6000,
            name: "ntoskrnl.exe".to_owned(),
        },
        Module {
            base: KSTACK,
            size: 0x2_4000,
            name: "kstack.sys".to_owned(),
        },
        Module {
            base: FLTMGR,
            size: 0x8_2000,
            name: "FLTMGR.SYS".to_owned(),
        },
    ])
}

const TIMER: &[u64] = &[
    KSTACK + 0x1A10,
    NT + 0x4_2F30,
    NT + 0x4_1B02,
    NT + 0x41_7C44,
];
const PROCESS: &[u64] = &[
    KSTACK + 0x2230,
    NT + 0x6E_1050,
    NT + 0x6E_0F11,
    NT + 0x42_A2B5,
];
const IMAGE: &[u64] = &[
    KSTACK + 0x2480,
    NT + 0x70_11A0,
    FLTMGR + 0x5_3D10,
    NT + 0x42_A2B5,
];
const REGISTRY: &[u64] = &[KSTACK + 0x2610, NT + 0x69_B7C0, 0x7FF6_1234_5678];
const OBJECT: &[u64] = &[KSTACK + 0x2890, NT + 0x6A_0010, NT + 0x6A_1F33];
const ONDEMAND: &[u64] = &[
    KSTACK + 0x3010,
    KSTACK + 0x2F40,
    NT + 0x3_A1C5,
    NT + 0x66_70B1,
];
const THREAD: &[u64] = &[KSTACK + 0x2350, NT + 0x6F_4410];

/// A capture with every source, repeated stacks, a truncated record, a
/// capture-now record and a frame outside every module.
fn records() -> Vec<TraceRecord> {
    let mut records = Vec::new();
    // Captured on two processors in turn, each with its own ring shard and
    // sequence numbers.
    let mut spent = [0_u64; 2];
    let mut push = |facts: SourceFacts, frames: &[u64], irql: u8, flags: RecordFlags| {
        let index = records.len() as u64 + 1;
        let shard = u16::try_from(index % 2).unwrap();
        spent[usize::from(shard)] += 1;
        records.push(TraceRecord {
            header: RecordHeader {
                sequence: spent[usize::from(shard)],
                // 2025-11-23T06:00:00Z plus 1 ms per record.
                timestamp: 134_083_512_000_000_000 + index * 10_000,
                process_id: if irql == 2 { 0 } else { 4312 },
                thread_id: 5000 + u32::try_from(index % 3).unwrap(),
                processor: shard,
                shard,
                irql,
                flags,
                os_hash: u32::try_from(stack_id(frames.iter().copied()) & 0xFFFF_FFFF).unwrap(),
                stack_id: stack_id(frames.iter().copied()),
                facts,
            },
            frames: frames.to_vec(),
        });
    };
    for _ in 0..5 {
        push(SourceFacts::Timer, TIMER, 2, RecordFlags::NONE);
    }
    push(
        SourceFacts::Process {
            event: Lifecycle::Create,
            process_id: 4312,
            parent_process_id: 1024,
        },
        PROCESS,
        0,
        RecordFlags::NONE,
    );
    push(
        SourceFacts::Thread {
            event: Lifecycle::Exit,
            process_id: 4312,
            thread_id: 5001,
        },
        THREAD,
        0,
        RecordFlags::NONE,
    );
    for _ in 0..2 {
        push(
            SourceFacts::ImageLoad {
                image_base: 0x7FF6_1230_0000,
                image_size: 0x5_0000,
                process_id: 4312,
            },
            IMAGE,
            0,
            RecordFlags::NONE,
        );
    }
    push(
        SourceFacts::Registry { notify_class: 1 },
        REGISTRY,
        0,
        RecordFlags::NONE,
    );
    push(
        SourceFacts::ObjectHandle {
            operation: HandleOperation::Create,
            object: ObjectKind::Process,
            desired_access: 0x1F_FFFF,
            target_process_id: 4,
        },
        OBJECT,
        0,
        RecordFlags::TRUNCATED,
    );
    push(
        SourceFacts::OnDemand { tag: 4312 },
        ONDEMAND,
        0,
        RecordFlags::NONE,
    );
    push(SourceFacts::Timer, TIMER, 2, RecordFlags::NONE);
    records
}

fn write_capture(path: &Path) {
    let file = std::fs::File::create(path).unwrap();
    let mut writer = CaptureWriter::new(file, &modules()).unwrap();
    for record in records() {
        writer.append(&record).unwrap();
    }
    writer.finish().unwrap();
}

fn scratch_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn kstack(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kstack"))
        .args(args)
        .output()
        .expect("running kstack")
}

/// Compares `actual` with `tests/golden/<name>`, or rewrites that file
/// when `KSTACK_UPDATE_GOLDEN` is set.
fn check_golden(name: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if std::env::var_os("KSTACK_UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|error| {
        panic!(
            "{}: {error} (set KSTACK_UPDATE_GOLDEN=1 to create it)",
            path.display()
        )
    });
    assert!(
        expected == actual,
        "{name} differs from its golden file {}\n--- expected\n{expected}\n--- actual\n{actual}",
        path.display()
    );
}

fn stdout_of(args: &[&str]) -> String {
    let output = kstack(args);
    assert!(
        output.status.success(),
        "kstack {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn offline_outputs_match_their_golden_files() {
    let dir = scratch_dir("golden");
    let capture = dir.join("sample.kstack");
    write_capture(&capture);
    let input = capture.to_str().unwrap();
    let cases: [(&str, &[&str]); 8] = [
        ("read.txt", &["read", "--input", input]),
        (
            "read-calltrace.txt",
            &["read", "--call-trace", "--input", input],
        ),
        ("read.jsonl", &["read", "--json", "--input", input]),
        ("top.txt", &["top", "--input", input]),
        (
            "top-limited.txt",
            &["top", "--limit", "2", "--frames", "2", "--input", input],
        ),
        ("top.jsonl", &["top", "--json", "--input", input]),
        ("folded.txt", &["folded", "--input", input]),
        ("modules.txt", &["modules", "--input", input]),
    ];
    for (golden, args) in cases {
        check_golden(golden, &stdout_of(args));
    }
}

#[test]
fn folded_to_a_file_equals_folded_to_stdout() {
    let dir = scratch_dir("folded-file");
    let capture = dir.join("sample.kstack");
    write_capture(&capture);
    let input = capture.to_str().unwrap();
    let out = dir.join("out.folded");
    stdout_of(&["folded", "--input", input, "-o", out.to_str().unwrap()]);
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        stdout_of(&["folded", "--input", input])
    );
}

#[test]
fn the_flamegraph_is_an_svg_of_every_frame() {
    let dir = scratch_dir("flamegraph");
    let capture = dir.join("sample.kstack");
    write_capture(&capture);
    let svg_path = dir.join("out.svg");
    let svg_arg = svg_path.to_str().unwrap();
    let output = kstack(&[
        "flamegraph",
        "--input",
        capture.to_str().unwrap(),
        "-o",
        svg_arg,
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    assert!(svg.starts_with("<?xml") && svg.trim_end().ends_with("</svg>"));
    for frame in [
        "kstack.sys+0x1a10",
        "ntoskrnl.exe+0x417c44",
        "FLTMGR.SYS+0x53d10",
        "timer",
        "0x7ff612345678",
    ] {
        assert!(svg.contains(frame), "{frame} missing from the SVG");
    }
    assert!(
        svg.contains("13 records, 7 unique stacks"),
        "the title counts them"
    );
    // The same capture draws the same picture.
    let again = dir.join("again.svg");
    kstack(&[
        "flamegraph",
        "--input",
        capture.to_str().unwrap(),
        "-o",
        again.to_str().unwrap(),
    ]);
    assert_eq!(std::fs::read_to_string(&again).unwrap(), svg);
}

#[test]
fn bad_inputs_get_a_clear_error_and_exit_code_8_and_lose_nothing() {
    let dir = scratch_dir("bad-inputs");
    let capture = dir.join("sample.kstack");
    write_capture(&capture);
    let bytes = std::fs::read(&capture).unwrap();
    let cut = dir.join("cut.kstack");
    std::fs::write(&cut, &bytes[..bytes.len() - 40]).unwrap();
    let text = dir.join("text.kstack");
    std::fs::write(&text, "hello").unwrap();
    let missing = dir.join("missing.kstack");
    let cases = [
        (&cut, "the capture was not finished"),
        (&text, "not a kstack capture"),
        (&missing, "reading"),
    ];
    for (path, message) in cases {
        let output = kstack(&["top", "--input", path.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(
            output.status.code(),
            Some(8),
            "{}: {stderr}",
            path.display()
        );
        assert!(stderr.contains(message), "{}: {stderr}", path.display());
        assert!(output.stdout.is_empty());
    }
    // An existing output is never replaced without --force.
    let existing = dir.join("existing.svg");
    std::fs::write(&existing, "keep me").unwrap();
    let input = capture.to_str().unwrap();
    let output = kstack(&[
        "flamegraph",
        "--input",
        input,
        "-o",
        existing.to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(8));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--force"));
    assert_eq!(std::fs::read_to_string(&existing).unwrap(), "keep me");
    let forced = kstack(&[
        "flamegraph",
        "--force",
        "--input",
        input,
        "-o",
        existing.to_str().unwrap(),
    ]);
    assert!(forced.status.success());
    assert!(
        std::fs::read_to_string(&existing)
            .unwrap()
            .starts_with("<?xml")
    );
}

#[cfg(not(windows))]
#[test]
fn live_commands_off_windows_say_they_need_windows() {
    for args in [&["top"][..], &["save", "x.kstack"], &["read"], &["status"]] {
        let output = kstack(args);
        assert_eq!(output.status.code(), Some(3), "{args:?}");
        assert!(String::from_utf8_lossy(&output.stderr).contains("runs on Windows"));
    }
}

#[cfg(not(windows))]
#[test]
fn symbols_off_windows_are_refused_and_the_environment_ignored() {
    let dir = scratch_dir("symbols-off-windows");
    let capture = dir.join("sample.kstack");
    write_capture(&capture);
    let input = capture.to_str().unwrap();
    let svg = dir.join("out.svg");
    let commands: [&[&str]; 4] = [
        &["read", "--input", input],
        &["top", "--input", input],
        &["folded", "--input", input],
        &["flamegraph", "--input", input, "-o", svg.to_str().unwrap()],
    ];
    for args in commands {
        let output = kstack(&[args, &["--symbols", "/srv/symbols"]].concat());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(3), "{args:?}: {stderr}");
        assert!(
            stderr.contains("--symbols reads PDB symbols with dbghelp, which only Windows"),
            "{args:?}: {stderr}"
        );
        assert!(output.stdout.is_empty(), "{args:?}");
    }
    assert!(!svg.exists(), "nothing is drawn");
    // An empty path means none; _NT_SYMBOL_PATH is a Windows setting.
    let plain = stdout_of(&["read", "--input", input]);
    assert_eq!(
        stdout_of(&["read", "--input", input, "--symbols", ""]),
        plain
    );
    let with_environment = Command::new(env!("CARGO_BIN_EXE_kstack"))
        .args(["read", "--input", input])
        .env("_NT_SYMBOL_PATH", "/srv/symbols")
        .output()
        .unwrap();
    assert!(with_environment.status.success());
    assert_eq!(String::from_utf8(with_environment.stdout).unwrap(), plain);
}
