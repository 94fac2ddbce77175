//! Human-readable reports.

use std::fmt::Write as _;

use kstack_abi::{
    ABI_VERSION, CaptureConfig, HostRoutine, KSTACK_VERSION, PagingExecutive, PagingInEffect,
    ProcessFilter, Source, StatusResponse, UserPart,
    host_routine::{APC_ROUTINE, APC_TAKE_BACK_ROUTINE, PROCESS_KEY_ROUTINE, USER_WALK_ROUTINE},
    paging::ASSUME_IN_EFFECT_VALUE,
};
use serde_json::{Value, json};

use crate::{capture::stack_table::counted, clock::system_time_text};

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
        "DisablePagingExecutive (as read at load): {}",
        paging_executive(status.paging_executive)
    );
    let _ = writeln!(
        out,
        "ring: {} waiting, {} of {} bytes in use, in {} (one per processor)",
        counted(u64::from(status.ring_used), "record"),
        status.ring_used_bytes,
        status.ring_capacity,
        counted(u64::from(status.ring_shards), "shard")
    );
    let table = status.stack_table;
    let _ = if table.entries == 0 {
        writeln!(out, "stack table: off (every record carries its frames)")
    } else {
        writeln!(
            out,
            "stack table: {} of {} entries used; {} hits, {} inserts ({} evictions); not tabled: \
             {} collisions, {} full, {} busy, {} without frames; {} stacks sent to readers",
            table.used,
            table.entries,
            table.hits,
            table.inserts,
            table.evictions,
            table.collisions,
            table.full,
            table.busy,
            table.empty,
            table.sent
        )
    };
    let sum = |count: fn(&kstack_abi::SourceStatus) -> u64| -> u64 {
        status.sources.iter().map(count).sum()
    };
    let _ = writeln!(
        out,
        "records: {} captured + {} module records = {} read + {} waiting + {} dropped (ring \
         full) + {} cleared ({} sequence numbers spent)",
        sum(|source| source.captured),
        status.module_records,
        status.read,
        status.ring_used,
        status.dropped,
        status.cleared,
        status.sequences_spent
    );
    let _ = writeln!(
        out,
        "not captured: {} filtered (process filter), {} sampled out, {} skipped (IRQL too high \
         for the paging policy), {} skipped (kernel stack below 8 KiB), {} not kept (source \
         disabled: capture-now answered only, thread captures delivered after)",
        sum(|source| source.filtered),
        sum(|source| source.sampled_out),
        sum(|source| source.skipped_irql),
        sum(|source| source.skipped_stack),
        sum(|source| source.not_kept)
    );
    let _ = writeln!(out, "{}", user_parts_text(status));
    let _ = writeln!(out, "{}", module_records_text(status));
    let _ = writeln!(out, "{}", thread_captures_text(status));
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
    let _ = writeln!(
        out,
        "capture: skip {} frames, keep up to {}, {}, {}; pool allocations held: {}",
        config.frames_to_skip,
        config.frames_to_capture,
        user_frames_text(config),
        processes_text(&config.processes),
        status.outstanding_allocations
    );
    source_table(&mut out, status);
    out
}

/// Which processes a filter keeps, in words.
#[must_use]
pub fn processes_text(filter: &ProcessFilter) -> String {
    let ids = |ids: &[u32]| {
        ids.iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    match (filter.include(), filter.exclude()) {
        ([], []) => "all processes".to_owned(),
        ([], exclude) => format!("all processes but {}", ids(exclude)),
        (include, []) => format!("processes {} only", ids(include)),
        (include, exclude) => format!(
            "processes {} only (and never {})",
            ids(include),
            ids(exclude)
        ),
    }
}

/// The user frames each source walks, in words: the count most sources
/// share, then the sources with another.
#[must_use]
pub fn user_frames_text(config: &CaptureConfig) -> String {
    let sharing = |count: u8| {
        Source::ALL
            .into_iter()
            .filter(|&source| config.user_frames(source) == count)
            .count()
    };
    let common = config
        .user_frames
        .iter()
        .copied()
        .max_by_key(|&count| (sharing(count), count))
        .unwrap_or(0);
    let words = |count: u8| {
        if count == 0 {
            "none".to_owned()
        } else {
            count.to_string()
        }
    };
    let others: Vec<String> = Source::ALL
        .into_iter()
        .filter(|&source| config.user_frames(source) != common)
        .map(|source| format!("{}: {}", source.name(), words(config.user_frames(source))))
        .collect();
    match (common, others.is_empty()) {
        (0, true) => "no user frames".to_owned(),
        (0, false) => format!("user frames only for {}", others.join(", ")),
        (_, true) => format!("user frames up to {common}"),
        (_, false) => format!("user frames up to {common} ({})", others.join(", ")),
    }
}

/// Whether user stacks can be walked, and what became of the user parts
/// of every record so far.
fn user_parts_text(status: &StatusResponse) -> String {
    let total = |part: UserPart| -> u64 {
        status
            .sources
            .iter()
            .map(|source| source.user_part(part))
            .sum()
    };
    let walk = routine_text(status.user_walk, USER_WALK_ROUTINE);
    let parts: Vec<String> = UserPart::ALL
        .into_iter()
        .map(|part| format!("{} {}", total(part), part.name().replace('_', " ")))
        .collect();
    format!("user frames: {walk}; user parts: {}", parts.join(", "))
}

/// Whether a routine the driver may not call is usable: "available", or
/// "unavailable (`routine` ...why)".
fn routine_text(state: HostRoutine, routine: &str) -> String {
    state.reason().map_or_else(
        || "available".to_owned(),
        |reason| format!("unavailable ({routine} {reason})"),
    )
}

/// The module records' line of the `kstack status` report.
fn module_records_text(status: &StatusResponse) -> String {
    format!(
        "module records: {} (image loads and process exits, for naming user frames); process \
         keys: {}",
        status.module_records,
        routine_text(status.process_key, PROCESS_KEY_ROUTINE)
    )
}

/// The thread captures' line of the `kstack status` report: whether APCs
/// can be queued, then every counter (their identities:
/// `kstack_abi::ThreadCaptureStatus`).
fn thread_captures_text(status: &StatusResponse) -> String {
    let captures = &status.thread_captures;
    format!(
        "thread captures: APCs {}, taken back at unload: {}; {} thread ids requested: {} queued, \
         {} no such thread, {} no free slot, {} not queued (thread exiting), {} system threads \
         refused, {} the requesting thread; queued: {} delivered ({} late), {} run down, {} in \
         flight (of {} slots)",
        routine_text(status.apc, APC_ROUTINE),
        routine_text(status.apc_take_back, APC_TAKE_BACK_ROUTINE),
        captures.requested,
        captures.queued,
        captures.no_such_thread,
        captures.no_slot,
        captures.not_queued,
        captures.refused_system_thread,
        captures.own,
        captures.delivered,
        captures.late,
        captures.run_down,
        captures.in_flight,
        captures.slots
    )
}

/// A routine's state in `kstack status --json`.
fn routine_json(state: HostRoutine, routine: &str) -> Value {
    json!({
        "available": state.reason().is_none(),
        "reason": state.reason().map(|reason| format!("{routine} {reason}")),
    })
}

/// The per-source part of the `kstack status` report: one line a source,
/// under 100 columns, then a line naming each source whose registration
/// status is not 0 (registered), with that status.
fn source_table(out: &mut String, status: &StatusResponse) {
    let config = &status.config;
    let _ = writeln!(
        out,
        "{:<11} {:<5} {:<7} {:>7} {:>10} {:>9} {:>11} {:>9} {:>10} {:>8}",
        "source",
        "avail",
        "enabled",
        "keep",
        "captured",
        "filtered",
        "sampled-out",
        "skip-irql",
        "skip-stack",
        "not-kept"
    );
    for source in Source::ALL {
        let state = &status.sources[source.index()];
        let _ = writeln!(
            out,
            "{:<11} {:<5} {:<7} {:>7} {:>10} {:>9} {:>11} {:>9} {:>10} {:>8}",
            source.name(),
            if state.available { "yes" } else { "no" },
            if config.sources.contains(source) {
                "yes"
            } else {
                "no"
            },
            format!("1/{}", config.sample_every(source)),
            state.captured,
            state.filtered,
            state.sampled_out,
            state.skipped_irql,
            state.skipped_stack,
            state.not_kept,
        );
    }
    let failed: Vec<String> = Source::ALL
        .into_iter()
        .filter(|source| status.sources[source.index()].registration != 0)
        .map(|source| {
            format!(
                "{} {:#010x}",
                source.name(),
                status.sources[source.index()].registration
            )
        })
        .collect();
    if !failed.is_empty() {
        let _ = writeln!(
            out,
            "registration, where not 0 (registered): {}",
            failed.join(", ")
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
                "sample_every": config.sample_every(source),
                "filtered": state.filtered,
                "sampled_out": state.sampled_out,
                "not_kept": state.not_kept,
                "user_frames": config.user_frames(source),
                "user_parts": UserPart::ALL
                    .into_iter()
                    .map(|part| (part.name().to_owned(), json!(state.user_part(part))))
                    .collect::<serde_json::Map<_, _>>(),
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
        "disable_paging_executive": status.paging_executive.configured,
        "paging_executive": {
            "configured": status.paging_executive.configured,
            "in_effect": status.paging_executive.allows_elevated_walks(),
            "decided_by": in_effect_name(status.paging_executive.in_effect),
            "override": status.paging_executive.override_set,
            "key_written": time_json(status.paging_executive.key_written),
            "boot_time": time_json(status.paging_executive.boot_time),
        },
        "elevated_walks_allowed": status.paging_executive.allows_elevated_walks(),
        "user_walk": routine_json(status.user_walk, USER_WALK_ROUTINE),
        "process_key": routine_json(status.process_key, PROCESS_KEY_ROUTINE),
        "module_records": status.module_records,
        "apc": routine_json(status.apc, APC_ROUTINE),
        "apc_take_back": routine_json(status.apc_take_back, APC_TAKE_BACK_ROUTINE),
        "thread_captures": thread_captures_json(&status.thread_captures),
        "ring": {
            "capacity_bytes": status.ring_capacity,
            "used": status.ring_used,
            "used_bytes": status.ring_used_bytes,
            "shards": status.ring_shards,
        },
        "stack_table": stack_table_json(&status.stack_table),
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
            "processes": {
                "include": config.processes.include(),
                "exclude": config.processes.exclude(),
            },
            "timer_period_ms": config.timer_period_ms,
        },
        "sources": sources,
    })
}

/// The stack table's part of `status --json`: `entries`, `used`, then
/// every counter by its name.
fn stack_table_json(table: &kstack_abi::StackTableStatus) -> Value {
    let mut value = json!({ "entries": table.entries, "used": table.used });
    for (name, count) in kstack_abi::StackTableStatus::COUNTER_NAMES
        .into_iter()
        .zip(table.counters())
    {
        value[name] = json!(count);
    }
    value
}

/// The thread captures' part of `status --json`: every field by its name.
fn thread_captures_json(captures: &kstack_abi::ThreadCaptureStatus) -> Value {
    kstack_abi::ThreadCaptureStatus::FIELD_NAMES
        .into_iter()
        .zip(captures.fields())
        .map(|(name, value)| (name.to_owned(), json!(value)))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// The JSON name of how "in effect" was decided.
const fn in_effect_name(in_effect: PagingInEffect) -> &'static str {
    match in_effect {
        PagingInEffect::NotConfigured => "not_configured",
        PagingInEffect::WrittenSinceBoot => "written_since_boot",
        PagingInEffect::Unknown => "unknown",
        PagingInEffect::BeforeBoot => "written_before_boot",
        PagingInEffect::AssumedByOverride => "override",
    }
}

/// A status time (100 ns since 1601, 0: unknown) in RFC 3339, if known.
fn known_time(filetime: u64) -> Option<String> {
    (filetime != 0)
        .then(|| system_time_text(filetime))
        .flatten()
}

/// A status time as JSON.
fn time_json(filetime: u64) -> Value {
    known_time(filetime).map_or(Value::Null, Value::from)
}

/// A status time as text.
fn time_text(filetime: u64) -> String {
    known_time(filetime).unwrap_or_else(|| "an unknown time".to_owned())
}

/// `DisablePagingExecutive`: configured, in effect, why, and what that
/// means for capture.
fn paging_executive(paging: PagingExecutive) -> String {
    let value = paging
        .configured
        .map_or_else(|| "not set".to_owned(), |value| value.to_string());
    let times = format!(
        "the Memory Management key was last written at {}, this boot at {}",
        time_text(paging.key_written),
        time_text(paging.boot_time)
    );
    let override_hint = format!(
        "if you did reboot with the value set, say so with \
         `reg add HKLM\\SYSTEM\\CurrentControlSet\\Services\\{service}\\{parameters} /v {ASSUME_IN_EFFECT_VALUE} \
         /t REG_DWORD /d 1 /f` and restart the driver",
        service = kstack_abi::SERVICE_NAME,
        parameters = kstack_abi::PARAMETERS_KEY,
    );
    let state = match paging.in_effect {
        PagingInEffect::NotConfigured if paging.override_set => format!(
            "not in effect ({ASSUME_IN_EFFECT_VALUE} is set but applies only to the value 1)"
        ),
        PagingInEffect::NotConfigured => "not in effect".to_owned(),
        PagingInEffect::WrittenSinceBoot => format!(
            "configured, NOT in effect: {times}, so the kernel may not have applied it (the value \
             applies from the next boot; Windows can also write to that key while it boots). Reboot; \
             {override_hint}"
        ),
        PagingInEffect::Unknown => format!(
            "configured, NOT in effect: the key's write time or the boot time could not be read, and \
             kstack then assumes not ({times}). {override_hint}"
        ),
        PagingInEffect::BeforeBoot => format!("in effect: {times}, before it"),
        PagingInEffect::AssumedByOverride => format!(
            "taken as in effect because {ASSUME_IN_EFFECT_VALUE}=1 says this boot applied it \
             ({times}); remove that value with DisablePagingExecutive"
        ),
    };
    let consequence = if paging.allows_elevated_walks() {
        "Executive code stays resident, so stacks are also walked at DISPATCH_LEVEL and above (timer \
         source allowed). Meant for temporary diagnosis: remove the value and reboot when done"
    } else if paging.configured == Some(1) {
        "Until it is, no stack is walked at DISPATCH_LEVEL or above (those events are counted as \
         skipped; the timer source is refused)"
    } else {
        "Executive code may be paged out, so no stack is walked at DISPATCH_LEVEL or above (those \
         events are counted as skipped; the timer source is refused). For a diagnosis session set it \
         to 1 and reboot"
    };
    format!("{value}, {state}. {consequence}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::test_support::sample_status;

    #[test]
    fn user_frame_settings_read_as_the_common_count_then_the_others() {
        let mut config = CaptureConfig::default();
        assert_eq!(
            user_frames_text(&config),
            "user frames only for registry: 30, ondemand: 30, threadstack: 30"
        );
        config.user_frames = [30, 30, 30, 20, 30, 0, 30, 30];
        assert_eq!(
            user_frames_text(&config),
            "user frames up to 30 (registry: 20, timer: none)"
        );
        config.user_frames = [0; Source::COUNT];
        assert_eq!(user_frames_text(&config), "no user frames");
        config.user_frames[Source::OnDemand.index()] = 62;
        assert_eq!(
            user_frames_text(&config),
            "user frames only for ondemand: 62"
        );
    }

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
            text.contains("ring: 3 records waiting, 288 of 8192 bytes in use, in 2 shards"),
            "{text}"
        );
        assert!(
            text.contains("7 captured + 2 module records = 6 read + 3 waiting + 0 dropped (ring full) + 0 cleared (9 sequence numbers spent)"),
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
            text.contains("not captured: 0 filtered (process filter), 7 sampled out, 0 skipped"),
            "{text}"
        );
        assert!(
            text.contains(
                "keep up to 32, user frames only for registry: 30, ondemand: 30, threadstack: 30, \
                 processes 4, 8 only (and never 0)"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "user frames: unavailable (RtlWalkFrameChain is exported by the host (Wine) only \
                 as a stub); user parts: 0 off, 0 captured,"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "module records: 2 (image loads and process exits, for naming user frames); \
                 process keys: unavailable (PsGetProcessCreateTimeQuadPart is exported by the \
                 host (Wine) only as a stub)"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "thread captures: APCs unavailable (KeInsertQueueApc is exported by the host \
                 (Wine) only as a stub), taken back at unload: unavailable (KeRemoveQueueApc is \
                 not exported by the kernel); 3 thread ids requested: 0 queued, 2 no such \
                 thread, 0 no free slot, 0 not queued (thread exiting), 0 system threads refused, \
                 1 the requesting thread; queued: 0 delivered (0 late), 0 run down, 0 in flight (of \
                 256 slots)"
            ),
            "{text}"
        );
        assert!(
            text.lines()
                .any(|line| line.starts_with("timer")
                    && line.split_whitespace().nth(3) == Some("1/10")),
            "timer keeps 1 in 10:\n{text}"
        );
        assert!(
            text.contains(
                "DisablePagingExecutive (as read at load): not set, not in effect. Executive code may be paged out"
            ),
            "{text}"
        );
    }

    #[test]
    fn status_json_has_every_source_and_the_paging_value() {
        let value = status_json(&sample_status());
        assert_eq!(value["sources"].as_array().unwrap().len(), Source::COUNT);
        assert_eq!(value["sources"][0]["name"], "process");
        assert_eq!(value["disable_paging_executive"], Value::Null);
        assert_eq!(value["ring"]["capacity_bytes"], 8192);
        assert_eq!(value["ring"]["used"], 3);
        assert_eq!(value["ring"]["used_bytes"], 288);
        assert_eq!(value["ring"]["shards"], 2);
        assert_eq!(value["sequences_spent"], 9);
        assert_eq!(value["read"], 6);
        assert_eq!(value["module_records"], 2);
        assert_eq!(value["process_key"]["available"], false);
        assert_eq!(
            value["process_key"]["reason"],
            "PsGetProcessCreateTimeQuadPart is exported by the host (Wine) only as a stub"
        );
        assert_eq!(value["altitudes"]["object"], "385291");
        assert_eq!(value["altitudes"]["registry"], Value::Null);
        assert_eq!(value["sources"][6]["not_kept"], 0);
        assert_eq!(value["sources"][0]["sampled_out"], 1);
        assert_eq!(value["sources"][5]["sample_every"], 10);
        assert_eq!(value["config"]["processes"]["include"], json!([4, 8]));
        assert_eq!(value["config"]["processes"]["exclude"], json!([0]));
        assert_eq!(value["driver_image"]["base"], "0x140000000");
        assert_eq!(value["driver_image"]["size"], 0x3_0000);
        assert_eq!(value["apc"]["available"], false);
        assert_eq!(
            value["apc"]["reason"],
            "KeInsertQueueApc is exported by the host (Wine) only as a stub"
        );
        assert_eq!(
            value["thread_captures"],
            json!({
                "requested": 3, "queued": 0, "no_such_thread": 2, "no_slot": 0, "not_queued": 0,
                "refused_system_thread": 0, "own": 1, "delivered": 0, "run_down": 0, "late": 0,
                "in_flight": 0, "slots": 256,
            })
        );
        assert_eq!(value["sources"][7]["name"], "threadstack");
    }

    #[test]
    fn every_paging_state_is_explained() {
        let written = 0x01DD_0000_0000_0000;
        let boot = written + 10_000_000;
        let before = paging_executive(PagingExecutive::decide(
            Some(1),
            Some(written),
            Some(boot),
            false,
        ));
        assert!(
            before.starts_with("1, in effect: the Memory Management key was last written at ")
                && before.contains("Executive code stays resident"),
            "{before}"
        );
        let since = paging_executive(PagingExecutive::decide(
            Some(1),
            Some(boot),
            Some(written),
            false,
        ));
        assert!(
            since.starts_with("1, configured, NOT in effect: ")
                && since.contains("Reboot")
                && since.contains(&format!("/v {ASSUME_IN_EFFECT_VALUE} /t REG_DWORD /d 1"))
                && since.contains("the timer source is refused"),
            "{since}"
        );
        let unknown = paging_executive(PagingExecutive::decide(Some(1), None, Some(boot), false));
        assert!(
            unknown.contains("could not be read") && unknown.contains("an unknown time"),
            "{unknown}"
        );
        let assumed = paging_executive(PagingExecutive::decide(
            Some(1),
            Some(boot),
            Some(written),
            true,
        ));
        assert!(
            assumed.starts_with(&format!(
                "1, taken as in effect because {ASSUME_IN_EFFECT_VALUE}=1"
            )) && assumed.contains("stays resident"),
            "{assumed}"
        );
        let zero = paging_executive(PagingExecutive::decide(Some(0), None, None, true));
        assert!(
            zero.starts_with(
                "0, not in effect (AssumePagingExecutiveInEffect is set but applies only"
            ) && zero.contains("may be paged out"),
            "{zero}"
        );
    }

    #[test]
    fn status_json_says_how_paging_was_decided() {
        let mut status = sample_status();
        let written = 0x01DD_0000_0000_0000;
        status.paging_executive =
            PagingExecutive::decide(Some(1), Some(written), Some(written + 1), false);
        let value = status_json(&status);
        assert_eq!(value["disable_paging_executive"], 1);
        assert_eq!(value["paging_executive"]["in_effect"], true);
        assert_eq!(
            value["paging_executive"]["decided_by"],
            "written_before_boot"
        );
        assert_eq!(value["paging_executive"]["override"], false);
        assert!(
            value["paging_executive"]["key_written"]
                .as_str()
                .unwrap()
                .ends_with('Z')
        );
        assert_eq!(value["elevated_walks_allowed"], true);
        status.paging_executive = PagingExecutive::NOT_SET;
        let value = status_json(&status);
        assert_eq!(value["paging_executive"]["decided_by"], "not_configured");
        assert_eq!(value["paging_executive"]["key_written"], Value::Null);
    }
}
