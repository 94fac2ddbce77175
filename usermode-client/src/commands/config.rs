//! `kstack config`: shows or changes what is captured.

use clap::Args;
use kstack_abi::{CaptureConfig, Source, SourceSet};
use kstack_client::{error::ClientError, session, transport::Transport};

use super::live::open_device;

#[derive(Args)]
pub struct ConfigArgs {
    /// Sources to enable (comma-separated names, or `all`). Capture-now
    /// (`selftest`) always answers; `ondemand` decides whether its record
    /// is also kept in the ring.
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
    /// Keep only records of this process id (0: every process). Applies to
    /// every source, capture-now included: the process is the one the
    /// callback runs in (the record's pid), which for process, thread and
    /// image events need not be the one the event names. Events left out
    /// are counted as `filtered` in `kstack status`; a capture-now from
    /// another process is still answered, not kept.
    #[arg(long)]
    pid: Option<u32>,
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

pub fn run(args: &ConfigArgs) -> Result<(), ClientError> {
    config(&mut open_device()?, args)
}

/// Applies the options to the configuration in force; prints the result.
fn config(device: &mut impl Transport, args: &ConfigArgs) -> Result<(), ClientError> {
    let current = session::status(device)?.config;
    let mut sources = current.sources;
    for source in args.enable.unwrap_or_default().iter() {
        sources = sources.with(source);
    }
    for source in args.disable.unwrap_or_default().iter() {
        sources = sources.without(source);
    }
    let wanted = CaptureConfig {
        sources,
        frames_to_skip: args.skip.unwrap_or(current.frames_to_skip),
        frames_to_capture: args.frames.unwrap_or(current.frames_to_capture),
        process_filter: args.pid.unwrap_or(current.process_filter),
        timer_period_ms: args.timer_period.unwrap_or(current.timer_period_ms),
    };
    if wanted != current {
        session::configure(device, &wanted)?;
    }
    let config = session::status(device)?.config;
    let enabled: Vec<_> = config.sources.iter().map(Source::name).collect();
    println!(
        "sources enabled: {}; skip {} frames, keep up to {}, process filter {}, timer period {} ms",
        if enabled.is_empty() {
            "none".to_owned()
        } else {
            enabled.join(",")
        },
        config.frames_to_skip,
        config.frames_to_capture,
        config.process_filter,
        config.timer_period_ms
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
