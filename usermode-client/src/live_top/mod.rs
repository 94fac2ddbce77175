//! `kstack top --live`: the model of the live view (pure state, driven by
//! records and an injected clock) and its drawing into a ratatui frame.
//! Reading the driver and the keyboard is the command's business
//! (`commands/top_live.rs` in the binary).

mod model;
mod render;

pub use model::{DriverCounters, Filter, LiveTop, Row, SortKey};
pub use render::draw;
