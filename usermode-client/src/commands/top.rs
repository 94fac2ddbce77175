//! `kstack top`: unique stacks by stack id, most frequent first; with
//! --live, a refreshing view of the driver (`top_live`).

use clap::Args;
use kstack_abi::SourceSet;
use kstack_client::{
    capture::stack_table::{self, TopLimits},
    error::ClientError,
    live_top::Filter,
    output::width::{Stream, fit, width},
};

use super::{
    config::parse_sources,
    input::{AnalysisInput, stack_table},
    output::JsonArg,
    symbols::SymbolsArg,
    top_live,
};

/// Stacks shown unless --limit says otherwise.
pub const STACKS: usize = 20;

#[derive(Args)]
#[command(mut_arg("interval", |arg| arg.help(
    "Milliseconds between reads when the ring is empty [default: 50]; with --live, between \
     refreshes of the view [default: 1000]"
)))]
pub struct TopArgs {
    #[command(flatten)]
    input: AnalysisInput,
    #[command(flatten)]
    json: JsonArg,
    /// Stacks to show (0: all).
    #[arg(long, default_value_t = STACKS)]
    limit: usize,
    /// Frames to show per stack, 0: all [default: 8; 3 with --live].
    #[arg(long)]
    frames: Option<usize>,
    #[command(flatten)]
    symbols: SymbolsArg,
    /// Follow the driver in a full-screen view refreshed every --interval
    /// (default 1000 ms): events per second and counts per stack and
    /// source, the ring's fill and drops. Keys: r/c/s sort by rate, count
    /// or source; f steps the source filter; space pauses; q, Esc or
    /// Ctrl-C quits. When stdout is not a terminal, prints the `top` text
    /// every interval instead.
    #[arg(long, conflicts_with_all = ["input", "json", "on_cpu", "off_cpu", "state"])]
    live: bool,
    /// With --live: count only these sources (comma-separated names, or
    /// `all`).
    #[arg(long, value_parser = parse_sources, requires = "live")]
    source: Option<SourceSet>,
    /// With --live: count only records of this process id.
    #[arg(long, requires = "live")]
    pid: Option<u32>,
}

/// A limit where 0 means no limit.
const fn all_when_zero(limit: usize) -> usize {
    if limit == 0 { usize::MAX } else { limit }
}

pub fn run(args: &TopArgs) -> Result<(), ClientError> {
    let frames = args
        .frames
        .unwrap_or(if args.live { top_live::FRAMES } else { 8 });
    let limits = TopLimits {
        stacks: all_when_zero(args.limit),
        frames: all_when_zero(frames),
    };
    if args.live {
        let filter = Filter {
            sources: args.source.unwrap_or(SourceSet::ALL),
            process_id: args.pid,
        };
        return top_live::run(args.input.follow(), &args.symbols, filter, limits);
    }
    let (table, symbolizer) = stack_table(&args.input, &args.symbols)?;
    if args.json.json {
        for line in stack_table::top_json(&table, &symbolizer, limits) {
            println!("{line}");
        }
    } else {
        let text = stack_table::top_text(&table, &symbolizer, limits);
        print!("{}", fit(&text, width(Stream::Stdout)));
    }
    Ok(())
}
