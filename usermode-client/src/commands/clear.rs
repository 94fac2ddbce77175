//! `kstack clear`: discards every record in the ring.

use kstack_client::{device::session, error::ClientError};

use super::live::open_device;

pub fn run() -> Result<(), ClientError> {
    session::clear(&mut open_device()?)
}
