//! `kstack selftest`: the driver captures the stack of this very request.

use kstack_client::{device::session, error::ClientError};

use super::{
    live::open_device,
    output::{RecordFormat, print_records},
};

pub fn run(format: &RecordFormat) -> Result<(), ClientError> {
    let mut device = open_device()?;
    let symbolizer = format.live_symbolizer(&mut device)?;
    let record = session::capture_now(&mut device, u64::from(std::process::id()))?;
    print_records(std::slice::from_ref(&record), &symbolizer, format);
    Ok(())
}
