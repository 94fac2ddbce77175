//! The blocks of a capture file (format 7 on): every byte after the file's
//! fixed header belongs to a block that carries its own length and a
//! CRC32C, so a reader finds damage, skips only the damaged bytes and goes
//! on, and reads a file cut short up to its last whole block. `LevelDB`'s
//! log and Kafka's record batches frame their records the same way.
//!
//! Layout of a block (little-endian):
//!
//! | offset | size | field |
//! |-------:|-----:|-------|
//! | 0  | 4 | magic [`BLOCK_MAGIC`] |
//! | 4  | 4 | CRC32C (Castagnoli) of bytes 8 to 24 and the payload |
//! | 8  | 1 | kind ([`BlockKind`]) |
//! | 9  | 3 | reserved, zero |
//! | 12 | 4 | payload length, at most [`MAX_BLOCK_PAYLOAD`] |
//! | 16 | 8 | entries written before this block (records, module records, sample entries) |
//! | 24 |   | the payload |
//!
//! Invariants the reader keeps:
//! - A block is used only when its magic, kind, length and checksum are all
//!   right: a damaged byte anywhere in it, header included, makes it
//!   damaged as a whole, never partly read.
//! - After a damaged block the reader looks for the next position where a
//!   whole intact block starts, one byte at a time, and resumes there: the
//!   bytes between are reported as damaged, with their offset and length.
//!   A false start needs four bytes of magic and a matching CRC32C.
//! - Bytes at the end of the file that hold no whole intact block are the
//!   tail of a capture cut short (or whose last blocks were damaged),
//!   reported as such.
//! - Memory: twice the largest block plus one read, whatever the file's
//!   size (consumed bytes are dropped once they are half the buffer).

use std::io::{self, Read};

/// The first bytes of every block.
pub const BLOCK_MAGIC: [u8; 4] = *b"KSBK";
/// Bytes before a block's payload.
pub const BLOCK_HEADER_SIZE: usize = 24;
/// The largest payload a block may have; a longer length is damage.
pub const MAX_BLOCK_PAYLOAD: usize = 16 << 20;
/// What the reader asks its input for at least, per read.
const READ_SIZE: usize = 64 << 10;

/// What a block holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockKind {
    /// The kernel's module list at the start (first block).
    Start = 1,
    /// One process's user-mode modules at the start.
    Process = 2,
    /// Records, module records and sample entries, back to back.
    Entries = 3,
    /// Identities of images that module records loaded.
    LoadedImages = 4,
    /// The end marker: the count of entries (last block).
    End = 5,
}

impl BlockKind {
    const fn from_byte(byte: u8) -> Option<Self> {
        Some(match byte {
            1 => Self::Start,
            2 => Self::Process,
            3 => Self::Entries,
            4 => Self::LoadedImages,
            5 => Self::End,
            _ => return None,
        })
    }
}

/// Appends a block of `kind` holding `payload` to `out`.
///
/// # Errors
/// A payload longer than [`MAX_BLOCK_PAYLOAD`].
pub fn encode_block(
    kind: BlockKind,
    entries_before: u64,
    payload: &[u8],
    out: &mut Vec<u8>,
) -> io::Result<()> {
    let length = u32::try_from(payload.len())
        .ok()
        .filter(|&length| length as usize <= MAX_BLOCK_PAYLOAD)
        .ok_or_else(|| io::Error::other("a capture block longer than 16 MiB"))?;
    let mut header = [0_u8; BLOCK_HEADER_SIZE];
    header[..4].copy_from_slice(&BLOCK_MAGIC);
    header[8] = kind as u8;
    header[12..16].copy_from_slice(&length.to_le_bytes());
    header[16..24].copy_from_slice(&entries_before.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&header[8..]), payload);
    header[4..8].copy_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(&header);
    out.extend_from_slice(payload);
    Ok(())
}

/// An intact block.
#[derive(Debug)]
pub struct Block<'a> {
    /// What it holds.
    pub kind: BlockKind,
    /// Entries written before it.
    pub entries_before: u64,
    /// Its byte offset in the file.
    pub offset: u64,
    /// Its payload.
    pub payload: &'a [u8],
}

/// What the reader finds next.
#[derive(Debug)]
pub enum Piece<'a> {
    /// An intact block.
    Block(Block<'a>),
    /// Bytes holding no intact block, followed by an intact block.
    Damaged {
        /// Where they start.
        offset: u64,
        /// How many.
        length: u64,
    },
    /// Bytes holding no intact block, up to the end of the file.
    Tail {
        /// Where they start.
        offset: u64,
        /// How many.
        length: u64,
    },
}

/// Reads blocks from a stream, one read ahead at most.
pub struct BlockReader<R> {
    input: R,
    buffer: Vec<u8>,
    /// Where the unread bytes start in `buffer`.
    start: usize,
    /// The file offset of `buffer[start]`.
    offset: u64,
    /// Bytes of the last block handed out, dropped at the next call.
    handed_out: usize,
    end_of_input: bool,
}

impl<R: Read> BlockReader<R> {
    /// Reads blocks from `input`, whose first byte is at file offset
    /// `offset`.
    pub const fn new(input: R, offset: u64) -> Self {
        Self {
            input,
            buffer: Vec::new(),
            start: 0,
            offset,
            handed_out: 0,
            end_of_input: false,
        }
    }

    /// The next block, run of damaged bytes, or tail; `None` at the end.
    ///
    /// # Errors
    /// The input's I/O error.
    pub fn next_piece(&mut self) -> io::Result<Option<Piece<'_>>> {
        self.advance(self.handed_out);
        self.handed_out = 0;
        if !self.fill(1)? {
            return Ok(None);
        }
        if let Some(length) = self.intact_block_length()? {
            self.handed_out = BLOCK_HEADER_SIZE + length;
            return Ok(Some(Piece::Block(self.block_at_start(length))));
        }
        let from = self.offset;
        self.advance(1);
        loop {
            let unread = &self.buffer[self.start..];
            if let Some(at) = unread.windows(4).position(|window| window == BLOCK_MAGIC) {
                self.advance(at);
                if self.intact_block_length()?.is_some() {
                    return Ok(Some(Piece::Damaged {
                        offset: from,
                        length: self.offset - from,
                    }));
                }
                self.advance(1);
                continue;
            }
            // Keep three bytes: a magic may begin there.
            let kept = unread.len().min(3);
            self.advance(unread.len() - kept);
            if !self.fill(kept + 1)? {
                self.advance(kept);
                return Ok(Some(Piece::Tail {
                    offset: from,
                    length: self.offset - from,
                }));
            }
        }
    }

    /// The payload length of the intact block at the unread bytes' start,
    /// if one starts there.
    fn intact_block_length(&mut self) -> io::Result<Option<usize>> {
        if !self.fill(BLOCK_HEADER_SIZE)? {
            return Ok(None);
        }
        let header = &self.buffer[self.start..self.start + BLOCK_HEADER_SIZE];
        let length = u32::from_le_bytes([header[12], header[13], header[14], header[15]]) as usize;
        if header[..4] != BLOCK_MAGIC
            || BlockKind::from_byte(header[8]).is_none()
            || header[9..12] != [0; 3]
            || length > MAX_BLOCK_PAYLOAD
            || !self.fill(BLOCK_HEADER_SIZE + length)?
        {
            return Ok(None);
        }
        let block = &self.buffer[self.start..self.start + BLOCK_HEADER_SIZE + length];
        let stored = u32::from_le_bytes([block[4], block[5], block[6], block[7]]);
        let computed = crc32c::crc32c_append(
            crc32c::crc32c(&block[8..BLOCK_HEADER_SIZE]),
            &block[BLOCK_HEADER_SIZE..],
        );
        Ok((stored == computed).then_some(length))
    }

    fn block_at_start(&self, length: usize) -> Block<'_> {
        let block = &self.buffer[self.start..self.start + BLOCK_HEADER_SIZE + length];
        Block {
            // Checked by `intact_block_length`.
            kind: BlockKind::from_byte(block[8]).unwrap_or(BlockKind::Entries),
            entries_before: u64::from_le_bytes(block[16..24].try_into().unwrap_or_default()),
            offset: self.offset,
            payload: &block[BLOCK_HEADER_SIZE..],
        }
    }

    fn advance(&mut self, bytes: usize) {
        self.start += bytes;
        self.offset += bytes as u64;
    }

    /// Reads until `wanted` unread bytes are buffered; false when the
    /// input ends first. Consumed bytes are dropped only once they are half
    /// the buffer, so a resynchronisation that tries candidate after
    /// candidate moves each byte a bounded number of times.
    fn fill(&mut self, wanted: usize) -> io::Result<bool> {
        if self.buffer.len() - self.start >= wanted || self.end_of_input {
            return Ok(self.buffer.len() - self.start >= wanted);
        }
        if self.start >= self.buffer.len() / 2 {
            self.buffer.drain(..self.start);
            self.start = 0;
        }
        let needed = self.start + wanted;
        let mut filled = self.buffer.len();
        self.buffer.resize(needed.max(filled + READ_SIZE), 0);
        while filled < needed {
            match self.input.read(&mut self.buffer[filled..]) {
                Ok(0) => {
                    self.end_of_input = true;
                    break;
                }
                Ok(read) => filled += read,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => {
                    self.buffer.truncate(filled);
                    return Err(error);
                }
            }
        }
        self.buffer.truncate(filled);
        Ok(filled - self.start >= wanted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocks(payloads: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for (index, payload) in payloads.iter().enumerate() {
            encode_block(BlockKind::Entries, index as u64, payload, &mut out).unwrap();
        }
        out
    }

    /// What a reader over `bytes` finds, reading `chunk` bytes at a time:
    /// `(offset, payload)` per block, `(offset, length)` per damaged run and
    /// the tail.
    #[derive(Debug, Default, PartialEq, Eq)]
    struct Found {
        blocks: Vec<(u64, Vec<u8>)>,
        damaged: Vec<(u64, u64)>,
        tail: Option<(u64, u64)>,
    }

    /// Hands out at most `chunk` bytes per read, as a pipe might.
    struct Chunked<'a>(&'a [u8], usize);

    impl Read for Chunked<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let length = buf.len().min(self.1).min(self.0.len());
            buf[..length].copy_from_slice(&self.0[..length]);
            self.0 = &self.0[length..];
            Ok(length)
        }
    }

    fn read(bytes: &[u8], chunk: usize) -> Found {
        let mut reader = BlockReader::new(Chunked(bytes, chunk), 100);
        let mut found = Found::default();
        while let Some(piece) = reader.next_piece().unwrap() {
            assert!(found.tail.is_none(), "nothing after the tail");
            match piece {
                Piece::Block(block) => found.blocks.push((block.offset, block.payload.to_vec())),
                Piece::Damaged { offset, length } => found.damaged.push((offset, length)),
                Piece::Tail { offset, length } => found.tail = Some((offset, length)),
            }
        }
        found
    }

    #[test]
    fn blocks_read_back_whatever_the_reads_size() {
        let bytes = blocks(&[b"one", b"", &vec![7; 100_000], b"four"]);
        for chunk in [1, 5, 4096, usize::MAX] {
            let found = read(&bytes, chunk);
            assert_eq!(found.damaged, []);
            assert_eq!(found.tail, None);
            let payloads: Vec<_> = found.blocks.iter().map(|(_, p)| p.len()).collect();
            assert_eq!(payloads, [3, 0, 100_000, 4]);
            assert_eq!(found.blocks[1].0, 100 + 27);
        }
    }

    #[test]
    fn a_flipped_bit_loses_its_block_only_and_a_cut_leaves_a_tail() {
        let bytes = blocks(&[b"alpha", b"bravo", b"charlie"]);
        let second = BLOCK_HEADER_SIZE + 5;
        let third = second + BLOCK_HEADER_SIZE + 5;
        for at in second..third {
            for bit in 0..8 {
                let mut damaged = bytes.clone();
                damaged[at] ^= 1 << bit;
                let found = read(&damaged, 7);
                let offsets: Vec<_> = found.blocks.iter().map(|(offset, _)| *offset).collect();
                assert_eq!(offsets, [100, 100 + third as u64], "byte {at} bit {bit}");
                assert_eq!(
                    found.damaged,
                    [(100 + second as u64, (third - second) as u64)]
                );
                assert_eq!(found.tail, None);
            }
        }
        for cut in third..bytes.len() {
            let found = read(&bytes[..cut], 3);
            assert_eq!(found.blocks.len(), 2, "cut at {cut}");
            let tail = (cut > third).then_some((100 + third as u64, (cut - third) as u64));
            assert_eq!(found.tail, tail);
        }
    }

    #[test]
    fn lengths_beyond_the_limit_or_the_file_are_damage() {
        let mut bytes = blocks(&[b"alpha", b"bravo"]);
        bytes[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        let found = read(&bytes, 1 << 20);
        assert_eq!(found.blocks.len(), 1);
        assert_eq!(found.damaged, [(100, (BLOCK_HEADER_SIZE + 5) as u64)]);
        let mut out = Vec::new();
        assert!(
            encode_block(BlockKind::End, 0, &vec![0; MAX_BLOCK_PAYLOAD + 1], &mut out).is_err()
        );
    }
}
