//! `kstack top --live`: the model of the live view (pure state, driven by
//! records and an injected clock).

mod model;

pub use model::{DriverCounters, Filter, LiveTop, Row, SortKey};
