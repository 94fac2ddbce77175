//! `kstack modules`: the kernel modules frames are named after, or with
//! `--processes` the user-mode modules of every running process.

use std::{
    io::{self, Write},
    path::PathBuf,
};

use clap::Args;
use kstack_client::{
    error::ClientError,
    modules::{Module, ModuleMap},
    process_modules::{self, ProcessModules},
};
use serde_json::json;

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
    /// List the user-mode modules of every running process instead (what
    /// live commands name user frames after), and the processes whose
    /// modules could not be read; with --input, those the capture saved.
    /// Needs no driver; live, Windows only.
    #[arg(long)]
    processes: bool,
    #[command(flatten)]
    json: JsonArg,
}

pub fn run(args: &ModulesArgs) -> Result<(), ClientError> {
    let mut out = io::stdout().lock();
    // A closed pipe (`| head`) ends the listing, not in an error.
    let _ = match (&args.input, args.processes) {
        (Some(path), processes) => {
            let bytes = read_file(path)?;
            let capture = parse_capture(path, &bytes)?;
            if processes {
                write_processes(&mut out, &capture.processes, args.json.json)
            } else {
                write_modules(&mut out, &capture.modules, None, args.json.json)
            }
        }
        (None, true) => write_processes(&mut out, &process_modules::list_running(), args.json.json),
        (None, false) => {
            let modules = live_modules(&mut open_device()?)?;
            write_modules(&mut out, &modules, None, args.json.json)
        }
    };
    Ok(())
}

/// One line per module; `process_id` says whose, for user-mode modules.
fn write_modules(
    out: &mut impl Write,
    modules: &ModuleMap,
    process_id: Option<u32>,
    json: bool,
) -> io::Result<()> {
    for module in modules.modules() {
        if json {
            writeln!(out, "{}", module_json(module, process_id))?;
        } else {
            let owner = process_id.map_or_else(String::new, |id| format!("pid {id:>6}  "));
            writeln!(
                out,
                "{owner}{:#018x} {:>10x} {}",
                module.base, module.size, module.name
            )?;
        }
    }
    Ok(())
}

fn module_json(module: &Module, process_id: Option<u32>) -> serde_json::Value {
    let mut value = json!({
        "base": format!("{:#x}", module.base),
        "size": module.size,
        "name": module.name,
    });
    if let Some(id) = process_id {
        value["process_id"] = json!(id);
    }
    value
}

/// Every listed process's modules, then the processes that could not be
/// read (text: a summary line; JSON: one object each, with `unreadable`,
/// the Win32 error).
fn write_processes(out: &mut impl Write, processes: &ProcessModules, json: bool) -> io::Result<()> {
    let mut listed = 0;
    for (process_id, modules) in processes.processes() {
        write_modules(out, modules, Some(process_id), json)?;
        listed += 1;
    }
    let unreadable = processes.unreadable();
    if json {
        for process in unreadable {
            writeln!(
                out,
                "{}",
                json!({
                    "process_id": process.process_id,
                    "name": process.name,
                    "unreadable": process.error,
                })
            )?;
        }
        return Ok(());
    }
    let gaps: Vec<String> = unreadable
        .iter()
        .map(|process| {
            format!(
                "{} {} (error {})",
                process.process_id, process.name, process.error
            )
        })
        .collect();
    writeln!(
        out,
        "{listed} {} listed; {} could not be read{}{}",
        if listed == 1 { "process" } else { "processes" },
        unreadable.len(),
        if gaps.is_empty() { "" } else { ": " },
        gaps.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use kstack_client::process_modules::Unreadable;

    use super::*;

    fn sample() -> ProcessModules {
        let mut processes = ProcessModules::default();
        processes.add(
            100,
            [Module {
                base: 0x7FF6_0000_0000,
                size: 0x1_0000,
                name: "kstack.exe".to_owned(),
            }],
        );
        processes.add_unreadable(Unreadable {
            process_id: 4,
            name: "System".to_owned(),
            error: 5,
        });
        processes
    }

    #[test]
    fn processes_are_listed_with_their_modules_and_gaps() {
        let mut text = Vec::new();
        write_processes(&mut text, &sample(), false).unwrap();
        assert_eq!(
            String::from_utf8(text).unwrap(),
            "pid    100  0x00007ff600000000      10000 kstack.exe\n\
             1 process listed; 1 could not be read: 4 System (error 5)\n"
        );
        let mut lines = Vec::new();
        write_processes(&mut lines, &sample(), true).unwrap();
        let values: Vec<serde_json::Value> = String::from_utf8(lines)
            .unwrap()
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
        assert_eq!(
            values,
            [
                json!({"base": "0x7ff600000000", "size": 0x1_0000, "name": "kstack.exe", "process_id": 100}),
                json!({"process_id": 4, "name": "System", "unreadable": 5}),
            ]
        );
    }
}
