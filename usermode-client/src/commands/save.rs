//! `kstack save`: records and the module list to a file for offline
//! analysis.

use std::{
    fs::File,
    io,
    path::{Path, PathBuf},
    time::Duration,
};

use clap::Args;
use kstack_client::{
    capture::{
        stack_table,
        writer::{CaptureOutput, CaptureWriter},
    },
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
    #[command(flatten)]
    sync: SyncArgs,
}

/// How often a capture being written is made durable.
#[derive(Args)]
pub struct SyncArgs {
    /// Make what was written durable (on disk, surviving a crash of the
    /// machine) at least this often, in seconds; each read's records are
    /// written to the file before the next read whatever this says, so a
    /// killed kstack loses none of them.
    #[arg(long, value_name = "SECONDS", default_value_t = 1.0, value_parser = sync_seconds)]
    sync_every: f64,
}

impl SyncArgs {
    /// Between syncs.
    pub fn every(&self) -> Duration {
        Duration::from_secs_f64(self.sync_every)
    }

    /// The summary's words for the syncs made.
    pub fn text(&self, syncs: u64) -> String {
        format!(
            "made durable {} (at most every {} s)",
            stack_table::counted(syncs, "time"),
            self.sync_every
        )
    }
}

fn sync_seconds(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(seconds) if (0.0..=3600.0).contains(&seconds) => Ok(seconds),
        _ => Err(format!(
            "{text:?} is not a number of seconds from 0 (after every read) to 3600"
        )),
    }
}

pub fn run(args: &SaveArgs) -> Result<(), ClientError> {
    let mut device = open_device()?;
    let path = args.file.as_path();
    let (mut writer, modules, processes) =
        start_capture(&mut device, path, args.force.force, &args.sync)?;
    let writing = |error: io::Error| ClientError::file(path, "writing", &error);
    let followed = session::follow(
        &mut device,
        args.follow.drain_or_follow(),
        &stop_flag(),
        |batch| append_batch(&mut writer, batch).map_err(writing),
    );
    let saved = writer.trace_records();
    let saved_modules = writer.module_records();
    let (summary, syncs) = finish_capture(writer, path, followed, saved, "save")?;
    kstack_client::eprintln_fitted!(
        "kstack save: {}, {}, {} and the user-mode modules of {} processes written to {}, {}; {}",
        stack_table::counted(saved, "record"),
        stack_table::counted(saved_modules, "module record"),
        stack_table::counted(modules.modules().len() as u64, "module"),
        processes.processes().count(),
        path.display(),
        args.sync.text(syncs),
        follow_summary_text(&summary)
    );
    Ok(())
}

/// A capture at `path` (replaced only with `force`), begun with the
/// kernel's module list and the running processes' modules, each image
/// with its identity where its file could be read, made durable as `sync`
/// says; returns the lists too.
pub fn start_capture(
    device: &mut impl Transport,
    path: &Path,
    force: bool,
    sync: &SyncArgs,
) -> Result<(CaptureWriter<File>, ModuleMap, ProcessModules), ClientError> {
    let modules = identified_live_modules(device)?;
    let mut processes = process_modules::list_running();
    processes.identify_images(|path| identity::of_file(Path::new(path)).ok());
    let writer = CaptureWriter::with_processes(create_output(path, force)?, &modules, &processes)
        .map_err(|error| ClientError::file(path, "writing", &error))
        .inspect_err(|_| discard(path))?
        .syncing_every(sync.every());
    Ok((writer, modules, processes))
}

/// Writes what one read returned to a capture, before the next read: its
/// module records, then its trace records. The identity of each image a
/// module record loaded is read now, once per image, while its file is
/// surely there (a DLL unpacked to a temporary folder may be gone by the
/// end).
pub fn append_batch<W: CaptureOutput>(
    writer: &mut CaptureWriter<W>,
    batch: &Batch,
) -> io::Result<()> {
    for change in &batch.modules {
        writer.append_module(change)?;
        if let Some((module, path)) = change.module().zip(change.image_path())
            && !writer.knows_loaded_image(&module)
            && let Ok(identity) = identity::of_file(Path::new(&path))
        {
            writer.note_loaded_identity(module, identity);
        }
    }
    for record in &batch.records {
        writer.append(record)?;
    }
    writer.end_batch()
}

/// Finishes the capture at `path` that reads filled, `followed` being how
/// they ended; returns that and the syncs made. A driver error ends the
/// capture but keeps what was read: the file is finished and valid, and
/// `kstack <command>` says so with the `saved` records' count. A write
/// error keeps the file too: it holds every batch written before the
/// error, whole, and reads as cut short.
pub fn finish_capture<T>(
    writer: CaptureWriter<File>,
    path: &Path,
    followed: Result<T, ClientError>,
    saved: u64,
    command: &str,
) -> Result<(T, u64), ClientError> {
    let kept = |what: &str| {
        kstack_client::eprintln_fitted!(
            "kstack {command}: {path} keeps the records {what}; it reads as cut short",
            path = path.display()
        );
    };
    if let Err(error @ ClientError::File { .. }) = followed {
        kept("written before the error");
        return Err(error);
    }
    let finished = writer
        .finish()
        .map_err(|error| ClientError::file(path, "writing", &error))
        .inspect_err(|_| kept("written before the error"))?;
    followed
        .inspect_err(|_| {
            kstack_client::eprintln_fitted!(
                "kstack {command}: {} read before the error are saved in {}",
                stack_table::counted(saved, "record"),
                path.display()
            );
        })
        .map(|outcome| (outcome, finished.syncs))
}
