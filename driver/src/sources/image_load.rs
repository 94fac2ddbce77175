//! Image loads (`PsSetLoadImageNotifyRoutine`).

use kstack_abi::SourceFacts;
use wdk_sys::{
    HANDLE, NTSTATUS, PIMAGE_INFO, PUNICODE_STRING,
    ntddk::{PsRemoveLoadImageNotifyRoutine, PsSetLoadImageNotifyRoutine},
};

use crate::{kernel::handle_to_id, recorder};

/// The callback. `process_id` is 0 for a driver (kernel-mode image).
///
/// Max IRQL: `PASSIVE_LEVEL` (load-image notify routines run there).
// Never inlined: the kernel calls it through a pointer, and the test-only
// injection calls it directly; either way it is a frame of its own, so each
// source's stacks differ.
#[inline(never)]
pub(crate) unsafe extern "C" fn on_image(
    _name: PUNICODE_STRING,
    process_id: HANDLE,
    info: PIMAGE_INFO,
) {
    // SAFETY: the kernel passes a valid IMAGE_INFO for the call's duration.
    let Some(info) = (unsafe { info.as_ref() }) else {
        return;
    };
    let facts = SourceFacts::ImageLoad {
        image_base: info.ImageBase as u64,
        image_size: info.ImageSize,
        process_id: handle_to_id(process_id),
    };
    recorder::record(|| Some(facts));
}

/// Max IRQL: `PASSIVE_LEVEL`.
pub fn register() -> NTSTATUS {
    // SAFETY: registers a routine that lives as long as the driver image.
    unsafe { PsSetLoadImageNotifyRoutine(Some(on_image)) }
}

/// Max IRQL: `PASSIVE_LEVEL`.
pub fn unregister() {
    // SAFETY: removes the routine registered by `register`.
    let _ = unsafe { PsRemoveLoadImageNotifyRoutine(Some(on_image)) };
}
