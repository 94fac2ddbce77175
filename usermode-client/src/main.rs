//! `kstack`: the user-mode client of the kstack driver. This file parses
//! the command line and hands each command to its module in `commands/`.

mod commands;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use kstack_client::error::{self, ClientError};

use commands::{
    clear, config, export, flamegraph, folded, modules, output, read, sample, save, selftest,
    status, threads, top, watch,
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
    Status(output::JsonArg),
    /// Show or change what is captured (no options: show).
    Config(config::ConfigArgs),
    /// Drain the ring once (or read a saved capture) and print the records.
    Read(read::ReadArgs),
    /// Follow new records until Ctrl-C (or --duration), then summarize.
    Watch(watch::WatchArgs),
    /// Discard every record in the ring.
    Clear,
    /// Capture this request's stack in the driver and show it.
    Selftest(output::RecordFormat),
    /// Capture other threads' stacks (--tid, or every thread of --pid),
    /// each in its thread through a kernel APC, and show them.
    Threads(threads::ThreadsArgs),
    /// Sample every thread of chosen processes N times a second, each
    /// through a kernel APC, into a capture file every command reads.
    Sample(sample::SampleArgs),
    /// Save records and the module list to a file for offline analysis.
    Save(save::SaveArgs),
    /// Unique stacks by stack id: count, sources, first and last seen;
    /// with --live, a refreshing full-screen view of the driver.
    Top(top::TopArgs),
    /// Folded stacks (`source;outermost;...;innermost count`) for
    /// flamegraph tools.
    Folded(folded::FoldedArgs),
    /// Draw a flamegraph SVG of the stacks.
    Flamegraph(flamegraph::FlamegraphArgs),
    /// The kernel modules frames are named after (base, size, name).
    Modules(modules::ModulesArgs),
    /// Write the records for another tool: a pprof profile (go tool pprof,
    /// Pyroscope, Grafana), a speedscope file, or Chrome trace events
    /// (the Perfetto UI, Chrome's tracing page).
    Export(export::ExportArgs),
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
        Command::Status(output) => status::run(output),
        Command::Config(args) => config::run(args),
        Command::Read(args) => read::run(args),
        Command::Watch(args) => watch::run(args),
        Command::Clear => clear::run(),
        Command::Selftest(format) => selftest::run(format),
        Command::Threads(args) => threads::run(args),
        Command::Sample(args) => sample::run(args),
        Command::Save(args) => save::run(args),
        Command::Top(args) => top::run(args),
        Command::Folded(args) => folded::run(args),
        Command::Flamegraph(args) => flamegraph::run(args),
        Command::Modules(args) => modules::run(args),
        Command::Export(args) => export::run(args),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
