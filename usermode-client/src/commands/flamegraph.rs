//! `kstack flamegraph`: a flamegraph SVG of the stacks.

use std::path::PathBuf;

use clap::Args;
use kstack_client::{error::ClientError, output::flamegraph};

use super::{
    input::{AnalysisInput, stack_table},
    output::write_file,
    symbols::SymbolsArg,
};

#[derive(Args)]
pub struct FlamegraphArgs {
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

pub fn run(args: &FlamegraphArgs) -> Result<(), ClientError> {
    let (table, symbolizer) = stack_table(&args.input, &args.symbols)?;
    if table.is_empty() {
        return Err(ClientError::NoRecords { to: "draw" });
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
