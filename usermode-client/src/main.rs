//! `kstack`: the user-mode client of the kstack driver. This file parses
//! the command line and hands each command to its module in `commands/`.

mod commands;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use kstack_client::error::{self, ClientError};

use commands::{
    clear, config, export, flamegraph, folded, input, modules, output, read, sample, save,
    selftest, status, threads, top, verify, watch,
};

/// Capture and inspect kernel stack traces recorded by kstack.sys.
#[derive(Parser)]
#[command(name = "kstack", version, about)]
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
    /// Check a saved capture through to its end: what it holds, whether
    /// it was finished, and what damage or a cut cost (exit code 10 when
    /// it is not whole).
    Verify(verify::VerifyArgs),
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
        Ok(()) if input::INCOMPLETE_CAPTURE.load(std::sync::atomic::Ordering::Relaxed) => {
            ExitCode::from(error::exit_code::INCOMPLETE_CAPTURE)
        }
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            kstack_client::eprintln_fitted!("kstack: {error}");
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
        Command::Verify(args) => verify::run(args),
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

    #[test]
    fn the_version_names_kstack() {
        use clap::CommandFactory;
        let version = Cli::command().render_version();
        assert_eq!(version, format!("kstack {}\n", env!("CARGO_PKG_VERSION")));
    }

    /// Every `.\kstack.exe` command line of the README's and the docs'
    /// PowerShell blocks, as words: up to a comment, a pipe or a closing
    /// parenthesis, quotes dropped, a PowerShell variable standing for 4.
    fn documented_command_lines() -> Vec<(String, Vec<String>)> {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut files = vec![root.join("README.md")];
        let mut docs: Vec<_> = std::fs::read_dir(root.join("docs"))
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
            .collect();
        docs.sort();
        files.extend(docs);
        let mut lines = Vec::new();
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            let mut in_powershell = false;
            for (number, line) in text.lines().enumerate() {
                let fence = line.trim_start();
                if fence.starts_with("```") {
                    in_powershell = fence == "```powershell";
                    continue;
                }
                let Some((_, command)) = line.split_once(".\\kstack.exe ") else {
                    continue;
                };
                if !in_powershell {
                    continue;
                }
                let command = command
                    .split(" #")
                    .next()
                    .and_then(|command| command.split(" |").next())
                    .and_then(|command| command.split(')').next())
                    .unwrap_or_default();
                let words = command
                    .split_whitespace()
                    .map(|word| {
                        let word = word.trim_matches('"');
                        match word.find('$') {
                            Some(start) => {
                                let end = word[start + 1..]
                                    .find(|c: char| !(c.is_alphanumeric() || c == '.'))
                                    .map_or(word.len(), |end| start + 1 + end);
                                let end = if word[..end].ends_with('.') {
                                    end - 1
                                } else {
                                    end
                                };
                                format!("{}4{}", &word[..start], &word[end..])
                            }
                            None => word.to_owned(),
                        }
                    })
                    .collect();
                lines.push((format!("{}:{}", file.display(), number + 1), words));
            }
        }
        lines
    }

    #[test]
    fn every_documented_command_line_parses() {
        let lines = documented_command_lines();
        assert!(
            lines.len() >= 30,
            "only {} command lines found",
            lines.len()
        );
        assert!(
            lines
                .iter()
                .any(|(_, words)| words.first().is_some_and(|w| w == "sample")),
            "the sampling step was not found"
        );
        for (place, words) in &lines {
            let parsed = Cli::try_parse_from(
                std::iter::once("kstack").chain(words.iter().map(String::as_str)),
            );
            assert!(
                parsed.is_ok(),
                "{place}: kstack {}: {}",
                words.join(" "),
                parsed.err().unwrap()
            );
        }
    }
}
