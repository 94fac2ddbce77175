//! `kstack folded`: folded stacks for flamegraph tools.

use std::{io::Write, path::PathBuf};

use clap::Args;
use kstack_client::error::ClientError;

use super::{
    input::{AnalysisInput, stack_table},
    output::write_file,
    symbols::SymbolsArg,
};

#[derive(Args)]
pub struct FoldedArgs {
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

pub fn run(args: &FoldedArgs) -> Result<(), ClientError> {
    let (table, symbolizer) = stack_table(&args.input, &args.symbols)?;
    let mut text = table.folded(&symbolizer).join("\n");
    text.push('\n');
    match &args.output {
        Some(path) => write_file(path, args.force, |out| out.write_all(text.as_bytes()))?,
        None => print!("{text}"),
    }
    Ok(())
}
