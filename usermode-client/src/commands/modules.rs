//! `kstack modules`: the kernel modules frames are named after.

use std::{
    io::{self, Write},
    path::PathBuf,
};

use clap::Args;
use kstack_client::error::ClientError;

use super::{
    input::{parse_capture, read_file},
    live::{live_modules, open_device},
    output::JsonArg,
};

#[derive(Args)]
pub struct ModulesArgs {
    /// Show the module list saved in this capture instead.
    #[arg(long, value_name = "FILE")]
    input: Option<PathBuf>,
    #[command(flatten)]
    json: JsonArg,
}

pub fn run(args: &ModulesArgs) -> Result<(), ClientError> {
    let modules = match &args.input {
        Some(path) => parse_capture(path, &read_file(path)?)?.modules,
        None => live_modules(&mut open_device()?)?,
    };
    let mut out = io::stdout().lock();
    for module in modules.modules() {
        let written = if args.json.json {
            writeln!(
                out,
                "{}",
                serde_json::json!({
                    "base": format!("{:#x}", module.base),
                    "size": module.size,
                    "name": module.name,
                })
            )
        } else {
            writeln!(
                out,
                "{:#018x} {:>10x} {}",
                module.base, module.size, module.name
            )
        };
        if written.is_err() {
            break;
        }
    }
    Ok(())
}
