//! Records in other tools' formats (`kstack export`): pprof profiles,
//! speedscope files and Chrome trace events. Frames are named as
//! everywhere else, by [`crate::naming::symbolizer::Symbolizer`].

pub mod chrome_trace;
pub mod pprof;
pub mod speedscope;
