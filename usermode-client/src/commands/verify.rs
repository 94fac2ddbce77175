//! `kstack verify`: a saved capture's health, read through to its end:
//! what it holds, whether it was finished, and what damage or a cut cost.

use std::path::PathBuf;

use clap::Args;
use kstack_client::{
    capture::{reader::Health, stack_table::counted},
    error::ClientError,
};
use serde_json::json;

use super::{
    input::{INCOMPLETE_CAPTURE, open_capture, read_error},
    output::JsonArg,
};

#[derive(Args)]
pub struct VerifyArgs {
    /// The capture file to check.
    file: PathBuf,
    #[command(flatten)]
    json: JsonArg,
}

pub fn run(args: &VerifyArgs) -> Result<(), ClientError> {
    let path = args.file.as_path();
    let mut capture = open_capture(path)?;
    let mut records = 0_u64;
    while let Some(record) = capture.next_record() {
        record.map_err(|error| read_error(path, error))?;
        records += 1;
    }
    let health = capture.health();
    if !health.is_whole() {
        INCOMPLETE_CAPTURE.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    if args.json.json {
        println!("{}", report_json(health, records));
    } else {
        print!(
            "{}",
            report_text(&path.display().to_string(), health, records)
        );
    }
    Ok(())
}

fn report_text(path: &str, health: &Health, records: u64) -> String {
    let blocks = if health.format >= 7 {
        format!("in {}", counted(health.blocks, "intact block"))
    } else {
        "in one run (formats before 7 have no blocks nor checksums)".to_owned()
    };
    let end = health.end_count.map_or_else(
        || "none: the capture was not finished".to_owned(),
        |count| format!("counts {}", counted(count, "entry")),
    );
    let verdict = if health.is_whole() {
        "whole".to_owned()
    } else {
        format!("incomplete: {health}")
    };
    format!(
        "{path}: capture format {}\nread: {} ({} with module records and sample facts) {blocks}\n\
         end marker: {end}\nhealth: {verdict}\n",
        health.format,
        counted(records, "record"),
        counted(health.entries, "entry"),
    )
}

fn report_json(health: &Health, records: u64) -> serde_json::Value {
    json!({
        "format": health.format,
        "whole": health.is_whole(),
        "records": records,
        "entries": health.entries,
        "blocks": health.blocks,
        "end_count": health.end_count,
        "cut": health.tail.map(|(offset, length)| json!({"offset": offset, "length": length})),
        "damaged_runs": health.damaged_runs,
        "damaged_bytes": health.damaged_bytes,
        "damaged": health.damaged.iter()
            .map(|(offset, length)| json!({"offset": offset, "length": length}))
            .collect::<Vec<_>>(),
        "undecodable_blocks": health.undecodable,
        "entries_lost": health.entries_lost,
        "stacks_lost": health.stacks_lost,
        "repeats_lost": health.repeats_lost,
        "module_list_lost": health.start_lost,
        "out_of_place_blocks": health.out_of_place,
        "bytes_after_end": health.after_end,
        "last_record": health.last_record.map(|(shard, sequence)| json!({"shard": shard, "sequence": sequence})),
        "problems": health.to_string(),
    })
}
