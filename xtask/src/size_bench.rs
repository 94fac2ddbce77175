//! `cargo xtask bench size`: the client's offline commands over captures of
//! 1 million and 10 million records (written by the synthetic capture
//! generator, `usermode-client/examples/synthetic_capture.rs`), each
//! command's wall time and peak resident memory (GNU time's `%e` and
//! `%M`), beside the tools that read our outputs doing their part: `go tool
//! pprof -top` on the pprof export and `inferno-flamegraph` on the folded
//! stacks, on the same machine in the same run. Results: performance.md.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::{
    host_setup,
    process::{self, Run},
};

/// The capture sizes measured, in records.
const SIZES: [u64; 2] = [1_000_000, 10_000_000];
/// inferno's command-line tools, the version of the library the client
/// draws with.
const INFERNO: &str = "inferno@0.12.8";

pub fn run(workspace: &Path) -> Result<()> {
    host_setup::ensure()?;
    let tools = workspace.join("target/bench-tools");
    let flamegraph = tools.join("bin/inferno-flamegraph");
    if !flamegraph.exists() {
        process::step(&format!(
            "installing {INFERNO}'s command-line tools into {}",
            tools.display()
        ));
        Run::new("cargo")
            .args(["install", "--locked", "--quiet", INFERNO, "--root"])
            .args([&tools])
            .run()?;
    }
    process::step("building the generator and the client (release)");
    // The generator needs the crate's test-support feature; the client is
    // built without it, as shipped.
    for target in [
        &[
            "--features",
            "test-support",
            "--example",
            "synthetic_capture",
        ][..],
        &["--bin", "kstack"],
    ] {
        process::cargo(
            workspace,
            &[
                &["build", "--release", "--locked", "-p", "kstack-client"][..],
                target,
            ]
            .concat(),
        )
        .run()?;
    }
    let release = workspace.join("target/release");
    let tools = Tools {
        kstack: release.join("kstack"),
        generator: release.join("examples/synthetic_capture"),
        flamegraph,
    };
    let dir = workspace.join("target/bench-size");
    std::fs::create_dir_all(&dir)?;
    println!("| records | file MiB | command | seconds | peak RSS MiB |");
    println!("|---:|---:|---|---:|---:|");
    for records in SIZES {
        measure(&tools, &dir, records)?;
    }
    Ok(())
}

/// The programs measured.
struct Tools {
    kstack: PathBuf,
    generator: PathBuf,
    flamegraph: PathBuf,
}

/// Writes a capture of `records` records in `dir`, measures each command
/// over it, and prints a table row for each.
fn measure(tools: &Tools, dir: &Path, records: u64) -> Result<()> {
    let out = |name: &str| dir.join(format!("{records}.{name}"));
    let (capture, folded, profile) = (out("kstack"), out("folded"), out("pb.gz"));
    let generated = timed(&tools.generator, &[&records.to_string(), path(&capture)?])?;
    let size = mib(std::fs::metadata(&capture)?.len());
    let row = |command: &str, (seconds, kib): (f64, u64)| {
        println!(
            "| {records} | {size} | {command} | {seconds:.2} | {} |",
            mib(kib * 1024)
        );
    };
    row("synthetic_capture (writing it)", generated);
    let input = path(&capture)?;
    for (command, args) in [
        ("kstack top", vec!["top", "--input", input]),
        (
            "kstack folded",
            vec!["folded", "--force", "-o", path(&folded)?, "--input", input],
        ),
        (
            "kstack flamegraph",
            vec![
                "flamegraph",
                "--force",
                "-o",
                path(&out("svg"))?,
                "--input",
                input,
            ],
        ),
        (
            "kstack export --format pprof",
            vec![
                "export",
                "--format",
                "pprof",
                "--force",
                "-o",
                path(&profile)?,
                "--input",
                input,
            ],
        ),
        ("kstack verify", vec!["verify", input]),
    ] {
        row(command, timed(&tools.kstack, &args)?);
    }
    row(
        "go tool pprof -top (the export)",
        timed(Path::new("go"), &["tool", "pprof", "-top", path(&profile)?])?,
    );
    row(
        "inferno-flamegraph (the folded file)",
        timed_to(&tools.flamegraph, &[path(&folded)?], &out("inferno.svg"))?,
    );
    println!(
        "| {records} | | folded file {} MiB, pprof export {} MiB | | |",
        mib(std::fs::metadata(&folded)?.len()),
        mib(std::fs::metadata(&profile)?.len())
    );
    // The largest files are not kept between runs.
    std::fs::remove_file(&capture)?;
    Ok(())
}

/// `bytes` in MiB, one decimal.
fn mib(bytes: u64) -> String {
    let tenths = bytes * 10 / (1 << 20);
    format!("{}.{}", tenths / 10, tenths % 10)
}

fn path(path: &Path) -> Result<&str> {
    path.to_str().context("a non-UTF-8 path")
}

/// Runs `program` with `args` under GNU time, its output discarded; returns
/// its wall time in seconds and peak resident memory in KiB.
fn timed(program: &Path, args: &[&str]) -> Result<(f64, u64)> {
    timed_to(program, args, Path::new("/dev/null"))
}

/// [`timed`], standard output written to `output`.
fn timed_to(program: &Path, args: &[&str], output: &Path) -> Result<(f64, u64)> {
    let report = tempfile_path(output);
    let out = std::fs::File::create(output)?;
    let status = std::process::Command::new("/usr/bin/time")
        .args(["-f", "%e %M", "-o"])
        .arg(&report)
        .arg(program)
        .args(args)
        .stdout(out)
        .stderr(std::process::Stdio::null())
        .status()
        .with_context(|| format!("running {} under /usr/bin/time", program.display()))?;
    if !status.success() {
        bail!("{} {} failed ({status})", program.display(), args.join(" "));
    }
    let text = std::fs::read_to_string(&report)?;
    let mut words = text.split_whitespace();
    let seconds = words
        .next()
        .and_then(|w| w.parse().ok())
        .context("GNU time's %e")?;
    let kib = words
        .next()
        .and_then(|w| w.parse().ok())
        .context("GNU time's %M")?;
    std::fs::remove_file(&report)?;
    Ok((seconds, kib))
}

/// Where GNU time writes its report for a run writing `output`.
fn tempfile_path(output: &Path) -> std::path::PathBuf {
    let mut name = output
        .file_name()
        .map(std::ffi::OsStr::to_os_string)
        .unwrap_or_default();
    if name.is_empty() || output == Path::new("/dev/null") {
        name = "time".into();
    }
    std::env::temp_dir().join(format!(
        "kstack-bench-{}-{}.time",
        std::process::id(),
        name.to_string_lossy()
    ))
}
