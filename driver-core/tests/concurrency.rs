//! The concurrent parts, scenario by scenario: a few producers and the
//! consumer on one ring and on a ring of two shards, callbacks and unload
//! on the rundown gate, a read racing a clear, captures racing on the stack
//! table (the same stack, colliding stacks, a hit against an eviction, an
//! eviction while a reader takes the frames), a thread-capture slot freed by
//! its APC routine while the next request waits for it. Each scenario runs
//! two ways:
//!
//! - under loom, every interleaving (or every one up to a preemption bound):
//!   `RUSTFLAGS="--cfg loom" cargo test -p kstack-driver-core --test concurrency --release`;
//! - on real threads, [`STD_RUNS`] times, and under Miri with several seeds
//!   (`cargo +nightly miri test -p kstack-driver-core --test concurrency`,
//!   `MIRIFLAGS=-Zmiri-many-seeds=0..4`), where Miri checks every access for
//!   undefined behaviour and data races.
//!
//! `cargo xtask test` runs all three.

use kstack_abi::{Source, UserPart};
use kstack_driver_core::{
    RecordRing, Rundown, Shard, ShardedRing, StackTable, Wait, Word,
    ring::Full,
    sharded_ring::{Counted, shards_over},
    stack_table::Tabled,
    stack_table::TestTable,
    test_support::keep,
    thread_captures::{Requested, Retirement, Slot, ThreadCaptures},
};
#[cfg(loom)]
use loom::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    },
    thread,
};
#[cfg(not(loom))]
use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    },
    thread,
};

/// Runs of each scenario on real threads: enough for the host's scheduler
/// to interleave them many ways natively; Miri varies the schedule through
/// its seeds instead.
#[cfg(not(loom))]
const STD_RUNS: usize = if cfg!(miri) { 1 } else { 500 };

/// Runs `body` under loom, exploring every interleaving.
#[cfg(loom)]
fn model(body: impl Fn() + Sync + Send + 'static) {
    loom::model(body);
}

/// Runs `body` [`STD_RUNS`] times on real threads.
#[cfg(not(loom))]
fn model(body: impl Fn() + Sync + Send + 'static) {
    for _ in 0..STD_RUNS {
        body();
    }
}

/// Runs `body` under loom, exploring every interleaving with up to
/// `preemptions` preemptions: for a model too large to explore whole on
/// this machine (the read-cut model, unbounded, needs more than 10 GiB).
#[cfg(loom)]
fn bounded_model(preemptions: usize, body: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(preemptions);
    builder.check(body);
}

/// On real threads, as [`model`].
#[cfg(not(loom))]
fn bounded_model(_preemptions: usize, body: impl Fn() + Sync + Send + 'static) {
    model(body);
}

/// `count` words of ring memory, kept for the whole run. The records here
/// are all one word long, so a ring of `n` words holds `n` records.
fn words(count: usize) -> &'static [Word] {
    keep((0..count).map(|_| Word::new()).collect::<Vec<_>>())
}

/// A ring of `capacity` one-word records, kept for the whole run.
fn ring_of(capacity: usize) -> &'static RecordRing<'static> {
    keep(RecordRing::new(words(capacity)))
}

/// A ring of `capacity` one-word records in `shards` shards, kept for the
/// whole run.
fn sharded_ring_of(capacity: usize, shards: usize) -> &'static ShardedRing<'static> {
    let shards: &'static [Shard<'static>] =
        keep(shards_over(words(capacity), shards).collect::<Vec<_>>());
    keep(ShardedRing::new(shards))
}

/// The size of every record here: one word.
const RECORD: usize = 8;

/// Writes a one-word record (the ring writes its size): producer id, then a
/// check pattern and the low byte of the sequence number the ring gave it.
fn record(producer: u8) -> impl FnOnce(u64, &mut [u8]) {
    move |sequence, record| {
        record[2..7].fill(producer);
        record[7] = u8::try_from(sequence).expect("small sequence numbers");
    }
}

/// Checks the records drained into `out` are whole; notes each one's
/// producer and sequence number.
fn check(out: &[u8], seen: &mut Vec<(u8, u8)>) {
    for chunk in out.chunks_exact(8) {
        assert_eq!(u16::from_le_bytes([chunk[0], chunk[1]]), 8);
        assert!(
            chunk[2..7].iter().all(|&byte| byte == chunk[2]),
            "torn record {chunk:?}"
        );
        seen.push((chunk[2], chunk[7]));
    }
}

/// Drains what is there now.
fn drain(ring: &RecordRing<'_>, seen: &mut Vec<(u8, u8)>) {
    let mut out = [0_u8; 32];
    let drained = ring.consumer().expect("the only consumer").drain(&mut out);
    check(&out[..drained.bytes], seen);
}

/// The sequence numbers `results` got, kept and dropped alike, in order.
fn numbers_spent(results: &[Result<u64, Full>]) -> Vec<u64> {
    let mut numbers: Vec<u64> = results
        .iter()
        .map(|&result| result.unwrap_or_else(|Full { sequence }| sequence))
        .collect();
    numbers.sort_unstable();
    numbers
}

/// Two producers and a consumer that drains while they run, on a ring of
/// `capacity` that already holds `waiting` records: every record published
/// is read exactly once and whole, every failure is counted as a drop, the
/// numbers spent run on without a hole or a repeat, and nothing else
/// happens. The consumer drains once while they run and once after.
fn producers_and_consumer(capacity: usize, waiting: u8) {
    model(move || {
        let ring = ring_of(capacity);
        for _ in 0..waiting {
            ring.publish(RECORD, record(0))
                .expect("room for the waiting records");
        }
        let producers: Vec<_> = (1..=2_u8)
            .map(|id| thread::spawn(move || ring.publish(RECORD, record(id))))
            .collect();
        let mut seen = Vec::new();
        // A drain while the producers run, and one after.
        drain(ring, &mut seen);
        let results: Vec<Result<u64, Full>> = producers
            .into_iter()
            .map(|producer| producer.join().unwrap())
            .collect();
        drain(ring, &mut seen);
        let published: Vec<u8> = (0..waiting)
            .map(|_| 0)
            .chain(
                results
                    .iter()
                    .zip(1_u8..)
                    .filter_map(|(result, id)| result.is_ok().then_some(id)),
            )
            .collect();
        let mut producers_seen: Vec<u8> = seen.iter().map(|&(producer, _)| producer).collect();
        producers_seen.sort_unstable();
        assert_eq!(producers_seen, published);
        let mut sequences: Vec<u8> = seen.iter().map(|&(_, sequence)| sequence).collect();
        sequences.sort_unstable();
        sequences.dedup();
        assert_eq!(sequences.len(), seen.len(), "sequence numbers are unique");
        let first = u64::from(waiting) + 1;
        assert_eq!(
            numbers_spent(&results),
            [first, first + 1],
            "one number each, in turn"
        );
        let drops = results.iter().filter(|result| result.is_err()).count();
        assert_eq!(ring.dropped(), drops as u64);
        assert_eq!(
            ring.sequences_spent(),
            first + 1,
            "a drop spends its number too"
        );
        assert!(ring.is_empty());
    });
}

#[test]
fn ring_of_two_with_two_producers_and_a_consumer() {
    producers_and_consumer(2, 0);
}

#[test]
fn ring_of_three_with_two_producers_and_a_consumer() {
    producers_and_consumer(3, 0);
}

/// A ring of two with one record waiting: whether a producer finds it full
/// depends on when the consumer drains, so the model covers a drop beside a
/// publish (a drop spends a number inside the section like a record).
#[test]
fn ring_of_two_holding_one_with_two_producers_and_a_consumer() {
    producers_and_consumer(2, 1);
}

/// Two producers on different processors, the first publishing twice and
/// the second once, each into its own shard of two records, and a consumer
/// draining all shards while they run: every record arrives whole and
/// exactly once, from its producer's shard, numbered from 1 in that shard's
/// order, and nothing is dropped.
#[test]
fn two_shards_with_a_producer_each_and_a_consumer() {
    model(|| {
        let ring = sharded_ring_of(4, 2);
        let finished: &'static AtomicUsize = keep(AtomicUsize::new(0));
        let producers: Vec<_> = (0..2_u8)
            .map(|processor| {
                thread::spawn(move || {
                    let shard = ring.shard_for(u32::from(processor));
                    for _ in 0..2 - processor {
                        assert!(
                            shard
                                .publish(
                                    Counted::Trace(Source::Timer, UserPart::Off),
                                    RECORD,
                                    record(processor)
                                )
                                .is_ok()
                        );
                    }
                    finished.fetch_add(1, Ordering::Release);
                })
            })
            .collect();
        let mut seen = Vec::new();
        let mut wait = Wait::new("both producers to finish");
        loop {
            let done = finished.load(Ordering::Acquire) == 2;
            let mut out = [0_u8; 32];
            let mut consumer = ring.consumer().expect("the only consumer");
            // The producer's id orders the merge: any order checks it.
            let drained = consumer.drain(&mut out, |record| u64::from(record[2]), u64::MAX);
            drop(consumer);
            check(&out[..drained.bytes], &mut seen);
            if done {
                break;
            }
            wait.turn();
        }
        for producer in producers {
            producer.join().unwrap();
        }
        for (processor, expected) in [(0, &[1, 2][..]), (1, &[1])] {
            let numbers: Vec<u8> = seen
                .iter()
                .filter(|&&(producer, _)| producer == processor)
                .map(|&(_, sequence)| sequence)
                .collect();
            assert_eq!(
                numbers, expected,
                "shard {processor}'s records, in its order"
            );
        }
        assert_eq!((ring.dropped(), ring.sequences_spent()), (0, 3));
        assert!(ring.is_empty());
    });
}

/// Unload closes the gate and waits until drained; a callback that got in
/// is never still inside once unload sees the gate drained.
#[test]
fn rundown_never_frees_under_a_callback() {
    model(|| {
        let rundown = Arc::new(Rundown::new());
        let inside = Arc::new(AtomicBool::new(false));
        let callback = {
            let (rundown, inside) = (Arc::clone(&rundown), Arc::clone(&inside));
            thread::spawn(move || {
                if let Some(_guard) = rundown.enter() {
                    inside.store(true, Ordering::Relaxed);
                    inside.store(false, Ordering::Relaxed);
                }
            })
        };
        rundown.close();
        let mut wait = Wait::new("the callback to leave the rundown gate");
        while !rundown.is_drained() {
            wait.turn();
        }
        assert!(
            !inside.load(Ordering::Relaxed),
            "unload saw a callback inside"
        );
        assert!(rundown.enter().is_none());
        callback.join().unwrap();
    });
}

/// One thread-capture slot: an APC's routine delivers request 1's capture
/// and frees the slot while request 2 waits to claim it. The routine reads
/// request 1's facts, never request 2's, and request 2 gets the slot only
/// after the routine is done with it. (The kernel's queueing orders the
/// arm before the routine, as the thread's spawn does here. A routine
/// that frees the slot before reading it fails this.)
#[test]
fn an_apc_routine_and_the_next_claim_of_its_slot() {
    model(|| {
        let table = keep(ThreadCaptures::new(keep([Slot::new()])));
        let first = Requested {
            tag: 1,
            at: 10,
            timeout: 5,
        };
        let index = table.arm(first).expect("the free slot");
        let routine = thread::spawn(move || {
            let delivery = table.delivered(index, 12);
            table.release(index);
            delivery
        });
        let second = Requested {
            tag: 2,
            at: 20,
            timeout: 5,
        };
        let mut wait = Wait::new("the APC routine to free the slot");
        let claimed = loop {
            if let Some(claimed) = table.arm(second) {
                break claimed;
            }
            wait.turn();
        };
        assert_eq!(table.requested(claimed), second);
        let delivery = routine.join().unwrap();
        assert_eq!((delivery.tag, delivery.delay, delivery.late), (1, 2, false));
    });
}

/// Unload gives up waiting while two APCs' routines finish: the slots'
/// memory is freed exactly once, by unload or by the last routine.
#[test]
fn the_slots_memory_is_freed_once_when_unload_gives_up() {
    model(|| {
        let retirement = keep(Retirement::new());
        retirement.queued();
        retirement.queued();
        let routines: Vec<_> = (0..2)
            .map(|_| thread::spawn(move || usize::from(retirement.done())))
            .collect();
        let frees = usize::from(retirement.abandon())
            + routines
                .into_iter()
                .map(|routine| routine.join().unwrap())
                .sum::<usize>();
        assert_eq!(frees, 1);
        assert_eq!(retirement.pending(), 0);
    });
}

/// Two producers on a ring of two that holds one record and is not
/// drained: one publishes, the other finds it full, in either order, and
/// each takes its own number in turn.
#[test]
fn a_publish_and_a_drop_take_numbers_in_turn() {
    model(|| {
        let ring = ring_of(2);
        ring.publish(RECORD, record(0))
            .expect("room for the waiting record");
        let producers: Vec<_> = (1..=2_u8)
            .map(|id| thread::spawn(move || ring.publish(RECORD, record(id))))
            .collect();
        let results: Vec<Result<u64, Full>> = producers
            .into_iter()
            .map(|producer| producer.join().unwrap())
            .collect();
        assert_eq!(numbers_spent(&results), [2, 3], "one number each, in turn");
        assert_eq!(results.iter().filter(|result| result.is_err()).count(), 1);
        assert_eq!((ring.dropped(), ring.sequences_spent()), (1, 3));
    });
}

/// Preemptions the read-cut model explores up to.
const READ_CUT_PREEMPTIONS: usize = 5;

/// Two producers on two shards stamp their records from one clock inside
/// their publish sections, while a consumer reads twice with a cut from the
/// same clock, and once more after both are done: whatever the
/// interleaving, no record a read returns is stamped earlier than one an
/// earlier read returned, and both records arrive. (A cut taken without
/// waiting for the sections, or a stamp taken before the section, breaks
/// this.)
#[test]
fn reads_come_out_in_time_order_across_reads() {
    bounded_model(READ_CUT_PREEMPTIONS, || {
        let ring = sharded_ring_of(4, 2);
        let clock: &'static AtomicU64 = keep(AtomicU64::new(1));
        let producers: Vec<_> = (0..2_u8)
            .map(|processor| {
                thread::spawn(move || {
                    let published = ring.shard_for(u32::from(processor)).publish(
                        Counted::Trace(Source::Timer, UserPart::Off),
                        RECORD,
                        move |_, record: &mut [u8]| {
                            let stamp = clock.fetch_add(1, Ordering::SeqCst);
                            record[2] = processor;
                            record[3] = 0;
                            record[4..8].copy_from_slice(
                                &u32::try_from(stamp).expect("a small clock").to_le_bytes(),
                            );
                        },
                    );
                    assert!(published.is_ok());
                })
            })
            .collect();
        let stamp = |record: &[u8]| {
            u64::from(u32::from_le_bytes(
                record[4..8].try_into().expect("4 bytes"),
            ))
        };
        let read = || {
            let now = clock.fetch_add(1, Ordering::SeqCst);
            let mut out = [0_u8; 32];
            let mut consumer = ring.consumer().expect("the only consumer");
            let cut = consumer.cut(now);
            let drained = consumer.drain(&mut out, stamp, cut);
            out[..drained.bytes]
                .chunks_exact(8)
                .map(stamp)
                .collect::<Vec<u64>>()
        };
        let mut stamps = read();
        stamps.extend(read());
        for producer in producers {
            producer.join().unwrap();
        }
        stamps.extend(read());
        assert!(stamps.is_sorted(), "a read went back in time: {stamps:?}");
        assert_eq!(stamps.len(), 2, "both records read");
    });
}

/// A read and a clear racing while a producer publishes two records into a
/// ring of two shards: at most one of them holds the consumer side at a
/// time (the other finds it busy), every record is read, cleared or still
/// waiting exactly once and whole, and the ring's counters add up.
#[test]
fn a_read_racing_a_clear() {
    bounded_model(3, || {
        let ring = sharded_ring_of(4, 2);
        let producer = thread::spawn(move || {
            let shard = ring.shard_for(0);
            for _ in 0..2 {
                assert!(
                    shard
                        .publish(
                            Counted::Trace(Source::Timer, UserPart::Off),
                            RECORD,
                            record(1)
                        )
                        .is_ok()
                );
            }
        });
        let reader = thread::spawn(move || {
            let mut seen = Vec::new();
            if let Some(mut consumer) = ring.consumer() {
                let mut out = [0_u8; 32];
                let drained = consumer.drain(&mut out, |record| u64::from(record[7]), u64::MAX);
                check(&out[..drained.bytes], &mut seen);
            }
            seen
        });
        let cleared = ring
            .consumer()
            .map_or(0, |mut consumer| consumer.discard_all());
        producer.join().unwrap();
        let mut seen = reader.join().unwrap();
        let read = seen.len() as u64;
        assert_eq!(ring.read(), read, "the read counter counts what was read");
        let waiting = ring.len() as u64;
        let mut rest = [0_u8; 32];
        let drained = ring.consumer().expect("no one else holds it now").drain(
            &mut rest,
            |record| u64::from(record[7]),
            u64::MAX,
        );
        check(&rest[..drained.bytes], &mut seen);
        assert_eq!(u64::from(drained.records), waiting);
        assert_eq!(read + cleared + waiting, 2, "each record once");
        let mut sequences: Vec<u8> = seen.iter().map(|&(_, sequence)| sequence).collect();
        sequences.sort_unstable();
        sequences.dedup();
        assert_eq!(sequences.len(), seen.len(), "no record twice");
        assert_eq!(
            ring.sequences_spent(),
            ring.read() + ring.len() as u64 + ring.dropped() + cleared,
            "numbers spent = read + waiting + dropped + cleared"
        );
    });
}

/// A stack table of `entries` entries, kept for the whole run.
fn table_of(entries: usize) -> &'static TestTable {
    TestTable::new(entries)
}

/// The frames in `slot`, as a reader that never got them reads them.
fn frames_in(table: &StackTable<'_>, slot: u32) -> Vec<u64> {
    let mut frames = [0; kstack_abi::MAX_FRAMES as usize];
    let (_, count) = table
        .frames_for(slot, &mut frames)
        .expect("a slot of the table");
    frames[..count].to_vec()
}

/// Enters `frames` under `id`; while the reference is held, checks the
/// slot holds exactly them; gives the reference back. Returns the outcome.
fn enter_and_check(table: &TestTable, id: u64, frames: &[u64]) -> Tabled {
    let tabled = table.enter(frames, id);
    if let Tabled::Slot(slot) = tabled {
        assert_eq!(
            frames_in(table, slot),
            frames,
            "a slot holds the stack it was entered for"
        );
        table.release(slot);
    }
    tabled
}

#[test]
fn two_captures_of_one_stack_or_of_colliding_stacks_into_one_entry() {
    for other in [[1_u64, 2], [3, 4]] {
        model(move || {
            let table = table_of(1);
            let racer = thread::spawn(move || enter_and_check(table, 5, &other));
            let mine = enter_and_check(table, 5, &[1, 2]);
            let theirs = racer.join().unwrap();
            let status = table.status();
            assert_eq!(
                status.hits + status.inserts + status.collisions + status.full + status.busy,
                2
            );
            assert!(status.used <= 1);
            if other == [3, 4] && matches!((mine, theirs), (Tabled::Slot(_), Tabled::Slot(_))) {
                // Both tabled: one after the other, the first released.
                assert_eq!(status.evictions, 1);
            }
        });
    }
}

#[test]
fn a_hit_and_an_eviction_of_the_same_entry() {
    model(|| {
        let table = table_of(1);
        // Stack A in the table, no record naming it: evictable.
        let Tabled::Slot(slot) = table.enter(&[1, 2], 5) else {
            panic!("empty table")
        };
        table.release(slot);
        let evictor = thread::spawn(move || table.enter(&[7], 6));
        let hit = table.enter(&[1, 2], 5);
        let evicted = evictor.join().unwrap();
        match (hit, evicted) {
            // The hit's reference kept A in place (checked after the race).
            (Tabled::Slot(held), Tabled::Inline) => assert_eq!(frames_in(table, held), [1, 2]),
            // The eviction came first: A's id now names B, so the hit missed.
            (Tabled::Inline, Tabled::Slot(held)) => assert_eq!(frames_in(table, held), [7]),
            // Each saw the other's claim and stepped back (both counted
            // busy): bounded, and never both.
            (Tabled::Inline, Tabled::Inline) => assert_eq!(table.status().busy, 2),
            outcome @ (Tabled::Slot(_), Tabled::Slot(_)) => {
                panic!("one entry cannot hold both: {outcome:?}")
            }
        }
    });
}

#[test]
fn an_eviction_while_a_reader_takes_the_frames() {
    model(|| {
        let table = table_of(1);
        // A record in the ring names stack A.
        let Tabled::Slot(slot) = table.enter(&[1, 2, 3], 5) else {
            panic!("empty table")
        };
        let reader = thread::spawn(move || {
            let epoch = table.begin_read(1);
            let mut frames = [0; kstack_abi::MAX_FRAMES as usize];
            let (_, count) = table.frames_for(slot, &mut frames).unwrap();
            let seen = frames[..count].to_vec();
            table.sent(slot, epoch);
            table.release(slot);
            seen
        });
        let other = enter_and_check(table, 6, &[9]);
        assert_eq!(
            reader.join().unwrap(),
            [1, 2, 3],
            "never torn, never replaced under the reader"
        );
        assert!(matches!(other, Tabled::Slot(_) | Tabled::Inline));
    });
}

/// Two threads whose thread ids share a window of the user-walk guard mark
/// themselves at once: each gets its own slot, each then finds itself
/// walking (a nested capture on that thread) and never the other, and
/// both marks are gone after.
#[test]
fn two_threads_mark_themselves_in_one_window_of_the_user_walk_guard() {
    use kstack_driver_core::user_walk_guard::{Refused, UserWalkGuard, window_start};

    let sharing = (2..u32::MAX / 4)
        .map(|n: u32| n * 4)
        .find(|&id| window_start(id) == window_start(4))
        .expect("another thread id with thread 4's window");
    model(move || {
        let guard: &'static UserWalkGuard = keep(UserWalkGuard::new());
        let walkers: Vec<_> = [4_u32, sharing]
            .into_iter()
            .map(|id| {
                thread::spawn(move || {
                    let walking = guard.enter(id).expect("a free slot");
                    assert_eq!(guard.enter(id).err(), Some(Refused::Reentered));
                    drop(walking);
                })
            })
            .collect();
        for walker in walkers {
            walker.join().unwrap();
        }
        assert_eq!(guard.marked(), 0);
    });
}
