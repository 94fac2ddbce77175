//! `kstack top --live`: reads the driver and the keyboard and shows the
//! live view (`kstack_client::live_top`) full-screen; when stdout is not a
//! terminal, prints `kstack top`'s text every interval instead.

use std::{
    io::{self, IsTerminal as _, Write as _},
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use kstack_abi::StatusResponse;
use kstack_client::{
    capture::stack_table::{self, Origin, StackTable, TopLimits},
    device::{
        session::{self, Batch, Reader},
        transport::Transport,
    },
    error::ClientError,
    live_top::{self, DriverCounters, Filter, LiveTop, SortKey},
    naming::symbolizer::Symbolizer,
    output::width::{Stream, fit, width},
};
use ratatui::{
    DefaultTerminal,
    crossterm::event::{self, Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers},
};
use time::{OffsetDateTime, format_description::well_known::Rfc3339};

use super::{
    live::{FollowArgs, open_device, stop_flag},
    symbols::SymbolsArg,
};

/// Frames shown per stack unless --frames says otherwise: a few lines per
/// row keep several stacks on one screen.
pub const FRAMES: usize = 3;

/// How often the driver is read (and keys answered) between refreshes,
/// so the ring does not fill while the view waits.
const READ_PAUSE: Duration = Duration::from_millis(50);

/// The span of the window rate, beside the last interval's.
const RATE_WINDOW: Duration = Duration::from_secs(10);

pub fn run(
    follow: &FollowArgs,
    symbols: &SymbolsArg,
    filter: Filter,
    limits: TopLimits,
) -> Result<(), ClientError> {
    let mut device = open_device()?;
    let symbolizer = symbols.live_symbolizer(&mut device)?;
    let mut screen = screen(symbolizer, filter, limits)?;
    refresh_loop(
        &mut device,
        follow.refresh(),
        follow.deadline(),
        &stop_flag(),
        screen.as_mut(),
    )
}

/// The live view, for this command and for another that reads the driver
/// (`kstack sample --live`): full-screen on a terminal; otherwise
/// `kstack top`'s text at every refresh.
pub fn screen(
    symbolizer: Symbolizer,
    filter: Filter,
    limits: TopLimits,
) -> Result<Box<dyn Screen>, ClientError> {
    Ok(if io::stdout().is_terminal() {
        let model = LiveTop::new(Instant::now(), RATE_WINDOW, filter);
        Box::new(FullScreen::start(model, symbolizer, limits)?)
    } else {
        Box::new(TextScreen {
            table: StackTable::default(),
            filter,
            driver: DriverCounters::default(),
            symbolizer,
            limits,
            closed: false,
        })
    })
}

/// Where the refresh loop shows what it reads.
pub trait Screen {
    /// What one read from the driver returned.
    fn batch(&mut self, batch: &Batch);
    /// An interval has passed; `status` is the driver's now.
    fn refresh(&mut self, now: Instant, status: &StatusResponse) -> Result<(), ClientError>;
    /// Waits up to `timeout` for the user; `false` when they asked to quit
    /// (or nobody reads any more).
    fn wait(&mut self, timeout: Duration) -> Result<bool, ClientError>;
}

/// Reads the driver every [`READ_PAUSE`], refreshes `screen` with its
/// status every `refresh`, until the user quits, `stop` is set (Ctrl-C) or
/// the deadline passes (refreshing once more then).
fn refresh_loop(
    device: &mut impl Transport,
    refresh: Duration,
    deadline: Option<Instant>,
    stop: &AtomicBool,
    screen: &mut dyn Screen,
) -> Result<(), ClientError> {
    let mut reader = Reader::default();
    let mut next_refresh = Instant::now() + refresh;
    loop {
        loop {
            let batch = reader.read(device)?;
            screen.batch(&batch);
            let more_pending = batch.more_pending;
            reader.recycle(batch);
            if !more_pending {
                break;
            }
        }
        let now = Instant::now();
        let ending = deadline.is_some_and(|end| now >= end);
        if ending || now >= next_refresh {
            screen.refresh(now, &session::status(device)?)?;
            next_refresh = now + refresh;
        }
        if ending
            || stop.load(Ordering::Relaxed)
            || !screen.wait(READ_PAUSE.min(next_refresh.saturating_duration_since(now)))?
        {
            return Ok(());
        }
    }
}

/// What a key asks of the full-screen view.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    Sort(SortKey),
    NextSource,
    Pause,
    Quit,
}

/// The view's keys (docs/client.md, "Live view").
fn action(key: &KeyEvent) -> Option<Action> {
    // Windows reports releases too; one press is one action.
    if key.kind != KeyEventKind::Press {
        return None;
    }
    // Raw mode delivers Ctrl-C as a key, not a signal.
    if key.modifiers.contains(KeyModifiers::CONTROL) {
        return (key.code == KeyCode::Char('c')).then_some(Action::Quit);
    }
    match key.code {
        KeyCode::Char('q') | KeyCode::Esc => Some(Action::Quit),
        KeyCode::Char('r') => Some(Action::Sort(SortKey::Rate)),
        KeyCode::Char('c') => Some(Action::Sort(SortKey::Count)),
        KeyCode::Char('s') => Some(Action::Sort(SortKey::Source)),
        KeyCode::Char('f') => Some(Action::NextSource),
        KeyCode::Char(' ') => Some(Action::Pause),
        _ => None,
    }
}

/// The ratatui view on the terminal's alternate screen, restored when
/// dropped.
struct FullScreen {
    terminal: DefaultTerminal,
    model: LiveTop,
    /// Kept current by the driver's module records.
    symbolizer: Symbolizer,
    limits: TopLimits,
}

impl FullScreen {
    fn start(
        model: LiveTop,
        symbolizer: Symbolizer,
        limits: TopLimits,
    ) -> Result<Self, ClientError> {
        let terminal = ratatui::try_init().map_err(|error| {
            // Raw mode may be on already.
            ratatui::restore();
            terminal_error(&error)
        })?;
        let mut screen = Self {
            terminal,
            model,
            symbolizer,
            limits,
        };
        screen.draw()?;
        Ok(screen)
    }

    fn draw(&mut self) -> Result<(), ClientError> {
        self.terminal
            .draw(|frame| live_top::draw(frame, &self.model, &self.symbolizer, self.limits))
            .map_err(|error| terminal_error(&error))?;
        Ok(())
    }
}

impl Drop for FullScreen {
    fn drop(&mut self) {
        ratatui::restore();
    }
}

impl Screen for FullScreen {
    fn batch(&mut self, batch: &Batch) {
        self.symbolizer.note_modules(&batch.modules);
        self.model.apply(&batch.records);
    }

    fn refresh(&mut self, now: Instant, status: &StatusResponse) -> Result<(), ClientError> {
        self.model.set_driver_status(status);
        self.model.tick(now);
        self.draw()
    }

    fn wait(&mut self, timeout: Duration) -> Result<bool, ClientError> {
        if !event::poll(timeout).map_err(|error| terminal_error(&error))? {
            return Ok(true);
        }
        match event::read().map_err(|error| terminal_error(&error))? {
            Event::Key(key) => match action(&key) {
                Some(Action::Quit) => return Ok(false),
                Some(Action::Sort(key)) => self.model.sort_by(key),
                Some(Action::NextSource) => {
                    self.model.set_filter(self.model.filter().next_source());
                }
                Some(Action::Pause) => self.model.toggle_pause(),
                None => return Ok(true),
            },
            Event::Resize(..) => {}
            _ => return Ok(true),
        }
        self.draw()?;
        Ok(true)
    }
}

/// The `kstack top` text of every record the filter admits so far, printed
/// every interval under a line with the time and the driver's counters.
struct TextScreen {
    table: StackTable,
    filter: Filter,
    driver: DriverCounters,
    /// Kept current by the driver's module records.
    symbolizer: Symbolizer,
    limits: TopLimits,
    /// stdout went away (a closed pipe).
    closed: bool,
}

impl Screen for TextScreen {
    fn batch(&mut self, batch: &Batch) {
        self.symbolizer.note_modules(&batch.modules);
        for record in &batch.records {
            if self.filter.admits(&Origin::of(record)) {
                self.table.add(record);
            }
        }
    }

    fn refresh(&mut self, _now: Instant, status: &StatusResponse) -> Result<(), ClientError> {
        self.driver.update(status);
        let time = OffsetDateTime::now_utc()
            .format(&Rfc3339)
            .unwrap_or_default();
        let text = format!(
            "kstack top --live {time}: {}, {}\n{}\n",
            self.driver.text(),
            self.filter.describe(),
            stack_table::top_text(&self.table, &self.symbolizer, self.limits)
        );
        let written = io::stdout()
            .lock()
            .write_all(fit(&text, width(Stream::Stdout)).as_bytes());
        self.closed = written.is_err();
        Ok(())
    }

    fn wait(&mut self, timeout: Duration) -> Result<bool, ClientError> {
        std::thread::sleep(timeout);
        Ok(!self.closed)
    }
}

fn terminal_error(error: &io::Error) -> ClientError {
    ClientError::File {
        path: "the terminal".to_owned(),
        action: "drawing on",
        message: error.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use kstack_abi::{
        Altitude, CaptureConfig, DriverImage, Ioctl, PagingExecutive, RecordFlags, Source,
        SourceFacts, SourceStatus, messages::STATUS_RESPONSE_SIZE, ntstatus::STATUS_SUCCESS,
    };
    use kstack_client::device::{test_support, transport::Reply};

    use super::*;

    /// A driver answering reads with scripted batches (then empty ones)
    /// and status requests with a status whose `read` counts them.
    struct FakeDriver {
        batches: VecDeque<(Vec<u64>, bool)>,
        status_requests: u64,
    }

    impl FakeDriver {
        fn read_reply(sequences: &[u64], more_pending: bool) -> Vec<u8> {
            let frames = [0xFFFF_F800_0000_1000_u64];
            let payload: Vec<u8> = sequences
                .iter()
                .flat_map(|&sequence| {
                    test_support::record_bytes(
                        sequence,
                        SourceFacts::Timer,
                        RecordFlags::NONE,
                        &frames,
                        &frames,
                    )
                })
                .collect();
            let declared = u32::try_from(sequences.len()).unwrap();
            test_support::read_reply(&payload, declared, more_pending, 0)
        }

        fn status(&self) -> Vec<u8> {
            let status = StatusResponse {
                driver_version: (0, 1, 0),
                paging_executive: PagingExecutive::NOT_SET,
                ring_capacity: 16 * 1024,
                ring_used: 0,
                ring_used_bytes: 0,
                ring_shards: 1,
                outstanding_allocations: 2,
                config: CaptureConfig::default(),
                dropped: 0,
                cleared: 0,
                read: self.status_requests,
                sequences_spent: self.status_requests,
                sources: [SourceStatus {
                    available: true,
                    ..SourceStatus::ZERO
                }; Source::COUNT],
                driver_image: DriverImage::default(),
                object_altitude: Altitude::default(),
                registry_altitude: Altitude::default(),
                stack_table: kstack_abi::StackTableStatus::default(),
                user_walk: kstack_abi::HostRoutine::Available,
                process_key: kstack_abi::HostRoutine::Available,
                module_records: 0,
                apc: kstack_abi::HostRoutine::Available,
                apc_take_back: kstack_abi::HostRoutine::Available,
                thread_captures: kstack_abi::ThreadCaptureStatus::default(),
            };
            let mut bytes = vec![0; STATUS_RESPONSE_SIZE];
            status.encode(&mut bytes);
            bytes
        }
    }

    impl Transport for FakeDriver {
        fn control(&mut self, code: u32, _input: &[u8], output: &mut [u8]) -> Reply {
            let bytes = if code == Ioctl::Status.code() {
                self.status_requests += 1;
                self.status()
            } else {
                let (sequences, more_pending) = self.batches.pop_front().unwrap_or_default();
                Self::read_reply(&sequences, more_pending)
            };
            output[..bytes.len()].copy_from_slice(&bytes);
            Reply {
                status: STATUS_SUCCESS,
                information: bytes.len(),
            }
        }
    }

    /// Notes what the loop shows; quits after `waits_left` waits.
    #[derive(Default)]
    struct Recorder {
        sequences: Vec<u64>,
        /// The driver's `read` counter at each refresh.
        refreshes: Vec<u64>,
        waits_left: usize,
    }

    impl Screen for Recorder {
        fn batch(&mut self, batch: &Batch) {
            self.sequences
                .extend(batch.records.iter().map(|record| record.header.sequence));
        }

        fn refresh(&mut self, _now: Instant, status: &StatusResponse) -> Result<(), ClientError> {
            self.refreshes.push(status.read);
            Ok(())
        }

        fn wait(&mut self, _timeout: Duration) -> Result<bool, ClientError> {
            self.waits_left = self.waits_left.saturating_sub(1);
            Ok(self.waits_left > 0)
        }
    }

    fn driver(batches: &[(&[u64], bool)]) -> FakeDriver {
        FakeDriver {
            batches: batches
                .iter()
                .map(|&(sequences, more)| (sequences.to_vec(), more))
                .collect(),
            status_requests: 0,
        }
    }

    #[test]
    fn the_loop_drains_each_time_and_refreshes_with_the_status_every_interval() {
        let mut device = driver(&[(&[1, 2], true), (&[3], false), (&[4], false)]);
        let mut screen = Recorder {
            waits_left: 2,
            ..Recorder::default()
        };
        let stop = AtomicBool::new(false);
        refresh_loop(&mut device, Duration::ZERO, None, &stop, &mut screen).unwrap();
        assert_eq!(
            screen.sequences,
            [1, 2, 3, 4],
            "read until nothing was pending"
        );
        assert_eq!(screen.refreshes, [1, 2], "a status per refresh");
        let mut device = driver(&[(&[1], false), (&[2], false)]);
        let mut screen = Recorder {
            waits_left: 2,
            ..Recorder::default()
        };
        refresh_loop(
            &mut device,
            Duration::from_hours(1),
            None,
            &stop,
            &mut screen,
        )
        .unwrap();
        assert_eq!(screen.sequences, [1, 2]);
        assert!(screen.refreshes.is_empty(), "no interval has passed");
    }

    #[test]
    fn the_loop_ends_at_the_deadline_refreshing_once_more_or_on_ctrl_c() {
        let mut device = driver(&[(&[1], false)]);
        let mut screen = Recorder {
            waits_left: 100,
            ..Recorder::default()
        };
        let hour = Duration::from_hours(1);
        let not_stopped = AtomicBool::new(false);
        refresh_loop(
            &mut device,
            hour,
            Some(Instant::now()),
            &not_stopped,
            &mut screen,
        )
        .unwrap();
        assert_eq!(
            (screen.sequences.as_slice(), screen.refreshes.as_slice()),
            (&[1][..], &[1][..])
        );
        assert_eq!(screen.waits_left, 100, "no wait after the deadline");
        let mut device = driver(&[(&[1], false)]);
        refresh_loop(&mut device, hour, None, &AtomicBool::new(true), &mut screen).unwrap();
        assert_eq!(screen.waits_left, 100, "no wait after Ctrl-C");
    }

    fn press(code: KeyCode, modifiers: KeyModifiers) -> Option<Action> {
        action(&KeyEvent::new(code, modifiers))
    }

    #[test]
    fn keys_sort_filter_pause_and_quit() {
        let none = KeyModifiers::NONE;
        assert_eq!(
            press(KeyCode::Char('r'), none),
            Some(Action::Sort(SortKey::Rate))
        );
        assert_eq!(
            press(KeyCode::Char('c'), none),
            Some(Action::Sort(SortKey::Count))
        );
        assert_eq!(
            press(KeyCode::Char('s'), none),
            Some(Action::Sort(SortKey::Source))
        );
        assert_eq!(press(KeyCode::Char('f'), none), Some(Action::NextSource));
        assert_eq!(press(KeyCode::Char(' '), none), Some(Action::Pause));
        assert_eq!(press(KeyCode::Char('q'), none), Some(Action::Quit));
        assert_eq!(press(KeyCode::Esc, none), Some(Action::Quit));
        assert_eq!(
            press(KeyCode::Char('c'), KeyModifiers::CONTROL),
            Some(Action::Quit),
            "Ctrl-C quits, plain c sorts by count"
        );
        assert_eq!(press(KeyCode::Char('r'), KeyModifiers::CONTROL), None);
        assert_eq!(press(KeyCode::Char('x'), none), None);
    }

    #[test]
    fn a_key_acts_once_not_on_release() {
        let mut release = KeyEvent::new(KeyCode::Char('q'), KeyModifiers::NONE);
        release.kind = KeyEventKind::Release;
        assert_eq!(action(&release), None);
    }
}
