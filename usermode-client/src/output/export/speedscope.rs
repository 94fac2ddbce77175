//! speedscope files (<https://www.speedscope.app/file-format-schema.json>):
//! one sampled profile per source, weighted by record counts.

use std::collections::HashMap;

use kstack_abi::Source;
use serde_json::{Value, json};

use crate::{capture::stack_table::StackTable, naming::symbolizer::Symbolizer};

/// The schema URL speedscope files declare.
pub const SCHEMA_URL: &str = "https://www.speedscope.app/file-format-schema.json";

/// The stacks of `table` as a speedscope file: a "sampled" profile per
/// source that captured any, one sample per stack (frames outermost first,
/// as speedscope wants them), its weight the stack's record count. Frames
/// are named as `kstack top` names them. speedscope opens on the source
/// with the most records.
#[must_use]
pub fn document(table: &StackTable, symbolizer: &Symbolizer) -> Value {
    let ranked = table.ranked();
    let mut frames = Vec::new();
    let mut frame_index = HashMap::new();
    let mut profiles = Vec::new();
    for source in Source::ALL {
        let mut samples = Vec::new();
        let mut weights = Vec::new();
        for stack in &ranked {
            let count = stack.per_source[source.index()];
            if count == 0 {
                continue;
            }
            // One shared frame per name and address: a user address may
            // name other modules in other processes.
            let sample: Vec<usize> = stack
                .calls(symbolizer)
                .into_iter()
                .rev()
                .map(|(address, name)| {
                    *frame_index
                        .entry((address, name))
                        .or_insert_with_key(|(_, name)| {
                            frames.push(json!({ "name": name }));
                            frames.len() - 1
                        })
                })
                .collect();
            samples.push(sample);
            weights.push(count);
        }
        if samples.is_empty() {
            continue;
        }
        profiles.push(json!({
            "type": "sampled",
            "name": source.name(),
            "unit": "none",
            "startValue": 0,
            "endValue": weights.iter().sum::<u64>(),
            "samples": samples,
            "weights": weights,
        }));
    }
    let busiest = profiles
        .iter()
        .enumerate()
        .max_by_key(|&(index, profile)| (profile["endValue"].as_u64(), std::cmp::Reverse(index)))
        .map_or(0, |(index, _)| index);
    json!({
        "$schema": SCHEMA_URL,
        "name": format!("kstack: {}", table.summary()),
        "exporter": "kstack",
        "activeProfileIndex": busiest,
        "shared": { "frames": frames },
        "profiles": profiles,
    })
}

#[cfg(test)]
mod tests {
    use kstack_abi::SourceFacts;

    use super::*;
    use crate::{capture::writer::tests::record, naming::modules::tests::sample_map};

    const LEAF: u64 = 0xFFFF_F801_2340_0010;
    const ROOT: u64 = 0xFFFF_F800_0000_0020;

    #[test]
    fn each_source_gets_a_profile_weighted_by_counts_and_named_like_top() {
        let mut table = StackTable::default();
        for record in [
            record(1, SourceFacts::Timer, &[LEAF, ROOT]),
            record(2, SourceFacts::Timer, &[LEAF, ROOT]),
            record(3, SourceFacts::OnDemand { tag: 1 }, &[0x42, ROOT]),
        ] {
            table.add(&record);
        }
        let document = document(
            &table,
            &Symbolizer::new(sample_map()).showing_tracer_frames(),
        );
        assert_eq!(document["$schema"], SCHEMA_URL);
        assert_eq!(
            document["shared"]["frames"],
            json!([
                { "name": "ntoskrnl.exe+0x20" },
                { "name": "kstack.sys+0x10" },
                { "name": "0x42" },
            ])
        );
        let profiles = document["profiles"].as_array().unwrap();
        assert_eq!(profiles.len(), 2, "no profile for sources without records");
        assert_eq!(profiles[0]["name"], "timer");
        assert_eq!(profiles[0]["samples"], json!([[0, 1]]), "the root first");
        assert_eq!(profiles[0]["weights"], json!([2]));
        assert_eq!(profiles[0]["endValue"], 2);
        assert_eq!(profiles[1]["name"], "ondemand");
        assert_eq!(profiles[1]["samples"], json!([[0, 2]]));
        assert_eq!(profiles[1]["weights"], json!([1]));
        assert_eq!(document["activeProfileIndex"], 0, "timer has the most");
    }
}
