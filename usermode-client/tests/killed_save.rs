//! `kstack save` killed at random points (the real binary, on Linux, over
//! the test build's endless fake driver): every batch the driver handed
//! out before the last one is in the file, whole and in order, and the
//! reader says where the file was cut. The bound client.md states: a
//! process killed at any point loses at most the batch in hand.

#![cfg(unix)]

#[allow(
    dead_code,
    reason = "only the binary and the scratch folder are used here"
)]
mod common;

use std::{
    path::Path,
    process::{Command, Stdio},
    time::{Duration, SystemTime},
};

use common::{kstack, scratch_dir};
use kstack_client::{capture::reader::read_whole, device::test_support::EndlessDriver};

/// The last sequence number the driver logged as handed out.
fn last_handed(log: &Path) -> u64 {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .rev()
        .find_map(|line| line.parse().ok())
        .unwrap_or(0)
}

/// Starts `kstack save`, signals it with `signal` after `delay`, and
/// checks what it left.
fn kill_and_check(dir: &Path, signal: &str, delay: Duration, context: &str) {
    let log = dir.join("driver.log");
    let capture = dir.join("killed.kstack");
    let mut save = Command::new(env!("CARGO_BIN_EXE_kstack"))
        .args([
            "save",
            capture.to_str().unwrap(),
            "--duration",
            "60",
            "--interval",
            "2",
        ])
        .env(EndlessDriver::ENVIRONMENT_VARIABLE, &log)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(delay);
    let killed = Command::new("kill")
        .args([signal, &save.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success(), "{context}");
    let status = save.wait().unwrap();
    let handed = last_handed(&log);
    if handed == 0 {
        // Killed before the first read: nothing was drained.
        return;
    }
    let read = read_whole(std::fs::File::open(&capture).unwrap()).unwrap();
    let sequences: Vec<u64> = read.records.iter().map(|r| r.header.sequence).collect();
    let kept = sequences.len() as u64;
    assert!(
        sequences.iter().copied().eq(1..=kept),
        "{context}: the records kept are 1 to {kept} in order"
    );
    assert!(
        kept + EndlessDriver::BATCH >= handed && kept <= handed,
        "{context}: {handed} handed out, {kept} kept: more than the batch in hand lost"
    );
    for record in &read.records {
        let stack = EndlessDriver::stack(record.header.sequence);
        assert_eq!(record.frames[..], stack, "{context}");
    }
    let health = &read.health;
    assert_eq!(health.damaged_runs, 0, "{context}: {health}");
    if health.end_count.is_some() {
        // SIGTERM may end it as Ctrl-C does: finished, whole.
        assert_eq!(signal, "-TERM", "{context}");
        assert!(status.success(), "{context}: {status}");
        assert!(health.is_whole(), "{context}: {health}");
        return;
    }
    // What a reader says of the cut file.
    let output = kstack(&["top", "--input", capture.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&output.stderr)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert_eq!(output.status.code(), Some(10), "{context}: {stderr}");
    assert!(stderr.contains("it was cut short"), "{context}: {stderr}");
    if kept > 0 {
        assert!(
            stderr.contains(&format!("after shard 0's record sequence {kept}")),
            "{context}: {stderr}"
        );
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            stdout.starts_with(&format!("{kept} records, ")),
            "{context}: {stdout}"
        );
    }
}

#[test]
fn a_killed_save_keeps_every_batch_written_before_the_kill() {
    let seed = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos()
        | 1;
    // xorshift32: kill points spread over the first 600 ms.
    let mut state = seed;
    let mut next_delay = || {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        Duration::from_millis(u64::from(state % 600))
    };
    let dir = scratch_dir("killed-save");
    for round in 0..12 {
        let signal = if round % 3 == 2 { "-TERM" } else { "-KILL" };
        let delay = next_delay();
        let context = format!("seed {seed}, round {round}: {signal} after {delay:?}");
        kill_and_check(&dir, signal, delay, &context);
    }
}
