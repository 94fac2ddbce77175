//! `kstack read`: drains the ring once (or reads a saved capture) and
//! prints the records.

use std::{path::PathBuf, sync::atomic::AtomicBool};

use clap::Args;
use kstack_client::{
    device::session::{self, Follow},
    error::ClientError,
};

use super::{
    input::for_each_saved_record,
    live::open_device,
    output::{RecordFormat, print_records},
};

#[derive(Args)]
pub struct ReadArgs {
    #[command(flatten)]
    format: RecordFormat,
    /// Read this saved capture instead of the driver (works on any OS).
    #[arg(long, value_name = "FILE")]
    input: Option<PathBuf>,
}

pub fn run(args: &ReadArgs) -> Result<(), ClientError> {
    if let Some(path) = &args.input {
        let mut batch = Vec::new();
        let symbolizer = for_each_saved_record(
            std::slice::from_ref(path),
            &args.format.symbols,
            |record, symbolizer| {
                batch.push(record.clone());
                if batch.len() == 4096 {
                    print_records(&batch, symbolizer, &args.format);
                    batch.clear();
                }
            },
        )?;
        print_records(&batch, &symbolizer, &args.format);
        return Ok(());
    }
    let mut device = open_device()?;
    let mut symbolizer = args.format.live_symbolizer(&mut device)?;
    session::follow(
        &mut device,
        Follow::UntilDrained,
        &AtomicBool::new(false),
        |batch| {
            symbolizer.note_modules(&batch.modules);
            print_records(&batch.records, &symbolizer, &args.format);
            Ok(())
        },
    )?;
    Ok(())
}
