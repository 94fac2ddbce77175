//! `NtQuerySystemInformation` (Windows): a class's reply, in a buffer grown
//! until it fits. The kernel module list (`naming::system_modules`) and the
//! thread listing (`thread_list`) parse the bytes.

use std::sync::atomic::{AtomicUsize, Ordering};

use windows_sys::Wdk::System::SystemInformation::{
    NtQuerySystemInformation, SYSTEM_INFORMATION_CLASS,
};

/// The largest reply so far, in 8-byte words: the next call starts there,
/// so a listing every tick makes one system call, not one that fails and
/// one that fits.
static LARGEST_REPLY: AtomicUsize = AtomicUsize::new(8192);

/// What the call returns when the buffer is too small.
const STATUS_INFO_LENGTH_MISMATCH: i32 = 0xC000_0004_u32.cast_signed();

/// The reply to `class`, as many bytes as the system wrote.
///
/// # Errors
/// The failing NTSTATUS.
pub fn query(class: SYSTEM_INFORMATION_CLASS) -> Result<Vec<u8>, i32> {
    // 8-aligned: the replies hold 64-bit fields.
    let mut buffer = vec![0_u64; LARGEST_REPLY.load(Ordering::Relaxed)];
    loop {
        let mut needed = 0_u32;
        let offered = u32::try_from(buffer.len() * 8).unwrap_or(u32::MAX);
        // SAFETY: the buffer is writable for `offered` bytes and 8-aligned;
        // `needed` is a valid out pointer.
        let status = unsafe {
            NtQuerySystemInformation(class, buffer.as_mut_ptr().cast(), offered, &raw mut needed)
        };
        match status {
            0 => {
                let bytes: Vec<u8> = buffer.iter().flat_map(|word| word.to_le_bytes()).collect();
                // A reply that leaves `needed` at 0 fills what it was given.
                let valid = match usize::try_from(needed) {
                    Ok(0) | Err(_) => bytes.len(),
                    Ok(written) => written.min(bytes.len()),
                };
                return Ok(bytes[..valid].to_vec());
            }
            STATUS_INFO_LENGTH_MISMATCH if needed > offered => {
                // The reply can grow between calls: ask for some room more.
                let words = usize::try_from(needed).unwrap_or(usize::MAX) / 8 + 1024;
                LARGEST_REPLY.fetch_max(words, Ordering::Relaxed);
                buffer.resize(words, 0);
            }
            failure => return Err(failure),
        }
    }
}
