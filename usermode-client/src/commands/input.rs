//! Where analyzed records come from: a saved capture (any OS), or the
//! driver (drained once, or followed for --duration seconds).

use std::path::{Path, PathBuf};

use clap::Args;
use kstack_client::{
    capture::{
        file::{CaptureError, CaptureView},
        stack_table::StackTable,
        state_filter::{FilterCounts, StateFilter},
        trace::TraceRecord,
    },
    device::session,
    error::ClientError,
    naming::symbolizer::Symbolizer,
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
    /// Analyze this saved capture instead of the driver (works on any OS).
    #[arg(long, value_name = "FILE", conflicts_with = "duration")]
    input: Option<PathBuf>,
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
    /// The saved capture read, if any.
    pub fn path(&self) -> Option<&Path> {
        self.input.as_deref()
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

/// Reads the capture file at `path` and hands each of its records, in
/// order, to `each` with the symbolizer for the file's module list and
/// `symbols`; returns that symbolizer. A damaged record ends it with the
/// file's error.
pub fn for_each_saved_record(
    path: &Path,
    symbols: &SymbolsArg,
    mut each: impl FnMut(&TraceRecord, &Symbolizer),
) -> Result<Symbolizer, ClientError> {
    let bytes = read_file(path)?;
    let mut capture = parse_capture(path, &bytes)?;
    let symbolizer = symbols
        .symbolizer(std::mem::take(&mut capture.modules), ModuleOrigin::Saved)
        .with_processes(std::mem::take(&mut capture.processes));
    for record in capture.records() {
        each(
            &record.map_err(|error| capture_error(path, error))?,
            &symbolizer,
        );
    }
    Ok(symbolizer)
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
    let symbolizer = if let Some(path) = &input.input {
        for_each_saved_record(path, symbols, |record, _| admitted(record))?
    } else {
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

pub fn read_file(path: &Path) -> Result<Vec<u8>, ClientError> {
    std::fs::read(path).map_err(|error| ClientError::file(path, "reading", &error))
}

pub fn parse_capture<'a>(path: &Path, bytes: &'a [u8]) -> Result<CaptureView<'a>, ClientError> {
    CaptureView::parse(bytes).map_err(|error| capture_error(path, error))
}

fn capture_error(path: &Path, error: CaptureError) -> ClientError {
    ClientError::Capture {
        path: path.display().to_string(),
        error,
    }
}
