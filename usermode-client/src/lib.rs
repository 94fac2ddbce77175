//! The kstack client as a library: the Windows transport, the conversations
//! with the driver, decoded records and reports. The `kstack` binary is the
//! command line over it; the Wine tests' bad-input storm reuses the transport.

#[cfg(windows)]
pub mod device;
pub mod capture_file;
pub mod error;
pub mod report;
pub mod modules;
pub mod session;
pub mod system_modules;
pub mod trace;
pub mod transport;
