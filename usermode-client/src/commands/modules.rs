//! `kstack modules`: the kernel modules frames are named after, or with
//! `--processes` the user-mode modules of every running process.

use std::{
    io::{self, Write},
    path::PathBuf,
};

use clap::Args;
use kstack_abi::{ModuleEvent, ModuleFlags};
use kstack_client::{
    capture::stack_table::counted,
    clock::system_time_text,
    error::ClientError,
    naming::{
        identity::ImageIdentity,
        modules::{Module, ModuleMap},
        process_modules::{self, ModuleChange, ProcessModules},
    },
    output::width::{Stream, fit, width},
};
use serde_json::json;

use super::{
    input::saved_module_lists,
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
    /// modules could not be read; with --input, those the capture saved,
    /// and the driver's module records (image loads, process exits) in it.
    /// Needs no driver; live, Windows only.
    #[arg(long)]
    processes: bool,
    #[command(flatten)]
    json: JsonArg,
}

pub fn run(args: &ModulesArgs) -> Result<(), ClientError> {
    let mut listing = Vec::new();
    let out = &mut listing;
    let _ = match (&args.input, args.processes) {
        (Some(path), processes) => {
            let (modules, process_modules) = saved_module_lists(path)?;
            if processes {
                if holds_nothing(&process_modules) {
                    return Err(ClientError::NoProcessModules {
                        path: path.display().to_string(),
                    });
                }
                write_processes(out, &process_modules, args.json.json)
            } else {
                write_modules(out, &modules, None, args.json.json)
            }
        }
        (None, true) => {
            if cfg!(not(windows)) {
                return Err(ClientError::NeedsWindows);
            }
            write_processes(out, &process_modules::list_running(), args.json.json)
        }
        (None, false) => {
            let modules = live_modules(&mut open_device()?)?;
            write_modules(out, &modules, None, args.json.json)
        }
    };
    let listing = String::from_utf8_lossy(&listing);
    let shown = if args.json.json {
        listing
    } else {
        fit(&listing, width(Stream::Stdout)).into()
    };
    // A closed pipe (`| head`) ends the listing, not in an error.
    let _ = io::stdout().lock().write_all(shown.as_bytes());
    Ok(())
}

/// Whether a capture's per-process listing says nothing: no process
/// listed, none unreadable, no module record.
fn holds_nothing(processes: &ProcessModules) -> bool {
    processes.processes().next().is_none()
        && processes.changes().is_empty()
        && processes.unreadable().is_empty()
}

/// One line per module; `process_id` says whose, for user-mode modules.
fn write_modules(
    out: &mut impl Write,
    modules: &ModuleMap,
    process_id: Option<u32>,
    json: bool,
) -> io::Result<()> {
    for module in modules.modules() {
        let identity = modules.identity(module);
        if json {
            writeln!(out, "{}", module_json(module, identity, process_id))?;
        } else {
            let owner = process_id.map_or_else(String::new, |id| format!("pid {id:>6}  "));
            let identity = identity.map_or_else(String::new, |identity| format!("  {identity}"));
            writeln!(
                out,
                "{owner}{:#018x} {:>#10x} {}{identity}",
                module.base, module.size, module.name
            )?;
        }
    }
    Ok(())
}

fn module_json(
    module: &Module,
    identity: Option<&ImageIdentity>,
    process_id: Option<u32>,
) -> serde_json::Value {
    let mut value = json!({
        "base": format!("{:#x}", module.base),
        "size": module.size,
        "name": module.name,
        "identity": identity.map(identity_json),
    });
    if let Some(id) = process_id {
        value["process_id"] = json!(id);
    }
    value
}

/// Every listed process's modules, the driver's module records (a saved
/// capture's), then the processes that could not be read (text: a summary
/// line; JSON: one object each, with `unreadable`, the Win32 error).
fn write_processes(out: &mut impl Write, processes: &ProcessModules, json: bool) -> io::Result<()> {
    let mut listed = 0;
    for (process_id, modules) in processes.processes() {
        write_modules(out, modules, Some(process_id), json)?;
        listed += 1;
    }
    for change in processes.changes() {
        let module = change.module();
        let identity = module
            .as_ref()
            .and_then(|module| processes.identity(module));
        if json {
            writeln!(out, "{}", change_json(change, identity))?;
        } else {
            writeln!(out, "{}", change_text(change, identity))?;
        }
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
        "{listed} {} listed; {} could not be read{}{}; {}",
        if listed == 1 { "process" } else { "processes" },
        unreadable.len(),
        if gaps.is_empty() { "" } else { ": " },
        gaps.join(", "),
        counted(processes.changes().len() as u64, "module record")
    )
}

/// An image's identity as a JSON object.
fn identity_json(identity: &ImageIdentity) -> serde_json::Value {
    json!({
        "timestamp": format!("{:#010x}", identity.timestamp),
        "size_of_image": identity.size_of_image,
        "pdb": identity.debug.as_ref().map(|debug| json!({
            "name": debug.pdb_name,
            "guid": debug.guid_text(),
            "age": debug.age,
            "key": debug.symbol_server_key(),
        })),
    })
}

/// One module record as a line: when, whose, what (and the loaded image's
/// identity, when the capture carries it).
fn change_text(change: &ModuleChange, identity: Option<&ImageIdentity>) -> String {
    let header = &change.header;
    let time = system_time_text(header.timestamp).unwrap_or_else(|| "no time".to_owned());
    let what = match header.event {
        ModuleEvent::ImageLoad => format!(
            "loaded {}{} at {:#x} ({:#x} bytes)",
            if header.flags.contains(ModuleFlags::PATH_TRUNCATED) {
                "..."
            } else {
                ""
            },
            change.path_text(),
            header.image_base,
            header.image_size
        ),
        ModuleEvent::ProcessExit => "exited".to_owned(),
    };
    let key = if header.process_key == 0 {
        "no process key".to_owned()
    } else {
        format!("process key {}", header.process_key)
    };
    let identity = identity.map_or_else(String::new, |identity| format!("; {identity}"));
    format!(
        "module record {time} pid {} {what}, {key} (shard {} #{}){identity}",
        header.process_id, header.shard, header.sequence
    )
}

/// One module record as a JSON object.
fn change_json(change: &ModuleChange, identity: Option<&ImageIdentity>) -> serde_json::Value {
    let header = &change.header;
    json!({
        "event": match header.event {
            ModuleEvent::ImageLoad => "image_load",
            ModuleEvent::ProcessExit => "process_exit",
        },
        "time": system_time_text(header.timestamp),
        "system_time_100ns": header.timestamp,
        "process_id": header.process_id,
        "process_key": header.process_key,
        "thread_id": header.thread_id,
        "base": format!("{:#x}", header.image_base),
        "size": header.image_size,
        "path": change.path_text(),
        "path_truncated": header.flags.contains(ModuleFlags::PATH_TRUNCATED),
        "shard": header.shard,
        "sequence": header.sequence,
        "identity": identity.map(identity_json),
    })
}

#[cfg(test)]
mod tests {
    use kstack_client::naming::process_modules::Unreadable;

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
        let header = kstack_abi::ModuleHeader {
            sequence: 7,
            timestamp: 134_083_512_000_100_000,
            process_id: 100,
            thread_id: 9,
            processor: 1,
            shard: 1,
            event: ModuleEvent::ImageLoad,
            flags: ModuleFlags::PATH_TRUNCATED,
            image_base: 0x7FFA_0000_0000,
            image_size: 0x2000,
            process_key: 0,
        };
        let late = ModuleChange {
            header,
            path: r"\x\late.dll".encode_utf16().collect(),
        };
        processes.set_loaded_identity(
            &late.module().unwrap(),
            ImageIdentity {
                timestamp: 0x1234,
                size_of_image: 0x2000,
                debug: None,
            },
        );
        processes.note(late);
        processes.note(ModuleChange {
            header: kstack_abi::ModuleHeader {
                sequence: 8,
                timestamp: header.timestamp + 10_000,
                event: ModuleEvent::ProcessExit,
                flags: ModuleFlags::NONE,
                image_base: 0,
                image_size: 0,
                process_key: 42,
                ..header
            },
            path: Vec::new(),
        });
        processes
    }

    #[test]
    fn processes_are_listed_with_their_modules_and_gaps() {
        let mut text = Vec::new();
        write_processes(&mut text, &sample(), false).unwrap();
        assert_eq!(
            String::from_utf8(text).unwrap(),
            "pid    100  0x00007ff600000000    0x10000 kstack.exe\n\
             module record 2025-11-23T06:00:00.01Z pid 100 loaded ...\\x\\late.dll at \
             0x7ffa00000000 (0x2000 bytes), no process key (shard 1 #7); timestamp 0x00001234, \
             size 0x2000, no pdb\n\
             module record 2025-11-23T06:00:00.011Z pid 100 exited, process key 42 (shard 1 #8)\n\
             1 process listed; 1 could not be read: 4 System (error 5); 2 module records\n"
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
                json!({"base": "0x7ff600000000", "size": 0x1_0000, "name": "kstack.exe", "process_id": 100,
                       "identity": null}),
                json!({"event": "image_load", "time": "2025-11-23T06:00:00.01Z",
                       "system_time_100ns": 134_083_512_000_100_000_u64, "process_id": 100,
                       "process_key": 0, "thread_id": 9, "base": "0x7ffa00000000", "size": 0x2000,
                       "path": r"\x\late.dll", "path_truncated": true, "shard": 1, "sequence": 7,
                       "identity": {"timestamp": "0x00001234", "size_of_image": 0x2000, "pdb": null}}),
                json!({"event": "process_exit", "time": "2025-11-23T06:00:00.011Z",
                       "system_time_100ns": 134_083_512_000_110_000_u64, "process_id": 100,
                       "process_key": 42, "thread_id": 9, "base": "0x0", "size": 0,
                       "path": "", "path_truncated": false, "shard": 1, "sequence": 8,
                       "identity": null}),
                json!({"process_id": 4, "name": "System", "unreadable": 5}),
            ]
        );
    }
}
