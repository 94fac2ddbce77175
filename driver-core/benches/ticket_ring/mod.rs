//! The baseline issue 28 measures kstack's shards against: a plain
//! per-processor ring of fixed-size records guarded by a ticket spinlock
//! (a locked add to take a ticket, a wait for it to be served, a Release
//! store to serve the next). It keeps no timestamps in order across
//! rings, counts nothing but its sequence numbers, and its drain
//! concatenates the rings: less than kstack's shards promise (drops and
//! sources counted, reads merged in time order), so it is a floor for the
//! same records, not a design kstack could take as it is. Its drain in
//! time order (`drain_merged`) is what that order alone costs it.

use std::{
    cell::UnsafeCell,
    hint::spin_loop,
    sync::atomic::{AtomicU64, Ordering},
};

use kstack_abi::{RecordHeader, encode_record};

/// One processor's ring: `slots` records of one size, in turn.
pub struct TicketRing {
    /// The next ticket to hand out.
    next: AtomicU64,
    /// The ticket whose holder may touch `inner`.
    serving: AtomicU64,
    inner: UnsafeCell<Inner>,
}

struct Inner {
    bytes: Vec<u8>,
    record_bytes: usize,
    slots: usize,
    /// The slot the next record goes into, and the oldest one unread.
    tail: usize,
    head: usize,
    /// Records waiting.
    waiting: usize,
    sequence: u64,
}

impl Inner {
    /// The oldest record waiting.
    fn oldest(&self) -> Option<&[u8]> {
        let at = self.head * self.record_bytes;
        (self.waiting > 0).then(|| &self.bytes[at..at + self.record_bytes])
    }
}

// SAFETY: `inner` is touched only by the holder of the ticket being served
// (`locked`), one at a time; the Acquire load of `serving` and the Release
// store that serves the next ticket order each holder after the one before.
unsafe impl Sync for TicketRing {}

impl TicketRing {
    /// A ring of `slots` records of `record_bytes` bytes.
    pub fn new(slots: usize, record_bytes: usize) -> Self {
        Self {
            next: AtomicU64::new(0),
            serving: AtomicU64::new(0),
            inner: UnsafeCell::new(Inner {
                bytes: vec![0; slots * record_bytes],
                record_bytes,
                slots,
                tail: 0,
                head: 0,
                waiting: 0,
                sequence: 0,
            }),
        }
    }

    /// Runs `body` holding the ring's lock.
    fn locked<R>(&self, body: impl FnOnce(&mut Inner) -> R) -> R {
        let ticket = self.next.fetch_add(1, Ordering::Relaxed);
        while self.serving.load(Ordering::Acquire) != ticket {
            spin_loop();
        }
        // SAFETY: this ticket is served: no other thread touches `inner`
        // until the store below serves the next one.
        let result = body(unsafe { &mut *self.inner.get() });
        self.serving.store(ticket + 1, Ordering::Release);
        result
    }

    /// Encodes one record under the ring's next sequence number; `false`
    /// when the ring is full (the record is lost, uncounted).
    pub fn publish(&self, header: &RecordHeader, frames: &[u64]) -> bool {
        self.locked(|inner| {
            if inner.waiting == inner.slots {
                return false;
            }
            let at = inner.tail * inner.record_bytes;
            inner.tail = if inner.tail + 1 == inner.slots {
                0
            } else {
                inner.tail + 1
            };
            inner.waiting += 1;
            inner.sequence += 1;
            let header = RecordHeader {
                sequence: inner.sequence,
                ..*header
            };
            let room = &mut inner.bytes[at..at + inner.record_bytes];
            encode_record(&header, frames, room).expect("the slot fits the record");
            true
        })
    }

    /// Copies whole records into `out` while they fit; returns the bytes.
    pub fn drain(&self, out: &mut [u8]) -> usize {
        self.locked(|inner| {
            let size = inner.record_bytes;
            let count = inner.waiting.min(out.len() / size);
            // At most two runs: to the end of the memory, then from its start.
            let to_end = (inner.slots - inner.head).min(count);
            let rest = count - to_end;
            let from = inner.head * size;
            out[..to_end * size].copy_from_slice(&inner.bytes[from..from + to_end * size]);
            out[to_end * size..count * size].copy_from_slice(&inner.bytes[..rest * size]);
            inner.head = if rest > 0 { rest } else { inner.head + to_end };
            if inner.head == inner.slots {
                inner.head = 0;
            }
            inner.waiting -= count;
            count * size
        })
    }

    /// Copies whole records of both rings into `out` while they fit, in
    /// the order kstack's read promises: by `order` (the timestamp), the
    /// first ring's record first on a tie, one record at a time, with both
    /// locks held; returns the bytes. What that order costs these rings.
    pub fn drain_merged(
        first: &Self,
        second: &Self,
        out: &mut [u8],
        order: impl Fn(&[u8]) -> u64,
    ) -> usize {
        first.locked(|first| {
            second.locked(|second| {
                let rings = [first, second];
                let mut written = 0;
                loop {
                    let keys = rings.each_ref().map(|ring| ring.oldest().map(&order));
                    let index = match keys {
                        [Some(first), Some(second)] => usize::from(second < first),
                        [Some(_), None] => 0,
                        [None, Some(_)] => 1,
                        [None, None] => break,
                    };
                    let ring = &mut *rings[index];
                    let Some(room) = out.get_mut(written..written + ring.record_bytes) else {
                        break;
                    };
                    room.copy_from_slice(ring.oldest().expect("a record waits"));
                    written += ring.record_bytes;
                    ring.head = if ring.head + 1 == ring.slots {
                        0
                    } else {
                        ring.head + 1
                    };
                    ring.waiting -= 1;
                }
                written
            })
        })
    }

    /// Empties the ring.
    pub fn clear(&self) {
        self.locked(|inner| {
            inner.head = inner.tail;
            inner.waiting = 0;
        });
    }
}
