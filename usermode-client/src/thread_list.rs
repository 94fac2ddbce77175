//! The machine's threads, and what each is doing: the listings `kstack
//! threads --pid` and `kstack sample` ask for.
//!
//! `NtQuerySystemInformation(SystemProcessInformation)` gives every thread
//! of every process in one call, with its state, its wait reason, how
//! often it was switched to, and its kernel and user times. Where that
//! call fails, Toolhelp lists the ids only, and the listing says so once
//! (see [`ListingSource`]). Off Windows there is nothing to list.
//!
//! The reply's layout is parsed here, portably, so it is tested on any
//! host; only the calls are Windows code. The x64 layout, little-endian:
//! - a process entry: `NextEntryOffset` (u32) at 0, `NumberOfThreads`
//!   (u32) at 4, `UniqueProcessId` at 80, and its `NumberOfThreads`
//!   thread entries from 256 (`sizeof(SYSTEM_PROCESS_INFORMATION)`);
//! - a thread entry (`SYSTEM_THREAD_INFORMATION`, 80 bytes): `KernelTime`
//!   at 0, `UserTime` at 8 (100 ns units), `CreateTime` at 16, `ClientId`
//!   at 40 (process, then
//!   thread at 48), `ContextSwitches` (u32) at 64, `ThreadState` (u32) at
//!   68, `WaitReason` (u32) at 72.
//!
//! winternl.h documents the entries, the state and the wait reason, and
//! keeps the times and the switch count as `Reserved` fields; they have
//! been at these offsets since NT 3.1 and are read the same way by Process
//! Explorer and System Informer (phnt's `ntexapi.h`,
//! `SYSTEM_THREAD_INFORMATION`), and ReactOS fills them from the `KTHREAD`
//! (`ntoskrnl/ex/sysinfo.c`, `SystemProcessInformation`). The Windows build
//! checks these offsets against windows-sys's declarations.

use std::fmt;

/// `KTHREAD_STATE`: where the scheduler has a thread (ReactOS
/// `sdk/include/ndk/ketypes.h`; phnt `ntkeapi.h`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ThreadState(pub u8);

impl ThreadState {
    /// Created, not started.
    pub const INITIALIZED: Self = Self(0);
    /// Ready to run, waiting for a processor.
    pub const READY: Self = Self(1);
    /// Running on a processor.
    pub const RUNNING: Self = Self(2);
    /// Chosen to run next on a processor.
    pub const STANDBY: Self = Self(3);
    /// Ended.
    pub const TERMINATED: Self = Self(4);
    /// Blocked in a wait (its reason says on what).
    pub const WAITING: Self = Self(5);
    /// Ready, its kernel stack paged out.
    pub const TRANSITION: Self = Self(6);
    /// Ready, not yet placed on a processor's queue.
    pub const DEFERRED_READY: Self = Self(7);
    const NAMES: [&'static str; 10] = [
        "initialized",
        "ready",
        "running",
        "standby",
        "terminated",
        "waiting",
        "transition",
        "deferred-ready",
        "gate-wait",
        "waiting-for-process-in-swap",
    ];

    /// The state's name, lower case (`state-N` for a value past the table).
    #[must_use]
    pub fn name(self) -> String {
        Self::NAMES
            .get(usize::from(self.0))
            .map_or_else(|| format!("state-{}", self.0), |&name| name.to_owned())
    }

    /// The state named `name` (as [`Self::name`] spells it).
    #[must_use]
    pub fn from_name(name: &str) -> Option<Self> {
        let index = Self::NAMES.iter().position(|&known| known == name)?;
        u8::try_from(index).ok().map(Self)
    }

    /// On a processor: the one state a sample counts as on-CPU.
    #[must_use]
    pub const fn on_cpu(self) -> bool {
        self.0 == Self::RUNNING.0
    }
}

/// `KWAIT_REASON` (wdm.h): what a waiting thread waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WaitReason(pub u8);

impl WaitReason {
    /// Suspended (`SuspendThread`).
    pub const SUSPENDED: Self = Self(5);
    const NAMES: [&'static str; 40] = [
        "Executive",
        "FreePage",
        "PageIn",
        "PoolAllocation",
        "DelayExecution",
        "Suspended",
        "UserRequest",
        "WrExecutive",
        "WrFreePage",
        "WrPageIn",
        "WrPoolAllocation",
        "WrDelayExecution",
        "WrSuspended",
        "WrUserRequest",
        "WrSpare0",
        "WrQueue",
        "WrLpcReceive",
        "WrLpcReply",
        "WrVirtualMemory",
        "WrPageOut",
        "WrRendezvous",
        "WrKeyedEvent",
        "WrTerminated",
        "WrProcessInSwap",
        "WrCpuRateControl",
        "WrCalloutStack",
        "WrKernel",
        "WrResource",
        "WrPushLock",
        "WrMutex",
        "WrQuantumEnd",
        "WrDispatchInt",
        "WrPreempted",
        "WrYieldExecution",
        "WrFastMutex",
        "WrGuardedMutex",
        "WrRundown",
        "WrAlertByThreadId",
        "WrDeferredPreempt",
        "WrPhysicalFault",
    ];

    /// The reason's name as wdm.h spells it (`WaitReason-N` past the
    /// table: newer kernels add reasons).
    #[must_use]
    pub fn name(self) -> String {
        Self::NAMES
            .get(usize::from(self.0))
            .map_or_else(|| format!("WaitReason-{}", self.0), |&name| name.to_owned())
    }
}

/// One thread's facts at a listing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThreadFacts {
    /// Where the scheduler had it; `None` where the system does not say
    /// (Wine: see [`parse_process_information`]).
    pub state: Option<ThreadState>,
    /// What it waited for (meaningful when waiting).
    pub wait_reason: WaitReason,
    /// How many times it was switched to a processor.
    pub context_switches: u32,
    /// Time it ran in kernel mode, 100 ns units.
    pub kernel_time: u64,
    /// Time it ran in user mode, 100 ns units.
    pub user_time: u64,
    /// When it was created (system time): with its id, which thread this
    /// is (ids are reused).
    pub create_time: u64,
}

impl ThreadFacts {
    /// Kernel and user time together, 100 ns units.
    #[must_use]
    pub const fn cpu_time(&self) -> u64 {
        self.kernel_time.saturating_add(self.user_time)
    }

    /// Whether it was blocked in a wait.
    #[must_use]
    pub fn waiting(&self) -> bool {
        self.state == Some(ThreadState::WAITING)
    }

    /// The state, and for a waiting thread what it waited for:
    /// `running`, `waiting (UserRequest)`, `state unknown`.
    #[must_use]
    pub fn state_text(&self) -> String {
        state_text(self.state, self.wait_reason)
    }
}

/// `state`, and for a waiting thread what it waited for: `running`,
/// `waiting (UserRequest)`, `state unknown`.
#[must_use]
pub fn state_text(state: Option<ThreadState>, wait_reason: WaitReason) -> String {
    match state {
        None => "state unknown".to_owned(),
        Some(ThreadState::WAITING) => {
            format!("{} ({})", ThreadState::WAITING.name(), wait_reason.name())
        }
        Some(state) => state.name(),
    }
}

/// One thread of a listing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessThread {
    /// The process it belongs to.
    pub process_id: u32,
    /// The thread.
    pub thread_id: u32,
    /// What it was doing (`None`: listed by Toolhelp, which knows ids only).
    pub facts: Option<ThreadFacts>,
}

/// Why a `SystemProcessInformation` reply could not be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MalformedListing {
    /// The offset of the process entry that does not fit.
    pub offset: usize,
    /// Bytes received.
    pub bytes: usize,
}

impl fmt::Display for MalformedListing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the system's process listing has an entry at byte {} that does not fit its {} bytes",
            self.offset, self.bytes
        )
    }
}

impl std::error::Error for MalformedListing {}

/// Which call listed the threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListingSource {
    /// `SystemProcessInformation`: ids and facts.
    ProcessInformation,
    /// Toolhelp, ids only: `NtQuerySystemInformation` failed with this
    /// NTSTATUS (or its reply was malformed: `None`).
    Toolhelp {
        /// The failing NTSTATUS.
        status: Option<i32>,
    },
}

impl ListingSource {
    /// The note a command prints once when the facts are missing.
    #[must_use]
    pub fn fallback_note(self) -> Option<String> {
        match self {
            Self::ProcessInformation => None,
            Self::Toolhelp { status } => Some(format!(
                "kstack: threads listed by Toolhelp, without their state, wait reason or CPU \
                 time: NtQuerySystemInformation(SystemProcessInformation) {}",
                status.map_or_else(
                    || "returned a malformed reply".to_owned(),
                    |status| format!("failed with {status:#010x}")
                )
            )),
        }
    }
}

/// Every thread of the machine at one moment, and which call listed them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listing {
    /// The threads, in the system's order.
    pub threads: Vec<ProcessThread>,
    /// Which call listed them.
    pub source: ListingSource,
}

/// Why a process's threads could not be listed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThreadListError {
    /// Off Windows there are no Windows threads to list.
    NeedsWindows,
    /// Both `NtQuerySystemInformation` and `CreateToolhelp32Snapshot`
    /// failed.
    Snapshot {
        /// Toolhelp's Win32 error.
        code: u32,
    },
    /// The listing holds no thread of this process: no process has the id
    /// (or it exited).
    NoThreads {
        /// The process asked for.
        process_id: u32,
    },
}

impl fmt::Display for ThreadListError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NeedsWindows => write!(
                f,
                "listing a process's threads needs Windows (or Wine): name the threads with --tid"
            ),
            Self::Snapshot { code } => write!(
                f,
                "cannot list the threads of the running processes (CreateToolhelp32Snapshot: \
                 Win32 error {code})"
            ),
            Self::NoThreads { process_id } => write!(
                f,
                "no thread of process {process_id} is running: no process has that id (or it \
                 exited)"
            ),
        }
    }
}

impl std::error::Error for ThreadListError {}

/// Every thread of each of `process_ids` (in the order given, each
/// process's threads in the system's order), from one listing.
///
/// # Errors
/// [`ThreadListError`]: the listing failed, a process has no thread in it,
/// or the host is not Windows.
pub fn threads_of(process_ids: &[u32]) -> Result<Listing, ThreadListError> {
    let listing = platform::list_threads()?;
    Ok(Listing {
        threads: select(&listing.threads, process_ids)?,
        source: listing.source,
    })
}

/// Every thread of the machine, from one listing (`kstack sample` lists
/// them at every tick and keeps those of the processes it samples).
///
/// # Errors
/// [`ThreadListError`]: the listing failed, or the host is not Windows.
pub fn all_threads() -> Result<Listing, ThreadListError> {
    platform::list_threads()
}

/// The threads of `listed` that belong to `process_ids`, grouped by
/// process in the order given; a process asked for twice is listed once.
fn select(
    listed: &[ProcessThread],
    process_ids: &[u32],
) -> Result<Vec<ProcessThread>, ThreadListError> {
    let mut selected = Vec::new();
    for (index, &process_id) in process_ids.iter().enumerate() {
        if process_ids[..index].contains(&process_id) {
            continue;
        }
        let before = selected.len();
        selected.extend(
            listed
                .iter()
                .filter(|thread| thread.process_id == process_id),
        );
        if selected.len() == before {
            return Err(ThreadListError::NoThreads { process_id });
        }
    }
    Ok(selected)
}

#[cfg(windows)]
mod platform {
    use windows_sys::Win32::System::WindowsProgramming::{
        SYSTEM_PROCESS_INFORMATION, SYSTEM_THREAD_INFORMATION,
    };

    use super::{
        CONTEXT_SWITCHES, Listing, ListingSource, PROCESS_ENTRY_SIZE, PROCESS_ID, ProcessThread,
        THREAD_ENTRY_SIZE, THREAD_ID, THREAD_STATE, ThreadListError, parse_process_information,
    };
    use crate::{system_information, toolhelp};

    // The parser's offsets are windows-sys's (winternl.h's) where it names
    // the field; the times and the switch count are its `Reserved` fields.
    const _: () = {
        assert!(size_of::<SYSTEM_PROCESS_INFORMATION>() == PROCESS_ENTRY_SIZE);
        assert!(core::mem::offset_of!(SYSTEM_PROCESS_INFORMATION, UniqueProcessId) == PROCESS_ID);
        assert!(size_of::<SYSTEM_THREAD_INFORMATION>() == THREAD_ENTRY_SIZE);
        assert!(core::mem::offset_of!(SYSTEM_THREAD_INFORMATION, ClientId) + 8 == THREAD_ID);
        assert!(core::mem::offset_of!(SYSTEM_THREAD_INFORMATION, Reserved3) == CONTEXT_SWITCHES);
        assert!(core::mem::offset_of!(SYSTEM_THREAD_INFORMATION, ThreadState) == THREAD_STATE);
    };

    /// `SystemProcessInformation`'s class (winternl.h).
    const SYSTEM_PROCESS_INFORMATION_CLASS: i32 = 5;

    /// Every thread of the system with its facts, else Toolhelp's ids.
    pub(super) fn list_threads() -> Result<Listing, ThreadListError> {
        let status = match system_information::query(SYSTEM_PROCESS_INFORMATION_CLASS) {
            Ok(bytes) => match parse_process_information(&bytes) {
                Ok(threads) => {
                    return Ok(Listing {
                        threads,
                        source: ListingSource::ProcessInformation,
                    });
                }
                Err(_) => None,
            },
            Err(status) => Some(status),
        };
        let threads = toolhelp::list_threads()
            .map_err(|code| ThreadListError::Snapshot { code })?
            .into_iter()
            .map(|(process_id, thread_id)| ProcessThread {
                process_id,
                thread_id,
                facts: None,
            })
            .collect();
        Ok(Listing {
            threads,
            source: ListingSource::Toolhelp { status },
        })
    }
}

#[cfg(not(windows))]
mod platform {
    use super::{Listing, ThreadListError};

    /// Off Windows there is nothing to list.
    pub(super) fn list_threads() -> Result<Listing, ThreadListError> {
        Err(ThreadListError::NeedsWindows)
    }
}

/// `sizeof(SYSTEM_PROCESS_INFORMATION)` on x64: its threads follow.
pub const PROCESS_ENTRY_SIZE: usize = 256;
/// `SYSTEM_PROCESS_INFORMATION.UniqueProcessId`.
pub const PROCESS_ID: usize = 80;
/// `sizeof(SYSTEM_THREAD_INFORMATION)` on x64.
pub const THREAD_ENTRY_SIZE: usize = 80;
/// `SYSTEM_THREAD_INFORMATION.KernelTime`, then `UserTime` at 8.
const KERNEL_TIME: usize = 0;
const USER_TIME: usize = 8;
const CREATE_TIME: usize = 16;
/// `SYSTEM_THREAD_INFORMATION.ClientId.UniqueThread`.
pub const THREAD_ID: usize = 48;
/// `SYSTEM_THREAD_INFORMATION.ContextSwitches` (winternl.h: `Reserved3`).
pub const CONTEXT_SWITCHES: usize = 64;
/// `SYSTEM_THREAD_INFORMATION.ThreadState`, then `WaitReason` at 72.
pub const THREAD_STATE: usize = 68;
const WAIT_REASON: usize = 72;

/// Parses an x64 `SystemProcessInformation` reply: every thread of every
/// process, in the system's order. Ids are the handles' low 32 bits (ids
/// are below 2^32 on every Windows).
///
/// A reply in which no thread was ever switched to carries no states:
/// Wine zeroes the state, the wait reason and the switch count of every
/// thread and fills only ids, priorities and times (`dlls/ntdll/unix/
/// system.c`, `get_system_process_info`), where Windows counts at least
/// the listing thread itself as switched to. Its states read as `None`,
/// not as "initialized".
///
/// # Errors
/// [`MalformedListing`] when an entry, or its threads, run past the bytes
/// or the next entry does not move forward.
pub fn parse_process_information(bytes: &[u8]) -> Result<Vec<ProcessThread>, MalformedListing> {
    let mut threads = Vec::new();
    let mut offset = 0;
    loop {
        let malformed = MalformedListing {
            offset,
            bytes: bytes.len(),
        };
        let header = bytes
            .get(offset..)
            .and_then(|rest| rest.get(..PROCESS_ENTRY_SIZE))
            .ok_or(malformed)?;
        let next = usize::try_from(u32_at(header, 0)).map_err(|_| malformed)?;
        let count = usize::try_from(u32_at(header, 4)).map_err(|_| malformed)?;
        let process_id = low_u32(u64_at(header, PROCESS_ID));
        let entries = count
            .checked_mul(THREAD_ENTRY_SIZE)
            .and_then(|size| bytes.get(offset + PROCESS_ENTRY_SIZE..)?.get(..size))
            .ok_or(malformed)?;
        threads.extend(
            entries
                .chunks_exact(THREAD_ENTRY_SIZE)
                .map(|entry| ProcessThread {
                    process_id,
                    thread_id: low_u32(u64_at(entry, THREAD_ID)),
                    facts: Some(ThreadFacts {
                        state: Some(ThreadState(low_u8(u32_at(entry, THREAD_STATE)))),
                        wait_reason: WaitReason(low_u8(u32_at(entry, WAIT_REASON))),
                        context_switches: u32_at(entry, CONTEXT_SWITCHES),
                        kernel_time: u64_at(entry, KERNEL_TIME),
                        user_time: u64_at(entry, USER_TIME),
                        create_time: u64_at(entry, CREATE_TIME),
                    }),
                }),
        );
        if next == 0 {
            let never_switched = threads
                .iter()
                .filter_map(|thread| thread.facts.as_ref())
                .all(|facts| facts.context_switches == 0);
            if never_switched {
                for facts in threads
                    .iter_mut()
                    .filter_map(|thread| thread.facts.as_mut())
                {
                    facts.state = None;
                }
            }
            return Ok(threads);
        }
        // Entries only move forward, so a bad offset cannot loop.
        offset = offset.checked_add(next).ok_or(malformed)?;
    }
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap_or_default())
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or_default())
}

/// The low 32 bits (an id handle).
fn low_u32(value: u64) -> u32 {
    u32::try_from(value & u64::from(u32::MAX)).unwrap_or(u32::MAX)
}

/// The low byte, saturated: states and reasons fit a byte; a larger value
/// reads as 255 (named `state-255`, not mistaken for another).
fn low_u8(value: u32) -> u8 {
    u8::try_from(value).unwrap_or(u8::MAX)
}

#[cfg(test)]
pub(crate) mod tests {
    use proptest::prelude::*;

    use super::*;

    const fn thread(process_id: u32, thread_id: u32) -> ProcessThread {
        ProcessThread {
            process_id,
            thread_id,
            facts: None,
        }
    }

    #[test]
    fn the_threads_of_each_process_asked_for_are_selected_in_its_order() {
        let listed = [
            thread(4, 8),
            thread(100, 104),
            thread(4, 12),
            thread(200, 204),
        ];
        assert_eq!(
            select(&listed, &[100, 4, 100]),
            Ok(vec![thread(100, 104), thread(4, 8), thread(4, 12)])
        );
        assert_eq!(
            select(&listed, &[4, 300]),
            Err(ThreadListError::NoThreads { process_id: 300 })
        );
    }

    #[cfg(not(windows))]
    #[test]
    fn off_windows_the_listing_says_it_needs_windows() {
        let error = threads_of(&[4]).unwrap_err();
        assert_eq!(error, ThreadListError::NeedsWindows);
        assert!(error.to_string().contains("--tid"), "{error}");
    }

    #[test]
    fn the_fallback_says_why_once_asked() {
        assert_eq!(ListingSource::ProcessInformation.fallback_note(), None);
        let note = ListingSource::Toolhelp {
            status: Some(0xC000_0002_u32.cast_signed()),
        }
        .fallback_note()
        .unwrap();
        assert!(
            note.contains("0xc0000002") && note.contains("Toolhelp"),
            "{note}"
        );
    }

    /// A reply with these processes, each with its threads, as the kernel
    /// lays it out.
    pub(crate) fn reply(processes: &[(u32, Vec<(u32, ThreadFacts)>)]) -> Vec<u8> {
        let mut bytes = Vec::new();
        for (index, (process_id, threads)) in processes.iter().enumerate() {
            let start = bytes.len();
            let size = PROCESS_ENTRY_SIZE + THREAD_ENTRY_SIZE * threads.len();
            bytes.resize(start + size, 0xCC);
            let entry = &mut bytes[start..];
            let next = if index + 1 == processes.len() {
                0
            } else {
                size
            };
            entry[0..4].copy_from_slice(&u32::try_from(next).unwrap().to_le_bytes());
            entry[4..8].copy_from_slice(&u32::try_from(threads.len()).unwrap().to_le_bytes());
            entry[PROCESS_ID..PROCESS_ID + 8]
                .copy_from_slice(&u64::from(*process_id).to_le_bytes());
            for (slot, (thread_id, facts)) in threads.iter().enumerate() {
                let thread = &mut entry[PROCESS_ENTRY_SIZE + slot * THREAD_ENTRY_SIZE..];
                thread[..8].copy_from_slice(&facts.kernel_time.to_le_bytes());
                thread[8..16].copy_from_slice(&facts.user_time.to_le_bytes());
                thread[16..24].copy_from_slice(&facts.create_time.to_le_bytes());
                thread[40..48].copy_from_slice(&u64::from(*process_id).to_le_bytes());
                thread[THREAD_ID..THREAD_ID + 8]
                    .copy_from_slice(&u64::from(*thread_id).to_le_bytes());
                thread[CONTEXT_SWITCHES..CONTEXT_SWITCHES + 4]
                    .copy_from_slice(&facts.context_switches.to_le_bytes());
                thread[THREAD_STATE..THREAD_STATE + 4].copy_from_slice(
                    &u32::from(facts.state.map_or(0, |state| state.0)).to_le_bytes(),
                );
                thread[WAIT_REASON..WAIT_REASON + 4]
                    .copy_from_slice(&u32::from(facts.wait_reason.0).to_le_bytes());
            }
        }
        bytes
    }

    fn facts(state: ThreadState, switches: u32, cpu: u64) -> ThreadFacts {
        ThreadFacts {
            state: Some(state),
            wait_reason: WaitReason(6),
            context_switches: switches,
            kernel_time: cpu,
            user_time: 2 * cpu,
            create_time: u64::from(switches) + 77,
        }
    }

    #[test]
    fn every_thread_of_every_process_is_read_with_its_facts() {
        let busy = facts(ThreadState::RUNNING, 7, 100);
        let idle = facts(ThreadState::WAITING, 3, 5);
        let bytes = reply(&[
            (0, vec![]),
            (4, vec![(8, idle)]),
            (1000, vec![(1004, busy), (1008, idle)]),
        ]);
        let threads = parse_process_information(&bytes).unwrap();
        let seen: Vec<(u32, u32, Option<ThreadFacts>)> = threads
            .iter()
            .map(|thread| (thread.process_id, thread.thread_id, thread.facts))
            .collect();
        assert_eq!(
            seen,
            [
                (4, 8, Some(idle)),
                (1000, 1004, Some(busy)),
                (1000, 1008, Some(idle))
            ]
        );
        assert_eq!(busy.cpu_time(), 300);
        assert!(idle.waiting() && !busy.waiting());
        assert_eq!(
            (idle.state_text(), busy.state_text()),
            ("waiting (UserRequest)".to_owned(), "running".to_owned())
        );
    }

    #[test]
    fn a_reply_without_switch_counts_has_no_states() {
        let as_wine = ThreadFacts {
            context_switches: 0,
            ..facts(ThreadState::INITIALIZED, 0, 4)
        };
        let bytes = reply(&[(100, vec![(104, as_wine), (108, as_wine)])]);
        let threads = parse_process_information(&bytes).unwrap();
        let facts = threads[0].facts.unwrap();
        assert_eq!((facts.state, facts.cpu_time()), (None, 12));
        assert_eq!(facts.state_text(), "state unknown");
        assert!(!facts.waiting());
    }

    #[test]
    fn names_are_the_headers_and_unknown_values_are_named_by_number() {
        assert_eq!(ThreadState::RUNNING.name(), "running");
        assert_eq!(ThreadState(200).name(), "state-200");
        assert_eq!(
            ThreadState::from_name("deferred-ready"),
            Some(ThreadState::DEFERRED_READY)
        );
        assert_eq!(ThreadState::from_name("asleep"), None);
        assert_eq!(WaitReason(6).name(), "UserRequest");
        assert_eq!(WaitReason(39).name(), "WrPhysicalFault");
        assert_eq!(WaitReason(41).name(), "WaitReason-41");
        assert!(ThreadState::RUNNING.on_cpu() && !ThreadState::READY.on_cpu());
    }

    proptest! {
        /// Cut anywhere or with any byte changed, a reply is read or
        /// refused, never a panic; cut inside an entry, it is refused.
        #[test]
        fn damaged_replies_are_refused_not_misread(cut in 0..1200_usize, at in 0..1200_usize, byte: u8) {
            let idle = facts(ThreadState::WAITING, 1, 1);
            let bytes = reply(&[(4, vec![(8, idle)]), (100, vec![(104, idle), (108, idle)]), (200, vec![])]);
            let whole = bytes.len();
            let cut = cut.min(whole);
            let result = parse_process_information(&bytes[..cut]);
            prop_assert_eq!(result.is_ok(), cut == whole);
            let mut changed = bytes.clone();
            let at = at % whole;
            changed[at] = byte;
            let _ = parse_process_information(&changed);
        }
    }
}
