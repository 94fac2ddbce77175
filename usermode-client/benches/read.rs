//! The client's part of a drain (criterion): `Reader::read` decoding one
//! full read reply, checking every record and giving each its frames, with
//! the stack table on (records name their stack) and off (each carries
//! it). The driver's part and Wine's transport are timed by
//! `cargo xtask bench drain`; this is the rest of that drain, on the host.
//!
//! Run with `cargo bench -p kstack-client --bench read`; results are in
//! `docs/performance.md`. One record counts as one element.

use std::hint::black_box;

use criterion::{Criterion, Throughput};
use kstack_abi::{RecordFlags, SourceFacts, ntstatus::STATUS_SUCCESS};
use kstack_client::device::{
    session::Reader,
    test_support::{read_reply, record_bytes},
    transport::{Reply, Transport},
};

/// Records in one reply: about what `kstack-drain-bench` drains in one of
/// its reads with the table off (4 MiB of 200-byte records; the client's
/// largest buffer).
const RECORDS: u64 = 20_000;
/// Frames per stack: the capture-now stack's depth under Wine.
const FRAMES: u64 = 16;

/// Answers every read with the same reply, or with none and more pending
/// (as the driver does when none fits) until the reader has grown to hold it.
struct Replaying(Vec<u8>);

impl Transport for Replaying {
    fn control(&mut self, _code: u32, _input: &[u8], output: &mut [u8]) -> Reply {
        if let Some(out) = output.get_mut(..self.0.len()) {
            out.copy_from_slice(&self.0);
            return Reply {
                status: STATUS_SUCCESS,
                information: self.0.len(),
            };
        }
        let empty = read_reply(&[], 0, true, 0);
        output[..empty.len()].copy_from_slice(&empty);
        Reply {
            status: STATUS_SUCCESS,
            information: empty.len(),
        }
    }
}

/// A reply of [`RECORDS`] capture-now records of one stack: each holding
/// its frames (`tabled` false), or the first holding them and the rest
/// naming the stack (`tabled` true, the table on).
fn reply(tabled: bool) -> Vec<u8> {
    let stack: Vec<u64> = (0..FRAMES)
        .map(|depth| 0xFFFF_F800_0010_0000 + depth * 0x40)
        .collect();
    let payload: Vec<u8> = (1..=RECORDS)
        .flat_map(|sequence| {
            let facts = SourceFacts::OnDemand { tag: sequence };
            if !tabled {
                return record_bytes(sequence, facts, RecordFlags::NONE, &stack, &stack);
            }
            let frames: &[u64] = if sequence == 1 { &stack } else { &[] };
            record_bytes(sequence, facts, RecordFlags::STACK_BY_ID, &stack, frames)
        })
        .collect();
    read_reply(&payload, u32::try_from(RECORDS).expect("small"), false, 0)
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    let mut group = criterion.benchmark_group("read_a_reply_of_20000_records");
    group.throughput(Throughput::Elements(RECORDS));
    group.sample_size(30);
    for (name, tabled) in [("table_off", false), ("table_on", true)] {
        let mut transport = Replaying(reply(tabled));
        let mut reader = Reader::default();
        // Grow the buffer, and let the reader remember the stack.
        while reader
            .read(&mut transport)
            .expect("a valid reply")
            .more_pending
        {}
        group.bench_function(name, |bench| {
            // As `session::follow` drains: each batch's memory recycled.
            bench.iter(|| {
                let batch = reader.read(&mut transport).expect("a valid reply");
                assert_eq!(batch.records.len() as u64, RECORDS);
                reader.recycle(black_box(batch));
            });
        });
    }
    group.finish();
    criterion.final_summary();
}
