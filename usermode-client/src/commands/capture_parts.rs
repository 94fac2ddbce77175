//! `save --max-size SIZE [--rotate N]`: a long capture in parts of bounded
//! size, and with `--rotate` only the newest N of them kept, as Procmon's
//! backing files and ETW's circular logs bound a capture's disk use.
//!
//! `FILE` becomes `STEM-0001.EXT`, `STEM-0002.EXT`, ...: once a part holds
//! `SIZE` bytes (checked when a batch ends, so a part exceeds it by at most
//! one batch) it is finished (its end marker written) and the next begins.
//! Each part is a whole capture that reads alone: it starts with the
//! module lists of the capture's start, then the module records written
//! before it of the processes that have not exited, and every loaded
//! image's identity, and stores each stack again in the first record that
//! has it.

use std::{
    collections::VecDeque,
    path::{Path, PathBuf},
};

use clap::Args;
use kstack_abi::ModuleEvent;
use kstack_client::{
    capture::{stack_table::counted, writer::CaptureWriter},
    device::session::Batch,
    error::ClientError,
    naming::{
        modules::ModuleMap,
        process_modules::{ModuleChange, ProcessModules},
    },
};

use super::output::{CaptureTarget, is_standard_output, open_target};

#[derive(Args)]
pub struct PartArgs {
    /// Write the capture in parts of about this size (bytes, or with K, M
    /// or G: KiB, MiB, GiB; at least 1M): FILE becomes STEM-0001.EXT,
    /// STEM-0002.EXT, ..., each a whole capture that reads alone.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    max_size: Option<u64>,
    /// With --max-size: keep only the newest N parts (2 or more, the one
    /// being written among them), deleting the oldest when a new one
    /// begins.
    #[arg(
        long,
        value_name = "N",
        requires = "max_size",
        value_parser = clap::value_parser!(u32).range(2..)
    )]
    rotate: Option<u32>,
}

/// The smallest `--max-size`: a part must hold more than its module lists.
const MIN_PART: u64 = 1 << 20;

fn parse_size(text: &str) -> Result<u64, String> {
    let (digits, unit) = match text.char_indices().last() {
        Some((at, unit)) if unit.is_ascii_alphabetic() => (&text[..at], unit.to_ascii_uppercase()),
        _ => (text, 'B'),
    };
    let shift = match unit {
        'B' => 0,
        'K' => 10,
        'M' => 20,
        'G' => 30,
        _ => return Err(format!("{text:?}: the size's unit is K, M or G")),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|count| count.checked_mul(1 << shift))
        .filter(|&bytes| bytes >= MIN_PART)
        .ok_or_else(|| format!("{text:?} is not a size of at least 1M (bytes, or with K, M or G)"))
}

impl PartArgs {
    /// The parts of a capture at `path`, when --max-size asks for them.
    /// Parts of an earlier capture of that name are refused, or with
    /// `force` deleted: one capture's parts are never mixed with
    /// another's, and none is found in the way hours later.
    ///
    /// # Errors
    /// [`ClientError::Unwritable`] for parts on standard output,
    /// [`ClientError::Exists`] for an earlier part without `force`, or
    /// the error deleting it.
    pub fn parts(&self, path: &Path, force: bool) -> Result<Option<Parts>, ClientError> {
        let Some(max_size) = self.max_size else {
            return Ok(None);
        };
        if is_standard_output(path) {
            return Err(ClientError::Unwritable {
                path: "standard output".to_owned(),
                reason: "--max-size writes parts, each a file: name one",
            });
        }
        for earlier in earlier_parts(path) {
            if !force {
                return Err(ClientError::Exists {
                    path: earlier.display().to_string(),
                });
            }
            std::fs::remove_file(&earlier)
                .map_err(|error| ClientError::file(&earlier, "deleting", &error))?;
        }
        Ok(Some(Parts {
            base: path.to_path_buf(),
            max_size,
            keep: self.rotate,
            number: 1,
            kept: VecDeque::new(),
            rotated_out: (0, 0),
            changes: Vec::new(),
            records_before: 0,
            syncs_before: 0,
        }))
    }
}

/// The parts written so far, and what the next one starts with.
pub struct Parts {
    base: PathBuf,
    max_size: u64,
    keep: Option<u32>,
    /// The part being written.
    number: u32,
    /// The finished parts kept, oldest first, with their trace records.
    kept: VecDeque<(PathBuf, u64)>,
    /// Parts deleted by --rotate, and their trace records.
    rotated_out: (u32, u64),
    /// Every module record written so far: each part starts with them.
    changes: Vec<ModuleChange>,
    /// Trace records in the finished parts.
    records_before: u64,
    /// Syncs made by the finished parts.
    syncs_before: u64,
}

/// The files beside `base` named as its parts are (`STEM-NNNN.EXT`).
fn earlier_parts(base: &Path) -> Vec<PathBuf> {
    let dir = match base.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let stem = format!(
        "{}-",
        base.file_stem().unwrap_or_default().to_string_lossy()
    );
    let extension = base
        .extension()
        .map(|extension| format!(".{}", extension.to_string_lossy()));
    let mut parts: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| {
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            let number = name.strip_prefix(&stem).and_then(|rest| match &extension {
                Some(extension) => rest.strip_suffix(extension.as_str()),
                None => Some(rest),
            });
            number.is_some_and(|digits| {
                digits.len() >= 4 && digits.bytes().all(|b| b.is_ascii_digit())
            })
        })
        .collect();
    parts.sort();
    parts
}

impl Parts {
    /// Part `number` of a capture named `base`: `STEM-NNNN.EXT`.
    #[must_use]
    pub fn path_of(base: &Path, number: u32) -> PathBuf {
        let stem = base.file_stem().unwrap_or_default().to_string_lossy();
        let name = match base.extension() {
            Some(extension) => format!("{stem}-{number:04}.{}", extension.to_string_lossy()),
            None => format!("{stem}-{number:04}"),
        };
        base.with_file_name(name)
    }

    /// The part being written.
    #[must_use]
    pub fn current(&self) -> PathBuf {
        Self::path_of(&self.base, self.number)
    }

    /// After `batch` was written to `writer`: notes its module records,
    /// and once the part holds --max-size bytes finishes it and begins the
    /// next (with the start's module lists, `modules` and `processes`),
    /// deleting the oldest part beyond --rotate's count.
    ///
    /// # Errors
    /// The next part's creation, or writing either part.
    pub fn after_batch(
        &mut self,
        writer: &mut CaptureWriter<CaptureTarget>,
        batch: &Batch,
        (modules, processes): (&ModuleMap, &ProcessModules),
        force: bool,
    ) -> Result<(), ClientError> {
        for change in &batch.modules {
            if change.header.event == ModuleEvent::ProcessExit {
                // An exited process's modules name nothing in later parts.
                let process = change.header.process_id;
                self.changes
                    .retain(|earlier| earlier.header.process_id != process);
            } else {
                self.changes.push(change.clone());
            }
        }
        if writer.bytes() < self.max_size {
            return Ok(());
        }
        let next_path = Self::path_of(&self.base, self.number + 1);
        let writing = |path: &Path| {
            let path = path.to_path_buf();
            move |error: std::io::Error| ClientError::file(&path, "writing", &error)
        };
        let mut next =
            CaptureWriter::with_processes(open_target(&next_path, force)?, modules, processes)
                .map_err(writing(&next_path))?;
        if let Some(every) = writer.sync_interval() {
            next = next.syncing_every(every);
        }
        for change in &self.changes {
            next.append_module(change).map_err(writing(&next_path))?;
        }
        for (module, identity) in writer.loaded_identities() {
            next.note_loaded_identity(module.clone(), identity.clone());
        }
        next.end_batch().map_err(writing(&next_path))?;
        let finished = std::mem::replace(writer, next);
        let records = finished.trace_records();
        let path = self.current();
        self.syncs_before += finished.finish().map_err(writing(&path))?.syncs;
        self.records_before += records;
        self.kept.push_back((path, records));
        self.number += 1;
        while self
            .keep
            .is_some_and(|keep| self.kept.len() + 1 > keep as usize)
        {
            let Some((oldest, records)) = self.kept.pop_front() else {
                break;
            };
            // A part another program holds open stays: the capture goes on.
            if let Err(error) = std::fs::remove_file(&oldest) {
                kstack_client::eprintln_fitted!(
                    "kstack save: warning: --rotate could not delete {}: {error}",
                    oldest.display()
                );
                continue;
            }
            self.rotated_out.0 += 1;
            self.rotated_out.1 += records;
        }
        Ok(())
    }

    /// Syncs made by the finished parts.
    #[must_use]
    pub const fn syncs_before(&self) -> u64 {
        self.syncs_before
    }

    /// Module records of the processes still running: every part repeats
    /// them, each counted once.
    #[must_use]
    pub fn module_records(&self) -> u64 {
        self.changes.len() as u64
    }

    /// Trace records in the finished parts, rotated out or kept.
    #[must_use]
    pub const fn records_before(&self) -> u64 {
        self.records_before
    }

    /// The summary's words: the parts kept, and what --rotate deleted.
    #[must_use]
    pub fn text(&self) -> String {
        let first_kept = self.number - u32::try_from(self.kept.len()).unwrap_or(0);
        let kept = if first_kept == self.number {
            format!("1 part, {}", self.current().display())
        } else {
            format!(
                "{} parts, {} to {}",
                self.number - first_kept + 1,
                Self::path_of(&self.base, first_kept).display(),
                self.current().display()
            )
        };
        let (parts, records) = self.rotated_out;
        if parts == 0 {
            kept
        } else {
            format!(
                "{kept}; {} ({}) deleted by --rotate",
                counted(u64::from(parts), "older part"),
                counted(records, "record")
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_a_unit_and_are_at_least_one_mib() {
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert_eq!(parse_size("2g"), Ok(2 << 30));
        assert_eq!(parse_size("4096K"), Ok(4 << 20));
        assert_eq!(parse_size("1048576"), Ok(1 << 20));
        for bad in ["1K", "0M", "12X", "M", "", "-1M", "99999999999G"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn parts_are_numbered_before_the_extension() {
        assert_eq!(
            Parts::path_of(Path::new("dir/trace.kstack"), 7),
            Path::new("dir/trace-0007.kstack")
        );
        assert_eq!(
            Parts::path_of(Path::new("trace"), 12),
            Path::new("trace-0012")
        );
    }
}
