//! `kernel-host-abi`: kstack's ABI for the second kernel host's Python
//! harness (`tests/kernel_host/`, speakeasy with a modelled ntoskrnl), so
//! that no layout, code or limit is written a second time in Python.
//!
//! Protocol: one JSON object per line on stdin, one JSON object per line on
//! stdout (flushed after each), until EOF. Any bad request gets
//! `{"error":"..."}` and the next line is read. Byte strings are lower-case
//! hex (upper case is accepted); numbers are JSON numbers (u64 included).
//! Names are the Rust variant names in `snake_case` (`image_load`,
//! `before_boot`, `host_stub`), user parts their `UserPart::name`.
//!
//! - `{"op":"facts"}`: the control codes (`status`, `configure`, `read`,
//!   `clear`, `capture_now`, `capture_threads`, `inject`, `fault_probe`),
//!   the lengths (`min_read_buffer`, `max_record_size`, `status_size`,
//!   `fault_probe_reply_size`, `capture_threads_reply_size`,
//!   `max_input_length`), `fault_probe_mapped_value`,
//!   `max_thread_captures`, `thread_capture_slots`, `abi_version`,
//!   `sources` (names in `Source::ALL` order), `default_user_frames` by
//!   source name, and kstack's own `statuses` by their Rust names.
//! - `{"op":"configure", ...}`: keys `sources` (names), `user_frames` and
//!   `sample_every` (objects by source name), `timer_period_ms`, `include`,
//!   `exclude` (process ids), `frames_to_capture`, `frames_to_skip`, all
//!   optional over `CaptureConfig::default()`; `"validate": false` skips
//!   the field checks so a test can send what the driver must refuse.
//!   Reply: `{"input":"<hex>"}`.
//! - `{"op":"capture_now","tag":N}`, `{"op":"fault_probe","target":"mapped"}`
//!   and `{"op":"inject","source":NAME,"facts":{...}}` (the facts as
//!   `decode_read` writes them): `{"input":"<hex>"}`.
//! - `{"op":"capture_threads","tag":N,"timeout_ms":N,"thread_ids":[...]}`:
//!   `{"input":"<hex>"}`; `"validate": false` encodes the fields as given
//!   (a zero id, no ids, over 64 ids: `count` is their number, the first
//!   64 sent), so a test can send what the driver must refuse.
//! - `{"op":"decode_capture_threads_reply","reply":"<hex>","count":N}`:
//!   `{"outcomes":[...]}`, one outcome name per requested id.
//! - `{"op":"decode_status","reply":"<hex>"}`: every `StatusResponse`
//!   field under its Rust name, sources by name.
//! - `{"op":"decode_read","reply":"<hex>"}`: `{"header":{...},"entries":[...]}`,
//!   each entry a trace (`"kind":"trace"`) or module (`"kind":"module"`)
//!   record with every header field.
//! - `{"op":"decode_record","reply":"<hex>"}`: a capture-now reply, the one
//!   record as in `decode_read`'s entries.
//! - `sample_start`, `sample_tick`, `sample_answered`, `sample_read`,
//!   `sample_counts`: a sampling session of `kstack sample`'s sampler
//!   (`sampling.rs`).

mod sampling;

use std::{
    fmt::{Debug, Write as _},
    io::{self, BufRead, Write},
    process::ExitCode,
};

use kstack_abi::{
    ABI_VERSION, Altitude, CaptureConfig, CaptureThreadsReply, CaptureThreadsRequest, DriverImage,
    Entry, Ioctl, ModuleFlags, ModuleHeader, ModuleRecord, PagingExecutive, ProcessFilter,
    ReadHeader, RecordFlags, RecordHeader, RecordView, Source, SourceFacts, SourceStatus,
    StackTableStatus, StatusResponse, ThreadCaptureStatus, UserPart, decode_entry,
    ioctl::{FAULT_PROBE_CODE, INJECT_CODE, MAX_INPUT_LENGTH, MIN_READ_BUFFER},
    messages::{
        FAULT_PROBE_REPLY_SIZE, FaultProbe, STATUS_RESPONSE_SIZE, encode_capture_now_request,
        encode_configure_request, encode_fault_probe_request, encode_inject_request,
    },
    ntstatus,
    source_facts::{HandleOperation, Lifecycle, ObjectKind},
    thread_capture::{
        CAPTURE_THREADS_REPLY_SIZE, MAX_THREAD_CAPTURES, THREAD_CAPTURE_SLOTS,
        encode_capture_threads_request,
    },
};
use kstack_tests::stack_bounds;
use serde_json::{Map, Value, json};

/// What a request gets: its reply, or the text of `{"error": ...}`.
type Reply = Result<Value, String>;
/// A request's members.
type Request = Map<String, Value>;

fn main() -> ExitCode {
    match serve(io::stdin().lock(), io::stdout().lock()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("kernel-host-abi: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Answers every line of `input` with one line of `output` until EOF.
fn serve(input: impl BufRead, mut output: impl Write) -> io::Result<()> {
    let mut session = None;
    for line in input.lines() {
        let reply = answer(&line?, &mut session).unwrap_or_else(|error| json!({ "error": error }));
        writeln!(output, "{reply}")?;
        output.flush()?;
    }
    Ok(())
}

/// The reply to one request line; sampling ops keep their `session`.
fn answer(line: &str, session: &mut Option<sampling::Session>) -> Reply {
    let request: Value =
        serde_json::from_str(line).map_err(|error| format!("not JSON: {error}"))?;
    let Value::Object(request) = request else {
        return Err("a request is a JSON object".to_owned());
    };
    let op = request
        .get("op")
        .and_then(Value::as_str)
        .ok_or("a request needs an \"op\" string")?;
    if let Some(reply) = sampling::answer(op, &request, session) {
        return reply;
    }
    match op {
        "facts" => keys(&request, &[]).map(|()| facts()),
        "configure" => configure(&request).map(|bytes| input(&bytes)),
        "capture_now" => {
            keys(&request, &["tag"])?;
            let tag = number(field(&request, "tag")?, "tag")?;
            Ok(input(&encode_capture_now_request(tag)))
        }
        "fault_probe" => {
            keys(&request, &["target"])?;
            let target = named(&FaultProbe::ALL, field(&request, "target")?)?;
            Ok(input(&encode_fault_probe_request(target)))
        }
        "inject" => {
            keys(&request, &["source", "facts"])?;
            let source = named(&Source::ALL, field(&request, "source")?)?;
            let facts = parse_facts(source, field(&request, "facts")?)?;
            Ok(input(&encode_inject_request(&facts)))
        }
        "capture_threads" => capture_threads(&request).map(|bytes| input(&bytes)),
        "decode_capture_threads_reply" => {
            keys(&request, &["reply", "count"])?;
            let count = number(field(&request, "count")?, "count")?;
            let reply = CaptureThreadsReply::decode(&hex_field(&request, "reply")?, count)
                .map_err(|error| error.to_string())?;
            let outcomes: Vec<String> = reply.outcomes().iter().map(name_of).collect();
            Ok(json!({ "outcomes": outcomes }))
        }
        "decode_status" => {
            let bytes = reply_bytes(&request)?;
            let status = StatusResponse::decode(&bytes).map_err(|error| error.to_string())?;
            Ok(status_json(&status))
        }
        "decode_read" => decode_read(&reply_bytes(&request)?),
        "decode_record" => {
            let bytes = reply_bytes(&request)?;
            let (entry, size) = decode_entry(&bytes).map_err(|error| error.to_string())?;
            if size != bytes.len() {
                return Err(format!(
                    "the reply is {} bytes, its record {size}",
                    bytes.len()
                ));
            }
            Ok(entry_json(&entry))
        }
        other => Err(format!("unknown op {other:?}")),
    }
}

/// Refuses members other than `op` and `allowed`: a misspelt key would
/// otherwise leave a default in place unnoticed.
fn keys(request: &Request, allowed: &[&str]) -> Result<(), String> {
    match request
        .keys()
        .find(|key| *key != "op" && !allowed.contains(&key.as_str()))
    {
        Some(key) => Err(format!("unknown key {key:?} (this op takes {allowed:?})")),
        None => Ok(()),
    }
}

fn field<'a>(object: &'a Request, name: &str) -> Result<&'a Value, String> {
    object.get(name).ok_or_else(|| format!("missing {name:?}"))
}

/// A non-negative integer that fits `T`.
fn number<T: TryFrom<u64>>(value: &Value, what: &str) -> Result<T, String> {
    value
        .as_u64()
        .and_then(|value| T::try_from(value).ok())
        .ok_or_else(|| format!("{what}: {value} is not a {}", std::any::type_name::<T>()))
}

/// A fieldless enum value's name: its Rust name in `snake_case`.
fn name_of(value: impl Debug) -> String {
    let mut name = String::new();
    for (index, c) in format!("{value:?}").chars().enumerate() {
        if c.is_ascii_uppercase() && index > 0 {
            name.push('_');
        }
        name.push(c.to_ascii_lowercase());
    }
    name
}

/// The value of `all` that `value` names (see [`name_of`]).
fn named<T: Debug + Copy>(all: &[T], value: &Value) -> Result<T, String> {
    let names: Vec<String> = all.iter().map(name_of).collect();
    value
        .as_str()
        .and_then(|name| names.iter().position(|known| known == name))
        .map(|position| all[position])
        .ok_or_else(|| format!("{value} is none of {names:?}"))
}

/// `{"input": hex}`: a request's input buffer.
fn input(bytes: &[u8]) -> Value {
    let mut text = String::with_capacity(2 * bytes.len());
    for byte in bytes {
        let _ = write!(text, "{byte:02x}");
    }
    json!({ "input": text })
}

/// The bytes of the request's `reply` (hex), its only key.
fn reply_bytes(request: &Request) -> Result<Vec<u8>, String> {
    keys(request, &["reply"])?;
    hex_field(request, "reply")
}

/// The bytes of the request's member `name` (hex).
fn hex_field(request: &Request, name: &str) -> Result<Vec<u8>, String> {
    let text = field(request, name)?
        .as_str()
        .ok_or_else(|| format!("{name:?} is a hex string"))?;
    let nibble = |byte: u8| char::from(byte).to_digit(16);
    text.as_bytes()
        .chunks(2)
        .map(|pair| match *pair {
            [high, low] => u8::try_from(nibble(high)? * 16 + nibble(low)?).ok(),
            _ => None,
        })
        .collect::<Option<Vec<u8>>>()
        .ok_or_else(|| format!("{name:?} is not hex (two digits a byte)"))
}

/// `values`, one per source in [`Source::ALL`] order, as an object by name.
fn per_source<T: Copy + Into<Value>>(values: &[T; Source::COUNT]) -> Value {
    Source::ALL
        .into_iter()
        .map(|source| (name_of(source), values[source.index()].into()))
        .collect::<Map<_, _>>()
        .into()
}

/// An object by source name (a subset of them) into `values`.
fn set_per_source<T: TryFrom<u64>>(
    values: &mut [T; Source::COUNT],
    object: &Value,
    what: &str,
) -> Result<(), String> {
    let object = object
        .as_object()
        .ok_or_else(|| format!("{what} is an object by source name"))?;
    for (name, value) in object {
        let source = named(&Source::ALL, &Value::from(name.as_str()))?;
        values[source.index()] = number(value, &format!("{what}.{name}"))?;
    }
    Ok(())
}

fn ids(value: &Value, what: &str) -> Result<Vec<u32>, String> {
    value
        .as_array()
        .ok_or_else(|| format!("{what} is a list of process ids"))?
        .iter()
        .map(|id| number(id, what))
        .collect()
}

fn facts() -> Value {
    json!({
        "status": Ioctl::Status.code(),
        "configure": Ioctl::Configure.code(),
        "read": Ioctl::Read.code(),
        "clear": Ioctl::Clear.code(),
        "capture_now": Ioctl::CaptureNow.code(),
        "capture_threads": Ioctl::CaptureThreads.code(),
        "inject": INJECT_CODE,
        "fault_probe": FAULT_PROBE_CODE,
        "min_read_buffer": MIN_READ_BUFFER,
        "max_record_size": kstack_abi::MAX_RECORD_SIZE,
        "status_size": STATUS_RESPONSE_SIZE,
        "fault_probe_reply_size": FAULT_PROBE_REPLY_SIZE,
        "fault_probe_mapped_value": FaultProbe::MAPPED_VALUE,
        "capture_threads_reply_size": CAPTURE_THREADS_REPLY_SIZE,
        "max_thread_captures": MAX_THREAD_CAPTURES,
        "thread_capture_slots": THREAD_CAPTURE_SLOTS,
        "max_input_length": MAX_INPUT_LENGTH,
        "abi_version": ABI_VERSION,
        "sources": Source::ALL.map(name_of),
        "default_user_frames": per_source(&CaptureConfig::default().user_frames),
        "min_remaining_stack": kstack_driver_core::kernel_stack::MIN_REMAINING_STACK,
        "stack_bounds": {
            "callback_path": stack_bounds::CALLBACK_PATH_BOUND,
            "capture_now_path": stack_bounds::CAPTURE_NOW_PATH_BOUND,
            "user_walk_own": stack_bounds::USER_WALK_OWN_BOUND,
        },
        "statuses": {
            "STATUS_NOT_SUPPORTED": unsigned(ntstatus::STATUS_NOT_SUPPORTED),
            "KSTACK_STATUS_PAGING_EXECUTIVE_REQUIRED": unsigned(ntstatus::KSTACK_STATUS_PAGING_EXECUTIVE_REQUIRED),
            "KSTACK_STATUS_STACK_TOO_LOW": unsigned(ntstatus::KSTACK_STATUS_STACK_TOO_LOW),
            "KSTACK_STATUS_SOURCE_DISABLED": unsigned(ntstatus::KSTACK_STATUS_SOURCE_DISABLED),
            "KSTACK_STATUS_NO_APC": unsigned(ntstatus::KSTACK_STATUS_NO_APC),
        },
    })
}

/// An NTSTATUS as the 32 bits a completed IRP's `IoStatus.Status` holds.
fn unsigned(status: ntstatus::NtStatus) -> u32 {
    u32::from_ne_bytes(status.to_ne_bytes())
}

/// The configure request's input for the request's settings.
fn configure(request: &Request) -> Result<Vec<u8>, String> {
    keys(
        request,
        &[
            "sources",
            "user_frames",
            "sample_every",
            "timer_period_ms",
            "include",
            "exclude",
            "frames_to_capture",
            "frames_to_skip",
            "validate",
        ],
    )?;
    let mut config = CaptureConfig::default();
    for (key, value) in request {
        match key.as_str() {
            "sources" => {
                config.sources = value
                    .as_array()
                    .ok_or("sources is a list of source names")?
                    .iter()
                    .map(|name| named(&Source::ALL, name))
                    .collect::<Result<_, _>>()?;
            }
            "user_frames" => set_per_source(&mut config.user_frames, value, key)?,
            "sample_every" => set_per_source(&mut config.sample_every, value, key)?,
            "timer_period_ms" => config.timer_period_ms = number(value, key)?,
            "frames_to_capture" => config.frames_to_capture = number(value, key)?,
            "frames_to_skip" => config.frames_to_skip = number(value, key)?,
            _ => {}
        }
    }
    let list = |key| {
        request
            .get(key)
            .map_or(Ok(Vec::new()), |value| ids(value, key))
    };
    config.processes = ProcessFilter::new(&list("include")?, &list("exclude")?)
        .map_err(|error| error.to_string())?;
    if validate(request)? {
        config.validate().map_err(|error| error.to_string())?;
    }
    Ok(encode_configure_request(&config).to_vec())
}

/// The capture-threads request's input for the request's `tag`,
/// `timeout_ms` and `thread_ids`, checked unless `"validate": false`.
fn capture_threads(request: &Request) -> Result<Vec<u8>, String> {
    keys(request, &["tag", "timeout_ms", "thread_ids", "validate"])?;
    let thread_ids = field(request, "thread_ids")?
        .as_array()
        .ok_or("thread_ids is a list of thread ids")?
        .iter()
        .map(|id| number(id, "thread_ids"))
        .collect::<Result<Vec<u32>, _>>()?;
    let request_fields = CaptureThreadsRequest::unchecked(
        number(field(request, "tag")?, "tag")?,
        number(field(request, "timeout_ms")?, "timeout_ms")?,
        &thread_ids,
    );
    if validate(request)? {
        request_fields
            .validate()
            .map_err(|error| error.to_string())?;
    }
    Ok(encode_capture_threads_request(&request_fields).to_vec())
}

/// The request's `validate` member: true when absent.
fn validate(request: &Request) -> Result<bool, String> {
    match request.get("validate") {
        None => Ok(true),
        Some(Value::Bool(validate)) => Ok(*validate),
        Some(other) => Err(format!("validate: {other} is not a boolean")),
    }
}

/// The JSON object of `$value`'s fields, each under its Rust name: as it
/// is, or as `field => expression of field` makes it. The pattern is
/// exhaustive, so a field added to the ABI type stops the build here.
macro_rules! fields_json {
    ($value:expr, $type:ident { $($field:ident $(=> $convert:expr)?),+ $(,)? }) => {{
        let $type { $($field),+ } = $value;
        let mut object = Map::new();
        $(
            let value = fields_json!(@one $field $(, $convert)?);
            object.insert(stringify!($field).to_owned(), json!(value));
        )+
        Value::Object(object)
    }};
    (@one $field:ident) => { $field };
    (@one $field:ident, $convert:expr) => { $convert };
}

/// Every field of the status, under its Rust name, and `abi_version`.
fn status_json(status: &StatusResponse) -> Value {
    let altitude = |altitude: &Altitude| fields_json!(altitude, Altitude { whole, fraction });
    let mut value = fields_json!(status, StatusResponse {
        driver_version,
        paging_executive => paging_json(paging_executive),
        ring_capacity,
        ring_used,
        ring_used_bytes,
        ring_shards,
        outstanding_allocations,
        config => config_json(config),
        dropped,
        cleared,
        read,
        sequences_spent,
        sources => Source::ALL
            .into_iter()
            .map(|source| (name_of(source), source_status_json(&sources[source.index()])))
            .collect::<Map<_, _>>(),
        driver_image => fields_json!(driver_image, DriverImage { base, size }),
        object_altitude => altitude(object_altitude),
        registry_altitude => altitude(registry_altitude),
        stack_table => fields_json!(stack_table, StackTableStatus {
            entries,
            used,
            hits,
            inserts,
            evictions,
            collisions,
            full,
            busy,
            empty,
            sent,
        }),
        user_walk => name_of(user_walk),
        process_key => name_of(process_key),
        module_records,
        apc => name_of(apc),
        apc_take_back => name_of(apc_take_back),
        thread_captures => fields_json!(thread_captures, ThreadCaptureStatus {
            requested,
            queued,
            no_such_thread,
            no_slot,
            not_queued,
            refused_system_thread,
            own,
            delivered,
            run_down,
            late,
            in_flight,
            slots,
        }),
    });
    value["abi_version"] = ABI_VERSION.into();
    value
}

/// The paging fields, the state by name, and whether it allows walks at
/// `DISPATCH_LEVEL`.
fn paging_json(paging: &PagingExecutive) -> Value {
    let mut value = fields_json!(paging, PagingExecutive {
        configured,
        in_effect => name_of(in_effect),
        override_set,
        key_written,
        boot_time,
    });
    value["allows_elevated_walks"] = paging.allows_elevated_walks().into();
    value
}

fn config_json(config: &CaptureConfig) -> Value {
    fields_json!(config, CaptureConfig {
        sources => sources.iter().map(name_of).collect::<Vec<_>>(),
        frames_to_skip,
        frames_to_capture,
        processes => json!({ "include": processes.include(), "exclude": processes.exclude() }),
        sample_every => per_source(sample_every),
        timer_period_ms,
        user_frames => per_source(user_frames),
    })
}

fn source_status_json(status: &SourceStatus) -> Value {
    fields_json!(status, SourceStatus {
        registration,
        available,
        captured,
        skipped_irql,
        skipped_stack,
        filtered,
        not_kept,
        sampled_out,
        user_parts => UserPart::ALL
            .into_iter()
            .map(|part| (part.name().to_owned(), user_parts[part.index()].into()))
            .collect::<Map<_, Value>>(),
    })
}

/// A read reply: its header, and every record its payload holds, which
/// must be as many as the header declares.
fn decode_read(bytes: &[u8]) -> Reply {
    let (header, records) = ReadHeader::decode(bytes).map_err(|error| error.to_string())?;
    let entries = records
        .map(|entry| entry.map(|entry| entry_json(&entry)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| error.to_string())?;
    if usize::try_from(header.record_count).ok() != Some(entries.len()) {
        return Err(format!(
            "the read header declares {} records, its payload holds {}",
            header.record_count,
            entries.len()
        ));
    }
    let header = fields_json!(
        header,
        ReadHeader {
            record_count,
            payload_bytes,
            more_pending,
            dropped,
        }
    );
    Ok(json!({ "header": header, "entries": entries }))
}

/// The names of the flags set, from `table`.
fn flag_names<F: Copy>(
    table: &[(F, &'static str)],
    is_set: impl Fn(F) -> bool,
) -> Vec<&'static str> {
    table
        .iter()
        .filter(|&&(flag, _)| is_set(flag))
        .map(|&(_, name)| name)
        .collect()
}

const RECORD_FLAGS: [(RecordFlags, &str); 4] = [
    (RecordFlags::TRUNCATED, "truncated"),
    (RecordFlags::NOT_IN_RING, "not_in_ring"),
    (RecordFlags::STACK_BY_ID, "stack_by_id"),
    (RecordFlags::WOW64, "wow64"),
];
const MODULE_FLAGS: [(ModuleFlags, &str); 1] = [(ModuleFlags::PATH_TRUNCATED, "path_truncated")];

fn entry_json(entry: &Entry<'_>) -> Value {
    match entry {
        Entry::Trace(record) => trace_json(record),
        Entry::Module(record) => module_json(record),
    }
}

/// A trace record: its header's fields, its source, and its frames.
fn trace_json(record: &RecordView<'_>) -> Value {
    let mut value = fields_json!(record.header, RecordHeader {
        sequence,
        timestamp,
        process_id,
        thread_id,
        processor,
        shard,
        irql,
        flags => flag_names(&RECORD_FLAGS, |flag| flags.contains(flag)),
        user_frame_count,
        user_part => user_part.name(),
        os_hash,
        stack_id,
        facts => facts_json(&facts),
    });
    value["kind"] = "trace".into();
    value["source"] = name_of(record.source()).into();
    value["frames"] = record.frames().collect::<Vec<_>>().into();
    value["frame_count"] = record.frame_count().into();
    value["kernel_frames"] = record.kernel_frame_count().into();
    value
}

/// A module record: its header's fields and its path.
fn module_json(record: &ModuleRecord<'_>) -> Value {
    let mut value = fields_json!(record.header, ModuleHeader {
        sequence,
        timestamp,
        process_id,
        thread_id,
        processor,
        shard,
        event => name_of(event),
        flags => flag_names(&MODULE_FLAGS, |flag| flags.contains(flag)),
        image_base,
        image_size,
        process_key,
    });
    value["kind"] = "module".into();
    value["path"] = String::from_utf16_lossy(&record.path_units().collect::<Vec<_>>()).into();
    value
}

/// A record's facts under their Rust field names; [`parse_facts`] reads
/// them back.
fn facts_json(facts: &SourceFacts) -> Value {
    match *facts {
        SourceFacts::Process {
            event,
            process_id,
            parent_process_id,
        } => json!({
            "event": name_of(event),
            "process_id": process_id,
            "parent_process_id": parent_process_id,
        }),
        SourceFacts::Thread {
            event,
            process_id,
            thread_id,
        } => json!({ "event": name_of(event), "process_id": process_id, "thread_id": thread_id }),
        SourceFacts::ImageLoad {
            image_base,
            image_size,
            process_id,
        } => {
            json!({ "image_base": image_base, "image_size": image_size, "process_id": process_id })
        }
        SourceFacts::Registry { notify_class } => json!({ "notify_class": notify_class }),
        SourceFacts::ObjectHandle {
            operation,
            object,
            desired_access,
            target_process_id,
        } => json!({
            "operation": name_of(operation),
            "object": name_of(object),
            "desired_access": desired_access,
            "target_process_id": target_process_id,
        }),
        SourceFacts::Timer => json!({}),
        SourceFacts::OnDemand { tag } => json!({ "tag": tag }),
        SourceFacts::ThreadStack {
            target_process_id,
            target_thread_id,
            tag,
            delay,
            late,
        } => json!({
            "target_process_id": target_process_id,
            "target_thread_id": target_thread_id,
            "tag": tag,
            "delay": delay,
            "late": late,
        }),
    }
}

/// `source`'s facts from the object [`facts_json`] writes, which must hold
/// exactly their fields.
fn parse_facts(source: Source, value: &Value) -> Result<SourceFacts, String> {
    let object = value.as_object().ok_or("facts is an object")?;
    let get = |name: &str| field(object, name);
    let id = |name: &str| number::<u32>(get(name)?, name);
    let lifecycle = || named(&[Lifecycle::Create, Lifecycle::Exit], get("event")?);
    let facts = match source {
        Source::Process => SourceFacts::Process {
            event: lifecycle()?,
            process_id: id("process_id")?,
            parent_process_id: id("parent_process_id")?,
        },
        Source::Thread => SourceFacts::Thread {
            event: lifecycle()?,
            process_id: id("process_id")?,
            thread_id: id("thread_id")?,
        },
        Source::ImageLoad => SourceFacts::ImageLoad {
            image_base: number(get("image_base")?, "image_base")?,
            image_size: number(get("image_size")?, "image_size")?,
            process_id: id("process_id")?,
        },
        Source::Registry => SourceFacts::Registry {
            notify_class: id("notify_class")?,
        },
        Source::ObjectHandle => SourceFacts::ObjectHandle {
            operation: named(
                &[HandleOperation::Create, HandleOperation::Duplicate],
                get("operation")?,
            )?,
            object: named(&[ObjectKind::Process, ObjectKind::Thread], get("object")?)?,
            desired_access: id("desired_access")?,
            target_process_id: id("target_process_id")?,
        },
        Source::Timer => SourceFacts::Timer,
        Source::OnDemand => SourceFacts::OnDemand {
            tag: number(get("tag")?, "tag")?,
        },
        Source::ThreadStack => SourceFacts::ThreadStack {
            target_process_id: id("target_process_id")?,
            target_thread_id: id("target_thread_id")?,
            tag: number(get("tag")?, "tag")?,
            delay: id("delay")?,
            late: get("late")?.as_bool().ok_or("late is a boolean")?,
        },
    };
    // Every key was read above, so a key left over is one the source lacks.
    let known = facts_json(&facts);
    match object.keys().find(|key| known.get(key.as_str()).is_none()) {
        Some(key) => Err(format!("{} facts have no {key:?}", name_of(source))),
        None => Ok(facts),
    }
}

#[cfg(test)]
mod tests {
    use kstack_abi::{
        CaptureThreadsError, ConfigError, DecodeError, HostRoutine, MAX_RECORD_SIZE, ModuleEvent,
        ThreadRequestOutcome,
        config::DEFAULT_USER_FRAMES,
        encode_record,
        messages::{
            decode_capture_now_request, decode_configure_request, decode_fault_probe_request,
            decode_inject_request,
        },
        module_record::encode_module_record,
        stack_id,
        thread_capture::decode_capture_threads_request,
    };
    use kstack_client::device::test_support::{read_reply, record_bytes, sample_status};

    use super::*;

    /// The reply to `request`, which must not be an error.
    fn ask(request: &Value) -> Value {
        answer(&request.to_string(), &mut None).unwrap_or_else(|error| panic!("{request}: {error}"))
    }

    /// The error `request` gets.
    fn refused(request: &Value) -> String {
        answer(&request.to_string(), &mut None).expect_err("an error")
    }

    fn hex(bytes: &[u8]) -> Value {
        input(bytes)["input"].clone()
    }

    /// The bytes of an `{"input": hex}` reply.
    fn input_bytes(reply: &Value) -> Vec<u8> {
        let request = json!({ "reply": reply["input"] });
        reply_bytes(request.as_object().unwrap()).unwrap()
    }

    #[test]
    fn facts_are_the_abi_s_codes_lengths_and_sources() {
        let value = ask(&json!({"op": "facts"}));
        let codes = [
            "status",
            "configure",
            "read",
            "clear",
            "capture_now",
            "capture_threads",
        ];
        assert_eq!(codes.len(), Ioctl::ALL.len());
        for (ioctl, key) in Ioctl::ALL.into_iter().zip(codes) {
            assert_eq!(value[key], ioctl.code(), "{key}");
        }
        assert_eq!(value["inject"], INJECT_CODE);
        assert_eq!(value["fault_probe"], FAULT_PROBE_CODE);
        assert_eq!(value["min_read_buffer"], 592);
        assert_eq!(value["status_size"], 1648);
        assert_eq!(value["max_input_length"], 280);
        assert_eq!(value["capture_threads_reply_size"], 64);
        assert_eq!(value["max_thread_captures"], 64);
        assert_eq!(value["thread_capture_slots"], 256);
        assert_eq!(
            value["sources"],
            json!([
                "process",
                "thread",
                "image_load",
                "registry",
                "object_handle",
                "timer",
                "on_demand",
                "thread_stack"
            ])
        );
        assert_eq!(
            value["statuses"]["KSTACK_STATUS_SOURCE_DISABLED"],
            0xE0B5_0004_u32
        );
        assert_eq!(value["statuses"]["KSTACK_STATUS_NO_APC"], 0xE0B5_0005_u32);
        assert_eq!(
            value["default_user_frames"]["registry"],
            DEFAULT_USER_FRAMES
        );
        assert_eq!(value["default_user_frames"]["image_load"], 0);
        assert_eq!(
            value["default_user_frames"]["thread_stack"],
            DEFAULT_USER_FRAMES
        );
        assert!(refused(&json!({"op": "facts", "extra": 1})).contains("extra"));
    }

    #[test]
    fn configure_encodes_every_setting_over_the_default() {
        let reply = ask(&json!({
            "op": "configure",
            "sources": ["registry", "process"],
            "user_frames": {"image_load": 5},
            "sample_every": {"thread": 3},
            "timer_period_ms": 20,
            "include": [4, 8],
            "exclude": [12],
            "frames_to_capture": 16,
            "frames_to_skip": 1,
        }));
        let mut expected = CaptureConfig {
            sources: [Source::Registry, Source::Process].into_iter().collect(),
            frames_to_skip: 1,
            frames_to_capture: 16,
            processes: ProcessFilter::new(&[4, 8], &[12]).unwrap(),
            timer_period_ms: 20,
            ..CaptureConfig::default()
        };
        expected.user_frames[Source::ImageLoad.index()] = 5;
        expected.sample_every[Source::Thread.index()] = 3;
        assert_eq!(decode_configure_request(&input_bytes(&reply)), Ok(expected));
        let reply = ask(&json!({"op": "configure"}));
        assert_eq!(
            decode_configure_request(&input_bytes(&reply)),
            Ok(CaptureConfig::default())
        );
    }

    #[test]
    fn configure_refuses_what_the_abi_refuses_unless_told_not_to_check() {
        let timer_walk = json!({"op": "configure", "user_frames": {"timer": 1}});
        let error = ConfigError::UserFrames {
            source: Source::Timer,
            value: 1,
        };
        assert_eq!(refused(&timer_walk), error.to_string());
        let mut unchecked = timer_walk;
        unchecked["validate"] = json!(false);
        assert_eq!(
            decode_configure_request(&input_bytes(&ask(&unchecked))),
            Err(DecodeError::Config(error))
        );
        assert_eq!(
            refused(&json!({"op": "configure", "include": [4], "exclude": [4]})),
            ConfigError::Processes.to_string()
        );
        for (request, names) in [
            (json!({"op": "configure", "user_frame": {}}), "user_frame"),
            (
                json!({"op": "configure", "sources": ["image"]}),
                "image_load",
            ),
            (
                json!({"op": "configure", "user_frames": {"timer": 256}}),
                "256",
            ),
            (json!({"op": "configure", "validate": "no"}), "boolean"),
        ] {
            let error = refused(&request);
            assert!(error.contains(names), "{request}: {error}");
        }
    }

    #[test]
    fn requests_with_a_payload_encode_it() {
        let reply = ask(&json!({"op": "capture_now", "tag": u64::MAX}));
        assert_eq!(
            decode_capture_now_request(&input_bytes(&reply)),
            Ok(u64::MAX)
        );
        for target in FaultProbe::ALL {
            let reply = ask(&json!({"op": "fault_probe", "target": name_of(target)}));
            assert_eq!(decode_fault_probe_request(&input_bytes(&reply)), Ok(target));
        }
        assert!(refused(&json!({"op": "fault_probe", "target": "elsewhere"})).contains("unmapped"));
        let every_source = [
            SourceFacts::Process {
                event: Lifecycle::Exit,
                process_id: 4,
                parent_process_id: 0,
            },
            SourceFacts::Thread {
                event: Lifecycle::Create,
                process_id: 4,
                thread_id: 8,
            },
            SourceFacts::ImageLoad {
                image_base: 1 << 40,
                image_size: 4096,
                process_id: 12,
            },
            SourceFacts::Registry { notify_class: 5 },
            SourceFacts::ObjectHandle {
                operation: HandleOperation::Duplicate,
                object: ObjectKind::Thread,
                desired_access: 0x1F_FFFF,
                target_process_id: 16,
            },
            SourceFacts::Timer,
            SourceFacts::OnDemand { tag: 99 },
            SourceFacts::ThreadStack {
                target_process_id: 4,
                target_thread_id: 8,
                tag: u64::MAX,
                delay: 12,
                late: true,
            },
        ];
        for facts in every_source {
            let source = name_of(facts.source());
            let reply =
                ask(&json!({"op": "inject", "source": source, "facts": facts_json(&facts)}));
            assert_eq!(decode_inject_request(&input_bytes(&reply)), Ok(facts));
        }
        let extra = json!({"op": "inject", "source": "timer", "facts": {"tag": 1}});
        assert!(refused(&extra).contains("tag"));
        let missing = json!({"op": "inject", "source": "registry", "facts": {}});
        assert!(refused(&missing).contains("notify_class"));
    }

    #[test]
    fn capture_threads_encodes_its_request_and_refuses_what_the_abi_refuses() {
        let reply = ask(&json!({
            "op": "capture_threads", "tag": u64::MAX, "timeout_ms": 60_000, "thread_ids": [8, 12, 8],
        }));
        assert_eq!(
            decode_capture_threads_request(&input_bytes(&reply)),
            Ok(CaptureThreadsRequest::new(u64::MAX, 60_000, &[8, 12, 8]).unwrap())
        );
        let zero_id =
            json!({"op": "capture_threads", "tag": 1, "timeout_ms": 5, "thread_ids": [8, 0]});
        let error = CaptureThreadsError::ZeroThreadId { index: 1 };
        assert_eq!(refused(&zero_id), error.to_string());
        let mut unchecked = zero_id;
        unchecked["validate"] = json!(false);
        assert_eq!(
            decode_capture_threads_request(&input_bytes(&ask(&unchecked))),
            Err(DecodeError::CaptureThreads(error))
        );
        let too_many: Vec<u32> = (1..=65).collect();
        let unchecked = json!({
            "op": "capture_threads", "tag": 1, "timeout_ms": 5, "thread_ids": too_many,
            "validate": false,
        });
        assert_eq!(
            decode_capture_threads_request(&input_bytes(&ask(&unchecked))),
            Err(DecodeError::CaptureThreads(CaptureThreadsError::Count {
                count: 65
            }))
        );
        for (request, names) in [
            (
                json!({"op": "capture_threads", "tag": 1, "timeout_ms": 0, "thread_ids": [8]}),
                "timeout",
            ),
            (
                json!({"op": "capture_threads", "tag": 1, "timeout_ms": 5, "thread_ids": []}),
                "0 thread ids",
            ),
            (
                json!({"op": "capture_threads", "tag": 1, "timeout_ms": 5, "thread_ids": [-1]}),
                "thread_ids",
            ),
            (
                json!({"op": "capture_threads", "tag": 1, "timeout_ms": 5, "thread_id": [8]}),
                "unknown key",
            ),
            (
                json!({"op": "capture_threads", "tag": 1, "thread_ids": [8]}),
                "timeout_ms",
            ),
        ] {
            let error = refused(&request);
            assert!(error.contains(names), "{request}: {error}");
        }
    }

    #[test]
    fn decode_capture_threads_reply_names_each_outcome_in_request_order() {
        let outcomes = [
            ThreadRequestOutcome::Own,
            ThreadRequestOutcome::Queued,
            ThreadRequestOutcome::NoSuchThread,
            ThreadRequestOutcome::NoSlot,
            ThreadRequestOutcome::NotQueued,
            ThreadRequestOutcome::SystemThread,
        ];
        let mut reply = [0_u8; CAPTURE_THREADS_REPLY_SIZE];
        CaptureThreadsReply::new(&outcomes)
            .unwrap()
            .encode(&mut reply);
        let value =
            ask(&json!({"op": "decode_capture_threads_reply", "reply": hex(&reply), "count": 6}));
        assert_eq!(
            value,
            json!({"outcomes": ["own", "queued", "no_such_thread", "no_slot", "not_queued", "system_thread"]})
        );
        let error = refused(
            &json!({"op": "decode_capture_threads_reply", "reply": hex(&reply), "count": 5}),
        );
        assert!(error.contains("byte 5"), "{error}");
        let error = refused(
            &json!({"op": "decode_capture_threads_reply", "reply": hex(&reply[..63]), "count": 6}),
        );
        assert!(error.contains("63 bytes"), "{error}");
        let error = refused(&json!({"op": "decode_capture_threads_reply", "reply": hex(&reply)}));
        assert!(error.contains("count"), "{error}");
    }

    /// The client's sample status with a proven paging state, both
    /// routine states, and every counter of every source its own value, so
    /// that a mix-up shows.
    fn distinct_status() -> StatusResponse {
        let mut status = sample_status();
        status.paging_executive = PagingExecutive::decide(Some(1), Some(5), Some(9), true);
        status.process_key = HostRoutine::NotExported;
        status.registry_altitude = Altitude {
            whole: 385_290,
            fraction: 3,
        };
        status.stack_table.sent = u64::MAX;
        status.apc = HostRoutine::Available;
        status.thread_captures =
            ThreadCaptureStatus::from_fields(core::array::from_fn(|field| 300 + field as u64));
        let mut next = 100_u64;
        for source in &mut status.sources {
            let mut count = || {
                next += 1;
                next
            };
            source.registration = -1_073_741_637;
            source.captured = count();
            source.skipped_irql = count();
            source.skipped_stack = count();
            source.filtered = count();
            source.not_kept = count();
            source.sampled_out = count();
            source.user_parts = [(); UserPart::COUNT].map(|()| count());
        }
        status
    }

    /// The bridge's reading of `status`.
    fn decode_status(status: &StatusResponse) -> Value {
        let mut bytes = [0_u8; STATUS_RESPONSE_SIZE];
        status.encode(&mut bytes);
        ask(&json!({"op": "decode_status", "reply": hex(&bytes)}))
    }

    #[test]
    fn decode_status_gives_every_field_by_its_rust_name() {
        let status = distinct_status();
        let value = decode_status(&status);

        assert_eq!(
            value.as_object().unwrap().len(),
            24,
            "23 fields and abi_version"
        );
        assert_eq!(value["abi_version"], ABI_VERSION);
        assert_eq!(value["driver_version"], json!([0, 1, 0]));
        assert_eq!(
            value["paging_executive"],
            json!({
                "configured": 1,
                "in_effect": "before_boot",
                "override_set": true,
                "key_written": 5,
                "boot_time": 9,
                "allows_elevated_walks": true,
            })
        );
        for (key, expected) in [
            ("ring_capacity", u64::from(status.ring_capacity)),
            ("ring_used", status.ring_used.into()),
            ("ring_used_bytes", status.ring_used_bytes.into()),
            ("ring_shards", status.ring_shards.into()),
            (
                "outstanding_allocations",
                status.outstanding_allocations.into(),
            ),
            ("dropped", status.dropped),
            ("cleared", status.cleared),
            ("read", status.read),
            ("sequences_spent", status.sequences_spent),
            ("module_records", status.module_records),
        ] {
            assert_eq!(value[key], expected, "{key}");
        }
        let config = &value["config"];
        assert_eq!(
            config["processes"],
            json!({"include": [4, 8], "exclude": [0]})
        );
        assert_eq!(config["sample_every"]["timer"], 10);
        assert_eq!(config["user_frames"]["on_demand"], DEFAULT_USER_FRAMES);
        assert_eq!(config["sources"], json!([]));
        assert_eq!(
            value["driver_image"],
            json!({"base": 0x1_4000_0000_u64, "size": 0x3_0000})
        );
        assert_eq!(
            value["object_altitude"],
            json!({"whole": 385_291, "fraction": 0})
        );
        assert_eq!(
            value["registry_altitude"],
            json!({"whole": 385_290, "fraction": 3})
        );
        let table = &value["stack_table"];
        assert_eq!(
            (table["entries"].clone(), table["used"].clone()),
            (json!(4096), json!(3))
        );
        for (name, count) in StackTableStatus::COUNTER_NAMES
            .into_iter()
            .zip(status.stack_table.counters())
        {
            assert_eq!(table[name], count, "{name}");
        }
        assert_eq!(value["user_walk"], "host_stub");
        assert_eq!(value["process_key"], "not_exported");
        assert_eq!(value["apc"], "available");
        for (name, count) in ThreadCaptureStatus::FIELD_NAMES
            .into_iter()
            .zip(status.thread_captures.fields())
        {
            assert_eq!(value["thread_captures"][name], count, "{name}");
        }
        assert_eq!(value["thread_captures"].as_object().unwrap().len(), 12);
    }

    #[test]
    fn decode_status_gives_every_source_counter_by_name() {
        let status = distinct_status();
        let value = decode_status(&status);
        for source in Source::ALL {
            let (state, json) = (
                &status.sources[source.index()],
                &value["sources"][name_of(source)],
            );
            assert_eq!(json["registration"], state.registration);
            assert_eq!(json["available"], state.available);
            for (key, count) in [
                ("captured", state.captured),
                ("skipped_irql", state.skipped_irql),
                ("skipped_stack", state.skipped_stack),
                ("filtered", state.filtered),
                ("not_kept", state.not_kept),
                ("sampled_out", state.sampled_out),
            ] {
                assert_eq!(json[key], count, "{source:?} {key}");
            }
            for part in UserPart::ALL {
                assert_eq!(
                    json["user_parts"][part.name()],
                    state.user_part(part),
                    "{part:?}"
                );
            }
        }
        assert_eq!(
            value["sources"]["thread_stack"]["user_parts"]["no_stack"],
            243
        );
    }

    #[test]
    fn a_status_the_abi_refuses_is_an_error() {
        let mut bytes = [0_u8; STATUS_RESPONSE_SIZE];
        distinct_status().encode(&mut bytes);
        let error = refused(
            &json!({"op": "decode_status", "reply": hex(&bytes[..STATUS_RESPONSE_SIZE - 1])}),
        );
        assert!(error.contains("1647"), "{error}");
    }

    /// A read payload's trace record with kernel and user frames, and the
    /// module record of an image load.
    fn read_payload() -> (RecordHeader, ModuleHeader, Vec<u8>) {
        let frames = [
            0xFFFF_F800_0000_1000,
            0xFFFF_F800_0000_2000,
            0x7FF6_0000_1000,
        ];
        let trace = RecordHeader {
            sequence: 9,
            timestamp: 133_000_000_000_000_000,
            process_id: 4312,
            thread_id: 77,
            processor: 1,
            shard: 1,
            irql: 0,
            flags: RecordFlags::WOW64.union(RecordFlags::TRUNCATED),
            user_frame_count: 1,
            user_part: UserPart::Truncated,
            os_hash: 0xABCD,
            stack_id: stack_id(&frames),
            facts: SourceFacts::ImageLoad {
                image_base: 0x7FF6_1230_0000,
                image_size: 0x5_0000,
                process_id: 4312,
            },
        };
        let mut payload = vec![0; MAX_RECORD_SIZE];
        let size = encode_record(&trace, &frames, &mut payload).unwrap();
        payload.truncate(size);
        let module = ModuleHeader {
            sequence: 10,
            timestamp: 133_000_000_000_000_001,
            process_id: 4312,
            thread_id: 77,
            processor: 1,
            shard: 1,
            event: ModuleEvent::ImageLoad,
            flags: ModuleFlags::PATH_TRUNCATED,
            image_base: 0x7FF6_1230_0000,
            image_size: 0x5_0000,
            process_key: 0x01DB_5A40_1122_3344,
        };
        let path: Vec<u16> = r"C:\app.exe".encode_utf16().collect();
        let mut out = vec![0; MAX_RECORD_SIZE];
        let size = encode_module_record(&module, &path, &mut out).unwrap();
        payload.extend(&out[..size]);
        (trace, module, payload)
    }

    #[test]
    fn decode_read_gives_the_header_and_every_record_field() {
        let (trace, module, payload) = read_payload();
        let reply = read_reply(&payload, 2, true, 3);
        let value = ask(&json!({"op": "decode_read", "reply": hex(&reply)}));
        assert_eq!(
            value["header"],
            json!({"record_count": 2, "payload_bytes": payload.len(), "more_pending": true, "dropped": 3})
        );
        assert_eq!(
            value["entries"][0],
            json!({
                "kind": "trace",
                "source": "image_load",
                "sequence": 9,
                "timestamp": trace.timestamp,
                "process_id": 4312,
                "thread_id": 77,
                "processor": 1,
                "shard": 1,
                "irql": 0,
                "flags": ["truncated", "wow64"],
                "user_frame_count": 1,
                "user_part": "truncated",
                "os_hash": 0xABCD,
                "stack_id": trace.stack_id,
                "facts": {"image_base": 0x7FF6_1230_0000_u64, "image_size": 0x5_0000, "process_id": 4312},
                "frames": [0xFFFF_F800_0000_1000_u64, 0xFFFF_F800_0000_2000_u64, 0x7FF6_0000_1000_u64],
                "frame_count": 3,
                "kernel_frames": 2,
            })
        );
        assert_eq!(
            value["entries"][1],
            json!({
                "kind": "module",
                "sequence": 10,
                "timestamp": module.timestamp,
                "process_id": 4312,
                "thread_id": 77,
                "processor": 1,
                "shard": 1,
                "event": "image_load",
                "flags": ["path_truncated"],
                "image_base": 0x7FF6_1230_0000_u64,
                "image_size": 0x5_0000,
                "process_key": module.process_key,
                "path": r"C:\app.exe",
            })
        );
        let miscounted = read_reply(&payload, 3, false, 0);
        let error = refused(&json!({"op": "decode_read", "reply": hex(&miscounted)}));
        assert!(error.contains("declares 3"), "{error}");
        let cut = &reply[..reply.len() - 8];
        assert!(refused(&json!({"op": "decode_read", "reply": hex(cut)})).contains("bytes"));
    }

    #[test]
    fn decode_record_reads_a_capture_now_reply_whole() {
        let reply = record_bytes(
            0,
            SourceFacts::OnDemand { tag: 7 },
            RecordFlags::NOT_IN_RING,
            &[1, 2],
            &[1, 2],
        );
        let value = ask(&json!({"op": "decode_record", "reply": hex(&reply)}));
        assert_eq!(
            (
                &value["source"],
                &value["flags"],
                &value["facts"],
                &value["frames"]
            ),
            (
                &json!("on_demand"),
                &json!(["not_in_ring"]),
                &json!({"tag": 7}),
                &json!([1, 2])
            )
        );
        let mut longer = reply;
        longer.push(0);
        assert!(
            refused(&json!({"op": "decode_record", "reply": hex(&longer)})).contains("its record")
        );
    }

    #[test]
    fn flag_tables_name_every_defined_bit() {
        for bit in 0..16 {
            let bits = 1_u16 << bit;
            assert_eq!(
                RecordFlags::from_bits(bits).is_some(),
                RECORD_FLAGS.iter().any(|(flag, _)| flag.bits() == bits),
                "record flag {bits:#x}"
            );
            assert_eq!(
                ModuleFlags::from_bits(bits).is_some(),
                MODULE_FLAGS.iter().any(|(flag, _)| flag.bits() == bits),
                "module flag {bits:#x}"
            );
        }
    }

    #[test]
    fn a_sampling_session_plans_ticks_and_counts_what_came_back() {
        let mut session = None;
        let mut ask = |request: Value| {
            answer(&request.to_string(), &mut session)
                .unwrap_or_else(|error| panic!("{request}: {error}"))
        };
        ask(
            json!({"op": "sample_start", "hz": 100, "threads_per_tick": 2, "timeout_ms": 30, "pids": [40]}),
        );
        let plan = ask(json!({"op": "sample_tick", "now_ms": 0,
                              "threads": [[40, 9], [41, 5], [40, 7], [40, 8]]}));
        assert_eq!(plan["thread_ids"], json!([7, 8]));
        let request =
            decode_capture_threads_request(&input_bytes(&json!({"input": plan["inputs"][0]})))
                .unwrap();
        assert_eq!((request.requested(), request.timeout_ms), (&[7, 8][..], 30));
        let mut reply = [0_u8; CAPTURE_THREADS_REPLY_SIZE];
        CaptureThreadsReply::new(&[ThreadRequestOutcome::Queued, ThreadRequestOutcome::NoSlot])
            .unwrap()
            .encode(&mut reply);
        ask(json!({"op": "sample_answered", "now_ms": 1, "replies": [hex(&reply)]}));
        let tag = plan["tag"].as_u64().unwrap();
        let facts = |thread_id| SourceFacts::ThreadStack {
            target_process_id: 40,
            target_thread_id: thread_id,
            tag,
            delay: 10,
            late: false,
        };
        let ours = record_bytes(1, facts(7), RecordFlags::NONE, &[1, 2], &[1, 2]);
        let other = record_bytes(2, facts(8), RecordFlags::NONE, &[1, 2], &[1, 2]);
        let read = read_reply(&[ours.clone(), other.clone()].concat(), 2, false, 0);
        assert_eq!(
            ask(json!({"op": "sample_read", "reply": hex(&read)})),
            json!({"this_sample": 1, "other": 1, "trace_bytes": ours.len() + other.len(),
                   "more_pending": false})
        );
        let counts = ask(json!({"op": "sample_counts"}));
        assert_eq!(
            (
                &counts["requested"],
                &counts["queued"],
                &counts["no_slot"],
                &counts["captured"]
            ),
            (&json!(2), &json!(1), &json!(1), &json!(1))
        );
        assert_eq!(
            (&counts["skipped_over_bound"], &counts["awaiting"]),
            (&json!(1), &json!(false))
        );
        let error = answer(
            r#"{"op": "sample_answered", "now_ms": 2, "replies": []}"#,
            &mut session,
        )
        .expect_err("no tick to answer");
        assert!(error.contains("no tick"), "{error}");
        let error = answer(r#"{"op": "sample_counts"}"#, &mut None).expect_err("no session");
        assert!(error.contains("sample_start"), "{error}");
    }

    #[test]
    fn bad_requests_get_errors() {
        for (line, expected) in [
            ("garbage", "not JSON"),
            ("", "not JSON"),
            ("[1]", "object"),
            (r#"{"op": 1}"#, "\"op\""),
            (r#"{"op": "nope"}"#, "unknown op"),
            (r#"{"op": "decode_status"}"#, "missing \"reply\""),
            (r#"{"op": "decode_status", "reply": 5}"#, "hex string"),
            (r#"{"op": "decode_status", "reply": "abc"}"#, "not hex"),
            (r#"{"op": "decode_status", "reply": "zz"}"#, "not hex"),
            (r#"{"op": "decode_status", "reply": "+f"}"#, "not hex"),
            (r#"{"op": "decode_status", "reply": "\u00e9"}"#, "not hex"),
            (
                r#"{"op": "decode_status", "reply": "00", "x": 1}"#,
                "unknown key",
            ),
            (r#"{"op": "decode_status", "reply": "00"}"#, "truncated"),
            (r#"{"op": "capture_now", "tag": -1}"#, "tag"),
        ] {
            let error = answer(line, &mut None).expect_err(line);
            assert!(error.contains(expected), "{line}: {error}");
        }
    }

    #[test]
    fn every_line_gets_one_line_until_eof() {
        let input = "{\"op\":\"facts\"}\nnot json\n{\"op\":\"capture_now\",\"tag\":1}\n";
        let mut output = Vec::new();
        serve(input.as_bytes(), &mut output).unwrap();
        let replies: Vec<Value> = String::from_utf8(output)
            .unwrap()
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
        assert_eq!(replies.len(), 3);
        assert!(replies[0].get("status").is_some());
        assert!(replies[1].get("error").is_some());
        assert!(replies[2].get("input").is_some());
    }
}
