//! A structured-exception scope around walks through memory the driver
//! does not own.
//!
//! A user-mode stack walk reads the current process's memory, which another
//! thread of that process can unmap or protect at any moment; the access
//! then raises an exception (`STATUS_ACCESS_VIOLATION`) in the walking
//! thread. C drivers put such reads in `__try`/`__except`; Rust has no
//! `__try`. So the one call that may fault goes through a small assembly
//! thunk whose unwind information names ntoskrnl's `__C_specific_handler`
//! and a scope table with one catch-all scope (filter 1,
//! `EXCEPTION_EXECUTE_HANDLER`) over its `call`. The kernel's exception
//! dispatch finds the thunk's frame, the handler unwinds to the scope's
//! landing point, and the thunk returns [`FAULTED`] instead of the machine
//! stopping. No Rust frame lies between the faulting routine and the
//! thunk, so nothing of Rust's is unwound.
//!
//! What this does not cover, as `__try` does not: a kernel-mode access to
//! an invalid *kernel* address is a bug check, not an exception.
//!
//! The user walk runs the scope on a kernel stack of its own
//! ([`guarded_walk_on_own_stack`]), so the exception's dispatch and the
//! unwind to the scope use that stack, not the callback's.
//!
//! Verified under Wine (its ntoskrnl's `__C_specific_handler` forwards to
//! ntdll's): the test build's [`FAULT_PROBE_CODE`] request reads, on its own
//! stack like the user walk, through an unmapped pointer inside the scope
//! and gets [`FAULTED`] back, and reads a mapped one and gets its value
//! (`tests/tests/wine_end_to_end.rs`; Wine's
//! `KeExpandKernelStackAndCalloutEx` calls the work on the same stack);
//! `tests/tests/driver_image.rs` checks the release image carries the
//! handler and the scope. On Windows only the runbook's user-frame steps
//! exercise it.
//!
//! [`FAULT_PROBE_CODE`]: kstack_abi::ioctl::FAULT_PROBE_CODE

use core::ffi::c_void;

use kstack_driver_core::{UserWalkFailure, kernel_stack::USER_WALK_STACK};

use crate::stack_expansion;

/// What [`guarded_walk`] returns when the routine raised an exception.
pub const FAULTED: u64 = u64::MAX;

/// `RtlWalkFrameChain(Callers, Count, Flags)`: the frames it wrote.
pub type FrameWalk = unsafe extern "system" fn(*mut *mut c_void, u32, u32) -> u32;

// `kstack_guarded_walk(walk, buffer, count, flags)`: calls
// `walk(buffer, count, flags)` and returns its 32-bit result zero-extended,
// or FAULTED if the call raised an exception. The `nop` keeps the call's
// return address, the program counter the dispatcher sees for this frame,
// inside the scope. Scope table (for __C_specific_handler): count, then
// begin, end, filter (1: always handle), landing point, as image-relative
// addresses.
core::arch::global_asm!(
    ".text",
    ".globl kstack_guarded_walk",
    ".p2align 4",
    "kstack_guarded_walk:",
    ".seh_proc kstack_guarded_walk",
    ".seh_handler __C_specific_handler, @except",
    "sub rsp, 40",
    ".seh_stackalloc 40",
    ".seh_endprologue",
    "mov rax, rcx",
    "mov rcx, rdx",
    "mov edx, r8d",
    "mov r8d, r9d",
    ".Lkstack_scope_begin:",
    "call rax",
    "nop",
    ".Lkstack_scope_end:",
    "mov eax, eax",
    "add rsp, 40",
    "ret",
    ".Lkstack_scope_landing:",
    "mov rax, -1",
    "add rsp, 40",
    "ret",
    ".seh_handlerdata",
    ".long 1",
    ".long .Lkstack_scope_begin@IMGREL",
    ".long .Lkstack_scope_end@IMGREL",
    ".long 1",
    ".long .Lkstack_scope_landing@IMGREL",
    ".text",
    ".seh_endproc",
);

unsafe extern "C" {
    /// The thunk above.
    fn kstack_guarded_walk(
        walk: FrameWalk,
        buffer: *mut *mut c_void,
        count: u32,
        flags: u32,
    ) -> u64;
}

/// Calls `walk(buffer, count, flags)` inside the exception scope: its
/// result, or `None` when it raised an exception (the buffer then holds
/// whatever it wrote before).
///
/// # Safety
/// `walk` is a routine with [`FrameWalk`]'s signature that writes at most
/// `count` pointers to `buffer`, which has room for them; it may fault
/// only on memory whose faults raise exceptions (user addresses).
///
/// Max IRQL: that of `walk` (`RtlWalkFrameChain` with user mode: below
/// `DISPATCH_LEVEL`, where a fault can be resolved or raised).
pub unsafe fn guarded_walk(
    walk: FrameWalk,
    buffer: *mut *mut c_void,
    count: u32,
    flags: u32,
) -> Option<u32> {
    // SAFETY: the thunk passes the caller's arguments on unchanged; the
    // caller's contract is `walk`'s.
    let result = unsafe { kstack_guarded_walk(walk, buffer, count, flags) };
    if result == FAULTED {
        None
    } else {
        u32::try_from(result).ok()
    }
}

/// [`guarded_walk`] on a kernel stack of its own of at least
/// [`USER_WALK_STACK`] bytes ([`stack_expansion`]): a page fault taken or
/// an exception dispatched under the walk uses that stack, not what the
/// caller has left. The scope is inside, so no exception crosses the
/// switch back.
///
/// # Errors
/// [`UserWalkFailure::Faulted`] when the walk raised an exception,
/// [`UserWalkFailure::NoStack`] when the kernel had no stack for it (then
/// nothing was walked).
///
/// # Safety
/// As [`guarded_walk`].
///
/// Max IRQL: as [`guarded_walk`].
pub unsafe fn guarded_walk_on_own_stack(
    walk: FrameWalk,
    buffer: *mut *mut c_void,
    count: u32,
    flags: u32,
) -> Result<u32, UserWalkFailure> {
    stack_expansion::run_with_stack(USER_WALK_STACK, || {
        // SAFETY: the caller's contract, passed on unchanged.
        unsafe { guarded_walk(walk, buffer, count, flags) }
    })
    .map_err(|_| UserWalkFailure::NoStack)?
    .ok_or(UserWalkFailure::Faulted)
}

/// Test builds only: a [`FrameWalk`]-shaped routine that reads the 32-bit
/// value at `buffer` (a leaf without unwind information, as the dispatcher
/// allows), so a test can fault inside the scope on purpose.
#[cfg(feature = "test-injection")]
pub mod probe {
    use super::FrameWalk;

    core::arch::global_asm!(
        ".text",
        ".globl kstack_fault_probe",
        ".p2align 4",
        "kstack_fault_probe:",
        "mov eax, dword ptr [rcx]",
        "ret",
    );

    unsafe extern "system" {
        /// The probe above.
        fn kstack_fault_probe(buffer: *mut *mut core::ffi::c_void, count: u32, flags: u32) -> u32;
    }

    /// The probe as a walk routine.
    pub const READ_FIRST_WORD: FrameWalk = kstack_fault_probe;
}
