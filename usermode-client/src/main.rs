//! `kstack`: the user-mode client of the kstack driver.

use std::{
    io::{self, Write},
    path::{Path, PathBuf},
    process::ExitCode,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use clap::{Args, Parser, Subcommand};
use kstack_abi::{CaptureConfig, RecordView, Source, SourceSet};

use kstack_client::{
    capture_file::{CaptureError, CaptureView, CaptureWriter},
    error::{self, ClientError},
    flamegraph,
    modules::{Module, ModuleMap},
    report,
    session::{self, Follow, FollowSummary},
    stack_table::{self, StackTable, TopLimits},
    symbol_path,
    symbolizer::Symbolizer,
    system_modules,
    trace::TraceRecord,
    transport::Transport,
};
#[cfg(windows)]
use kstack_client::{device, pdb_symbols};

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
    Status(JsonArg),
    /// Show or change what is captured (no options: show).
    Config(ConfigArgs),
    /// Drain the ring once (or read a saved capture) and print the records.
    Read(ReadArgs),
    /// Follow new records until Ctrl-C (or --duration), then summarize.
    Watch(WatchArgs),
    /// Discard every record in the ring.
    Clear,
    /// Capture this request's stack in the driver and show it.
    Selftest(RecordFormat),
    /// Save records and the module list to a file for offline analysis.
    Save(SaveArgs),
    /// Unique stacks by stack id: count, sources, first and last seen.
    Top(TopArgs),
    /// Folded stacks (`source;outermost;...;innermost count`) for
    /// flamegraph tools.
    Folded(FoldedArgs),
    /// Draw a flamegraph SVG of the stacks.
    Flamegraph(FlamegraphArgs),
    /// The kernel modules frames are named after (base, size, name).
    Modules(ModulesArgs),
}

#[derive(Args)]
struct JsonArg {
    /// JSON instead of text (README, "JSON output").
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct RecordFormat {
    #[command(flatten)]
    json: JsonArg,
    /// One Sysmon-style `CallTrace: a+0x1|b+0x2` line per record instead
    /// of one line per frame.
    #[arg(long, conflicts_with = "json")]
    call_trace: bool,
    #[command(flatten)]
    symbols: SymbolsArg,
}

#[derive(Args)]
struct SymbolsArg {
    /// Name frames `module!function+0xoffset` from PDB symbols found
    /// through this dbghelp symbol path (`;`-separated folders and `srv*`
    /// symbol servers). Default: `_NT_SYMBOL_PATH`; "" for none. Windows
    /// only.
    #[arg(long, value_name = "PATH")]
    symbols: Option<String>,
}

/// Where the module list frames are named after comes from.
#[derive(Clone, Copy)]
enum ModuleOrigin {
    /// This machine's kernel, now: its images are in the system folders.
    Live,
    /// A saved capture, perhaps from another machine: images and PDBs are
    /// found on the symbol path only.
    Saved,
}

#[derive(Args)]
struct ConfigArgs {
    /// Sources to enable (comma-separated names, or `all`). Capture-now
    /// (`selftest`) always answers; `ondemand` decides whether its record
    /// is also kept in the ring.
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
    /// Keep only records of this process id (0: every process). Applies to
    /// every source, capture-now included: the process is the one the
    /// callback runs in (the record's pid), which for process, thread and
    /// image events need not be the one the event names. Events left out
    /// are counted as `filtered` in `kstack status`; a capture-now from
    /// another process is still answered, not kept.
    #[arg(long)]
    pid: Option<u32>,
    /// The timer source's period in milliseconds (1 to 10000).
    #[arg(long)]
    timer_period: Option<u32>,
}

#[derive(Args)]
struct ReadArgs {
    #[command(flatten)]
    format: RecordFormat,
    /// Read this saved capture instead of the driver (works on any OS).
    #[arg(long, value_name = "FILE")]
    input: Option<PathBuf>,
}

#[derive(Args)]
struct FollowArgs {
    /// Stop after this many seconds.
    #[arg(long, value_name = "SECONDS")]
    duration: Option<f64>,
    /// Milliseconds between reads when the ring is empty.
    #[arg(long, value_name = "MS", default_value_t = 50)]
    interval: u64,
}

#[derive(Args)]
struct WatchArgs {
    #[command(flatten)]
    format: RecordFormat,
    #[command(flatten)]
    follow: FollowArgs,
}

#[derive(Args)]
struct SaveArgs {
    /// The capture file to write.
    file: PathBuf,
    /// Replace the file if it exists.
    #[arg(long)]
    force: bool,
    /// Follow for this long (or until Ctrl-C) instead of draining once.
    #[command(flatten)]
    follow: FollowArgs,
}

/// Where analyzed records come from: a saved capture, or the driver
/// (drained once, or followed for --duration seconds).
#[derive(Args)]
struct AnalysisInput {
    /// Analyze this saved capture instead of the driver (works on any OS).
    #[arg(long, value_name = "FILE", conflicts_with = "duration")]
    input: Option<PathBuf>,
    #[command(flatten)]
    follow: FollowArgs,
}

#[derive(Args)]
struct TopArgs {
    #[command(flatten)]
    input: AnalysisInput,
    #[command(flatten)]
    json: JsonArg,
    /// Stacks to show.
    #[arg(long, default_value_t = 20)]
    limit: usize,
    /// Frames to show per stack.
    #[arg(long, default_value_t = 8)]
    frames: usize,
    #[command(flatten)]
    symbols: SymbolsArg,
}

#[derive(Args)]
struct FoldedArgs {
    #[command(flatten)]
    input: AnalysisInput,
    /// Write to this file instead of standard output.
    #[arg(long, short, value_name = "FILE")]
    output: Option<PathBuf>,
    /// Replace the output file if it exists.
    #[arg(long)]
    force: bool,
    #[command(flatten)]
    symbols: SymbolsArg,
}

#[derive(Args)]
struct FlamegraphArgs {
    #[command(flatten)]
    input: AnalysisInput,
    /// The SVG file to write.
    #[arg(long, short, value_name = "FILE")]
    output: PathBuf,
    /// Replace the output file if it exists.
    #[arg(long)]
    force: bool,
    /// The title drawn above the graph.
    #[arg(long, default_value = "kstack: kernel stacks")]
    title: String,
    #[command(flatten)]
    symbols: SymbolsArg,
}

#[derive(Args)]
struct ModulesArgs {
    /// Show the module list saved in this capture instead.
    #[arg(long, value_name = "FILE")]
    input: Option<PathBuf>,
    #[command(flatten)]
    json: JsonArg,
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
    match command {
        Command::Status(output) => {
            let status = session::status(&mut open_device()?)?;
            if output.json {
                println!("{}", report::status_json(&status));
            } else {
                print!("{}", report::status(&status));
            }
        }
        Command::Config(args) => config(&mut open_device()?, args)?,
        Command::Read(args) => read(args)?,
        Command::Watch(args) => watch(&mut open_device()?, args)?,
        Command::Clear => session::clear(&mut open_device()?)?,
        Command::Selftest(format) => {
            let mut device = open_device()?;
            let symbolizer = format
                .symbols
                .symbolizer(live_modules(&mut device)?, ModuleOrigin::Live)?;
            let record = session::capture_now(&mut device, u64::from(std::process::id()))?;
            print_records(std::slice::from_ref(&record), &symbolizer, format);
        }
        Command::Save(args) => save(args)?,
        Command::Top(args) => {
            let (table, symbolizer) = stack_table(&args.input, &args.symbols)?;
            let limits = TopLimits {
                stacks: args.limit,
                frames: args.frames,
            };
            if args.json.json {
                for line in stack_table::top_json(&table, &symbolizer, limits) {
                    println!("{line}");
                }
            } else {
                print!("{}", stack_table::top_text(&table, &symbolizer, limits));
            }
        }
        Command::Folded(args) => {
            let (table, symbolizer) = stack_table(&args.input, &args.symbols)?;
            let mut text = table.folded(&symbolizer).join("\n");
            text.push('\n');
            match &args.output {
                Some(path) => write_file(path, args.force, |out| out.write_all(text.as_bytes()))?,
                None => print!("{text}"),
            }
        }
        Command::Flamegraph(args) => flamegraph(args)?,
        Command::Modules(args) => modules(args)?,
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

/// The module list frames are named after in a live session: the kernel's
/// list, with kstack.sys as the driver reports it replacing whatever the
/// list says about that range.
fn live_modules(device: &mut impl Transport) -> Result<ModuleMap, ClientError> {
    let status = session::status(device)?;
    let system = system_module_list().unwrap_or_else(|error| {
        eprintln!("kstack: warning: {error}; only frames inside kstack.sys get names");
        Vec::new()
    });
    let map = ModuleMap::new(system);
    Ok(match Module::from_driver_image(status.driver_image) {
        Some(driver) => map.with_authoritative(driver),
        None => map,
    })
}

impl SymbolsArg {
    /// Names frames after `modules`, and after functions too when a symbol
    /// path is set. A dbghelp that will not start costs the function names
    /// only.
    #[cfg(windows)]
    #[expect(
        clippy::unnecessary_wraps,
        reason = "the same signature as off Windows, where --symbols is refused"
    )]
    fn symbolizer(
        &self,
        modules: ModuleMap,
        origin: ModuleOrigin,
    ) -> Result<Symbolizer, ClientError> {
        let symbolizer = Symbolizer::new(modules);
        let environment = std::env::var(symbol_path::ENVIRONMENT_VARIABLE).ok();
        let Some(path) = symbol_path::chosen(self.symbols.as_deref(), environment.as_deref())
        else {
            return Ok(symbolizer);
        };
        let image_dirs = match origin {
            ModuleOrigin::Live => {
                symbol_path::system_image_dirs(std::env::var_os("SystemRoot").as_deref())
            }
            ModuleOrigin::Saved => Vec::new(),
        };
        Ok(match pdb_symbols::Dbghelp::start(&path, image_dirs) {
            Ok(dbghelp) => symbolizer.with_functions(Box::new(dbghelp)),
            Err(error) => {
                eprintln!(
                    "kstack: warning: dbghelp did not start ({error}); frames are named module+0xoffset"
                );
                symbolizer
            }
        })
    }

    /// Off Windows there is no dbghelp: `--symbols` is refused rather than
    /// silently ignored; `_NT_SYMBOL_PATH`, a Windows setting, is ignored.
    #[cfg(not(windows))]
    fn symbolizer(
        &self,
        modules: ModuleMap,
        _origin: ModuleOrigin,
    ) -> Result<Symbolizer, ClientError> {
        match symbol_path::chosen(self.symbols.as_deref(), None) {
            Some(_) => Err(ClientError::SymbolsNeedWindows),
            None => Ok(Symbolizer::new(modules)),
        }
    }
}

#[cfg(windows)]
fn system_module_list() -> Result<Vec<Module>, system_modules::ModuleListError> {
    system_modules::query()
}

#[cfg(not(windows))]
#[expect(
    clippy::unnecessary_wraps,
    reason = "the same signature as the Windows query"
)]
fn system_module_list() -> Result<Vec<Module>, system_modules::ModuleListError> {
    // Live sessions need the device, so this is never reached off Windows.
    Ok(Vec::new())
}

/// The Ctrl-C flag. Without a console (a service, some Wine setups) there
/// is no Ctrl-C to catch; --duration still ends the wait.
fn stop_flag() -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    let _ = ctrlc::set_handler(move || flag.store(true, Ordering::Relaxed));
    stop
}

impl FollowArgs {
    /// Follow until stopped (Ctrl-C or --duration).
    fn until_stopped(&self) -> Follow {
        Follow::UntilStopped {
            deadline: self
                .duration
                .map(|seconds| Instant::now() + Duration::from_secs_f64(seconds.max(0.0))),
            interval: Duration::from_millis(self.interval),
        }
    }

    /// Drain once, unless --duration asks to follow.
    fn drain_or_follow(&self) -> Follow {
        if self.duration.is_some() {
            self.until_stopped()
        } else {
            Follow::UntilDrained
        }
    }
}

fn read(args: &ReadArgs) -> Result<(), ClientError> {
    if let Some(path) = &args.input {
        let mut batch = Vec::new();
        let symbolizer =
            for_each_saved_record(path, &args.format.symbols, |record, symbolizer| {
                batch.push(TraceRecord::from(record));
                if batch.len() == 4096 {
                    print_records(&batch, symbolizer, &args.format);
                    batch.clear();
                }
            })?;
        print_records(&batch, &symbolizer, &args.format);
        return Ok(());
    }
    let mut device = open_device()?;
    let symbolizer = args
        .format
        .symbols
        .symbolizer(live_modules(&mut device)?, ModuleOrigin::Live)?;
    session::follow(
        &mut device,
        Follow::UntilDrained,
        &AtomicBool::new(false),
        |records| {
            print_records(records, &symbolizer, &args.format);
            Ok(())
        },
    )?;
    Ok(())
}

/// Reads until stopped; then says how many records arrived, how many
/// sequence numbers are missing, and how many drops the driver counted.
fn watch(device: &mut impl Transport, args: &WatchArgs) -> Result<(), ClientError> {
    let symbolizer = args
        .format
        .symbols
        .symbolizer(live_modules(device)?, ModuleOrigin::Live)?;
    let summary = session::follow(
        device,
        args.follow.until_stopped(),
        &stop_flag(),
        |records| {
            print_records(records, &symbolizer, &args.format);
            Ok(())
        },
    )?;
    eprintln!("kstack watch: {}", follow_summary_text(&summary));
    Ok(())
}

fn follow_summary_text(summary: &FollowSummary) -> String {
    format!(
        "{} records, {} sequence gaps, {} dropped by the driver (ring full) meanwhile",
        summary.received, summary.gaps, summary.dropped
    )
}

fn save(args: &SaveArgs) -> Result<(), ClientError> {
    let mut device = open_device()?;
    let modules = live_modules(&mut device)?;
    let path = args.file.as_path();
    let writing = |error: io::Error| ClientError::file(path, "writing", &error);
    let mut writer = CaptureWriter::new(create_output(path, args.force)?, &modules)
        .map_err(writing)
        .inspect_err(|_| discard(path))?;
    let followed = session::follow(
        &mut device,
        args.follow.drain_or_follow(),
        &stop_flag(),
        |records| {
            records
                .iter()
                .try_for_each(|record| writer.append(record))
                .map_err(writing)
        },
    );
    let saved = writer.records();
    // A driver error ends the capture but keeps what was read: the file is
    // finished and valid. A write error leaves nothing trustworthy.
    writer
        .finish()
        .map_err(writing)
        .inspect_err(|_| discard(path))?;
    let summary = followed.inspect_err(|error| {
        if matches!(error, ClientError::File { .. }) {
            discard(path);
        } else {
            eprintln!(
                "kstack save: {saved} records read before the error are saved in {}",
                path.display()
            );
        }
    })?;
    eprintln!(
        "kstack save: {} and {} written to {}; {}",
        stack_table::counted(saved, "record"),
        stack_table::counted(modules.modules().len() as u64, "module"),
        path.display(),
        follow_summary_text(&summary)
    );
    Ok(())
}

/// Reads the capture file at `path` and hands each of its records, in
/// order, to `each` with the symbolizer for the file's module list and
/// `symbols`; returns that symbolizer. A damaged record ends it with the
/// file's error.
fn for_each_saved_record(
    path: &Path,
    symbols: &SymbolsArg,
    mut each: impl FnMut(&RecordView<'_>, &Symbolizer),
) -> Result<Symbolizer, ClientError> {
    let bytes = read_file(path)?;
    let mut capture = parse_capture(path, &bytes)?;
    let symbolizer =
        symbols.symbolizer(std::mem::take(&mut capture.modules), ModuleOrigin::Saved)?;
    for record in capture.records() {
        each(
            &record.map_err(|error| capture_error(path, error))?,
            &symbolizer,
        );
    }
    Ok(symbolizer)
}

/// Groups records from a capture file or from the driver by stack; names
/// their frames after its module list and `symbols`.
fn stack_table(
    input: &AnalysisInput,
    symbols: &SymbolsArg,
) -> Result<(StackTable, Symbolizer), ClientError> {
    let mut table = StackTable::default();
    if let Some(path) = &input.input {
        let symbolizer = for_each_saved_record(path, symbols, |record, _| {
            table.add(&record.header, || record.frames());
        })?;
        return Ok((table, symbolizer));
    }
    let mut device = open_device()?;
    let symbolizer = symbols.symbolizer(live_modules(&mut device)?, ModuleOrigin::Live)?;
    session::follow(
        &mut device,
        input.follow.drain_or_follow(),
        &stop_flag(),
        |records| {
            for record in records {
                table.add(&record.header, || record.frames.iter().copied());
            }
            Ok(())
        },
    )?;
    Ok((table, symbolizer))
}

fn flamegraph(args: &FlamegraphArgs) -> Result<(), ClientError> {
    let (table, symbolizer) = stack_table(&args.input, &args.symbols)?;
    if table.is_empty() {
        return Err(ClientError::NothingToDraw);
    }
    let folded = table.folded(&symbolizer);
    let subtitle = table.summary();
    write_file(&args.output, args.force, |out| {
        flamegraph::write_svg(&folded, &format!("{} ({subtitle})", args.title), out)
    })?;
    eprintln!(
        "kstack flamegraph: {subtitle} drawn to {}",
        args.output.display()
    );
    Ok(())
}

fn modules(args: &ModulesArgs) -> Result<(), ClientError> {
    let modules = match &args.input {
        Some(path) => parse_capture(path, &read_file(path)?)?.modules,
        None => live_modules(&mut open_device()?)?,
    };
    let mut out = io::stdout().lock();
    for module in modules.modules() {
        let written = if args.json.json {
            writeln!(
                out,
                "{}",
                serde_json::json!({
                    "base": format!("{:#x}", module.base),
                    "size": module.size,
                    "name": module.name,
                })
            )
        } else {
            writeln!(
                out,
                "{:#018x} {:>10x} {}",
                module.base, module.size, module.name
            )
        };
        if written.is_err() {
            break;
        }
    }
    Ok(())
}

fn read_file(path: &Path) -> Result<Vec<u8>, ClientError> {
    std::fs::read(path).map_err(|error| ClientError::file(path, "reading", &error))
}

fn parse_capture<'a>(path: &Path, bytes: &'a [u8]) -> Result<CaptureView<'a>, ClientError> {
    CaptureView::parse(bytes).map_err(|error| capture_error(path, error))
}

fn capture_error(path: &Path, error: CaptureError) -> ClientError {
    ClientError::Capture {
        path: path.display().to_string(),
        error,
    }
}

/// Creates `path`, refusing to replace it without `force`.
fn create_output(path: &Path, force: bool) -> Result<io::BufWriter<std::fs::File>, ClientError> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true);
    if force {
        options.create(true).truncate(true);
    } else {
        options.create_new(true);
    }
    let file = options.open(path).map_err(|error| {
        if error.kind() == io::ErrorKind::AlreadyExists {
            ClientError::Exists {
                path: path.display().to_string(),
            }
        } else {
            ClientError::file(path, "creating", &error)
        }
    })?;
    Ok(io::BufWriter::new(file))
}

/// Removes a half-written output, so nothing that looks finished is wrong.
fn discard(path: &Path) {
    let _ = std::fs::remove_file(path);
}

/// Writes a whole output file with `write`.
fn write_file(
    path: &Path,
    force: bool,
    write: impl FnOnce(&mut io::BufWriter<std::fs::File>) -> io::Result<()>,
) -> Result<(), ClientError> {
    let mut out = create_output(path, force)?;
    write(&mut out)
        .and_then(|()| out.flush())
        .map_err(|error| ClientError::file(path, "writing", &error))
        .inspect_err(|_| discard(path))
}

fn print_records(records: &[TraceRecord], symbolizer: &Symbolizer, format: &RecordFormat) {
    let mut out = io::stdout().lock();
    for record in records {
        let written = if format.json.json {
            writeln!(out, "{}", record.to_json(symbolizer))
        } else {
            write!(out, "{}", record.to_text(symbolizer, format.call_trace))
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
