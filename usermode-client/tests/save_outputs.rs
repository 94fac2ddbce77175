//! Where `save` and `sample` write, by the rule every output follows
//! (client.md, "Commands"): `FILE` or `-o FILE`, `-` for standard output,
//! a device never, a `--duration` of more than 0. Over the test build's
//! endless fake driver (Linux).

#![cfg(unix)]

#[allow(
    dead_code,
    reason = "only the binary, the scratch folder and the synthetic capture are used here"
)]
mod common;

use std::process::{Command, Output, Stdio};

use common::{kstack, scratch_dir, write_capture};
use kstack_client::{capture::reader::read_whole, device::test_support::EndlessDriver};

/// `kstack args`, over the endless driver, in `dir`.
fn over_driver(dir: &std::path::Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kstack"))
        .args(args)
        .current_dir(dir)
        .env(EndlessDriver::ENVIRONMENT_VARIABLE, dir.join("driver.log"))
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn said(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn save_writes_file_or_o_file_or_standard_output_and_never_a_device() {
    let dir = scratch_dir("save-outputs");
    // `-`: the capture on standard output, whole, the summary on stderr.
    let piped = over_driver(&dir, &["save", "-", "--duration", "0.2"]);
    assert!(piped.status.success(), "{}", said(&piped));
    let read = read_whole(&piped.stdout[..]).unwrap();
    assert!(read.health.is_whole(), "{}", read.health);
    assert!(!read.records.is_empty());
    assert!(
        said(&piped).contains("written to standard output"),
        "{}",
        said(&piped)
    );
    assert!(!dir.join("-").exists(), "no file named -");
    // FILE and -o FILE alike; not both.
    for args in [&["save", "a.kstack"][..], &["save", "-o", "b.kstack"]] {
        let output = over_driver(&dir, args);
        assert!(output.status.success(), "{args:?}: {}", said(&output));
        let file = dir.join(args.last().unwrap());
        let read = read_whole(std::fs::File::open(file).unwrap()).unwrap();
        assert_eq!(
            read.records.len() as u64,
            EndlessDriver::BATCH,
            "drained once"
        );
    }
    let both = over_driver(&dir, &["save", "c.kstack", "-o", "d.kstack"]);
    assert_eq!(both.status.code(), Some(2), "{}", said(&both));
    let neither = over_driver(&dir, &["save"]);
    assert_eq!(neither.status.code(), Some(2), "{}", said(&neither));
    // A device, under any case or extension: refused before anything is
    // drained; no file made.
    for device in ["NUL", "nul.kstack", "COM1"] {
        let output = over_driver(&dir, &["save", device]);
        assert_eq!(output.status.code(), Some(8), "{device}: {}", said(&output));
        assert!(
            said(&output).contains("names a device"),
            "{}",
            said(&output)
        );
        assert!(!dir.join(device).exists());
    }
    // --duration 0 is refused, as any duration that is not more than 0.
    for duration in ["0", "-1", "nan"] {
        let duration = format!("--duration={duration}");
        let output = over_driver(&dir, &["save", "e.kstack", &duration]);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{duration}: {}",
            said(&output)
        );
        assert!(said(&output).contains("is not a positive number of seconds"));
    }
    // sample's live view draws on standard output: not with `-o -`.
    let live = over_driver(&dir, &["sample", "--pid", "4", "-o", "-", "--live"]);
    assert_eq!(live.status.code(), Some(8), "{}", said(&live));
    assert!(
        said(&live).contains("--live draws its view there"),
        "{}",
        said(&live)
    );
}

#[test]
fn every_output_refuses_a_device() {
    let dir = scratch_dir("device-outputs");
    let capture = dir.join("sample.kstack");
    write_capture(&capture);
    let input = capture.to_str().unwrap();
    for args in [
        &["folded", "--input", input, "-o", "NUL"][..],
        &["flamegraph", "--input", input, "-o", "con.svg"],
        &[
            "export",
            "--format",
            "pprof",
            "--input",
            input,
            "-o",
            "LPT1.pb.gz",
        ],
    ] {
        let output = kstack(args);
        assert_eq!(output.status.code(), Some(8), "{args:?}: {}", said(&output));
        assert!(
            said(&output).contains("names a device"),
            "{}",
            said(&output)
        );
    }
}

/// The capture files in `dir`, sorted.
fn parts_in(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.ends_with(".kstack"))
        .collect();
    names.sort();
    names
}

/// The sequence numbers of a part's records, which must read alone and
/// whole.
fn part_sequences(path: &std::path::Path) -> Vec<u64> {
    let read = read_whole(std::fs::File::open(path).unwrap()).unwrap();
    assert!(
        read.health.is_whole(),
        "{}: {}",
        path.display(),
        read.health
    );
    read.records.iter().map(|r| r.header.sequence).collect()
}

#[test]
fn max_size_writes_whole_parts_and_rotate_keeps_the_newest() {
    let dir = scratch_dir("save-parts");
    // All parts kept: together, every record once, in order.
    let all = dir.join("all");
    std::fs::create_dir_all(&all).unwrap();
    let output = over_driver(
        &all,
        &[
            "save",
            "trace.kstack",
            "--max-size",
            "1M",
            "--duration",
            "2",
            "--interval",
            "1",
        ],
    );
    assert!(output.status.success(), "{}", said(&output));
    let names = parts_in(&all);
    assert!(names.len() >= 3, "{names:?}: {}", said(&output));
    assert_eq!(names[0], "trace-0001.kstack");
    let sequences: Vec<u64> = names
        .iter()
        .flat_map(|name| part_sequences(&all.join(name)))
        .collect();
    assert!(
        sequences.iter().copied().eq(1..=sequences.len() as u64),
        "every record once, in order"
    );
    for name in &names[..names.len() - 1] {
        let size = std::fs::metadata(all.join(name)).unwrap().len();
        assert!(
            (1 << 20..(1 << 20) + (1 << 18)).contains(&size),
            "{name}: {size} bytes"
        );
    }
    assert!(
        said(&output).contains(&format!("{} parts, ", names.len())),
        "{}",
        said(&output)
    );
    // The parts of an earlier capture of the name are never mixed with a
    // new one's: refused, or with --force deleted first.
    let again = over_driver(&all, &["save", "trace.kstack", "--max-size", "1M"]);
    assert_eq!(again.status.code(), Some(8), "{}", said(&again));
    assert!(
        said(&again).contains("trace-0001.kstack"),
        "{}",
        said(&again)
    );
    let forced = over_driver(
        &all,
        &["save", "trace.kstack", "--max-size", "1M", "--force"],
    );
    assert!(forced.status.success(), "{}", said(&forced));
    assert_eq!(
        parts_in(&all),
        ["trace-0001.kstack"],
        "drained once: one part"
    );
    // --rotate keeps two parts at least: the one being written and one more.
    let one = over_driver(
        &dir,
        &["save", "x.kstack", "--max-size", "1M", "--rotate", "1"],
    );
    assert_eq!(one.status.code(), Some(2), "{}", said(&one));
    // Parts are files: not on standard output.
    let piped = over_driver(&dir, &["save", "-", "--max-size", "1M"]);
    assert_eq!(piped.status.code(), Some(8), "{}", said(&piped));
}

#[test]
fn rotate_keeps_the_newest_parts_and_says_what_it_deleted() {
    // --rotate 2: the newest two parts, the rest deleted and said.
    let rotated = scratch_dir("save-rotate");
    let output = over_driver(
        &rotated,
        &[
            "save",
            "-o",
            "ring.kstack",
            "--max-size",
            "1M",
            "--rotate",
            "2",
            "--duration",
            "2",
            "--interval",
            "1",
        ],
    );
    assert!(output.status.success(), "{}", said(&output));
    let names = parts_in(&rotated);
    assert_eq!(names.len(), 2, "{names:?}");
    let (older, newer) = (
        part_sequences(&rotated.join(&names[0])),
        part_sequences(&rotated.join(&names[1])),
    );
    // The newest part may have ended as soon as it began.
    assert!(
        newer
            .first()
            .is_none_or(|&first| first == older.last().unwrap() + 1),
        "the kept parts follow each other"
    );
    assert!(older[0] > 1, "the first parts were deleted");
    assert!(
        said(&output).contains("deleted by --rotate"),
        "{}",
        said(&output)
    );
}
