//! Driver replies built for scripted transports (feature `test-support`,
//! which only the crate's own tests turn on).

use kstack_abi::{
    MAX_RECORD_SIZE, ReadHeader, RecordFlags, RecordHeader, SourceFacts, encode_record,
    messages::READ_HEADER_SIZE, stack_id,
};

/// One encoded record of `stack`'s stack (process 4, thread 8, shard 0,
/// time 0), with these facts and flags, holding `frames` (the stack, or
/// none for a record that names it).
///
/// # Panics
/// When `frames` holds more than a record can.
#[must_use]
pub fn record_bytes(
    sequence: u64,
    facts: SourceFacts,
    flags: RecordFlags,
    stack: &[u64],
    frames: &[u64],
) -> Vec<u8> {
    let header = RecordHeader {
        sequence,
        timestamp: 0,
        process_id: 4,
        thread_id: 8,
        processor: 0,
        shard: 0,
        irql: 0,
        flags,
        user_frame_count: 0,
        user_part: kstack_abi::UserPart::Off,
        os_hash: 1,
        stack_id: stack_id(stack.iter().copied()),
        facts,
    };
    let mut out = vec![0; MAX_RECORD_SIZE];
    let size = encode_record(&header, frames, &mut out).expect("at most MAX_FRAMES frames");
    out.truncate(size);
    out
}

/// A read reply: its header (declaring `declared` records, and `dropped`)
/// and `payload`.
///
/// # Panics
/// When the payload is over 4 GiB.
#[must_use]
pub fn read_reply(payload: &[u8], declared: u32, more_pending: bool, dropped: u64) -> Vec<u8> {
    let mut bytes = vec![0; READ_HEADER_SIZE];
    ReadHeader {
        record_count: declared,
        payload_bytes: u32::try_from(payload.len()).expect("a small payload"),
        more_pending,
        dropped,
    }
    .encode(&mut bytes);
    bytes.extend(payload);
    bytes
}
