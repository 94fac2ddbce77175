//! The client's cost of one `kstack sample` tick over 100 threads
//! (criterion), back to back: every thread's sample repeated (none had run
//! since its capture: the sampler's rule, a copy of its last record, its
//! 32-byte entry written), against every thread's sample delivered (each
//! asked for, its record noted and written, as the command does with what
//! the driver returns). Both write to a sink through the capture writer.
//! A delivered sample also costs the driver's capture (`capture_an_event`
//! in driver-core's bench) and the kernel's APC and, for a waiting thread,
//! a switch to it: those only a Windows VM measures.
//!
//! Run with `cargo bench -p kstack-client --bench sampling`; results are
//! in `docs/performance.md`. One sample counts as one element.

use std::{
    collections::BTreeSet,
    hint::black_box,
    io::Sink,
    time::{Duration, Instant},
};

use criterion::{Criterion, Throughput};
use kstack_abi::{RecordFlags, RecordHeader, SourceFacts, ThreadRequestOutcome, UserPart};
use kstack_client::{
    capture::{trace::TraceRecord, writer::CaptureWriter},
    naming::modules::ModuleMap,
    sampling::{SampleSettings, Sampler, Selection},
    thread_list::{ProcessThread, ThreadFacts, ThreadState, WaitReason},
};

const THREADS: u32 = 100;
const PROCESS: u32 = 500;
/// The stack's frames: a user-mode wait's depth, kernel part then user part.
const FRAMES: u64 = 24;

/// The threads as listed, each waiting, switched to `switches` times.
fn listing(switches: u32, facts: bool) -> Vec<ProcessThread> {
    (1..=THREADS)
        .map(|thread_id| ProcessThread {
            process_id: PROCESS,
            thread_id,
            facts: facts.then_some(ThreadFacts {
                state: Some(ThreadState::WAITING),
                wait_reason: WaitReason(6),
                context_switches: switches,
                kernel_time: 10,
                user_time: 20,
                create_time: 0,
            }),
        })
        .collect()
}

/// The record the driver sends for `thread_id`'s request tagged `tag`.
fn record(tag: u64, thread_id: u32) -> TraceRecord {
    let frames: Vec<u64> = (0..FRAMES)
        .map(|depth| 0xFFFF_F800_0010_0000 + depth * 0x40)
        .collect();
    TraceRecord {
        header: RecordHeader {
            sequence: 1,
            timestamp: 134_083_512_000_000_000,
            process_id: PROCESS,
            thread_id,
            processor: 0,
            shard: 0,
            irql: 1,
            flags: RecordFlags::NONE,
            user_frame_count: 8,
            user_part: UserPart::Captured,
            os_hash: 1,
            stack_id: kstack_abi::stack_id(&frames),
            facts: SourceFacts::ThreadStack {
                target_process_id: PROCESS,
                target_thread_id: thread_id,
                tag,
                delay: 0,
                late: false,
            },
        },
        frames: frames.into(),
        sample: None,
    }
}

/// A sampler at 100 Hz over [`PROCESS`], started at `start`.
fn sampler(start: Instant) -> Sampler {
    let settings = SampleSettings {
        hz: 100,
        threads_per_tick: 256,
        timeout_ms: 1000,
    };
    Sampler::new(
        settings,
        Selection::Processes(BTreeSet::from([PROCESS])),
        1,
        start,
    )
}

/// One tick: the plan, each asked-for thread queued and its record noted
/// and written, each repeated sample written.
fn tick(
    sampler: &mut Sampler,
    writer: &mut CaptureWriter<Sink>,
    now: Instant,
    listed: &[ProcessThread],
) {
    let plan = sampler.plan(now, 134_083_512_000_000_000, listed);
    for repeated in &plan.repeated {
        writer.append(repeated).expect("a sink takes anything");
    }
    sampler.answered(
        &plan,
        &vec![ThreadRequestOutcome::Queued; plan.thread_ids.len()],
        now,
    );
    for &thread_id in &plan.thread_ids {
        let mut delivered = record(plan.tag, thread_id);
        sampler.note_record(&mut delivered);
        writer.append(&delivered).expect("a sink takes anything");
    }
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    let mut group = criterion.benchmark_group("sample_tick_100_threads");
    group.throughput(Throughput::Elements(u64::from(THREADS)));
    let period = Duration::from_millis(10);

    // Every thread captured twice with one stack, each time listed switched
    // to once more after (the APC's own switch-in), then never again: every
    // later tick repeats all.
    let start = Instant::now();
    let mut repeating = sampler(start);
    let mut writer = CaptureWriter::new(std::io::sink(), &ModuleMap::default()).expect("a sink");
    tick(&mut repeating, &mut writer, start, &listing(1, true));
    tick(
        &mut repeating,
        &mut writer,
        start + period,
        &listing(2, true),
    );
    let still = listing(3, true);
    let mut now = start + 2 * period;
    tick(&mut repeating, &mut writer, now, &still);
    assert_eq!(
        repeating.counts().repeated,
        u64::from(THREADS),
        "the third tick repeats every thread"
    );
    group.bench_function("all_repeated", |b| {
        b.iter(|| {
            now += period;
            tick(&mut repeating, &mut writer, now, black_box(&still));
        });
    });

    // Listed without states: every thread asked for at every tick.
    let mut delivering = sampler(start);
    let ids_only = listing(0, false);
    let mut now = start;
    group.bench_function("all_delivered", |b| {
        b.iter(|| {
            tick(&mut delivering, &mut writer, now, black_box(&ids_only));
            now += period;
        });
    });
    assert_eq!(delivering.counts().repeated, 0);
    group.finish();
    criterion.final_summary();
}
