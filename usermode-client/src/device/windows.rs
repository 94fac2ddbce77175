//! The Windows transport: a handle to `\\.\KStack` and
//! `NtDeviceIoControlFile`, which returns the driver's own NTSTATUS (the
//! Win32 `DeviceIoControl` folds several of kstack's statuses into one error).

use std::{ffi::OsStr, os::windows::ffi::OsStrExt, ptr};

use kstack_abi::USER_DEVICE_PATH;
use windows_sys::Win32::{
    Foundation::{
        CloseHandle, GENERIC_READ, GENERIC_WRITE, GetLastError, HANDLE, INVALID_HANDLE_VALUE,
    },
    Storage::FileSystem::{CreateFileW, FILE_ATTRIBUTE_NORMAL, OPEN_EXISTING},
    System::IO::IO_STATUS_BLOCK,
};

use crate::{
    device::transport::{Reply, Transport},
    error::ClientError,
};

/// An open handle to the kstack device.
pub struct Device {
    handle: HANDLE,
}

impl Device {
    /// Opens the device for reading and writing.
    ///
    /// # Errors
    /// [`ClientError::Open`] with the Win32 error.
    pub fn open() -> Result<Self, ClientError> {
        let path: Vec<u16> = OsStr::new(USER_DEVICE_PATH)
            .encode_wide()
            .chain([0])
            .collect();
        // SAFETY: `path` is NUL-terminated and outlives the call; no security
        // attributes or template handle are passed.
        let handle = unsafe {
            CreateFileW(
                path.as_ptr(),
                GENERIC_READ | GENERIC_WRITE,
                0,
                ptr::null(),
                OPEN_EXISTING,
                FILE_ATTRIBUTE_NORMAL,
                ptr::null_mut(),
            )
        };
        if handle == INVALID_HANDLE_VALUE {
            // SAFETY: reads this thread's last-error value; no preconditions.
            let code = unsafe { GetLastError() };
            return Err(ClientError::Open { code });
        }
        Ok(Self { handle })
    }
}

impl Transport for Device {
    fn control(&mut self, code: u32, input: &[u8], output: &mut [u8]) -> Reply {
        let mut io_status = IO_STATUS_BLOCK::default();
        let input_length = u32::try_from(input.len()).unwrap_or(u32::MAX);
        let output_length = u32::try_from(output.len()).unwrap_or(u32::MAX);
        // SAFETY: the handle is open and synchronous (so the call returns the
        // final status); both buffers are valid for the lengths given and
        // outlive the call.
        let status = unsafe {
            windows_sys::Wdk::System::IO::NtDeviceIoControlFile(
                self.handle,
                ptr::null_mut(),
                None,
                ptr::null(),
                &raw mut io_status,
                code,
                input.as_ptr().cast(),
                input_length,
                output.as_mut_ptr().cast(),
                output_length,
            )
        };
        Reply {
            status,
            information: io_status.Information.min(output.len()),
        }
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: the handle came from CreateFileW and is closed once.
        unsafe { CloseHandle(self.handle) };
    }
}
