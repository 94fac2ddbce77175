//! Where analyzed records come from: a saved capture (any OS), or the
//! driver (drained once, or followed for --duration seconds).

use std::{
    fs::File,
    io,
    path::{Path, PathBuf},
    sync::atomic::{AtomicBool, Ordering},
};

use clap::Args;
use kstack_client::{
    capture::{
        reader::{CaptureReader, Health, Item, ReadError},
        stack_table::StackTable,
        state_filter::{FilterCounts, StateFilter},
        trace::TraceRecord,
    },
    device::session,
    error::ClientError,
    naming::{modules::ModuleMap, process_modules::ProcessModules, symbolizer::Symbolizer},
    thread_list::ThreadState,
};

use super::{
    live::{FollowArgs, open_device, stop_flag},
    symbols::{ModuleOrigin, SymbolsArg},
};

/// Where analyzed records come from: a saved capture, or the driver
/// (drained once, or followed for --duration seconds); and which of them
/// are counted.
#[derive(Args)]
pub struct AnalysisInput {
    /// Analyze this saved capture instead of the driver (works on any OS);
    /// several (`--input A B`, or `--input` again) are read in order as
    /// one: the parts of `save --max-size`.
    #[arg(long, value_name = "FILE", num_args = 1.., conflicts_with = "duration")]
    input: Vec<PathBuf>,
    #[command(flatten)]
    follow: FollowArgs,
    #[command(flatten)]
    states: StateArgs,
}

/// Which samples are counted, by their thread's state when `kstack sample`
/// listed it (records without a state are left out by each).
#[derive(Args)]
#[group(multiple = false)]
pub struct StateArgs {
    /// Count only samples whose thread was running (on-CPU).
    #[arg(long)]
    on_cpu: bool,
    /// Count only samples whose thread was not running (off-CPU: waiting,
    /// ready, ...).
    #[arg(long)]
    off_cpu: bool,
    /// Count only samples whose thread was in this state: initialized,
    /// ready, running, standby, terminated, waiting, transition,
    /// deferred-ready, gate-wait, waiting-for-process-in-swap.
    #[arg(long, value_name = "STATE", value_parser = parse_state)]
    state: Option<ThreadState>,
}

impl StateArgs {
    /// The filter asked for, if any.
    pub fn filter(&self) -> Option<StateFilter> {
        if self.on_cpu {
            Some(StateFilter::OnCpu)
        } else if self.off_cpu {
            Some(StateFilter::OffCpu)
        } else {
            self.state.map(StateFilter::State)
        }
    }
}

fn parse_state(text: &str) -> Result<ThreadState, String> {
    ThreadState::from_name(text).ok_or_else(|| {
        format!(
            "{text:?} is not a thread state: initialized, ready, running, standby, terminated, \
             waiting, transition, deferred-ready, gate-wait, waiting-for-process-in-swap"
        )
    })
}

impl AnalysisInput {
    /// The saved captures read (none: the driver).
    pub fn paths(&self) -> &[PathBuf] {
        &self.input
    }

    /// How long to follow the driver, and how often to read it.
    pub const fn follow(&self) -> &FollowArgs {
        &self.follow
    }

    /// The state filter asked for, if any.
    pub fn state_filter(&self) -> Option<StateFilter> {
        self.states.filter()
    }
}

/// Reads the capture files at `paths`, in order, as one, and hands each of
/// their records, in order, to `each` with the symbolizer for the first
/// file's module lists and `symbols`, kept current with every file's module
/// records; returns that symbolizer. What a file lost (damage, a cut) is
/// said on stderr when it is read (see [`note_health`]).
pub fn for_each_saved_record(
    paths: &[PathBuf],
    symbols: &SymbolsArg,
    mut each: impl FnMut(&TraceRecord, &Symbolizer),
) -> Result<Symbolizer, ClientError> {
    let mut symbolizer: Option<Symbolizer> = None;
    for path in paths {
        let mut capture = open_capture(path)?;
        // The parts of one capture start with the same module lists.
        let symbolizer = symbolizer.get_or_insert_with(|| {
            symbols
                .symbolizer(std::mem::take(&mut capture.modules), ModuleOrigin::Saved)
                .with_processes(std::mem::take(&mut capture.processes))
        });
        while let Some(item) = capture.next_item() {
            match item.map_err(|error| read_error(path, error))? {
                Item::Record(record) => each(&record, symbolizer),
                Item::Module(change) => symbolizer.note_modules(std::slice::from_ref(&change)),
                Item::LoadedImages(images) => {
                    for (module, identity) in images {
                        symbolizer.note_loaded_identity(&module, identity);
                    }
                }
            }
        }
        note_health(path, capture.health());
    }
    symbolizer.ok_or_else(|| {
        ClientError::file(
            Path::new("--input"),
            "reading",
            &io::Error::other("no capture file named"),
        )
    })
}

/// The module lists of the capture file at `path`: the kernel's, and each
/// process's with every module record and loaded image's identity noted.
pub fn saved_module_lists(path: &Path) -> Result<(ModuleMap, ProcessModules), ClientError> {
    let mut capture = open_capture(path)?;
    while let Some(record) = capture.next_record() {
        record.map_err(|error| read_error(path, error))?;
    }
    note_health(path, capture.health());
    Ok((capture.modules, capture.processes))
}

/// Hands each record of a capture file or from the driver that the state
/// filter admits to `each`, in order (what the filter left out is said on
/// stderr); returns the symbolizer for its module list and `symbols`.
fn for_each_record(
    input: &AnalysisInput,
    symbols: &SymbolsArg,
    mut each: impl FnMut(&TraceRecord),
) -> Result<Symbolizer, ClientError> {
    let filter = input.state_filter();
    let mut counts = FilterCounts::default();
    let mut admitted = |record: &TraceRecord| {
        if filter.is_none_or(|filter| counts.note(filter, record)) {
            each(record);
        }
    };
    let symbolizer = if input.input.is_empty() {
        let mut device = open_device()?;
        let mut symbolizer = symbols.live_symbolizer(&mut device)?;
        session::follow(
            &mut device,
            input.follow.drain_or_follow(),
            &stop_flag(),
            |batch| {
                symbolizer.note_modules(&batch.modules);
                for record in &batch.records {
                    admitted(record);
                }
                Ok(())
            },
        )?;
        symbolizer
    } else {
        for_each_saved_record(&input.input, symbols, |record, _| admitted(record))?
    };
    if let Some(filter) = filter {
        kstack_client::eprintln_fitted!("kstack: {}", counts.text(filter));
    }
    Ok(symbolizer)
}

/// Groups records from a capture file or from the driver by stack; names
/// their frames after its module list and `symbols`.
pub fn stack_table(
    input: &AnalysisInput,
    symbols: &SymbolsArg,
) -> Result<(StackTable, Symbolizer), ClientError> {
    let mut table = StackTable::default();
    let symbolizer = for_each_record(input, symbols, |record| {
        table.add(record);
    })?;
    Ok((table, symbolizer))
}

/// Every record from a capture file or from the driver, in order, and the
/// symbolizer naming their frames.
pub fn trace_records(
    input: &AnalysisInput,
    symbols: &SymbolsArg,
) -> Result<(Vec<TraceRecord>, Symbolizer), ClientError> {
    let mut records = Vec::new();
    let symbolizer = for_each_record(input, symbols, |record| records.push(record.clone()))?;
    Ok((records, symbolizer))
}

/// Opens the capture file at `path` and reads its module lists.
pub fn open_capture(path: &Path) -> Result<CaptureReader<File>, ClientError> {
    if path.is_dir() {
        return Err(ClientError::file(
            path,
            "reading",
            &io::Error::other("it is a folder; give a capture file written by kstack save"),
        ));
    }
    let file = File::open(path).map_err(|error| ClientError::file(path, "reading", &error))?;
    CaptureReader::open(file).map_err(|error| read_error(path, error))
}

pub fn read_error(path: &Path, error: ReadError) -> ClientError {
    match error {
        ReadError::Io(error) => ClientError::file(path, "reading", &error),
        ReadError::Capture(error) => ClientError::Capture {
            path: path.display().to_string(),
            error,
        },
    }
}

/// Whether a capture read was not whole: the process then ends with
/// `exit_code::INCOMPLETE_CAPTURE` (its output is complete for what could
/// be read).
pub static INCOMPLETE_CAPTURE: AtomicBool = AtomicBool::new(false);

/// Says on stderr what the capture at `path` lost, if anything, and notes
/// it in [`INCOMPLETE_CAPTURE`].
fn note_health(path: &Path, health: &Health) {
    if !health.is_whole() {
        INCOMPLETE_CAPTURE.store(true, Ordering::Relaxed);
        kstack_client::eprintln_fitted!(
            "kstack: warning: {} is incomplete: {}; everything else in it was read",
            path.display(),
            health
        );
    }
}
