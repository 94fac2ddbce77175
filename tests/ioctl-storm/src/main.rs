//! Bad input from user mode against the real driver: random control codes,
//! buffer lengths and damaged requests, sent through the same transport as
//! the client. Each reply's status must equal what kstack-driver-core, run
//! here in user mode as a reference with the driver's own registrations and
//! paging setting, answers for the same request; and the driver must still
//! serve status afterwards. Usage: `kstack-ioctl-storm [CASES] [SEED]`.

#[cfg(windows)]
mod storm;

use std::process::ExitCode;

#[cfg(windows)]
fn main() -> ExitCode {
    storm::run()
}

#[cfg(not(windows))]
fn main() -> ExitCode {
    eprintln!("kstack-ioctl-storm talks to the kstack driver: it runs on Windows or under Wine");
    ExitCode::FAILURE
}
