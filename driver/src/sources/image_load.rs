//! Image loads (`PsSetLoadImageNotifyRoutine`): a module record for every
//! load, then the source's own capture when it is enabled.

use kstack_abi::SourceFacts;
use kstack_driver_core::ModuleFacts;
use wdk_sys::{
    HANDLE, NTSTATUS, PIMAGE_INFO, PUNICODE_STRING,
    ntddk::{PsRemoveLoadImageNotifyRoutine, PsSetLoadImageNotifyRoutine},
};

use crate::{
    kernel::{handle_to_id, process_key_by_id},
    recorder,
    unicode::NameTail,
};

/// The callback. `process_id` is 0 for a driver (kernel-mode image).
///
/// Max IRQL: `PASSIVE_LEVEL` (load-image notify routines run there).
// Never inlined: the kernel calls it through a pointer, and the test-only
// injection calls it directly; either way it is a frame of its own, so each
// source's stacks differ.
#[inline(never)]
pub(crate) unsafe extern "C" fn on_image(
    name: PUNICODE_STRING,
    process_id: HANDLE,
    info: PIMAGE_INFO,
) {
    // SAFETY: the kernel passes a valid IMAGE_INFO for the call's duration.
    let Some(info) = (unsafe { info.as_ref() }) else {
        return;
    };
    let (base, size) = (info.ImageBase as u64, info.ImageSize);
    // An image is far below 4 GiB; the record's field is a u32.
    let image = (base, u32::try_from(size).unwrap_or(u32::MAX));
    // SAFETY: the kernel passes null or a valid name for the call.
    unsafe { record_module(name, process_id, image) };
    let facts = SourceFacts::ImageLoad {
        image_base: base,
        image_size: size,
        process_id: handle_to_id(process_id),
    };
    recorder::record(|| Some(facts));
}

/// The load's module record. Never inlined: the copy of the name (over
/// 512 bytes) lives in this frame, gone before the capture's walk starts,
/// so the capture path's stack stays as `docs/kernel-stack.md` measures it.
///
/// # Safety
/// `name` is null or a valid `UNICODE_STRING` for the call.
///
/// Max IRQL: `PASSIVE_LEVEL`.
#[inline(never)]
unsafe fn record_module(name: PUNICODE_STRING, process_id: HANDLE, image: (u64, u32)) {
    // SAFETY: null or valid for the call (the caller).
    let path = unsafe { NameTail::copy(name) };
    recorder::record_module(|routines| {
        let key = process_key_by_id(routines, process_id);
        let id = handle_to_id(process_id);
        ModuleFacts::image_load(id, key, image, path.units(), path.truncated())
    });
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
