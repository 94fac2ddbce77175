//! Model checks (loom) of the lock-free parts: every interleaving of a few
//! producers and the consumer on the ring, and of callbacks and unload on
//! the rundown gate. Run with
//! `RUSTFLAGS="--cfg loom" cargo test -p kstack-driver-core --test loom --release`
//! (`cargo xtask test` does).

#![cfg(loom)]

use kstack_abi::MAX_RECORD_SIZE;
use kstack_driver_core::{RecordRing, Rundown, Slot};
use loom::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    thread,
};

/// Writes an 8-byte record: size, producer id, then a check pattern.
fn record(producer: u8) -> impl FnOnce(&mut [u8; MAX_RECORD_SIZE]) {
    move |slot| {
        slot[..2].copy_from_slice(&8_u16.to_le_bytes());
        slot[2..8].fill(producer);
    }
}

/// Drains what is there now; checks each record is whole.
fn drain(ring: &RecordRing<'_>, seen: &mut Vec<u8>) {
    let mut out = [0_u8; 32];
    let drained = ring.consumer().expect("the only consumer").drain(&mut out);
    for chunk in out[..drained.bytes].chunks_exact(8) {
        assert_eq!(u16::from_le_bytes([chunk[0], chunk[1]]), 8);
        assert!(
            chunk[2..8].iter().all(|&byte| byte == chunk[2]),
            "torn record {chunk:?}"
        );
        seen.push(chunk[2]);
    }
}

/// Two producers and a consumer that drains while they run, on a ring of
/// `capacity`: every record published is read exactly once and whole, every
/// failure is counted as a drop, and nothing else happens. The consumer
/// yields between drains so the model interleaves it with the producers.
fn producers_and_consumer(capacity: u64) {
    loom::model(move || {
        let slots: &'static [Slot] = Box::leak((0..capacity).map(Slot::new).collect());
        let ring: &'static RecordRing<'static> = Box::leak(Box::new(RecordRing::new(slots)));
        let finished: &'static AtomicUsize = Box::leak(Box::new(AtomicUsize::new(0)));
        let producers: Vec<_> = (1..=2_u8)
            .map(|id| {
                thread::spawn(move || {
                    let published = ring.publish(record(id)).is_ok();
                    finished.fetch_add(1, Ordering::Release);
                    published
                })
            })
            .collect();
        let mut seen = Vec::new();
        loop {
            let done = finished.load(Ordering::Acquire) == 2;
            drain(ring, &mut seen);
            if done {
                break;
            }
            thread::yield_now();
        }
        let published: Vec<u8> = producers
            .into_iter()
            .zip(1_u8..)
            .filter_map(|(producer, id)| producer.join().unwrap().then_some(id))
            .collect();
        seen.sort_unstable();
        assert_eq!(seen, published);
        assert_eq!(ring.dropped(), 2 - published.len() as u64);
        assert!(ring.is_empty());
    });
}

#[test]
fn ring_of_two_with_two_producers_and_a_consumer() {
    producers_and_consumer(2);
}

#[test]
fn ring_of_three_with_two_producers_and_a_consumer() {
    producers_and_consumer(3);
}

/// Unload closes the gate and waits until drained; a callback that got in
/// is never still inside once unload sees the gate drained.
#[test]
fn rundown_never_frees_under_a_callback() {
    loom::model(|| {
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
        while !rundown.is_drained() {
            thread::yield_now();
        }
        assert!(
            !inside.load(Ordering::Relaxed),
            "unload saw a callback inside"
        );
        assert!(rundown.enter().is_none());
        callback.join().unwrap();
    });
}
