//! The one thing the client needs from the operating system: send a control
//! request to the driver and get its NTSTATUS and output back.

use kstack_abi::ntstatus::NtStatus;

/// A completed device-control request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reply {
    /// The status the driver completed the request with.
    pub status: NtStatus,
    /// Bytes the driver wrote to the output buffer.
    pub information: usize,
}

/// A channel to the driver. The Windows implementation is
/// [`crate::device::Device`]; tests use scripted fakes.
pub trait Transport {
    /// Sends `code` with `input`; the driver writes into `output`.
    fn control(&mut self, code: u32, input: &[u8], output: &mut [u8]) -> Reply;
}
