//! Reading DWORD values from the registry at load.

use core::{mem::size_of, ptr};

use wdk_sys::{
    _KEY_INFORMATION_CLASS::KeyBasicInformation,
    _KEY_VALUE_INFORMATION_CLASS::KeyValuePartialInformation,
    HANDLE, KEY_QUERY_VALUE, KEY_SET_VALUE, NTSTATUS, OBJ_CASE_INSENSITIVE, OBJ_KERNEL_HANDLE,
    OBJECT_ATTRIBUTES, REG_DWORD, REG_OPTION_NON_VOLATILE, STATUS_OBJECT_NAME_NOT_FOUND,
    UNICODE_STRING,
    ntddk::{ZwClose, ZwCreateKey, ZwOpenKey, ZwQueryKey, ZwQueryValueKey, ZwSetValueKey},
};

use crate::unicode::{unicode_string, unicode_string_over};

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
    with_key(key, Dword::Absent, |handle| query_dword(handle, value_name))
}

/// Reads a `REG_DWORD` value and when its key was last written (100 ns
/// units since 1601, UTC; `None` when the key is absent or its time
/// unreadable).
///
/// Max IRQL: `PASSIVE_LEVEL` (Zw registry routines).
pub fn read_dword_and_key_time(
    key: &UNICODE_STRING,
    value_name: &'static [u16],
) -> Result<(Dword, Option<u64>), NTSTATUS> {
    with_key(key, (Dword::Absent, None), |handle| {
        query_dword(handle, value_name).map(|dword| (dword, last_write_time(handle)))
    })
}

/// Opens `key` for reading, runs `read` on it and closes it; `absent` when
/// the key does not exist.
fn with_key<T>(
    key: &UNICODE_STRING,
    absent: T,
    read: impl FnOnce(HANDLE) -> Result<T, NTSTATUS>,
) -> Result<T, NTSTATUS> {
    let mut key_name = *key;
    let mut attributes = object_attributes(&mut key_name);
    let mut handle: HANDLE = ptr::null_mut();
    // SAFETY: every pointer refers to a live local; the handle is closed below.
    let status = unsafe { ZwOpenKey(&raw mut handle, KEY_QUERY_VALUE, &raw mut attributes) };
    if status == STATUS_OBJECT_NAME_NOT_FOUND {
        return Ok(absent);
    }
    if status < 0 {
        return Err(status);
    }
    let result = read(handle);
    // SAFETY: `handle` was opened above and is closed exactly once.
    let _ = unsafe { ZwClose(handle) };
    result
}

/// The key's `LastWriteTime`, or `None`.
fn last_write_time(key: HANDLE) -> Option<u64> {
    // KEY_BASIC_INFORMATION: LastWriteTime i64, TitleIndex u32, NameLength
    // u32, then the key's name (room here for 112 UTF-16 units). Read as
    // bytes rather than through the header struct.
    let mut information = [0_u64; 16];
    let mut returned = 0_u32;
    // SAFETY: the buffer outlives the call and its length is passed with it.
    let status = unsafe {
        ZwQueryKey(
            key,
            KeyBasicInformation,
            information.as_mut_ptr().cast(),
            u32::try_from(size_of_val(&information)).unwrap_or(0),
            &raw mut returned,
        )
    };
    (status >= 0 && returned >= 8).then(|| u64::from_le_bytes(information[0].to_le_bytes()))
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
const PARAMETERS_PATH_CAPACITY: usize = 256;

/// The service's `Parameters` key path, built once from the service key
/// `DriverEntry` receives and kept (it is needed again at unload).
#[derive(Clone, Copy)]
pub struct ParametersKey {
    path: [u16; PARAMETERS_PATH_CAPACITY],
    chars: usize,
}

impl ParametersKey {
    /// `<service key>\Parameters`, or `None` for a path too long to keep.
    ///
    /// Max IRQL: any.
    pub fn new(service_key: &UNICODE_STRING) -> Option<Self> {
        const NAME: &str = kstack_abi::PARAMETERS_KEY;
        let name: [u16; NAME.len()] = kstack_abi::ascii_to_utf16(NAME);
        let key_chars = usize::from(service_key.Length) / 2;
        let chars = key_chars + 1 + name.len();
        if service_key.Buffer.is_null() || chars > PARAMETERS_PATH_CAPACITY {
            return None;
        }
        // SAFETY: the kernel's UNICODE_STRING holds Length bytes at Buffer.
        let key = unsafe { core::slice::from_raw_parts(service_key.Buffer, key_chars) };
        let mut path = [0_u16; PARAMETERS_PATH_CAPACITY];
        path[..key_chars].copy_from_slice(key);
        path[key_chars] = u16::from(b'\\');
        path[key_chars + 1..chars].copy_from_slice(&name);
        Some(Self { path, chars })
    }

    /// The path as a `UNICODE_STRING` over this value's buffer (the
    /// registry routines only read a key name).
    fn unicode_string(&self) -> UNICODE_STRING {
        unicode_string_over(&self.path[..self.chars])
    }

    /// Reads a DWORD under the key.
    ///
    /// Max IRQL: `PASSIVE_LEVEL`.
    pub fn read_dword(&self, value_name: &'static [u16]) -> Result<Dword, NTSTATUS> {
        read_dword(&self.unicode_string(), value_name)
    }

    /// Writes a `REG_DWORD` under the key, creating the key if needed.
    ///
    /// Max IRQL: `PASSIVE_LEVEL`.
    pub fn write_dword(&self, value_name: &'static [u16], value: u32) -> Result<(), NTSTATUS> {
        let mut key_name = self.unicode_string();
        let mut attributes = object_attributes(&mut key_name);
        let mut handle: HANDLE = ptr::null_mut();
        // SAFETY: every pointer refers to a live local; the handle is closed below.
        let status = unsafe {
            ZwCreateKey(
                &raw mut handle,
                KEY_SET_VALUE,
                &raw mut attributes,
                0,
                ptr::null_mut(),
                REG_OPTION_NON_VOLATILE,
                ptr::null_mut(),
            )
        };
        if status < 0 {
            return Err(status);
        }
        let mut name = unicode_string(value_name);
        let mut data = value;
        // SAFETY: `data` is the 4 bytes of a REG_DWORD and outlives the call.
        let status = unsafe {
            ZwSetValueKey(
                handle,
                &raw mut name,
                0,
                REG_DWORD,
                (&raw mut data).cast(),
                4,
            )
        };
        // SAFETY: `handle` was opened above and is closed exactly once.
        let _ = unsafe { ZwClose(handle) };
        if status < 0 { Err(status) } else { Ok(()) }
    }
}

/// A DWORD setting of the service's `Parameters` key: `None` when the key
/// or value is missing, unreadable or not a DWORD.
///
/// Max IRQL: `PASSIVE_LEVEL`.
pub fn read_setting(parameters: Option<&ParametersKey>, value: &'static [u16]) -> Option<u32> {
    match parameters?.read_dword(value) {
        Ok(Dword::Value(setting)) => Some(setting),
        Ok(Dword::Absent | Dword::WrongType) | Err(_) => None,
    }
}

fn object_attributes(name: &mut UNICODE_STRING) -> OBJECT_ATTRIBUTES {
    OBJECT_ATTRIBUTES {
        Length: u32::try_from(size_of::<OBJECT_ATTRIBUTES>()).unwrap_or(u32::MAX),
        RootDirectory: ptr::null_mut(),
        ObjectName: name,
        Attributes: OBJ_CASE_INSENSITIVE | OBJ_KERNEL_HANDLE,
        SecurityDescriptor: ptr::null_mut(),
        SecurityQualityOfService: ptr::null_mut(),
    }
}
