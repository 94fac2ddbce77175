//! `kstack sample`: every thread of chosen processes captured N times a
//! second through thread-stack requests, written to a capture file that
//! every offline command and export reads. Which threads each tick asks
//! for, within its bounds, and the count of every skip are
//! `kstack_client::sampling`'s; this file lists the threads, sends the
//! requests, reads the ring between ticks and writes what it read.

use std::{
    collections::BTreeSet,
    io,
    path::PathBuf,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use clap::Args;
use kstack_abi::{ThreadRequestOutcome, thread_capture::MAX_THREAD_CAPTURES};
use kstack_client::{
    capture::stack_table::{TopLimits, counted},
    clock::system_time_now,
    device::{
        session::{self, Batch, FollowSummary, Follower},
        transport::Transport,
    },
    error::ClientError,
    live_top::Filter,
    output::width::eprint_fitted,
    sampling::{
        HZ_RANGE, MAX_THREADS_PER_TICK, SampleCounts, SampleSettings, Sampler, Selection, TickPlan,
    },
    thread_list::{self, Listing, ThreadListError},
};

use super::{
    live::{follow_summary_text, open_device, positive_seconds, stop_flag},
    output::{ForceArg, discard, is_standard_output, shown},
    save::{SyncArgs, append_batch, finish_capture, start_capture},
    symbols::SymbolsArg,
    threads::{self, fresh_tag, require_apc, with_thread_stacks},
    top,
    top_live::{self, Screen},
};

#[derive(Args)]
#[command(group = clap::ArgGroup::new("processes").required(true))]
pub struct SampleArgs {
    /// Sample every thread of this process (repeat for more processes).
    #[arg(
        long = "pid",
        value_name = "PID",
        group = "processes",
        allow_negative_numbers = true,
        value_parser = threads::process_id()
    )]
    pids: Vec<u32>,
    /// Sample every process but the idle and system processes (the driver
    /// queues no APC to system threads) and kstack's own.
    #[arg(long, group = "processes")]
    all: bool,
    /// Ticks per second (1 to 1000).
    #[arg(
        long,
        value_name = "N",
        default_value_t = 99,
        value_parser = clap::value_parser!(u32).range(
            i64::from(*HZ_RANGE.start())..=i64::from(*HZ_RANGE.end())
        )
    )]
    hz: u32,
    /// Stop after this many seconds (without it: at Ctrl-C, or when every
    /// process sampled has ended).
    #[arg(long, value_name = "SECONDS", value_parser = positive_seconds)]
    duration: Option<f64>,
    /// The most threads one tick asks for (1 to 256); the rest wait for
    /// the next tick, in turn.
    #[arg(
        long,
        value_name = "N",
        default_value_t = MAX_THREADS_PER_TICK,
        value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_THREADS_PER_TICK))
    )]
    threads_per_tick: u32,
    /// How long a thread's request holds it back from later ticks, in
    /// milliseconds (1 to 60000); a capture after it is kept, flagged late.
    #[arg(long, value_name = "MS", default_value_t = 1000, value_parser = threads::timeout_ms())]
    timeout_ms: u32,
    /// The capture file to write (`-`: standard output, which must not be
    /// a terminal; not with --live).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    file: PathBuf,
    #[command(flatten)]
    force: ForceArg,
    #[command(flatten)]
    sync: SyncArgs,
    /// Show `kstack top --live`'s view of the records as they are written
    /// (q or Ctrl-C ends the sample).
    #[arg(long)]
    live: bool,
    #[command(flatten)]
    symbols: SymbolsArg,
}

/// Between reads while a tick is not due.
const READ_INTERVAL: Duration = Duration::from_millis(10);

/// Between refreshes of the live view (`--live`).
const VIEW_REFRESH: Duration = Duration::from_secs(1);

/// The processes left out of `--all`: the idle process (0) and the system
/// process (4), whose threads are system threads.
const NOT_SAMPLED: [u32; 2] = [0, 4];

pub fn run(args: &SampleArgs) -> Result<(), ClientError> {
    if args.live && is_standard_output(&args.file) {
        return Err(ClientError::Unwritable {
            path: "standard output".to_owned(),
            reason: "--live draws its view there: write the capture to a file",
        });
    }
    let mut device = open_device()?;
    require_apc(&mut device)?;
    let selection = selection(args)?;
    let settings = SampleSettings {
        hz: args.hz,
        threads_per_tick: args.threads_per_tick,
        timeout_ms: args.timeout_ms,
    };
    let path = args.file.as_path();
    let (mut writer, ..) = start_capture(&mut device, path, args.force.force, &args.sync)?;
    let writing = |error: io::Error| ClientError::file(path, "writing", &error);
    let symbolizer = if args.live {
        Some(
            args.symbols
                .live_symbolizer(&mut device)
                .inspect_err(|_| discard(path))?,
        )
    } else {
        None
    };
    let stop = stop_flag();
    let deadline = args
        .duration
        .map(|seconds| Instant::now() + Duration::from_secs_f64(seconds));
    let session = u32::try_from(fresh_tag() >> 32).unwrap_or(u32::MAX);
    let (sampled, read) = with_thread_stacks(&mut device, "sample", |device| {
        // The view's rows and frames are `kstack top --live`'s.
        let limits = TopLimits {
            stacks: top::STACKS,
            frames: top_live::FRAMES,
        };
        let mut view = symbolizer
            .map(|symbolizer| top_live::screen(symbolizer, Filter::default(), limits))
            .transpose()?;
        let mut sampler = Sampler::new(settings, selection, session, Instant::now());
        let mut follower = Follower::default();
        let outcome = sample(
            device,
            &mut sampler,
            &mut follower,
            Bounds {
                deadline,
                timeout: Duration::from_millis(u64::from(args.timeout_ms)),
            },
            &mut thread_list::all_threads,
            &stop,
            // Coerced here: inside the Option it could not be.
            view.as_mut()
                .map(|view| -> &mut dyn Screen { view.as_mut() }),
            &mut |batch| append_batch(&mut writer, batch).map_err(writing),
        );
        // The terminal is given back before the summary is printed.
        drop(view);
        Ok((outcome.map(|end| (sampler, end)), follower.summary()))
    })
    .inspect_err(|_| discard(path))?;
    let saved = writer.trace_records();
    let ((finished, end), syncs) = finish_capture(writer, path, sampled, saved, "sample")?;
    eprint_fitted(&summary_text(
        &finished,
        &settings,
        &end,
        &read,
        &format!("{}, {}", shown(path), args.sync.text(syncs)),
    ));
    Ok(())
}

/// The processes `--pid` or `--all` choose.
fn selection(args: &SampleArgs) -> Result<Selection, ClientError> {
    Ok(if args.all {
        Selection::AllBut(
            NOT_SAMPLED
                .into_iter()
                .chain([std::process::id()])
                .collect(),
        )
    } else {
        // Each process must be running now; later, its end is followed.
        thread_list::threads_of(&args.pids).map_err(ClientError::ThreadList)?;
        Selection::Processes(args.pids.iter().copied().collect::<BTreeSet<u32>>())
    })
}

/// When a sample ends, and how long the last requests are waited for.
#[derive(Clone, Copy, Debug)]
struct Bounds {
    deadline: Option<Instant>,
    timeout: Duration,
}

/// How a sample ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ending {
    /// The duration passed.
    Duration,
    /// Ctrl-C, or q in the live view.
    Stopped,
    /// Every process sampled ended.
    ProcessesEnded,
}

/// What [`sample`] hands back: how it ended, when its last tick ran, and
/// how long it took, the last reads included.
#[derive(Clone, Copy, Debug)]
struct End {
    ending: Ending,
    last_tick: Option<Instant>,
    elapsed: Duration,
}

/// Runs the sample: at each tick, lists the threads and asks for those the
/// sampler picks; between ticks, reads the ring and hands every batch to
/// `each` (and to `view`, refreshed with the driver's status every
/// [`VIEW_REFRESH`], which also waits for the user's keys). After the last
/// tick, reads on until every queued request's record came, the timeout
/// passed since the last request, or Ctrl-C.
#[expect(
    clippy::too_many_arguments,
    reason = "the device, the sampler's state, and what the command plugs in"
)]
fn sample(
    device: &mut impl Transport,
    sampler: &mut Sampler,
    follower: &mut Follower,
    bounds: Bounds,
    list: &mut impl FnMut() -> Result<Listing, ThreadListError>,
    stop: &AtomicBool,
    mut view: Option<&mut dyn Screen>,
    each: &mut impl FnMut(&Batch) -> Result<(), ClientError>,
) -> Result<End, ClientError> {
    let started = Instant::now();
    let mut last_tick = None;
    let mut next_refresh = started + VIEW_REFRESH;
    let mut fallback_said = false;
    let ending = loop {
        let now = Instant::now();
        if stop.load(Ordering::Relaxed) {
            break Ending::Stopped;
        }
        if bounds.deadline.is_some_and(|deadline| now >= deadline) {
            break Ending::Duration;
        }
        if sampler.selection_ended() {
            break Ending::ProcessesEnded;
        }
        let wait = sampler.until_next_tick(now);
        if wait.is_zero() {
            let listing = list().map_err(ClientError::ThreadList)?;
            if let Some(note) = listing.source.fallback_note()
                && !std::mem::replace(&mut fallback_said, true)
            {
                kstack_client::eprintln_fitted!("{note}");
            }
            let plan = sampler.plan(now, system_time_now(), &listing.threads);
            last_tick = Some(now);
            // The repeated samples first: they are of this tick's listing,
            // before the captures it asks for.
            hand_on(
                &Batch {
                    records: plan.repeated.clone(),
                    ..Batch::default()
                },
                &mut view,
                each,
            )?;
            ask(device, sampler, &plan, bounds.timeout)?;
        }
        // A read after every tick too: ticks that take their whole period
        // must not starve the ring.
        let read_any = read(device, sampler, follower, &mut view, each)?;
        if let Some(view) = view.as_deref_mut()
            && now >= next_refresh
        {
            view.refresh(now, &session::status(device)?)?;
            next_refresh = now + VIEW_REFRESH;
        }
        if read_any || wait.is_zero() {
            continue;
        }
        let pause = wait.min(READ_INTERVAL);
        match view.as_deref_mut() {
            Some(view) => {
                if !view.wait(pause)? {
                    break Ending::Stopped;
                }
            }
            None => std::thread::sleep(pause),
        }
    };
    let waited_until = last_tick.map(|at| at + bounds.timeout);
    while sampler.awaiting()
        && !stop.load(Ordering::Relaxed)
        && waited_until.is_some_and(|until| Instant::now() < until)
    {
        if !read(device, sampler, follower, &mut view, each)? {
            std::thread::sleep(READ_INTERVAL);
        }
    }
    // What arrived meanwhile, whatever it is.
    while read(device, sampler, follower, &mut view, each)? {}
    Ok(End {
        ending,
        last_tick,
        elapsed: started.elapsed(),
    })
}

/// Sends a tick's requests, at most [`MAX_THREAD_CAPTURES`] ids each, and
/// gives the sampler every outcome, also those before a refused request.
fn ask(
    device: &mut impl Transport,
    sampler: &mut Sampler,
    plan: &TickPlan,
    timeout: Duration,
) -> Result<(), ClientError> {
    let timeout_ms = u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX);
    let asked = Instant::now();
    let mut outcomes: Vec<ThreadRequestOutcome> = Vec::with_capacity(plan.thread_ids.len());
    let mut refused = None;
    for chunk in plan.thread_ids.chunks(MAX_THREAD_CAPTURES) {
        match session::capture_threads(device, plan.tag, timeout_ms, chunk) {
            Ok(answered) => outcomes.extend(answered),
            Err(error) => {
                refused = Some(error);
                break;
            }
        }
    }
    sampler.answered(plan, &outcomes, asked);
    refused.map_or(Ok(()), Err)
}

/// Reads once, notes every record with the sampler and hands the batch to
/// the view and to `each`; says whether the read returned anything.
fn read(
    device: &mut impl Transport,
    sampler: &mut Sampler,
    follower: &mut Follower,
    view: &mut Option<&mut dyn Screen>,
    each: &mut impl FnMut(&Batch) -> Result<(), ClientError>,
) -> Result<bool, ClientError> {
    let mut batch = follower.read(device)?;
    for record in &mut batch.records {
        sampler.note_record(record);
    }
    hand_on(&batch, view, each)?;
    let anything = !batch.records.is_empty() || !batch.modules.is_empty();
    follower.recycle(batch);
    Ok(anything)
}

/// Hands a batch to the view and to `each`.
fn hand_on(
    batch: &Batch,
    view: &mut Option<&mut dyn Screen>,
    each: &mut impl FnMut(&Batch) -> Result<(), ClientError>,
) -> Result<(), ClientError> {
    if let Some(view) = view.as_deref_mut() {
        view.batch(batch);
    }
    each(batch)
}

/// `count` per tick over `ticks` (0 over none).
fn per_tick(count: u64, ticks: u64) -> f64 {
    #[expect(clippy::cast_precision_loss, reason = "an average to a tenth")]
    let (count, ticks) = (count as f64, ticks as f64);
    if ticks > 0.0 { count / ticks } else { 0.0 }
}

/// `count` per second over `seconds` (0 over no time).
fn rate(count: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        #[expect(clippy::cast_precision_loss, reason = "a rate to the unit")]
        let count = count as f64;
        count / seconds
    } else {
        0.0
    }
}

/// The summary on the way out: the ticks, what became of the threads and
/// requests, the records read, and where they went.
fn summary_text(
    sampler: &Sampler,
    settings: &SampleSettings,
    end: &End,
    read: &FollowSummary,
    path: &str,
) -> String {
    let counts: &SampleCounts = sampler.counts();
    let ending = match end.ending {
        Ending::Duration => "the duration passed",
        Ending::Stopped => "stopped",
        Ending::ProcessesEnded => "every process sampled ended",
    };
    let expected = end.last_tick.map_or(0, |at| sampler.expected_ticks(at));
    let seconds = end.elapsed.as_secs_f64();
    format!(
        "kstack sample: {ending} after {seconds:.1} s: {} of the {expected} due at {} Hz ran \
         ({} fell while the tick before was running); {} followed, {} of them ended\n\
         kstack sample: {} listed ({} without a state, always asked for): {} skipped while their \
         last request was pending, {} repeated without an APC (not run since their stack was \
         captured), {} left by the per-tick bound of {}, {} asked for{}\n\
         kstack sample: per tick, {:.1} threads interrupted and {:.1} repeated\n\
         kstack sample: {} queued, refused: {} no such thread, {} no slot, {} exiting, {} \
         system, {} own\n\
         kstack sample: {} captured ({:.0} a second, {} late), {} unanswered; {} of other \
         requests or sources kept too\n\
         kstack sample: written to {path}; {}\n",
        counts.ticks,
        settings.hz,
        counts.missed_ticks,
        counted(counts.threads_seen, "thread"),
        counts.threads_gone,
        counted(counts.listed, "thread-tick"),
        counts.without_state,
        counts.skipped_pending,
        counts.repeated,
        counts.skipped_over_bound,
        settings.threads_per_tick,
        counts.requested,
        if counts.unsent > 0 {
            format!(", {} not sent (the request was refused)", counts.unsent)
        } else {
            String::new()
        },
        per_tick(counts.queued, counts.ticks),
        per_tick(counts.repeated, counts.ticks),
        counted(counts.queued, "request"),
        counts.no_such_thread,
        counts.no_slot,
        counts.not_queued,
        counts.system_thread,
        counts.own,
        counted(counts.captured, "stack"),
        rate(counts.captured, seconds),
        counts.late,
        counts.awaited,
        counted(counts.other_records, "record"),
        follow_summary_text(read),
    )
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use kstack_abi::{HostRoutine, Ioctl, StatusResponse, ntstatus::KSTACK_STATUS_SOURCE_DISABLED};

    use kstack_client::{
        capture::trace::TraceRecord,
        thread_list::{ListingSource, ProcessThread, ThreadFacts, ThreadState, WaitReason},
    };

    use super::{super::fake_driver::FakeDriver, *};

    const PROCESS: u32 = 100;
    const SESSION: u32 = 0x5A;

    fn threads(process_id: u32, ids: &[u32]) -> Listing {
        Listing {
            threads: ids
                .iter()
                .map(|&thread_id| ProcessThread {
                    process_id,
                    thread_id,
                    facts: None,
                })
                .collect(),
            source: ListingSource::ProcessInformation,
        }
    }

    fn sampler(threads_per_tick: u32, timeout_ms: u32) -> Sampler {
        Sampler::new(
            SampleSettings {
                hz: 100,
                threads_per_tick,
                timeout_ms,
            },
            Selection::Processes(BTreeSet::from([PROCESS])),
            SESSION,
            Instant::now(),
        )
    }

    /// Runs `sample` for `duration` over `listings` (one per tick, the last
    /// repeated): how it ended, the counts, the records handed on, and
    /// what the driver was asked.
    fn run_sample(
        driver: &mut FakeDriver,
        sampler: &mut Sampler,
        duration: Duration,
        timeout: Duration,
        listings: &[Listing],
    ) -> (Result<End, ClientError>, u64) {
        run_sample_with_view(driver, sampler, duration, timeout, listings, None)
    }

    /// [`run_sample`], showing what it reads in `view`.
    fn run_sample_with_view(
        driver: &mut FakeDriver,
        sampler: &mut Sampler,
        duration: Duration,
        timeout: Duration,
        listings: &[Listing],
        view: Option<&mut dyn Screen>,
    ) -> (Result<End, ClientError>, u64) {
        let mut follower = Follower::default();
        let mut listed = 0;
        let mut handed_on = 0;
        let ended = sample(
            driver,
            sampler,
            &mut follower,
            Bounds {
                deadline: Some(Instant::now() + duration),
                timeout,
            },
            &mut || {
                let listing = listings[listed.min(listings.len() - 1)].clone();
                listed += 1;
                Ok(listing)
            },
            &AtomicBool::new(false),
            view,
            &mut |batch| {
                handed_on += batch
                    .records
                    .iter()
                    .filter(|record| !record.sample.is_some_and(|facts| facts.repeated))
                    .count() as u64;
                Ok(())
            },
        );
        assert_eq!(follower.summary().received, handed_on);
        (ended, handed_on)
    }

    /// Thread 1 of `PROCESS`, blocked in a user-mode wait, switched to
    /// `switches` times.
    fn sleeping(switches: u32) -> Listing {
        let mut listing = threads(PROCESS, &[1]);
        listing.threads[0].facts = Some(ThreadFacts {
            state: Some(ThreadState::WAITING),
            wait_reason: WaitReason(6),
            context_switches: switches,
            kernel_time: 7,
            user_time: 0,
            create_time: 0,
        });
        listing
    }

    #[test]
    fn a_sleeping_thread_is_interrupted_twice_then_its_stack_repeated() {
        let mut driver = FakeDriver::new(vec![]);
        driver.delivers = true;
        let mut sampler = sampler(8, 40);
        let mut follower = Follower::default();
        // Switched to once more after each of the first two ticks: the
        // APCs' own switch-ins.
        let mut listings = [sleeping(5), sleeping(6)].into_iter();
        let last = sleeping(7);
        let mut written: Vec<TraceRecord> = Vec::new();
        let ended = sample(
            &mut driver,
            &mut sampler,
            &mut follower,
            Bounds {
                deadline: Some(Instant::now() + Duration::from_millis(100)),
                timeout: Duration::from_millis(40),
            },
            &mut || Ok(listings.next().unwrap_or_else(|| last.clone())),
            &AtomicBool::new(false),
            None,
            &mut |batch| {
                written.extend(batch.records.iter().cloned());
                Ok(())
            },
        );
        assert_eq!(ended.unwrap().ending, Ending::Duration);
        assert_eq!(
            driver.requests.len(),
            2,
            "two APCs, at the first two ticks: the same stack twice"
        );
        let counts = *sampler.counts();
        assert!(counts.ticks >= 5, "{counts:?}");
        assert_eq!((counts.captured, counts.repeated), (2, counts.ticks - 2));
        assert_eq!(written.len() as u64, counts.ticks);
        let captured = &written[1];
        for (index, sample) in written.iter().enumerate() {
            let facts = sample.sample.unwrap();
            assert_eq!(facts.repeated, index >= 2, "sample {index}");
        }
        for repeated in &written[2..] {
            assert_eq!(
                (repeated.header.sequence, &repeated.frames),
                (captured.header.sequence, &captured.frames),
                "a copy of the last capture"
            );
        }
    }

    #[test]
    fn every_tick_asks_within_its_bound_and_every_record_is_handed_on() {
        let mut driver = FakeDriver::new(vec![]);
        driver.delivers = true;
        // Thread 3's APC never runs: it is asked for again once its
        // request is older than the timeout, never before.
        driver.never_run.insert(3);
        let mut listing = threads(PROCESS, &[1, 2, 3]);
        listing.threads.extend(threads(PROCESS + 1, &[9]).threads);
        let mut sampler = sampler(2, 40);
        let (ended, handed_on) = run_sample(
            &mut driver,
            &mut sampler,
            Duration::from_millis(200),
            Duration::from_millis(40),
            &[listing],
        );
        let end = ended.unwrap();
        assert_eq!(end.ending, Ending::Duration);
        let counts = *sampler.counts();
        assert!(counts.ticks >= 10, "{counts:?}");
        let asked: Vec<Vec<u32>> = driver
            .requests
            .iter()
            .map(|r| r.requested().to_vec())
            .collect();
        assert!(
            asked.iter().all(|ids| ids.len() <= 2 && !ids.contains(&9)),
            "{asked:?}"
        );
        let asked_for_3 = asked.iter().filter(|ids| ids.contains(&3)).count() as u64;
        assert!(
            (2..=6).contains(&asked_for_3),
            "thread 3 asked for {asked_for_3} times in 200 ms with a 40 ms hold"
        );
        assert_eq!(counts.captured, handed_on, "every record is this sample's");
        assert_eq!(
            counts.awaited, asked_for_3,
            "thread 3's requests are unanswered"
        );
        assert_eq!(counts.queued, counts.captured + counts.awaited);
        assert_eq!(
            counts.requested,
            asked.iter().map(Vec::len).sum::<usize>() as u64
        );
        assert!(
            counts.skipped_pending > 0 && counts.skipped_over_bound > 0,
            "{counts:?}"
        );
        assert!(driver.requests.iter().all(|r| r.timeout_ms == 40));
    }

    /// A live view that counts what it is shown and quits at its
    /// `quit_at`th wait.
    #[derive(Default)]
    struct CountingView {
        records: u64,
        refreshes: usize,
        waits: usize,
        quit_at: usize,
    }

    impl Screen for CountingView {
        fn batch(&mut self, batch: &Batch) {
            self.records += batch.records.len() as u64;
        }

        fn refresh(&mut self, _now: Instant, status: &StatusResponse) -> Result<(), ClientError> {
            assert_eq!(status.apc, HostRoutine::Available, "the driver's status");
            self.refreshes += 1;
            Ok(())
        }

        fn wait(&mut self, timeout: Duration) -> Result<bool, ClientError> {
            std::thread::sleep(timeout);
            self.waits += 1;
            Ok(self.waits < self.quit_at)
        }
    }

    #[test]
    fn the_live_view_sees_every_record_is_refreshed_and_can_end_the_sample() {
        let mut driver = FakeDriver::new(vec![]);
        driver.delivers = true;
        let mut sampler = sampler(8, 1000);
        // About 1.5 s of 10 ms waits: past the first refresh.
        let mut view = CountingView {
            quit_at: 150,
            ..CountingView::default()
        };
        let (ended, handed_on) = run_sample_with_view(
            &mut driver,
            &mut sampler,
            Duration::from_secs(30),
            Duration::from_secs(1),
            &[threads(PROCESS, &[1, 2])],
            Some(&mut view),
        );
        assert_eq!(ended.unwrap().ending, Ending::Stopped, "q in the view");
        assert_eq!(view.records, handed_on);
        assert!(
            handed_on > 0 && view.refreshes >= 1,
            "{} refreshes",
            view.refreshes
        );
    }

    #[test]
    fn ticks_that_take_their_whole_period_still_read_and_count_the_missed_ones() {
        let mut driver = FakeDriver::new(vec![]);
        driver.delivers = true;
        let mut sampler = sampler(8, 1000);
        let mut follower = Follower::default();
        // Listing takes 25 ms at 100 Hz: a tick is always due.
        let ended = sample(
            &mut driver,
            &mut sampler,
            &mut follower,
            Bounds {
                deadline: Some(Instant::now() + Duration::from_millis(250)),
                timeout: Duration::from_secs(1),
            },
            &mut || {
                std::thread::sleep(Duration::from_millis(25));
                Ok(threads(PROCESS, &[1]))
            },
            &AtomicBool::new(false),
            None,
            &mut |_| Ok(()),
        );
        assert_eq!(ended.unwrap().ending, Ending::Duration);
        let counts = sampler.counts();
        assert!(counts.missed_ticks >= counts.ticks, "{counts:?}");
        assert!(
            driver.read_requests as u64 >= counts.ticks,
            "{} reads over {} ticks",
            driver.read_requests,
            counts.ticks
        );
        assert_eq!(counts.captured, counts.queued);
    }

    #[test]
    fn a_sample_ends_when_its_processes_end() {
        let mut driver = FakeDriver::new(vec![]);
        driver.delivers = true;
        let mut sampler = sampler(8, 1000);
        let (ended, handed_on) = run_sample(
            &mut driver,
            &mut sampler,
            Duration::from_secs(30),
            Duration::from_secs(1),
            &[
                threads(PROCESS, &[1, 2]),
                threads(PROCESS, &[2]),
                threads(PROCESS, &[]),
            ],
        );
        assert_eq!(ended.unwrap().ending, Ending::ProcessesEnded);
        let counts = sampler.counts();
        assert_eq!(
            (counts.ticks, counts.threads_seen, counts.threads_gone),
            (3, 2, 2)
        );
        assert_eq!((counts.captured, handed_on), (3, 3));
    }

    #[test]
    fn a_refused_request_ends_the_sample_and_what_came_before_counts() {
        let mut driver = FakeDriver::new(vec![]);
        driver.delivers = true;
        driver.refuse_from = Some((1, KSTACK_STATUS_SOURCE_DISABLED));
        let ids: Vec<u32> = (1..=70).collect();
        let mut sampler = sampler(256, 1000);
        let (ended, _) = run_sample(
            &mut driver,
            &mut sampler,
            Duration::from_secs(30),
            Duration::from_secs(1),
            &[threads(PROCESS, &ids)],
        );
        assert_eq!(
            ended.unwrap_err(),
            ClientError::Refused {
                request: Ioctl::CaptureThreads,
                status: KSTACK_STATUS_SOURCE_DISABLED
            }
        );
        let counts = sampler.counts();
        assert_eq!(
            (counts.requested, counts.queued, counts.unsent),
            (64, 64, 6)
        );
    }

    #[test]
    fn the_summary_accounts_for_every_thread_and_request() {
        let mut driver = FakeDriver::new(vec![]);
        driver.delivers = true;
        driver.refused = [(2, ThreadRequestOutcome::NoSuchThread)].into();
        let mut sampler = sampler(8, 1000);
        let (ended, _) = run_sample(
            &mut driver,
            &mut sampler,
            Duration::from_secs(30),
            Duration::from_secs(1),
            &[threads(PROCESS, &[1, 2]), threads(PROCESS, &[])],
        );
        let end = End {
            elapsed: Duration::from_secs(2),
            ..ended.unwrap()
        };
        let settings = SampleSettings {
            hz: 100,
            threads_per_tick: 8,
            timeout_ms: 1000,
        };
        let read = FollowSummary {
            received: 1,
            ..FollowSummary::default()
        };
        assert_eq!(
            summary_text(&sampler, &settings, &end, &read, "out.kstack"),
            "kstack sample: every process sampled ended after 2.0 s: 2 of the 2 due at 100 Hz \
             ran (0 fell while the tick before was running); 2 threads followed, 2 of them \
             ended\n\
             kstack sample: 2 thread-ticks listed (2 without a state, always asked for): 0 \
             skipped while their last request was pending, 0 repeated without an APC (not run \
             since their stack was captured), 0 left by the per-tick bound of 8, 2 asked for\n\
             kstack sample: per tick, 0.5 threads interrupted and 0.0 repeated\n\
             kstack sample: 1 request queued, refused: 1 no such thread, 0 no slot, 0 exiting, \
             0 system, 0 own\n\
             kstack sample: 1 stack captured (0 a second, 0 late), 0 unanswered; 0 records of \
             other requests or sources kept too\n\
             kstack sample: written to out.kstack; 1 records, 0 module records, 0 sequence \
             gaps, 0 dropped by the driver (ring full) meanwhile\n"
        );
    }

    #[derive(Parser)]
    struct Command {
        #[command(flatten)]
        sample: SampleArgs,
    }

    #[test]
    fn the_command_line_takes_processes_or_all_and_bounds_in_range() {
        let parsed = Command::try_parse_from(["sample", "--pid", "4", "--pid", "8", "-o", "x"])
            .unwrap()
            .sample;
        assert_eq!(
            (
                parsed.pids,
                parsed.hz,
                parsed.threads_per_tick,
                parsed.timeout_ms
            ),
            (vec![4, 8], 99, 256, 1000)
        );
        let parsed = Command::try_parse_from([
            "sample",
            "--all",
            "--hz",
            "1000",
            "--duration",
            "0.5",
            "--threads-per-tick",
            "1",
            "--output",
            "x",
        ])
        .unwrap()
        .sample;
        assert!(parsed.all);
        assert_eq!(
            (parsed.hz, parsed.duration, parsed.threads_per_tick),
            (1000, Some(0.5), 1)
        );
        for args in [
            &["sample", "-o", "x"][..],
            &["sample", "--pid", "4"],
            &["sample", "--pid", "4", "--all", "-o", "x"],
            &["sample", "--pid", "4", "--hz", "0", "-o", "x"],
            &["sample", "--pid", "4", "--hz", "1001", "-o", "x"],
            &[
                "sample",
                "--pid",
                "4",
                "--threads-per-tick",
                "257",
                "-o",
                "x",
            ],
            &["sample", "--pid", "4", "--duration", "0", "-o", "x"],
            &["sample", "--pid", "4", "--duration", "nan", "-o", "x"],
            &["sample", "--pid", "4", "--timeout-ms", "0", "-o", "x"],
        ] {
            assert!(Command::try_parse_from(args).is_err(), "{args:?}");
        }
        let missing = Command::try_parse_from(["sample", "-o", "x"])
            .err()
            .unwrap()
            .to_string();
        assert!(
            missing.contains("--pid") && missing.contains("--all"),
            "{missing}"
        );
        let negative = Command::try_parse_from(["sample", "--pid", "-5", "-o", "x"])
            .err()
            .unwrap()
            .to_string();
        assert!(negative.contains("-5 is not in 0..="), "{negative}");
    }
}
