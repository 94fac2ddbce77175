//! End to end on Linux: the real kstack.sys in Wine 8, installed and driven
//! with Wine's `sc.exe`, and the real client talking to it. Nothing here is
//! mocked.
//!
//! One private prefix serves every case, so the cases run in order from a
//! plain `main` (no libtest): each starts from a running driver with nothing
//! enabled, and the run ends with the closing line `N passed, N failed`.
//!
//! What Wine cannot show, and these tests therefore do not claim: real IRQL
//! (CR8 reads 0 even in a DPC, so timer records say irql 0), paging, and the
//! process, thread, object and registry callbacks (Wine never fires them).

use std::{
    collections::{BTreeMap, BTreeSet},
    env,
    path::{Path, PathBuf},
    process::{ExitCode, Output},
    thread,
    time::{Duration, Instant},
};

use kstack_abi::{
    SourceFacts,
    messages::FaultProbe,
    source_facts::{HandleOperation, Lifecycle, ObjectKind},
};
use kstack_tests::wine_host::{INJECTION_DRIVER_DIR, WineHost, WineResult};
use object::read::pe::{ImageNtHeaders, ImageOptionalHeader, PeFile64};
use serde_json::Value;

/// A case: `Ok` or what went wrong.
type Case = fn(&Context) -> WineResult<()>;

struct Context {
    wine: WineHost,
    package: PathBuf,
    wine_support: PathBuf,
}

fn main() -> ExitCode {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace")
        .to_path_buf();
    let from_env = |name: &str, default: &str| {
        env::var_os(name)
            .filter(|dir| !dir.is_empty())
            .map_or_else(|| workspace.join(default), PathBuf::from)
    };
    let package = from_env("KSTACK_PACKAGE_DIR", "target/kstack-package");
    let wine_support = from_env("KSTACK_WINE_SUPPORT_DIR", "target/kstack-wine");
    let prefix = workspace.join("target/wine-tests/prefix");

    let started = Instant::now();
    let wine = match WineHost::create(&prefix, &package, &wine_support) {
        Ok(wine) => wine,
        Err(error) => {
            eprintln!(
                "setting up the Wine prefix failed (run `cargo xtask test`, which builds the package):\n{error}"
            );
            println!("0 passed, 1 failed");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "Wine prefix ready in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let context = Context {
        wine,
        package,
        wine_support,
    };
    // `cargo test --test wine_end_to_end -- WORD...` runs only the cases
    // whose names contain one of the words (all when none is given).
    let words: Vec<String> = env::args()
        .skip(1)
        .filter(|arg| !arg.starts_with('-'))
        .collect();
    let cases = cases()
        .into_iter()
        .filter(|(name, _)| words.is_empty() || words.iter().any(|word| name.contains(word)));
    let (mut passed, mut failed) = (0, 0);
    for (name, case) in cases {
        let started = Instant::now();
        let result = fresh_driver(&context.wine).and_then(|()| case(&context));
        let seconds = started.elapsed().as_secs_f64();
        match result {
            Ok(()) => {
                passed += 1;
                println!("ok     {name} ({seconds:.1} s)");
            }
            Err(error) => {
                failed += 1;
                println!("FAILED {name} ({seconds:.1} s)\n{error}\n");
            }
        }
    }
    context.wine.shut_down();
    println!("{passed} passed, {failed} failed");
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Every case, in the order they run.
fn cases() -> [(&'static str, Case); 23] {
    [
        (
            "lifecycle: create, start, stop (device gone), delete, start again",
            lifecycle,
        ),
        (
            "status reports the driver as loaded",
            status_reports_the_driver,
        ),
        (
            "configure round trip, and bad settings refused locally",
            configure_round_trip,
        ),
        (
            "capture-now frames start inside kstack.sys (shown with --tracer-frames, hidden by default)",
            capture_now_frames_are_in_kstack,
        ),
        (
            "threads and sample: refused under Wine (no APC delivery), said in words, the source unavailable, nothing changed; threads listed without states",
            threads_are_refused_under_wine,
        ),
        (
            "kstack.pdb names kstack.sys's functions, live and offline, as on Linux and as llvm-symbolizer",
            pdb_symbols_name_functions,
        ),
        (
            "read returns whole records in order; clear discards them",
            read_and_clear,
        ),
        (
            "save, then top, folded and flamegraph of the capture, the same under Wine and on Linux",
            save_and_analyze,
        ),
        (
            "injection (test build): process, thread, image, registry and object callbacks record",
            injected_events_are_recorded,
        ),
        (
            "injection (test build): process lists and 1-in-N sampling count every event once",
            filters_and_sampling_count_every_event,
        ),
        (
            "user frames: unavailable under Wine (its RtlWalkFrameChain is a stub, never called); every record of a source that asks for them says so, the others say off, the outcomes add up",
            user_frames_unavailable_under_wine,
        ),
        (
            "modules --processes lists running processes' modules (the client's own among them) and counts the unreadable",
            running_processes_modules_are_listed,
        ),
        (
            "module records (test build): injected image loads and process exits are recorded with every source disabled; a saved capture carries them",
            module_records_are_kept,
        ),
        (
            "module records: a real driver load in kstack's host process, reported by Wine's loader, is recorded with its path, base, size and identity",
            real_image_loads_are_recorded,
        ),
        (
            "fault scope (test build): a read through an unmapped pointer is caught, a mapped one returns its value",
            fault_scope_catches_a_fault,
        ),
        (
            "the release driver refuses injection and fault-probe requests",
            release_driver_refuses_injection,
        ),
        (
            "stack table: each reader gets every record's frames, the lookups add up; StackTableEntries=0 turns it off",
            stack_table_per_reader,
        ),
        (
            "DisablePagingExecutive: in effect only after a reboot or by the override; the timer follows",
            timer_follows_the_paging_policy,
        ),
        (
            "tiny ring: every sequence number is received or counted as dropped",
            overflow_loses_nothing_silently,
        ),
        (
            "save killed after draining, then mid-capture: the file, a read after and the batch in hand account for every sequence number",
            killed_save_loses_nothing_drained,
        ),
        (
            "reads in time order under load: two processes capturing and draining, the timer sampling; counters add up",
            order_under_load,
        ),
        (
            "10,000 bad requests answered exactly as kstack-driver-core answers; still serving",
            bad_input_storm,
        ),
        (
            "100 start/stop cycles with the timer firing: no pool left at any unload",
            start_stop_cycles,
        ),
    ]
}

/// Every case starts from a freshly started driver with default settings.
fn fresh_driver(wine: &WineHost) -> WineResult<()> {
    if wine.driver_running() {
        wine.stop_driver()?;
    }
    wine.set_disable_paging_executive(None)?;
    wine.set_assume_paging_executive_in_effect(None)?;
    wine.set_ring_capacity(None)?;
    wine.set_stack_table_entries(None)?;
    wine.start_driver()
}

fn ensure(condition: bool, message: impl FnOnce() -> String) -> WineResult<()> {
    if condition { Ok(()) } else { Err(message()) }
}

fn status(wine: &WineHost) -> WineResult<Value> {
    let text = wine.client_ok(&["status", "--json"])?;
    serde_json::from_str(&text)
        .map_err(|error| format!("status --json is not JSON ({error}): {text}"))
}

fn json_lines(text: &str) -> WineResult<Vec<Value>> {
    text.lines()
        .map(|line| {
            serde_json::from_str(line).map_err(|error| format!("not a JSON line ({error}): {line}"))
        })
        .collect()
}

fn lifecycle(context: &Context) -> WineResult<()> {
    let wine = &context.wine;
    wine.client_ok(&["status"])?;
    wine.stop_driver()?;
    let stopped = wine.client(&["status"])?;
    let stderr = said(&stopped.stderr);
    ensure(
        stopped.status.code() == Some(3) && stderr.contains("sc.exe start kstack"),
        || {
            format!(
                "with the driver stopped, status should exit 3 and say how to start it: {:?} {stderr}",
                stopped.status
            )
        },
    )?;
    wine.delete_service()?;
    wine.create_service()?;
    wine.start_driver()?;
    wine.client_ok(&["status"]).map(drop)
}

fn status_reports_the_driver(context: &Context) -> WineResult<()> {
    let status = status(&context.wine)?;
    let expect = |pointer: &str, wanted: Value| {
        let actual = status.pointer(pointer).cloned().unwrap_or(Value::Null);
        ensure(actual == wanted, || {
            format!("status{pointer} is {actual}, expected {wanted}\n{status:#}")
        })
    };
    expect("/abi_version", Value::from(kstack_abi::ABI_VERSION))?;
    expect("/driver_version", Value::from(env!("CARGO_PKG_VERSION")))?;
    expect("/disable_paging_executive", Value::Null)?;
    expect(
        "/paging_executive/decided_by",
        Value::from("not_configured"),
    )?;
    expect("/elevated_walks_allowed", Value::Bool(false))?;
    expect("/read", Value::from(0))?;
    // ObRegisterCallbacks succeeds under Wine at kstack's default altitude;
    // Wine 8 has no CmRegisterCallbackEx, so no registry altitude.
    expect(
        "/altitudes/object",
        Value::from(kstack_abi::altitude::OBJECT_ALTITUDE_DEFAULT.to_string()),
    )?;
    expect("/altitudes/registry", Value::Null)?;
    expect("/ring/capacity_bytes", Value::from(9 * 1024 * 1024))?;
    expect("/ring/used_bytes", Value::from(0))?;
    expect("/ring/used", Value::from(0))?;
    expect("/sequences_spent", Value::from(0))?;
    // One shard per processor Wine reports (KeQueryActiveProcessorCountEx).
    let shards = status["ring"]["shards"].as_u64().unwrap_or_default();
    ensure(
        (1..=u64::from(kstack_abi::MAX_SHARDS)).contains(&shards),
        || format!("status/ring/shards is {shards}\n{status:#}"),
    )?;
    // DriverStart and DriverSize: kstack.sys at its preferred base.
    let (start, end) = kstack_image_range(&context.package)?;
    expect("/driver_image/base", Value::from(format!("{start:#x}")))?;
    expect("/driver_image/size", Value::from(end - start))?;
    // The state block, the ring, the thread-capture slots and the
    // user-walk guard: all the driver allocates.
    expect("/pool_allocations", Value::from(4))?;
    let sources = status["sources"].as_array().cloned().unwrap_or_default();
    for source in &sources {
        let name = source["name"].as_str().unwrap_or_default();
        // Wine 8 has no CmRegisterCallbackEx: the registry source is reported
        // unavailable with STATUS_NOT_SUPPORTED; its KeInsertQueueApc is a
        // stub: the threadstack source is unavailable with
        // KSTACK_STATUS_NO_APC; everything else registers.
        let (available, registration) = match name {
            "registry" => (false, "0xc00000bb"),
            "threadstack" => (false, "0xe0b50005"),
            _ => (true, "0x00000000"),
        };
        ensure(
            source["available"] == available && source["registration"] == registration,
            || format!("source {name}: {source}"),
        )?;
        ensure(source["enabled"] == false, || {
            format!("source {name} enabled at load: {source}")
        })?;
        ensure(
            [
                "captured",
                "skipped_irql",
                "skipped_stack",
                "filtered",
                "not_kept",
                "sampled_out",
            ]
            .iter()
            .all(|counter| source[*counter] == 0),
            || format!("source {name} counted something at load: {source}"),
        )?;
    }
    ensure(sources.len() == kstack_abi::Source::COUNT, || {
        format!("{} sources reported", sources.len())
    })
}

fn configure_round_trip(context: &Context) -> WineResult<()> {
    let wine = &context.wine;
    wine.client_ok(&[
        "config",
        "--enable",
        "process,thread,image,object,ondemand",
        "--skip",
        "1",
        "--frames",
        "40",
        "--pid",
        "4,8",
        "--exclude-pid",
        "0",
        "--sample",
        "registry=10,timer=2",
        "--timer-period",
        "25",
    ])?;
    let status = status(wine)?;
    let config = &status["config"];
    ensure(
        config["frames_to_skip"] == 1
            && config["frames_to_capture"] == 40
            && config["timer_period_ms"] == 25
            && config["processes"]["include"] == serde_json::json!([4, 8])
            && config["processes"]["exclude"] == serde_json::json!([0]),
        || format!("config after configure: {config}"),
    )?;
    let rates: Vec<(&str, u64)> = status["sources"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|source| Some((source["name"].as_str()?, source["sample_every"].as_u64()?)))
        .filter(|&(_, every)| every != 1)
        .collect();
    ensure(rates == [("registry", 10), ("timer", 2)], || {
        format!("sampling after configure: {rates:?}")
    })?;
    wine.client_ok(&[
        "config",
        "--pid",
        "all",
        "--exclude-pid",
        "none",
        "--sample",
        "registry=1,timer=1",
    ])?;
    let enabled: BTreeSet<&str> = status["sources"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|source| source["enabled"] == true)
        .filter_map(|source| source["name"].as_str())
        .collect();
    ensure(
        enabled == BTreeSet::from(["image", "object", "ondemand", "process", "thread"]),
        || format!("enabled sources: {enabled:?}"),
    )?;
    wine.client_ok(&["config", "--disable", "all"])?;
    // Refused by the client before anything is sent, with the reason.
    let refused = wine.client(&["config", "--frames", "0"])?;
    let stderr = said(&refused.stderr);
    ensure(
        refused.status.code() == Some(2) && stderr.contains("frames to capture is 0"),
        || {
            format!(
                "--frames 0 should be refused with exit 2: {:?} {stderr}",
                refused.status
            )
        },
    )?;
    // The registry source is unavailable under Wine: the driver refuses it.
    let unavailable = wine.client(&["config", "--enable", "registry"])?;
    let stderr = said(&unavailable.stderr);
    ensure(
        unavailable.status.code() == Some(5) && stderr.contains("0xc00000bb"),
        || {
            format!(
                "enabling the registry source should be refused by the driver: {:?} {stderr}",
                unavailable.status
            )
        },
    )?;
    let status = self::status(wine)?;
    ensure(
        status["sources"]
            .as_array()
            .into_iter()
            .flatten()
            .all(|source| source["enabled"] == false),
        || format!("refused requests must change nothing: {status}"),
    )
}

/// The address range kstack.sys occupies when loaded at its preferred base
/// (Wine loads it there when the range is free; a relocation makes this
/// case fail, visibly).
fn kstack_image_range(package: &Path) -> WineResult<(u64, u64)> {
    image_range(&package.join("kstack.sys"))
}

/// Where the PE image at `path` asks to be loaded: its preferred base and
/// one past its end.
fn image_range(path: &Path) -> WineResult<(u64, u64)> {
    let image =
        std::fs::read(path).map_err(|error| format!("reading {}: {error}", path.display()))?;
    let pe =
        PeFile64::parse(&*image).map_err(|error| format!("parsing {}: {error}", path.display()))?;
    let optional = pe.nt_headers().optional_header();
    let base = optional.image_base();
    Ok((base, base + u64::from(optional.size_of_image())))
}

fn capture_now_frames_are_in_kstack(context: &Context) -> WineResult<()> {
    let (start, end) = kstack_image_range(&context.package)?;
    let records =
        json_lines(
            &context
                .wine
                .client_ok(&["selftest", "--json", "--tracer-frames"])?,
        )?;
    let record = records.first().ok_or("selftest printed no record")?;
    ensure(
        record["source"] == "ondemand" && record["flags"] == serde_json::json!(["not_in_ring"]),
        || format!("selftest record: {record}"),
    )?;
    let frames: Vec<u64> = record["frames"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|frame| u64::from_str_radix(frame.as_str()?.trim_start_matches("0x"), 16).ok())
        .collect();
    let first = *frames.first().ok_or("no frames")?;
    ensure((start..end).contains(&first), || {
        format!("frame 0 {first:#x} is not inside kstack.sys [{start:#x}, {end:#x}): {frames:x?}")
    })?;
    let named = format!("kstack.sys+{:#x}", first - start);
    ensure(record["locations"][0] == named.as_str(), || {
        format!("frame 0 should be named {named}: {record}")
    })?;
    ensure(frames.len() > 3, || format!("only {} frames", frames.len()))?;
    // By default the same request's stack starts below kstack.sys's frames,
    // and says how many it left out.
    let tracer = frames
        .iter()
        .take_while(|frame| (start..end).contains(*frame))
        .count();
    let records = json_lines(&context.wine.client_ok(&["selftest", "--json"])?)?;
    let record = records.first().ok_or("selftest printed no record")?;
    ensure(
        record["tracer_frames"] == tracer
            && record["locations"].as_array().is_some_and(|locations| {
                locations
                    .iter()
                    .all(|location| !location.as_str().unwrap_or("").starts_with("kstack.sys"))
            }),
        || format!("{tracer} tracer frames should be hidden: {record}"),
    )?;
    // The text says so, in the words quick-start.md quotes.
    let text = context.wine.client_ok(&["selftest"])?;
    let note = format!("({tracer} kstack.sys frames hidden; --tracer-frames shows them)");
    ensure(text.contains(&note), || {
        format!("selftest should say {note}: {text}")
    })
}

/// `kstack threads` and `kstack sample` under Wine, whose
/// `KeInsertQueueApc` is a stub the driver never calls: each client stops
/// with the driver's reason and the refused-request exit code, before
/// changing the configuration (and the sample leaves no file); status
/// counts nothing.
fn threads_are_refused_under_wine(context: &Context) -> WineResult<()> {
    let wine = &context.wine;
    let before = status(wine)?;
    let sample_file = wine.client_dir().join("refused.kstack");
    // The driver's reason comes first, before any process is looked for.
    for args in [
        &["threads", "--tid", "8"][..],
        &["threads", "--pid", "99999"],
        &["sample", "--all", "--duration", "1", "-o", "refused.kstack"],
        &["sample", "--pid", "99999", "-o", "refused.kstack"],
    ] {
        let output = wine.client(args)?;
        let stderr = said(&output.stderr);
        ensure(output.status.code() == Some(5), || {
            format!(
                "{args:?}: exit {:?}, stderr: {stderr}",
                output.status.code()
            )
        })?;
        ensure(stderr.contains("KeInsertQueueApc"), || {
            format!("{args:?}: stderr does not name the routine: {stderr}")
        })?;
    }
    ensure(!sample_file.exists(), || {
        format!("the refused sample left {}", sample_file.display())
    })?;
    // The source itself is unavailable there, so it cannot be enabled.
    let enabling = wine.client(&["config", "--enable", "threadstack"])?;
    let stderr = said(&enabling.stderr);
    ensure(
        enabling.status.code() == Some(5) && stderr.contains("0xc00000bb"),
        || {
            format!(
                "enabling threadstack: exit {:?}, stderr: {stderr}",
                enabling.status.code()
            )
        },
    )?;
    let after = status(wine)?;
    ensure(after["config"] == before["config"], || {
        format!(
            "the configuration changed: {} -> {}",
            before["config"], after["config"]
        )
    })?;
    ensure(after["thread_captures"]["requested"] == 0, || {
        format!("thread captures counted: {}", after["thread_captures"])
    })?;
    threads_are_listed_without_states(wine)
}

/// `kstack threads --list` under Wine: every thread listed by
/// `SystemProcessInformation` (no Toolhelp note), which Wine implements
/// without thread states, so each is shown with its CPU time and an unknown
/// state.
fn threads_are_listed_without_states(wine: &WineHost) -> WineResult<()> {
    let output = wine.client(&["threads", "--list", "--json"])?;
    let stderr = said(&output.stderr);
    ensure(
        output.status.success() && !stderr.contains("Toolhelp"),
        || {
            format!(
                "threads --list: exit {:?}, stderr: {stderr}",
                output.status.code()
            )
        },
    )?;
    let threads = json_lines(&String::from_utf8_lossy(&output.stdout))?;
    ensure(!threads.is_empty(), || "no thread listed".to_owned())?;
    ensure(
        threads
            .iter()
            .all(|thread| thread["state"].is_null() && thread["cpu_time_100ns"].is_u64()),
        || format!("a thread with a state, or without a CPU time: {threads:?}"),
    )?;
    let process_id = threads[0]["process_id"].to_string();
    let text = wine.client(&["threads", "--list", "--pid", &process_id])?;
    let shown = String::from_utf8_lossy(&text.stdout);
    ensure(
        text.status.success() && shown.contains(&format!("(process {process_id}): state unknown")),
        || format!("threads --list --pid {process_id}: {shown}"),
    )
}

/// What the client said, as one line: its text is fitted to 100 columns
/// off a terminal, so a phrase may be wrapped anywhere.
fn said(output: &[u8]) -> String {
    String::from_utf8_lossy(output)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// The first frame's location in the JSON records `output` printed.
fn first_location(output: &str) -> WineResult<String> {
    let records = json_lines(output)?;
    let record = records.first().ok_or("no record printed")?;
    record["locations"][0]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("no location in {record}"))
}

/// Copies `names` from `from` into a new folder `to`.
fn copy_files(from: &Path, names: &[&str], to: &Path) -> WineResult<()> {
    std::fs::create_dir_all(to).map_err(|error| format!("creating {}: {error}", to.display()))?;
    for name in names {
        std::fs::copy(from.join(name), to.join(name))
            .map_err(|error| format!("copying {name} to {}: {error}", to.display()))?;
    }
    Ok(())
}

fn pdb_symbols_name_functions(context: &Context) -> WineResult<()> {
    let wine = &context.wine;
    // Frame 0 is where the driver walks its own stack (kstack or
    // kstack_driver_core, whatever LTO inlined), named from kstack.pdb.
    let names_a_kstack_function =
        |location: &str| location.starts_with("kstack.sys!kstack") && location.contains("+0x");
    // Only the PDB here: live, the image is found where the driver was
    // loaded from (system32\drivers), and its debug directory names this
    // PDB.
    copy_files(
        &context.package,
        &["kstack.pdb"],
        &wine.drive_c().join("pdb-only"),
    )?;
    // kstack.sys's own frames are the ones named here: shown on request.
    let live = first_location(&wine.client_ok(&[
        "selftest",
        "--json",
        "--tracer-frames",
        "--symbols",
        r"C:\pdb-only",
    ])?)?;
    ensure(names_a_kstack_function(&live), || {
        format!("with --symbols frame 0 should name a kstack function: {live}")
    })?;
    let from_environment = wine.client_with_env(
        ("_NT_SYMBOL_PATH", r"C:\pdb-only"),
        &["selftest", "--json", "--tracer-frames"],
    )?;
    let environment_location = first_location(&String::from_utf8_lossy(&from_environment.stdout))?;
    ensure(environment_location == live, || {
        format!(
            "_NT_SYMBOL_PATH should name frame 0 as --symbols does: {environment_location} vs {live}"
        )
    })?;
    let turned_off = wine.client_with_env(
        ("_NT_SYMBOL_PATH", r"C:\pdb-only"),
        &["selftest", "--json", "--tracer-frames", "--symbols", ""],
    )?;
    let off_location = first_location(&String::from_utf8_lossy(&turned_off.stdout))?;
    ensure(off_location.starts_with("kstack.sys+0x"), || {
        format!("--symbols \"\" should turn symbols off: {off_location}")
    })?;
    // A saved capture, analyzed as if on another machine: it carries
    // kstack.sys's identity, so the PDB alone is enough.
    wine.client_ok(&["config", "--enable", "ondemand"])?;
    wine.client_ok(&["selftest"])?;
    let _ = std::fs::remove_file(wine.client_dir().join("symbols.kstack"));
    wine.client_ok(&["save", "symbols.kstack"])?;
    let pdb_only = wine.client(&[
        "read",
        "--json",
        "--tracer-frames",
        "--input",
        "symbols.kstack",
        "--symbols",
        r"C:\pdb-only",
    ])?;
    let stderr = said(&pdb_only.stderr);
    let offline = first_location(&String::from_utf8_lossy(&pdb_only.stdout))?;
    ensure(
        pdb_only.status.success() && names_a_kstack_function(&offline) && stderr.is_empty(),
        || format!("offline with the PDB only: {offline}, stderr: {stderr}"),
    )?;
    // Another build's PDB (the test build's) is refused, and said.
    copy_files(
        &context.wine_support.join(INJECTION_DRIVER_DIR),
        &["kstack.pdb"],
        &wine.drive_c().join("other-pdb"),
    )?;
    let other = wine.client(&[
        "read",
        "--json",
        "--tracer-frames",
        "--input",
        "symbols.kstack",
        "--symbols",
        r"C:\other-pdb",
    ])?;
    let other_stderr = said(&other.stderr);
    let other_location = first_location(&String::from_utf8_lossy(&other.stdout))?;
    ensure(
        other.status.success()
            && other_location.starts_with("kstack.sys+0x")
            && other_stderr.contains("another build's PDB"),
        || format!("another build's PDB: {other_location}, stderr: {other_stderr}"),
    )?;
    linux_names_as_windows(context, &wine.client_dir().join("symbols.kstack"), &offline)?;
    let top = wine.client_ok(&[
        "top",
        "--tracer-frames",
        "--input",
        "symbols.kstack",
        "--symbols",
        r"C:\pdb-only",
    ])?;
    let folded = wine.client_ok(&[
        "folded",
        "--tracer-frames",
        "--input",
        "symbols.kstack",
        "--symbols",
        r"C:\pdb-only",
    ])?;
    ensure(
        top.contains(&offline) && folded.contains(&function_of(&offline).replace(' ', "_")),
        || format!("top and folded should name {offline}:\n{top}\n{folded}"),
    )
}

/// `module!function` of `module!function+0xoffset`.
fn function_of(location: &str) -> &str {
    location
        .rsplit_once("+0x")
        .map_or(location, |(function, _)| function)
}

/// The Linux side of the same saved capture: the client's PDB reader
/// (`pdb_files`), finding kstack.pdb in the package folder by the identity
/// the capture carries, names frame 0 as the Windows client did under Wine
/// (`expected`), and its function, inlined calls and source lines are
/// what llvm-symbolizer, an independent PDB reader, says of that address;
/// a PDB of another build is refused and the frame stays
/// `kstack.sys+0x...`.
fn linux_names_as_windows(context: &Context, capture: &Path, expected: &str) -> WineResult<()> {
    use kstack_client::{
        capture::reader::read_whole,
        naming::{pdb_files::PdbFiles, symbolizer::Symbolizer},
    };
    let file =
        std::fs::File::open(capture).map_err(|error| format!("reading the capture: {error}"))?;
    let read = read_whole(file).map_err(|error| error.to_string())?;
    let record = read.records.first().ok_or("the capture holds no record")?;
    let address = *record.frames.first().ok_or("a record without frames")?;
    let symbolizer_of = |symbol_path: &Path| {
        Symbolizer::new(read.modules.clone())
            .showing_tracer_frames()
            .with_functions(Box::new(PdbFiles::new(&symbol_path.display().to_string())))
    };
    let symbolizer = symbolizer_of(&context.package);
    let named = record
        .locations(&symbolizer)
        .into_iter()
        .next()
        .unwrap_or_default();
    ensure(named == expected, || {
        format!("the Linux client named frame 0 {named}, the Windows client under Wine {expected}")
    })?;
    let (_, rva) = read
        .modules
        .find(address)
        .ok_or("frame 0 is in no module")?;
    let ours: Vec<(String, String)> = symbolizer
        .source(None, address)
        .iter()
        .map(|frame| {
            (
                frame.function.clone().unwrap_or_default(),
                frame.place().unwrap_or_default(),
            )
        })
        .collect();
    let theirs = llvm_symbolizer(&context.package.join("kstack.sys"), rva)?;
    ensure(!ours.is_empty() && ours == theirs, || {
        format!("frame 0 at RVA {rva:#x}: ours {ours:?}, llvm-symbolizer's {theirs:?}")
    })?;
    ensure(
        theirs
            .last()
            .is_some_and(|(function, _)| function_of(expected).ends_with(&format!("!{function}"))),
        || format!("llvm-symbolizer's outermost function {theirs:?} against {expected}"),
    )?;
    // The injection build's PDB is another build's: refused.
    let other = record
        .locations(&symbolizer_of(
            &context.wine_support.join(INJECTION_DRIVER_DIR),
        ))
        .into_iter()
        .next()
        .unwrap_or_default();
    ensure(other.starts_with("kstack.sys+0x"), || {
        format!("another build's PDB named frame 0: {other}")
    })
}

/// What llvm-symbolizer reads from `image`'s PDB at `rva`: each function,
/// innermost (inlined) first, with `file:line` (its column dropped).
fn llvm_symbolizer(image: &Path, rva: u64) -> WineResult<Vec<(String, String)>> {
    let output = std::process::Command::new("llvm-symbolizer")
        .arg(format!("--obj={}", image.display()))
        .args(["--inlining", "--relative-address", &format!("{rva:#x}")])
        .output()
        .map_err(|error| format!("running llvm-symbolizer (apt package llvm): {error}"))?;
    let text = String::from_utf8_lossy(&output.stdout);
    let lines: Vec<&str> = text.lines().filter(|line| !line.is_empty()).collect();
    Ok(lines
        .chunks(2)
        .map(|pair| {
            let place = pair.get(1).copied().unwrap_or_default();
            // file:line:column, where the file may hold ':' (C:\...).
            let place = place.rsplit_once(':').map_or(place, |(rest, _)| rest);
            (pair[0].to_owned(), place.to_owned())
        })
        .collect())
}

fn read_and_clear(context: &Context) -> WineResult<()> {
    let wine = &context.wine;
    wine.client_ok(&["config", "--enable", "ondemand"])?;
    for _ in 0..3 {
        wine.client_ok(&["selftest"])?;
    }
    let records = json_lines(&wine.client_ok(&["read", "--json"])?)?;
    // Each lands in the shard of the processor it ran on, numbered there
    // from 1; the read merges the shards in time order.
    let named: Vec<(u64, u64, u64)> = records
        .iter()
        .filter_map(|record| {
            Some((
                record["system_time_100ns"].as_u64()?,
                record["shard"].as_u64()?,
                record["sequence"].as_u64()?,
            ))
        })
        .collect();
    let mut per_shard: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for &(_, shard, sequence) in &named {
        per_shard.entry(shard).or_default().push(sequence);
    }
    ensure(
        named.len() == 3
            && named.is_sorted_by_key(|&(time, _, _)| time)
            && per_shard
                .values()
                .all(|sequences| sequences.iter().copied().eq(1..=sequences.len() as u64)),
        || format!("(time, shard, sequence) read: {named:?}"),
    )?;
    ensure(
        records.iter().all(|record| {
            record["frames"]
                .as_array()
                .is_some_and(|frames| !frames.is_empty())
        }),
        || "a record without frames".to_owned(),
    )?;
    ensure(wine.client_ok(&["read", "--json"])?.is_empty(), || {
        "a second read found records".to_owned()
    })?;
    for _ in 0..2 {
        wine.client_ok(&["selftest"])?;
    }
    wine.client_ok(&["clear"])?;
    let status = status(wine)?;
    ensure(
        status["cleared"] == 2 && status["ring"]["used"] == 0,
        || format!("after clear: {status}"),
    )?;
    ensure(wine.client_ok(&["read"])?.is_empty(), || {
        "records survived clear".to_owned()
    })?;
    counters_add_up(&status)
}

/// Restarts the driver with `DisablePagingExecutive`=1 taken as in effect
/// (the override), so the timer source can be enabled.
fn allow_elevated_walks(wine: &WineHost) -> WineResult<()> {
    wine.stop_driver()?;
    wine.allow_elevated_walks()?;
    wine.start_driver()
}

/// `kstack folded` of `e2e.kstack` under Wine equals what the Linux
/// library makes of the same capture (`table`, named after `modules`):
/// without kstack.sys's own frames by default, with them on request.
fn folded_agrees_with_linux(
    wine: &WineHost,
    table: &kstack_client::capture::stack_table::StackTable,
    modules: &kstack_client::naming::modules::ModuleMap,
) -> WineResult<()> {
    for tracer_frames in [false, true] {
        let symbolizer = kstack_client::naming::symbolizer::Symbolizer::new(modules.clone());
        let symbolizer = if tracer_frames {
            symbolizer.showing_tracer_frames()
        } else {
            symbolizer
        };
        let mut linux_folded = table.folded(&symbolizer).join("\n");
        linux_folded.push('\n');
        let mut args = vec!["folded", "--input", "e2e.kstack"];
        if tracer_frames {
            args.push("--tracer-frames");
        }
        let wine_folded = wine.client_ok(&args)?;
        ensure(wine_folded == linux_folded, || {
            format!("folded stacks differ:\nWine:\n{wine_folded}\nLinux:\n{linux_folded}")
        })?;
        ensure(
            wine_folded.starts_with("timer;")
                && wine_folded.contains("kstack.sys+0x") == tracer_frames,
            || {
                format!(
                    "folded stacks should start at the source and name kstack.sys only with \
                     --tracer-frames ({tracer_frames}): {wine_folded}"
                )
            },
        )?;
    }
    Ok(())
}

fn save_and_analyze(context: &Context) -> WineResult<()> {
    let wine = &context.wine;
    allow_elevated_walks(wine)?;
    wine.client_ok(&[
        "config",
        "--enable",
        "timer,ondemand",
        "--timer-period",
        "5",
    ])?;
    let capture = wine.client_dir().join("e2e.kstack");
    let _ = std::fs::remove_file(&capture);
    let saved = wine.client(&["save", "e2e.kstack", "--duration", "1"])?;
    let summary = String::from_utf8_lossy(&saved.stderr).into_owned();
    ensure(saved.status.success(), || format!("save failed: {summary}"))?;
    wine.client_ok(&["config", "--disable", "all"])?;
    // Samples taken between the end of save and the disable (a Wine process
    // start, tens of ms at 5 ms a sample) are still in the ring: the live
    // top below must see only its own record.
    wine.client_ok(&["clear"])?;
    // The Windows client wrote it; the Linux build of the same library
    // reads it.
    let file =
        std::fs::File::open(&capture).map_err(|error| format!("reading the capture: {error}"))?;
    let read = kstack_client::capture::reader::read_whole(file)
        .map_err(|error| format!("reading the capture on Linux: {error}"))?;
    ensure(read.health.is_whole(), || {
        format!("the capture: {}", read.health)
    })?;
    let mut table = kstack_client::capture::stack_table::StackTable::default();
    for record in read.records {
        ensure(record.source() == kstack_abi::Source::Timer, || {
            format!("a {:?} record in a timer capture", record.source())
        })?;
        table.add(&record);
    }
    ensure(table.records() >= 50, || {
        format!("{} records in 1 s at 5 ms: {summary}", table.records())
    })?;
    ensure(
        summary.contains(&format!("kstack save: {} records", table.records())),
        || {
            format!(
                "the summary disagrees with the file's {} records: {summary}",
                table.records()
            )
        },
    )?;
    let (start, _) = kstack_image_range(&context.package)?;
    ensure(
        read.modules
            .find(start)
            .is_some_and(|(module, _)| module.name == "kstack.sys"),
        || format!("the saved module list lacks kstack.sys: {:?}", read.modules),
    )?;
    // It carries kstack.sys's identity (what a symbol server files kstack.pdb
    // under), read from the installed image: the package's.
    let expected = kstack_client::naming::identity::of_file(&context.package.join("kstack.sys"))?;
    let saved = read
        .modules
        .find(start)
        .and_then(|(module, _)| read.modules.identity(module));
    ensure(saved == Some(&expected), || {
        format!("kstack.sys's saved identity {saved:?}, the package's {expected:?}")
    })?;
    folded_agrees_with_linux(wine, &table, &read.modules)?;
    let top = json_lines(&wine.client_ok(&["top", "--json", "--input", "e2e.kstack"])?)?;
    let counted: u64 = top.iter().filter_map(|stack| stack["count"].as_u64()).sum();
    ensure(
        counted == table.records() && top.len() == table.len().min(20),
        || {
            format!(
                "top counts {counted} records in {} stacks; the file has {} in {}",
                top.len(),
                table.records(),
                table.len()
            )
        },
    )?;
    let svg_path = wine.client_dir().join("e2e.svg");
    let _ = std::fs::remove_file(&svg_path);
    wine.client_ok(&[
        "flamegraph",
        "--tracer-frames",
        "--input",
        "e2e.kstack",
        "-o",
        "e2e.svg",
    ])?;
    let svg =
        std::fs::read_to_string(&svg_path).map_err(|error| format!("reading the SVG: {error}"))?;
    ensure(
        svg.starts_with("<?xml") && svg.contains("kstack.sys+0x"),
        || "the flamegraph is not an SVG naming kstack.sys frames".to_owned(),
    )?;
    // Live analysis drains the ring itself: a capture-now record is kept
    // in the ring while ondemand is enabled.
    wine.client_ok(&["config", "--enable", "ondemand"])?;
    wine.client_ok(&["selftest"])?;
    let live = wine.client_ok(&["top"])?;
    ensure(
        live.starts_with("1 record, 1 unique stack\n") && live.contains("sources ondemand"),
        || format!("live top after one selftest: {live}"),
    )
}

/// Sends one injection request for `facts`; returns the status printed.
fn inject(wine: &WineHost, facts: &SourceFacts) -> WineResult<Output> {
    let words = facts.to_words().map(|word| format!("{word:#x}"));
    let mut args = vec![facts.source().name()];
    args.extend(words.iter().map(String::as_str));
    wine.program("kstack-inject.exe", &args)
}

/// The events injected, in order, and what the records must say.
fn injected_events() -> Vec<SourceFacts> {
    vec![
        SourceFacts::Process {
            event: Lifecycle::Create,
            process_id: 1234,
            parent_process_id: 5678,
        },
        SourceFacts::Process {
            event: Lifecycle::Exit,
            process_id: 1234,
            parent_process_id: 0,
        },
        SourceFacts::Thread {
            event: Lifecycle::Create,
            process_id: 1234,
            thread_id: 99,
        },
        SourceFacts::ImageLoad {
            image_base: 0x7FF6_1230_0000,
            image_size: 0x5_0000,
            process_id: 1234,
        },
        SourceFacts::Registry { notify_class: 3 },
        SourceFacts::ObjectHandle {
            operation: HandleOperation::Create,
            object: ObjectKind::Process,
            desired_access: 0x1F_FFFF,
            target_process_id: 0,
        },
        SourceFacts::ObjectHandle {
            operation: HandleOperation::Duplicate,
            object: ObjectKind::Thread,
            desired_access: 0x40,
            target_process_id: 0,
        },
    ]
}

fn injected_events_are_recorded(context: &Context) -> WineResult<()> {
    with_injection_driver(context, injected_events_case)
}

fn filters_and_sampling_count_every_event(context: &Context) -> WineResult<()> {
    with_injection_driver(context, |context, _| filters_and_sampling_case(context))
}

/// Runs `case` with the test-injection build of the driver loaded.
fn with_injection_driver(
    context: &Context,
    case: impl FnOnce(&Context, &Path) -> WineResult<()>,
) -> WineResult<()> {
    let wine = &context.wine;
    let injection_build = context.wine_support.join(INJECTION_DRIVER_DIR);
    wine.stop_driver()?;
    wine.install_driver_image(&injection_build)?;
    wine.start_driver()?;
    let result = case(context, &injection_build);
    // Whatever happened, the next cases get the release driver back.
    wine.stop_driver()?;
    wine.install_driver_image(&context.package)?;
    result
}

/// The registry source's counters in a status.
fn registry_counters(wine: &WineHost) -> WineResult<[u64; 3]> {
    let status = status(wine)?;
    let registry = status["sources"]
        .as_array()
        .and_then(|sources| sources.iter().find(|source| source["name"] == "registry"))
        .cloned()
        .ok_or("status without the registry source")?;
    let counter = |name: &str| {
        registry[name]
            .as_u64()
            .ok_or_else(|| format!("registry without {name}: {registry}"))
    };
    Ok([
        counter("captured")?,
        counter("filtered")?,
        counter("sampled_out")?,
    ])
}

/// Injects `count` registry events; each must be accepted.
fn inject_registry(wine: &WineHost, count: u32) -> WineResult<()> {
    for notify_class in 0..count {
        let output = inject(wine, &SourceFacts::Registry { notify_class })?;
        ensure(output.status.success(), || {
            format!("injecting a registry event: {output:?}")
        })?;
    }
    Ok(())
}

fn filters_and_sampling_case(context: &Context) -> WineResult<()> {
    let wine = &context.wine;
    wine.client_ok(&["config", "--enable", "registry", "--sample", "registry=3"])?;
    inject_registry(wine, 7)?;
    let [captured, filtered, sampled_out] = registry_counters(wine)?;
    // Each processor keeps its first and every third event: of 7, at least
    // 3 (all on one processor) and at most 7 (never two on one).
    ensure(
        captured + sampled_out == 7 && filtered == 0 && (3..=7).contains(&captured),
        || {
            format!(
                "7 events 1-in-3: {captured} captured, {sampled_out} sampled out, {filtered} filtered"
            )
        },
    )?;
    let records = json_lines(&wine.client_ok(&["read", "--json"])?)?;
    let kept = records
        .iter()
        .filter(|record| record["source"] == "registry")
        .count();
    ensure(kept as u64 == captured, || {
        format!("{kept} registry records read, {captured} captured")
    })?;
    // kstack-inject runs in a process of its own: never pid 1 under Wine.
    wine.client_ok(&["config", "--sample", "registry=1", "--pid", "1"])?;
    inject_registry(wine, 2)?;
    let after_include = registry_counters(wine)?;
    ensure(after_include == [captured, 2, sampled_out], || {
        format!("2 events of a process not included: {after_include:?}")
    })?;
    wine.client_ok(&["config", "--pid", "all", "--exclude-pid", "1"])?;
    inject_registry(wine, 1)?;
    let after_exclude = registry_counters(wine)?;
    ensure(after_exclude == [captured + 1, 2, sampled_out], || {
        format!("1 event of a process not excluded: {after_exclude:?}")
    })?;
    // The driver refuses what the client would refuse: the client says why.
    let refused = wine.client(&["config", "--pid", "4", "--exclude-pid", "4"])?;
    let stderr = said(&refused.stderr);
    ensure(
        refused.status.code() == Some(2) && stderr.contains("both included and excluded"),
        || format!("--pid 4 --exclude-pid 4: {:?} {stderr}", refused.status),
    )?;
    let config = &status(wine)?["config"];
    ensure(
        config["processes"]["include"] == serde_json::json!([])
            && config["processes"]["exclude"] == serde_json::json!([1]),
        || format!("the refused config changed nothing: {config}"),
    )
}

fn injected_events_case(context: &Context, injection_build: &Path) -> WineResult<()> {
    let wine = &context.wine;
    let status = status(wine)?;
    let registry = status["sources"]
        .as_array()
        .and_then(|sources| sources.iter().find(|source| source["name"] == "registry"))
        .cloned()
        .unwrap_or_default();
    ensure(
        registry["available"] == true && registry["registration"] == "0x60b50002",
        || format!("the injection build reports registry as injection-only: {registry}"),
    )?;
    wine.client_ok(&["config", "--enable", "process,thread,image,registry,object"])?;
    let events = injected_events();
    for facts in &events {
        let output = inject(wine, facts)?;
        ensure(output.status.success(), || {
            format!(
                "injecting {facts:?}: {:?} {}{}",
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            )
        })?;
    }
    let refused = inject(wine, &SourceFacts::Timer)?;
    ensure(
        String::from_utf8_lossy(&refused.stdout).trim() == "0xc00000bb",
        || format!("injecting a timer event should be refused: {refused:?}"),
    )?;
    wine.client_ok(&["config", "--disable", "all"])?;
    let records = json_lines(&wine.client_ok(&["read", "--json", "--tracer-frames"])?)?;
    // Wine's own image loads may interleave: keep the injected ones.
    let injected: Vec<&Value> = records
        .iter()
        .filter(|record| {
            record["source"] != "image" || record["facts"]["image_base"] == "0x7ff612300000"
        })
        .collect();
    ensure(injected.len() == events.len(), || {
        format!(
            "{} records for {} injected events: {records:#?}",
            injected.len(),
            events.len()
        )
    })?;
    let (image, _) = kstack_image_range(injection_build)?;
    for (record, facts) in injected.iter().zip(&events) {
        ensure(record["source"] == facts.source().name(), || {
            format!("expected a {} record: {record}", facts.source().name())
        })?;
        let expected = expected_facts_json(facts, record);
        ensure(record["facts"] == expected, || {
            format!("facts {} should be {expected}", record["facts"])
        })?;
        ensure(
            record["locations"][0]
                .as_str()
                .is_some_and(|location| location.starts_with("kstack.sys+0x")),
            || format!("frame 0 should be inside kstack.sys (loaded at {image:#x}): {record}"),
        )?;
    }
    // Each source's callback is its own code path: different stacks.
    let stacks: BTreeSet<(&str, &str)> = injected
        .iter()
        .filter_map(|record| Some((record["source"].as_str()?, record["stack_id"].as_str()?)))
        .collect();
    let sources: BTreeSet<&str> = stacks.iter().map(|(source, _)| *source).collect();
    let ids: BTreeSet<&str> = stacks.iter().map(|(_, id)| *id).collect();
    ensure(ids.len() >= sources.len(), || {
        format!(
            "{} distinct stacks for {} sources: {stacks:?}",
            ids.len(),
            sources.len()
        )
    })
}

/// What a record of an injected event must say: the injected facts, but for
/// object-handle events, whose object is the driver's current process or
/// thread, so their target is the record's own process.
fn expected_facts_json(facts: &SourceFacts, record: &Value) -> Value {
    let mut expected = kstack_client::capture::trace::facts_json(facts);
    if matches!(facts, SourceFacts::ObjectHandle { .. }) {
        expected["target_process_id"] = record["process_id"].clone();
    }
    expected
}

fn release_driver_refuses_injection(context: &Context) -> WineResult<()> {
    let wine = &context.wine;
    wine.client_ok(&["config", "--enable", "thread"])?;
    let output = inject(
        wine,
        &SourceFacts::Thread {
            event: Lifecycle::Create,
            process_id: 1,
            thread_id: 2,
        },
    )?;
    ensure(
        String::from_utf8_lossy(&output.stdout).trim() == "0xc0000010" && !output.status.success(),
        || format!("the release driver should answer STATUS_INVALID_DEVICE_REQUEST: {output:?}"),
    )?;
    let probe = wine.program("kstack-inject.exe", &["fault-probe", "unmapped"])?;
    ensure(
        String::from_utf8_lossy(&probe.stdout).trim() == "0xc0000010" && !probe.status.success(),
        || format!("the release driver should refuse the fault probe: {probe:?}"),
    )?;
    let records = wine.client_ok(&["read", "--json"])?;
    ensure(records.trim().is_empty(), || {
        format!("nothing may be recorded: {records}")
    })
}

/// Under Wine the driver finds `RtlWalkFrameChain` exported as a stub and
/// never calls it: status says why; the records of every source that asks
/// for user frames (registry, on-demand and thread-stack by default, the
/// image source opted in; thread-stack requests are refused under Wine, so
/// it makes no records) say their user part is unavailable, the others' (the timer,
/// and the process, thread and object sources, off by default) say off;
/// per source, the outcomes add up to the records made; and the host keeps
/// serving every source and request (the injection build fires the
/// callbacks Wine never fires).
fn user_frames_unavailable_under_wine(context: &Context) -> WineResult<()> {
    with_injection_driver(context, |context, _| {
        let wine = &context.wine;
        let before = status(wine)?;
        ensure(
            before["user_walk"]
                == serde_json::json!({
                    "available": false,
                    "reason": "RtlWalkFrameChain is exported by the host (Wine) only as a stub",
                }),
            || {
                format!(
                    "status should say why user frames are unavailable: {}",
                    before["user_walk"]
                )
            },
        )?;
        let refused = wine.client(&["config", "--user-frames", "timer=1"])?;
        ensure(!refused.status.success(), || {
            format!("user frames for the timer must be refused: {refused:?}")
        })?;
        wine.stop_driver()?;
        wine.set_disable_paging_executive(Some(1))?;
        wine.set_assume_paging_executive_in_effect(Some(1))?;
        wine.start_driver()?;
        wine.client_ok(&[
            "config",
            "--enable",
            "all",
            "--timer-period",
            "5",
            "--user-frames",
            "registry=12,image=5",
        ])?;
        for facts in injected_events() {
            ensure(inject(wine, &facts)?.status.success(), || {
                format!("injecting {facts:?}")
            })?;
        }
        wine.client_ok(&["selftest"])?;
        thread::sleep(Duration::from_millis(100));
        wine.client_ok(&["config", "--disable", "all"])?;
        let records = json_lines(&wine.client_ok(&["read", "--json"])?)?;
        let after = status(wine)?;
        let sources = after["sources"]
            .as_array()
            .ok_or("status without sources")?;
        // The part a source's records say: off where its setting asks for
        // no user frames, else unavailable.
        let expected_part = |name: &str| {
            let walks = sources
                .iter()
                .find(|source| source["name"] == name)
                .and_then(|source| source["user_frames"].as_u64())
                .unwrap_or(0)
                > 0;
            if walks { "unavailable" } else { "off" }
        };
        let walking: BTreeSet<&str> = sources
            .iter()
            .filter_map(|source| source["name"].as_str())
            .filter(|&name| expected_part(name) == "unavailable")
            .collect();
        ensure(
            walking == BTreeSet::from(["image", "ondemand", "registry", "threadstack"]),
            || format!("the defaults and image opted in: {walking:?}"),
        )?;
        let mut seen = BTreeSet::new();
        for record in &records {
            let source = record["source"].as_str().unwrap_or_default();
            seen.insert(source);
            let expected = expected_part(source);
            ensure(
                record["user_part"] == expected
                    && record["user_frames"] == serde_json::json!([])
                    && record["user_frames_32_bit"] == false,
                || format!("a {source} record's user part should be {expected}: {record}"),
            )?;
        }
        ensure(seen.len() == 7, || {
            format!("records of every source expected, got {seen:?}")
        })?;
        for source in sources {
            let parts = source["user_parts"]
                .as_object()
                .ok_or_else(|| format!("no user_parts: {source}"))?;
            let counted: u64 = parts.values().filter_map(Value::as_u64).sum();
            let made =
                source["captured"].as_u64().unwrap_or(0) + source["not_kept"].as_u64().unwrap_or(0);
            let expected_part = expected_part(source["name"].as_str().unwrap_or_default());
            ensure(
                counted == made && parts[expected_part].as_u64() == Some(made),
                || format!("every record's user part counted, all {expected_part}: {source}"),
            )?;
        }
        let registry_frames = after["sources"]
            .as_array()
            .and_then(|sources| sources.iter().find(|source| source["name"] == "registry"))
            .map(|registry| registry["user_frames"].clone());
        ensure(registry_frames == Some(serde_json::json!(12)), || {
            format!("the registry source's user frames setting: {registry_frames:?}")
        })
    })
}

/// `kstack modules --processes` through Wine's Toolhelp: the client's own
/// process is listed with `kstack.exe` and `ntdll.dll`, every module has a
/// size, and every process is either listed or counted unreadable.
fn running_processes_modules_are_listed(context: &Context) -> WineResult<()> {
    let wine = &context.wine;
    let lines = json_lines(&wine.client_ok(&["modules", "--processes", "--json"])?)?;
    let mut modules: BTreeMap<u64, BTreeSet<String>> = BTreeMap::new();
    for line in &lines {
        let process_id = line["process_id"]
            .as_u64()
            .ok_or_else(|| format!("a line without a process id: {line}"))?;
        if line.get("unreadable").is_some() {
            continue;
        }
        ensure(line["size"].as_u64().is_some_and(|size| size > 0), || {
            format!("a module without a size: {line}")
        })?;
        let name = line["name"]
            .as_str()
            .unwrap_or_default()
            .to_ascii_lowercase();
        modules.entry(process_id).or_default().insert(name);
    }
    ensure(
        modules
            .values()
            .any(|names| names.contains("kstack.exe") && names.contains("ntdll.dll")),
        || {
            format!(
                "the client's own process should be listed with kstack.exe and ntdll.dll: {modules:?}"
            )
        },
    )?;
    let text = said(wine.client_ok(&["modules", "--processes"])?.as_bytes());
    ensure(
        text.contains(" listed; ")
            && text.contains("could not be read")
            && (text.ends_with(" module records") || text.ends_with(" module record")),
        || format!("the text listing ends with a count of listed and unreadable processes: {text}"),
    )
}

/// The driver's exception scope (`driver/src/fault_scope.rs`) under Wine's
/// real exception dispatch: an unmapped read inside it comes back as
/// "faulted" with the host still serving, a mapped one with its value.
fn fault_scope_catches_a_fault(context: &Context) -> WineResult<()> {
    with_injection_driver(context, |context, _| {
        let wine = &context.wine;
        for _ in 0..3 {
            let output = wine.program("kstack-inject.exe", &["fault-probe", "unmapped"])?;
            ensure(
                output.status.success()
                    && String::from_utf8_lossy(&output.stdout).trim() == "0x00000000 faulted",
                || format!("an unmapped read inside the scope: {output:?}"),
            )?;
        }
        let output = wine.program("kstack-inject.exe", &["fault-probe", "mapped"])?;
        let expected = format!("0x00000000 {:#x}", FaultProbe::MAPPED_VALUE);
        ensure(
            output.status.success() && String::from_utf8_lossy(&output.stdout).trim() == expected,
            || format!("a mapped read inside the scope should give {expected}: {output:?}"),
        )?;
        wine.client_ok(&["config", "--enable", "ondemand"])?;
        wine.client_ok(&["selftest"])?;
        Ok(())
    })
}

/// The timer source is refused while `DisablePagingExecutive`=1 is not in
/// effect; `reason` says which state that is.
/// Samples the timer every millisecond for a while, then reads it out in
/// two client processes (two readers: each its own device handle), each
/// record with its frames. Returns the status after.
fn timer_records_in_two_readers(wine: &WineHost) -> WineResult<Value> {
    for reader in ["first", "second"] {
        wine.client_ok(&["config", "--enable", "timer", "--timer-period", "1"])?;
        thread::sleep(Duration::from_millis(300));
        wine.client_ok(&["config", "--disable", "timer"])?;
        // Every frame, kstack.sys's own too: each came through the table.
        let records = json_lines(&wine.client_ok(&["read", "--json", "--tracer-frames"])?)?;
        ensure(records.len() >= 20, || {
            format!("the {reader} reader got {} timer records", records.len())
        })?;
        for record in &records {
            let frames = record["frames"].as_array().map_or(0, Vec::len);
            ensure(frames > 0, || {
                format!("the {reader} reader got a record without frames: {record}")
            })?;
        }
    }
    status(wine)
}

fn stack_table_per_reader(context: &Context) -> WineResult<()> {
    let wine = &context.wine;
    allow_elevated_walks(wine)?;
    let status = timer_records_in_two_readers(wine)?;
    let table = &status["stack_table"];
    let counter = |name: &str| table[name].as_u64().unwrap_or(0);
    let captured: u64 = status["sources"]
        .as_array()
        .ok_or("status without sources")?
        .iter()
        .map(|source| source["captured"].as_u64().unwrap_or(0))
        .sum();
    ensure(
        counter("entries") == 4096
            && counter("hits") > 0
            && counter("hits")
                + counter("inserts")
                + counter("collisions")
                + counter("full")
                + counter("busy")
                + counter("empty")
                == captured,
        || format!("the lookups must add up to the {captured} records captured: {table}"),
    )?;
    // Each of the two readers was sent the timer's stacks: at least one
    // record with frames from the table each.
    ensure(counter("sent") >= 2, || {
        format!("two readers, each sent the stacks: {table}")
    })?;
    wine.stop_driver()?;
    wine.set_stack_table_entries(Some(0))?;
    wine.start_driver()?;
    let status = timer_records_in_two_readers(wine)?;
    ensure(
        status["stack_table"]["entries"] == 0 && status["stack_table"]["hits"] == 0,
        || {
            format!(
                "StackTableEntries=0 must turn the table off: {}",
                status["stack_table"]
            )
        },
    )?;
    let text = said(wine.client_ok(&["status"])?.as_bytes());
    ensure(text.contains("stack table: off"), || {
        format!("status must say the table is off:\n{text}")
    })
}

fn expect_timer_refused(wine: &WineHost, reason: &str) -> WineResult<()> {
    let refused = wine.client(&["config", "--enable", "timer"])?;
    let stderr = said(&refused.stderr);
    ensure(
        refused.status.code() == Some(5)
            && stderr.contains("DisablePagingExecutive")
            && stderr.contains("0xe0b50001"),
        || {
            format!(
                "the timer must be refused ({reason}): {:?} {stderr}",
                refused.status
            )
        },
    )
}

/// Status's paging part must be `decided_by`, in effect or not.
fn expect_paging(wine: &WineHost, decided_by: &str, in_effect: bool) -> WineResult<Value> {
    let status = status(wine)?;
    let paging = &status["paging_executive"];
    ensure(
        paging["decided_by"] == decided_by
            && paging["in_effect"] == in_effect
            && status["elevated_walks_allowed"] == in_effect
            && status["disable_paging_executive"] == 1,
        || format!("expected {decided_by} (in effect: {in_effect}): {status:#}"),
    )?;
    Ok(status)
}

fn timer_follows_the_paging_policy(context: &Context) -> WineResult<()> {
    let wine = &context.wine;
    expect_timer_refused(wine, "the value not set")?;

    // Written after this boot: configured, not in effect.
    wine.stop_driver()?;
    wine.set_disable_paging_executive(Some(1))?;
    wine.start_driver()?;
    expect_paging(wine, "written_since_boot", false)?;
    let text = said(wine.client_ok(&["status"])?.as_bytes());
    ensure(
        text.contains("DisablePagingExecutive (as read at load): 1, configured, NOT in effect")
            && text.contains(kstack_abi::paging::ASSUME_IN_EFFECT_VALUE),
        || format!("status must explain the state and the override:\n{text}"),
    )?;
    expect_timer_refused(wine, "the value written after this boot")?;

    // After a reboot the key was last written before the boot: in effect.
    wine.reboot()?;
    wine.start_driver()?;
    let status = expect_paging(wine, "written_before_boot", true)?;
    // RFC 3339 UTC times to the second compare as text; the reboot puts a
    // whole second between the two.
    let time = |name: &str| {
        status["paging_executive"][name]
            .as_str()
            .and_then(|text| text.get(..19))
            .ok_or_else(|| format!("paging_executive/{name} is not a time: {status:#}"))
    };
    ensure(time("key_written")? < time("boot_time")?, || {
        format!("the key must be written before the boot: {status:#}")
    })?;
    wine.client_ok(&["config", "--enable", "timer", "--timer-period", "5"])?;
    thread::sleep(Duration::from_millis(500));
    wine.client_ok(&["config", "--disable", "timer"])?;
    let records = json_lines(&wine.client_ok(&["read", "--json"])?)?;
    ensure(records.len() >= 20, || {
        format!("{} timer records in 0.5 s at 5 ms", records.len())
    })?;
    ensure(
        records
            .iter()
            .all(|record| record["source"] == "timer" && record["facts"] == serde_json::json!({})),
        || "a non-timer record".to_owned(),
    )?;

    // Written again since this boot, with the override: taken as in effect,
    // and reported as the override. (Wine's registry leaves the key's time
    // alone when a value is set to what it holds, so remove it first.)
    wine.stop_driver()?;
    wine.set_disable_paging_executive(None)?;
    wine.set_disable_paging_executive(Some(1))?;
    wine.set_assume_paging_executive_in_effect(Some(1))?;
    wine.start_driver()?;
    let status = expect_paging(wine, "override", true)?;
    ensure(status["paging_executive"]["override"] == true, || {
        format!("the override must be reported: {status:#}")
    })?;
    wine.client_ok(&["config", "--enable", "timer", "--timer-period", "5"])
        .map(drop)
}

fn overflow_loses_nothing_silently(context: &Context) -> WineResult<()> {
    let wine = &context.wine;
    wine.stop_driver()?;
    wine.allow_elevated_walks()?;
    wine.set_ring_capacity(Some(16))?;
    wine.start_driver()?;
    let applied = status(wine)?;
    let shards = applied["ring"]["shards"]
        .as_u64()
        .ok_or("status without ring/shards")?;
    ensure(applied["ring"]["capacity_bytes"] == 16 * 1024, || {
        "RingCapacity=16 (KiB) not applied".to_owned()
    })?;
    wine.client_ok(&["config", "--enable", "timer", "--timer-period", "1"])?;
    // Records are named by shard and sequence number: each shard numbers its
    // own.
    let mut received = BTreeSet::new();
    let mut note = |text: String| -> WineResult<()> {
        for record in json_lines(&text)? {
            let shard = record["shard"].as_u64().ok_or("record without shard")?;
            let sequence = record["sequence"]
                .as_u64()
                .ok_or("record without sequence")?;
            ensure(shard < shards && sequence > 0, || {
                format!("shard {shard} of {shards}, sequence {sequence}: {record}")
            })?;
            ensure(received.insert((shard, sequence)), || {
                format!("shard {shard}'s sequence {sequence} received twice")
            })?;
        }
        Ok(())
    };
    // A timer record takes at least 48 bytes (one naming its tabled
    // stack): 500 ms of 1 ms samples is more than 16 KiB holds.
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        note(wine.client_ok(&["read", "--json"])?)?;
        thread::sleep(Duration::from_millis(500));
    }
    // Stop the source, then collect what is left: no number is spent after.
    wine.client_ok(&["config", "--disable", "timer"])?;
    note(wine.client_ok(&["read", "--json"])?)?;
    let status = status(wine)?;
    let spent = status["sequences_spent"]
        .as_u64()
        .ok_or("no sequences_spent")?;
    let dropped = status["dropped"].as_u64().ok_or("no dropped")?;
    // Module records (Wine's own image loads, if any) spend numbers too and
    // are not among the lines `read --json` prints; each is received or
    // dropped. Without any, the check is exact.
    let modules = number_at(&status, "/module_records")?;
    let missing = spent - modules - received.len() as u64;
    ensure(dropped > 0, || {
        format!("a 16 KiB ring read every 500 ms never overflowed: {status}")
    })?;
    ensure(missing <= dropped && dropped <= missing + modules, || {
        format!(
            "{spent} sequence numbers spent over {shards} shards, {} received, {missing} missing, but {dropped} \
             drops counted",
            received.len()
        )
    })?;
    counters_add_up(&status)
}

/// `kstack save` killed (SIGKILL) after the timer stopped and it drained
/// the ring: nothing was in hand, so its file (read on Linux: cut short,
/// never damaged) holds every sequence number the driver spent, each
/// shard's from 1 with no gap, and a read after finds nothing. A buffered
/// writer would lose its last unwritten records here. (Killed at random
/// points mid-batch: `usermode-client/tests/killed_save.rs`, on Linux.)
fn killed_save_loses_nothing_drained(context: &Context) -> WineResult<()> {
    let wine = &context.wine;
    allow_elevated_walks(wine)?;
    wine.client_ok(&["config", "--enable", "timer", "--timer-period", "2"])?;
    let capture = wine.client_dir().join("killed.kstack");
    let _ = std::fs::remove_file(&capture);
    let mut save = wine.spawn_client(&["save", "killed.kstack", "--duration", "60"])?;
    thread::sleep(Duration::from_secs(2));
    wine.client_ok(&["config", "--disable", "timer"])?;
    // Reads every 50 ms while the ring is empty: it is drained by now.
    thread::sleep(Duration::from_secs(1));
    save.kill()
        .map_err(|error| format!("killing kstack save: {error}"))?;
    let _ = save.wait();
    let file = std::fs::File::open(&capture)
        .map_err(|error| format!("the killed save left no file: {error}"))?;
    let saved = kstack_client::capture::reader::read_whole(file)
        .map_err(|error| format!("reading the killed save's file: {error}"))?;
    let health = &saved.health;
    ensure(
        health.end_count.is_none() && health.damaged_runs == 0 && health.tail.is_none(),
        || format!("the killed save's file: {health}"),
    )?;
    // Module records number in their shard's sequence too.
    let mut received: BTreeMap<u16, BTreeSet<u64>> = BTreeMap::new();
    let headers = saved
        .records
        .iter()
        .map(|record| (record.header.shard, record.header.sequence))
        .chain(
            saved
                .processes
                .changes()
                .iter()
                .map(|change| (change.header.shard, change.header.sequence)),
        );
    for (shard, sequence) in headers {
        received.entry(shard).or_default().insert(sequence);
    }
    for (shard, sequences) in &received {
        ensure(
            sequences.iter().copied().eq(1..=sequences.len() as u64),
            || {
                format!(
                    "shard {shard}'s sequences in the file are not 1 to {}",
                    sequences.len()
                )
            },
        )?;
    }
    let after = json_lines(&wine.client_ok(&["read", "--json"])?)?;
    let status = status(wine)?;
    let spent = number_at(&status, "/sequences_spent")?;
    let modules = number_at(&status, "/module_records")?;
    ensure(
        after.is_empty() && saved.records.len() as u64 + modules == spent && spent > 100,
        || {
            format!(
                "{spent} sequence numbers spent ({modules} by module records), {} in the killed \
                 save's file, {} read after",
                saved.records.len(),
                after.len()
            )
        },
    )?;
    killed_mid_capture(wine)
}

/// `kstack save` killed (SIGKILL) while the timer samples, then the rest
/// drained by a read: the file, the read after and the records the killed
/// client held (the driver's `read` count less the two) account for every
/// sequence number spent, and the numbers neither in the file nor read
/// after are, in each shard, one run right after the file's last record:
/// the batch in hand.
fn killed_mid_capture(wine: &WineHost) -> WineResult<()> {
    allow_elevated_walks(wine)?;
    wine.client_ok(&["config", "--enable", "timer", "--timer-period", "2"])?;
    let capture = wine.client_dir().join("killed-mid.kstack");
    let _ = std::fs::remove_file(&capture);
    let mut save = wine.spawn_client(&["save", "killed-mid.kstack", "--duration", "60"])?;
    thread::sleep(Duration::from_millis(1500));
    save.kill()
        .map_err(|error| format!("killing kstack save: {error}"))?;
    let _ = save.wait();
    wine.client_ok(&["config", "--disable", "timer"])?;
    let file = std::fs::File::open(&capture)
        .map_err(|error| format!("the killed save left no file: {error}"))?;
    let saved = kstack_client::capture::reader::read_whole(file)
        .map_err(|error| format!("reading the killed save's file: {error}"))?;
    ensure(saved.health.damaged_runs == 0, || {
        format!("the killed save's file is damaged: {}", saved.health)
    })?;
    let mut seen: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
    let mut last_saved: BTreeMap<u64, u64> = BTreeMap::new();
    for record in &saved.records {
        let (shard, sequence) = (u64::from(record.header.shard), record.header.sequence);
        seen.entry(shard).or_default().insert(sequence);
        last_saved.insert(shard, sequence);
    }
    let after = json_lines(&wine.client_ok(&["read", "--json"])?)?;
    for record in &after {
        let (shard, sequence) = (
            number_at(record, "/shard")?,
            number_at(record, "/sequence")?,
        );
        ensure(seen.entry(shard).or_default().insert(sequence), || {
            format!("shard {shard}'s sequence {sequence} both in the file and read after")
        })?;
    }
    let status = status(wine)?;
    let spent = number_at(&status, "/sequences_spent")?;
    let read = number_at(&status, "/read")?;
    ensure(
        number_at(&status, "/dropped")? == 0 && number_at(&status, "/module_records")? == 0,
        || format!("a drop or a module record: {status}"),
    )?;
    let kept = (saved.records.len() + after.len()) as u64;
    let in_hand = read - kept;
    ensure(spent == kept + in_hand, || {
        format!(
            "{spent} spent, {read} read by the driver's count: {} in the file, {} read after, \
             {in_hand} in hand when killed",
            saved.records.len(),
            after.len()
        )
    })?;
    let mut visible = 0;
    for (shard, sequences) in &seen {
        let last = sequences.last().copied().unwrap_or(0);
        let missing: Vec<u64> = (1..=last)
            .filter(|sequence| !sequences.contains(sequence))
            .collect();
        let first_unsaved = last_saved.get(shard).copied().unwrap_or(0) + 1;
        ensure(
            missing
                .iter()
                .copied()
                .eq(first_unsaved..first_unsaved + missing.len() as u64),
            || {
                format!(
                    "shard {shard}: {missing:?} missing, not one run right after the file's \
                     last record ({})",
                    first_unsaved - 1
                )
            },
        )?;
        visible += missing.len() as u64;
    }
    ensure(visible <= in_hand, || {
        format!("{visible} numbers missing between the file and the read after, {in_hand} in hand")
    })
}

/// The status identities of `kstack_abi::StatusResponse`, for a driver
/// where nothing is being captured, read or cleared.
fn counters_add_up(status: &Value) -> WineResult<()> {
    let number = |value: &Value| {
        value
            .as_u64()
            .ok_or_else(|| format!("not a count: {value}"))
    };
    let spent = number(&status["sequences_spent"])?;
    let parts = number(&status["read"])?
        + number(&status["ring"]["used"])?
        + number(&status["dropped"])?
        + number(&status["cleared"])?;
    let captured = status["sources"]
        .as_array()
        .ok_or("status without sources")?
        .iter()
        .map(|source| number(&source["captured"]))
        .sum::<WineResult<u64>>()?;
    let modules = number(&status["module_records"])?;
    ensure(spent == parts && spent == captured + modules, || {
        format!(
            "spent {spent}, read + used + dropped + cleared {parts}, captured over sources \
             {captured} + module records {modules}: {status}"
        )
    })
}

fn module_records_are_kept(context: &Context) -> WineResult<()> {
    with_injection_driver(context, module_records_case)
}

fn module_records_case(context: &Context, _: &Path) -> WineResult<()> {
    let wine = &context.wine;
    let before = status(wine)?;
    ensure(
        before["process_key"]
            == serde_json::json!({
                "available": false,
                "reason": "PsGetProcessCreateTimeQuadPart is exported by the host (Wine) only as a stub",
            }),
        || format!("status should say why process keys are unavailable: {before}"),
    )?;
    // Nothing enabled (a fresh driver's default): module records regardless.
    let load = SourceFacts::ImageLoad {
        image_base: 0x7FF6_4560_0000,
        image_size: 0x3_0000,
        process_id: 4321,
    };
    let exit = SourceFacts::Process {
        event: Lifecycle::Exit,
        process_id: 4321,
        parent_process_id: 0,
    };
    for facts in [load, exit] {
        ensure(inject(wine, &facts)?.status.success(), || {
            format!("injecting {facts:?}")
        })?;
    }
    wine.client_ok(&["save", "modules.kstack"])?;
    let after = status(wine)?;
    let listed = json_lines(&wine.client_ok(&[
        "modules",
        "--processes",
        "--input",
        "modules.kstack",
        "--json",
    ])?)?;
    let records: Vec<&Value> = listed
        .iter()
        .filter(|line| line["event"].is_string())
        .collect();
    let injected_load = records.iter().position(|record| {
        record["event"] == "image_load"
            && record["path"] == kstack_abi::messages::INJECTED_IMAGE_PATH
            && record["base"] == "0x7ff645600000"
            && record["size"] == 0x3_0000
            && record["process_id"] == 4321
            && record["process_key"] == 0
    });
    let injected_exit = records
        .iter()
        .position(|record| record["event"] == "process_exit" && record["process_id"] == 4321);
    ensure(
        matches!((injected_load, injected_exit), (Some(load), Some(exit)) if load < exit),
        || format!("the injected load, then the exit, expected among {records:#?}"),
    )?;
    let noted = number_at(&after, "/module_records")? - number_at(&before, "/module_records")?;
    // The capture holds these and any written before `before`.
    ensure(noted >= 2 && records.len() as u64 >= noted, || {
        format!(
            "{} module records saved, status counted {noted} since the first",
            records.len()
        )
    })?;
    let captured: u64 = after["sources"]
        .as_array()
        .ok_or("status without sources")?
        .iter()
        .filter_map(|source| source["captured"].as_u64())
        .sum();
    ensure(captured == 0, || {
        format!("no source enabled, yet {captured} records captured")
    })?;
    counters_add_up(&after)
}

/// The load-order group of Wine's mount manager: drivers of one group share
/// one winedevice.exe process, and Wine reports image loads to the
/// load-image routines of the drivers in that process only.
const SHARED_GROUP: &str = "System Bus Extender";
/// The probe driver's service.
const PROBE_SERVICE: &str = "kstack-probe";

fn real_image_loads_are_recorded(context: &Context) -> WineResult<()> {
    let wine = &context.wine;
    let probe = context
        .wine_support
        .join(kstack_tests::wine_host::PROBE_DRIVER);
    let drivers = wine.drive_c().join("windows/system32/drivers");
    std::fs::copy(&probe, drivers.join(kstack_tests::wine_host::PROBE_DRIVER))
        .map_err(|error| format!("installing {}: {error}", probe.display()))?;
    // kstack into the group's host, then back into a host of its own,
    // each by making its service again.
    let move_to = |group| {
        wine.stop_driver()?;
        wine.delete_service()?;
        wine.create_service_in(group)?;
        wine.start_driver()
    };
    move_to(Some(SHARED_GROUP))?;
    let seen = probe_load_case(wine, &probe);
    move_to(None)?;
    seen
}

/// Starts the probe driver in kstack's group while a capture is being saved
/// (after its start listing, so only the module record can tell of it) and
/// finds its load, with the image's identity, in the capture.
fn probe_load_case(wine: &WineHost, probe: &Path) -> WineResult<()> {
    let binary = format!(
        r"C:\windows\system32\drivers\{}",
        kstack_tests::wine_host::PROBE_DRIVER
    );
    wine.create_kernel_service(PROBE_SERVICE, &binary, Some(SHARED_GROUP))?;
    let capture = wine.client_dir().join("probe.kstack");
    let _ = std::fs::remove_file(&capture);
    let (started, saved) = thread::scope(|scope| {
        let saving =
            scope.spawn(|| wine.client(&["save", "--force", "--duration", "6", "probe.kstack"]));
        // The file is made once the start listing is taken.
        let deadline = Instant::now() + Duration::from_secs(20);
        while !capture.exists() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(50));
        }
        let started = wine.sc(&["start", PROBE_SERVICE]);
        let saved = saving
            .join()
            .unwrap_or_else(|_| Err("the save thread panicked".to_owned()));
        (started, saved)
    });
    let _ = wine.sc(&["stop", PROBE_SERVICE]);
    wine.sc(&["delete", PROBE_SERVICE])?;
    started?;
    let saved = saved?;
    ensure(saved.status.success(), || format!("save failed: {saved:?}"))?;
    let (base, end) = image_range(probe)?;
    let listed = json_lines(&wine.client_ok(&[
        "modules",
        "--processes",
        "--input",
        "probe.kstack",
        "--json",
    ])?)?;
    let is_probe = |name: &Value| {
        name.as_str()
            .is_some_and(|name| name.ends_with(kstack_tests::wine_host::PROBE_DRIVER))
    };
    ensure(!listed.iter().any(|line| is_probe(&line["name"])), || {
        format!("the probe loaded before the start listing: {listed:#?}")
    })?;
    let load = listed
        .iter()
        .find(|line| line["event"] == "image_load" && is_probe(&line["path"]));
    // The capture carries the loaded image's identity, read from its file
    // while the capture was saved.
    let identity = kstack_client::naming::identity::of_file(probe)?;
    ensure(
        load.is_some_and(|load| {
            load["process_id"] == 0
                && load["process_key"] == 0
                && load["base"] == format!("{base:#x}")
                && load["size"] == end - base
                && load["identity"]["timestamp"] == format!("{:#010x}", identity.timestamp)
                && load["identity"]["size_of_image"] == end - base
        }),
        || {
            format!(
                "the probe's load (a driver, pid 0, at {base:#x}, {} bytes, {identity}) expected \
                 among {listed:#?}",
                end - base
            )
        },
    )
}

/// The count at `pointer` in a JSON value.
fn number_at(value: &Value, pointer: &str) -> WineResult<u64> {
    value
        .pointer(pointer)
        .and_then(Value::as_u64)
        .ok_or_else(|| format!("no count at {pointer}: {value}"))
}

fn order_under_load(context: &Context) -> WineResult<()> {
    let wine = &context.wine;
    allow_elevated_walks(wine)?;
    wine.client_ok(&[
        "config",
        "--enable",
        "ondemand,timer",
        "--timer-period",
        "1",
    ])?;
    let outputs = thread::scope(|scope| {
        let checkers: Vec<_> = (0..2)
            .map(|_| scope.spawn(|| wine.program("kstack-order-check.exe", &["3", "1500"])))
            .collect();
        checkers
            .into_iter()
            .map(|checker| {
                checker
                    .join()
                    .map_err(|_| "a checker thread panicked".to_owned())?
            })
            .collect::<WineResult<Vec<_>>>()
    })?;
    let mut read = 0;
    for output in &outputs {
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        ensure(
            output.status.success() && stdout.contains(", 0 out of order"),
            || {
                format!(
                    "order check failed ({:?}):\n{stdout}\n{stderr}",
                    output.status
                )
            },
        )?;
        read += stdout
            .split_whitespace()
            .nth(1)
            .and_then(|count| count.parse::<u64>().ok())
            .ok_or_else(|| format!("no record count in {stdout}"))?;
    }
    wine.client_ok(&["config", "--disable", "all"])?;
    wine.client_ok(&["read"])?;
    let status = status(wine)?;
    let sources = &status["sources"];
    let captured = |name: &str| {
        sources
            .as_array()
            .and_then(|all| all.iter().find(|source| source["name"] == name))
            .and_then(|source| source["captured"].as_u64())
            .unwrap_or(0)
    };
    ensure(
        read > 1000 && captured("ondemand") > 1000 && captured("timer") > 100,
        || {
            format!(
                "{read} records read by the checkers: too little load to mean anything: {status}"
            )
        },
    )?;
    counters_add_up(&status)
}

fn start_stop_cycles(context: &Context) -> WineResult<()> {
    const CYCLES: u32 = 100;
    let wine = &context.wine;
    wine.stop_driver()?;
    wine.allow_elevated_walks()?;
    for cycle in 1..=CYCLES {
        wine.start_driver()
            .map_err(|error| format!("cycle {cycle}: {error}"))?;
        wine.client_ok(&["config", "--enable", "timer", "--timer-period", "2"])?;
        wine.client_ok(&["read"])?;
        wine.forget_unload_record()?;
        // Stopped with the timer still firing: unload must cancel it, flush
        // its DPCs and wait for callbacks in flight before freeing.
        wine.stop_driver()
            .map_err(|error| format!("cycle {cycle}: {error}"))?;
        let left = wine.last_unload_pool_allocations()?;
        ensure(left == Some(0), || {
            format!("cycle {cycle}: the unload record says {left:?} allocations left")
        })?;
    }
    wine.start_driver()
}

fn bad_input_storm(context: &Context) -> WineResult<()> {
    let output = context
        .wine
        .program("kstack-ioctl-storm.exe", &["10000", "20261122"])?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    ensure(
        output.status.success()
            && stdout.contains("10000 cases, 0 mismatches, driver still serving: true"),
        || format!("storm failed ({:?}):\n{stdout}\n{stderr}", output.status),
    )?;
    status(&context.wine).map(drop)
}
