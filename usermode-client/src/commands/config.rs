//! `kstack config`: shows or changes what is captured.

use clap::Args;
use kstack_abi::{CaptureConfig, MAX_FRAMES, MAX_PROCESS_IDS, ProcessFilter, Source, SourceSet};
use kstack_client::{
    device::{session, transport::Transport},
    error::ClientError,
    output::{
        report::{processes_text, user_frames_text},
        width::{Stream, fit, width},
    },
};

use super::live::open_device;

#[derive(Args)]
pub struct ConfigArgs {
    /// Sources to enable (comma-separated names, or `all`: every source the
    /// driver can provide here, those `kstack status` says are available;
    /// a source named that is not available is refused by the driver).
    /// Capture-now (`selftest`) always answers; `ondemand` decides whether
    /// its record is also kept in the ring. Capture-threads requests are
    /// refused unless `threadstack` is enabled.
    #[arg(long, value_parser = parse_sources)]
    enable: Option<SourceSet>,
    /// Sources to disable (comma-separated names, or `all`).
    #[arg(long, value_parser = parse_sources)]
    disable: Option<SourceSet>,
    /// RtlCaptureStackBackTrace's FramesToSkip (0 keeps kstack's own frames).
    #[arg(long)]
    skip: Option<u16>,
    /// RtlCaptureStackBackTrace's FramesToCapture (1 to 62).
    #[arg(long)]
    frames: Option<u16>,
    /// Keep only records of these process ids (comma-separated, up to 8;
    /// `all`: every process). Applies to every source, capture-now
    /// included: the process is the one the callback runs in (the record's
    /// pid), which for process, thread and image events need not be the
    /// one the event names; timer samples of an idle processor are pid 0.
    /// Events left out are counted as `filtered` in `kstack status`; a
    /// capture-now from a process left out is still answered, not kept.
    #[arg(long, value_parser = parse_include)]
    pid: Option<Pids>,
    /// Never keep records of these process ids (comma-separated, up to 8;
    /// `none`: exclude nothing), e.g. `0` for the idle process. An id may
    /// not be both kept with --pid and excluded.
    #[arg(long, value_parser = parse_exclude)]
    exclude_pid: Option<Pids>,
    /// Keep one event in N per source: `timer=10,registry=100` (1 keeps
    /// every event; 1 to 65535; `ondemand` and `threadstack` are always
    /// 1). Sources not named
    /// keep their rate. Each processor keeps its first event and then every
    /// N-th; the others are counted as `sampled-out` in `kstack status`.
    #[arg(long, value_parser = parse_sampling)]
    sample: Option<PerSource<u16>>,
    /// The most user-mode frames to walk after the kernel frames, per
    /// source: `registry=20,object=0` (0 to 62; 0: none; `timer` only 0).
    /// Sources not named keep theirs (by default 30 for registry, ondemand
    /// and threadstack, 0 for the others). A record
    /// holds at most 62 frames in all: the user part gets what the kernel
    /// part leaves. Each record says what happened to its user part;
    /// `kstack status` counts the outcomes.
    #[arg(long, value_parser = parse_user_frames)]
    user_frames: Option<PerSource<u8>>,
    /// The timer source's period in milliseconds (1 to 10000).
    #[arg(long)]
    timer_period: Option<u32>,
}

/// Source names as the command line takes them.
pub fn parse_sources(text: &str) -> Result<SourceSet, String> {
    if text == "all" {
        return Ok(SourceSet::ALL);
    }
    text.split(',')
        .map(|name| {
            Source::from_name(name.trim()).ok_or_else(|| {
                let known: Vec<_> = Source::ALL.iter().map(|source| source.name()).collect();
                format!(
                    "unknown source `{name}`; sources are {} or all",
                    known.join(", ")
                )
            })
        })
        .collect()
}

/// A process id list as one option value (clap would take a bare `Vec`
/// for a repeated option).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pids(Vec<u32>);

/// Per-source values (sampling rates, user frames) as one option value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PerSource<T>(Vec<(Source, T)>);

/// A process id list, or `word` for the empty list.
fn parse_pids(text: &str, word: &str) -> Result<Pids, String> {
    if text == word {
        return Ok(Pids(Vec::new()));
    }
    let ids = text
        .split(',')
        .map(|id| {
            id.trim()
                .parse::<u32>()
                .map_err(|_| format!("`{id}` is not a process id (a decimal number, or {word})"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if ids.len() > MAX_PROCESS_IDS {
        return Err(format!(
            "{} process ids given; the driver keeps at most {MAX_PROCESS_IDS}",
            ids.len()
        ));
    }
    Ok(Pids(ids))
}

fn parse_include(text: &str) -> Result<Pids, String> {
    parse_pids(text, "all")
}

fn parse_exclude(text: &str) -> Result<Pids, String> {
    parse_pids(text, "none")
}

/// `source=N` pairs, comma-separated; `value` parses and checks each N
/// (`what` names it in errors, `example` shows a pair).
fn parse_per_source<T>(
    text: &str,
    example: &str,
    what: &str,
    value: impl Fn(&str) -> Result<T, String>,
) -> Result<PerSource<T>, String> {
    text.split(',')
        .map(|pair| {
            let (name, number) = pair
                .split_once('=')
                .ok_or_else(|| format!("`{pair}` is not source=N (e.g. {example})"))?;
            let source = parse_sources(name)?;
            let [source] = source.iter().collect::<Vec<_>>()[..] else {
                return Err(format!("`{name}`: one source per {what}"));
            };
            Ok((source, value(number.trim())?))
        })
        .collect::<Result<_, _>>()
        .map(PerSource)
}

/// Sampling rates: `source=N`, N from 1 to 65535.
fn parse_sampling(text: &str) -> Result<PerSource<u16>, String> {
    parse_per_source(text, "timer=10", "rate", |every| {
        every
            .parse::<u16>()
            .ok()
            .filter(|&every| every >= 1)
            .ok_or_else(|| format!("`{every}`: a rate is 1 to 65535"))
    })
}

/// User frames: `source=N`, N from 0 to [`MAX_FRAMES`].
fn parse_user_frames(text: &str) -> Result<PerSource<u8>, String> {
    parse_per_source(text, "registry=20", "count", |count| {
        count
            .parse::<u8>()
            .ok()
            .filter(|&count| u16::from(count) <= MAX_FRAMES)
            .ok_or_else(|| format!("`{count}`: user frames are 0 to {MAX_FRAMES}"))
    })
}

pub fn run(args: &ConfigArgs) -> Result<(), ClientError> {
    config(&mut open_device()?, args)
}

/// Applies the options to the configuration in force; prints the result.
fn config(device: &mut impl Transport, args: &ConfigArgs) -> Result<(), ClientError> {
    let status = session::status(device)?;
    let current = status.config;
    let mut sources = current.sources;
    let mut enable = args.enable.unwrap_or_default();
    if enable == SourceSet::ALL {
        enable = Source::ALL
            .into_iter()
            .filter(|source| status.sources[source.index()].available)
            .fold(SourceSet::EMPTY, SourceSet::with);
    }
    for source in enable.iter() {
        sources = sources.with(source);
    }
    for source in args.disable.unwrap_or_default().iter() {
        sources = sources.without(source);
    }
    let include = args
        .pid
        .as_ref()
        .map_or(current.processes.include(), |pids| &pids.0);
    let exclude = args
        .exclude_pid
        .as_ref()
        .map_or(current.processes.exclude(), |pids| &pids.0);
    let processes = ProcessFilter::new(include, exclude).map_err(ClientError::InvalidConfig)?;
    let mut sample_every = current.sample_every;
    for &(source, every) in args.sample.iter().flat_map(|rates| &rates.0) {
        sample_every[source.index()] = every;
    }
    let mut user_frames = current.user_frames;
    for &(source, count) in args.user_frames.iter().flat_map(|counts| &counts.0) {
        user_frames[source.index()] = count;
    }
    let wanted = CaptureConfig {
        sources,
        frames_to_skip: args.skip.unwrap_or(current.frames_to_skip),
        frames_to_capture: args.frames.unwrap_or(current.frames_to_capture),
        processes,
        sample_every,
        timer_period_ms: args.timer_period.unwrap_or(current.timer_period_ms),
        user_frames,
    };
    wanted.validate().map_err(ClientError::InvalidConfig)?;
    if wanted != current {
        session::configure(device, &wanted)?;
    }
    let config = session::status(device)?.config;
    let enabled: Vec<_> = config.sources.iter().map(Source::name).collect();
    let sampled: Vec<_> = Source::ALL
        .into_iter()
        .filter(|&source| config.sample_every(source) > 1)
        .map(|source| format!("{} 1/{}", source.name(), config.sample_every(source)))
        .collect();
    let shown = format!(
        "sources enabled: {}; skip {} frames, keep up to {}, {}, {}, {}; timer period {} ms\n",
        if enabled.is_empty() {
            "none".to_owned()
        } else {
            enabled.join(",")
        },
        config.frames_to_skip,
        config.frames_to_capture,
        user_frames_text(&config),
        processes_text(&config.processes),
        if sampled.is_empty() {
            "every event kept".to_owned()
        } else {
            format!("sampling {}", sampled.join(", "))
        },
        config.timer_period_ms
    );
    print!("{}", fit(&shown, width(Stream::Stdout)));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::fake_driver::FakeDriver;

    /// `--enable all` enables what the driver can provide: a source status
    /// says is unavailable (threadstack where APCs cannot be queued) is left
    /// out, not sent for the driver to refuse the whole request.
    #[test]
    fn enable_all_enables_every_available_source_only() {
        let mut driver = FakeDriver::new(Vec::new());
        driver.status.sources[Source::ThreadStack.index()].available = false;
        let args = ConfigArgs {
            enable: Some(parse_sources("all").unwrap()),
            disable: None,
            skip: None,
            frames: None,
            pid: None,
            exclude_pid: None,
            sample: None,
            user_frames: None,
            timer_period: None,
        };
        config(&mut driver, &args).unwrap();
        let sent = driver
            .configured
            .last()
            .expect("a configure request")
            .sources;
        let available: SourceSet = Source::ALL
            .into_iter()
            .filter(|source| driver.status.sources[source.index()].available)
            .fold(SourceSet::EMPTY, SourceSet::with);
        assert_eq!(sent, available);
        assert!(!sent.contains(Source::ThreadStack));
        assert!(sent.contains(Source::Process));
    }

    #[test]
    fn source_lists_parse_and_unknown_names_are_explained() {
        assert_eq!(parse_sources("all"), Ok(SourceSet::ALL));
        assert_eq!(
            parse_sources("timer, process"),
            Ok(SourceSet::EMPTY.with(Source::Timer).with(Source::Process))
        );
        let error = parse_sources("timer,disk").unwrap_err();
        assert!(
            error.contains("unknown source `disk`") && error.contains("ondemand"),
            "{error}"
        );
    }

    #[test]
    fn process_lists_parse_and_bad_ones_are_explained() {
        assert_eq!(parse_include("4, 8"), Ok(Pids(vec![4, 8])));
        assert_eq!(parse_include("all"), Ok(Pids(vec![])));
        assert_eq!(parse_exclude("0"), Ok(Pids(vec![0])));
        assert_eq!(parse_exclude("none"), Ok(Pids(vec![])));
        let error = parse_include("4,x").unwrap_err();
        assert!(error.contains("`x` is not a process id"), "{error}");
        let error = parse_exclude("1,2,3,4,5,6,7,8,9").unwrap_err();
        assert!(
            error.contains("9 process ids given; the driver keeps at most 8"),
            "{error}"
        );
    }

    #[test]
    fn sampling_pairs_parse_and_bad_ones_are_explained() {
        assert_eq!(
            parse_sampling("timer=10, registry=100"),
            Ok(PerSource(vec![
                (Source::Timer, 10),
                (Source::Registry, 100)
            ]))
        );
        for (text, expected) in [
            ("timer", "is not source=N"),
            ("disk=3", "unknown source `disk`"),
            ("all=3", "one source per rate"),
            ("timer=0", "a rate is 1 to 65535"),
            ("timer=70000", "a rate is 1 to 65535"),
        ] {
            let error = parse_sampling(text).unwrap_err();
            assert!(error.contains(expected), "{text}: {error}");
        }
        assert_eq!(
            parse_user_frames("registry=0, ondemand=62"),
            Ok(PerSource(vec![
                (Source::Registry, 0),
                (Source::OnDemand, 62)
            ]))
        );
        for (text, expected) in [
            ("registry", "(e.g. registry=20)"),
            ("all=3", "one source per count"),
            ("registry=63", "user frames are 0 to 62"),
            ("registry=-1", "user frames are 0 to 62"),
        ] {
            let error = parse_user_frames(text).unwrap_err();
            assert!(error.contains(expected), "{text}: {error}");
        }
    }
}

#[cfg(test)]
mod command_line_tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Command {
        #[command(flatten)]
        config: ConfigArgs,
    }

    #[test]
    fn every_option_parses_through_clap_into_its_field() {
        let parsed = Command::try_parse_from([
            "config",
            "--pid",
            "4,8",
            "--exclude-pid",
            "0",
            "--sample",
            "registry=10,timer=2",
            "--user-frames",
            "registry=20,object=0",
        ])
        .unwrap()
        .config;
        assert_eq!(parsed.pid, Some(Pids(vec![4, 8])));
        assert_eq!(parsed.exclude_pid, Some(Pids(vec![0])));
        assert_eq!(
            parsed.sample,
            Some(PerSource(vec![(Source::Registry, 10), (Source::Timer, 2)]))
        );
        assert_eq!(
            parsed.user_frames,
            Some(PerSource(vec![
                (Source::Registry, 20),
                (Source::ObjectHandle, 0)
            ]))
        );
        let cleared = Command::try_parse_from(["config", "--pid", "all", "--exclude-pid", "none"])
            .unwrap()
            .config;
        assert_eq!(
            (cleared.pid, cleared.exclude_pid),
            (Some(Pids(vec![])), Some(Pids(vec![])))
        );
    }
}
