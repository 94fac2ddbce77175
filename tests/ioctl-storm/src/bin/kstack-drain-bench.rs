//! Drain throughput of the real driver (Wine benchmark, `cargo xtask
//! bench`). Each round fills the ring with capture-now records (the
//! on-demand source keeps them), then times draining it in batches through
//! the client's reader, decoding and checking every record as `kstack read`
//! does. Usage: `kstack-drain-bench RECORDS ROUNDS`; prints one line per
//! round, a summary line, `records/s` being records drained per second, and
//! last `result: <median records/s> <records per MiB of ring>` for
//! `cargo xtask bench drain`.

use std::process::ExitCode;

#[cfg(windows)]
fn main() -> ExitCode {
    match bench() {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("kstack-drain-bench: {error}");
            ExitCode::FAILURE
        }
    }
}

/// The device, timing the requests sent through it: what a drain spends
/// in the driver (and Wine's transport) as against decoding in the client.
#[cfg(windows)]
struct Timed<'a, T> {
    inner: &'a mut T,
    spent: std::time::Duration,
}

#[cfg(windows)]
impl<T: kstack_client::device::transport::Transport> kstack_client::device::transport::Transport
    for Timed<'_, T>
{
    fn control(
        &mut self,
        code: u32,
        input: &[u8],
        output: &mut [u8],
    ) -> kstack_client::device::transport::Reply {
        let started = std::time::Instant::now();
        let reply = self.inner.control(code, input, output);
        self.spent += started.elapsed();
        reply
    }
}

#[cfg(windows)]
fn bench() -> Result<(), String> {
    use std::time::Instant;

    use kstack_abi::{CaptureConfig, Source, SourceSet};
    use kstack_client::device::{
        Device,
        session::{self, Reader},
    };

    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|arg| arg.parse().map_err(|_| format!("not a number: {arg}")))
        .collect::<Result<_, _>>()?;
    let [wanted, rounds] = args[..] else {
        return Err("usage: kstack-drain-bench RECORDS ROUNDS".to_owned());
    };
    let mut device = Device::open().map_err(|error| error.to_string())?;
    // Every capture of a round may land in one shard (the requests may all
    // run on one processor): a round fills at most the smallest shard, with
    // records of at most MAX_RECORD_SIZE bytes.
    let status = session::status(&mut device).map_err(|error| error.to_string())?;
    let smallest_shard = u64::from(status.ring_capacity / status.ring_shards.max(1))
        / kstack_abi::MAX_RECORD_SIZE as u64;
    let records = wanted.min(smallest_shard);
    if records < wanted {
        println!(
            "{wanted} records per round asked for; {records}, what the smallest of {} shards of a {}-byte ring surely holds",
            status.ring_shards, status.ring_capacity
        );
    }
    let config = CaptureConfig {
        sources: SourceSet::EMPTY.with(Source::OnDemand),
        ..CaptureConfig::default()
    };
    session::configure(&mut device, &config).map_err(|error| error.to_string())?;
    session::clear(&mut device).map_err(|error| error.to_string())?;
    let mut reader = Reader::default();
    let mut rates = Vec::new();
    let mut per_mib = 0.0;
    // Round 0 warms up (the reader grows its buffer); it is not counted.
    for round in 0..=rounds {
        for tag in 0..records {
            session::capture_now(&mut device, tag).map_err(|error| error.to_string())?;
        }
        if round == 0 {
            // What these records take in the ring: records per MiB, beside
            // the 1820 that ABI 5's fixed 576-byte slots held.
            let filled = session::status(&mut device).map_err(|error| error.to_string())?;
            per_mib = f64::from(filled.ring_used) * 1_048_576.0
                / f64::from(filled.ring_used_bytes.max(1));
            println!(
                "ring: {} records in {} bytes, {per_mib:.0} records per MiB (fixed 576-byte slots: 1820); stack table: {} entries, {} hits",
                filled.ring_used,
                filled.ring_used_bytes,
                filled.stack_table.entries,
                filled.stack_table.hits
            );
        }
        let started = Instant::now();
        let mut timed = Timed {
            inner: &mut device,
            spent: std::time::Duration::ZERO,
        };
        let (drained, reads, frames) = drain(&mut reader, &mut timed)?;
        let seconds = started.elapsed().as_secs_f64();
        let in_requests = timed.spent.as_secs_f64();
        if drained != records {
            return Err(format!(
                "round {round}: filled {records}, drained {drained}"
            ));
        }
        #[expect(clippy::cast_precision_loss, reason = "a rate")]
        let rate = drained as f64 / seconds;
        println!(
            "round {round}: {drained} records ({frames} frames) in {reads} reads, {:.3} ms ({:.3} in read requests), {rate:.0} records/s{}",
            seconds * 1e3,
            in_requests * 1e3,
            if round == 0 {
                " (warm-up, not counted)"
            } else {
                ""
            }
        );
        if round > 0 {
            rates.push(rate);
        }
    }
    session::configure(&mut device, &CaptureConfig::default())
        .map_err(|error| error.to_string())?;
    rates.sort_by(f64::total_cmp);
    let (Some(low), Some(high)) = (rates.first(), rates.last()) else {
        return Err("no round was counted".to_owned());
    };
    let median = rates[rates.len() / 2];
    println!(
        "summary: {} rounds of {records} records: median {median:.0} records/s (min {low:.0}, max {high:.0})",
        rates.len(),
    );
    println!("result: {median:.0} {per_mib:.0}");
    Ok(())
}

/// Reads until nothing is pending; returns the records, reads and frames.
#[cfg(windows)]
fn drain(
    reader: &mut kstack_client::device::session::Reader,
    device: &mut impl kstack_client::device::transport::Transport,
) -> Result<(u64, u64, u64), String> {
    let (mut drained, mut reads, mut frames) = (0_u64, 0_u64, 0_u64);
    loop {
        let batch = reader.read(device).map_err(|error| error.to_string())?;
        reads += 1;
        drained += batch.records.len() as u64;
        frames += batch
            .records
            .iter()
            .map(|r| r.frames.len() as u64)
            .sum::<u64>();
        let more_pending = batch.more_pending;
        // As `session::follow` does: the next read fills this memory.
        reader.recycle(batch);
        if !more_pending {
            return Ok((drained, reads, frames));
        }
    }
}

#[cfg(not(windows))]
fn main() -> ExitCode {
    eprintln!("kstack-drain-bench talks to the kstack driver: it runs on Windows or under Wine");
    ExitCode::FAILURE
}
