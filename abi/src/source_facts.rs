//! What each source records about its event: the facts of a record, kept
//! as three words on the wire.

use crate::{error::DecodeError, source::Source};

/// Whether a process or thread is starting or ending.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Lifecycle {
    /// Being created.
    Create,
    /// Exiting.
    Exit,
}

/// What kind of handle operation an object callback saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HandleOperation {
    /// `OB_OPERATION_HANDLE_CREATE`.
    Create,
    /// `OB_OPERATION_HANDLE_DUPLICATE`.
    Duplicate,
}

/// The object type of a handle operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ObjectKind {
    /// A process object.
    Process,
    /// A thread object.
    Thread,
}

/// What the source knew about the event it captured. Each variant belongs
/// to one [`Source`]; together with it, this is the record's "where".
///
/// On the wire (a record's bytes 40 to 63, see [`crate::record`]) the facts
/// are three u64 words, `a`, `b`, `c`, by source:
///
/// | source | `a` | `b` | `c` |
/// |--------|-----|-----|-----|
/// | process | event (0 create, 1 exit) | `process_id` | `parent_process_id` |
/// | thread | event (0 create, 1 exit) | `process_id` | `thread_id` |
/// | image load | `image_base` | `image_size` | `process_id` |
/// | registry | `notify_class` | 0 | 0 |
/// | object handle | operation (0 create, 1 duplicate) in bits 0..32, object (0 process, 1 thread) in bits 32..64 | `desired_access` | `target_process_id` |
/// | timer | 0 | 0 | 0 |
/// | on demand | `tag` | 0 | 0 |
/// | thread stack | `tag` | `target_process_id` in bits 0..32, `target_thread_id` in bits 32..64 | `delay` in bits 0..32, `late` (0 or 1) in bits 32..64 |
///
/// A u32 field alone in a word has the word's high 32 bits zero. Any other
/// value (a word a source does not use that is not 0, an enumeration out
/// of range, high bits set) is a damaged record
/// ([`DecodeError::InvalidFacts`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SourceFacts {
    /// A process was created or exited.
    Process {
        /// Create or exit.
        event: Lifecycle,
        /// The process created or exiting.
        process_id: u32,
        /// Its parent (0 on exit, where the kernel does not say).
        parent_process_id: u32,
    },
    /// A thread was created or exited.
    Thread {
        /// Create or exit.
        event: Lifecycle,
        /// The thread's process.
        process_id: u32,
        /// The thread created or exiting.
        thread_id: u32,
    },
    /// An image was mapped.
    ImageLoad {
        /// Where it was mapped.
        image_base: u64,
        /// Its size in bytes.
        image_size: u64,
        /// The process it was mapped into (0 for a kernel-mode image).
        process_id: u32,
    },
    /// A registry operation.
    Registry {
        /// The `REG_NOTIFY_CLASS` value of the operation.
        notify_class: u32,
    },
    /// A handle to a process or thread was opened or duplicated.
    ObjectHandle {
        /// Create or duplicate.
        operation: HandleOperation,
        /// Process or thread.
        object: ObjectKind,
        /// The access the caller asked for.
        desired_access: u32,
        /// The process the object is (or belongs to).
        target_process_id: u32,
    },
    /// A periodic timer sample.
    Timer,
    /// A capture-now request.
    OnDemand {
        /// The caller's tag, returned as given.
        tag: u64,
    },
    /// A thread's stack, captured in the thread by the special kernel APC
    /// a capture-threads request queued to it
    /// ([`crate::Ioctl::CaptureThreads`]). The record's `process_id` and
    /// `thread_id` are the same thread's (the APC runs in it).
    ThreadStack {
        /// The process of the thread captured.
        target_process_id: u32,
        /// The thread captured: one of the request's thread ids.
        target_thread_id: u32,
        /// The request's tag, as given.
        tag: u64,
        /// From the request to the capture, in 100 ns units (the record
        /// clock's), at most `u32::MAX` (about 7 minutes): a longer delay
        /// reads as `u32::MAX`.
        delay: u32,
        /// The capture ran after the request's `timeout_ms` had passed (a
        /// timeout does not take a queued APC back; the capture is still
        /// recorded, and counted as
        /// [`crate::messages::ThreadCaptureStatus::late`]).
        late: bool,
    },
}

impl SourceFacts {
    /// The source these facts belong to.
    #[must_use]
    pub const fn source(&self) -> Source {
        match self {
            Self::Process { .. } => Source::Process,
            Self::Thread { .. } => Source::Thread,
            Self::ImageLoad { .. } => Source::ImageLoad,
            Self::Registry { .. } => Source::Registry,
            Self::ObjectHandle { .. } => Source::ObjectHandle,
            Self::Timer => Source::Timer,
            Self::OnDemand { .. } => Source::OnDemand,
            Self::ThreadStack { .. } => Source::ThreadStack,
        }
    }

    /// The three 64-bit fact words of the record layout.
    #[must_use]
    pub const fn to_words(&self) -> [u64; 3] {
        match *self {
            Self::Process {
                event,
                process_id,
                parent_process_id,
            } => [
                lifecycle_word(event),
                process_id as u64,
                parent_process_id as u64,
            ],
            Self::Thread {
                event,
                process_id,
                thread_id,
            } => [lifecycle_word(event), process_id as u64, thread_id as u64],
            Self::ImageLoad {
                image_base,
                image_size,
                process_id,
            } => [image_base, image_size, process_id as u64],
            Self::Registry { notify_class } => [notify_class as u64, 0, 0],
            Self::ObjectHandle {
                operation,
                object,
                desired_access,
                target_process_id,
            } => {
                let operation = match operation {
                    HandleOperation::Create => 0,
                    HandleOperation::Duplicate => 1,
                };
                let object = match object {
                    ObjectKind::Process => 0,
                    ObjectKind::Thread => 1,
                };
                [
                    operation | object << 32,
                    desired_access as u64,
                    target_process_id as u64,
                ]
            }
            Self::Timer => [0, 0, 0],
            Self::OnDemand { tag } => [tag, 0, 0],
            Self::ThreadStack {
                target_process_id,
                target_thread_id,
                tag,
                delay,
                late,
            } => [
                tag,
                target_process_id as u64 | (target_thread_id as u64) << 32,
                delay as u64 | (late as u64) << 32,
            ],
        }
    }

    /// The facts of `source` from the record's fact words. Unused words must
    /// be zero and enumerations in range, so a damaged record is an error.
    ///
    /// # Errors
    /// [`DecodeError::InvalidFacts`] when the words are not valid for `source`.
    pub fn from_words(source: Source, [a, b, c]: [u64; 3]) -> Result<Self, DecodeError> {
        let invalid = DecodeError::InvalidFacts { source };
        let id = |word: u64| u32::try_from(word).map_err(|_| invalid);
        let lifecycle = |word: u64| match word {
            0 => Ok(Lifecycle::Create),
            1 => Ok(Lifecycle::Exit),
            _ => Err(invalid),
        };
        let facts = match source {
            Source::Process => Self::Process {
                event: lifecycle(a)?,
                process_id: id(b)?,
                parent_process_id: id(c)?,
            },
            Source::Thread => Self::Thread {
                event: lifecycle(a)?,
                process_id: id(b)?,
                thread_id: id(c)?,
            },
            Source::ImageLoad => Self::ImageLoad {
                image_base: a,
                image_size: b,
                process_id: id(c)?,
            },
            Source::Registry if b == 0 && c == 0 => Self::Registry {
                notify_class: id(a)?,
            },
            Source::ObjectHandle => {
                let operation = match a & 0xFFFF_FFFF {
                    0 => HandleOperation::Create,
                    1 => HandleOperation::Duplicate,
                    _ => return Err(invalid),
                };
                let object = match a >> 32 {
                    0 => ObjectKind::Process,
                    1 => ObjectKind::Thread,
                    _ => return Err(invalid),
                };
                Self::ObjectHandle {
                    operation,
                    object,
                    desired_access: id(b)?,
                    target_process_id: id(c)?,
                }
            }
            Source::Timer if a == 0 && b == 0 && c == 0 => Self::Timer,
            Source::OnDemand if b == 0 && c == 0 => Self::OnDemand { tag: a },
            Source::ThreadStack => Self::ThreadStack {
                target_process_id: low_half(b),
                target_thread_id: high_half(b),
                tag: a,
                delay: low_half(c),
                late: match high_half(c) {
                    0 => false,
                    1 => true,
                    _ => return Err(invalid),
                },
            },
            Source::Registry | Source::Timer | Source::OnDemand => return Err(invalid),
        };
        Ok(facts)
    }
}

/// The low 32 bits of a fact word that packs two u32 fields.
#[expect(clippy::cast_possible_truncation, reason = "the low half, by intent")]
const fn low_half(word: u64) -> u32 {
    word as u32
}

/// The high 32 bits of a fact word that packs two u32 fields.
const fn high_half(word: u64) -> u32 {
    (word >> 32) as u32
}

const fn lifecycle_word(event: Lifecycle) -> u64 {
    match event {
        Lifecycle::Create => 0,
        Lifecycle::Exit => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn facts_round_trip_through_words() {
        let all = [
            SourceFacts::Process {
                event: Lifecycle::Exit,
                process_id: 4,
                parent_process_id: 0,
            },
            SourceFacts::Thread {
                event: Lifecycle::Create,
                process_id: 8,
                thread_id: 12,
            },
            SourceFacts::ImageLoad {
                image_base: 0xFFFF_F800_0000_0000,
                image_size: 0x1000,
                process_id: 0,
            },
            SourceFacts::Registry { notify_class: 26 },
            SourceFacts::ObjectHandle {
                operation: HandleOperation::Duplicate,
                object: ObjectKind::Thread,
                desired_access: 0x1F_FFFF,
                target_process_id: u32::MAX,
            },
            SourceFacts::Timer,
            SourceFacts::OnDemand { tag: u64::MAX },
            SourceFacts::ThreadStack {
                target_process_id: 0x0102_0304,
                target_thread_id: u32::MAX,
                tag: 0x0506_0708_090A_0B0C,
                delay: 0x0D0E_0F10,
                late: true,
            },
        ];
        for facts in all {
            assert_eq!(
                SourceFacts::from_words(facts.source(), facts.to_words()),
                Ok(facts)
            );
        }
    }

    #[test]
    fn damaged_fact_words_are_errors() {
        let invalid = |source| Err(DecodeError::InvalidFacts { source });
        assert_eq!(
            SourceFacts::from_words(Source::Process, [2, 0, 0]),
            invalid(Source::Process)
        );
        assert_eq!(
            SourceFacts::from_words(Source::Thread, [0, 1 << 32, 0]),
            invalid(Source::Thread)
        );
        assert_eq!(
            SourceFacts::from_words(Source::Registry, [1, 1, 0]),
            invalid(Source::Registry)
        );
        assert_eq!(
            SourceFacts::from_words(Source::ObjectHandle, [2, 0, 0]),
            invalid(Source::ObjectHandle)
        );
        assert_eq!(
            SourceFacts::from_words(Source::ObjectHandle, [2 << 32, 0, 0]),
            invalid(Source::ObjectHandle)
        );
        assert_eq!(
            SourceFacts::from_words(Source::Timer, [0, 0, 1]),
            invalid(Source::Timer)
        );
        assert_eq!(
            SourceFacts::from_words(Source::OnDemand, [7, 1, 0]),
            invalid(Source::OnDemand)
        );
        assert_eq!(
            SourceFacts::from_words(Source::ThreadStack, [7, 1, 2 << 32]),
            invalid(Source::ThreadStack),
            "late is 0 or 1"
        );
    }

    #[test]
    fn thread_stack_facts_pack_two_fields_a_word_as_documented() {
        let facts = SourceFacts::ThreadStack {
            target_process_id: 0x0102_0304,
            target_thread_id: 0x0506_0708,
            tag: 9,
            delay: 0x0A0B_0C0D,
            late: true,
        };
        assert_eq!(facts.to_words(), [9, 0x0506_0708_0102_0304, 0x1_0A0B_0C0D]);
        let on_time = SourceFacts::ThreadStack {
            target_process_id: 4,
            target_thread_id: 8,
            tag: 0,
            delay: 0,
            late: false,
        };
        assert_eq!(on_time.to_words(), [0, 8 << 32 | 4, 0]);
        assert_eq!(
            SourceFacts::from_words(Source::ThreadStack, on_time.to_words()),
            Ok(on_time)
        );
    }
}
