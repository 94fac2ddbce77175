//! Process create and exit (`PsSetCreateProcessNotifyRoutineEx`): the
//! source's capture when it is enabled, then for an exit a module record
//! (after the capture, so the exit's own record is named with the
//! process's modules).
//!
//! The kernel requires the image to carry the force-integrity flag for this
//! routine (it returns `STATUS_ACCESS_DENIED` otherwise); wdk-build links
//! with /INTEGRITYCHECK and `tests/tests/driver_image.rs` checks it.

use kstack_abi::{SourceFacts, source_facts::Lifecycle};
use kstack_driver_core::ModuleFacts;
use wdk_sys::{
    HANDLE, NTSTATUS, PEPROCESS, PPS_CREATE_NOTIFY_INFO, ntddk::PsSetCreateProcessNotifyRoutineEx,
};

use crate::{
    kernel::{handle_to_id, process_key},
    recorder,
};

/// The callback.
///
/// Max IRQL: `PASSIVE_LEVEL` (process notify routines run there).
// Never inlined: the kernel calls it through a pointer, and the test-only
// injection calls it directly; either way it is a frame of its own, so each
// source's stacks differ.
#[inline(never)]
pub(crate) unsafe extern "C" fn on_process(
    process: PEPROCESS,
    process_id: HANDLE,
    create_info: PPS_CREATE_NOTIFY_INFO,
) {
    // SAFETY: the kernel passes null on exit and a valid structure on create.
    let create = unsafe { create_info.as_ref() };
    let facts = SourceFacts::Process {
        event: if create.is_some() {
            Lifecycle::Create
        } else {
            Lifecycle::Exit
        },
        process_id: handle_to_id(process_id),
        parent_process_id: create.map_or(0, |info| handle_to_id(info.ParentProcessId)),
    };
    recorder::record(|| Some(facts));
    if create.is_none() {
        let id = handle_to_id(process_id);
        recorder::record_module(|routines| {
            ModuleFacts::process_exit(id, process_key(routines, process))
        });
    }
}

/// Max IRQL: `PASSIVE_LEVEL`.
pub fn register() -> NTSTATUS {
    // SAFETY: registers a routine that lives as long as the driver image.
    unsafe { PsSetCreateProcessNotifyRoutineEx(Some(on_process), 0) }
}

/// Max IRQL: `PASSIVE_LEVEL`.
pub fn unregister() {
    // SAFETY: removes the routine registered by `register`.
    let _ = unsafe { PsSetCreateProcessNotifyRoutineEx(Some(on_process), 1) };
}
