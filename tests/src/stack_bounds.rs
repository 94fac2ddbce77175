//! What kstack's own frames may take of a kernel stack: the figures
//! docs/kernel-stack.md quotes, checked statically against the release
//! image's unwind codes (`tests/tests/driver_image.rs`) and dynamically by
//! the second kernel host, which measures the stack at every kernel call
//! (through `kernel-host-abi`'s facts). The bound kstack-driver-core's
//! `MIN_REMAINING_STACK` (8 KiB) is chosen over. A change that grows the
//! capture path past them fails both.

/// From a source callback's entry to its deepest kernel call.
pub const CALLBACK_PATH_BOUND: usize = 1536;
/// From the dispatch routine's entry, for a capture-now request.
pub const CAPTURE_NOW_PATH_BOUND: usize = 4608;
/// What kstack's own frames may take of the user walk's 24 KiB stack
/// before `RtlWalkFrameChain` starts: the callout and the thunk.
pub const USER_WALK_OWN_BOUND: usize = 256;
