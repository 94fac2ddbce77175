//! IRP dispatch: create, close and device control. kstack-driver-core admits
//! the request (code and lengths) before anything is read, then serves it.

use core::slice;

use kstack_abi::{ioctl::MAX_INPUT_LENGTH, ntstatus::NtStatus};
use kstack_driver_core::{Caller, DriverCore};
use wdk_sys::{
    DEVICE_OBJECT, IRP, IRP_MJ_CLOSE, NTSTATUS, STATUS_DEVICE_NOT_READY, STATUS_INVALID_PARAMETER,
    STATUS_SUCCESS,
};

use crate::{
    kernel::{self, DeviceControl},
    loaded, pool,
};

/// The dispatch routine for every major function the driver handles.
///
/// # Safety
/// Called by the I/O manager with a valid IRP for this driver's device.
///
/// Max IRQL: `PASSIVE_LEVEL` (create, close and device control arrive there).
pub unsafe extern "C" fn dispatch(_device: *mut DEVICE_OBJECT, irp: *mut IRP) -> NTSTATUS {
    // SAFETY: the I/O manager passes a valid, current IRP.
    let (major, file_object, control) = unsafe { kernel::current_request(irp) };
    let (status, information) = match control {
        // Create and close: the device's DACL already admitted the caller.
        None => {
            if u32::from(major) == IRP_MJ_CLOSE {
                // Its address may come back as another reader's.
                loaded::with_loaded(|driver| driver.recorder.core.reader_closed(file_object));
            }
            (STATUS_SUCCESS, 0)
        }
        Some(request) => device_control(&request, file_object),
    };
    // SAFETY: the IRP is this driver's and has not been completed.
    unsafe { kernel::complete_request(irp, status, information) }
}

/// Serves one device-control request; returns its status and the bytes
/// written to the output buffer.
///
/// Max IRQL: `PASSIVE_LEVEL`.
fn device_control(request: &DeviceControl, reader: u64) -> (NtStatus, usize) {
    #[cfg(feature = "test-injection")]
    if let Some(reply) = crate::injection::serve(request) {
        return reply;
    }
    let ioctl = match DriverCore::admit(request.code, request.input_length, request.output_length) {
        Ok(ioctl) => ioctl,
        Err(status) => return (status, 0),
    };
    let has_buffers = request.input_length != 0 || request.output_length != 0;
    if request.system_buffer.is_null() && has_buffers {
        return (STATUS_INVALID_PARAMETER, 0);
    }
    // METHOD_BUFFERED: input and output share the system buffer, so the
    // input (at most MAX_INPUT_LENGTH bytes, as admitted) is copied first.
    let mut input = [0_u8; MAX_INPUT_LENGTH];
    let input = &mut input[..request.input_length];
    let output: &mut [u8] = if has_buffers {
        // SAFETY: the system buffer holds max(input, output) bytes and is
        // this request's until completion.
        let buffer = unsafe {
            slice::from_raw_parts_mut(
                request.system_buffer,
                request.input_length.max(request.output_length),
            )
        };
        input.copy_from_slice(&buffer[..request.input_length]);
        &mut buffer[..request.output_length]
    } else {
        &mut []
    };
    loaded::with_loaded(|driver| {
        driver.recorder.core.serve(
            ioctl,
            input,
            output,
            &driver.recorder.platform(),
            driver,
            Caller {
                reader,
                pool_allocations: pool::outstanding(),
            },
        )
    })
    .unwrap_or((STATUS_DEVICE_NOT_READY, 0))
}
