//! kstack.sys: a WDM driver that captures kernel stack traces.
//!
//! Layout: [`kernel`] is the only module that touches WDK struct fields;
//! [`device`] owns the device and link; [`dispatch`] serves the IRPs, using
//! kstack-abi for every length, code and layout; [`registry`] reads values
//! at load. `DriverEntry` and `DriverUnload` below are the single setup and
//! cleanup path.

#![no_std]

#[cfg(not(test))]
extern crate wdk_panic;

mod device;
mod dispatch;
mod kernel;
mod registry;

use core::sync::atomic::{AtomicU64, Ordering};

use kstack_abi::{PagingExecutive, ascii_to_utf16};
use wdk_sys::{
    DRIVER_OBJECT, IRP_MJ_CLOSE, IRP_MJ_CREATE, IRP_MJ_DEVICE_CONTROL, NTSTATUS, PCUNICODE_STRING,
    STATUS_SUCCESS,
};
// kstack's own code does not allocate (all memory is set up at load); this
// makes any `alloc` use by a dependency come from tagged non-paged pool.
#[cfg(not(test))]
#[global_allocator]
static GLOBAL_ALLOCATOR: wdk_alloc::WdkAllocator = wdk_alloc::WdkAllocator;

const MEMORY_MANAGEMENT_KEY: &str =
    r"\Registry\Machine\SYSTEM\CurrentControlSet\Control\Session Manager\Memory Management";
static MEMORY_MANAGEMENT_KEY_UTF16: [u16; MEMORY_MANAGEMENT_KEY.len()] =
    ascii_to_utf16(MEMORY_MANAGEMENT_KEY);
const DISABLE_PAGING_EXECUTIVE: &str = "DisablePagingExecutive";
static DISABLE_PAGING_EXECUTIVE_UTF16: [u16; DISABLE_PAGING_EXECUTIVE.len()] =
    ascii_to_utf16(DISABLE_PAGING_EXECUTIVE);

/// `DisablePagingExecutive` as read at load: bit 32 set when the value
/// exists, the value in the low 32 bits. Written once in `DriverEntry`
/// before the device exists, read by dispatch afterwards.
static PAGING_EXECUTIVE: AtomicU64 = AtomicU64::new(0);

/// `DisablePagingExecutive` as read at load.
///
/// Max IRQL: any.
fn paging_executive() -> PagingExecutive {
    let word = PAGING_EXECUTIVE.load(Ordering::Relaxed);
    match u32::try_from(word >> 32) {
        Ok(0) => PagingExecutive::NotSet,
        _ => PagingExecutive::Value(u32::try_from(word & u64::from(u32::MAX)).unwrap_or_default()),
    }
}

/// Reads `DisablePagingExecutive`; a missing value, a non-DWORD or an
/// unreadable key all mean paging is allowed, the safe assumption.
///
/// Max IRQL: `PASSIVE_LEVEL`.
fn read_paging_executive() -> PagingExecutive {
    let key = kernel::unicode_string(&MEMORY_MANAGEMENT_KEY_UTF16);
    match registry::read_dword(&key, &DISABLE_PAGING_EXECUTIVE_UTF16) {
        Ok(registry::Dword::Value(value)) => PagingExecutive::Value(value),
        Ok(registry::Dword::Absent | registry::Dword::WrongType) | Err(_) => {
            PagingExecutive::NotSet
        }
    }
}

/// The driver's entry point.
///
/// # Safety
/// Called once by the kernel with its driver object.
///
/// Max IRQL: `PASSIVE_LEVEL`.
#[unsafe(export_name = "DriverEntry")]
pub unsafe extern "system" fn driver_entry(
    driver: *mut DRIVER_OBJECT,
    _registry_path: PCUNICODE_STRING,
) -> NTSTATUS {
    let paging = match read_paging_executive() {
        PagingExecutive::NotSet => 0,
        PagingExecutive::Value(value) => 1 << 32 | u64::from(value),
    };
    PAGING_EXECUTIVE.store(paging, Ordering::Relaxed);

    // SAFETY: `driver` is the kernel's driver object for this load.
    if let Err(status) = unsafe { device::create(driver) } {
        return status;
    }
    // SAFETY: the driver object is ours to fill in during DriverEntry.
    let driver = unsafe { &mut *driver };
    for major in [IRP_MJ_CREATE, IRP_MJ_CLOSE, IRP_MJ_DEVICE_CONTROL] {
        driver.MajorFunction[major as usize] = Some(dispatch::dispatch);
    }
    driver.DriverUnload = Some(driver_unload);
    STATUS_SUCCESS
}

/// The single cleanup path.
///
/// # Safety
/// Called once by the kernel when the service stops.
///
/// Max IRQL: `PASSIVE_LEVEL`.
unsafe extern "C" fn driver_unload(driver: *mut DRIVER_OBJECT) {
    // SAFETY: the driver created exactly one device, still listed here.
    let device = unsafe { (*driver).DeviceObject };
    if !device.is_null() {
        // SAFETY: `device` came from `device::create` and is deleted once.
        unsafe { device::delete(device) };
    }
}
