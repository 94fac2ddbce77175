//! The offline commands (`--input FILE`) run as the real `kstack` binary
//! over a capture written here, and their outputs compared with the files
//! in `tests/golden/`. Set `KSTACK_UPDATE_GOLDEN=1` to rewrite those files
//! after an intended change, then review the diff.

mod common;

use common::{check_golden, kstack, scratch_dir, stdout_of, write_capture};

#[test]
fn offline_outputs_match_their_golden_files() {
    let dir = scratch_dir("golden");
    let capture = dir.join("sample.kstack");
    write_capture(&capture);
    let input = capture.to_str().unwrap();
    let cases: [(&str, &[&str]); 9] = [
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
        (
            "modules-processes.txt",
            &["modules", "--processes", "--input", input],
        ),
    ];
    for (golden, args) in cases {
        let output = stdout_of(args);
        // Text for people fits 100 columns off a terminal; machine formats
        // (JSON lines, folded stacks, CallTrace lines) are one item a line.
        if !golden.contains(".json") && golden != "folded.txt" {
            for line in output.lines() {
                assert!(
                    line.chars().count() <= 100 || line.starts_with("  CallTrace: "),
                    "{golden}: a line over 100 columns: {line}"
                );
            }
        }
        check_golden(golden, &output);
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
        "ntoskrnl.exe+0x417c44",
        "FLTMGR.SYS+0x53d10",
        "timer",
        // User frames, named after the registry record's process: one by
        // the start listing, one by a DLL loaded during the capture.
        "app.exe+0x1a00",
        "helper.dll+0x5678",
    ] {
        assert!(svg.contains(frame), "{frame} missing from the SVG");
    }
    assert!(
        svg.contains("16 records, 9 unique stacks"),
        "the title counts them"
    );
    // kstack.sys's own frames (the capture path) only on request.
    assert!(!svg.contains("kstack.sys+"), "a tracer frame in the SVG");
    let traced = dir.join("traced.svg");
    let output = kstack(&[
        "flamegraph",
        "--tracer-frames",
        "--input",
        capture.to_str().unwrap(),
        "-o",
        traced.to_str().unwrap(),
    ]);
    assert!(output.status.success());
    let traced = std::fs::read_to_string(&traced).unwrap();
    assert!(
        traced.contains("kstack.sys+0x1a10"),
        "--tracer-frames shows them"
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
fn bad_inputs_get_a_clear_error_and_lose_nothing() {
    let dir = scratch_dir("bad-inputs");
    let capture = dir.join("sample.kstack");
    write_capture(&capture);
    let bytes = std::fs::read(&capture).unwrap();
    let cut = dir.join("cut.kstack");
    std::fs::write(&cut, &bytes[..bytes.len() - 40]).unwrap();
    let text = dir.join("text.kstack");
    std::fs::write(&text, "hello").unwrap();
    let missing = dir.join("missing.kstack");
    // A capture cut short is read up to its last whole block (here, none),
    // said, with exit code 10; what is not a capture exits with 8.
    let cases = [
        (&cut, 10, "is incomplete: it was cut short"),
        (&text, 8, "not a kstack capture"),
        (&missing, 8, "reading"),
        (&dir, 8, "it is a folder"),
    ];
    for (path, code, message) in cases {
        let output = kstack(&["top", "--input", path.to_str().unwrap()]);
        // Unwrapped, as a terminal's width may wrap it anywhere.
        let stderr = String::from_utf8_lossy(&output.stderr)
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        assert_eq!(
            output.status.code(),
            Some(code),
            "{}: {stderr}",
            path.display()
        );
        assert!(stderr.contains(message), "{}: {stderr}", path.display());
        let stdout = String::from_utf8_lossy(&output.stdout);
        if code == 10 {
            assert!(stdout.starts_with("0 records"), "{stdout}");
        } else {
            assert!(stdout.is_empty(), "{stdout}");
        }
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
    for args in [
        &["top"][..],
        &["save", "x.kstack"],
        &["read"],
        &["status"],
        &["threads", "--pid", "4"],
    ] {
        let output = kstack(args);
        assert_eq!(output.status.code(), Some(3), "{args:?}");
        assert!(String::from_utf8_lossy(&output.stderr).contains("runs on Windows"));
    }
}

/// Off Windows the symbol path (`--symbols`, else `_NT_SYMBOL_PATH`) is
/// searched for each image's PDB by the identity the capture carries; what
/// is not found is said once, with where it looked, and the frames keep
/// their `module+0xoffset` names. (Naming from a real PDB: the Wine test's
/// Linux side and `tests/tests/driver_image.rs`.)
#[cfg(not(windows))]
#[test]
fn symbols_off_windows_are_looked_for_by_identity_and_what_is_missing_said() {
    let dir = scratch_dir("symbols-off-windows");
    let capture = dir.join("sample.kstack");
    write_capture(&capture);
    let input = capture.to_str().unwrap();
    // kstack.sys's frames too, so both images' PDBs are asked for.
    let plain = stdout_of(&["read", "--tracer-frames", "--input", input]);
    let said = |output: &std::process::Output| {
        String::from_utf8_lossy(&output.stderr)
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    let flag = kstack(&[
        "read",
        "--tracer-frames",
        "--input",
        input,
        "--symbols",
        "/srv/symbols",
    ]);
    let environment = std::process::Command::new(env!("CARGO_BIN_EXE_kstack"))
        .args(["read", "--tracer-frames", "--input", input])
        .env("_NT_SYMBOL_PATH", "/srv/symbols")
        .output()
        .unwrap();
    for output in [&flag, &environment] {
        assert!(output.status.success());
        assert_eq!(String::from_utf8_lossy(&output.stdout), plain);
        let stderr = said(output);
        assert!(
            stderr.contains(
                "no symbols for kstack.sys (kstack.pdb 6174736B6B63702D64622D67756964211): looked \
                 at /srv/symbols/kstack.pdb/6174736B6B63702D64622D67756964211 (absent), \
                 /srv/symbols/kstack.pdb (absent)"
            ),
            "{stderr}"
        );
        assert_eq!(
            stderr.matches("no symbols for").count(),
            2,
            "once per PDB: {stderr}"
        );
    }
    // An empty path means none, whatever the environment says.
    let off = std::process::Command::new(env!("CARGO_BIN_EXE_kstack"))
        .args(["read", "--tracer-frames", "--input", input, "--symbols", ""])
        .env("_NT_SYMBOL_PATH", "/srv/symbols")
        .output()
        .unwrap();
    assert!(off.status.success() && off.stderr.is_empty());
    assert_eq!(String::from_utf8(off.stdout).unwrap(), plain);
}

/// The README's offline example is the start of the golden output it
/// names, line for line (up to its `...`), so it cannot drift from what the
/// client prints.
#[test]
fn the_readme_example_is_the_golden_output() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let golden =
        std::fs::read_to_string(root.join("usermode-client/tests/golden/top-limited.txt")).unwrap();
    let example: Vec<&str> = readme
        .lines()
        .skip_while(|line| !line.starts_with("$ target/debug/kstack top --limit 2 --frames 2"))
        .skip(1)
        .take_while(|line| *line != "...")
        .collect();
    assert!(example.len() >= 3, "the README's example was not found");
    let start: Vec<&str> = golden.lines().take(example.len()).collect();
    assert_eq!(example, start);
}

/// `--limit 0` and `--frames 0` mean all, not none.
#[test]
fn top_limits_of_zero_mean_all() {
    let dir = scratch_dir("top-zero");
    let capture = dir.join("sample.kstack");
    write_capture(&capture);
    let all = stdout_of(&[
        "top",
        "--limit",
        "0",
        "--frames",
        "0",
        "--input",
        capture.to_str().unwrap(),
    ]);
    let every = stdout_of(&[
        "top",
        "--limit",
        "1000",
        "--frames",
        "1000",
        "--input",
        capture.to_str().unwrap(),
    ]);
    assert_eq!(all, every);
    assert!(all.starts_with("16 records, 9 unique stacks\n"), "{all}");
    assert!(!all.contains("more frame"), "{all}");
}

/// An offline question the capture cannot answer is an error, not an
/// empty answer: per-process module maps of a capture that saved none.
#[test]
fn process_module_maps_of_a_capture_without_them_are_an_error() {
    let dir = scratch_dir("no-process-modules");
    let capture = dir.join("bare.kstack");
    let file = std::fs::File::create(&capture).unwrap();
    kstack_client::capture::writer::CaptureWriter::new(
        file,
        &kstack_client::naming::modules::ModuleMap::default(),
    )
    .unwrap()
    .finish()
    .unwrap();
    let output = kstack(&[
        "modules",
        "--processes",
        "--input",
        capture.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(9), "{stderr}");
    assert!(
        stderr.contains("bare.kstack holds no user-mode module maps"),
        "{stderr}"
    );
    assert!(output.stdout.is_empty());
    #[cfg(not(windows))]
    {
        let live = kstack(&["modules", "--processes"]);
        assert_eq!(live.status.code(), Some(3), "live listing off Windows");
    }
}

/// `kstack verify` reads a capture through: whole (exit 0), damaged or
/// cut (exit 10, what it cost), or not a capture (exit 8).
#[test]
fn verify_reports_a_captures_health() {
    let dir = scratch_dir("verify");
    let capture = dir.join("sample.kstack");
    write_capture(&capture);
    let path = capture.to_str().unwrap();
    let whole = kstack(&["verify", path]);
    let text = String::from_utf8_lossy(&whole.stdout);
    assert_eq!(whole.status.code(), Some(0), "{text}");
    assert!(text.contains("health: whole"), "{text}");
    assert!(text.contains("capture format 7"), "{text}");
    let bytes = std::fs::read(&capture).unwrap();
    let mut damaged = bytes.clone();
    damaged[bytes.len() / 2] ^= 0x40;
    let damaged_path = dir.join("damaged.kstack");
    std::fs::write(&damaged_path, &damaged).unwrap();
    let cut_path = dir.join("cut.kstack");
    std::fs::write(&cut_path, &bytes[..bytes.len() - 3]).unwrap();
    for (file, whole, damaged_runs) in [
        (&capture, true, 0),
        (&damaged_path, false, 1),
        (&cut_path, false, 0),
    ] {
        let output = kstack(&["verify", "--json", file.to_str().unwrap()]);
        let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        assert_eq!(
            output.status.code(),
            Some(if whole { 0 } else { 10 }),
            "{report}"
        );
        assert_eq!(report["whole"], whole, "{report}");
        assert_eq!(report["damaged_runs"], damaged_runs, "{report}");
        assert_eq!(report["end_count"].is_null(), file == &cut_path, "{report}");
    }
    let missing = kstack(&["verify", dir.join("missing").to_str().unwrap()]);
    assert_eq!(missing.status.code(), Some(8));
}
