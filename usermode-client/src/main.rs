//! `kstack`: the user-mode client of the kstack driver.

#[cfg(windows)]
mod device;
mod error;
mod report;
mod session;
mod transport;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::error::ClientError;

/// Capture and inspect kernel stack traces recorded by kstack.sys.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Driver and ABI version, paging policy, sources, counters, ring fill.
    Status,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(usage) => {
            let _ = usage.print();
            // --help and --version are not errors.
            return if usage.use_stderr() {
                ExitCode::from(error::exit_code::USAGE)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    match run(&cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("kstack: {error}");
            ExitCode::from(error.exit_code())
        }
    }
}

fn run(command: &Command) -> Result<(), ClientError> {
    match command {
        Command::Status => {
            let mut device = open_device()?;
            let status = session::status(&mut device)?;
            print!("{}", report::status(&status));
            Ok(())
        }
    }
}

#[cfg(windows)]
fn open_device() -> Result<device::Device, ClientError> {
    device::Device::open()
}

#[cfg(not(windows))]
fn open_device() -> Result<NoDevice, ClientError> {
    Err(ClientError::NeedsWindows)
}

/// Stands in for the device where there is none, so commands type-check
/// and say plainly that they need Windows.
#[cfg(not(windows))]
enum NoDevice {}

#[cfg(not(windows))]
impl transport::Transport for NoDevice {
    fn control(&mut self, _code: u32, _input: &[u8], _output: &mut [u8]) -> transport::Reply {
        match *self {}
    }
}
