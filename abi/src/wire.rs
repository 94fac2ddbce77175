//! Bounds-checked little-endian reading and writing of fixed-offset fields.
//!
//! Every message crosses the user/kernel boundary as bytes; nothing is ever
//! reinterpreted in place, so a short or misaligned buffer is an error, never
//! undefined behaviour.

use crate::error::DecodeError;

/// Reads fields from a byte slice at fixed offsets.
#[derive(Clone, Copy)]
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) const fn new(bytes: &'a [u8]) -> Self {
        Self { bytes }
    }

    fn array<const N: usize>(self, offset: usize) -> Result<[u8; N], DecodeError> {
        offset
            .checked_add(N)
            .and_then(|end| self.bytes.get(offset..end))
            .and_then(|slice| slice.try_into().ok())
            .ok_or(DecodeError::Truncated {
                needed: offset.saturating_add(N),
                actual: self.bytes.len(),
            })
    }

    pub(crate) fn u8(self, offset: usize) -> Result<u8, DecodeError> {
        self.array::<1>(offset).map(|[byte]| byte)
    }

    pub(crate) fn u16(self, offset: usize) -> Result<u16, DecodeError> {
        self.array(offset).map(u16::from_le_bytes)
    }

    pub(crate) fn u32(self, offset: usize) -> Result<u32, DecodeError> {
        self.array(offset).map(u32::from_le_bytes)
    }

    pub(crate) fn i32(self, offset: usize) -> Result<i32, DecodeError> {
        self.array(offset).map(i32::from_le_bytes)
    }

    pub(crate) fn u64(self, offset: usize) -> Result<u64, DecodeError> {
        self.array(offset).map(u64::from_le_bytes)
    }
}

/// Writes fields into a byte slice at fixed offsets. Callers check the
/// slice's length once, up front; a write past the end is a bug and panics.
pub(crate) struct Writer<'a> {
    bytes: &'a mut [u8],
}

impl<'a> Writer<'a> {
    pub(crate) const fn new(bytes: &'a mut [u8]) -> Self {
        Self { bytes }
    }

    fn put<const N: usize>(&mut self, offset: usize, value: [u8; N]) {
        self.bytes[offset..offset + N].copy_from_slice(&value);
    }

    pub(crate) fn u8(&mut self, offset: usize, value: u8) {
        self.put(offset, [value]);
    }

    pub(crate) fn u16(&mut self, offset: usize, value: u16) {
        self.put(offset, value.to_le_bytes());
    }

    pub(crate) fn u32(&mut self, offset: usize, value: u32) {
        self.put(offset, value.to_le_bytes());
    }

    pub(crate) fn i32(&mut self, offset: usize, value: i32) {
        self.put(offset, value.to_le_bytes());
    }

    pub(crate) fn u64(&mut self, offset: usize, value: u64) {
        self.put(offset, value.to_le_bytes());
    }
}

/// Checks an encoded message against its layout table: `rows` of offset
/// and expected bytes, in order, must cover every byte of `bytes` once.
#[cfg(test)]
pub(crate) fn assert_layout<'a>(bytes: &[u8], rows: impl IntoIterator<Item = (usize, &'a [u8])>) {
    let mut next = 0;
    for (offset, expected) in rows {
        assert_eq!(offset, next, "the rows cover every byte once");
        assert_eq!(
            &bytes[offset..offset + expected.len()],
            expected,
            "at {offset}"
        );
        next = offset + expected.len();
    }
    assert_eq!(next, bytes.len(), "the rows cover every byte");
}

/// A fieldless enum crossing the boundary as an integer: the enum with its
/// `repr` and wire values, `ALL` its values in declaration order (which
/// is wire order), `COUNT` how many, and `from_wire`, which refuses any
/// value the enum does not define (a damaged or newer message).
macro_rules! wire_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident: $repr:ident {
            $($(#[$variant_meta:meta])* $variant:ident = $value:literal,)+
        }
    ) => {
        $(#[$meta])*
        #[repr($repr)]
        $vis enum $name {
            $($(#[$variant_meta])* $variant = $value,)+
        }

        impl $name {
            /// Every value, in wire order.
            pub const ALL: [Self; Self::COUNT] = [$(Self::$variant),+];
            /// How many values there are.
            pub const COUNT: usize = [$($value),+].len();

            /// The value with this wire value, if it is one.
            #[must_use]
            pub const fn from_wire(value: $repr) -> Option<Self> {
                match value {
                    $($value => Some(Self::$variant),)+
                    _ => None,
                }
            }
        }
    };
}
pub(crate) use wire_enum;

/// A set of flag bits crossing the boundary as an integer: `NONE`, the
/// named flags, and `from_bits`, which refuses bits no flag defines.
macro_rules! wire_flags {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident($repr:ty) {
            $($(#[$flag_meta:meta])* const $flag:ident = $bit:literal;)+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
        $vis struct $name($repr);

        impl $name {
            /// No flag.
            pub const NONE: Self = Self(0);
            $($(#[$flag_meta])* pub const $flag: Self = Self($bit);)+
            /// Every defined bit.
            const KNOWN: $repr = 0 $(| $bit)+;

            /// The flags with these bits, or `None` when one is undefined.
            #[must_use]
            pub const fn from_bits(bits: $repr) -> Option<Self> {
                if bits & !Self::KNOWN == 0 {
                    Some(Self(bits))
                } else {
                    None
                }
            }

            /// The wire bits.
            #[must_use]
            pub const fn bits(self) -> $repr {
                self.0
            }

            /// Whether every bit of `other` is set.
            #[must_use]
            pub const fn contains(self, other: Self) -> bool {
                self.0 & other.0 == other.0
            }

            /// These flags and `other`'s.
            #[must_use]
            pub const fn union(self, other: Self) -> Self {
                Self(self.0 | other.0)
            }

            /// These flags without `other`'s.
            #[must_use]
            pub const fn without(self, other: Self) -> Self {
                Self(self.0 & !other.0)
            }
        }
    };
}
pub(crate) use wire_flags;
