//! IRP dispatch: create, close and device control. Lengths and contents are
//! checked with kstack-abi before anything is used.

use core::slice;

use kstack_abi::{
    CaptureConfig, Ioctl, RequestError, Source, SourceStatus, StatusResponse,
    ntstatus::{NtStatus, STATUS_BUFFER_OVERFLOW, STATUS_SUCCESS},
};
use wdk_sys::{DEVICE_OBJECT, IRP, NTSTATUS, STATUS_INVALID_PARAMETER, STATUS_NOT_IMPLEMENTED};

use crate::{
    kernel::{self, DeviceControl},
    paging_executive,
};

/// The dispatch routine for every major function the driver handles.
///
/// # Safety
/// Called by the I/O manager with a valid IRP for this driver's device.
///
/// Max IRQL: `PASSIVE_LEVEL` (create, close and device control arrive there).
pub unsafe extern "C" fn dispatch(_device: *mut DEVICE_OBJECT, irp: *mut IRP) -> NTSTATUS {
    // SAFETY: the I/O manager passes a valid, current IRP.
    let (_major, control) = unsafe { kernel::current_request(irp) };
    let (status, information) = match control {
        // Create and close: nothing to set up or tear down per handle.
        None => (STATUS_SUCCESS, 0),
        Some(request) => device_control(&request),
    };
    // SAFETY: the IRP is this driver's and has not been completed.
    unsafe { kernel::complete_request(irp, status, information) }
}

/// Handles one device-control request; returns its status and the bytes
/// written to the output buffer.
///
/// Max IRQL: `PASSIVE_LEVEL`.
fn device_control(request: &DeviceControl) -> (NtStatus, usize) {
    let Some(ioctl) = Ioctl::from_code(request.code) else {
        return (
            RequestError::UnknownCode { code: request.code }.ntstatus(),
            0,
        );
    };
    if let Err(error) = ioctl.check_lengths(request.input_length, request.output_length) {
        return (error.ntstatus(), 0);
    }
    if request.system_buffer.is_null() && (request.input_length != 0 || request.output_length != 0)
    {
        return (STATUS_INVALID_PARAMETER, 0);
    }
    match ioctl {
        Ioctl::Status => {
            // SAFETY: METHOD_BUFFERED: the system buffer holds at least
            // `output_length` bytes, owned by this request until completion.
            let output =
                unsafe { slice::from_raw_parts_mut(request.system_buffer, request.output_length) };
            let (written, complete) = status().encode(output);
            (
                if complete {
                    STATUS_SUCCESS
                } else {
                    STATUS_BUFFER_OVERFLOW
                },
                written,
            )
        }
        // Capture, the ring and the sources arrive with the driver core.
        Ioctl::Configure | Ioctl::Read | Ioctl::Clear | Ioctl::CaptureNow => {
            (STATUS_NOT_IMPLEMENTED, 0)
        }
    }
}

/// The driver's status as of now.
///
/// Max IRQL: `PASSIVE_LEVEL`.
fn status() -> StatusResponse {
    let unregistered = SourceStatus {
        registration: STATUS_NOT_IMPLEMENTED,
        available: false,
        captured: 0,
        skipped_irql: 0,
    };
    StatusResponse {
        driver_version: StatusResponse::this_version(),
        paging_executive: paging_executive(),
        ring_ready: false,
        ring_capacity: 0,
        ring_used: 0,
        outstanding_allocations: 0,
        config: CaptureConfig::default(),
        dropped: 0,
        cleared: 0,
        next_sequence: 0,
        sources: [unregistered; Source::COUNT],
    }
}
