//! Sends one test-injection request to a kstack.sys built with the
//! `test-injection` feature (Wine end-to-end tests). Usage:
//! `kstack-inject SOURCE WORD WORD WORD`, where the words are the source's
//! fact words as `SourceFacts::to_words` lays them out (decimal or 0x hex).
//! Prints the request's NTSTATUS; exits 0 when it succeeded.

use std::process::ExitCode;

#[cfg(windows)]
fn main() -> ExitCode {
    use kstack_abi::{Source, SourceFacts, ioctl::INJECT_CODE, messages::encode_inject_request};
    use kstack_client::{device::Device, transport::Transport};

    let args: Vec<String> = std::env::args().skip(1).collect();
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
    let mut device = match Device::open() {
        Ok(device) => device,
        Err(error) => {
            eprintln!("kstack-inject: {error}");
            return ExitCode::from(3);
        }
    };
    let reply = device.control(INJECT_CODE, &encode_inject_request(&facts), &mut []);
    println!("{:#010x}", reply.status);
    if reply.status >= 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

#[cfg(not(windows))]
fn main() -> ExitCode {
    eprintln!("kstack-inject talks to the kstack driver: it runs on Windows or under Wine");
    ExitCode::FAILURE
}
