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
