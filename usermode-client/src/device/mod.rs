//! Talking to the driver: the one request the client needs from the
//! operating system ([`transport`]), the Windows device that answers it
//! (`Device`, Windows only), the conversations built on it
//! ([`session`]), and, for tests, the driver's replies built for scripted
//! transports.

pub mod session;
#[cfg(feature = "test-support")]
pub mod test_support;
pub mod transport;
#[cfg(windows)]
mod windows;

#[cfg(windows)]
pub use windows::Device;
