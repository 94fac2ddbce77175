//! Read order under load (Wine test): `THREADS` threads send capture-now
//! requests as fast as they can for `MILLISECONDS`, each on its own handle,
//! while the main thread drains; whatever else runs meanwhile (the timer,
//! other processes reading and capturing) is up to the caller. Every record
//! this process reads must be stamped no earlier than the one before it,
//! across all its reads (two readers each see an ordered part of one
//! ordered stream). A read refused as busy (another reader) is tried again.
//! Usage: `kstack-order-check THREADS MILLISECONDS`; ends with the line
//! `order-check: R records in N reads (B busy), C captures sent, 0 out of order`.

use std::process::ExitCode;

#[cfg(windows)]
fn main() -> ExitCode {
    match check() {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("kstack-order-check: {error}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(windows)]
fn check() -> Result<(), String> {
    use std::{
        sync::atomic::{AtomicBool, AtomicU64, Ordering},
        thread,
        time::{Duration, Instant},
    };

    use kstack_abi::{Ioctl, ntstatus::STATUS_DEVICE_BUSY};
    use kstack_client::{
        device::{
            Device,
            session::{self, Reader},
        },
        error::ClientError,
    };

    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|arg| arg.parse().map_err(|_| format!("not a number: {arg}")))
        .collect::<Result<_, _>>()?;
    let [threads, milliseconds] = args[..] else {
        return Err("usage: kstack-order-check THREADS MILLISECONDS".to_owned());
    };
    let mut device = Device::open().map_err(|error| error.to_string())?;
    let capturing = AtomicBool::new(true);
    let sent = AtomicU64::new(0);
    let mut reader = Reader::default();
    let (mut records, mut reads, mut busy, mut last) = (0_u64, 0_u64, 0_u64, 0_u64);
    let mut read_once = |device: &mut Device| -> Result<bool, String> {
        match reader.read(device) {
            Ok(batch) => {
                reads += 1;
                for record in &batch.records {
                    let stamped = record.header.timestamp;
                    if stamped < last {
                        return Err(format!(
                            "out of order after {records} records: shard {} sequence {} stamped {stamped}, \
                             after a record stamped {last}",
                            record.header.shard, record.header.sequence
                        ));
                    }
                    last = stamped;
                    records += 1;
                }
                Ok(batch.more_pending)
            }
            Err(ClientError::Refused {
                request: Ioctl::Read,
                status: STATUS_DEVICE_BUSY,
            }) => {
                busy += 1;
                Ok(true)
            }
            Err(error) => Err(error.to_string()),
        }
    };
    thread::scope(|scope| -> Result<(), String> {
        let senders: Vec<_> = (0..threads)
            .map(|_| {
                let (capturing, sent) = (&capturing, &sent);
                scope.spawn(move || -> Result<(), String> {
                    let mut device = Device::open().map_err(|error| error.to_string())?;
                    let mut tag = 0;
                    while capturing.load(Ordering::Relaxed) {
                        session::capture_now(&mut device, tag)
                            .map_err(|error| error.to_string())?;
                        tag += 1;
                        sent.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(())
                })
            })
            .collect();
        let deadline = Instant::now() + Duration::from_millis(milliseconds);
        let drained = (|| {
            while Instant::now() < deadline {
                read_once(&mut device)?;
            }
            Ok(())
        })();
        capturing.store(false, Ordering::Relaxed);
        for sender in senders {
            sender
                .join()
                .map_err(|_| "a capture thread panicked".to_owned())??;
        }
        drained
    })?;
    // What the senders left, until a read leaves nothing pending.
    let give_up = Instant::now() + Duration::from_secs(5);
    while read_once(&mut device)? {
        if Instant::now() > give_up {
            return Err("the ring did not drain within 5 s".to_owned());
        }
    }
    println!(
        "order-check: {records} records in {reads} reads ({busy} busy), {} captures sent, 0 out of order",
        sent.load(Ordering::Relaxed)
    );
    Ok(())
}

#[cfg(not(windows))]
fn main() -> ExitCode {
    eprintln!("kstack-order-check talks to the kstack driver: it runs on Windows or under Wine");
    ExitCode::FAILURE
}
