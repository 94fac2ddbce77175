//! One module per `kstack` command, named after it, with its arguments and
//! what it does; the modules without a command's name hold what several
//! commands share (where records come from, where output goes).

pub mod capture_parts;
pub mod clear;
pub mod config;
pub mod export;
#[cfg(test)]
mod fake_driver;
pub mod flamegraph;
pub mod folded;
pub mod input;
pub mod live;
pub mod modules;
pub mod output;
pub mod read;
pub mod sample;
pub mod save;
pub mod selftest;
pub mod status;
pub mod symbols;
pub mod threads;
pub mod top;
pub mod top_live;
pub mod verify;
pub mod watch;
