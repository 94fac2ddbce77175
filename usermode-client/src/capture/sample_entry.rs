//! A sample's thread facts in a capture file (format 6). `kstack sample`
//! writes one right after each record its requests asked for, and one on
//! its own for each sample that repeats a thread's last captured stack
//! without an APC (see `sampling`).
//!
//! Layout (32 bytes, little-endian; bytes 0 to 2 are where every record
//! has its size and kind):
//!
//! | offset | size | field |
//! |-------:|-----:|-------|
//! | 0  | 2 | size: 32 |
//! | 2  | 1 | [`FILE_ENTRY_KIND`] |
//! | 3  | 1 | flags: bit 0 repeated, bit 1 the state is known |
//! | 4  | 1 | the thread's state when listed (`KTHREAD_STATE`) |
//! | 5  | 1 | its wait reason (`KWAIT_REASON`) |
//! | 6  | 2 | reserved, zero |
//! | 8  | 4 | the sampled thread's id |
//! | 12 | 4 | its process's id |
//! | 16 | 8 | its kernel and user time since its previous sample, 100 ns units |
//! | 24 | 8 | a repeated sample's time (the tick's listing, on the records' clock); 0 after a record, whose time it shares |

use kstack_abi::module_record::FILE_ENTRY_KIND;

use crate::{
    capture::trace::SampleFacts,
    thread_list::{ThreadState, WaitReason},
};

/// Bytes in a sample entry.
pub const SAMPLE_ENTRY_SIZE: usize = 32;
const REPEATED: u8 = 1;
const STATE_KNOWN: u8 = 2;

/// A decoded sample entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SampleEntry {
    /// The sampled thread.
    pub thread_id: u32,
    /// Its process.
    pub process_id: u32,
    /// A repeated sample's time; 0 after a record.
    pub timestamp: u64,
    /// The facts.
    pub facts: SampleFacts,
}

/// Whether the entry at the front of `bytes` is one of the file's own
/// (byte 2 [`FILE_ENTRY_KIND`]).
#[must_use]
pub fn is_file_entry(bytes: &[u8]) -> bool {
    bytes.get(2) == Some(&FILE_ENTRY_KIND)
}

/// The entry's bytes.
#[must_use]
pub fn encode(entry: &SampleEntry) -> [u8; SAMPLE_ENTRY_SIZE] {
    let mut bytes = [0_u8; SAMPLE_ENTRY_SIZE];
    bytes[0..2].copy_from_slice(&32_u16.to_le_bytes());
    bytes[2] = FILE_ENTRY_KIND;
    let facts = &entry.facts;
    bytes[3] = if facts.repeated { REPEATED } else { 0 }
        | if facts.state.is_some() {
            STATE_KNOWN
        } else {
            0
        };
    bytes[4] = facts.state.map_or(0, |state| state.0);
    bytes[5] = facts.wait_reason.0;
    bytes[8..12].copy_from_slice(&entry.thread_id.to_le_bytes());
    bytes[12..16].copy_from_slice(&entry.process_id.to_le_bytes());
    bytes[16..24].copy_from_slice(&facts.cpu_time.to_le_bytes());
    bytes[24..32].copy_from_slice(&entry.timestamp.to_le_bytes());
    bytes
}

/// The entry at the front of `bytes`.
///
/// # Errors
/// What is wrong with it, in words: a size other than 32, bytes missing,
/// unknown flags, a reserved field not zero, a state given where none is
/// known, or a time on an entry that follows its record.
pub fn decode(bytes: &[u8]) -> Result<SampleEntry, &'static str> {
    let bytes: &[u8; SAMPLE_ENTRY_SIZE] = bytes
        .get(..SAMPLE_ENTRY_SIZE)
        .and_then(|entry| entry.try_into().ok())
        .ok_or("a sample entry cut short")?;
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap_or_default());
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or_default());
    if u16::from_le_bytes([bytes[0], bytes[1]]) != 32 || bytes[2] != FILE_ENTRY_KIND {
        return Err("not a sample entry of 32 bytes");
    }
    let flags = bytes[3];
    if flags & !(REPEATED | STATE_KNOWN) != 0 || bytes[6..8] != [0, 0] {
        return Err("a sample entry with unknown flags or reserved bytes set");
    }
    let known = flags & STATE_KNOWN != 0;
    if !known && bytes[4] != 0 {
        return Err("a sample entry with a state where none is known");
    }
    if flags & REPEATED == 0 && u64_at(24) != 0 {
        return Err("a sample entry after a record with a time of its own");
    }
    Ok(SampleEntry {
        thread_id: u32_at(8),
        process_id: u32_at(12),
        timestamp: u64_at(24),
        facts: SampleFacts {
            state: known.then_some(ThreadState(bytes[4])),
            wait_reason: WaitReason(bytes[5]),
            cpu_time: u64_at(16),
            repeated: flags & REPEATED != 0,
        },
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Every entry reads back as written.
        #[test]
        fn entries_round_trip(
            thread_id: u32, process_id: u32, timestamp: u64, cpu_time: u64,
            state in proptest::option::of(any::<u8>()), wait_reason: u8, repeated: bool,
        ) {
            let entry = SampleEntry {
                thread_id,
                process_id,
                timestamp: if repeated { timestamp } else { 0 },
                facts: SampleFacts {
                    state: state.map(ThreadState),
                    wait_reason: WaitReason(wait_reason),
                    cpu_time,
                    repeated,
                },
            };
            let bytes = encode(&entry);
            prop_assert!(is_file_entry(&bytes));
            prop_assert_eq!(decode(&bytes), Ok(entry));
        }
    }

    #[test]
    fn malformed_entries_are_refused() {
        let entry = SampleEntry {
            thread_id: 8,
            process_id: 4,
            timestamp: 0,
            facts: SampleFacts {
                state: None,
                wait_reason: WaitReason(0),
                cpu_time: 0,
                repeated: false,
            },
        };
        let good = encode(&entry);
        assert!(decode(&good[..31]).is_err());
        for (at, byte) in [(0, 40), (3, 4), (4, 5), (6, 1), (24, 1)] {
            let mut bad = good;
            bad[at] = byte;
            assert!(decode(&bad).is_err(), "byte {at} = {byte}");
        }
    }
}
