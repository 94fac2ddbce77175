//! `kstack`: the user-mode client of the kstack driver.

use std::{
    io::{self, Write},
    process::ExitCode,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use clap::{Args, Parser, Subcommand};
use kstack_abi::{CaptureConfig, Source, SourceSet};

#[cfg(windows)]
use kstack_client::device;
use kstack_client::{
    error::{self, ClientError},
    report,
    session::{self, Reader, SequenceTracker},
    trace::TraceRecord,
    transport::Transport,
};

/// Capture and inspect kernel stack traces recorded by kstack.sys.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Driver and ABI version, paging policy, sources, counters, ring fill.
    Status(OutputArgs),
    /// Show or change what is captured (no options: show).
    Config(ConfigArgs),
    /// Drain the ring once and print the records.
    Read(OutputArgs),
    /// Follow new records until Ctrl-C (or --duration), then summarize.
    Watch(WatchArgs),
    /// Discard every record in the ring.
    Clear,
    /// Capture this request's stack in the driver and show it.
    Selftest(OutputArgs),
}

#[derive(Args)]
struct ConfigArgs {
    /// Sources to enable (comma-separated names, or `all`).
    #[arg(long, value_parser = parse_sources)]
    enable: Option<SourceSet>,
    /// Sources to disable (comma-separated names, or `all`).
    #[arg(long, value_parser = parse_sources)]
    disable: Option<SourceSet>,
    /// RtlCaptureStackBackTrace's FramesToSkip (0 keeps kstack's own frames).
    #[arg(long)]
    skip: Option<u16>,
    /// RtlCaptureStackBackTrace's FramesToCapture (1 to 62).
    #[arg(long)]
    frames: Option<u16>,
    /// Capture only in this process id (0: every process).
    #[arg(long)]
    pid: Option<u32>,
    /// The timer source's period in milliseconds (1 to 10000).
    #[arg(long)]
    timer_period: Option<u32>,
}

#[derive(Args)]
struct OutputArgs {
    /// One JSON object per record, one per line (README, "JSON output").
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct WatchArgs {
    #[command(flatten)]
    output: OutputArgs,
    /// Stop after this many seconds.
    #[arg(long)]
    duration: Option<f64>,
    /// Milliseconds between reads when the ring is empty.
    #[arg(long, default_value_t = 50)]
    interval: u64,
}

/// Source names as the command line takes them.
fn parse_sources(text: &str) -> Result<SourceSet, String> {
    if text == "all" {
        return Ok(SourceSet::ALL);
    }
    text.split(',')
        .map(|name| {
            Source::from_name(name.trim()).ok_or_else(|| {
                let known: Vec<_> = Source::ALL.iter().map(|source| source.name()).collect();
                format!(
                    "unknown source `{name}`; sources are {} or all",
                    known.join(", ")
                )
            })
        })
        .collect()
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(usage) => {
            let _ = usage.print();
            // --help and --version are not errors.
            return if usage.use_stderr() {
                ExitCode::from(error::exit_code::USAGE)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    match run(&cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("kstack: {error}");
            ExitCode::from(error.exit_code())
        }
    }
}

fn run(command: &Command) -> Result<(), ClientError> {
    let mut device = open_device()?;
    match command {
        Command::Status(output) => {
            let status = session::status(&mut device)?;
            if output.json {
                println!("{}", report::status_json(&status));
            } else {
                print!("{}", report::status(&status));
            }
        }
        Command::Config(args) => config(&mut device, args)?,
        Command::Read(output) => {
            let mut reader = Reader::default();
            loop {
                let batch = reader.read(&mut device)?;
                print_records(&batch.records, output.json);
                if !batch.more_pending {
                    break;
                }
            }
        }
        Command::Watch(args) => watch(&mut device, args)?,
        Command::Clear => session::clear(&mut device)?,
        Command::Selftest(output) => {
            let record = session::capture_now(&mut device, u64::from(std::process::id()))?;
            print_records(std::slice::from_ref(&record), output.json);
        }
    }
    Ok(())
}

/// Applies the options to the configuration in force; prints the result.
fn config(device: &mut impl Transport, args: &ConfigArgs) -> Result<(), ClientError> {
    let current = session::status(device)?.config;
    let mut sources = current.sources;
    for source in args.enable.unwrap_or_default().iter() {
        sources = sources.with(source);
    }
    for source in args.disable.unwrap_or_default().iter() {
        sources = sources.without(source);
    }
    let wanted = CaptureConfig {
        sources,
        frames_to_skip: args.skip.unwrap_or(current.frames_to_skip),
        frames_to_capture: args.frames.unwrap_or(current.frames_to_capture),
        process_filter: args.pid.unwrap_or(current.process_filter),
        timer_period_ms: args.timer_period.unwrap_or(current.timer_period_ms),
    };
    if wanted != current {
        session::configure(device, &wanted)?;
    }
    let config = session::status(device)?.config;
    let enabled: Vec<_> = config.sources.iter().map(Source::name).collect();
    println!(
        "sources enabled: {}; skip {} frames, keep up to {}, process filter {}, timer period {} ms",
        if enabled.is_empty() {
            "none".to_owned()
        } else {
            enabled.join(",")
        },
        config.frames_to_skip,
        config.frames_to_capture,
        config.process_filter,
        config.timer_period_ms
    );
    Ok(())
}

/// Reads until stopped; then says how many records arrived, how many
/// sequence numbers are missing, and how many drops the driver counted.
fn watch(device: &mut impl Transport, args: &WatchArgs) -> Result<(), ClientError> {
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = Arc::clone(&stop);
        // Without a console (a service, some Wine setups) there is no Ctrl-C
        // to catch; --duration still ends the watch.
        let _ = ctrlc::set_handler(move || stop.store(true, Ordering::Relaxed));
    }
    let deadline = args
        .duration
        .map(|seconds| Instant::now() + Duration::from_secs_f64(seconds.max(0.0)));
    let mut reader = Reader::default();
    let mut tracker = SequenceTracker::default();
    let mut dropped = None;
    let mut last_dropped = 0;
    while !stop.load(Ordering::Relaxed) && deadline.is_none_or(|deadline| Instant::now() < deadline)
    {
        let batch = reader.read(device)?;
        for record in &batch.records {
            tracker.note(record.header.sequence);
        }
        print_records(&batch.records, args.output.json);
        dropped.get_or_insert(batch.dropped);
        last_dropped = batch.dropped;
        if !batch.more_pending {
            std::thread::sleep(Duration::from_millis(args.interval));
        }
    }
    let dropped_while_watching = last_dropped - dropped.unwrap_or(last_dropped);
    eprintln!(
        "kstack watch: {} records, {} sequence gaps, {} dropped by the driver (ring full) while watching",
        tracker.received,
        tracker.gaps(),
        dropped_while_watching
    );
    Ok(())
}

fn print_records(records: &[TraceRecord], json: bool) {
    let mut out = io::stdout().lock();
    for record in records {
        let written = if json {
            writeln!(out, "{}", record.to_json())
        } else {
            write!(out, "{}", record.to_text())
        };
        if written.is_err() {
            // The reader went away (a closed pipe): nothing more to print.
            return;
        }
    }
}

#[cfg(windows)]
fn open_device() -> Result<device::Device, ClientError> {
    device::Device::open()
}

#[cfg(not(windows))]
fn open_device() -> Result<NoDevice, ClientError> {
    Err(ClientError::NeedsWindows)
}

/// Stands in for the device where there is none, so commands type-check
/// and say plainly that they need Windows.
#[cfg(not(windows))]
enum NoDevice {}

#[cfg(not(windows))]
impl Transport for NoDevice {
    fn control(
        &mut self,
        _code: u32,
        _input: &[u8],
        _output: &mut [u8],
    ) -> kstack_client::transport::Reply {
        match *self {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_lists_parse_and_unknown_names_are_explained() {
        assert_eq!(parse_sources("all"), Ok(SourceSet::ALL));
        assert_eq!(
            parse_sources("timer, process"),
            Ok(SourceSet::EMPTY.with(Source::Timer).with(Source::Process))
        );
        let error = parse_sources("timer,disk").unwrap_err();
        assert!(
            error.contains("unknown source `disk`") && error.contains("ondemand"),
            "{error}"
        );
    }

    #[test]
    fn the_cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
