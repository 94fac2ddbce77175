//! Running work with a guaranteed amount of kernel stack:
//! `KeExpandKernelStackAndCalloutEx` first looks whether the current stack
//! has that much left; if not, it grows the stack or switches to a new
//! stack segment for the call, and gives it back afterwards.
//!
//! kstack runs its user walk this way ([`crate::kernel`]'s
//! `walk_user_stack`): a walk of user memory can take a hard page fault or
//! have an exception dispatched under it, and neither fits what a callback
//! deep in another driver's stack may have left (`docs/kernel-stack.md`).
//!
//! It never waits (`Wait` = FALSE): a callback must not block on a free
//! stack, so when none is to be had the work does not run and the caller
//! counts it. The stack segment is the kernel's, from its own cache, not
//! kstack's pool. Under Wine the routine calls the work on the same stack
//! (Wine's kernel stacks are ordinary thread stacks).

use core::{ffi::c_void, ptr};

use wdk_sys::{BOOLEAN, NTSTATUS};

/// `EXPAND_STACK_CALLOUT`: the routine run with the guaranteed stack.
type StackCallout = unsafe extern "system" fn(*mut c_void);

#[link(name = "ntoskrnl", kind = "dylib")]
unsafe extern "system" {
    /// `KeExpandKernelStackAndCalloutEx(Callout, Parameter, Size, Wait,
    /// Context)` (ntddk.h; Windows 7 and later, and Wine): calls `Callout`
    /// with at least `Size` bytes of stack, or returns an error without
    /// calling it. Not declared by the mingw-w64 headers.
    fn KeExpandKernelStackAndCalloutEx(
        callout: StackCallout,
        parameter: *mut c_void,
        size: usize,
        wait: BOOLEAN,
        context: *mut c_void,
    ) -> NTSTATUS;
}

/// Runs `work` with at least `bytes` of kernel stack, without waiting for
/// one: `work`'s result, or the routine's failure status
/// (`STATUS_NO_MEMORY` when no stack segment was free), in which case
/// `work` never ran.
///
/// `work` must not unwind (the driver aborts on panic) and must not raise
/// an exception it does not catch itself: an exception does not cross the
/// switch back to the caller's stack.
///
/// # Errors
/// The routine's status when it could not give `work` the stack.
///
/// Max IRQL: `DISPATCH_LEVEL` (kstack calls it below, for the user walk).
pub fn run_with_stack<F: FnOnce() -> R, R>(bytes: usize, work: F) -> Result<R, NTSTATUS> {
    let mut call = Call::<F, R>::Pending(work);
    // SAFETY: `call` outlives the routine, which calls `run_call::<F, R>`
    // with it at most once before returning; no wait, so any IRQL up to
    // DISPATCH_LEVEL; `Context` is reserved and null.
    let status = unsafe {
        KeExpandKernelStackAndCalloutEx(
            run_call::<F, R>,
            (&raw mut call).cast(),
            bytes,
            0,
            ptr::null_mut(),
        )
    };
    match call {
        Call::Done(result) if status >= 0 => Ok(result),
        // The routine did not call the work: its status says why. A
        // success without the call would break its contract; it reads as
        // no stack.
        _ => Err(if status < 0 {
            status
        } else {
            wdk_sys::STATUS_NO_MEMORY
        }),
    }
}

/// The work, before and after it ran.
enum Call<F, R> {
    Pending(F),
    Running,
    Done(R),
}

/// The callout: runs the pending work once and keeps its result.
///
/// # Safety
/// `parameter` is the `Call<F, R>` that [`run_with_stack`] passed, alive
/// and not otherwise borrowed for the call.
///
/// Max IRQL: that of [`run_with_stack`]'s caller.
unsafe extern "system" fn run_call<F: FnOnce() -> R, R>(parameter: *mut c_void) {
    // SAFETY: the caller's contract: `parameter` is our `Call<F, R>`.
    let call = unsafe { &mut *parameter.cast::<Call<F, R>>() };
    if let Call::Pending(work) = core::mem::replace(call, Call::Running) {
        *call = Call::Done(work());
    }
}
