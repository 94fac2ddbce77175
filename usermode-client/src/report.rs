//! Human-readable reports.

use std::fmt::Write as _;

use kstack_abi::{ABI_VERSION, KSTACK_VERSION, PagingExecutive, Source, StatusResponse};
use serde_json::{Value, json};

use crate::stack_table::counted;

/// The `kstack status` report.
#[must_use]
pub fn status(status: &StatusResponse) -> String {
    let mut out = String::new();
    let (major, minor, patch) = status.driver_version;
    let (client_major, client_minor, client_patch) = KSTACK_VERSION;
    let _ = writeln!(
        out,
        "kstack driver {major}.{minor}.{patch}, client {client_major}.{client_minor}.{client_patch}, ABI {ABI_VERSION}"
    );
    let image = status.driver_image;
    let _ = writeln!(
        out,
        "kstack.sys loaded at {:#x}, {:#x} bytes",
        image.base, image.size
    );
    let _ = writeln!(
        out,
        "DisablePagingExecutive: {}",
        paging_executive(status.paging_executive)
    );
    let _ = writeln!(
        out,
        "ring: {} of {} records in use, in {} (one per processor)",
        status.ring_used,
        status.ring_capacity,
        counted(u64::from(status.ring_shards), "shard")
    );
    let sum = |count: fn(&kstack_abi::SourceStatus) -> u64| -> u64 {
        status.sources.iter().map(count).sum()
    };
    let _ = writeln!(
        out,
        "records: {} captured = {} read + {} waiting + {} dropped (ring full) + {} cleared \
         ({} sequence numbers spent)",
        sum(|source| source.captured),
        status.read,
        status.ring_used,
        status.dropped,
        status.cleared,
        status.sequences_spent
    );
    let _ = writeln!(
        out,
        "not captured: {} skipped (IRQL too high for the paging policy), {} skipped (kernel stack \
         below 8 KiB), {} filtered \
         (process filter), {} capture-now answered only (on-demand disabled)",
        sum(|source| source.skipped_irql),
        sum(|source| source.skipped_stack),
        sum(|source| source.filtered),
        sum(|source| source.not_kept)
    );
    let altitude = |altitude: kstack_abi::Altitude| {
        if altitude.is_some() {
            altitude.to_string()
        } else {
            "not registered".to_owned()
        }
    };
    let _ = writeln!(
        out,
        "callback altitudes: object {}, registry {}",
        altitude(status.object_altitude),
        altitude(status.registry_altitude)
    );
    let config = &status.config;
    let filter = match config.process_filter {
        0 => "all processes".to_owned(),
        pid => format!("process {pid} only"),
    };
    let _ = writeln!(
        out,
        "capture: skip {} frames, keep up to {}, {filter}; pool allocations held: {}",
        config.frames_to_skip, config.frames_to_capture, status.outstanding_allocations
    );
    source_table(&mut out, status);
    out
}

/// The per-source part of the `kstack status` report: one line a source.
fn source_table(out: &mut String, status: &StatusResponse) {
    let config = &status.config;
    let _ = writeln!(
        out,
        "{:<10} {:<11} {:<8} {:>10} {:>13} {:>14} {:>10} {:>9}  registration",
        "source",
        "available",
        "enabled",
        "captured",
        "skipped-irql",
        "skipped-stack",
        "filtered",
        "not-kept"
    );
    for source in Source::ALL {
        let state = &status.sources[source.index()];
        let _ = writeln!(
            out,
            "{:<10} {:<11} {:<8} {:>10} {:>13} {:>14} {:>10} {:>9}  {:#010x}",
            source.name(),
            if state.available { "yes" } else { "no" },
            if config.sources.contains(source) {
                "yes"
            } else {
                "no"
            },
            state.captured,
            state.skipped_irql,
            state.skipped_stack,
            state.filtered,
            state.not_kept,
            state.registration,
        );
    }
}

/// The `kstack status --json` object.
#[must_use]
pub fn status_json(status: &StatusResponse) -> Value {
    let (major, minor, patch) = status.driver_version;
    let config = &status.config;
    let sources: Vec<Value> = Source::ALL
        .iter()
        .map(|&source| {
            let state = &status.sources[source.index()];
            json!({
                "name": source.name(),
                "available": state.available,
                "enabled": config.sources.contains(source),
                "registration": format!("{:#010x}", state.registration),
                "captured": state.captured,
                "skipped_irql": state.skipped_irql,
                "skipped_stack": state.skipped_stack,
                "filtered": state.filtered,
                "not_kept": state.not_kept,
            })
        })
        .collect();
    json!({
        "driver_version": format!("{major}.{minor}.{patch}"),
        "abi_version": ABI_VERSION,
        "driver_image": {
            "base": format!("{:#x}", status.driver_image.base),
            "size": status.driver_image.size,
        },
        "disable_paging_executive": match status.paging_executive {
            PagingExecutive::NotSet => Value::Null,
            PagingExecutive::Value(value) => json!(value),
        },
        "elevated_walks_allowed": status.paging_executive.allows_elevated_walks(),
        "ring": {
            "capacity": status.ring_capacity,
            "used": status.ring_used,
            "shards": status.ring_shards,
        },
        "dropped": status.dropped,
        "cleared": status.cleared,
        "read": status.read,
        "altitudes": {
            "object": status.object_altitude.is_some().then(|| status.object_altitude.to_string()),
            "registry": status.registry_altitude.is_some().then(|| status.registry_altitude.to_string()),
        },
        "sequences_spent": status.sequences_spent,
        "pool_allocations": status.outstanding_allocations,
        "config": {
            "frames_to_skip": config.frames_to_skip,
            "frames_to_capture": config.frames_to_capture,
            "process_filter": config.process_filter,
            "timer_period_ms": config.timer_period_ms,
        },
        "sources": sources,
    })
}

/// `DisablePagingExecutive` and what it means for capture.
fn paging_executive(value: PagingExecutive) -> String {
    let consequence = if value.allows_elevated_walks() {
        "executive code stays resident, so stacks are also walked at DISPATCH_LEVEL and above (timer source \
         allowed). Meant for temporary diagnosis: remove the value and reboot when done"
    } else {
        "executive code may be paged out, so no stack is walked at DISPATCH_LEVEL or above (those events are \
         counted as skipped; the timer source is refused). For a diagnosis session set it to 1 and reboot"
    };
    match value {
        PagingExecutive::NotSet => format!("not set; {consequence}"),
        PagingExecutive::Value(number) => format!("{number}; {consequence}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::tests::sample_status;

    #[test]
    fn status_report_covers_every_source_and_counter() {
        let text = status(&sample_status());
        for source in Source::ALL {
            assert!(
                text.lines().any(|line| line.starts_with(source.name())),
                "{} missing:\n{text}",
                source.name()
            );
        }
        assert!(
            text.contains("3 of 8192 records in use, in 2 shards"),
            "{text}"
        );
        assert!(
            text.contains("7 captured = 4 read + 3 waiting + 0 dropped (ring full) + 0 cleared (7 sequence numbers spent)"),
            "{text}"
        );
        assert!(
            text.contains("kstack.sys loaded at 0x140000000, 0x30000 bytes"),
            "{text}"
        );
        assert!(
            text.contains("callback altitudes: object 385291, registry not registered"),
            "{text}"
        );
        assert!(
            text.contains("7 captured"),
            "sum of per-source counts:\n{text}"
        );
        assert!(
            text.contains("DisablePagingExecutive: not set; executive code may be paged out"),
            "{text}"
        );
    }

    #[test]
    fn status_json_has_every_source_and_the_paging_value() {
        let value = status_json(&sample_status());
        assert_eq!(value["sources"].as_array().unwrap().len(), Source::COUNT);
        assert_eq!(value["sources"][0]["name"], "process");
        assert_eq!(value["disable_paging_executive"], Value::Null);
        assert_eq!(value["ring"]["capacity"], 8192);
        assert_eq!(value["ring"]["shards"], 2);
        assert_eq!(value["sequences_spent"], 7);
        assert_eq!(value["read"], 4);
        assert_eq!(value["altitudes"]["object"], "385291");
        assert_eq!(value["altitudes"]["registry"], Value::Null);
        assert_eq!(value["sources"][6]["not_kept"], 0);
        assert_eq!(value["driver_image"]["base"], "0x140000000");
        assert_eq!(value["driver_image"]["size"], 0x3_0000);
    }

    #[test]
    fn paging_executive_1_is_described_as_allowing_elevated_walks() {
        let text = paging_executive(PagingExecutive::Value(1));
        assert!(
            text.starts_with("1; executive code stays resident"),
            "{text}"
        );
        assert!(
            paging_executive(PagingExecutive::Value(0))
                .starts_with("0; executive code may be paged out")
        );
    }
}
