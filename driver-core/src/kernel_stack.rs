//! The kernel-stack budget of a capture: how much stack must be left
//! before the kernel walk, how much the user walk gets, and how what is left
//! is computed. `docs/kernel-stack.md` has the figures behind each number.
//!
//! An x64 kernel thread has 24 KiB of stack in all, and registry and object
//! callbacks run deep inside other drivers' stacks. Running out bugchecks
//! the machine (a double fault), so every budget here fails closed: when the
//! driver cannot tell how much is left, it takes it as nothing.

/// The least kernel stack a capture needs left before it walks the kernel
/// stack, in bytes.
///
/// Why this much: kstack's own frames on the deepest capture path add up to
/// about 1.5 KiB from a callback (the source callback, `DriverCore::capture`
/// with the walked frames, then the publish section), and about 3.8 KiB from
/// a capture-now request (the dispatch routine's frame is the largest);
/// `docs/kernel-stack.md` has the figures, read from the release image.
/// `RtlCaptureStackBackTrace` then unwinds with a `CONTEXT` record (1,232
/// bytes) and its own frames, which cannot be measured here (Windows only).
/// It walks only kernel memory that is resident or, below `DISPATCH_LEVEL`,
/// pageable kernel code, never user memory. 8 KiB of the 24 KiB covers
/// both with room for an interrupt arriving during the walk; below it the
/// event is skipped and counted (`skipped_stack`), never walked.
///
/// The user walk is not held to this: it runs on a stack of its own
/// ([`USER_WALK_STACK`]).
pub const MIN_REMAINING_STACK: usize = 8 * 1024;

/// The stack the user walk runs on, in bytes: the driver asks the kernel
/// for a stack with at least this much (`KeExpandKernelStackAndCalloutEx`)
/// and walks the user stack on it, never on the callback's.
///
/// Why: the user walk reads user memory, so it can take a hard page fault
/// (the file system and its filters read the page in, under the walk) or
/// raise an exception that the kernel dispatches on the same stack
/// (`KiDispatchException`, `RtlDispatchException`, and the unwind to the
/// driver's exception scope, each keeping `CONTEXT` records of 1,232
/// bytes). Neither has a bound kstack can measure; together they can take
/// more than a callback has left. 24 KiB is a whole x64 kernel stack
/// (`KERNEL_STACK_SIZE`): what every thread starts with, page faults and
/// exception dispatch included.
pub const USER_WALK_STACK: usize = 24 * 1024;

/// Bytes of stack left below `here`, an address in the current frame, on
/// the stack whose limits are `low` (its lowest address) and `high` (one
/// past its highest), as the WDK's inline `IoGetRemainingStackSize`
/// computes it from `IoGetStackLimits`; 0 when the limits are unknown (0),
/// make no stack (`low >= high`), or do not hold `here`: a budget that
/// cannot be read is none, so nothing is walked.
///
/// Max IRQL: any.
#[must_use]
pub fn remaining_below(here: u64, low: u64, high: u64) -> usize {
    if low == 0 || low >= high || !(low..high).contains(&here) {
        return 0;
    }
    usize::try_from(here - low).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stack_left_is_from_here_down_to_the_low_limit() {
        assert_eq!(remaining_below(0x9000, 0x4000, 0xA000), 0x5000);
        assert_eq!(remaining_below(0x4000, 0x4000, 0xA000), 0);
        assert_eq!(remaining_below(0x9FFF, 0x4000, 0xA000), 0x5FFF);
    }

    #[test]
    fn limits_that_cannot_be_read_or_do_not_hold_here_leave_nothing() {
        // Unknown: the kernel wrote nothing.
        assert_eq!(remaining_below(0x9000, 0, 0), 0);
        assert_eq!(remaining_below(0x9000, 0, 0xA000), 0);
        // No stack at all, or limits the wrong way round.
        assert_eq!(remaining_below(0x9000, 0xA000, 0xA000), 0);
        assert_eq!(remaining_below(0x9000, 0xA000, 0x4000), 0);
        // Here is on another stack (say a DPC stack whose limits the
        // kernel did not report): above the high limit, or below the low.
        assert_eq!(remaining_below(0xA000, 0x4000, 0xA000), 0);
        assert_eq!(remaining_below(0xF_0000, 0x4000, 0xA000), 0);
        assert_eq!(remaining_below(0x3FFF, 0x4000, 0xA000), 0);
    }
}
