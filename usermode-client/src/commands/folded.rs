//! `kstack folded`: folded stacks for flamegraph tools.

use clap::Args;
use kstack_client::error::ClientError;

use super::{
    input::{AnalysisInput, stack_table},
    output::OutputArgs,
    symbols::SymbolsArg,
};

#[derive(Args)]
pub struct FoldedArgs {
    #[command(flatten)]
    input: AnalysisInput,
    #[command(flatten)]
    output: OutputArgs,
    #[command(flatten)]
    symbols: SymbolsArg,
}

pub fn run(args: &FoldedArgs) -> Result<(), ClientError> {
    args.output.check(args.input.paths())?;
    let (table, symbolizer) = stack_table(&args.input, &args.symbols)?;
    let mut text = table.folded(&symbolizer).join("\n");
    text.push('\n');
    args.output.write(|out| out.write_all(text.as_bytes()))
}
