//! Sends one test-injection request to a kstack.sys built with the
//! `test-injection` feature (Wine end-to-end tests). Usage:
//! `kstack-inject SOURCE WORD WORD WORD`, where the words are the source's
//! fact words as `SourceFacts::to_words` lays them out (decimal or 0x hex).
//! Prints the request's NTSTATUS; exits 0 when it succeeded.
//!
//! `kstack-inject fault-probe mapped|unmapped` sends a fault-probe request
//! instead and prints the status and the reply (the value read, or
//! `faulted` when the driver's exception scope caught the read).

use std::process::ExitCode;

#[cfg(windows)]
fn main() -> ExitCode {
    use kstack_abi::{Source, SourceFacts, ioctl::INJECT_CODE, messages::encode_inject_request};
    use kstack_client::device::transport::Transport;

    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [mode, target] = args.as_slice()
        && mode == "fault-probe"
    {
        return fault_probe(target);
    }
    let parse_word = |text: &str| match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    };
    let facts = match args.as_slice() {
        [source, a, b, c] => Source::from_name(source).and_then(|source| {
            let words = [parse_word(a)?, parse_word(b)?, parse_word(c)?];
            SourceFacts::from_words(source, words).ok()
        }),
        _ => None,
    };
    let Some(facts) = facts else {
        eprintln!("usage: kstack-inject SOURCE WORD WORD WORD (valid fact words for the source)");
        return ExitCode::from(2);
    };
    let mut device = match open_device() {
        Ok(device) => device,
        Err(code) => return code,
    };
    let reply = device.control(INJECT_CODE, &encode_inject_request(&facts), &mut []);
    println!("{:#010x}", reply.status);
    if reply.status >= 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The driver's device, or the exit code after saying why not.
#[cfg(windows)]
fn open_device() -> Result<kstack_client::device::Device, ExitCode> {
    kstack_client::device::Device::open().map_err(|error| {
        eprintln!("kstack-inject: {error}");
        ExitCode::from(3)
    })
}

/// Sends one fault-probe request for `target`.
#[cfg(windows)]
fn fault_probe(target: &str) -> ExitCode {
    use kstack_abi::{
        ioctl::FAULT_PROBE_CODE,
        messages::{FAULT_PROBE_REPLY_SIZE, FaultProbe, encode_fault_probe_request},
    };
    use kstack_client::device::transport::Transport;

    let target = match target {
        "mapped" => FaultProbe::Mapped,
        "unmapped" => FaultProbe::Unmapped,
        _ => {
            eprintln!("usage: kstack-inject fault-probe mapped|unmapped");
            return ExitCode::from(2);
        }
    };
    let mut device = match open_device() {
        Ok(device) => device,
        Err(code) => return code,
    };
    let mut reply = [0_u8; FAULT_PROBE_REPLY_SIZE];
    let answer = device.control(
        FAULT_PROBE_CODE,
        &encode_fault_probe_request(target),
        &mut reply,
    );
    let value = u64::from_le_bytes(reply);
    if answer.status < 0 || answer.information != FAULT_PROBE_REPLY_SIZE {
        println!("{:#010x}", answer.status);
        return ExitCode::FAILURE;
    }
    if value == u64::MAX {
        println!("{:#010x} faulted", answer.status);
    } else {
        println!("{:#010x} {value:#x}", answer.status);
    }
    ExitCode::SUCCESS
}

#[cfg(not(windows))]
fn main() -> ExitCode {
    eprintln!("kstack-inject talks to the kstack driver: it runs on Windows or under Wine");
    ExitCode::FAILURE
}
