//! `cargo xtask`: kstack's build, test and demo entry points on a Linux host.
//!
//! Every command first makes sure the machine has what it needs (Debian
//! packages, rustup targets, the WDK-shaped tree, the patched wdk-build), so
//! each works on a fresh Debian 12 machine that only has rustup and cargo.
//! On Windows, build the driver with the real WDK through cargo-make instead
//! (see docs/windows-build.md).

#[cfg(target_os = "linux")]
mod host_setup;
#[cfg(target_os = "linux")]
mod inf_stamp;
#[cfg(target_os = "linux")]
mod kernel_host;
#[cfg(target_os = "linux")]
mod package;
#[cfg(target_os = "linux")]
mod process;
#[cfg(target_os = "linux")]
mod size_bench;
#[cfg(target_os = "linux")]
mod wdk_mingw;

#[cfg(target_os = "linux")]
use std::path::{Path, PathBuf};

#[cfg(target_os = "linux")]
use anyhow::{Context, Result, bail};
#[cfg(target_os = "linux")]
use kstack_tests::wine_host::WineHost;

#[cfg(target_os = "linux")]
const USAGE: &str = "\
usage: cargo xtask <command>

commands:
  setup        install what the Linux build needs (idempotent)
  build        build kstack.sys, kstack.inf and the client into the package folder
  test         build everything, then run lints and every test (CI runs this)
  demo         build, then run kstack.sys under Wine with the real client
  bench        run the benchmarks: ring, offline analysis, the client's read,
               draining the real driver under Wine, and the sampling load on the
               second kernel host (figures: docs/performance.md)
  bench drain  only the Wine drain: 5 interleaved pairs of runs, the stack table
               off then on; ends with one line: each one's median events drained
               per second and range, the per-pair ratio, events per MiB of ring
  bench sample only the sampling loads on the second kernel host: 100 threads at
               100 Hz through kstack sample's sampler, records and ring bytes a
               second; then 95 waiting and 5 running, listed with and without
               thread states, APCs and interrupted waits a second side by side
               (about six minutes of emulation)
  bench size   only the client's offline commands over captures of 1 and 10
               million records: time and peak memory of top, folded, flamegraph,
               export and verify, beside go tool pprof and inferno-flamegraph
  kernel-host  build, then run only the second kernel host: kstack.sys under
               speakeasy with a modelled ntoskrnl (tests/kernel_host/)
  package-dir  print the package folder
  help         print this text";

#[cfg(not(target_os = "linux"))]
fn main() {
    eprintln!(
        "xtask: `cargo xtask` drives the Linux build; on Windows build with the WDK through `cargo make` (docs/windows-build.md)"
    );
    std::process::exit(1);
}

#[cfg(target_os = "linux")]
fn main() {
    if let Err(error) = run(&std::env::args().skip(1).collect::<Vec<_>>()) {
        eprintln!("xtask: error: {error:#}");
        std::process::exit(1);
    }
}

#[cfg(target_os = "linux")]
fn run(args: &[String]) -> Result<()> {
    let workspace = workspace_root()?;
    if let [bench, which] = args
        && bench == "bench"
    {
        return match which.as_str() {
            "drain" => wine_drain_bench(&workspace),
            "sample" => sample_bench(&workspace),
            "size" => size_bench::run(&workspace),
            other => bail!("unknown bench `{other}`\n\n{USAGE}"),
        };
    }
    let [command] = args else {
        bail!("expected exactly one command\n\n{USAGE}");
    };
    match command.as_str() {
        "setup" => {
            wdk_mingw::prepare(&workspace)?;
        }
        "build" => {
            package::build(&workspace)?;
        }
        "test" => test(&workspace)?,
        "demo" => demo(&workspace)?,
        "bench" => {
            // The offline analysis names frames from the package's kstack.pdb.
            let built = package::build(&workspace)?;
            process::step("criterion benchmarks (results: docs/performance.md)");
            for (package, bench) in [
                ("kstack-driver-core", "ring"),
                ("kstack-client", "analysis"),
                ("kstack-client", "read"),
            ] {
                process::cargo(
                    &workspace,
                    &["bench", "--locked", "--package", package, "--bench", bench],
                )
                .env(package::PACKAGE_DIR_ENV, &built.dir)
                .run()?;
            }
            wine_drain_bench(&workspace)?;
            sample_bench(&workspace)?;
        }
        "kernel-host" => {
            let built = package::build(&workspace)?;
            kernel_host_step(&workspace, &built.dir)?;
        }
        "package-dir" => println!("{}", package::package_dir(&workspace).display()),
        "help" | "--help" | "-h" => println!("{USAGE}"),
        other => bail!("unknown command `{other}`\n\n{USAGE}"),
    }
    Ok(())
}

#[cfg(target_os = "linux")]
/// Builds the real artifacts, then runs formatting, lint and every test.
fn test(workspace: &Path) -> Result<()> {
    let built = package::build(workspace)?;
    process::step("formatting check");
    process::cargo(workspace, &["fmt", "--all", "--check"]).run()?;
    process::step("clippy (host crates)");
    process::cargo(
        workspace,
        &[
            "clippy",
            "--locked",
            "--workspace",
            "--exclude",
            "kstack-driver",
            "--all-targets",
        ],
    )
    .args(["--", "-D", "warnings"])
    .run()?;
    process::step("clippy (driver, x86_64-pc-windows-msvc)");
    package::driver_clippy(workspace, &built.toolchain)?;
    process::step("cargo check of the client for x86_64-pc-windows-msvc");
    process::cargo(
        workspace,
        &[
            "check",
            "--locked",
            "--package",
            "kstack-client",
            "--target",
            package::MSVC_TARGET,
        ],
    )
    .run()?;
    kernel_host_step(workspace, &built.dir)?;
    process::step(
        "loom model check of the concurrency scenarios (ring, shards, rundown gate, read and clear, stack table)",
    );
    // Own target dir: --cfg loom changes every crate's build.
    process::cargo(
        workspace,
        &[
            "test",
            "--locked",
            "--release",
            "--package",
            "kstack-driver-core",
            "--test",
            "concurrency",
        ],
    )
    .env("RUSTFLAGS", "--cfg loom")
    .env("CARGO_TARGET_DIR", workspace.join("target/loom"))
    .run()?;
    process::step(
        "Miri: kstack-abi's and kstack-driver-core's unit tests, then the concurrency scenarios under 4 seeds \
         (undefined behaviour, data races, leaks)",
    );
    miri(
        workspace,
        &["-p", "kstack-abi", "-p", "kstack-driver-core", "--lib"],
        &[],
    )?;
    miri(
        workspace,
        &["-p", "kstack-driver-core", "--test", "concurrency"],
        &["-Zmiri-many-seeds=0..4"],
    )?;
    process::step("tests");
    process::cargo(
        workspace,
        &[
            "test",
            "--locked",
            "--workspace",
            "--exclude",
            "kstack-driver",
        ],
    )
    .env(package::PACKAGE_DIR_ENV, &built.dir)
    .env(
        package::WINE_SUPPORT_DIR_ENV,
        package::wine_support_dir(workspace),
    )
    .run()?;
    Ok(())
}

#[cfg(target_os = "linux")]
/// The sampling load on the second kernel host, on a fresh package.
fn sample_bench(workspace: &Path) -> Result<()> {
    let built = package::build(workspace)?;
    process::step("the sampling loads on the second kernel host (tests/kernel_host/measure.py)");
    kernel_host::measure(workspace, &built.dir, "sampling")?;
    kernel_host::measure(workspace, &built.dir, "sampling_states")
}

#[cfg(target_os = "linux")]
/// The second kernel host, on the package in `package_dir`.
fn kernel_host_step(workspace: &Path, package_dir: &Path) -> Result<()> {
    process::step(
        "second kernel host: kstack.sys under speakeasy with a modelled ntoskrnl (IRQL, pool, \
         registrations, forced failures)",
    );
    kernel_host::run(workspace, package_dir)
}

#[cfg(target_os = "linux")]
/// The demo: the real kstack.sys in a private Wine prefix, installed with
/// Wine's sc.exe and driven by the real client, step by step.
fn demo(workspace: &Path) -> Result<()> {
    let built = package::build(workspace)?;
    let prefix = workspace.join("target/wine-demo/prefix");
    process::step(&format!(
        "making a private Wine prefix in {} (about 10 s)",
        prefix.display()
    ));
    let wine = WineHost::create(&prefix, &built.dir, &package::wine_support_dir(workspace))
        .map_err(anyhow::Error::msg)?;
    let result = demo_steps(&wine, &built.dir);
    process::step("sc stop kstack (DriverUnload runs), sc delete kstack");
    let stopped = wine.stop_driver().and_then(|()| wine.delete_service());
    wine.shut_down();
    result?;
    stopped.map_err(anyhow::Error::msg)?;
    println!();
    println!(
        "Demo finished. The package (kstack.sys, kstack.pdb, kstack.inf, kstack.exe) is in {}.",
        built.dir.display()
    );
    Ok(())
}

#[cfg(target_os = "linux")]
/// `cargo miri test` with `args` on the pinned nightly. Proptests run 8
/// cases each (Miri interprets every access), drawn with proptest's
/// xorshift generator rather than its default `ChaCha` one: a `prop_oneof!`
/// seeds a new generator for each alternative it keeps for shrinking, and
/// under Miri seeding `ChaCha` was a third of what
/// `counters_add_up_after_every_step` interpreted (xorshift, per case,
/// about a tenth of that). They keep no failure files (Miri isolates the
/// tests from the file system); `flags` go to Miri.
fn miri(workspace: &Path, args: &[&str], flags: &[&str]) -> Result<()> {
    let forwarded = [
        "PROPTEST_CASES",
        "PROPTEST_RNG_ALGORITHM",
        "PROPTEST_DISABLE_FAILURE_PERSISTENCE",
    ];
    let miri_flags: Vec<String> = forwarded
        .iter()
        .map(|name| format!("-Zmiri-env-forward={name}"))
        .chain(flags.iter().map(|&flag| flag.to_owned()))
        .collect();
    process::Run::new("rustup")
        .args([
            "run",
            host_setup::MIRI_TOOLCHAIN,
            "cargo",
            "miri",
            "test",
            "--locked",
        ])
        .args(args)
        .current_dir(workspace)
        .env("PROPTEST_CASES", "8")
        .env("PROPTEST_RNG_ALGORITHM", "xs")
        .env("PROPTEST_DISABLE_FAILURE_PERSISTENCE", "true")
        .env("MIRIFLAGS", miri_flags.join(" "))
        .run()
}

/// The demo's capture and flamegraph, in the client's folder in the prefix.
#[cfg(target_os = "linux")]
const DEMO_CAPTURE: &str = "demo.kstack";
#[cfg(target_os = "linux")]
const DEMO_FLAMEGRAPH: &str = "demo-flamegraph.svg";

#[cfg(target_os = "linux")]
fn demo_steps(wine: &WineHost, package: &Path) -> Result<()> {
    let client = |args: &[&str]| -> Result<()> {
        println!("    > kstack {}", args.join(" "));
        let output = wine.client(args).map_err(anyhow::Error::msg)?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        // Summaries (save, flamegraph) and errors go to stderr.
        for line in stdout.lines().take(40).chain(stderr.lines()) {
            println!("      {line}");
        }
        if !output.status.success() {
            bail!("kstack {} failed ({})", args.join(" "), output.status);
        }
        Ok(())
    };
    process::step("sc create kstack type= kernel ... ; sc start kstack");
    wine.start_driver().map_err(anyhow::Error::msg)?;
    client(&["status"])?;
    process::step(
        "selftest: the driver captures the stack of this very request; --tracer-frames shows kstack.sys's \
         own frames too (stacks start below them by default, and under Wine the frames below are Wine's, \
         which its module list does not name)",
    );
    client(&["selftest", "--tracer-frames"])?;
    process::step(
        "timer sampling walks stacks at DISPATCH_LEVEL, which is only safe when executive code cannot be \
         paged out: setting DisablePagingExecutive=1 in this prefix's registry (on a real machine: temporary, \
         for diagnosis), then rebooting (here: a new wineserver), since the value applies from the next boot",
    );
    wine.stop_driver().map_err(anyhow::Error::msg)?;
    wine.set_disable_paging_executive(Some(1))
        .map_err(anyhow::Error::msg)?;
    wine.reboot().map_err(anyhow::Error::msg)?;
    wine.start_driver().map_err(anyhow::Error::msg)?;
    client(&["status"])?;
    client(&[
        "config",
        "--enable",
        "timer,ondemand",
        "--timer-period",
        "10",
        "--frames",
        "16",
    ])?;
    process::step("watching for 2 seconds");
    let output = wine
        .client(&["watch", "--duration", "2", "--tracer-frames"])
        .map_err(anyhow::Error::msg)?;
    let text = String::from_utf8_lossy(&output.stdout);
    let records = text.lines().filter(|line| line.starts_with('#')).count();
    for line in text.lines().take(12) {
        println!("      {line}");
    }
    println!("      ... ({records} records in all)");
    println!("      {}", String::from_utf8_lossy(&output.stderr).trim());
    process::step(
        "saving 2 seconds of samples with their module list, then the most frequent stacks",
    );
    let _ = std::fs::remove_file(wine.client_dir().join(DEMO_CAPTURE));
    client(&["save", DEMO_CAPTURE, "--duration", "2"])?;
    client(&[
        "top",
        "--input",
        DEMO_CAPTURE,
        "--limit",
        "3",
        "--frames",
        "6",
        "--tracer-frames",
    ])?;
    process::step("a flamegraph of the capture, drawn by inferno");
    let svg = wine.client_dir().join(DEMO_FLAMEGRAPH);
    let _ = std::fs::remove_file(&svg);
    client(&[
        "flamegraph",
        "--input",
        DEMO_CAPTURE,
        "-o",
        DEMO_FLAMEGRAPH,
        "--tracer-frames",
    ])?;
    println!("      open {} in a browser", svg.display());
    demo_symbols(wine, package, &client)?;
    client(&["config", "--disable", "all"])?;
    client(&["status"])?;
    Ok(())
}

/// Ring capacity in KiB, and records per round, of the Wine drain
/// benchmark. The ring is the largest allowed: a round's captures may all
/// land in one shard, and each of the shards (one per processor) holds its
/// share of the ring.
#[cfg(target_os = "linux")]
const DRAIN_BENCH_RING: u32 = 147_456;
#[cfg(target_os = "linux")]
const DRAIN_BENCH_RECORDS: &str = "60000";
#[cfg(target_os = "linux")]
const DRAIN_BENCH_ROUNDS: &str = "3";
/// Pairs of runs, table off then on: the configurations interleaved, so
/// the machine's drift between them shows in every pair, not as a gap
/// between two blocks of runs.
#[cfg(target_os = "linux")]
const DRAIN_BENCH_PAIRS: usize = 5;

/// Drains the real driver under Wine in batches (kstack-drain-bench),
/// in [`DRAIN_BENCH_PAIRS`] pairs of runs with the stack table off
/// (`StackTableEntries`=0) then on (the default), in one prefix; ends with
/// one line: each configuration's median over the pairs with its range, and
/// the per-pair ratio's median and range.
#[cfg(target_os = "linux")]
/// The demo's step naming kstack.sys's frames from kstack.pdb.
fn demo_symbols(
    wine: &WineHost,
    package: &Path,
    client: &impl Fn(&[&str]) -> Result<()>,
) -> Result<()> {
    process::step(
        "function names and source lines from kstack.pdb: the package's kstack.sys and kstack.pdb \
         copied to C:\\symbols",
    );
    let symbols = wine.drive_c().join("symbols");
    std::fs::create_dir_all(&symbols).with_context(|| format!("creating {}", symbols.display()))?;
    for file in ["kstack.sys", "kstack.pdb"] {
        std::fs::copy(package.join(file), symbols.join(file))
            .with_context(|| format!("copying {file} to {}", symbols.display()))?;
    }
    client(&[
        "top",
        "--input",
        DEMO_CAPTURE,
        "--limit",
        "1",
        "--frames",
        "4",
        "--symbols",
        r"C:\symbols",
        "--tracer-frames",
    ])?;
    Ok(())
}

#[cfg(target_os = "linux")]
fn wine_drain_bench(workspace: &Path) -> Result<()> {
    let built = package::build(workspace)?;
    let prefix = workspace.join("target/wine-bench/prefix");
    process::step("drain throughput of the real driver under Wine (results: docs/performance.md)");
    let wine = WineHost::create(&prefix, &built.dir, &package::wine_support_dir(workspace))
        .map_err(anyhow::Error::msg)?;
    let mut pairs = Vec::with_capacity(DRAIN_BENCH_PAIRS);
    for _ in 0..DRAIN_BENCH_PAIRS {
        let pair = drain_bench_run(&wine, Some(0))
            .and_then(|off| drain_bench_run(&wine, None).map(|on| (off, on)));
        match pair {
            Ok(pair) => pairs.push(pair),
            Err(error) => {
                wine.shut_down();
                return Err(error);
            }
        }
    }
    wine.shut_down();
    println!("{}", drain_summary(&pairs));
    Ok(())
}

/// One drain benchmark run's events per second and events per MiB.
#[cfg(target_os = "linux")]
type DrainRun = (f64, f64);

/// The drain benchmark's closing line over its pairs of runs, table off
/// then on.
#[cfg(target_os = "linux")]
fn drain_summary(pairs: &[(DrainRun, DrainRun)]) -> String {
    let spread = |values: Vec<f64>| {
        let mut values = values;
        values.sort_by(f64::total_cmp);
        let median = values.get(values.len() / 2).copied().unwrap_or(0.0);
        let low = values.first().copied().unwrap_or(0.0);
        let high = values.last().copied().unwrap_or(0.0);
        (median, low, high)
    };
    let off = spread(pairs.iter().map(|((rate, _), _)| *rate).collect());
    let on = spread(pairs.iter().map(|(_, (rate, _))| *rate).collect());
    let ratio = spread(
        pairs
            .iter()
            .map(|((off, _), (on, _))| on / off.max(f64::MIN_POSITIVE))
            .collect(),
    );
    let per_mib =
        |pick: fn(&(DrainRun, DrainRun)) -> f64| spread(pairs.iter().map(pick).collect()).0;
    format!(
        "drain ({} interleaved pairs): table off median {:.0} events/s (min {:.0}, max {:.0}), \
         on median {:.0} (min {:.0}, max {:.0}); on/off per pair median {:.2}x (min {:.2}x, \
         max {:.2}x); events per MiB off {:.0}, on {:.0}",
        pairs.len(),
        off.0,
        off.1,
        off.2,
        on.0,
        on.1,
        on.2,
        ratio.0,
        ratio.1,
        ratio.2,
        per_mib(|((_, per_mib), _)| *per_mib),
        per_mib(|(_, (_, per_mib))| *per_mib),
    )
}

/// One run of kstack-drain-bench with `StackTableEntries` set to `entries`
/// (or absent): its median events per second and events per MiB of ring.
#[cfg(target_os = "linux")]
fn drain_bench_run(wine: &WineHost, entries: Option<u32>) -> Result<DrainRun> {
    let table = entries.map_or_else(|| "default".to_owned(), |entries| entries.to_string());
    process::step(&format!("kstack-drain-bench, StackTableEntries {table}"));
    if wine.driver_running() {
        wine.stop_driver().map_err(anyhow::Error::msg)?;
    }
    let output = wine
        .set_ring_capacity(Some(DRAIN_BENCH_RING))
        .and_then(|()| wine.set_stack_table_entries(entries))
        .and_then(|()| wine.start_driver())
        .and_then(|()| {
            wine.program(
                "kstack-drain-bench.exe",
                &[DRAIN_BENCH_RECORDS, DRAIN_BENCH_ROUNDS],
            )
        })
        .map_err(anyhow::Error::msg)?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    print!("{stdout}");
    eprint!("{}", String::from_utf8_lossy(&output.stderr));
    if !output.status.success() {
        bail!("kstack-drain-bench failed ({})", output.status);
    }
    wine.stop_driver().map_err(anyhow::Error::msg)?;
    // The program's last line: `result: <events/s> <events per MiB>`.
    let figures: Vec<f64> = stdout
        .lines()
        .find_map(|line| line.strip_prefix("result: "))
        .context("kstack-drain-bench printed no result line")?
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .context("kstack-drain-bench's result line")?;
    let [rate, per_mib] = figures[..] else {
        bail!(
            "kstack-drain-bench's result line has {} figures",
            figures.len()
        );
    };
    Ok((rate, per_mib))
}

#[cfg(target_os = "linux")]
/// The workspace root: the parent of this crate's manifest directory.
fn workspace_root() -> Result<PathBuf> {
    let manifest_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .map(Path::to_path_buf)
        .context("xtask's manifest directory has no parent")
}
