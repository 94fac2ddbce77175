//! Host benchmarks of the record ring (criterion): the stack id of 32
//! frames (beside ABI 12's, its baseline); publishing a 32-frame
//! record with one and two producers against a plain encode into a buffer;
//! publishing through the stack table, an event of a known stack and of a
//! new one, against a plain encode of the same event record (48 bytes: a
//! timer event naming its stack); a whole
//! capture (`DriverCore::capture`: the configuration read, the walk, the
//! table and the publish) of an event with a known stack; and draining a
//! full ring and decoding what it held.
//!
//! The ring is the driver's: two shards, as on a two-processor machine, and
//! a publish is the capture's whole path into it: pick the processor's
//! shard, claim room and that shard's next sequence number, encode the
//! record into the room and move the tail past it. Two producers run on two processors, so
//! each publishes into its own shard, as two CPUs would.
//!
//! Run with `cargo bench -p kstack-driver-core --bench ring`. Every
//! benchmark counts one record as one element, so criterion reports time per
//! record and records per second. The results and the spec's targets are in
//! `docs/performance.md`.

use std::{
    cell::Cell,
    hint::black_box,
    sync::Barrier,
    thread,
    time::{Duration, Instant},
};

use criterion::{BenchmarkGroup, Criterion, Throughput, measurement::WallTime};
mod ticket_ring;
use kstack_abi::{
    CaptureConfig, CaptureThreadsRequest, DriverImage, HostRoutine, Ioctl, MAX_RECORD_SIZE,
    PagingExecutive, SourceSet, ThreadRequestOutcome,
    messages::{encode_capture_now_request, encode_configure_request},
    ntstatus::STATUS_SUCCESS,
    thread_capture::{CAPTURE_THREADS_REPLY_SIZE, encode_capture_threads_request},
};
use kstack_abi::{
    RecordFlags, RecordHeader, Records, Source, SourceFacts, UserPart, by_id_record_size,
    encode_record, record_flags, record_os_hash, record_size, record_timestamp, stack_id,
};
use kstack_driver_core::{
    Caller, CaptureOutcome, DriverCore, Platform, Routine, Shard, ShardedRing, SourceControl,
    SourceRegistration, StackEntry, StackTable, UserThread, UserWalkFailure, Word,
    sharded_ring::{Counted, ring_words, shards_over},
    stack_table::Tabled,
    thread_captures::Slot,
    user_walk_guard::UserWalkGuard,
};
use ticket_ring::TicketRing;

/// Frames per benchmarked record (the default `frames_to_capture`).
const FRAMES: usize = 32;
/// Shards of every benchmarked ring: one per processor of this machine.
const SHARDS: usize = 2;
/// Records per shard: 4096 records of 32 frames (328 bytes each), 1.3 MiB;
/// and the most records a round publishes, so no round meets a full shard.
const RING_CAPACITY: u64 = 4096;
/// The bytes of one benchmarked record.
#[expect(clippy::cast_possible_truncation, reason = "32 frames")]
const RECORD_BYTES: usize = record_size(FRAMES as u16);
/// Bytes one drain may copy out, as a client's read buffer.
const DRAIN_BUFFER: usize = 256 * 1024;

/// 32 return addresses that look like a timer DPC's kernel stack: spread
/// over ntoskrnl's and a few drivers' images in the x64 kernel range.
fn kernel_frames() -> [u64; FRAMES] {
    const IMAGE_BASES: [u64; 4] = [
        0xFFFF_F803_1A40_0000, // ntoskrnl.exe
        0xFFFF_F803_1E20_0000, // hal.dll
        0xFFFF_F803_2C10_0000, // a filter driver
        0xFFFF_F803_3B80_0000, // kstack.sys
    ];
    let mut state = 0x9E37_79B9_7F4A_7C15_u64;
    core::array::from_fn(|index| {
        // xorshift64: fixed, varied offsets below 8 MiB into each image.
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        IMAGE_BASES[index % IMAGE_BASES.len()] + (state & 0x7F_FFFF)
    })
}

/// A timer record's header for `frames`, as the capture path builds it.
fn timer_header(frames: &[u64; FRAMES], processor: u16) -> RecordHeader {
    RecordHeader {
        sequence: 1,
        timestamp: 134_081_000_000_000_000,
        process_id: 4,
        thread_id: 0,
        processor,
        shard: processor,
        irql: 2,
        // The walk filled all 32 frames asked for.
        flags: RecordFlags::TRUNCATED,
        user_frame_count: 0,
        user_part: kstack_abi::UserPart::Off,
        // Windows' BackTraceHash is the low 32 bits of the sum of the frames.
        os_hash: u32::try_from(frames.iter().copied().fold(0_u64, u64::wrapping_add) & 0xFFFF_FFFF)
            .expect("masked to 32 bits"),
        stack_id: stack_id(frames),
        facts: SourceFacts::Timer,
    }
}

/// Bytes of one shard: exactly `RING_CAPACITY` benchmarked records.
fn shard_bytes() -> usize {
    usize::try_from(RING_CAPACITY).expect("4096 fits a usize") * RECORD_BYTES
}

/// The memory of a fresh ring of `SHARDS` shards of `RING_CAPACITY`
/// records.
fn ring_memory() -> Vec<Word> {
    ring_words(SHARDS * shard_bytes()).collect()
}

/// The shards over `words`.
fn ring_shards(words: &[Word]) -> Vec<Shard<'_>> {
    shards_over(words, SHARDS).collect()
}

/// Empties the ring (not timed) so the next round's publishes all find
/// room.
fn empty(ring: &ShardedRing<'_>) {
    ring.consumer()
        .expect("the benchmark is the only consumer")
        .discard_all();
    assert!(ring.is_empty());
}

/// Publishes `count` records from `processor` as the capture path does:
/// its shard, the shard's next sequence number, the record encoded straight
/// into the claimed room. Returns how many found the shard full.
fn publish_records(
    ring: &ShardedRing<'_>,
    processor: u32,
    header: &RecordHeader,
    frames: &[u64; FRAMES],
    count: u64,
) -> u64 {
    let mut full = 0;
    for _ in 0..count {
        let published = ring.shard_for(processor).publish(
            Counted::Trace(Source::Timer, UserPart::Off),
            RECORD_BYTES,
            |sequence, room| {
                let header = RecordHeader {
                    sequence,
                    ..*header
                };
                encode_record(&header, frames, room).expect("the room fits 32 frames");
            },
        );
        if published.is_err() {
            full += 1;
        }
    }
    full
}

/// The fair floor of a publish: `count` records with sequence numbers
/// from `first` encoded into `buffer` record after record, as a shard's
/// tail advances, back to the start when the next would not fit (a shard
/// holds whole records, so it wraps at the same places): the publish's
/// work (its header built around the sequence number, the same
/// fixed-size frame array encoded into a room of exactly the record's
/// bytes) without the ring's synchronisation and bookkeeping. No division
/// places a record: until 2026-11-27 one (`sequence % places`) cost the
/// floor more than the publish's own arithmetic, so the ratio flattered
/// the publish.
fn copy_records<const N: usize>(
    buffer: &mut [u8],
    header: &RecordHeader,
    frames: &[u64; N],
    first: u64,
    count: u64,
) {
    copy_records_after(buffer, header, frames, (first, count), |_| {});
}

/// [`copy_records`], running `before` on each record's header first.
fn copy_records_after<const N: usize>(
    buffer: &mut [u8],
    header: &RecordHeader,
    frames: &[u64; N],
    (first, count): (u64, u64),
    mut before: impl FnMut(&mut RecordHeader),
) {
    // The size the record encodes to (a record naming its stack is shorter).
    let bytes = encode_record(header, frames, &mut [0; kstack_abi::MAX_RECORD_SIZE])
        .expect("at most 62 frames");
    let mut at = 0;
    for sequence in first..first + count {
        if at + bytes > buffer.len() {
            at = 0;
        }
        let mut header = RecordHeader {
            sequence,
            ..*header
        };
        before(&mut header);
        let room = &mut buffer[at..at + bytes];
        encode_record(&header, frames, room).expect("the room fits the frames");
        // As the ring's Release store does, make every record's bytes count.
        black_box(room);
        at += bytes;
    }
}

/// The rounds an `iters`-record measurement is cut into: at most one
/// shard's worth each, so a round never meets a full shard.
fn rounds(iters: u64) -> impl Iterator<Item = u64> {
    rounds_of(iters, RING_CAPACITY)
}

/// `iters` records in rounds of at most `size`.
fn rounds_of(iters: u64, size: u64) -> impl Iterator<Item = u64> {
    let full_rounds = iters / size;
    let rest = iters % size;
    std::iter::repeat_n(size, usize::try_from(full_rounds).unwrap_or(usize::MAX))
        .chain((rest > 0).then_some(rest))
}

/// Times `iters` calls of `each` in rounds of at most [`TABLE_ROUND`],
/// with `clear` (not timed) before each round; returns the rounds' sum.
fn timed_in_rounds(iters: u64, mut clear: impl FnMut(), mut each: impl FnMut()) -> Duration {
    let mut elapsed = Duration::ZERO;
    for count in rounds_of(iters, TABLE_ROUND) {
        clear();
        let start = Instant::now();
        for _ in 0..count {
            each();
        }
        elapsed += start.elapsed();
    }
    elapsed
}

/// Runs `iters` records on two threads started once, in rounds of at
/// most `RING_CAPACITY` records: before each round `prepare` runs (not
/// timed) while both threads wait, then each thread runs `work(its index,
/// its half of the round)`. A round's time is from the first thread's
/// start to the last one's end; returns the rounds' sum.
fn two_threads_in_rounds(
    iters: u64,
    mut prepare: impl FnMut(),
    work: impl Fn(u16, u64) + Sync,
) -> Duration {
    let counts: Vec<u64> = rounds(iters).collect();
    let go = Barrier::new(3);
    let done = Barrier::new(3);
    let spans = std::sync::Mutex::new(Vec::with_capacity(2 * counts.len()));
    thread::scope(|scope| {
        for index in 0..2_u16 {
            let (go, done, spans, work, counts) = (&go, &done, &spans, &work, &counts);
            scope.spawn(move || {
                for &count in counts {
                    let half = if index == 0 {
                        count / 2
                    } else {
                        count - count / 2
                    };
                    go.wait();
                    let start = Instant::now();
                    work(index, half);
                    let end = Instant::now();
                    spans.lock().expect("no thread panicked").push((start, end));
                    done.wait();
                }
            });
        }
        let mut elapsed = Duration::ZERO;
        for _ in &counts {
            prepare();
            go.wait();
            done.wait();
            let mut spans = spans.lock().expect("no thread panicked");
            let first_start = spans.iter().map(|span| span.0).min().expect("2 threads");
            let last_end = spans.iter().map(|span| span.1).max().expect("2 threads");
            elapsed += last_end - first_start;
            spans.clear();
        }
        elapsed
    })
}

/// A group timing one record per iteration, kept short (the whole bench runs
/// in well under two minutes on two cores).
fn record_group<'c>(c: &'c mut Criterion, name: &str) -> BenchmarkGroup<'c, WallTime> {
    let mut group = c.benchmark_group(name);
    group
        .throughput(Throughput::Elements(1))
        .sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    group
}

/// Publishing one 32-frame timer record (sequence number taken, encoded
/// straight into the claimed room), by one producer and by two concurrent
/// producers on two processors, beside the same encode into a plain buffer.
///
/// A publish that finds its shard full costs far less than a real one (no
/// encode, no copy), so a measurement with any drop would be meaningless.
/// Each measurement is therefore cut into rounds of at most `RING_CAPACITY`
/// records, the ring is emptied between rounds outside the timed region,
/// and every round asserts that none of its publishes met a full shard (and
/// the ring's drop counter is checked to be still zero at the end).
fn publish_32_frames(c: &mut Criterion) {
    let frames = kernel_frames();
    let mut group = record_group(c, "publish_32_frames");
    let header = timer_header(&frames, 0);
    publish_into_the_ring(&mut group, &header, &frames);
    ticket_rings(&mut group, &frames);
    copy_floors(&mut group, &header, &frames);
    group.finish();
}

/// The same publishes into per-processor ticket-spinlock rings (the
/// baseline, `ticket_ring/mod.rs`), one ring per thread, in the same
/// rounds: a round never meets a full ring.
fn ticket_rings(group: &mut BenchmarkGroup<'_, WallTime>, frames: &[u64; FRAMES]) {
    let slots = usize::try_from(RING_CAPACITY).expect("4096");
    let rings = [
        TicketRing::new(slots, RECORD_BYTES),
        TicketRing::new(slots, RECORD_BYTES),
    ];
    let header = timer_header(frames, 0);
    group.bench_function("ticket_ring_1_producer", |b| {
        b.iter_custom(|iters| {
            let mut elapsed = Duration::ZERO;
            for count in rounds(iters) {
                rings[0].clear();
                let start = Instant::now();
                for _ in 0..count {
                    assert!(rings[0].publish(black_box(&header), black_box(frames)));
                }
                elapsed += start.elapsed();
            }
            elapsed
        });
    });
    group.bench_function("ticket_ring_2_producers", |b| {
        b.iter_custom(|iters| {
            two_threads_in_rounds(
                iters,
                || rings.iter().for_each(TicketRing::clear),
                |processor, half| {
                    let header = timer_header(frames, processor);
                    let ring = &rings[usize::from(processor)];
                    for _ in 0..half {
                        assert!(ring.publish(black_box(&header), black_box(frames)));
                    }
                },
            )
        });
    });
}

/// `publish_32_frames`'s publishes into the ring, by one producer and by
/// two.
fn publish_into_the_ring(
    group: &mut BenchmarkGroup<'_, WallTime>,
    header: &RecordHeader,
    frames: &[u64; FRAMES],
) {
    let words = ring_memory();
    let shards = ring_shards(&words);
    let ring = ShardedRing::new(&shards);
    group.bench_function("ring_1_producer", |b| {
        b.iter_custom(|iters| {
            let mut elapsed = Duration::ZERO;
            for count in rounds(iters) {
                empty(&ring);
                let start = Instant::now();
                let full = publish_records(&ring, 0, black_box(header), black_box(frames), count);
                elapsed += start.elapsed();
                assert_eq!(full, 0, "a timed publish met a full shard");
            }
            elapsed
        });
    });
    assert_eq!(ring.dropped(), 0);

    // Two threads, as two processors, each publish half of every round into
    // their own shard. The time of a round is from the first producer's
    // start to the last one's end, as each thread measures it: thread
    // start-up and the barriers are not timed.
    let words = ring_memory();
    let shards = ring_shards(&words);
    let ring = ShardedRing::new(&shards);
    group.bench_function("ring_2_producers", |b| {
        b.iter_custom(|iters| {
            two_threads_in_rounds(
                iters,
                || empty(&ring),
                |processor, half| {
                    let header = timer_header(frames, processor);
                    let full = publish_records(
                        &ring,
                        u32::from(processor),
                        black_box(&header),
                        black_box(frames),
                        half,
                    );
                    assert_eq!(full, 0, "a timed publish met a full shard");
                },
            )
        });
    });
    assert_eq!(ring.dropped(), 0);
}

/// The floors the publishes are measured against, in the same group (so
/// the same run): the publish's encode without the ring, by one thread and
/// by two; and the writer word's cost alone.
fn copy_floors(
    group: &mut BenchmarkGroup<'_, WallTime>,
    header: &RecordHeader,
    frames: &[u64; FRAMES],
) {
    // The floor: the same loop and encode into plain memory as large as a
    // shard (RING_CAPACITY records, written in turn), no ring.
    let mut buffer = vec![0_u8; shard_bytes()];
    group.bench_function("plain_copy_shard_sized", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            copy_records(&mut buffer, black_box(header), black_box(frames), 0, iters);
            start.elapsed()
        });
    });

    // Two threads doing that floor at once, each into its own memory: the
    // 2-producer floor, run in the same rounds as the 2-producer publish.
    let buffers: Vec<std::sync::Mutex<Vec<u8>>> = (0..2)
        .map(|_| std::sync::Mutex::new(vec![0_u8; shard_bytes()]))
        .collect();
    group.bench_function("plain_copy_shard_sized_2_threads", |b| {
        b.iter_custom(|iters| {
            two_threads_in_rounds(
                iters,
                || {},
                |thread, half| {
                    let mut buffer = buffers[usize::from(thread)]
                        .lock()
                        .expect("one thread per buffer");
                    copy_records(&mut buffer, black_box(header), black_box(frames), 0, half);
                },
            )
        });
    });

    // What the writer word costs a publish: its compare-and-swap and
    // release store alone, on a line the thread owns (a shard's own
    // processor's case). A publish without it would save about this much,
    // but would be sound only where no two producers ever meet on a shard.
    let word = std::sync::atomic::AtomicU64::new(0);
    group.bench_function("writer_word_alone", |b| {
        b.iter(|| {
            let held = word.load(std::sync::atomic::Ordering::Relaxed);
            let taken = word.compare_exchange_weak(
                held,
                held + 1,
                std::sync::atomic::Ordering::SeqCst,
                std::sync::atomic::Ordering::Relaxed,
            );
            black_box(taken).ok();
            word.store(held + 2, std::sync::atomic::Ordering::Release);
        });
    });
}

/// Fills both shards with `count` records between them, taking turns
/// every `run` records, each a little later than the one before: with runs
/// of 1 a drain merges them one by one, with longer runs (a processor's
/// burst of events) it takes each run from one shard.
fn fill_in_runs(ring: &ShardedRing<'_>, frames: &[u64; FRAMES], count: u64, run: u64) {
    for index in 0..count {
        let processor = u16::try_from(index / run % 2).expect("0 or 1");
        let header = RecordHeader {
            timestamp: 134_081_000_000_000_000 + index,
            ..timer_header(frames, processor)
        };
        assert_eq!(
            publish_records(ring, u32::from(processor), &header, frames, 1),
            0
        );
    }
}

/// Draining a ring of `RING_CAPACITY` 32-frame records, spread over both
/// shards, into a client-sized buffer (merged by timestamp, as the driver's
/// read does) and decoding every record, frames included: the shards taking
/// turns record by record (the merge's worst case), and in runs of 16. The
/// ring is filled outside the timed region before each round.
fn drain_and_decode(c: &mut Criterion) {
    let frames = kernel_frames();
    let words = ring_memory();
    let shards = ring_shards(&words);
    let ring = ShardedRing::new(&shards);
    let mut buffer = vec![0_u8; DRAIN_BUFFER];
    let mut group = record_group(c, "drain_and_decode");
    for (name, run) in [
        ("ring_4096_into_256KiB", 1),
        ("ring_4096_in_runs_of_16_into_256KiB", 16),
    ] {
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut elapsed = Duration::ZERO;
                for count in rounds(iters) {
                    empty(&ring);
                    fill_in_runs(&ring, &frames, count, run);
                    let start = Instant::now();
                    let mut consumer = ring.consumer().expect("the only consumer");
                    let (mut drained, mut decoded, mut sum) = (0_u64, 0_u64, 0_u64);
                    loop {
                        let batch = consumer.drain(&mut buffer, record_timestamp, u64::MAX);
                        if batch.records == 0 {
                            break;
                        }
                        drained += u64::from(batch.records);
                        let (records, checksum) = decode_all(&buffer[..batch.bytes]);
                        decoded += records;
                        sum = sum.wrapping_add(checksum);
                    }
                    drop(consumer);
                    black_box(sum);
                    elapsed += start.elapsed();
                    assert_eq!((drained, decoded), (count, count));
                }
                elapsed
            });
        });
    }
    ticket_rings_drained(&mut group, &frames, &mut buffer);
    group.finish();
    assert_eq!(ring.dropped(), 0);
}

/// Decodes every record in `bytes`, frames included, as a client does:
/// how many, and a sum of their sequence numbers and frames. One function
/// for both drains, never inlined, so their decode costs the same.
#[inline(never)]
fn decode_all(bytes: &[u8]) -> (u64, u64) {
    let (mut decoded, mut sum) = (0, 0_u64);
    for record in Records::new(bytes) {
        let record = record
            .ok()
            .and_then(kstack_abi::Entry::trace)
            .expect("the ring holds valid trace records");
        sum = sum
            .wrapping_add(record.header.sequence)
            .wrapping_add(record.frames().fold(0, u64::wrapping_add));
        decoded += 1;
    }
    (decoded, sum)
}

/// The same records drained from two ticket-spinlock rings (the baseline):
/// filled alternately as the shards are, drained ring after ring (no merge
/// by time: the baseline promises no order across rings), every record
/// decoded the same way.
fn ticket_rings_drained(
    group: &mut BenchmarkGroup<'_, WallTime>,
    frames: &[u64; FRAMES],
    buffer: &mut [u8],
) {
    let slots = usize::try_from(RING_CAPACITY).expect("4096");
    let rings = [
        TicketRing::new(slots, RECORD_BYTES),
        TicketRing::new(slots, RECORD_BYTES),
    ];
    for (name, in_time_order) in [
        ("ticket_rings_4096_into_256KiB", false),
        ("ticket_rings_4096_in_time_order_into_256KiB", true),
    ] {
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut elapsed = Duration::ZERO;
                for count in rounds(iters) {
                    rings.iter().for_each(TicketRing::clear);
                    for index in 0..count {
                        let processor = u16::try_from(index % 2).expect("0 or 1");
                        let header = RecordHeader {
                            timestamp: 134_081_000_000_000_000 + index,
                            ..timer_header(frames, processor)
                        };
                        assert!(rings[usize::from(processor)].publish(&header, frames));
                    }
                    let start = Instant::now();
                    let (mut decoded, mut sum) = (0_u64, 0_u64);
                    let [first, second] = &rings;
                    loop {
                        let bytes = if in_time_order {
                            TicketRing::drain_merged(first, second, buffer, record_timestamp)
                        } else {
                            // Ring after ring: the first until it is empty.
                            match first.drain(buffer) {
                                0 => second.drain(buffer),
                                bytes => bytes,
                            }
                        };
                        if bytes == 0 {
                            break;
                        }
                        let (records, checksum) = decode_all(&buffer[..bytes]);
                        decoded += records;
                        sum = sum.wrapping_add(checksum);
                    }
                    black_box(sum);
                    elapsed += start.elapsed();
                    assert_eq!(decoded, count);
                }
                elapsed
            });
        });
    }
}

/// Entries of the benchmarked stack table: the driver's default.
const TABLE_ENTRIES: usize = 4096;
/// Events per round through the table: the references a round holds until
/// it ends (as unread records do) take a sixteenth of the entries, so an
/// insert finds all 8 slots of its window held (and would carry its frames
/// inline) about once in 16^8 = 4e9; from the 17th round on of new stacks
/// every insert replaces an old entry.
const TABLE_ROUND: u64 = 256;

/// Publishes `count` events through the table as the capture path does
/// (`DriverCore::publish`): the stack's lookup (a hit, or an insert), then
/// a 48-byte record naming the entry. With `new_stacks`, each event's stack
/// differs from every other's (its first frame is the sequence), and its
/// stack id is computed in the timed loop. Returns how many were carried
/// inline or met a full shard (whose reference is then given back, as the
/// capture path does).
fn publish_tabled(
    ring: &ShardedRing<'_>,
    table: &StackTable<'_>,
    header: &RecordHeader,
    frames: &[u64; FRAMES],
    (first, count, new_stacks): (u64, u64, bool),
) -> u64 {
    let shard = ring.shard_for(0);
    let mut stack = *frames;
    let mut missed = 0;
    for sequence in first..first + count {
        let id = if new_stacks {
            stack[0] = sequence;
            stack_id(&stack)
        } else {
            header.stack_id
        };
        let Tabled::Slot(slot) = table.enter(&stack, id, header.os_hash, shard.table_counters())
        else {
            missed += 1;
            continue;
        };
        let published = shard.publish(
            Counted::Trace(Source::Timer, UserPart::Off),
            by_id_record_size(&header.facts),
            |sequence, room| {
                let header = RecordHeader {
                    sequence,
                    stack_id: id,
                    os_hash: slot,
                    flags: header.flags.union(RecordFlags::STACK_BY_ID),
                    ..*header
                };
                encode_record(&header, &[], room).expect("the room fits a record without frames");
            },
        );
        if published.is_err() {
            table.release(slot);
            missed += 1;
        }
    }
    missed
}

/// Empties the ring (not timed), giving back the table reference of every
/// record that names an entry, as the driver's clear does.
fn empty_releasing(ring: &ShardedRing<'_>, table: &StackTable<'_>) {
    ring.consumer()
        .expect("the benchmark is the only consumer")
        .discard_each(|record| {
            if record_flags(record).contains(RecordFlags::STACK_BY_ID) {
                table.release(record_os_hash(record));
            }
        });
    assert!(ring.is_empty());
}

/// An event of a known stack (a table hit) and of a new stack (an insert,
/// and from the second round on an eviction), each published through the
/// table into the ring, beside the floor: the plain encode of that 48-byte
/// event record into shard-sized memory, in the same group and run. Every
/// round starts with an empty ring and every reference given back (untimed),
/// and asserts that no event was carried inline or dropped.
fn publish_through_the_stack_table(c: &mut Criterion) {
    let frames = kernel_frames();
    let header = timer_header(&frames, 0);
    let mut group = record_group(c, "publish_through_the_stack_table");
    let entries: Vec<StackEntry> = (0..TABLE_ENTRIES).map(|_| StackEntry::new()).collect();
    let table = StackTable::new(&entries);
    let mut first = 0;
    let words = ring_memory();
    let shards = ring_shards(&words);
    let ring = ShardedRing::new(&shards);
    // The known stack before the new stacks churn the table: it finds the
    // stack in its home slot, at the first probe.
    for (name, new_stacks) in [("known_stack", false), ("new_stack", true)] {
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut elapsed = Duration::ZERO;
                for count in rounds_of(iters, TABLE_ROUND) {
                    empty_releasing(&ring, &table);
                    let start = Instant::now();
                    let missed = publish_tabled(
                        &ring,
                        &table,
                        black_box(&header),
                        black_box(&frames),
                        (first, count, new_stacks),
                    );
                    elapsed += start.elapsed();
                    first += count;
                    assert_eq!(missed, 0, "a timed event was carried inline or dropped");
                }
                empty_releasing(&ring, &table);
                elapsed
            });
        });
    }
    let event = RecordHeader {
        flags: RecordFlags::STACK_BY_ID,
        user_frame_count: 0,
        user_part: kstack_abi::UserPart::Off,
        ..header
    };
    let mut buffer = vec![0_u8; shard_bytes()];
    group.bench_function("plain_copy_event_record", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            copy_records::<0>(&mut buffer, black_box(&event), &[], 0, iters);
            start.elapsed()
        });
    });
    // The fair floor of a known stack's tabled publish: the table's own
    // work without its synchronisation (no reference, no version): the
    // stack's home slot in a plain array of as many entries, its id and
    // every one of its 32 frames compared as the table compares them, the
    // slot put in the record, then that record's plain encode.
    let mut plain_table: Vec<PlainEntry> =
        (0..TABLE_ENTRIES).map(|_| PlainEntry::default()).collect();
    let mask = TABLE_ENTRIES - 1;
    let home = usize::try_from(header.stack_id).expect("64-bit") & mask;
    plain_table[home].id = header.stack_id;
    plain_table[home].frames[..FRAMES].copy_from_slice(&frames);
    plain_table[home].count = FRAMES;
    group.bench_function("plain_lookup_and_copy_event_record", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            copy_records_after::<0>(&mut buffer, black_box(&event), &[], (0, iters), |event| {
                let frames = black_box(&frames);
                let slot = usize::try_from(event.stack_id).expect("64-bit") & mask;
                let entry = black_box(&plain_table[slot]);
                assert!(
                    entry.holds(event.stack_id, frames),
                    "the stack is at its home slot"
                );
                event.os_hash = u32::try_from(slot).expect("a slot number");
            });
            start.elapsed()
        });
    });
    group.finish();
}

/// An entry of the fair floor's plain table.
struct PlainEntry {
    id: u64,
    count: usize,
    frames: [u64; kstack_abi::MAX_FRAMES as usize],
}

impl Default for PlainEntry {
    fn default() -> Self {
        Self {
            id: 0,
            count: 0,
            frames: [0; kstack_abi::MAX_FRAMES as usize],
        }
    }
}

impl PlainEntry {
    /// Whether the entry holds the stack `frames` under `id`: the
    /// comparison `StackEntry` makes (every frame, no early exit).
    fn holds(&self, id: u64, frames: &[u64]) -> bool {
        self.id == id
            && self.count == frames.len()
            && self
                .frames
                .iter()
                .zip(frames)
                .fold(0, |differ, (kept, frame)| differ | (kept ^ frame))
                == 0
    }
}

/// The kernel a whole capture runs on, with nothing in it that costs: the
/// walk copies the same 32 frames every time, the clock counts, the
/// "raised" section runs as it is, and user stacks cannot be walked (as
/// under Wine).
struct BenchPlatform {
    frames: [u64; FRAMES],
    clock: Cell<u64>,
}

impl Platform for BenchPlatform {
    fn irql(&self) -> u8 {
        0
    }

    fn current_ids(&self) -> (u32, u32) {
        (4, 8)
    }

    fn processor(&self) -> u32 {
        0
    }

    fn at_dispatch<R>(&self, section: impl FnOnce(u32) -> R) -> R {
        section(0)
    }

    fn timestamp(&self) -> u64 {
        let now = self.clock.get() + 1;
        self.clock.set(now);
        now
    }

    fn remaining_stack(&self) -> usize {
        16 * 1024
    }

    fn walk_stack(&self, _frames_to_skip: u32, frames: &mut [u64]) -> (usize, u32) {
        let count = frames.len().min(FRAMES);
        frames[..count].copy_from_slice(&self.frames[..count]);
        (count, 0x1234)
    }

    fn user_thread(&self) -> UserThread {
        UserThread::default()
    }

    fn walk_user_stack(&self, _frames: &mut [u64]) -> Result<usize, UserWalkFailure> {
        Err(UserWalkFailure::Faulted)
    }
}

/// No timer to start or stop, no thread to queue an APC to.
struct NoTimer;

impl SourceControl for NoTimer {
    fn set_timer(&self, _period_ms: Option<u32>) {}

    fn queue_thread_capture(
        &self,
        _thread_id: u32,
        _slot: usize,
    ) -> Result<(), ThreadRequestOutcome> {
        Err(ThreadRequestOutcome::NoSuchThread)
    }
}

/// A whole capture of a registry event whose 32-frame stack the table
/// knows, through `DriverCore::capture` (the source's configuration read,
/// the process filter and sampling checks, the stack check, the walk, the
/// stack id, the table lookup and the publish), in rounds of `TABLE_ROUND`
/// events, the ring cleared (and the table's references given back)
/// between rounds, untimed. Compare with `publish_through_the_stack_table`'s
/// `known_stack`, the publish alone.
fn capture_an_event(c: &mut Criterion) {
    let mut group = record_group(c, "capture_an_event");
    let words = ring_memory();
    let shards = ring_shards(&words);
    let entries: Vec<StackEntry> = (0..TABLE_ENTRIES).map(|_| StackEntry::new()).collect();
    let walkers = UserWalkGuard::new();
    let core = DriverCore::new(
        ShardedRing::new(&shards),
        StackTable::new(&entries),
        PagingExecutive::NOT_SET,
        DriverImage::default(),
        &[],
        &walkers,
    );
    core.set_registration(
        Source::Registry,
        SourceRegistration {
            status: STATUS_SUCCESS,
        },
    );
    let platform = BenchPlatform {
        frames: kernel_frames(),
        clock: Cell::new(134_081_000_000_000_000),
    };
    let caller = Caller {
        reader: 1,
        pool_allocations: 0,
    };
    let request = |ioctl: Ioctl, input: &[u8]| {
        let (status, _) = core.serve(ioctl, input, &mut [], &platform, &NoTimer, caller);
        assert_eq!(status, STATUS_SUCCESS, "{ioctl:?}");
    };
    let config = CaptureConfig {
        sources: SourceSet::EMPTY.with(Source::Registry),
        frames_to_capture: u16::try_from(FRAMES).expect("32"),
        ..CaptureConfig::default()
    };
    request(Ioctl::Configure, &encode_configure_request(&config));
    group.bench_function("known_stack", |b| {
        b.iter_custom(|iters| {
            timed_in_rounds(
                iters,
                || request(Ioctl::Clear, &[]),
                || {
                    let outcome = core.capture(
                        &platform,
                        black_box(SourceFacts::Registry { notify_class: 1 }),
                    );
                    assert!(matches!(outcome, CaptureOutcome::Published(_)));
                },
            )
        });
    });
    group.finish();
    let status = core.status(0);
    assert_eq!(status.dropped, 0);
    // 0 when a filter left the benchmark out.
    assert!(
        status.stack_table.inserts <= 1,
        "one stack, known after its first event"
    );
}

/// Takes every thread's APC, remembering the slot the core armed.
struct TakesApcs(Cell<usize>);

impl SourceControl for TakesApcs {
    fn set_timer(&self, _period_ms: Option<u32>) {}

    fn queue_thread_capture(
        &self,
        _thread_id: u32,
        slot: usize,
    ) -> Result<(), ThreadRequestOutcome> {
        self.0.set(slot);
        Ok(())
    }
}

/// One thread's stack on request against one capture-now, the same known
/// 32-frame stack, in rounds of `TABLE_ROUND` with the ring cleared between
/// them, untimed. `capture_now`: the request served (walk, publish, the
/// reply's record). `thread_stack`: a capture-threads request for one
/// thread served (decode, a slot armed, the APC "queued" by a control that
/// only takes it), then the delivery (`thread_delivered`: the slot's facts,
/// the counts) and its capture, and the slot freed. What the kernel does
/// between, queueing and delivering the APC, is not in it.
fn thread_stack_against_capture_now(c: &mut Criterion) {
    let mut group = record_group(c, "thread_stack_against_capture_now");
    let words = ring_memory();
    let shards = ring_shards(&words);
    let entries: Vec<StackEntry> = (0..TABLE_ENTRIES).map(|_| StackEntry::new()).collect();
    let walkers = UserWalkGuard::new();
    let slots: Vec<Slot> = (0..8).map(|_| Slot::new()).collect();
    let core = DriverCore::new(
        ShardedRing::new(&shards),
        StackTable::new(&entries),
        PagingExecutive::NOT_SET,
        DriverImage::default(),
        &slots,
        &walkers,
    );
    for source in [Source::OnDemand, Source::ThreadStack] {
        core.set_registration(
            source,
            SourceRegistration {
                status: STATUS_SUCCESS,
            },
        );
    }
    core.set_routine(Routine::Apc, HostRoutine::Available);
    let platform = BenchPlatform {
        frames: kernel_frames(),
        clock: Cell::new(134_081_000_000_000_000),
    };
    let caller = Caller {
        reader: 1,
        pool_allocations: 0,
    };
    let control = TakesApcs(Cell::new(0));
    let request = |ioctl: Ioctl, input: &[u8], output: &mut [u8]| {
        let (status, _) = core.serve(ioctl, input, output, &platform, &control, caller);
        assert_eq!(status, STATUS_SUCCESS, "{ioctl:?}");
    };
    let config = CaptureConfig {
        sources: SourceSet::EMPTY
            .with(Source::OnDemand)
            .with(Source::ThreadStack),
        frames_to_capture: u16::try_from(FRAMES).expect("32"),
        user_frames: [0; Source::COUNT],
        ..CaptureConfig::default()
    };
    request(
        Ioctl::Configure,
        &encode_configure_request(&config),
        &mut [],
    );
    let capture_now = encode_capture_now_request(7);
    let mut reply = vec![0_u8; MAX_RECORD_SIZE];
    group.bench_function("capture_now", |b| {
        b.iter_custom(|iters| {
            timed_in_rounds(
                iters,
                || request(Ioctl::Clear, &[], &mut []),
                || request(Ioctl::CaptureNow, black_box(&capture_now), &mut reply),
            )
        });
    });
    let one_thread = encode_capture_threads_request(
        &CaptureThreadsRequest::new(7, 1000, &[12]).expect("a valid request"),
    );
    let mut outcomes = [0_u8; CAPTURE_THREADS_REPLY_SIZE];
    group.bench_function("thread_stack", |b| {
        b.iter_custom(|iters| {
            timed_in_rounds(
                iters,
                || request(Ioctl::Clear, &[], &mut []),
                || {
                    request(Ioctl::CaptureThreads, black_box(&one_thread), &mut outcomes);
                    let slot = control.0.get();
                    let facts = core
                        .thread_delivered(&platform, slot)
                        .expect("the source is on");
                    let outcome = core.capture(&platform, black_box(facts));
                    assert!(matches!(outcome, CaptureOutcome::Published(_)));
                    slots[slot].release();
                },
            )
        });
    });
    group.finish();
    let status = core.status(0);
    assert_eq!(status.dropped, 0);
    assert_eq!(status.thread_captures.in_flight, 0);
}

/// The stack id of ABI 7 to 12, the baseline of [`stack_id_of_32_frames`]:
/// every frame in one multiply-rotate chain, then murmur3's finaliser.
fn serial_stack_id(frames: impl IntoIterator<Item = u64>) -> u64 {
    const K: u64 = 0x517C_C1B7_2722_0A95;
    let (hash, count) = frames
        .into_iter()
        .fold((0_u64, 0_u64), |(hash, count), frame| {
            ((hash.rotate_left(5) ^ frame).wrapping_mul(K), count + 1)
        });
    let mut h = hash ^ count;
    h ^= h >> 33;
    h = h.wrapping_mul(0xFF51_AFD7_ED55_8CCD);
    h ^= h >> 33;
    h = h.wrapping_mul(0xC4CE_B9FE_1A85_EC53);
    h ^ (h >> 33)
}

/// The stack id of a 32-frame stack as the capture computes it (ABI 13's
/// eight lanes), beside ABI 12's serial chain, in the same run. Latency:
/// each id changes the next stack (as in a capture, where the table lookup
/// waits for the id), so one id's whole chain is timed; throughput: ids of
/// one stack back to back, which a processor overlaps.
fn stack_id_of_32_frames(c: &mut Criterion) {
    let frames = kernel_frames();
    let mut group = record_group(c, "stack_id_of_32_frames");
    let mut chained = frames;
    let mut id = 0;
    group.bench_function("abi_13_eight_lanes/latency", |b| {
        b.iter(|| {
            chained[0] ^= id & 8;
            id = stack_id(&chained);
        });
    });
    group.bench_function("abi_12_serial/latency", |b| {
        b.iter(|| {
            chained[0] ^= id & 8;
            id = serial_stack_id(chained.iter().copied());
        });
    });
    group.bench_function("abi_13_eight_lanes/throughput", |b| {
        b.iter(|| stack_id(black_box(&frames)));
    });
    group.bench_function("abi_12_serial/throughput", |b| {
        b.iter(|| serial_stack_id(black_box(&frames).iter().copied()));
    });
    group.finish();
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    stack_id_of_32_frames(&mut criterion);
    publish_32_frames(&mut criterion);
    publish_through_the_stack_table(&mut criterion);
    capture_an_event(&mut criterion);
    thread_stack_against_capture_now(&mut criterion);
    drain_and_decode(&mut criterion);
    criterion.final_summary();
}
