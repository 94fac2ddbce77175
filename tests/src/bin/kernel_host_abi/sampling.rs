//! The bridge's sampling session: `kstack_client::sampling::Sampler`, the
//! sampler `kstack sample` runs, driven by the kernel host against the real
//! driver, on the model's clock (milliseconds since the session began).
//!
//! - `{"op":"sample_start","hz":N,"threads_per_tick":N,"timeout_ms":N,"pids":[...]}`:
//!   a new session sampling those processes; `{}`.
//! - `{"op":"sample_tick","now_ms":N,"threads":[[pid,tid],...]}`: the
//!   tick's plan over the threads listed, each `[pid, tid]` (no facts, as
//!   Toolhelp lists them) or `[pid, tid, state, wait_reason, switches,
//!   cpu_100ns]` (as `SystemProcessInformation` does): `{"tag":N,
//!   "thread_ids":[...],"inputs":["<hex>",...],"repeated":[tid,...]}`, one
//!   capture-threads request per 64 ids, and the threads whose sample
//!   repeats their last stack without an APC.
//! - `{"op":"sample_answered","now_ms":N,"replies":["<hex>",...]}`: the
//!   replies to the last tick's requests, in order (fewer when one was
//!   refused); `{}`.
//! - `{"op":"sample_read","reply":"<hex>"}`: a read reply, each trace
//!   record noted: `{"this_sample":N,"other":N,"trace_bytes":N,
//!   "more_pending":B}` (`trace_bytes`: the trace records' bytes, as the
//!   ring held them).
//! - `{"op":"sample_counts"}`: every `SampleCounts` field by name, and
//!   `awaiting` and `selection_ended`.

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use kstack_abi::{
    CaptureThreadsReply, CaptureThreadsRequest, Entry, ReadHeader, SourceFacts, decode_entry,
    messages::READ_HEADER_SIZE,
    thread_capture::{MAX_THREAD_CAPTURES, encode_capture_threads_request},
};
use kstack_client::{
    capture::trace::TraceRecord,
    sampling::{RecordOwner, SampleSettings, Sampler, Selection, TickPlan},
    thread_list::{ProcessThread, ThreadFacts, ThreadState, WaitReason},
};
use serde_json::{Value, json};

use super::{Reply, Request, field, hex_field, input, keys, number};

/// A session's sampler, its clock's origin and the last tick's plan.
pub struct Session {
    sampler: Sampler,
    origin: Instant,
    last: Option<TickPlan>,
    timeout_ms: u32,
}

/// The session tag's high half: any value does, the host checks records
/// by what the sampler says.
const SESSION: u32 = 0x6B73_7470;

/// Answers a sampling op, or `None` when `op` is none of them.
pub fn answer(op: &str, request: &Request, session: &mut Option<Session>) -> Option<Reply> {
    Some(match op {
        "sample_start" => start(request).map(|started| {
            *session = Some(started);
            json!({})
        }),
        "sample_tick" => with(session, |session| tick(session, request)),
        "sample_answered" => with(session, |session| answered(session, request)),
        "sample_read" => with(session, |session| read(session, request)),
        "sample_counts" => with(session, |session| {
            keys(request, &[])?;
            Ok(counts(session))
        }),
        _ => return None,
    })
}

fn with(session: &mut Option<Session>, op: impl FnOnce(&mut Session) -> Reply) -> Reply {
    session
        .as_mut()
        .map_or_else(|| Err("no sample_start yet".to_owned()), op)
}

fn start(request: &Request) -> Result<Session, String> {
    keys(request, &["hz", "threads_per_tick", "timeout_ms", "pids"])?;
    let settings = SampleSettings {
        hz: number(field(request, "hz")?, "hz")?,
        threads_per_tick: number(field(request, "threads_per_tick")?, "threads_per_tick")?,
        timeout_ms: number(field(request, "timeout_ms")?, "timeout_ms")?,
    };
    let pids = field(request, "pids")?
        .as_array()
        .ok_or("pids is an array")?
        .iter()
        .map(|pid| number(pid, "pid"))
        .collect::<Result<BTreeSet<u32>, _>>()?;
    let origin = Instant::now();
    Ok(Session {
        sampler: Sampler::new(settings, Selection::Processes(pids), SESSION, origin),
        origin,
        last: None,
        timeout_ms: settings.timeout_ms,
    })
}

fn at(session: &Session, request: &Request) -> Result<Instant, String> {
    let now_ms: u64 = number(field(request, "now_ms")?, "now_ms")?;
    Ok(session.origin + Duration::from_millis(now_ms))
}

fn tick(session: &mut Session, request: &Request) -> Reply {
    keys(request, &["now_ms", "threads"])?;
    let now = at(session, request)?;
    let listed = field(request, "threads")?
        .as_array()
        .ok_or("threads is an array")?
        .iter()
        .map(|thread| match thread.as_array().map(Vec::as_slice) {
            Some([process_id, thread_id]) => Ok(ProcessThread {
                process_id: number(process_id, "pid")?,
                thread_id: number(thread_id, "tid")?,
                facts: None,
            }),
            Some([process_id, thread_id, state, wait_reason, switches, cpu]) => Ok(ProcessThread {
                process_id: number(process_id, "pid")?,
                thread_id: number(thread_id, "tid")?,
                facts: Some(ThreadFacts {
                    state: Some(ThreadState(number(state, "state")?)),
                    wait_reason: WaitReason(number(wait_reason, "wait_reason")?),
                    context_switches: number(switches, "switches")?,
                    kernel_time: number(cpu, "cpu_100ns")?,
                    user_time: 0,
                    // The model never reuses a thread id.
                    create_time: 0,
                }),
            }),
            _ => Err(format!(
                "{thread} is not [pid, tid] or [pid, tid, state, wait_reason, switches, cpu_100ns]"
            )),
        })
        .collect::<Result<Vec<_>, _>>()?;
    // The records' clock: any value serves, the host reads no repeated
    // record's time.
    let plan = session.sampler.plan(now, 0, &listed);
    let inputs = plan
        .thread_ids
        .chunks(MAX_THREAD_CAPTURES)
        .map(|chunk| {
            CaptureThreadsRequest::new(plan.tag, session.timeout_ms, chunk)
                .map(|request| input(&encode_capture_threads_request(&request))["input"].clone())
                .map_err(|error| error.to_string())
        })
        .collect::<Result<Vec<Value>, _>>()?;
    let repeated: Vec<u32> = plan
        .repeated
        .iter()
        .filter_map(|record| match record.header.facts {
            SourceFacts::ThreadStack {
                target_thread_id, ..
            } => Some(target_thread_id),
            _ => None,
        })
        .collect();
    let reply = json!({
        "tag": plan.tag,
        "thread_ids": plan.thread_ids,
        "inputs": inputs,
        "repeated": repeated,
    });
    session.last = Some(plan);
    Ok(reply)
}

fn answered(session: &mut Session, request: &Request) -> Reply {
    keys(request, &["now_ms", "replies"])?;
    let now = at(session, request)?;
    let plan = session.last.take().ok_or("no tick to answer")?;
    let replies = field(request, "replies")?
        .as_array()
        .ok_or("replies is an array")?;
    let mut outcomes = Vec::with_capacity(plan.thread_ids.len());
    for (reply, chunk) in replies
        .iter()
        .zip(plan.thread_ids.chunks(MAX_THREAD_CAPTURES))
    {
        let mut member = Request::new();
        member.insert("reply".to_owned(), reply.clone());
        let decoded = CaptureThreadsReply::decode(&hex_field(&member, "reply")?, chunk.len())
            .map_err(|error| error.to_string())?;
        outcomes.extend_from_slice(decoded.outcomes());
    }
    session.sampler.answered(&plan, &outcomes, now);
    Ok(json!({}))
}

fn read(session: &mut Session, request: &Request) -> Reply {
    keys(request, &["reply"])?;
    let bytes = hex_field(request, "reply")?;
    // Checks the header and every record; the walk below then takes each
    // record's size too.
    let (header, entries) = ReadHeader::decode(&bytes).map_err(|error| error.to_string())?;
    entries
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| error.to_string())?;
    let (mut this_sample, mut other, mut trace_bytes) = (0_u64, 0_u64, 0_u64);
    let mut payload = bytes.get(READ_HEADER_SIZE..).unwrap_or_default();
    while !payload.is_empty() {
        let (entry, size) = decode_entry(payload).map_err(|error| error.to_string())?;
        payload = &payload[size..];
        if let Entry::Trace(view) = entry {
            trace_bytes += size as u64;
            match session.sampler.note_record(&mut TraceRecord::from(&view)) {
                RecordOwner::ThisSample(_) => this_sample += 1,
                RecordOwner::Other => other += 1,
            }
        }
    }
    Ok(json!({
        "this_sample": this_sample,
        "other": other,
        "trace_bytes": trace_bytes,
        "more_pending": header.more_pending,
    }))
}

fn counts(session: &Session) -> Value {
    let counts = session.sampler.counts();
    json!({
        "ticks": counts.ticks,
        "missed_ticks": counts.missed_ticks,
        "listed": counts.listed,
        "without_state": counts.without_state,
        "skipped_pending": counts.skipped_pending,
        "eligible": counts.eligible,
        "skipped_over_bound": counts.skipped_over_bound,
        "requested": counts.requested,
        "repeated": counts.repeated,
        "unsent": counts.unsent,
        "queued": counts.queued,
        "no_such_thread": counts.no_such_thread,
        "no_slot": counts.no_slot,
        "not_queued": counts.not_queued,
        "system_thread": counts.system_thread,
        "own": counts.own,
        "captured": counts.captured,
        "late": counts.late,
        "awaited": counts.awaited,
        "other_records": counts.other_records,
        "threads_seen": counts.threads_seen,
        "threads_gone": counts.threads_gone,
        "awaiting": session.sampler.awaiting(),
        "selection_ended": session.sampler.selection_ended(),
    })
}
