//! The control device `\Device\KStack` and its user-mode link
//! `\DosDevices\KStack`.

use core::ptr;

use kstack_abi::{DEVICE_NAME_UTF16, DOS_DEVICE_NAME_UTF16, ioctl::DEVICE_TYPE};
use wdk_sys::{
    DEVICE_OBJECT, DO_BUFFERED_IO, DO_DEVICE_INITIALIZING, DRIVER_OBJECT, FILE_DEVICE_SECURE_OPEN,
    NTSTATUS,
    ntddk::{IoCreateDevice, IoCreateSymbolicLink, IoDeleteDevice, IoDeleteSymbolicLink},
};

use crate::kernel::unicode_string;

/// Creates the device and its link. On failure nothing is left behind.
///
/// # Safety
/// `driver` is the driver object passed to `DriverEntry`.
///
/// Max IRQL: `PASSIVE_LEVEL`.
pub unsafe fn create(driver: *mut DRIVER_OBJECT) -> Result<*mut DEVICE_OBJECT, NTSTATUS> {
    let mut device_name = unicode_string(&DEVICE_NAME_UTF16);
    let mut device: *mut DEVICE_OBJECT = ptr::null_mut();
    // SAFETY: `driver` is valid (caller); the name and out pointer are live
    // locals. FILE_DEVICE_SECURE_OPEN applies the device's security to opens
    // of any path below it too.
    let status = unsafe {
        IoCreateDevice(
            driver,
            0,
            &raw mut device_name,
            DEVICE_TYPE,
            FILE_DEVICE_SECURE_OPEN,
            0,
            &raw mut device,
        )
    };
    if status < 0 {
        return Err(status);
    }
    let mut link_name = unicode_string(&DOS_DEVICE_NAME_UTF16);
    // SAFETY: both names are valid UNICODE_STRINGs over static buffers.
    let status = unsafe { IoCreateSymbolicLink(&raw mut link_name, &raw mut device_name) };
    if status < 0 {
        // SAFETY: the device was created above and nothing else refers to it.
        unsafe { IoDeleteDevice(device) };
        return Err(status);
    }
    // SAFETY: the device is new; nothing else uses it while
    // DO_DEVICE_INITIALIZING is set.
    let device_fields = unsafe { &mut *device };
    device_fields.Flags = (device_fields.Flags | DO_BUFFERED_IO) & !DO_DEVICE_INITIALIZING;
    Ok(device)
}

/// Deletes the link and the device made by [`create`].
///
/// # Safety
/// `device` came from [`create`] and is deleted once.
///
/// Max IRQL: `PASSIVE_LEVEL`.
pub unsafe fn delete(device: *mut DEVICE_OBJECT) {
    let mut link_name = unicode_string(&DOS_DEVICE_NAME_UTF16);
    // SAFETY: the link was created by `create`.
    let _ = unsafe { IoDeleteSymbolicLink(&raw mut link_name) };
    // SAFETY: the caller passes the device from `create`, deleted once.
    unsafe { IoDeleteDevice(device) };
}
