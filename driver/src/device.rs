//! The control device `\Device\KStack` and its user-mode link
//! `\DosDevices\KStack`.

use core::ptr;

use kstack_abi::{DEVICE_NAME_UTF16, DOS_DEVICE_NAME_UTF16, ioctl::DEVICE_TYPE};
use wdk_sys::{
    ACL, ACL_REVISION, DACL_SECURITY_INFORMATION, DEVICE_OBJECT, DO_BUFFERED_IO,
    DO_DEVICE_INITIALIZING, DRIVER_OBJECT, FILE_ALL_ACCESS, FILE_DEVICE_SECURE_OPEN, HANDLE,
    NTSTATUS, OBJ_KERNEL_HANDLE, SECURITY_DESCRIPTOR, SECURITY_DESCRIPTOR_REVISION, WRITE_DAC,
    ntddk::{
        IoCreateDevice, IoCreateSymbolicLink, IoDeleteDevice, IoDeleteSymbolicLink,
        ObOpenObjectByPointer, RtlAddAccessAllowedAce, RtlCreateAcl, RtlCreateSecurityDescriptor,
        RtlSetDaclSecurityDescriptor, ZwClose, ZwSetSecurityObject,
    },
};

use crate::{kernel::KERNEL_MODE, unicode::unicode_string};

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
    if let Err(status) = admit_only_system_and_administrators(device) {
        // SAFETY: as `delete`, for the device and link made above.
        unsafe { delete(device) };
        return Err(status);
    }
    // SAFETY: the device is new; nothing else uses it while
    // DO_DEVICE_INITIALIZING is set.
    let device_fields = unsafe { &mut *device };
    device_fields.Flags = (device_fields.Flags | DO_BUFFERED_IO) & !DO_DEVICE_INITIALIZING;
    Ok(device)
}

/// SIDs as bytes (revision, count, authority, sub-authorities): built here
/// rather than taken from `SeExports`, which Wine 8 does not fill in.
/// S-1-5-18, the `LocalSystem` account.
const LOCAL_SYSTEM_SID: [u8; 12] = [1, 1, 0, 0, 0, 0, 0, 5, 18, 0, 0, 0];
/// S-1-5-32-544, BUILTIN\Administrators.
const ADMINISTRATORS_SID: [u8; 16] = [1, 2, 0, 0, 0, 0, 0, 5, 32, 0, 0, 0, 0x20, 2, 0, 0];

/// Replaces the device's DACL with one granting `FILE_ALL_ACCESS` to
/// SYSTEM and Administrators only, so nobody else can open `\\.\KStack`
/// (`IoCreateDeviceSecure` does the same from SDDL, but lives in the WDK's
/// static wdmsec.lib, which the Linux build lacks).
///
/// Max IRQL: `PASSIVE_LEVEL`.
fn admit_only_system_and_administrators(device: *mut DEVICE_OBJECT) -> Result<(), NTSTATUS> {
    // An ACL header (8) and two ACCESS_ALLOWED_ACEs (8 + SID each).
    const ACL_BYTES: usize = 8 + (8 + LOCAL_SYSTEM_SID.len()) + (8 + ADMINISTRATORS_SID.len());
    let mut acl = [0_u64; ACL_BYTES.div_ceil(8)];
    let acl = acl.as_mut_ptr().cast::<ACL>();
    let mut descriptor = SECURITY_DESCRIPTOR::default();
    let check = |status: NTSTATUS| if status < 0 { Err(status) } else { Ok(()) };
    // SAFETY: `acl` is ACL_BYTES long and 8-aligned.
    check(unsafe { RtlCreateAcl(acl, u32::try_from(ACL_BYTES).unwrap_or(0), ACL_REVISION) })?;
    for sid in [LOCAL_SYSTEM_SID.as_slice(), ADMINISTRATORS_SID.as_slice()] {
        // SAFETY: the ACL has room for both ACEs; the SID bytes are valid
        // SIDs and the call only reads them.
        check(unsafe {
            RtlAddAccessAllowedAce(
                acl,
                ACL_REVISION,
                FILE_ALL_ACCESS,
                sid.as_ptr().cast_mut().cast(),
            )
        })?;
    }
    // SAFETY: `descriptor` is a local absolute security descriptor.
    check(unsafe {
        RtlCreateSecurityDescriptor((&raw mut descriptor).cast(), SECURITY_DESCRIPTOR_REVISION)
    })?;
    // SAFETY: the descriptor and ACL are valid and outlive their use below.
    check(unsafe { RtlSetDaclSecurityDescriptor((&raw mut descriptor).cast(), 1, acl, 0) })?;
    let mut handle: HANDLE = ptr::null_mut();
    // SAFETY: `device` is a live device object; the handle is closed below.
    check(unsafe {
        ObOpenObjectByPointer(
            device.cast(),
            OBJ_KERNEL_HANDLE,
            ptr::null_mut(),
            WRITE_DAC,
            ptr::null_mut(),
            KERNEL_MODE,
            &raw mut handle,
        )
    })?;
    // SAFETY: a kernel handle with WRITE_DAC and a valid descriptor.
    let status = unsafe {
        ZwSetSecurityObject(
            handle,
            DACL_SECURITY_INFORMATION,
            (&raw mut descriptor).cast(),
        )
    };
    // SAFETY: the handle was opened above and is closed once.
    let _ = unsafe { ZwClose(handle) };
    check(status)
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
