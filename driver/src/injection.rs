//! Test-only event injection, compiled only with the `test-injection`
//! feature (never in the release image; `tests/tests/driver_image.rs`
//! checks its PDB).
//!
//! Wine never fires the process, thread, object and registry callbacks, so
//! the Wine tests send [`INJECT_CODE`] requests instead: each one calls the
//! source's real callback function with synthetic arguments built from the
//! request's facts, and the callback captures and records as it would for
//! a kernel event. [`FAULT_PROBE_CODE`] requests read through a pointer
//! inside the driver's exception scope ([`fault_scope`]), so a test can
//! see a fault caught. What is synthetic: the arguments, and the object of an
//! object-handle event, which is always the current process or thread (so
//! its target process id is the current process, not the request's).
//!
//! [`INJECT_CODE`]: kstack_abi::ioctl::INJECT_CODE
//! [`FAULT_PROBE_CODE`]: kstack_abi::ioctl::FAULT_PROBE_CODE

use core::{ffi::c_void, ptr};

use kstack_abi::{
    SourceFacts,
    ioctl::{FAULT_PROBE_CODE, INJECT_CODE},
    messages::{
        FAULT_PROBE_REPLY_SIZE, FAULT_PROBE_REQUEST_SIZE, FaultProbe, INJECT_REQUEST_SIZE,
        INJECTED_IMAGE_PATH, decode_fault_probe_request, decode_inject_request,
    },
    ntstatus::{
        KSTACK_STATUS_INJECTION_ONLY, NtStatus, STATUS_INVALID_BUFFER_SIZE, STATUS_NOT_SUPPORTED,
        STATUS_SUCCESS,
    },
    source_facts::{HandleOperation, Lifecycle, ObjectKind},
};
use wdk_sys::{
    HANDLE, IMAGE_INFO, OB_OPERATION_HANDLE_CREATE, OB_OPERATION_HANDLE_DUPLICATE,
    OB_PRE_OPERATION_INFORMATION, OB_PRE_OPERATION_PARAMETERS, PETHREAD, PS_CREATE_NOTIFY_INFO,
    PVOID, STATUS_DEVICE_NOT_READY, STATUS_NO_MEMORY,
    ntddk::{
        IoGetCurrentProcess, ObfDereferenceObject, PsGetCurrentThreadId, PsLookupThreadByThreadId,
    },
};

use kstack_driver_core::UserWalkFailure;

use crate::{
    fault_scope::{self, FAULTED, probe},
    kernel::{DeviceControl, ObjectType},
    recorder,
    sources::{image_load, object_handles, process, registry_operations, thread},
    unicode::{unicode_string, utf16},
};

/// The registration status of a source the kernel could not register, in
/// the injection build: its events can still be injected.
///
/// Max IRQL: `PASSIVE_LEVEL`.
pub const fn registration(kernel_status: NtStatus) -> NtStatus {
    if kernel_status == STATUS_NOT_SUPPORTED {
        KSTACK_STATUS_INJECTION_ONLY
    } else {
        kernel_status
    }
}

/// Serves the test-only requests: an injection, a fault probe; `None` for
/// any other code.
///
/// Never inlined, so the test build's PDB names it: the image tests tell
/// the release image from the test build by it.
///
/// Max IRQL: `PASSIVE_LEVEL`.
#[inline(never)]
pub fn serve(request: &DeviceControl) -> Option<(NtStatus, usize)> {
    match request.code {
        INJECT_CODE => Some(serve_injection(request)),
        FAULT_PROBE_CODE => Some(serve_fault_probe(request)),
        _ => None,
    }
}

/// Reads the probe's target inside the fault scope and answers what it
/// read, or `FAULTED`.
///
/// Max IRQL: `PASSIVE_LEVEL`.
fn serve_fault_probe(request: &DeviceControl) -> (NtStatus, usize) {
    if request.input_length != FAULT_PROBE_REQUEST_SIZE
        || request.output_length != FAULT_PROBE_REPLY_SIZE
        || request.system_buffer.is_null()
    {
        return (STATUS_INVALID_BUFFER_SIZE, 0);
    }
    let input = request.system_buffer;
    // SAFETY: the system buffer holds the input (checked above) until
    // completion; it is decoded before the reply is written over it.
    let bytes = unsafe { core::slice::from_raw_parts(input, FAULT_PROBE_REQUEST_SIZE) };
    let target = match decode_fault_probe_request(bytes) {
        Ok(target) => target,
        Err(error) => return (error.ntstatus(), 0),
    };
    let mut mapped = u64::from(FaultProbe::MAPPED_VALUE);
    let address: *mut *mut c_void = match target {
        FaultProbe::Mapped => (&raw mut mapped).cast(),
        FaultProbe::Unmapped => ptr::without_provenance_mut(8),
    };
    let read_first_word = probe::READ_FIRST_WORD;
    // The same path as the user walk's: its own stack, then the scope.
    // SAFETY: the probe reads 4 bytes at `address`, writes nothing; a fault
    // on the unmapped user address is an access violation the scope catches.
    let result = unsafe { fault_scope::guarded_walk_on_own_stack(read_first_word, address, 0, 0) };
    let reply = match result {
        Ok(value) => u64::from(value),
        Err(UserWalkFailure::Faulted) => FAULTED,
        Err(UserWalkFailure::NoStack) => return (STATUS_NO_MEMORY, 0),
    };
    // SAFETY: the system buffer has the FAULT_PROBE_REPLY_SIZE output bytes
    // (checked above) and nothing else refers to it now.
    let output =
        unsafe { core::slice::from_raw_parts_mut(request.system_buffer, FAULT_PROBE_REPLY_SIZE) };
    output.copy_from_slice(&reply.to_le_bytes());
    (STATUS_SUCCESS, FAULT_PROBE_REPLY_SIZE)
}

/// Serves one injection request: validates it, then runs the callback.
///
/// Max IRQL: `PASSIVE_LEVEL`.
fn serve_injection(request: &DeviceControl) -> (NtStatus, usize) {
    if request.input_length != INJECT_REQUEST_SIZE
        || request.output_length != 0
        || request.system_buffer.is_null()
    {
        return (STATUS_INVALID_BUFFER_SIZE, 0);
    }
    let mut input = [0_u8; INJECT_REQUEST_SIZE];
    // SAFETY: the system buffer holds the request's INJECT_REQUEST_SIZE
    // input bytes (checked above) until completion.
    let bytes = unsafe { core::slice::from_raw_parts(request.system_buffer, INJECT_REQUEST_SIZE) };
    input.copy_from_slice(bytes);
    let facts = match decode_inject_request(&input) {
        Ok(facts) => facts,
        Err(error) => return (error.ntstatus(), 0),
    };
    let status = recorder::with_recorder(|_| inject(facts));
    (status.unwrap_or(STATUS_DEVICE_NOT_READY), 0)
}

/// Calls `facts`' source callback as the kernel would.
///
/// Max IRQL: `PASSIVE_LEVEL`.
fn inject(facts: SourceFacts) -> NtStatus {
    match facts {
        SourceFacts::Process {
            event,
            process_id,
            parent_process_id,
        } => {
            let mut info = PS_CREATE_NOTIFY_INFO {
                ParentProcessId: id_handle(parent_process_id),
                ..PS_CREATE_NOTIFY_INFO::default()
            };
            let info = match event {
                Lifecycle::Create => &raw mut info,
                Lifecycle::Exit => ptr::null_mut(),
            };
            // SAFETY: any IRQL; returns the current process, not referenced.
            let current = unsafe { IoGetCurrentProcess() };
            // SAFETY: the arguments a process notify routine gets: a
            // process, its id, and creation information or null on exit.
            unsafe { process::on_process(current, id_handle(process_id), info) };
        }
        SourceFacts::Thread {
            event,
            process_id,
            thread_id,
        } => {
            let create = u8::from(event == Lifecycle::Create);
            // SAFETY: the arguments a thread notify routine gets.
            unsafe { thread::on_thread(id_handle(process_id), id_handle(thread_id), create) };
        }
        SourceFacts::ImageLoad {
            image_base,
            image_size,
            process_id,
        } => {
            let mut info = IMAGE_INFO {
                ImageBase: image_base as PVOID,
                ImageSize: image_size,
                ..IMAGE_INFO::default()
            };
            let mut name = unicode_string(utf16!(INJECTED_IMAGE_PATH));
            // SAFETY: a name and image information valid for the call, as
            // the kernel passes them.
            unsafe { image_load::on_image(&raw mut name, id_handle(process_id), &raw mut info) };
        }
        SourceFacts::Registry { notify_class } => {
            // SAFETY: a registry callback's arguments: its context (unused),
            // the notify class, and operation information (unused).
            let _ = unsafe {
                registry_operations::on_registry(
                    ptr::null_mut(),
                    notify_class as usize as PVOID,
                    ptr::null_mut(),
                )
            };
        }
        SourceFacts::ObjectHandle {
            operation,
            object,
            desired_access,
            ..
        } => return inject_handle_operation(operation, object, desired_access),
        SourceFacts::Timer | SourceFacts::OnDemand { .. } | SourceFacts::ThreadStack { .. } => {
            return STATUS_NOT_SUPPORTED;
        }
    }
    STATUS_SUCCESS
}

/// An object pre-operation on the current process or thread.
///
/// Max IRQL: `PASSIVE_LEVEL`.
fn inject_handle_operation(
    operation: HandleOperation,
    object: ObjectKind,
    desired_access: u32,
) -> NtStatus {
    let mut parameters = OB_PRE_OPERATION_PARAMETERS::default();
    parameters.CreateHandleInformation.DesiredAccess = desired_access;
    parameters.CreateHandleInformation.OriginalDesiredAccess = desired_access;
    let mut thread: PETHREAD = ptr::null_mut();
    let (object_pointer, object_type) = match object {
        // SAFETY: any IRQL; the current process, not referenced.
        ObjectKind::Process => (unsafe { IoGetCurrentProcess() }.cast(), ObjectType::Process),
        ObjectKind::Thread => {
            // SAFETY: any IRQL; the current thread's id.
            let thread_id = unsafe { PsGetCurrentThreadId() };
            // SAFETY: `thread` receives a referenced thread, released below.
            let status = unsafe { PsLookupThreadByThreadId(thread_id, &raw mut thread) };
            if status < 0 {
                return status;
            }
            (thread.cast(), ObjectType::Thread)
        }
    };
    let mut info = OB_PRE_OPERATION_INFORMATION {
        Operation: match operation {
            HandleOperation::Create => OB_OPERATION_HANDLE_CREATE,
            HandleOperation::Duplicate => OB_OPERATION_HANDLE_DUPLICATE,
        },
        Object: object_pointer,
        ObjectType: object_type.get(),
        Parameters: &raw mut parameters,
        ..OB_PRE_OPERATION_INFORMATION::default()
    };
    // SAFETY: valid operation information for the call's duration.
    let _ = unsafe { object_handles::on_handle(ptr::null_mut(), &raw mut info) };
    if !thread.is_null() {
        // SAFETY: the reference taken by PsLookupThreadByThreadId above.
        unsafe { ObfDereferenceObject(thread.cast()) };
    }
    STATUS_SUCCESS
}

/// A process or thread id as the kernel passes it.
///
/// Max IRQL: any.
fn id_handle(id: u32) -> HANDLE {
    id as usize as HANDLE
}
