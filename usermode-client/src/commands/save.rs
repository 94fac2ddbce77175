//! `kstack save`: records and the module list to a file for offline
//! analysis.

use std::{
    fs::File,
    io::{self, BufWriter, Write},
    path::{Path, PathBuf},
};

use clap::Args;
use kstack_client::{
    capture::{file::CaptureWriter, stack_table},
    device::{
        session::{self, Batch},
        transport::Transport,
    },
    error::ClientError,
    naming::{
        identity,
        modules::ModuleMap,
        process_modules::{self, ProcessModules},
    },
};

use super::{
    live::{FollowArgs, follow_summary_text, identified_live_modules, open_device, stop_flag},
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
    let path = args.file.as_path();
    let (mut writer, modules, processes) = start_capture(&mut device, path, args.force.force)?;
    let writing = |error: io::Error| ClientError::file(path, "writing", &error);
    let followed = session::follow(
        &mut device,
        args.follow.drain_or_follow(),
        &stop_flag(),
        |batch| append_batch(&mut writer, batch).map_err(writing),
    );
    let saved = writer.trace_records();
    let saved_modules = writer.module_records();
    let summary = finish_capture(writer, path, followed, saved, "save")?;
    kstack_client::eprintln_fitted!(
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

/// A capture at `path` (replaced only with `force`), begun with the
/// kernel's module list and the running processes' modules, each image
/// with its identity where its file could be read; returns them too.
pub fn start_capture(
    device: &mut impl Transport,
    path: &Path,
    force: bool,
) -> Result<(CaptureWriter<BufWriter<File>>, ModuleMap, ProcessModules), ClientError> {
    let modules = identified_live_modules(device)?;
    let mut processes = process_modules::list_running();
    processes.identify_images(|path| identity::of_file(Path::new(path)).ok());
    let writer = CaptureWriter::with_processes(create_output(path, force)?, &modules, &processes)
        .map_err(|error| ClientError::file(path, "writing", &error))
        .inspect_err(|_| discard(path))?;
    Ok((writer, modules, processes))
}

/// Appends what one read returned to a capture: its module records, then
/// its trace records. The identity of each image a module record loaded is
/// read now, once per image, while its file is surely there (a DLL
/// unpacked to a temporary folder may be gone by the end).
pub fn append_batch<W: Write>(writer: &mut CaptureWriter<W>, batch: &Batch) -> io::Result<()> {
    for change in &batch.modules {
        writer.append_module(change)?;
        if let Some((module, path)) = change.module().zip(change.image_path())
            && !writer.knows_loaded_image(&module)
            && let Ok(identity) = identity::of_file(Path::new(&path))
        {
            writer.note_loaded_identity(module, identity);
        }
    }
    batch
        .records
        .iter()
        .try_for_each(|record| writer.append(record))
}

/// Finishes the capture at `path` that reads filled, `followed` being how
/// they ended. A driver error ends the capture but keeps what was read:
/// the file is finished and valid, and `kstack <command>` says so with the
/// `saved` records' count. A write error leaves nothing trustworthy: the
/// file is removed.
pub fn finish_capture<W: Write, T>(
    writer: CaptureWriter<W>,
    path: &Path,
    followed: Result<T, ClientError>,
    saved: u64,
    command: &str,
) -> Result<T, ClientError> {
    writer
        .finish()
        .map_err(|error| ClientError::file(path, "writing", &error))
        .inspect_err(|_| discard(path))?;
    followed.inspect_err(|error| {
        if matches!(error, ClientError::File { .. }) {
            discard(path);
        } else {
            kstack_client::eprintln_fitted!(
                "kstack {command}: {} read before the error are saved in {}",
                stack_table::counted(saved, "record"),
                path.display()
            );
        }
    })
}
