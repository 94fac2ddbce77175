//! `kstack export` of the synthetic capture, read back by the tools each
//! format is for: `go tool pprof` (Debian's golang-go), speedscope's own
//! file-format schema and its viewer in headless Chromium (both from its
//! npm package), and the trace-event rules Perfetto and `chrome://tracing`
//! follow. `cargo xtask test` installs Go, npm and Chromium; without them
//! these tests fail and say how to install them.
//! Deterministic outputs are also compared with `tests/golden/`.

mod browser;
mod common;

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

use common::{check_golden, kstack, scratch_dir, stdout_of, write_capture};
use kstack_client::{capture::writer::CaptureWriter, naming::modules::ModuleMap};
use serde_json::Value;

/// The speedscope release whose schema the speedscope export is checked
/// against.
const SPEEDSCOPE_VERSION: &str = "1.25.0";

/// Exports the synthetic capture in `format` into `dir`; returns the file.
fn export(dir: &Path, format: &str, file_name: &str) -> PathBuf {
    let capture = dir.join("sample.kstack");
    write_capture(&capture);
    let out = dir.join(file_name);
    let output = kstack(&[
        "export",
        "--format",
        format,
        "--input",
        capture.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(
        output.status.success(),
        "kstack export --format {format} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    out
}

/// `kstack top --json` of the capture in `dir`: every stack, every frame.
fn top_stacks(dir: &Path) -> Vec<Value> {
    let capture = dir.join("sample.kstack");
    stdout_of(&[
        "top",
        "--json",
        "--limit",
        "1000000",
        "--frames",
        "1000",
        "--input",
        capture.to_str().unwrap(),
    ])
    .lines()
    .map(|line| serde_json::from_str(line).unwrap())
    .collect()
}

/// A `top --json` stack's frames, named: the kernel part, then the user
/// part.
fn locations(stack: &Value) -> Vec<&str> {
    ["locations", "user_locations"]
        .into_iter()
        .flat_map(|part| stack[part].as_array().unwrap())
        .map(|location| location.as_str().unwrap())
        .collect()
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// `go tool pprof -top`'s rows: flat and cum per function name.
fn pprof_top(profile: &Path) -> (String, BTreeMap<String, (u64, u64)>) {
    let output = Command::new("go")
        .args(["tool", "pprof", "-top"])
        .arg(profile)
        // pprof prints the profile's time in the local zone.
        .env("TZ", "UTC")
        .output()
        .unwrap_or_else(|error| {
            panic!(
                "cannot run `go` ({error}): Go is needed to read the pprof export; install it \
                 with `apt-get install -y golang-go` (cargo xtask test does)"
            )
        });
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(
        output.status.success(),
        "go tool pprof -top failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut rows = BTreeMap::new();
    let table = stdout
        .split_once("flat  flat%   sum%        cum   cum%\n")
        .unwrap_or_else(|| panic!("no table in go tool pprof -top's output:\n{stdout}"))
        .1;
    for line in table.lines() {
        // flat flat% sum% cum cum% name
        let columns: Vec<&str> = line.split_whitespace().collect();
        let [flat, _, _, cum, _, name] = columns[..] else {
            panic!("unexpected go tool pprof -top row: {line}");
        };
        let previous = rows.insert(
            name.to_owned(),
            (flat.parse().unwrap(), cum.parse().unwrap()),
        );
        assert!(previous.is_none(), "{name} listed twice:\n{stdout}");
    }
    (stdout, rows)
}

/// What `stacks` (`kstack top --json`) contribute to each frame name, the
/// way profilers rank functions: its self count is the records (as
/// `count_of` counts them) of the stacks whose innermost frame it is, its
/// total the records of the stacks it appears in, once per stack however
/// often it recurs. Names with neither are left out.
fn self_and_total(
    stacks: &[Value],
    count_of: impl Fn(&Value) -> u64,
) -> BTreeMap<String, (u64, u64)> {
    let mut table = BTreeMap::<String, (u64, u64)>::new();
    for stack in stacks {
        let count = count_of(stack);
        if count == 0 {
            continue;
        }
        let names = locations(stack);
        table.entry(names[0].to_owned()).or_default().0 += count;
        for name in names.into_iter().collect::<BTreeSet<_>>() {
            table.entry(name.to_owned()).or_default().1 += count;
        }
    }
    table
}

/// pprof ranks functions, `kstack top` whole stacks, so the two are
/// compared through what each stack contributes to a function. Without
/// symbols (none off Windows) every frame address is its own pprof
/// function, named exactly as `kstack top` names the frame; so its flat
/// and cum counts are its self and total counts. Every function of the
/// capture must be listed (it is small enough that pprof drops no node).
#[test]
fn go_tool_pprof_reads_the_profile_and_agrees_with_kstack_top() {
    let dir = scratch_dir("export-pprof");
    let profile = export(&dir, "pprof", "sample.pb.gz");
    let stacks = top_stacks(&dir);
    let records: u64 = stacks
        .iter()
        .map(|stack| stack["count"].as_u64().unwrap())
        .sum();
    assert_eq!(records, 16, "the synthetic capture's records");
    let expected = self_and_total(&stacks, |stack| stack["count"].as_u64().unwrap());
    let (stdout, actual) = pprof_top(&profile);
    assert!(
        stdout.contains(&format!(
            "Showing nodes accounting for {records}, 100% of {records} total"
        )),
        "{stdout}"
    );
    assert!(stdout.contains("Type: samples"), "{stdout}");
    assert!(
        stdout.contains("Time: Nov 23, 2025 at 6:00am (UTC)"),
        "{stdout}"
    );
    assert_eq!(actual, expected, "go tool pprof -top:\n{stdout}");
}

/// speedscope's built viewer and schema (its npm package's
/// `dist/release/`), fetched and unpacked once into target/; the tests of
/// one run share it.
fn speedscope_release() -> &'static Path {
    static RELEASE: OnceLock<PathBuf> = OnceLock::new();
    RELEASE.get_or_init(|| {
        let cache =
            Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("speedscope-{SPEEDSCOPE_VERSION}"));
        let release = cache.join("release");
        if release.exists() {
            return release;
        }
        // Per process: test runners such as nextest run each test in a
        // process of its own, and two may fetch at once.
        let packed = cache.join(format!("pack.{}", std::process::id()));
        std::fs::create_dir_all(&packed).unwrap();
        let output = Command::new("npm")
            .args(["pack", &format!("speedscope@{SPEEDSCOPE_VERSION}")])
            .arg("--pack-destination")
            .arg(&packed)
            .output()
            .unwrap_or_else(|error| {
                panic!(
                    "cannot run `npm` ({error}): npm fetches speedscope's viewer and schema; \
                     install it with `apt-get install -y npm` (cargo xtask test does)"
                )
            });
        assert!(
            output.status.success(),
            "npm pack speedscope@{SPEEDSCOPE_VERSION} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let tarball = packed.join(format!("speedscope-{SPEEDSCOPE_VERSION}.tgz"));
        let gzipped = std::fs::File::open(&tarball).unwrap();
        let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(gzipped));
        // Whole or not at all: a later run trusts what it finds.
        let partial = cache.join(format!("release.partial.{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&partial);
        std::fs::create_dir_all(&partial).unwrap();
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let path = entry.path().unwrap().into_owned();
            if let Ok(relative) = path.strip_prefix("package/dist/release") {
                let destination = partial.join(relative);
                std::fs::create_dir_all(destination.parent().unwrap()).unwrap();
                entry.unpack(&destination).unwrap();
            }
        }
        for file in ["index.html", "file-format-schema.json"] {
            assert!(
                partial.join(file).is_file(),
                "the speedscope package holds dist/release/{file}"
            );
        }
        // Another process may have put its whole copy in place first.
        if std::fs::rename(&partial, &release).is_err() {
            assert!(
                release.join("index.html").is_file(),
                "no release in {}",
                cache.display()
            );
            let _ = std::fs::remove_dir_all(&partial);
        }
        let _ = std::fs::remove_dir_all(&packed);
        release
    })
}

fn speedscope_schema() -> Value {
    read_json(&speedscope_release().join("file-format-schema.json"))
}

#[test]
fn the_speedscope_file_is_valid_by_speedscopes_schema() {
    let dir = scratch_dir("export-speedscope");
    let document = read_json(&export(&dir, "speedscope", "sample.speedscope.json"));
    let validator = jsonschema::validator_for(&speedscope_schema()).unwrap();
    let errors: Vec<String> = validator
        .iter_errors(&document)
        .map(|error| error.to_string())
        .collect();
    assert!(errors.is_empty(), "schema errors: {errors:#?}");
    // The schema does reject a file that breaks it.
    let mut broken = document.clone();
    broken["profiles"][0]["weights"] = Value::from("13");
    assert!(!validator.is_valid(&broken));

    // Frames named as `kstack top` names them; weights count records per
    // source.
    let stacks = top_stacks(&dir);
    let frames: BTreeSet<&str> = document["shared"]["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|frame| frame["name"].as_str().unwrap())
        .collect();
    let top_names: BTreeSet<&str> = stacks.iter().flat_map(locations).collect();
    assert_eq!(frames, top_names);
    let per_source = records_per_source(&stacks);
    let weights: BTreeMap<String, u64> = document["profiles"]
        .as_array()
        .unwrap()
        .iter()
        .map(|profile| {
            let total = profile["weights"]
                .as_array()
                .unwrap()
                .iter()
                .map(|weight| weight.as_u64().unwrap())
                .sum();
            (profile["name"].as_str().unwrap().to_owned(), total)
        })
        .collect();
    assert_eq!(weights, per_source);
    check_golden(
        "export.speedscope.json",
        &(serde_json::to_string_pretty(&document).unwrap() + "\n"),
    );
}

/// The records of `stacks` (`kstack top --json`) per source.
fn records_per_source(stacks: &[Value]) -> BTreeMap<String, u64> {
    let mut per_source = BTreeMap::<String, u64>::new();
    for stack in stacks {
        for (source, count) in stack["sources"].as_object().unwrap() {
            *per_source.entry(source.clone()).or_default() += count.as_u64().unwrap();
        }
    }
    per_source
}

/// What speedscope's sandwich view shows in its DOM: the profile list (a
/// row per profile: number, name, weight) and the shown profile's frames
/// (a row per frame: total, self, name; here keyed by name, self first).
#[derive(Debug, Default)]
struct SandwichView {
    profiles: BTreeMap<String, u64>,
    frames: BTreeMap<String, (u64, u64)>,
}

fn sandwich_view(dom: &str) -> SandwichView {
    let text = |html: &str| {
        // Each cell's HTML starts inside its `<td` tag.
        let mut in_tag = true;
        let mut text = String::new();
        for character in html.chars() {
            match character {
                '<' => in_tag = true,
                '>' => in_tag = false,
                _ if !in_tag => text.push(character),
                _ => {}
            }
        }
        text.replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&amp;", "&")
    };
    let count = |cell: &str| -> u64 {
        // "6", "6 (100%)", or "0 (<0.01%)".
        let number = cell.split_whitespace().next().unwrap_or_default();
        number
            .parse()
            .unwrap_or_else(|_| panic!("a count in speedscope's table: {cell:?}"))
    };
    let mut view = SandwichView::default();
    let rows = dom
        .split("<tr")
        .skip(1)
        .map(|row| row.split("</tr>").next().unwrap());
    // Header rows hold `<th>` cells, and are left out.
    for row in rows.filter(|row| !row.contains("<th")) {
        let cells: Vec<String> = row
            .split("<td")
            .skip(1)
            .map(|cell| text(cell.split("</td>").next().unwrap()))
            .collect();
        let [first, second, third] = &cells[..] else {
            panic!("a row of speedscope's tables: {cells:?}");
        };
        if first.ends_with("%)") {
            view.frames
                .insert(third.clone(), (count(second), count(first)));
        } else {
            view.profiles.insert(second.clone(), count(third));
        }
    }
    view
}

/// speedscope's own viewer, from the npm package the schema comes from,
/// in headless Chromium: it fetches the export, lists every source with
/// its records and the shown profile's frames with the self and total
/// counts `kstack top` gives them (the sandwich view's DOM), and draws its
/// flame graph (on a WebGL canvas, so read from a screenshot: a bar, in a
/// colour of its own, per frame). A profile it cannot import shows its
/// error page, which the same checks reject.
#[test]
fn speedscopes_viewer_loads_the_profile_and_draws_it() {
    let dir = scratch_dir("export-speedscope-viewer");
    let document = read_json(&export(&dir, "speedscope", "sample.speedscope.json"));
    let shown = usize::try_from(document["activeProfileIndex"].as_u64().unwrap()).unwrap();
    let source = document["profiles"][shown]["name"].as_str().unwrap();
    let stacks = top_stacks(&dir);
    let expected = self_and_total(&stacks, |stack| {
        stack["sources"][source].as_u64().unwrap_or(0)
    });
    assert!(expected.len() >= 3, "{source}: {expected:?}");
    // Valid JSON that speedscope's import rejects: a frame index out of
    // range.
    let mut broken = document.clone();
    broken["profiles"][shown]["samples"][0][0] = Value::from(999);
    std::fs::write(dir.join("broken.speedscope.json"), broken.to_string()).unwrap();
    let server = browser::Server::start(vec![dir.clone(), speedscope_release().to_owned()]);
    let page = |file: &str, view: &str| {
        format!(
            "http://127.0.0.1:{}/index.html#profileURL={file}{view}",
            server.port
        )
    };

    let dom = browser::dom(&page("sample.speedscope.json", "&view=sandwich"));
    assert!(!dom.contains("Something went wrong"), "{dom}");
    let title = format!(
        "<title>{} - speedscope</title>",
        document["name"].as_str().unwrap()
    );
    assert!(dom.contains(&title), "{title} in\n{dom}");
    let view = sandwich_view(&dom);
    assert_eq!(view.frames, expected, "{dom}");
    assert_eq!(view.profiles, records_per_source(&stacks), "{dom}");
    let requests = server.requests();
    assert!(
        requests.contains(&"GET /sample.speedscope.json 200".to_owned()),
        "{requests:?}"
    );
    // A full-width bar of a 1400-pixel window covers over 20,000 pixels.
    let pixels = browser::screenshot(&page("sample.speedscope.json", ""));
    let bars = browser::large_colour_areas(&pixels, 10_000);
    assert!(
        bars.len() >= expected.len(),
        "a bar per frame of {expected:?}, in colours of their own: {bars:?}"
    );

    let dom = browser::dom(&page("broken.speedscope.json", "&view=sandwich"));
    assert!(dom.contains("Something went wrong"), "{dom}");
    let view = sandwich_view(&dom);
    assert!(
        view.frames.is_empty() && view.profiles.is_empty(),
        "{view:?}"
    );
    let pixels = browser::screenshot(&page("broken.speedscope.json", ""));
    assert!(browser::large_colour_areas(&pixels, 10_000).len() < expected.len());
}

#[test]
fn the_chrome_trace_has_every_record_as_an_instant_event_in_time_order() {
    let dir = scratch_dir("export-chrome-trace");
    let document = read_json(&export(&dir, "chrome-trace", "sample.trace.json"));
    let events = document["traceEvents"].as_array().unwrap();
    let capture = dir.join("sample.kstack");
    let lines: Vec<Value> = stdout_of(&["read", "--json", "--input", capture.to_str().unwrap()])
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let key = |record: &Value| (record["shard"].as_u64(), record["sequence"].as_u64());
    let read: BTreeSet<_> = lines.iter().map(key).collect();
    let traced: BTreeSet<_> = events.iter().map(|event| key(&event["args"])).collect();
    assert_eq!(events.len(), lines.len());
    assert_eq!(traced, read, "every record, once");
    let mut previous = 0.0;
    for event in events {
        let args = &event["args"];
        let ts = event["ts"].as_f64().unwrap();
        assert!(ts >= previous, "{ts} after {previous}");
        previous = ts;
        assert_eq!(event["ph"], "i");
        assert_eq!(event["name"], args["source"]);
        assert_eq!(event["pid"], args["process_id"]);
        assert_eq!(event["tid"], args["thread_id"]);
        assert!(args["facts"].is_object(), "{event}");
        assert!(args["processor"].is_u64(), "{event}");
        let line = lines.iter().find(|line| key(line) == key(args)).unwrap();
        assert_eq!(args, line, "args are the record's JSON line");
        assert!(!args["locations"].as_array().unwrap().is_empty());
    }
    // The synthetic records are 1 ms apart.
    assert_eq!(events.last().unwrap()["ts"].as_f64(), Some(15_000.0));
    check_golden(
        "export.chrome-trace.json",
        &(serde_json::to_string_pretty(&document).unwrap() + "\n"),
    );
}

#[test]
fn the_input_a_device_or_a_folder_is_never_the_output_and_dash_is_standard_output() {
    let dir = scratch_dir("export-unwritable");
    let capture = dir.join("sample.kstack");
    write_capture(&capture);
    let bytes = std::fs::read(&capture).unwrap();
    // The capture being read is never the output, however it is spelt,
    // --force or not; nor is a device or a folder.
    let spelt_again = dir
        .join("..")
        .join(dir.file_name().unwrap())
        .join("sample.kstack");
    for (target, message) in [
        (
            spelt_again.to_str().unwrap(),
            "it is the capture being read",
        ),
        ("/dev/null", "not a regular file"),
        (dir.to_str().unwrap(), "not a regular file"),
    ] {
        let output = kstack(&[
            "export",
            "--format",
            "pprof",
            "--input",
            capture.to_str().unwrap(),
            "-o",
            target,
            "--force",
        ]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(8), "{target}: {stderr}");
        // Fitted to 100 columns: read as one line.
        let said = stderr.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(said.contains(message) && said.contains(target), "{stderr}");
        assert!(
            stderr.lines().all(|line| line.chars().count() <= 100),
            "{stderr}"
        );
    }
    assert_eq!(
        std::fs::read(&capture).unwrap(),
        bytes,
        "the input is intact"
    );
    // `-o -` is standard output.
    let output = kstack(&[
        "export",
        "--format",
        "speedscope",
        "--input",
        capture.to_str().unwrap(),
        "-o",
        "-",
    ]);
    assert!(output.status.success());
    let document: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert!(document["profiles"].is_array(), "{document}");
    assert!(!dir.join("-").exists(), "a file named -");
}

#[test]
fn export_bad_inputs_get_a_clear_error_and_lose_nothing() {
    let dir = scratch_dir("export-bad-inputs");
    let capture = dir.join("sample.kstack");
    write_capture(&capture);
    let bytes = std::fs::read(&capture).unwrap();
    // Cut inside its one block of records: none can be read.
    let cut = dir.join("cut.kstack");
    std::fs::write(&cut, &bytes[..bytes.len() - 40]).unwrap();
    let mut damaged = bytes.clone();
    damaged[9] ^= 1;
    let damaged_header = dir.join("damaged.kstack");
    std::fs::write(&damaged_header, &damaged).unwrap();
    let existing = dir.join("existing.pb.gz");
    std::fs::write(&existing, "keep me").unwrap();
    let export_to = |input: &Path, extra: &[&str]| {
        kstack(
            &[
                &[
                    "export",
                    "--format",
                    "pprof",
                    "--input",
                    input.to_str().unwrap(),
                    "-o",
                    existing.to_str().unwrap(),
                ],
                extra,
            ]
            .concat(),
        )
    };
    // A capture whose header is damaged is refused before anything is
    // written, and one cut before its first whole block of records has
    // nothing to export, --force or not; an existing output is not
    // replaced without --force.
    for (input, extra, code, message) in [
        (&damaged_header, &["--force"][..], 8, "are damaged"),
        (&cut, &["--force"][..], 9, "it was cut short"),
        (&capture, &[][..], 8, "--force"),
    ] {
        let output = export_to(input, extra);
        // Unwrapped, as the path's length moves where the text wraps.
        let stderr = String::from_utf8_lossy(&output.stderr)
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        assert_eq!(output.status.code(), Some(code), "{stderr}");
        assert!(stderr.contains(message), "{stderr}");
        assert_eq!(std::fs::read_to_string(&existing).unwrap(), "keep me");
    }
    // Replaced, whole, with --force; no temporary file is left behind.
    assert!(export_to(&capture, &["--force"]).status.success());
    assert_eq!(&std::fs::read(&existing).unwrap()[..2], [0x1F, 0x8B]);
    let names: BTreeSet<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(
        names,
        BTreeSet::from(
            [
                "cut.kstack",
                "damaged.kstack",
                "existing.pb.gz",
                "sample.kstack"
            ]
            .map(str::to_owned)
        )
    );
    // Cut in its end marker only: every record is exported, and the exit
    // code (10) and a warning say the capture was incomplete.
    let end_cut = dir.join("end-cut.kstack");
    std::fs::write(&end_cut, &bytes[..bytes.len() - 10]).unwrap();
    let output = export_to(&end_cut, &["--force"]);
    // Unwrapped, as a terminal's width may wrap it anywhere.
    let stderr = String::from_utf8_lossy(&output.stderr)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert_eq!(output.status.code(), Some(10), "{stderr}");
    assert!(
        stderr.contains("is incomplete: it was cut short"),
        "{stderr}"
    );
    assert!(stderr.contains("kstack export: "), "{stderr}");
    let whole = std::fs::read(&existing).unwrap();
    assert!(export_to(&capture, &["--force"]).status.success());
    assert_eq!(std::fs::read(&existing).unwrap(), whole, "the same profile");
    // A capture of no records is nothing to export (exit code 9).
    let empty = dir.join("empty.kstack");
    let file = std::fs::File::create(&empty).unwrap();
    CaptureWriter::new(file, &ModuleMap::default())
        .unwrap()
        .finish()
        .unwrap();
    let out = dir.join("empty.json");
    let output = kstack(&[
        "export",
        "--format",
        "chrome-trace",
        "--input",
        empty.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(9));
    assert!(String::from_utf8_lossy(&output.stderr).contains("no records to export"));
    assert!(!out.exists());
    // An unknown format is a usage error.
    let output = kstack(&["export", "--format", "svg", "-o", "x"]);
    assert_eq!(output.status.code(), Some(2));
}

#[cfg(not(windows))]
#[test]
fn a_live_export_off_windows_says_it_needs_windows() {
    let dir = scratch_dir("export-live");
    let out = dir.join("live.pb.gz");
    let output = kstack(&[
        "export",
        "--format",
        "pprof",
        "--duration",
        "1",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&output.stderr).contains("runs on Windows"));
    assert!(!out.exists());
}
