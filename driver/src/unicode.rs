//! Kernel strings: the `UNICODE_STRING`s kstack hands the kernel, over
//! UTF-16 text it keeps. Apart from `kernel` so that `routines`, which
//! `kernel` uses, can name exports without a cycle between them.

use core::mem::size_of;

use wdk_sys::UNICODE_STRING;

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
