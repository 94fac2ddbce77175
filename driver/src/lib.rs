#![no_std]
//! probe
extern crate wdk_panic;
use wdk_alloc::WdkAllocator;
#[global_allocator]
static GLOBAL_ALLOCATOR: WdkAllocator = WdkAllocator;
use wdk_sys::{DRIVER_OBJECT, NTSTATUS, PCUNICODE_STRING, STATUS_SUCCESS};
/// entry
#[unsafe(export_name = "DriverEntry")]
pub unsafe extern "system" fn driver_entry(_d: &mut DRIVER_OBJECT, _r: PCUNICODE_STRING) -> NTSTATUS {
    let mut frames = [core::ptr::null_mut(); 8];
    // SAFETY: probe
    let n = unsafe { wdk_sys::ntddk::RtlCaptureStackBackTrace(0, 8, frames.as_mut_ptr(), core::ptr::null_mut()) };
    if n == 0 { return 1; }
    STATUS_SUCCESS
}
