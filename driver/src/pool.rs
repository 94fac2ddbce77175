//! Non-paged pool: the one place kstack allocates, the pool tags, and the
//! count of what is outstanding (status reports it; it is zero once unload
//! has freed everything). Every allocation happens in `DriverEntry`.

use core::{
    ffi::c_void,
    ptr::NonNull,
    sync::atomic::{AtomicU32, Ordering},
};

use wdk_sys::{
    _POOL_TYPE::NonPagedPoolNx, POOL_FLAG_NON_PAGED, POOL_TYPE, ntddk::ExFreePoolWithTag,
};

use crate::routines::Routines;

/// The record ring's slots.
pub const TAG_RING: u32 = u32::from_le_bytes(*b"KsRg");
/// The per-load driver state.
pub const TAG_STATE: u32 = u32::from_le_bytes(*b"KsSt");
/// The thread-capture slots and their `KAPC`s.
pub const TAG_APCS: u32 = u32::from_le_bytes(*b"KsAp");
/// The user walks' re-entry guard.
pub const TAG_GUARD: u32 = u32::from_le_bytes(*b"KsUw");

static OUTSTANDING: AtomicU32 = AtomicU32::new(0);

unsafe extern "system" {
    /// Exported by every Windows release and by Wine; wdk-sys leaves it out
    /// as deprecated in favour of `ExAllocatePool2`, which older kernels lack.
    fn ExAllocatePoolWithTag(pool_type: POOL_TYPE, bytes: usize, tag: u32) -> *mut c_void;
}

/// Allocates `bytes` of non-executable non-paged pool: through
/// `ExAllocatePool2` where the kernel exports it, else
/// `ExAllocatePoolWithTag(NonPagedPoolNx)`. The memory is not zeroed.
///
/// Max IRQL: `DISPATCH_LEVEL` (kstack calls it only in `DriverEntry`).
pub fn allocate(routines: &Routines, bytes: usize, tag: u32) -> Option<NonNull<u8>> {
    let memory = match routines.allocate_pool2 {
        // SAFETY: ExAllocatePool2 with a valid flag set and size.
        Some(allocate_pool2) => unsafe { allocate_pool2(POOL_FLAG_NON_PAGED, bytes, tag) },
        // SAFETY: a valid pool type and size.
        None => unsafe { ExAllocatePoolWithTag(NonPagedPoolNx, bytes, tag) },
    };
    let memory = NonNull::new(memory.cast::<u8>())?;
    OUTSTANDING.fetch_add(1, Ordering::Relaxed);
    Some(memory)
}

/// A `T` made in place in zeroed pool (for tables larger than a kernel
/// stack, which must never be built on one), freed with [`free`] and `tag`.
///
/// # Safety
/// All-zero bytes are a valid `T`, and `T` needs no more than the pool's
/// 16-byte alignment.
///
/// Max IRQL: `DISPATCH_LEVEL` (kstack calls it only in `DriverEntry`).
pub unsafe fn allocate_zeroed<T>(routines: &Routines, tag: u32) -> Option<NonNull<T>> {
    let memory = allocate(routines, size_of::<T>(), tag)?;
    // SAFETY: the block is `size_of::<T>()` bytes and not yet shared.
    unsafe { memory.as_ptr().write_bytes(0, size_of::<T>()) };
    Some(memory.cast())
}

/// Frees memory from [`allocate`].
///
/// # Safety
/// `memory` came from [`allocate`] with `tag`, is freed once, and nothing
/// uses it any more.
///
/// Max IRQL: `DISPATCH_LEVEL`.
pub unsafe fn free(memory: NonNull<u8>, tag: u32) {
    // SAFETY: the caller guarantees the allocation is ours and unused.
    unsafe { ExFreePoolWithTag(memory.as_ptr().cast(), tag) };
    OUTSTANDING.fetch_sub(1, Ordering::Relaxed);
}

/// Allocations not yet freed.
///
/// Max IRQL: any.
pub fn outstanding() -> u32 {
    OUTSTANDING.load(Ordering::Relaxed)
}
