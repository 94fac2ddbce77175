//! Handle operations on processes and threads (`ObRegisterCallbacks`). Like
//! the process source, it needs the image's force-integrity flag.

use core::{
    cell::UnsafeCell,
    ffi::c_void,
    ptr,
    sync::atomic::{AtomicPtr, Ordering},
};

use kstack_abi::{
    SourceFacts,
    altitude::{ALTITUDE_CHARS, Altitude, register_at_free_altitude},
    source_facts::{HandleOperation, ObjectKind},
};
use wdk_sys::{
    _OB_PREOP_CALLBACK_STATUS::OB_PREOP_SUCCESS,
    NTSTATUS, OB_CALLBACK_REGISTRATION, OB_FLT_REGISTRATION_VERSION, OB_OPERATION_HANDLE_CREATE,
    OB_OPERATION_HANDLE_DUPLICATE, OB_OPERATION_REGISTRATION, OB_PRE_OPERATION_INFORMATION,
    OB_PREOP_CALLBACK_STATUS, POB_PRE_OPERATION_INFORMATION, PVOID,
    ntddk::{ObRegisterCallbacks, ObUnRegisterCallbacks, PsGetProcessId, PsGetThreadProcessId},
};

use crate::{
    kernel::{ObjectType, handle_to_id},
    recorder,
    unicode::unicode_string_over,
};

/// The registration and the operation table it points to (kept where the
/// kernel can read it for as long as the callbacks are registered).
pub struct ObjectCallbacks {
    handle: AtomicPtr<c_void>,
    operations: UnsafeCell<[OB_OPERATION_REGISTRATION; 2]>,
    /// The altitude's text.
    altitude: UnsafeCell<[u16; ALTITUDE_CHARS]>,
}

/// The pre-operation callback.
///
/// Max IRQL: `PASSIVE_LEVEL` (object pre-operation callbacks run there).
// Never inlined: the kernel calls it through a pointer, and the test-only
// injection calls it directly; either way it is a frame of its own, so each
// source's stacks differ.
#[inline(never)]
pub(crate) unsafe extern "C" fn on_handle(
    _context: PVOID,
    info: POB_PRE_OPERATION_INFORMATION,
) -> OB_PREOP_CALLBACK_STATUS {
    // SAFETY: the kernel passes valid operation information for the call.
    if let Some(info) = unsafe { info.as_ref() } {
        recorder::record(|| handle_facts(info));
    }
    // kstack only observes: the access is granted as asked.
    OB_PREOP_SUCCESS
}

/// Max IRQL: `PASSIVE_LEVEL`.
fn handle_facts(info: &OB_PRE_OPERATION_INFORMATION) -> Option<SourceFacts> {
    let operation = match info.Operation {
        OB_OPERATION_HANDLE_CREATE => HandleOperation::Create,
        OB_OPERATION_HANDLE_DUPLICATE => HandleOperation::Duplicate,
        _ => return None,
    };
    let (object, target) = if info.ObjectType == ObjectType::Process.get() {
        // SAFETY: the object of a process-type operation is a process.
        (ObjectKind::Process, unsafe {
            PsGetProcessId(info.Object.cast())
        })
    } else {
        // SAFETY: the only other registered type is the thread type.
        (ObjectKind::Thread, unsafe {
            PsGetThreadProcessId(info.Object.cast())
        })
    };
    // SAFETY: Parameters is valid for the call.
    let parameters = unsafe { &*info.Parameters };
    // SAFETY: DesiredAccess is the first field of both the create and the
    // duplicate variant, so either reading is the same bytes.
    let desired_access = unsafe { parameters.CreateHandleInformation.DesiredAccess };
    Some(SourceFacts::ObjectHandle {
        operation,
        object,
        desired_access,
        target_process_id: handle_to_id(target),
    })
}

impl ObjectCallbacks {
    pub fn new() -> Self {
        Self {
            handle: AtomicPtr::new(ptr::null_mut()),
            operations: UnsafeCell::new([OB_OPERATION_REGISTRATION::default(); 2]),
            altitude: UnsafeCell::new([0; ALTITUDE_CHARS]),
        }
    }

    /// Registers for process and thread handle creation and duplication,
    /// at the first free altitude from `base` (`kstack_abi::altitude`);
    /// returns the status and the altitude in use.
    ///
    /// Max IRQL: `PASSIVE_LEVEL`.
    pub fn register(&self, base: u32) -> (NTSTATUS, Altitude) {
        let operation = |object_type| OB_OPERATION_REGISTRATION {
            ObjectType: object_type,
            Operations: OB_OPERATION_HANDLE_CREATE | OB_OPERATION_HANDLE_DUPLICATE,
            PreOperation: Some(on_handle),
            PostOperation: None,
        };
        let operations = self.operations.get();
        // SAFETY: nothing else touches the table before registration.
        unsafe {
            operations.write([
                operation(ObjectType::Process.variable()),
                operation(ObjectType::Thread.variable()),
            ]);
        };
        register_at_free_altitude(base, |altitude| {
            // SAFETY: only DriverEntry registers, once, before any reader.
            let text = unsafe { &mut *self.altitude.get() };
            let length = altitude.to_utf16(text);
            let mut registration = OB_CALLBACK_REGISTRATION {
                Version: u16::try_from(OB_FLT_REGISTRATION_VERSION).unwrap_or_default(),
                OperationRegistrationCount: 2,
                Altitude: unicode_string_over(&text[..length]),
                RegistrationContext: ptr::null_mut(),
                OperationRegistration: operations.cast(),
            };
            let mut handle = ptr::null_mut();
            // SAFETY: the registration and its table are valid; the table
            // and the altitude's text live in the driver state until
            // `unregister`.
            let status = unsafe { ObRegisterCallbacks(&raw mut registration, &raw mut handle) };
            if status >= 0 {
                self.handle.store(handle, Ordering::Relaxed);
            }
            status
        })
    }

    /// Max IRQL: `PASSIVE_LEVEL`.
    pub fn unregister(&self) {
        let handle = self.handle.swap(ptr::null_mut(), Ordering::Relaxed);
        if !handle.is_null() {
            // SAFETY: the handle came from a successful registration.
            unsafe { ObUnRegisterCallbacks(handle) };
        }
    }
}
