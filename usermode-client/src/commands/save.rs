//! `kstack save`: records and the module list to a file for offline
//! analysis.

use std::{
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
    capture_parts::{PartArgs, Parts},
    live::{FollowArgs, follow_summary_text, identified_live_modules, open_device, stop_flag},
    output::{CaptureTarget, ForceArg, discard, open_target, shown},
};

#[derive(Args)]
#[command(group = clap::ArgGroup::new("capture").required(true).args(["file", "output"]))]
pub struct SaveArgs {
    /// The capture file to write (`-`: standard output, which must not be
    /// a terminal).
    file: Option<PathBuf>,
    /// The same, as `sample`, `folded`, `flamegraph` and `export` take it.
    #[arg(
        short = 'o',
        long = "output",
        value_name = "FILE",
        conflicts_with = "file"
    )]
    output: Option<PathBuf>,
    #[command(flatten)]
    force: ForceArg,
    /// Follow for this long (or until Ctrl-C) instead of draining once.
    #[command(flatten)]
    follow: FollowArgs,
    #[command(flatten)]
    sync: SyncArgs,
    #[command(flatten)]
    parts: PartArgs,
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
    let path = args
        .file
        .as_deref()
        .or(args.output.as_deref())
        .expect("clap requires FILE or -o FILE");
    let mut parts = args.parts.parts(path, args.force.force)?;
    let first = parts
        .as_ref()
        .map_or_else(|| path.to_path_buf(), Parts::current);
    let force = args.force.force;
    let (mut writer, modules, processes) = start_capture(&mut device, &first, force, &args.sync)?;
    let followed = session::follow(
        &mut device,
        args.follow.drain_or_follow(),
        &stop_flag(),
        |batch| {
            let current = parts
                .as_ref()
                .map_or_else(|| path.to_path_buf(), Parts::current);
            append_batch(&mut writer, batch)
                .map_err(|error| ClientError::file(&current, "writing", &error))?;
            parts.as_mut().map_or(Ok(()), |parts| {
                parts.after_batch(&mut writer, batch, (&modules, &processes), force)
            })
        },
    );
    let earlier = parts.as_ref().map_or(0, Parts::records_before);
    let saved = earlier + writer.trace_records();
    let saved_modules = parts
        .as_ref()
        .map_or_else(|| writer.module_records(), Parts::module_records);
    let last = parts
        .as_ref()
        .map_or_else(|| path.to_path_buf(), Parts::current);
    let (summary, syncs) = finish_capture(writer, &last, followed, saved, "save")?;
    let syncs = syncs + parts.as_ref().map_or(0, Parts::syncs_before);
    let written_to = parts.as_ref().map_or_else(|| shown(path), Parts::text);
    kstack_client::eprintln_fitted!(
        "kstack save: {}, {}, {} and the user-mode modules of {} processes written to {}, {}; {}",
        stack_table::counted(saved, "record"),
        stack_table::counted(saved_modules, "module record"),
        stack_table::counted(modules.modules().len() as u64, "module"),
        processes.processes().count(),
        written_to,
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
) -> Result<(CaptureWriter<CaptureTarget>, ModuleMap, ProcessModules), ClientError> {
    let modules = identified_live_modules(device)?;
    let mut processes = process_modules::list_running();
    processes.identify_images(|path| identity::of_file(Path::new(path)).ok());
    let writer = CaptureWriter::with_processes(open_target(path, force)?, &modules, &processes)
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
/// error keeps the file too: it holds every block written before the
/// error, and is finished when its end marker still fits (the error was
/// another file's, such as the next part's); else it reads as cut short.
pub fn finish_capture<T>(
    writer: CaptureWriter<CaptureTarget>,
    path: &Path,
    followed: Result<T, ClientError>,
    saved: u64,
    command: &str,
) -> Result<(T, u64), ClientError> {
    let kept = |what: &str| {
        kstack_client::eprintln_fitted!(
            "kstack {command}: {path} keeps the records {what}; it reads as cut short",
            path = shown(path)
        );
    };
    if let Err(error @ ClientError::File { .. }) = followed {
        // The end marker may still fit (the error may have been another
        // file's: the next part's); if it does not, the file reads as cut.
        if writer.finish().is_err() {
            kept("written before the error");
        }
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
                shown(path)
            );
        })
        .map(|outcome| (outcome, finished.syncs))
}
