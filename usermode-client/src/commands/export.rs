//! `kstack export`: the records in another tool's format, written to a
//! file.

use std::io::{self, Write};

use clap::{Args, ValueEnum};
use kstack_client::{
    capture::stack_table::{StackTable, counted},
    error::ClientError,
    naming::symbolizer::Symbolizer,
    output::export::{chrome_trace, pprof, speedscope},
};
use serde_json::Value;

use super::{
    input::{AnalysisInput, stack_table, trace_records},
    output::OutputArgs,
    symbols::SymbolsArg,
};

/// The formats `kstack export` writes.
#[derive(Clone, Copy, ValueEnum)]
pub enum ExportFormat {
    /// profile.proto, gzipped: go tool pprof, Pyroscope, Grafana.
    Pprof,
    /// speedscope's JSON file format: speedscope.app.
    Speedscope,
    /// Trace-event JSON: the Perfetto UI, Chrome's tracing page.
    ChromeTrace,
}

#[derive(Args)]
#[command(mut_arg("output", |arg| arg.required(true).help("The file to write")))]
pub struct ExportArgs {
    /// The format to write.
    #[arg(long, value_enum)]
    format: ExportFormat,
    #[command(flatten)]
    input: AnalysisInput,
    #[command(flatten)]
    output: OutputArgs,
    #[command(flatten)]
    symbols: SymbolsArg,
}

pub fn run(args: &ExportArgs) -> Result<(), ClientError> {
    args.output.check(args.input.paths())?;
    let summary = match args.format {
        ExportFormat::Pprof => {
            let (table, symbolizer) = stacks(args)?;
            args.output
                .write(|out| pprof::write(&table, &symbolizer, out))?;
            table.summary()
        }
        ExportFormat::Speedscope => {
            let (table, symbolizer) = stacks(args)?;
            args.output
                .write(|out| write_json(out, &speedscope::document(&table, &symbolizer)))?;
            table.summary()
        }
        ExportFormat::ChromeTrace => {
            let (records, symbolizer) = trace_records(&args.input, &args.symbols)?;
            if records.is_empty() {
                return Err(NO_RECORDS);
            }
            args.output
                .write(|out| write_json(out, &chrome_trace::document(&records, &symbolizer)))?;
            counted(records.len() as u64, "record")
        }
    };
    kstack_client::eprintln_fitted!("kstack export: {summary} written to {}", args.output);
    Ok(())
}

const NO_RECORDS: ClientError = ClientError::NoRecords { to: "export" };

/// The records grouped by stack; an error when there are none.
fn stacks(args: &ExportArgs) -> Result<(StackTable, Symbolizer), ClientError> {
    let (table, symbolizer) = stack_table(&args.input, &args.symbols)?;
    if table.is_empty() {
        return Err(NO_RECORDS);
    }
    Ok((table, symbolizer))
}

/// One line of JSON.
fn write_json(mut out: impl Write, document: &Value) -> io::Result<()> {
    serde_json::to_writer(&mut out, document)?;
    out.write_all(b"\n")
}
