//! What is made of the driver's answers and the records: readable reports
//! and JSON of the driver's status, flamegraph SVGs, the records in other
//! tools' formats ([`export`]), and text fitted to the terminal ([`width`]). Records and stack tables render
//! themselves as text and JSON lines (`capture`).

pub mod export;
pub mod flamegraph;
pub mod report;
pub mod width;
