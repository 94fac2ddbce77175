//! Kernel strings: the `UNICODE_STRING`s kstack hands the kernel, over
//! UTF-16 text it keeps, and the copies it keeps of names the kernel hands
//! it. Apart from `kernel` so that `routines`, which
//! `kernel` uses, can name exports without a cycle between them.

use core::mem::size_of;

use kstack_abi::module_record::MAX_MODULE_PATH;
use kstack_driver_core::module_records::path_tail;
use wdk_sys::{PCUNICODE_STRING, UNICODE_STRING};

// The WDK's x64 layout, as `kernel` pins the structs it touches.
const _: () = assert!(size_of::<UNICODE_STRING>() == 0x10);

/// A static UTF-16 copy of an ASCII string (a literal or a `&str` constant),
/// for `UNICODE_STRING`s.
macro_rules! utf16 {
    ($text:expr) => {{
        const TEXT: &str = $text;
        static UTF16: [u16; TEXT.len()] = kstack_abi::ascii_to_utf16(TEXT);
        &UTF16
    }};
}
pub(crate) use utf16;

/// A `UNICODE_STRING` over a static UTF-16 array.
///
/// Max IRQL: any.
pub fn unicode_string(text: &'static [u16]) -> UNICODE_STRING {
    let bytes = u16::try_from(size_of_val(text)).unwrap_or(u16::MAX);
    UNICODE_STRING {
        Length: bytes,
        MaximumLength: bytes,
        // The kernel takes a mutable pointer but never writes through a
        // string it is only given to read.
        Buffer: text.as_ptr().cast_mut(),
    }
}

/// A `UNICODE_STRING` over `text`, which the caller keeps alive and
/// unchanged while the kernel may read the string.
///
/// Max IRQL: any.
pub fn unicode_string_over(text: &[u16]) -> UNICODE_STRING {
    let bytes = u16::try_from(size_of_val(text)).unwrap_or(u16::MAX);
    UNICODE_STRING {
        Length: bytes,
        MaximumLength: bytes,
        Buffer: text.as_ptr().cast_mut(),
    }
}

/// The end of a kernel-given name (at most [`MAX_MODULE_PATH`] UTF-16
/// units), copied into the holder's memory: a module record is written at
/// `DISPATCH_LEVEL`, where the kernel's buffer (paged pool, possibly) may
/// not be touched, so the callback copies it first, at `PASSIVE_LEVEL`.
pub struct NameTail {
    units: [u16; MAX_MODULE_PATH],
    len: usize,
    truncated: bool,
}

impl NameTail {
    /// Copies the end of `name` (null: an empty name).
    ///
    /// # Safety
    /// `name` is null or a valid `UNICODE_STRING` whose `Length` bytes at
    /// `Buffer` are readable for the call.
    ///
    /// Max IRQL: `APC_LEVEL` (the buffer may be paged).
    pub unsafe fn copy(name: PCUNICODE_STRING) -> Self {
        let mut tail = Self {
            units: [0; MAX_MODULE_PATH],
            len: 0,
            truncated: false,
        };
        // SAFETY: null or valid for the call (the caller).
        let Some(name) = (unsafe { name.as_ref() }) else {
            return tail;
        };
        let length = usize::from(name.Length) / 2;
        if name.Buffer.is_null() || length == 0 {
            return tail;
        }
        // SAFETY: `Length` bytes at `Buffer` are readable (the caller).
        let whole = unsafe { core::slice::from_raw_parts(name.Buffer, length) };
        let kept = &whole[path_tail(length)..];
        tail.units[..kept.len()].copy_from_slice(kept);
        tail.len = kept.len();
        tail.truncated = kept.len() < length;
        tail
    }

    /// The units copied.
    ///
    /// Max IRQL: any.
    pub fn units(&self) -> &[u16] {
        &self.units[..self.len]
    }

    /// Whether the name's beginning was left out.
    ///
    /// Max IRQL: any.
    pub const fn truncated(&self) -> bool {
        self.truncated
    }
}
