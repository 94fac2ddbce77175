//! The kstack client as a library: the conversations with the driver,
//! decoded records, how frames are named, and what is made of them. The
//! `kstack` binary is the command line over it (`main.rs`, `commands/`);
//! the Wine tests' bad-input storm reuses the device.
//!
//! The rooms, each depending only on those listed before it:
//! - [`clock`]: the records' clock (Windows system time) as text and
//!   Unix time;
//! - [`system_information`] (Windows): the system's replies to
//!   `NtQuerySystemInformation`, in a buffer grown until they fit;
//! - [`toolhelp`] (Windows): Toolhelp snapshots of the running processes;
//! - [`thread_list`]: the machine's threads and what each is doing (state,
//!   wait reason, switches, CPU times);
//! - [`naming`]: kernel and user-mode module lists, PDB symbols, and the
//!   symbolizer that names every frame;
//! - [`capture`]: trace records with their stacks put back together (and a
//!   sample's thread facts), saved capture files, and records grouped by
//!   stack;
//! - [`sampling`]: which threads each tick of `kstack sample` asks for,
//!   which samples repeat a stack, and the count of every one it did not
//!   ask for or that did not answer;
//! - [`error`]: everything that can go wrong, each with its exit code;
//! - [`device`]: the transport to the driver, the Windows device handle,
//!   and the conversations (status, read, configure, capture threads)
//!   over it;
//! - [`output`]: reports, flamegraph SVGs, and exports for other tools;
//! - [`live_top`]: the model and drawing of `kstack top --live`.

pub mod capture;
pub mod clock;
pub mod device;
pub mod error;
pub mod live_top;
pub mod naming;
pub mod output;
pub mod sampling;
#[cfg(windows)]
mod system_information;
pub mod thread_list;
#[cfg(windows)]
mod toolhelp;
