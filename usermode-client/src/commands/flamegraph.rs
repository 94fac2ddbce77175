//! `kstack flamegraph`: a flamegraph SVG of the stacks.

use clap::Args;
use kstack_client::{
    capture::state_filter::StateFilter,
    error::ClientError,
    output::flamegraph::{self, Drawn},
};

use super::{
    input::{AnalysisInput, stack_table},
    output::OutputArgs,
    symbols::SymbolsArg,
};

#[derive(Args)]
#[command(mut_arg("output", |arg| arg.required(true).help("The SVG file to write")))]
pub struct FlamegraphArgs {
    #[command(flatten)]
    input: AnalysisInput,
    #[command(flatten)]
    output: OutputArgs,
    /// The title drawn above the graph.
    #[arg(long, default_value = "kstack: kernel stacks")]
    title: String,
    #[command(flatten)]
    symbols: SymbolsArg,
}

pub fn run(args: &FlamegraphArgs) -> Result<(), ClientError> {
    args.output.check(args.input.paths())?;
    let (table, symbolizer) = stack_table(&args.input, &args.symbols)?;
    if table.is_empty() {
        return Err(ClientError::NoRecords { to: "draw" });
    }
    let folded = table.folded(&symbolizer);
    let subtitle = table.summary();
    let drawn = match args.input.state_filter() {
        Some(StateFilter::OffCpu) => Drawn::OffCpu,
        Some(StateFilter::State(state)) if !state.on_cpu() => Drawn::OffCpu,
        _ => Drawn::Stacks,
    };
    args.output.write(|out| {
        flamegraph::write_svg(&folded, &format!("{} ({subtitle})", args.title), drawn, out)
    })?;
    kstack_client::eprintln_fitted!("kstack flamegraph: {subtitle} drawn to {}", args.output);
    Ok(())
}
