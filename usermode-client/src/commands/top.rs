//! `kstack top`: unique stacks by stack id, most frequent first.

use clap::Args;
use kstack_client::{
    error::ClientError,
    stack_table::{self, TopLimits},
};

use super::{
    input::{AnalysisInput, stack_table},
    output::JsonArg,
    symbols::SymbolsArg,
};

#[derive(Args)]
pub struct TopArgs {
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

pub fn run(args: &TopArgs) -> Result<(), ClientError> {
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
    Ok(())
}
