//! Records as the client holds them: each trace record with its frames
//! (the stacks the driver sends once and then names by id are put back
//! together here), saved capture files for offline analysis, and the
//! records grouped by stack that `top`, folded stacks and flamegraphs
//! are drawn from.

pub mod block;
pub mod entry_walk;
pub mod format;
pub mod legacy;
pub mod reader;
pub mod sample_entry;
pub mod stack_table;
pub mod state_filter;
#[cfg(feature = "test-support")]
pub mod synthetic;
pub mod trace;
pub mod writer;
