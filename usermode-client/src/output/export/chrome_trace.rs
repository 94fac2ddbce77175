//! Chrome trace events (the JSON that ui.perfetto.dev and `chrome://tracing`
//! open): every record an instant event on its process and thread.

use serde_json::{Value, json};

use crate::{capture::trace::TraceRecord, clock::system_time_text, naming::symbolizer::Symbolizer};

/// 100 ns system-time units per microsecond, the trace format's unit.
const TICKS_PER_MICROSECOND: f64 = 10.0;

/// Every record as an instant event (`"ph": "i"`, thread scope), in time
/// order: `ts` in microseconds since the earliest record (whose time is
/// `otherData.start_time`: a trace viewer counts from the first event
/// anyway, and microseconds since 1970 would not keep 100 ns in a JSON
/// number), `pid` and `tid` the record's, the source its name, and its
/// `kstack read --json` line (source, facts, processor, named frames) in
/// `args`.
#[must_use]
pub fn document(records: &[TraceRecord], symbolizer: &Symbolizer) -> Value {
    let mut in_time_order: Vec<&TraceRecord> = records.iter().collect();
    // Shards interleave; within one instant keep each shard's order.
    in_time_order.sort_by_key(|record| {
        (
            record.header.timestamp,
            record.header.shard,
            record.header.sequence,
        )
    });
    let start = in_time_order
        .first()
        .map_or(0, |record| record.header.timestamp);
    let events: Vec<Value> = in_time_order
        .iter()
        .map(|record| {
            #[expect(
                clippy::cast_precision_loss,
                reason = "exact below 2^53 ticks, about 28 years after the first record"
            )]
            let ticks = (record.header.timestamp - start) as f64;
            json!({
                "name": record.source().name(),
                "cat": "kstack",
                "ph": "i",
                "s": "t",
                "ts": ticks / TICKS_PER_MICROSECOND,
                "pid": record.header.process_id,
                "tid": record.header.thread_id,
                "args": record.to_json(symbolizer),
            })
        })
        .collect();
    json!({
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "exporter": "kstack",
            "start_time": system_time_text(start),
            "records": records.len(),
        },
    })
}

#[cfg(test)]
mod tests {
    use kstack_abi::SourceFacts;

    use super::*;
    use crate::{capture::writer::tests::record, naming::modules::tests::sample_map};

    #[test]
    fn records_become_instant_events_in_time_order() {
        let mut late = record(1, SourceFacts::Timer, &[0xFFFF_F801_2340_0010]);
        late.header.timestamp += 25;
        late.header.processor = 3;
        let early = record(1, SourceFacts::OnDemand { tag: 7 }, &[0x42]);
        let document = document(
            &[late, early.clone()],
            &Symbolizer::new(sample_map()).showing_tracer_frames(),
        );
        let events = document["traceEvents"].as_array().unwrap();
        assert_eq!(events.len(), 2);
        assert_eq!(events[0]["name"], "ondemand");
        assert_eq!(events[0]["ts"], 0.0);
        assert_eq!(events[1]["ts"], 2.5, "25 ticks of 100 ns");
        assert_eq!(events[1]["ph"], "i");
        assert_eq!(events[1]["pid"], 4);
        assert_eq!(events[1]["tid"], 8);
        assert_eq!(events[1]["args"]["processor"], 3);
        assert_eq!(events[1]["args"]["locations"], json!(["kstack.sys+0x10"]));
        assert_eq!(events[0]["args"]["facts"], json!({ "tag": 7 }));
        assert_eq!(
            document["otherData"]["start_time"],
            json!(system_time_text(early.header.timestamp))
        );
    }

    #[test]
    fn no_records_make_an_empty_trace() {
        let document = document(&[], &Symbolizer::new(sample_map()).showing_tracer_frames());
        assert_eq!(document["traceEvents"], json!([]));
    }
}
