//! Synthetic captures for benchmarks (feature `test-support`): records of
//! a busy timer source over a fixed set of stacks, spread over a kernel
//! module list, written in batches as `kstack save` writes them. The
//! offline analysis benchmark (`benches/analysis.rs`) and the size
//! benchmark's generator (`examples/synthetic_capture.rs`, run by `cargo
//! xtask bench size`) share them, so both measure the same kind of file.

use std::{io, sync::Arc};

use kstack_abi::{RecordFlags, RecordHeader, SourceFacts, stack_id};

use crate::{
    capture::{
        trace::TraceRecord,
        writer::{CaptureOutput, CaptureWriter},
    },
    naming::modules::{Module, ModuleMap},
};

/// Distinct stacks among the records.
pub const UNIQUE_STACKS: u64 = 2_000;
/// Frames per record (the default `frames_to_capture`).
pub const FRAMES: u64 = 32;
/// Modules in the module list (a typical Windows 11 kernel has ~200).
pub const MODULES: u64 = 200;
const MODULE_SIZE: u32 = 0x10_0000;
/// Where the first module is loaded.
pub const KERNEL_BASE: u64 = 0xFFFF_F800_0000_0000;
/// Records per batch: about what one read drains at 10,000 records a
/// second every 50 ms, five times over.
pub const BATCH: u64 = 2_500;

/// The kernel's module list: `driver0.sys` to `driver199.sys`.
#[must_use]
pub fn modules() -> ModuleMap {
    ModuleMap::new((0..MODULES).map(|index| Module {
        base: KERNEL_BASE + index * u64::from(MODULE_SIZE) * 2,
        size: MODULE_SIZE,
        name: format!("driver{index}.sys"),
    }))
}

/// Stack `stack`'s frames: spread over the modules, the same every time.
#[must_use]
pub fn frames(stack: u64) -> Vec<u64> {
    (0..FRAMES)
        .map(|depth| {
            let mixed = (stack * 31 + depth * 17) % MODULES;
            KERNEL_BASE + mixed * u64::from(MODULE_SIZE) * 2 + (stack * 97 + depth * 13) % 0xF_FFFF
        })
        .collect()
}

/// Writes `records` timer records over [`UNIQUE_STACKS`] stacks whose
/// frames `frames_of` gives, [`BATCH`] to a batch.
///
/// # Errors
/// The writer's I/O error.
pub fn write_records<W: CaptureOutput>(
    writer: &mut CaptureWriter<W>,
    records: u64,
    frames_of: impl Fn(u64) -> Vec<u64>,
) -> io::Result<()> {
    let stacks: Vec<Arc<[u64]>> = (0..UNIQUE_STACKS)
        .map(|stack| frames_of(stack).into())
        .collect();
    for sequence in 1..=records {
        // Skewed like real samples: half the records share 20 hot stacks.
        let stack = if sequence % 2 == 0 {
            sequence % 20
        } else {
            (sequence / 2) % UNIQUE_STACKS
        };
        let frames = &stacks[usize::try_from(stack).unwrap_or_default()];
        let shard = u16::try_from(sequence % 8).unwrap_or_default();
        writer.append(&TraceRecord {
            header: RecordHeader {
                // Eight processors in turn, each numbering its shard's records.
                sequence: sequence / 8 + 1,
                timestamp: 134_083_512_000_000_000 + sequence * 10_000,
                process_id: 4,
                thread_id: 8,
                processor: shard,
                shard,
                irql: 2,
                flags: RecordFlags::NONE,
                user_frame_count: 0,
                user_part: kstack_abi::UserPart::Off,
                os_hash: 0,
                stack_id: stack_id(frames),
                facts: SourceFacts::Timer,
            },
            frames: Arc::clone(frames),
            sample: None,
        })?;
        if sequence % BATCH == 0 {
            writer.end_batch()?;
        }
    }
    writer.end_batch()
}
