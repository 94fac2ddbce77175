//! Thread create and exit (`PsSetCreateThreadNotifyRoutine`).

use kstack_abi::{SourceFacts, source_facts::Lifecycle};
use wdk_sys::{
    BOOLEAN, HANDLE, NTSTATUS,
    ntddk::{PsRemoveCreateThreadNotifyRoutine, PsSetCreateThreadNotifyRoutine},
};

use crate::{kernel::handle_to_id, recorder};

/// The callback.
///
/// Max IRQL: `APC_LEVEL` (thread notify routines run at PASSIVE or APC).
// Never inlined: the kernel calls it through a pointer, and the test-only
// injection calls it directly; either way it is a frame of its own, so each
// source's stacks differ.
#[inline(never)]
pub(crate) unsafe extern "C" fn on_thread(process_id: HANDLE, thread_id: HANDLE, create: BOOLEAN) {
    let facts = SourceFacts::Thread {
        event: if create == 0 {
            Lifecycle::Exit
        } else {
            Lifecycle::Create
        },
        process_id: handle_to_id(process_id),
        thread_id: handle_to_id(thread_id),
    };
    recorder::record(|| Some(facts));
}

/// Max IRQL: `PASSIVE_LEVEL`.
pub fn register() -> NTSTATUS {
    // SAFETY: registers a routine that lives as long as the driver image.
    unsafe { PsSetCreateThreadNotifyRoutine(Some(on_thread)) }
}

/// Max IRQL: `PASSIVE_LEVEL`.
pub fn unregister() {
    // SAFETY: removes the routine registered by `register`.
    let _ = unsafe { PsRemoveCreateThreadNotifyRoutine(Some(on_thread)) };
}
