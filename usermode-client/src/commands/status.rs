//! `kstack status`: driver and ABI version, paging policy, sources,
//! counters, ring fill.

use kstack_client::{
    device::session,
    error::ClientError,
    output::{
        report,
        width::{Stream, fit, width},
    },
};

use super::{live::open_device, output::JsonArg};

pub fn run(output: &JsonArg) -> Result<(), ClientError> {
    let status = session::status(&mut open_device()?)?;
    if output.json {
        println!("{}", report::status_json(&status));
    } else {
        print!("{}", fit(&report::status(&status), width(Stream::Stdout)));
    }
    Ok(())
}
