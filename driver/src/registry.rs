//! Reading DWORD values from the registry at load.

use core::{mem::size_of, ptr};

use wdk_sys::{
    _KEY_VALUE_INFORMATION_CLASS::KeyValuePartialInformation,
    HANDLE, KEY_QUERY_VALUE, NTSTATUS, OBJ_CASE_INSENSITIVE, OBJ_KERNEL_HANDLE, OBJECT_ATTRIBUTES,
    REG_DWORD, STATUS_OBJECT_NAME_NOT_FOUND, UNICODE_STRING,
    ntddk::{ZwClose, ZwOpenKey, ZwQueryValueKey},
};

use crate::kernel::unicode_string;

/// What a DWORD look-up found.
pub enum Dword {
    /// The key or the value does not exist.
    Absent,
    /// The value exists but is not a `REG_DWORD`.
    WrongType,
    /// The value.
    Value(u32),
}

/// Reads a `REG_DWORD` value. `key` is a kernel registry path
/// (`\Registry\Machine\...`).
///
/// Max IRQL: `PASSIVE_LEVEL` (Zw registry routines).
pub fn read_dword(key: &UNICODE_STRING, value_name: &'static [u16]) -> Result<Dword, NTSTATUS> {
    let mut key_name = *key;
    let mut attributes = OBJECT_ATTRIBUTES {
        Length: u32::try_from(size_of::<OBJECT_ATTRIBUTES>()).unwrap_or(u32::MAX),
        RootDirectory: ptr::null_mut(),
        ObjectName: &raw mut key_name,
        Attributes: OBJ_CASE_INSENSITIVE | OBJ_KERNEL_HANDLE,
        SecurityDescriptor: ptr::null_mut(),
        SecurityQualityOfService: ptr::null_mut(),
    };
    let mut handle: HANDLE = ptr::null_mut();
    // SAFETY: every pointer refers to a live local; the handle is closed below.
    let status = unsafe { ZwOpenKey(&raw mut handle, KEY_QUERY_VALUE, &raw mut attributes) };
    if status == STATUS_OBJECT_NAME_NOT_FOUND {
        return Ok(Dword::Absent);
    }
    if status < 0 {
        return Err(status);
    }
    let result = query_dword(handle, value_name);
    // SAFETY: `handle` was opened above and is closed exactly once.
    let _ = unsafe { ZwClose(handle) };
    result
}

fn query_dword(key: HANDLE, value_name: &'static [u16]) -> Result<Dword, NTSTATUS> {
    // KEY_VALUE_PARTIAL_INFORMATION: TitleIndex u32, Type u32, DataLength u32,
    // then the data. Read as bytes rather than through the header struct.
    let mut information = [0_u64; 4];
    let mut returned = 0_u32;
    let mut name = unicode_string(value_name);
    // SAFETY: the buffer outlives the call and its length is passed with it.
    let status = unsafe {
        ZwQueryValueKey(
            key,
            &raw mut name,
            KeyValuePartialInformation,
            information.as_mut_ptr().cast(),
            u32::try_from(size_of_val(&information)).unwrap_or(0),
            &raw mut returned,
        )
    };
    if status == STATUS_OBJECT_NAME_NOT_FOUND {
        return Ok(Dword::Absent);
    }
    if status < 0 {
        return Err(status);
    }
    let [header, data, ..] = information.map(u64::to_le_bytes);
    let word = |bytes: [u8; 8], at: usize| {
        u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
    };
    let (kind, length, value) = (word(header, 4), word(data, 0), word(data, 4));
    Ok(if kind == REG_DWORD && length == 4 {
        Dword::Value(value)
    } else {
        Dword::WrongType
    })
}

/// Room for the service key path plus `\Parameters`; service key paths are
/// about 60 characters.
const SERVICE_PATH_CAPACITY: usize = 256;

/// Reads a DWORD from the service's `Parameters` subkey, given the service
/// key path `DriverEntry` received. A path too long for the buffer reads as
/// absent.
///
/// Max IRQL: `PASSIVE_LEVEL`.
pub fn read_service_parameter(
    service_key: &UNICODE_STRING,
    value_name: &'static [u16],
) -> Result<Dword, NTSTATUS> {
    const SUFFIX: &str = r"\Parameters";
    let suffix: [u16; SUFFIX.len()] = kstack_abi::ascii_to_utf16(SUFFIX);
    let key_chars = usize::from(service_key.Length) / 2;
    let mut path = [0_u16; SERVICE_PATH_CAPACITY];
    if service_key.Buffer.is_null() || key_chars + suffix.len() > path.len() {
        return Ok(Dword::Absent);
    }
    // SAFETY: the kernel's UNICODE_STRING holds Length bytes at Buffer.
    let key = unsafe { core::slice::from_raw_parts(service_key.Buffer, key_chars) };
    path[..key_chars].copy_from_slice(key);
    path[key_chars..key_chars + suffix.len()].copy_from_slice(&suffix);
    let bytes = u16::try_from((key_chars + suffix.len()) * 2).unwrap_or(u16::MAX);
    let parameters_key = UNICODE_STRING {
        Length: bytes,
        MaximumLength: bytes,
        Buffer: path.as_mut_ptr(),
    };
    read_dword(&parameters_key, value_name)
}
