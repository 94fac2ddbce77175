//! `kstack save`: records and the module list to a file for offline
//! analysis.

use std::{io, path::PathBuf};

use clap::Args;
use kstack_client::{
    capture::{file::CaptureWriter, stack_table},
    device::session,
    error::ClientError,
    naming::process_modules,
};

use super::{
    live::{FollowArgs, follow_summary_text, live_modules, open_device, stop_flag},
    output::{ForceArg, create_output, discard},
};

#[derive(Args)]
pub struct SaveArgs {
    /// The capture file to write.
    file: PathBuf,
    #[command(flatten)]
    force: ForceArg,
    /// Follow for this long (or until Ctrl-C) instead of draining once.
    #[command(flatten)]
    follow: FollowArgs,
}

pub fn run(args: &SaveArgs) -> Result<(), ClientError> {
    let mut device = open_device()?;
    let modules = live_modules(&mut device)?;
    let processes = process_modules::list_running();
    let path = args.file.as_path();
    let writing = |error: io::Error| ClientError::file(path, "writing", &error);
    let mut writer =
        CaptureWriter::with_processes(create_output(path, args.force.force)?, &modules, &processes)
            .map_err(writing)
            .inspect_err(|_| discard(path))?;
    let followed = session::follow(
        &mut device,
        args.follow.drain_or_follow(),
        &stop_flag(),
        |batch| {
            batch
                .modules
                .iter()
                .try_for_each(|change| writer.append_module(change))
                .and_then(|()| {
                    batch
                        .records
                        .iter()
                        .try_for_each(|record| writer.append(record))
                })
                .map_err(writing)
        },
    );
    let saved = writer.records() - writer.module_records();
    let saved_modules = writer.module_records();
    // A driver error ends the capture but keeps what was read: the file is
    // finished and valid. A write error leaves nothing trustworthy.
    writer
        .finish()
        .map_err(writing)
        .inspect_err(|_| discard(path))?;
    let summary = followed.inspect_err(|error| {
        if matches!(error, ClientError::File { .. }) {
            discard(path);
        } else {
            eprintln!(
                "kstack save: {saved} records read before the error are saved in {}",
                path.display()
            );
        }
    })?;
    eprintln!(
        "kstack save: {}, {}, {} and the user-mode modules of {} processes written to {}; {}",
        stack_table::counted(saved, "record"),
        stack_table::counted(saved_modules, "module record"),
        stack_table::counted(modules.modules().len() as u64, "module"),
        processes.processes().count(),
        path.display(),
        follow_summary_text(&summary)
    );
    Ok(())
}
