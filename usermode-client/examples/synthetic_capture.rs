//! Writes a synthetic capture of RECORDS timer records to FILE, as `kstack
//! save` writes one (`kstack_client::capture::synthetic`), for the size
//! benchmark (`cargo xtask bench size`):
//! `synthetic_capture RECORDS FILE`.

use std::{fs::File, process::ExitCode};

use kstack_client::capture::{synthetic, writer::CaptureWriter};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [records, path] = &args[..] else {
        eprintln!("usage: synthetic_capture RECORDS FILE");
        return ExitCode::from(2);
    };
    let Ok(records) = records.parse::<u64>() else {
        eprintln!("{records:?} is not a number of records");
        return ExitCode::from(2);
    };
    let written = File::create(path).and_then(|file| {
        let mut writer = CaptureWriter::new(file, &synthetic::modules())?;
        synthetic::write_records(&mut writer, records, synthetic::frames)?;
        writer.finish()
    });
    match written {
        Ok(_) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("writing {path}: {error}");
            ExitCode::FAILURE
        }
    }
}
