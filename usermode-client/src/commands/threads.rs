//! `kstack threads`: other threads' stacks on request. The driver queues a
//! special kernel APC to each thread named (`kstack_abi::Ioctl::CaptureThreads`),
//! which captures the thread's stack in the thread itself; the records
//! come back through the ring like any other, and are told apart here by
//! the request's tag and the thread id.

use std::{
    collections::BTreeMap,
    io::{self, Write},
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use clap::Args;
use kstack_abi::{
    CaptureConfig, HostRoutine, Source, SourceFacts, StatusResponse, ThreadRequestOutcome,
    thread_capture::THREAD_CAPTURE_TIMEOUT_MS_RANGE,
};
use kstack_client::{
    capture::{
        stack_table,
        trace::{JSON_SCHEMA_VERSION, TraceRecord},
    },
    clock::{cpu_time_text, system_time_now},
    device::{
        session::{self, Follow},
        transport::Transport,
    },
    error::ClientError,
    naming::symbolizer::Symbolizer,
    output::width::{Stream, fit, width},
    thread_list::{self, ProcessThread, ThreadFacts, ThreadState},
};
use serde_json::{Value, json};

use super::{
    live::{open_device, stop_flag},
    output::RecordFormat,
};

#[derive(Args)]
#[command(group = clap::ArgGroup::new("targets").required(true).multiple(true))]
pub struct ThreadsArgs {
    /// Capture this thread's stack (repeat for more threads).
    #[arg(
        long = "tid",
        value_name = "TID",
        group = "targets",
        allow_negative_numbers = true,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    tids: Vec<u32>,
    /// Capture the stack of every thread of this process, as listed when
    /// the command starts (repeat for more processes).
    #[arg(
        long = "pid",
        value_name = "PID",
        group = "targets",
        allow_negative_numbers = true,
        value_parser = process_id()
    )]
    pids: Vec<u32>,
    /// How long to wait for the captures, in milliseconds (1 to 60000).
    #[arg(long, value_name = "MS", default_value_t = 1000, value_parser = timeout_ms())]
    timeout_ms: u32,
    /// List the threads of each --pid (of every process without one) with
    /// what they were doing: state, wait reason, context switches and CPU
    /// time. Captures no stack and needs no driver.
    #[arg(long, group = "targets", conflicts_with_all = ["tids", "timeout_ms", "call_trace"])]
    list: bool,
    #[command(flatten)]
    format: RecordFormat,
}

/// `--pid`: any 32-bit process id; a negative one gets the range error.
pub fn process_id() -> clap::builder::RangedI64ValueParser<u32> {
    clap::value_parser!(u32).range(0..)
}

/// `--timeout-ms`: a capture-threads request's timeout, as the driver
/// takes it.
pub fn timeout_ms() -> clap::builder::RangedI64ValueParser<u32> {
    clap::value_parser!(u32).range(
        i64::from(*THREAD_CAPTURE_TIMEOUT_MS_RANGE.start())
            ..=i64::from(*THREAD_CAPTURE_TIMEOUT_MS_RANGE.end()),
    )
}

/// A thread asked for: its id, and its process and what it was doing when
/// the command listed it (`--pid`; the facts where the system gives them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Target {
    thread_id: u32,
    process_id: Option<u32>,
    facts: Option<ThreadFacts>,
}

/// What became of one thread asked for.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    /// The driver queued no APC to it; the outcome says why.
    Refused(ThreadRequestOutcome),
    /// Its record arrived.
    Captured(TraceRecord),
    /// An APC was queued, but no record came before the wait ended.
    Missing,
}

/// Between reads while captures are awaited.
const READ_INTERVAL: Duration = Duration::from_millis(10);

pub fn run(args: &ThreadsArgs) -> Result<(), ClientError> {
    if args.list {
        return list(&args.pids, args.format.json.json);
    }
    let mut device = open_device()?;
    require_apc(&mut device)?;
    let mut symbolizer = args.format.live_symbolizer(&mut device)?;
    let targets = targets(&args.tids, &args.pids)?;
    let stop = stop_flag();
    with_thread_stacks(&mut device, "threads", |device| {
        let answers = capture(
            device,
            &targets,
            args.timeout_ms,
            fresh_tag(),
            &mut symbolizer,
            &stop,
        )?;
        let mut out = io::stdout().lock();
        // A closed pipe ends the output, not in an error.
        let _ = if args.format.json.json {
            answers.iter().try_for_each(|(target, answer)| {
                writeln!(out, "{}", answer_json(*target, answer, &symbolizer))
            })
        } else {
            let mut text = Vec::new();
            let _ = write_text(
                &answers,
                &symbolizer,
                args.format.call_trace,
                args.timeout_ms,
                &mut text,
            );
            let text = String::from_utf8_lossy(&text);
            out.write_all(fit(&text, width(Stream::Stdout)).as_bytes())
        };
        kstack_client::eprintln_fitted!(
            "kstack threads: {}",
            summary_text(&answers, args.timeout_ms)
        );
        Ok(())
    })
}

/// `--list`: each listed thread on a line (text) or an object (JSON), and
/// how they were listed on stderr when Toolhelp stood in.
fn list(pids: &[u32], json: bool) -> Result<(), ClientError> {
    let listing = if pids.is_empty() {
        thread_list::all_threads()
    } else {
        thread_list::threads_of(pids)
    }
    .map_err(ClientError::ThreadList)?;
    if let Some(note) = listing.source.fallback_note() {
        kstack_client::eprintln_fitted!("{note}");
    }
    let mut out = io::stdout().lock();
    for thread in &listing.threads {
        // A closed pipe ends the output, not in an error.
        let written = if json {
            writeln!(out, "{}", listed_json(thread))
        } else {
            writeln!(out, "{}", listed_text(thread))
        };
        if written.is_err() {
            break;
        }
    }
    kstack_client::eprintln_fitted!(
        "kstack threads: {} listed",
        stack_table::counted(listing.threads.len() as u64, "thread")
    );
    Ok(())
}

/// `thread 104 (process 100): waiting (UserRequest), 12 switches, CPU
/// 1.5 ms`; without a state (Wine), the CPU time only.
fn listed_text(thread: &ProcessThread) -> String {
    let facts = match thread.facts {
        None => "no facts (listed by Toolhelp)".to_owned(),
        Some(facts) if facts.state.is_none() => format!(
            "state unknown (the system lists none), CPU {}",
            cpu_time_text(facts.cpu_time())
        ),
        Some(facts) => format!(
            "{}, {} switches, CPU {}",
            facts.state_text(),
            facts.context_switches,
            cpu_time_text(facts.cpu_time())
        ),
    };
    format!(
        "thread {} (process {}): {facts}",
        thread.thread_id, thread.process_id
    )
}

/// One listed thread as JSON: `schema`, `thread_id`, `process_id`,
/// `state`, `wait_reason` (null unless waiting), `context_switches` (null
/// without a state), `cpu_time_100ns` (null without facts).
fn listed_json(thread: &ProcessThread) -> Value {
    let facts = thread.facts;
    let state = facts.and_then(|facts| facts.state);
    json!({
        "schema": JSON_SCHEMA_VERSION,
        "thread_id": thread.thread_id,
        "process_id": thread.process_id,
        "state": state.map(ThreadState::name),
        "wait_reason": facts
            .filter(ThreadFacts::waiting)
            .map(|facts| facts.wait_reason.name()),
        "context_switches": facts
            .filter(|_| state.is_some())
            .map(|facts| facts.context_switches),
        "cpu_time_100ns": facts.map(|facts| facts.cpu_time()),
    })
}

/// The threads asked for: the `--tid`s, then every thread of each
/// `--pid`; a thread named twice is asked for once.
fn targets(tids: &[u32], pids: &[u32]) -> Result<Vec<Target>, ClientError> {
    let listed = if pids.is_empty() {
        Vec::new()
    } else {
        thread_list::threads_of(pids)
            .map_err(ClientError::ThreadList)?
            .threads
    };
    let named = tids.iter().map(|&thread_id| Target {
        thread_id,
        process_id: None,
        facts: None,
    });
    let of_processes = listed.into_iter().map(|thread| Target {
        thread_id: thread.thread_id,
        process_id: Some(thread.process_id),
        facts: thread.facts,
    });
    let mut targets: Vec<Target> = Vec::new();
    for target in named.chain(of_processes) {
        if !targets
            .iter()
            .any(|known| known.thread_id == target.thread_id)
        {
            targets.push(target);
        }
    }
    Ok(targets)
}

/// A tag no other request is likely to carry: the time now (100 ns units)
/// mixed with this process's id.
pub fn fresh_tag() -> u64 {
    system_time_now().rotate_left(16) ^ u64::from(std::process::id())
}

/// The driver's status, or the reason it cannot queue APCs: the first
/// thing a thread-stack command checks (`docs/client.md`: before the
/// threads are listed, before anything changes).
pub fn require_apc(device: &mut impl Transport) -> Result<StatusResponse, ClientError> {
    let status = session::status(device)?;
    if status.apc == HostRoutine::Available {
        Ok(status)
    } else {
        Err(ClientError::NoApc { apc: status.apc })
    }
}

/// Runs `capture` with the threadstack source enabled. A driver that
/// cannot queue APCs is reported before anything changes. When the source
/// is off, it is turned on for `capture` (saying so on stderr, as
/// `kstack <command>`) and the previous configuration put back
/// afterwards, whether `capture` succeeded or not.
pub fn with_thread_stacks<D: Transport, T>(
    device: &mut D,
    command: &str,
    capture: impl FnOnce(&mut D) -> Result<T, ClientError>,
) -> Result<T, ClientError> {
    let previous = require_apc(device)?.config;
    if previous.sources.contains(Source::ThreadStack) {
        return capture(device);
    }
    let enabled = CaptureConfig {
        sources: previous.sources.with(Source::ThreadStack),
        ..previous
    };
    session::configure(device, &enabled)?;
    kstack_client::eprintln_fitted!(
        "kstack {command}: enabled the threadstack source for this command; the previous \
         configuration is put back at the end"
    );
    let result = capture(device);
    let restored = session::configure(device, &previous);
    if let Err(error) = &restored {
        kstack_client::eprintln_fitted!(
            "kstack {command}: warning: the previous configuration could not be put back \
             ({error}); threadstack stays enabled: kstack config --disable threadstack"
        );
    }
    let value = result?;
    restored.map(|()| value)
}

/// Asks for the targets' stacks with `tag`, then reads the ring until
/// every queued thread's record arrived, `timeout_ms` passed (counted from
/// the last request), or `stop` was set (Ctrl-C). Records of other
/// requests and of other sources are read and passed over: like every
/// reader, this drains the ring. Module records keep `symbolizer` current.
fn capture(
    device: &mut impl Transport,
    targets: &[Target],
    timeout_ms: u32,
    tag: u64,
    symbolizer: &mut Symbolizer,
    stop: &AtomicBool,
) -> Result<Vec<(Target, Answer)>, ClientError> {
    let ids: Vec<u32> = targets.iter().map(|target| target.thread_id).collect();
    let outcomes = session::capture_threads(device, tag, timeout_ms, &ids)?;
    let deadline = Instant::now() + Duration::from_millis(u64::from(timeout_ms));
    let mut awaited: BTreeMap<u32, Option<TraceRecord>> = ids
        .iter()
        .zip(&outcomes)
        .filter(|&(_, &outcome)| outcome == ThreadRequestOutcome::Queued)
        .map(|(&id, _)| (id, None))
        .collect();
    let mut missing = awaited.len();
    if missing > 0 {
        let until = Follow::UntilStopped {
            deadline: Some(deadline),
            interval: READ_INTERVAL,
        };
        session::follow(device, until, stop, |batch| {
            symbolizer.note_modules(&batch.modules);
            for record in &batch.records {
                if let SourceFacts::ThreadStack {
                    tag: record_tag,
                    target_thread_id,
                    ..
                } = record.header.facts
                    && record_tag == tag
                    && let Some(slot @ None) = awaited.get_mut(&target_thread_id)
                {
                    *slot = Some(record.clone());
                    missing -= 1;
                }
            }
            if missing == 0 {
                // Every answer is in: the same flag as Ctrl-C ends the reads.
                stop.store(true, Ordering::Relaxed);
            }
            Ok(())
        })?;
    }
    Ok(targets
        .iter()
        .zip(outcomes)
        .map(|(&target, outcome)| {
            let answer = match outcome {
                ThreadRequestOutcome::Queued => awaited
                    .get_mut(&target.thread_id)
                    .and_then(Option::take)
                    .map_or(Answer::Missing, Answer::Captured),
                refused => Answer::Refused(refused),
            };
            (target, answer)
        })
        .collect())
}

/// Why the driver queued no APC to a thread, in words.
const fn outcome_text(outcome: ThreadRequestOutcome) -> &'static str {
    match outcome {
        ThreadRequestOutcome::Queued => "queued",
        ThreadRequestOutcome::NoSuchThread => "no such thread (it may have exited)",
        ThreadRequestOutcome::NoSlot => {
            "not queued: every APC slot of the driver is in use; try again later"
        }
        ThreadRequestOutcome::NotQueued => {
            "not queued: the kernel refused the APC (the thread is exiting)"
        }
        ThreadRequestOutcome::SystemThread => {
            "a system thread: kstack queues no APC to system threads"
        }
        ThreadRequestOutcome::Own => "this command's own thread: `kstack selftest` captures it",
    }
}

/// `thread T`, `thread T (process P)`, or with what it was doing when
/// listed: `thread T (process P, waiting (UserRequest) when listed)`.
fn thread_text(target: Target) -> String {
    let facts = target
        .facts
        .map(|facts| format!(", {} when listed", facts.state_text()))
        .unwrap_or_default();
    match target.process_id {
        Some(process_id) => format!("thread {} (process {process_id}{facts})", target.thread_id),
        None => format!("thread {}", target.thread_id),
    }
}

/// One block per thread, in the order asked: a captured stack as every
/// command shows a record (its facts say the thread, process, delay and
/// whether it was late), else one line saying why there is none.
fn write_text(
    answers: &[(Target, Answer)],
    symbolizer: &Symbolizer,
    call_trace: bool,
    timeout_ms: u32,
    out: &mut impl Write,
) -> io::Result<()> {
    for (target, answer) in answers {
        match answer {
            Answer::Captured(record) => {
                if target.facts.is_some() {
                    writeln!(out, "{}:", thread_text(*target))?;
                }
                write!(out, "{}", record.to_text(symbolizer, call_trace))?;
            }
            Answer::Refused(outcome) => {
                writeln!(out, "{}: {}", thread_text(*target), outcome_text(*outcome))?;
            }
            Answer::Missing => writeln!(
                out,
                "{}: no answer within {timeout_ms} ms",
                thread_text(*target)
            )?,
        }
    }
    Ok(())
}

/// One object per thread: a captured stack is its record's object
/// (`kstack read --json`'s) with `outcome` and `answered` added; a thread
/// without a record has `schema`, `thread_id`, `process_id` (null when
/// not listed), `outcome` and `answered`.
fn answer_json(target: Target, answer: &Answer, symbolizer: &Symbolizer) -> Value {
    let outcome = match answer {
        Answer::Refused(outcome) => *outcome,
        Answer::Captured(_) | Answer::Missing => ThreadRequestOutcome::Queued,
    };
    let mut object = match answer {
        Answer::Captured(record) => record.to_json(symbolizer),
        Answer::Refused(_) | Answer::Missing => json!({
            "schema": JSON_SCHEMA_VERSION,
            "thread_id": target.thread_id,
            "process_id": target.process_id,
        }),
    };
    object["outcome"] = json!(outcome.name());
    object["answered"] = json!(matches!(answer, Answer::Captured(_)));
    if let Some(facts) = target.facts {
        object["listed_state"] = json!(facts.state.map(ThreadState::name));
        object["listed_wait_reason"] = json!(facts.waiting().then(|| facts.wait_reason.name()));
    }
    object
}

/// How many threads were asked for and what became of them.
fn summary_text(answers: &[(Target, Answer)], timeout_ms: u32) -> String {
    let count =
        |wanted: fn(&Answer) -> bool| answers.iter().filter(|(_, answer)| wanted(answer)).count();
    format!(
        "{} threads asked for: {} captured, {} not queued, {} no answer within {timeout_ms} ms",
        answers.len(),
        count(|answer| matches!(answer, Answer::Captured(_))),
        count(|answer| matches!(answer, Answer::Refused(_))),
        count(|answer| matches!(answer, Answer::Missing)),
    )
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use kstack_abi::{Ioctl, RecordFlags, SourceSet, ntstatus::STATUS_DEVICE_BUSY};
    use kstack_client::{device::test_support::record_bytes, naming::modules::ModuleMap};

    use kstack_client::output::width::DEFAULT_WIDTH;

    use super::{
        super::fake_driver::{FRAMES, FakeDriver, thread_stack},
        *,
    };

    const TAG: u64 = 0x7A6;

    fn tids(ids: &[u32]) -> Vec<Target> {
        ids.iter()
            .map(|&thread_id| Target {
                thread_id,
                process_id: None,
                facts: None,
            })
            .collect()
    }

    /// A thread listed blocked in a user-mode wait.
    fn waiting() -> ThreadFacts {
        ThreadFacts {
            state: Some(ThreadState::WAITING),
            wait_reason: thread_list::WaitReason(6),
            context_switches: 10,
            kernel_time: 0,
            user_time: 0,
            create_time: 0,
        }
    }

    #[test]
    fn list_shows_each_threads_facts_as_far_as_known() {
        let thread = |facts| ProcessThread {
            process_id: 100,
            thread_id: 104,
            facts,
        };
        let as_wine = ThreadFacts {
            state: None,
            context_switches: 0,
            kernel_time: 10_000,
            ..waiting()
        };
        assert_eq!(
            listed_text(&thread(Some(waiting()))),
            "thread 104 (process 100): waiting (UserRequest), 10 switches, CPU 0.0 ms"
        );
        assert_eq!(
            listed_text(&thread(Some(as_wine))),
            "thread 104 (process 100): state unknown (the system lists none), CPU 1.0 ms"
        );
        assert_eq!(
            listed_text(&thread(None)),
            "thread 104 (process 100): no facts (listed by Toolhelp)"
        );
        assert_eq!(
            listed_json(&thread(Some(waiting()))),
            json!({"schema": 5, "thread_id": 104, "process_id": 100, "state": "waiting",
                   "wait_reason": "UserRequest", "context_switches": 10, "cpu_time_100ns": 0})
        );
        assert_eq!(
            listed_json(&thread(Some(as_wine))),
            json!({"schema": 5, "thread_id": 104, "process_id": 100, "state": null,
                   "wait_reason": null, "context_switches": null, "cpu_time_100ns": 10_000})
        );
        assert!(Command::try_parse_from(["t", "--list"]).is_ok());
        assert!(Command::try_parse_from(["t", "--list", "--tid", "5"]).is_err());
        let missing = Command::try_parse_from(["t"]).err().unwrap().to_string();
        assert!(
            ["--tid", "--pid", "--list"]
                .iter()
                .all(|option| missing.contains(option)),
            "{missing}"
        );
        let negative = Command::try_parse_from(["t", "--pid", "-5"])
            .err()
            .unwrap()
            .to_string();
        assert!(negative.contains("-5 is not in 0..="), "{negative}");
    }

    #[test]
    fn a_listed_thread_is_named_with_what_it_was_doing() {
        let listed = Target {
            thread_id: 12,
            process_id: Some(4),
            facts: Some(waiting()),
        };
        assert_eq!(
            thread_text(listed),
            "thread 12 (process 4, waiting (UserRequest) when listed)"
        );
        let mut text = Vec::new();
        write_text(&[(listed, Answer::Missing)], &kernel(), false, 5, &mut text).unwrap();
        assert_eq!(
            String::from_utf8(text).unwrap(),
            "thread 12 (process 4, waiting (UserRequest) when listed): no answer within 5 ms\n"
        );
    }

    fn no_modules() -> Symbolizer {
        Symbolizer::new(ModuleMap::default())
    }

    /// Names the kernel frames of [`FRAMES`].
    fn kernel() -> Symbolizer {
        Symbolizer::new(ModuleMap::new([kstack_client::naming::modules::Module {
            base: 0xFFFF_F800_0000_0000,
            size: 0x100_0000,
            name: "ntoskrnl.exe".to_owned(),
        }]))
    }

    fn captured_facts(answer: &Answer) -> Option<SourceFacts> {
        match answer {
            Answer::Captured(record) => Some(record.header.facts),
            Answer::Refused(_) | Answer::Missing => None,
        }
    }

    #[test]
    fn each_thread_gets_its_own_record_of_this_request_and_the_rest_is_passed_over() {
        let other_source = record_bytes(
            1,
            SourceFacts::OnDemand { tag: TAG },
            RecordFlags::NONE,
            &FRAMES,
            &FRAMES,
        );
        let mut driver = FakeDriver::new(vec![
            vec![
                other_source,
                thread_stack(2, TAG + 1, 12, false),
                thread_stack(3, TAG, 12, false),
            ],
            vec![],
            vec![
                thread_stack(4, TAG, 14, true),
                thread_stack(5, TAG, 12, true),
            ],
        ]);
        driver.refused = [(15, ThreadRequestOutcome::NoSuchThread)].into();
        let targets = tids(&[12, 14, 15, 16]);
        let answers = capture(
            &mut driver,
            &targets,
            200,
            TAG,
            &mut no_modules(),
            &AtomicBool::new(false),
        )
        .unwrap();
        assert_eq!(driver.requests.len(), 1);
        assert_eq!(driver.requests[0].requested(), [12, 14, 15, 16]);
        assert_eq!(driver.requests[0].timeout_ms, 200);
        let facts = |thread_id, late| {
            Some(SourceFacts::ThreadStack {
                target_process_id: 4,
                target_thread_id: thread_id,
                tag: TAG,
                delay: 12_345,
                late,
            })
        };
        assert_eq!(
            captured_facts(&answers[0].1),
            facts(12, false),
            "the first record of this tag, not another request's"
        );
        assert_eq!(captured_facts(&answers[1].1), facts(14, true));
        assert_eq!(
            answers[2].1,
            Answer::Refused(ThreadRequestOutcome::NoSuchThread)
        );
        assert_eq!(answers[3].1, Answer::Missing);
        assert!(driver.read_requests >= 3, "read until the timeout");

        let mut text = Vec::new();
        write_text(&answers, &kernel(), false, 200, &mut text).unwrap();
        let shown = fit(&String::from_utf8(text).unwrap(), DEFAULT_WIDTH);
        // docs/client.md shows this output, as a pipe gets it: the same.
        let docs = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/client.md"),
        )
        .unwrap();
        let mut documented = String::new();
        for line in docs
            .lines()
            .skip_while(|line| !line.starts_with("> kstack threads --tid 12 --tid 14"))
            .skip(1)
            .take_while(|line| !line.starts_with("```"))
        {
            documented.push_str(line);
            documented.push('\n');
        }
        assert_eq!(shown, documented);
        assert_eq!(
            summary_text(&answers, 200),
            "4 threads asked for: 2 captured, 1 not queued, 1 no answer within 200 ms"
        );
    }

    #[test]
    fn the_wait_ends_when_every_queued_thread_answered() {
        let mut driver = FakeDriver::new(vec![vec![
            thread_stack(1, TAG, 14, false),
            thread_stack(2, TAG, 12, false),
        ]]);
        driver.refused = [(16, ThreadRequestOutcome::SystemThread)].into();
        let started = Instant::now();
        let answers = capture(
            &mut driver,
            &tids(&[12, 14, 16]),
            60_000,
            TAG,
            &mut no_modules(),
            &AtomicBool::new(false),
        )
        .unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "not the timeout"
        );
        assert_eq!(driver.read_requests, 1);
        assert!(
            answers[..2]
                .iter()
                .all(|(_, a)| matches!(a, Answer::Captured(_)))
        );
        // Nothing queued: nothing to read.
        let mut full = FakeDriver::new(vec![]);
        full.refused = [(12, ThreadRequestOutcome::NoSlot)].into();
        let answers = capture(
            &mut full,
            &tids(&[12]),
            60_000,
            TAG,
            &mut no_modules(),
            &AtomicBool::new(false),
        )
        .unwrap();
        assert_eq!(answers[0].1, Answer::Refused(ThreadRequestOutcome::NoSlot));
        assert_eq!(full.read_requests, 0);
    }

    #[test]
    fn json_has_one_object_per_thread() {
        let mut driver = FakeDriver::new(vec![vec![thread_stack(1, TAG, 12, true)]]);
        driver.refused = [(13, ThreadRequestOutcome::Own)].into();
        let targets = vec![
            Target {
                thread_id: 12,
                process_id: Some(4),
                facts: Some(waiting()),
            },
            Target {
                thread_id: 13,
                process_id: None,
                facts: None,
            },
            Target {
                thread_id: 14,
                process_id: Some(4),
                facts: None,
            },
        ];
        let answers = capture(
            &mut driver,
            &targets,
            20,
            TAG,
            &mut no_modules(),
            &AtomicBool::new(false),
        )
        .unwrap();
        let objects: Vec<Value> = answers
            .iter()
            .map(|(target, answer)| answer_json(*target, answer, &no_modules()))
            .collect();
        assert_eq!(objects[0]["source"], "threadstack");
        assert_eq!(objects[0]["facts"]["late"], true);
        assert_eq!(objects[0]["facts"]["delay_100ns"], 12_345);
        assert_eq!(objects[0]["thread_id"], 12);
        assert_eq!(objects[0]["user_frames"], json!(["0x7ff600003000"]));
        assert_eq!(objects[0]["frames"].as_array().unwrap().len(), 2);
        assert_eq!(
            (&objects[0]["outcome"], &objects[0]["answered"]),
            (&json!("queued"), &json!(true))
        );
        assert_eq!(
            (
                &objects[0]["listed_state"],
                &objects[0]["listed_wait_reason"]
            ),
            (&json!("waiting"), &json!("UserRequest"))
        );
        assert_eq!(
            objects[1],
            json!({"schema": 5, "thread_id": 13, "process_id": null, "outcome": "own",
                   "answered": false})
        );
        assert_eq!(
            objects[2],
            json!({"schema": 5, "thread_id": 14, "process_id": 4, "outcome": "queued",
                   "answered": false})
        );
    }

    #[test]
    fn the_source_is_enabled_for_the_request_and_the_configuration_put_back() {
        let mut driver = FakeDriver::new(vec![]);
        let previous = driver.status.config;
        assert!(!previous.sources.contains(Source::ThreadStack));
        let enabled = CaptureConfig {
            sources: previous.sources.with(Source::ThreadStack),
            ..previous
        };
        let mut seen = None;
        let result = with_thread_stacks(&mut driver, "threads", |device| {
            seen = Some(session::status(device)?.config);
            Ok(7)
        });
        assert_eq!(result, Ok(7));
        assert_eq!(seen, Some(enabled), "enabled while capturing");
        assert_eq!(driver.configured, [enabled, previous]);
        // Put back after an error too, and the error is the command's.
        let mut failing = FakeDriver::new(vec![]);
        let result: Result<(), _> =
            with_thread_stacks(&mut failing, "threads", |_| Err(ClientError::ReaderFailed));
        assert_eq!(result, Err(ClientError::ReaderFailed));
        assert_eq!(failing.configured, [enabled, previous]);
        // A configuration that cannot be put back is an error.
        let mut busy = FakeDriver::new(vec![]);
        let mut calls = 0;
        let result = with_thread_stacks(&mut busy, "threads", |device| {
            calls += 1;
            device.configure_status = STATUS_DEVICE_BUSY;
            Ok(())
        });
        assert_eq!(calls, 1);
        assert_eq!(
            result,
            Err(ClientError::Refused {
                request: Ioctl::Configure,
                status: STATUS_DEVICE_BUSY
            })
        );
    }

    #[test]
    fn an_enabled_source_is_left_alone_and_a_host_without_apcs_changes_nothing() {
        let mut driver = FakeDriver::new(vec![]);
        driver.status.config.sources = SourceSet::EMPTY.with(Source::ThreadStack);
        assert_eq!(
            with_thread_stacks(&mut driver, "threads", |_| Ok(())),
            Ok(())
        );
        assert!(driver.configured.is_empty());
        let mut wine = FakeDriver::new(vec![]);
        wine.status.apc = HostRoutine::HostStub;
        let mut called = false;
        let result = with_thread_stacks(&mut wine, "threads", |_| {
            called = true;
            Ok(())
        });
        assert_eq!(
            result,
            Err(ClientError::NoApc {
                apc: HostRoutine::HostStub
            })
        );
        assert!(!called && wine.configured.is_empty());
    }

    #[test]
    fn a_thread_named_twice_is_asked_for_once() {
        assert_eq!(targets(&[5, 7, 5], &[]), Ok(tids(&[5, 7])));
        #[cfg(not(windows))]
        assert_eq!(
            targets(&[5], &[4]),
            Err(ClientError::ThreadList(
                thread_list::ThreadListError::NeedsWindows
            ))
        );
    }

    #[derive(Parser)]
    struct Command {
        #[command(flatten)]
        threads: ThreadsArgs,
    }

    #[test]
    fn the_command_line_takes_threads_or_processes_and_a_timeout_in_range() {
        let parsed = Command::try_parse_from(["threads", "--tid", "12", "--tid", "14"])
            .unwrap()
            .threads;
        assert_eq!((parsed.tids, parsed.timeout_ms), (vec![12, 14], 1000));
        let parsed = Command::try_parse_from(["threads", "--pid", "4", "--timeout-ms", "60000"])
            .unwrap()
            .threads;
        assert_eq!((parsed.pids, parsed.timeout_ms), (vec![4], 60_000));
        for args in [
            &["threads"][..],
            &["threads", "--tid", "0"],
            &["threads", "--tid", "1", "--timeout-ms", "0"],
            &["threads", "--tid", "1", "--timeout-ms", "60001"],
        ] {
            assert!(Command::try_parse_from(args).is_err(), "{args:?}");
        }
    }
}
