//! `kstack clear`: discards every record in the ring.

use kstack_client::{error::ClientError, session};

use super::live::open_device;

pub fn run() -> Result<(), ClientError> {
    session::clear(&mut open_device()?)
}
