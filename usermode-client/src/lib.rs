//! The kstack client as a library: the Windows transport, the conversations
//! with the driver, decoded records and reports. The `kstack` binary is the
//! command line over it; the Wine tests' bad-input storm reuses the transport.

pub mod capture_file;
#[cfg(windows)]
pub mod device;
pub mod error;
pub mod export;
pub mod flamegraph;
pub mod live_top;
pub mod modules;
#[cfg(windows)]
pub mod pdb_symbols;
pub mod process_modules;
pub mod report;
pub mod session;
pub mod stack_table;
pub mod symbol_path;
pub mod symbolizer;
pub mod system_modules;
#[cfg(feature = "test-support")]
pub mod test_support;
pub mod trace;
pub mod transport;
