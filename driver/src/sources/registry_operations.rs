//! Registry operations (`CmRegisterCallbackEx`), looked up at load: a kernel
//! without it (Wine 8) reports the source unavailable.

use core::{
    cell::UnsafeCell,
    ffi::c_void,
    ptr,
    sync::atomic::{AtomicI64, Ordering},
};

use kstack_abi::{
    SourceFacts,
    altitude::{ALTITUDE_CHARS, Altitude, register_at_free_altitude},
};
use wdk_sys::{
    DRIVER_OBJECT, LARGE_INTEGER, NTSTATUS, PVOID, STATUS_NOT_SUPPORTED, STATUS_SUCCESS,
};

use crate::{recorder, routines::Routines, unicode::unicode_string_over};

/// The callback's registration, and the text of its altitude (kept in the
/// driver state while registered).
pub struct RegistryCallback {
    cookie: AtomicI64,
    altitude: UnsafeCell<[u16; ALTITUDE_CHARS]>,
}

/// The callback. `argument1` is the operation's `REG_NOTIFY_CLASS`.
///
/// Max IRQL: `PASSIVE_LEVEL` (registry callbacks run there).
// Never inlined: the kernel calls it through a pointer, and the test-only
// injection calls it directly; either way it is a frame of its own, so each
// source's stacks differ.
#[inline(never)]
pub(crate) unsafe extern "C" fn on_registry(
    _context: PVOID,
    argument1: PVOID,
    _argument2: PVOID,
) -> NTSTATUS {
    let notify_class = u32::try_from(argument1 as usize).unwrap_or(u32::MAX);
    recorder::record(|| Some(SourceFacts::Registry { notify_class }));
    // kstack only observes: every operation proceeds.
    STATUS_SUCCESS
}

impl RegistryCallback {
    pub const fn new() -> Self {
        Self {
            cookie: AtomicI64::new(0),
            altitude: UnsafeCell::new([0; ALTITUDE_CHARS]),
        }
    }

    /// Registers, if the kernel has both routines, at the first free
    /// altitude from `base` (`kstack_abi::altitude`); returns the status
    /// and the altitude in use.
    ///
    /// Max IRQL: `PASSIVE_LEVEL`.
    pub fn register(
        &self,
        routines: &Routines,
        driver: *mut DRIVER_OBJECT,
        base: u32,
    ) -> (NTSTATUS, Altitude) {
        let (Some(register), Some(_)) = (
            routines.register_registry_callback,
            routines.unregister_registry_callback,
        ) else {
            return (STATUS_NOT_SUPPORTED, Altitude::default());
        };
        register_at_free_altitude(base, |altitude| {
            // SAFETY: only DriverEntry registers, once, before any reader.
            let text = unsafe { &mut *self.altitude.get() };
            let length = altitude.to_utf16(text);
            // Registry callbacks are ordered by altitude; kstack observes only.
            let altitude = unicode_string_over(&text[..length]);
            let mut cookie = LARGE_INTEGER::default();
            // SAFETY: the routine is CmRegisterCallbackEx; the callback lives
            // as long as the image, the altitude's text as long as the
            // driver state, and `cookie` outlives the call.
            let status = unsafe {
                register(
                    Some(on_registry),
                    &raw const altitude,
                    driver.cast::<c_void>(),
                    ptr::null_mut(),
                    &raw mut cookie,
                    ptr::null_mut(),
                )
            };
            if status >= 0 {
                // SAFETY: QuadPart is the whole value of the union.
                self.cookie
                    .store(unsafe { cookie.QuadPart }, Ordering::Relaxed);
            }
            status
        })
    }

    /// Max IRQL: `PASSIVE_LEVEL`.
    pub fn unregister(&self, routines: &Routines) {
        if let Some(unregister) = routines.unregister_registry_callback {
            let cookie = LARGE_INTEGER {
                QuadPart: self.cookie.load(Ordering::Relaxed),
            };
            // SAFETY: the cookie came from a successful registration.
            let _ = unsafe { unregister(cookie) };
        }
    }
}
