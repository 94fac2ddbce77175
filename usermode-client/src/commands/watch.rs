//! `kstack watch`: follows new records until Ctrl-C (or --duration), then
//! summarizes.

use clap::Args;
use kstack_client::{
    device::{session, transport::Transport},
    error::ClientError,
};

use super::{
    live::{FollowArgs, follow_summary_text, open_device, stop_flag},
    output::{RecordFormat, print_records},
};

#[derive(Args)]
pub struct WatchArgs {
    #[command(flatten)]
    format: RecordFormat,
    #[command(flatten)]
    follow: FollowArgs,
}

pub fn run(args: &WatchArgs) -> Result<(), ClientError> {
    watch(&mut open_device()?, args)
}

/// Reads until stopped; then says how many records arrived, how many
/// sequence numbers are missing, and how many drops the driver counted.
fn watch(device: &mut impl Transport, args: &WatchArgs) -> Result<(), ClientError> {
    let mut symbolizer = args.format.live_symbolizer(device)?;
    let summary = session::follow(device, args.follow.until_stopped(), &stop_flag(), |batch| {
        symbolizer.note_modules(&batch.modules);
        print_records(&batch.records, &symbolizer, &args.format);
        Ok(())
    })?;
    kstack_client::eprintln_fitted!("kstack watch: {}", follow_summary_text(&summary));
    Ok(())
}
