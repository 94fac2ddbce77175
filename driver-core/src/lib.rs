//! kstack.sys's logic, without kernel bindings, so it builds and is tested
//! on any host (with proptest, and loom under `--cfg loom`).
//!
//! - [`ring`]: the record ring, one per shard: one publish section at a
//!   time, a consumer that never blocks it.
//! - [`sharded_ring`]: the per-processor shards the driver keeps.
//! - [`rundown`]: the gate unload closes before freeing what callbacks use.
//! - [`paging_policy`]: when a stack walk is allowed.
//! - [`stack_table`]: each distinct stack kept once, named by records.
//! - [`platform`]: the kernel as the capture sees it (the driver supplies it).
//! - [`capture`]: from a callback's facts to a record in the ring; the
//!   configuration it reads is a sequence lock of its own (`config_cell`).
//! - [`kernel_stack`]: how much kernel stack a capture needs, and the user
//!   walk's own stack.
//! - [`user_walk_guard`]: which threads are walking their user stack.
//! - [`module_records`]: image loads and process exits into the ring.
//! - [`requests`]: serving the IOCTLs, every input validated by kstack-abi.
//!
//! The driver crate supplies the kernel through [`platform::Platform`] and
//! [`requests::SourceControl`]; everything here is plain safe Rust but for
//! the ring's slot access, whose invariants `ring` documents.

#![cfg_attr(not(any(test, feature = "test-support")), no_std)]

pub mod capture;
mod config_cell;
pub mod kernel_stack;
pub mod module_records;
pub mod paging_policy;
pub mod platform;
pub mod requests;
pub mod ring;
pub mod rundown;
pub mod sharded_ring;
pub mod stack_table;
mod sync;
#[cfg(feature = "test-support")]
pub mod test_support;
mod thread_captures;
pub mod user_walk_guard;

pub use capture::{CaptureOutcome, DriverCore, SourceRegistration};
pub use module_records::ModuleFacts;
pub use platform::{Platform, Routine, UserThread, UserWalkFailure};
pub use requests::{Caller, SourceControl};
pub use ring::{RecordRing, Word};
pub use rundown::{Rundown, RundownGuard};
pub use sharded_ring::{Shard, ShardedRing};
pub use stack_table::{StackEntry, StackTable};
pub use sync::Wait;
