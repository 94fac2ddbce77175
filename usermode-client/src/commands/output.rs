//! Where output goes: records printed as text or JSON lines, and output
//! files that are never half-written nor replaced without --force.

use std::{
    fmt,
    fs::File,
    io::{self, IsTerminal as _, Write},
    path::{Path, PathBuf},
};

use clap::Args;
use kstack_client::{
    capture::{trace::TraceRecord, writer::CaptureOutput},
    device::transport::Transport,
    error::ClientError,
    naming::symbolizer::Symbolizer,
    output::width::{Stream, fit, width},
};
use tempfile::NamedTempFile;

use super::symbols::SymbolsArg;

#[derive(Args)]
pub struct JsonArg {
    /// JSON instead of text (docs/client.md, "JSON output").
    #[arg(long)]
    pub json: bool,
}

/// `--force`, for every command that writes a file.
#[derive(Args)]
pub struct ForceArg {
    /// Replace the output file if it exists.
    #[arg(long)]
    pub force: bool,
}

/// Where a command's whole output goes: the file `--output` names, else
/// (or with `-o -`) standard output. A command with nothing to print makes the file
/// required and says what it is:
/// `#[command(mut_arg("output", |arg| arg.required(true).help("...")))]`.
#[derive(Args)]
pub struct OutputArgs {
    /// Write to this file instead of standard output (`-`: standard
    /// output).
    #[arg(long, short, value_name = "FILE")]
    output: Option<PathBuf>,
    #[command(flatten)]
    force: ForceArg,
}

impl OutputArgs {
    /// The file to write, if any (`-` is standard output).
    fn file(&self) -> Option<&Path> {
        self.output
            .as_deref()
            .filter(|path| !is_standard_output(path))
    }

    /// Checks, before any work, that the output may be written: see
    /// [`check_output`]; `input` is the file being read, if any.
    pub fn check(&self, inputs: &[PathBuf]) -> Result<(), ClientError> {
        self.file()
            .map_or(Ok(()), |path| check_output(path, self.force.force, inputs))
    }

    /// Writes the whole output with `write`: to the file (see
    /// [`write_file`]) or to standard output, where a closed pipe (`| head`)
    /// ends it, not in an error.
    pub fn write(
        &self,
        write: impl FnOnce(&mut dyn Write) -> io::Result<()>,
    ) -> Result<(), ClientError> {
        if let Some(path) = self.file() {
            return write_file(path, self.force.force, |out| write(out));
        }
        let mut out = io::stdout().lock();
        let _ = write(&mut out).and_then(|()| out.flush());
        Ok(())
    }
}

/// Where the output went, for the closing message.
impl fmt::Display for OutputArgs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.file() {
            Some(path) => path.display().fmt(f),
            None => f.write_str("standard output"),
        }
    }
}

#[derive(Args)]
pub struct RecordFormat {
    #[command(flatten)]
    pub json: JsonArg,
    /// One Sysmon-style `CallTrace: a+0x1|b+0x2` line per record instead
    /// of one line per frame.
    #[arg(long, conflicts_with = "json")]
    pub call_trace: bool,
    #[command(flatten)]
    pub symbols: SymbolsArg,
}

impl RecordFormat {
    /// How a live session names the records it prints (see
    /// [`SymbolsArg::live_symbolizer`]).
    ///
    /// # Errors
    /// The status request's error, or `--symbols` off Windows.
    pub fn live_symbolizer(&self, device: &mut impl Transport) -> Result<Symbolizer, ClientError> {
        self.symbols.live_symbolizer(device)
    }
}

pub fn print_records(records: &[TraceRecord], symbolizer: &Symbolizer, format: &RecordFormat) {
    let mut out = io::stdout().lock();
    // Asked once per batch, not per record.
    let columns = width(Stream::Stdout);
    for record in records {
        let written = if format.json.json {
            writeln!(out, "{}", record.to_json(symbolizer))
        } else {
            let text = record.to_text(symbolizer, format.call_trace);
            write!(out, "{}", fit(&text, columns))
        };
        if written.is_err() {
            // The reader went away (a closed pipe): nothing more to print.
            return;
        }
    }
}

/// Whether `path` is `-`: standard output.
pub fn is_standard_output(path: &Path) -> bool {
    path.as_os_str() == "-"
}

/// Whether `path` may be written: never when it is one of `inputs` (the
/// captures being read) or exists and is not a regular file (a device, a pipe, a
/// folder), `--force` or not; otherwise an existing file only with
/// `force`.
///
/// # Errors
/// [`ClientError::Unwritable`], [`ClientError::Exists`].
pub fn check_output(path: &Path, force: bool, inputs: &[PathBuf]) -> Result<(), ClientError> {
    let unwritable = |reason| ClientError::Unwritable {
        path: path.display().to_string(),
        reason,
    };
    if is_device_name(path) {
        return Err(unwritable(
            "it names a device (NUL, CON, PRN, AUX, COM1-9, LPT1-9), never a file",
        ));
    }
    let Ok(metadata) = std::fs::metadata(path) else {
        // Nothing there (or nothing this process may look at): creating
        // it will say.
        return Ok(());
    };
    let same_file = |other: &Path| {
        std::fs::canonicalize(path)
            .ok()
            .zip(std::fs::canonicalize(other).ok())
            .is_some_and(|(a, b)| a == b)
    };
    if inputs.iter().any(|input| same_file(input)) {
        return Err(unwritable("it is the capture being read"));
    }
    if !metadata.is_file() {
        return Err(unwritable(
            "it is not a regular file (a device, a pipe or a folder); --force replaces only files",
        ));
    }
    if force {
        Ok(())
    } else {
        Err(ClientError::Exists {
            path: path.display().to_string(),
        })
    }
}

/// Whether `path` names one of Windows' reserved devices (`NUL`, `CON`,
/// `PRN`, `AUX`, `COM1`-`COM9`, `LPT1`-`LPT9`, in any case, with any
/// extension, in any folder) or a device path (`\\.\...`): Windows opens
/// the device, not a file, whatever exists. Refused on every host, so a
/// name is refused the same on Linux as on the Windows that reads it.
fn is_device_name(path: &Path) -> bool {
    let text = path.to_string_lossy();
    if text.starts_with(r"\\.\") || text.starts_with("//./") {
        return true;
    }
    let name = text.rsplit(['/', '\\']).next().unwrap_or_default();
    let stem = name.split('.').next().unwrap_or_default().trim_end();
    let upper = stem.to_ascii_uppercase();
    matches!(upper.as_str(), "NUL" | "CON" | "PRN" | "AUX")
        || ((upper.starts_with("COM") || upper.starts_with("LPT"))
            && upper.len() == 4
            && matches!(upper.as_bytes()[3], b'1'..=b'9'))
}

/// The OS error under one of tempfile's, which adds the temporary file's
/// name: errors name the file the user asked for, never ours.
fn without_temporary_path(error: &io::Error) -> io::Error {
    if let Some(code) = error.raw_os_error() {
        return io::Error::from_raw_os_error(code);
    }
    error
        .get_ref()
        .and_then(|inner| inner.source())
        .and_then(|source| source.downcast_ref::<io::Error>())
        .map_or_else(|| io::Error::from(error.kind()), without_temporary_path)
}

/// Creates `path`, refusing to replace it without `force`.
pub fn create_output(path: &Path, force: bool) -> Result<std::fs::File, ClientError> {
    check_output(path, force, &[])?;
    let mut options = std::fs::OpenOptions::new();
    options.write(true);
    if force {
        options.create(true).truncate(true);
    } else {
        options.create_new(true);
    }
    let file = options.open(path).map_err(|error| {
        if error.kind() == io::ErrorKind::AlreadyExists {
            ClientError::Exists {
                path: path.display().to_string(),
            }
        } else {
            ClientError::file(path, "creating", &error)
        }
    })?;
    Ok(file)
}

/// Where a capture goes: a file, or standard output (`-`).
pub enum CaptureTarget {
    /// A file created for it.
    File(File),
    /// Standard output (a pipe or a file the shell opened).
    Stdout(io::Stdout),
}

impl Write for CaptureTarget {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        match self {
            Self::File(file) => file.write(bytes),
            Self::Stdout(out) => out.write(bytes),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Self::File(file) => file.flush(),
            Self::Stdout(out) => out.flush(),
        }
    }
}

impl CaptureOutput for CaptureTarget {
    fn sync(&mut self) -> io::Result<()> {
        match self {
            Self::File(file) => file.sync(),
            // What reads the pipe decides what is durable.
            Self::Stdout(out) => out.flush(),
        }
    }
}

/// `path` as messages name it.
pub fn shown(path: &Path) -> String {
    if is_standard_output(path) {
        "standard output".to_owned()
    } else {
        path.display().to_string()
    }
}

/// The capture's target: `path` created (replaced only with `force`), or
/// standard output for `-` when it is not a terminal.
pub fn open_target(path: &Path, force: bool) -> Result<CaptureTarget, ClientError> {
    if !is_standard_output(path) {
        return create_output(path, force).map(CaptureTarget::File);
    }
    let out = io::stdout();
    if out.is_terminal() {
        return Err(ClientError::Unwritable {
            path: "standard output".to_owned(),
            reason: "it is a terminal, and a capture is binary: redirect it to a file or a pipe",
        });
    }
    Ok(CaptureTarget::Stdout(out))
}

/// Removes a half-written output, so nothing that looks finished is wrong
/// (standard output is left alone).
pub fn discard(path: &Path) {
    if !is_standard_output(path) {
        let _ = std::fs::remove_file(path);
    }
}

/// Writes a whole output file with `write`, refusing to replace `path`
/// without `force`. It is written to a temporary file beside `path` and
/// renamed to `path` once complete, so a failed write leaves `path` as it
/// was and no half-written file behind.
fn write_file(
    path: &Path,
    force: bool,
    write: impl FnOnce(&mut io::BufWriter<NamedTempFile>) -> io::Result<()>,
) -> Result<(), ClientError> {
    let exists = || ClientError::Exists {
        path: path.display().to_string(),
    };
    check_output(path, force, &[])?;
    let dir = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let mut builder = tempfile::Builder::new();
    builder.prefix(".kstack-").suffix(".tmp");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        // What a plain create makes (less the umask), not tempfile's 0600.
        builder.permissions(std::fs::Permissions::from_mode(0o666));
    }
    let temp = builder
        .tempfile_in(dir)
        .map_err(|error| ClientError::file(path, "creating", &without_temporary_path(&error)))?;
    let writing =
        |error: &io::Error| ClientError::file(path, "writing", &without_temporary_path(error));
    let mut out = io::BufWriter::new(temp);
    write(&mut out)
        .and_then(|()| out.flush())
        .map_err(|error| writing(&error))?;
    let temp = out.into_inner().map_err(|error| writing(error.error()))?;
    let persisted = if force {
        temp.persist(path)
    } else {
        // Someone may have made `path` meanwhile: still not replaced.
        temp.persist_noclobber(path)
    };
    persisted.map_err(|error| {
        if error.error.kind() == io::ErrorKind::AlreadyExists {
            exists()
        } else {
            writing(&error.error)
        }
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_never_name_the_temporary_file() {
        let missing = Path::new("/nonexistent-kstack-folder/out.svg");
        let error = write_file(missing, false, |_| Ok(())).unwrap_err();
        let text = error.to_string();
        assert!(
            text.starts_with("creating /nonexistent-kstack-folder/out.svg: "),
            "{text}"
        );
        assert!(
            !text.contains(".kstack-") && !text.contains(".tmp"),
            "{text}"
        );
        let raw = tempfile::Builder::new()
            .prefix(".kstack-")
            .tempfile_in("/nonexistent-kstack-folder")
            .unwrap_err();
        assert!(
            raw.to_string().contains("nonexistent"),
            "tempfile names it: {raw}"
        );
        assert!(
            !without_temporary_path(&raw)
                .to_string()
                .contains("nonexistent")
        );
    }

    fn refusal(result: Result<(), ClientError>) -> Option<&'static str> {
        match result {
            Err(ClientError::Unwritable { reason, .. }) => Some(reason),
            Err(ClientError::Exists { .. }) => Some("exists"),
            Err(other) => panic!("{other}"),
            Ok(()) => None,
        }
    }

    #[test]
    fn an_output_is_never_the_input_nor_a_device_and_replaces_a_file_only_with_force() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in.kstack");
        std::fs::write(&input, "capture").unwrap();
        let new = dir.path().join("new.svg");
        assert_eq!(
            refusal(check_output(&new, false, std::slice::from_ref(&input))),
            None
        );
        assert_eq!(refusal(check_output(&input, false, &[])), Some("exists"));
        assert_eq!(refusal(check_output(&input, true, &[])), None);
        let again = dir.path().join(".").join("in.kstack");
        for force in [false, true] {
            assert_eq!(
                refusal(check_output(&again, force, std::slice::from_ref(&input))),
                Some("it is the capture being read")
            );
            assert!(
                refusal(check_output(dir.path(), force, &[]))
                    .is_some_and(|reason| reason.contains("not a regular file"))
            );
        }
        #[cfg(unix)]
        assert!(
            refusal(check_output(Path::new("/dev/null"), true, &[]))
                .is_some_and(|reason| reason.contains("not a regular file"))
        );
        // Windows' devices, whatever the folder, case or extension.
        for device in [
            "NUL",
            "nul.txt",
            "out/CON",
            r"C:\x\Com1.kstack",
            "LPT9",
            r"\\.\PhysicalDrive0",
        ] {
            assert!(
                refusal(check_output(Path::new(device), true, &[]))
                    .is_some_and(|reason| reason.contains("names a device")),
                "{device}"
            );
        }
        for file in ["NULL", "COM10", "console.txt", "nul_report", "LPT0"] {
            let path = dir.path().join(file);
            assert_eq!(refusal(check_output(&path, false, &[])), None, "{file}");
        }
        // save and sample create their file through the same check.
        assert!(matches!(
            create_output(dir.path(), true),
            Err(ClientError::Unwritable { .. })
        ));
    }
}
