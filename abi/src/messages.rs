//! Request and response layouts. Requests start with `abi_version` and
//! `size`; the status response starts with the same two words, at the same
//! offsets in every ABI version, so any client can tell a mismatch.

use crate::{
    ABI_VERSION, Altitude, CaptureConfig, HostRoutine, PagingExecutive, PagingInEffect, Records,
    Source, SourceFacts, UserPart,
    config::CAPTURE_CONFIG_SIZE,
    error::DecodeError,
    ntstatus::NtStatus,
    wire::{Reader, Writer},
    wire_types::wire_enum,
};

/// `abi_version` and `size`: the prefix of requests and of the status response.
pub const STATUS_PREFIX_SIZE: usize = 8;
/// Configure request: prefix, then a [`CaptureConfig`].
pub const CONFIGURE_REQUEST_SIZE: usize = STATUS_PREFIX_SIZE + CAPTURE_CONFIG_SIZE;
/// Capture-now request: prefix, then a caller tag (u64).
pub const CAPTURE_NOW_REQUEST_SIZE: usize = STATUS_PREFIX_SIZE + 8;
/// Read response header.
pub const READ_HEADER_SIZE: usize = 24;
/// Bytes per source in the status response.
const SOURCE_STATUS_SIZE: usize = 56 + 8 * UserPart::COUNT;
/// Offset of the configuration in force in the status response.
const CONFIG_OFFSET: usize = 32;
/// Offset of `dropped`, `cleared` and `sequences_spent` (u64 each), after
/// the configuration.
const COUNTERS_OFFSET: usize = CONFIG_OFFSET + CAPTURE_CONFIG_SIZE;
/// Offset of the per-source part of the status response.
const SOURCES_OFFSET: usize = COUNTERS_OFFSET + 24;
/// Offset of the driver's image range, after the per-source part.
const DRIVER_IMAGE_OFFSET: usize = SOURCES_OFFSET + SOURCE_STATUS_SIZE * Source::COUNT;
/// Offset of the ring's shard count (u32), then the bytes in use (u32),
/// after the image range (a u64 base, a u32 size) and `apc_take_back` (a
/// [`HostRoutine`] u32).
const RING_SHARDS_OFFSET: usize = DRIVER_IMAGE_OFFSET + 16;
/// Offset of the records read so far (u64), after the shard count.
const READ_OFFSET: usize = RING_SHARDS_OFFSET + 8;
/// Offset of the two callback altitudes in use, object then registry
/// (each a u32 whole part, a u16 fraction, 2 reserved zero bytes; whole 0:
/// not registered), after the records read.
const ALTITUDES_OFFSET: usize = READ_OFFSET + 8;
/// Offset of whether `DisablePagingExecutive` is in effect (a
/// [`PagingInEffect`] u32, 4 reserved zero bytes), then the key's last write
/// time and the boot time compared against (u64 each), after the altitudes.
const PAGING_OFFSET: usize = ALTITUDES_OFFSET + 16;
/// Offset of the stack table's part ([`StackTableStatus`]: `entries` and
/// `used` u32, then `hits`, `inserts`, `evictions`, `collisions`, `full`,
/// `busy`, `empty` and `sent`, u64 each), after the paging part.
const STACK_TABLE_OFFSET: usize = PAGING_OFFSET + 24;
/// Offset of whether the driver can walk user stacks (a [`HostRoutine`] u32,
/// 4 reserved zero bytes), after the stack table's part.
const USER_WALK_OFFSET: usize = STACK_TABLE_OFFSET + 72;
/// Offset of whether module records carry process keys (a [`HostRoutine`]
/// u32, 4 reserved zero bytes), then the module records that entered the
/// ring (u64), after the user-walk part.
const MODULES_OFFSET: usize = USER_WALK_OFFSET + 8;
/// Offset of whether the driver can queue APCs (a [`HostRoutine`] u32, 4
/// reserved zero bytes), after the module part.
const APC_OFFSET: usize = MODULES_OFFSET + 16;
/// Offset of the capture-threads counters ([`ThreadCaptureStatus`]), after
/// the APC part.
const THREAD_CAPTURES_OFFSET: usize = APC_OFFSET + 8;
/// The whole status response.
pub const STATUS_RESPONSE_SIZE: usize = THREAD_CAPTURES_OFFSET + ThreadCaptureStatus::SIZE;

fn encode_prefix(w: &mut Writer<'_>, size: usize) {
    w.u32(0, ABI_VERSION);
    #[expect(
        clippy::cast_possible_truncation,
        reason = "message sizes are small constants"
    )]
    w.u32(4, size as u32);
}

/// Checks the first word of a message of either direction: this ABI
/// version. Every request, the status response and the read header start
/// with it, in every ABI version.
fn check_abi_version(r: Reader<'_>) -> Result<(), DecodeError> {
    let abi_version = r.u32(0)?;
    if abi_version != ABI_VERSION {
        return Err(DecodeError::AbiVersion {
            ours: ABI_VERSION,
            theirs: abi_version,
        });
    }
    Ok(())
}

/// Checks a request's (or the status response's) prefix: this ABI version,
/// then a `size` word of exactly `size` bytes.
fn check_prefix(r: Reader<'_>, size: usize) -> Result<(), DecodeError> {
    check_abi_version(r)?;
    let declared = r.u32(4)?;
    if usize::try_from(declared).ok() != Some(size) {
        return Err(DecodeError::SizeField {
            expected: size,
            declared,
        });
    }
    Ok(())
}

/// The configure request: replace the capture configuration.
#[must_use]
pub fn encode_configure_request(config: &CaptureConfig) -> [u8; CONFIGURE_REQUEST_SIZE] {
    encode_request(|w| {
        config.encode(w, STATUS_PREFIX_SIZE);
    })
}

/// Decodes and validates a configure request.
///
/// # Errors
/// A [`DecodeError`]; [`DecodeError::ntstatus`] gives the status to return.
pub fn decode_configure_request(bytes: &[u8]) -> Result<CaptureConfig, DecodeError> {
    let r = request_body(bytes, CONFIGURE_REQUEST_SIZE)?;
    CaptureConfig::decode(r, STATUS_PREFIX_SIZE)
}

/// The capture-now request; `tag` comes back in the record's facts.
#[must_use]
pub fn encode_capture_now_request(tag: u64) -> [u8; CAPTURE_NOW_REQUEST_SIZE] {
    encode_request(|w| {
        w.u64(STATUS_PREFIX_SIZE, tag);
    })
}

/// Decodes a capture-now request; returns its tag.
///
/// # Errors
/// A [`DecodeError`]; [`DecodeError::ntstatus`] gives the status to return.
pub fn decode_capture_now_request(bytes: &[u8]) -> Result<u64, DecodeError> {
    let r = request_body(bytes, CAPTURE_NOW_REQUEST_SIZE)?;
    r.u64(STATUS_PREFIX_SIZE)
}

/// The test-injection request (only a driver built with the
/// `test-injection` feature serves it): prefix, source (u8, then 7 bytes
/// written as zeros and not looked at), the source's three fact words.
pub const INJECT_REQUEST_SIZE: usize = STATUS_PREFIX_SIZE + 8 + 24;

/// The name an injected image load gives the load-image callback, so its
/// module record's path is known to the test that injected it.
pub const INJECTED_IMAGE_PATH: &str = r"\Device\HarddiskVolume1\kstack-injected\app.exe";

/// The test-injection request: run `facts`' source callback in the driver
/// with synthetic arguments built from the facts (an image load is named
/// [`INJECTED_IMAGE_PATH`]).
#[must_use]
pub fn encode_inject_request(facts: &SourceFacts) -> [u8; INJECT_REQUEST_SIZE] {
    encode_request(|w| {
        w.u8(STATUS_PREFIX_SIZE, facts.source() as u8);
        for (index, word) in facts.to_words().into_iter().enumerate() {
            w.u64(STATUS_PREFIX_SIZE + 8 + 8 * index, word);
        }
    })
}

/// Decodes a test-injection request; returns the facts to inject.
///
/// # Errors
/// A [`DecodeError`]; [`DecodeError::ntstatus`] gives the status to return.
pub fn decode_inject_request(bytes: &[u8]) -> Result<SourceFacts, DecodeError> {
    let r = request_body(bytes, INJECT_REQUEST_SIZE)?;
    let value = r.u8(STATUS_PREFIX_SIZE)?;
    let source = Source::from_wire(value).ok_or(DecodeError::UnknownSource { value })?;
    let word = |index: usize| r.u64(STATUS_PREFIX_SIZE + 8 + 8 * index);
    SourceFacts::from_words(source, [word(0)?, word(1)?, word(2)?])
}

/// The test fault-probe request (only a driver built with the
/// `test-injection` feature serves it): prefix, then the target (u8 as
/// [`FaultProbe`], then 7 zero bytes). The reply is 8 bytes: the value the
/// probe read inside the driver's exception scope (its low 32 bits), or
/// `u64::MAX` when the read raised an exception that the scope caught.
pub const FAULT_PROBE_REQUEST_SIZE: usize = STATUS_PREFIX_SIZE + 8;
/// The fault-probe reply's size.
pub const FAULT_PROBE_REPLY_SIZE: usize = 8;

wire_enum! {
/// What the fault probe reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultProbe: u8 {
    /// A word of the driver's own stack, holding [`FaultProbe::MAPPED_VALUE`].
    Mapped = 0,
    /// User address 8, never mapped on Windows or under Wine: the read
    /// raises an access violation.
    Unmapped = 1,
}
}

impl FaultProbe {
    /// The 32-bit value the driver puts in the mapped word.
    pub const MAPPED_VALUE: u32 = 0x6B73_7461;
}

/// The test fault-probe request for `target`.
#[must_use]
pub fn encode_fault_probe_request(target: FaultProbe) -> [u8; FAULT_PROBE_REQUEST_SIZE] {
    encode_request(|w| {
        w.u8(STATUS_PREFIX_SIZE, target as u8);
    })
}

/// Decodes a test fault-probe request.
///
/// # Errors
/// A [`DecodeError`]; [`DecodeError::ntstatus`] gives the status to return.
pub fn decode_fault_probe_request(bytes: &[u8]) -> Result<FaultProbe, DecodeError> {
    let r = request_body(bytes, FAULT_PROBE_REQUEST_SIZE)?;
    let value = r.u64(STATUS_PREFIX_SIZE)?;
    u8::try_from(value)
        .ok()
        .and_then(FaultProbe::from_wire)
        .ok_or(DecodeError::UnknownProbeTarget { value })
}

/// A request of `N` bytes: the prefix, then what `body` writes.
pub(crate) fn encode_request<const N: usize>(body: impl FnOnce(&mut Writer<'_>)) -> [u8; N] {
    let mut bytes = [0; N];
    let mut w = Writer::new(&mut bytes);
    encode_prefix(&mut w, N);
    body(&mut w);
    bytes
}

/// `bytes` as a request of exactly `size` bytes with this ABI's prefix.
pub(crate) fn request_body(bytes: &[u8], size: usize) -> Result<Reader<'_>, DecodeError> {
    check_exact_length(bytes, size)?;
    let r = Reader::new(bytes);
    check_prefix(r, size)?;
    Ok(r)
}

pub(crate) const fn check_exact_length(bytes: &[u8], size: usize) -> Result<(), DecodeError> {
    if bytes.len() == size {
        Ok(())
    } else {
        Err(DecodeError::Length {
            expected: size,
            actual: bytes.len(),
        })
    }
}

/// One source's part of the status response. Layout (144 bytes):
/// `registration` i32, state u32 (bit 0: available), then the counters
/// `captured`, `skipped_irql`, `skipped_stack`, `filtered`, `not_kept`,
/// `sampled_out`, then `user_parts` in [`UserPart::ALL`] order, u64 each.
///
/// The counters count events of an enabled source (a disabled source's
/// events are not looked at), each event under exactly one of them, from
/// load on (a clear resets none). An event meets, in this order, the
/// process filter (`filtered`), the sampling (`sampled_out`), the paging
/// policy and the stack check (`skipped_irql`, `skipped_stack`), then the
/// ring (`captured`, of which the ring's `dropped` are the ones that found
/// their shard full). So for every enabled source, the events that reached
/// its callback are `captured + filtered + sampled_out + skipped_irql +
/// skipped_stack`.
///
/// Capture-now requests are counted whether or not the on-demand source
/// is enabled, each under exactly one counter, in another order (see
/// [`crate::Ioctl::CaptureNow`]): the paging policy and the stack check
/// first (`skipped_irql`, `skipped_stack`: the request fails), then
/// whether the source is enabled (`not_kept`), then the process filter
/// (`filtered`), then the ring (`captured`); never sampled. So the
/// on-demand source's counters add up to every capture-now request that
/// passed the length and version checks.
///
/// Thread-stack events, one per capture-threads APC delivered in its
/// thread ([`ThreadCaptureStatus::delivered`]), are
/// counted as callback events are, in the same order; an APC delivered
/// after the source was disabled is counted as `not_kept`, without a walk.
/// So the thread-stack source's counters add up to `delivered`.
///
/// - `captured`: records that entered the ring, kept or dropped because
///   their shard was full. Summed over sources, plus
///   [`StatusResponse::module_records`], it equals
///   [`StatusResponse::sequences_spent`]: every sequence number is one
///   captured trace record or one module record.
/// - `skipped_irql`: no walk, the IRQL too high for the paging policy
///   (`DISPATCH_LEVEL` or above while `DisablePagingExecutive`=1 is not in
///   effect, see [`crate::paging`]).
/// - `skipped_stack`: no walk, less kernel stack left than a walk needs
///   (8 KiB, checked before walking; for capture-now the request fails
///   with `KSTACK_STATUS_STACK_TOO_LOW`).
/// - `filtered`: left out by the process filter, not walked (for
///   capture-now, with the on-demand source enabled: walked and answered,
///   not kept).
/// - `not_kept`: capture-now: answered to its caller, not kept, because
///   the on-demand source is disabled, whatever the process filter says of
///   the caller. With `skipped_irql`, `skipped_stack` and `user_parts` of
///   capture-nows, the counters a disabled source can move. Thread-stack:
///   an APC delivered after its source was disabled, not walked.
/// - `sampled_out`: admitted by the process filter, then not kept by the
///   source's sampling (see [`CaptureConfig::sample_every`]); no walk.
///
/// Every walked event becomes one record, kept, dropped or answered only,
/// and every record says what happened to its user part, so the sum of
/// `user_parts` = `captured + not_kept`, and for the on-demand source
/// `+ filtered` too (a capture-now from a process the lists leave out is
/// still walked and answered), but for the thread-stack source, `captured`
/// alone (its `not_kept` are not walked); exact when no capture is under
/// way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SourceStatus {
    /// The NTSTATUS of registering the source's callback at load
    /// (`STATUS_NOT_SUPPORTED` when the kernel lacks the routine).
    pub registration: NtStatus,
    /// Whether the source can be enabled.
    pub available: bool,
    /// Records that entered the ring (published or dropped).
    pub captured: u64,
    /// Events where no walk was made because the IRQL was too high for the
    /// paging policy.
    pub skipped_irql: u64,
    /// Events where no walk was made because too little kernel stack was
    /// left.
    pub skipped_stack: u64,
    /// Events left out by the process filter.
    pub filtered: u64,
    /// Capture-now records answered to the caller only (the on-demand
    /// source disabled).
    pub not_kept: u64,
    /// Events not kept by the source's sampling (no walk).
    pub sampled_out: u64,
    /// Records by what happened to their user part, in [`UserPart::ALL`]
    /// order ([`SourceStatus::user_part`] reads one).
    pub user_parts: [u64; UserPart::COUNT],
}

impl SourceStatus {
    /// Nothing registered, nothing counted.
    pub const ZERO: Self = Self {
        registration: 0,
        available: false,
        captured: 0,
        skipped_irql: 0,
        skipped_stack: 0,
        filtered: 0,
        not_kept: 0,
        sampled_out: 0,
        user_parts: [0; UserPart::COUNT],
    };

    /// Decodes the source part at `at` of a status response.
    fn decode(r: Reader<'_>, at: usize) -> Result<Self, DecodeError> {
        let state = r.u32(at + 4)?;
        if state & !SOURCE_AVAILABLE != 0 {
            return Err(DecodeError::UnknownFlags { bits: state });
        }
        let mut user_parts = [0; UserPart::COUNT];
        for (part, count) in user_parts.iter_mut().enumerate() {
            *count = r.u64(at + 56 + 8 * part)?;
        }
        Ok(Self {
            registration: r.i32(at)?,
            available: state == SOURCE_AVAILABLE,
            captured: r.u64(at + 8)?,
            skipped_irql: r.u64(at + 16)?,
            skipped_stack: r.u64(at + 24)?,
            filtered: r.u64(at + 32)?,
            not_kept: r.u64(at + 40)?,
            sampled_out: r.u64(at + 48)?,
            user_parts,
        })
    }

    /// Records whose user part had outcome `part`.
    #[must_use]
    pub const fn user_part(&self, part: UserPart) -> u64 {
        self.user_parts[part.index()]
    }
}

/// Where the driver's own image is loaded, from its `DRIVER_OBJECT`
/// (`DriverStart`, `DriverSize`): lets the client name frames inside
/// kstack.sys even where the system's module list lacks it (Wine).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DriverImage {
    /// The image's base address (0 when unknown).
    pub base: u64,
    /// The image's size in bytes (0 when unknown).
    pub size: u32,
}

/// The stack table's state (see [`crate::RecordFlags::STACK_BY_ID`]). While
/// the table is on (`entries` > 0) every record that enters the ring, kept
/// or dropped, looks its stack up once, with one outcome:
/// `hits + inserts + collisions + full + busy + empty` = the sum of every source's
/// [`SourceStatus::captured`] since load (exact when no capture is under
/// way). `used = inserts - evictions`. Records with the outcome `hits` or
/// `inserts` enter the ring without their frames; the others carry them.
/// While the table is off (`entries` 0, for the whole load) nothing is
/// looked up: `used` and every counter stay 0, and no record has
/// [`crate::RecordFlags::STACK_BY_ID`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StackTableStatus {
    /// Entries in the table (`Parameters\StackTableEntries`, see
    /// [`crate::STACK_TABLE_ENTRIES_VALUE`]); 0: the table is off and every
    /// record carries its frames.
    pub entries: u32,
    /// Entries holding a stack.
    pub used: u32,
    /// Lookups that found their stack in the table.
    pub hits: u64,
    /// Stacks written into an entry, evictions included.
    pub inserts: u64,
    /// Inserts that replaced another stack, one no unread record named.
    pub evictions: u64,
    /// Stacks not tabled because the table holds their stack id with
    /// other frames (two stacks are never merged), or their id is 0.
    pub collisions: u64,
    /// Stacks not tabled because every entry they may use (eight from
    /// their id's home slot) holds a stack that unread records name.
    pub full: u64,
    /// Stacks not tabled because another capture was writing the entry
    /// they needed at that moment.
    pub busy: u64,
    /// Records whose walk returned no frames: nothing to table, and a
    /// record without frames must not look like one that names its stack.
    pub empty: u64,
    /// Records returned by reads with their frames written in from the
    /// table (which ones: see [`crate::RecordFlags::STACK_BY_ID`]).
    pub sent: u64,
}

impl StackTableStatus {
    /// The names of the u64 counters, in wire order (after `entries` and
    /// `used`); [`StackTableStatus::counters`] gives their values.
    pub const COUNTER_NAMES: [&'static str; 8] = [
        "hits",
        "inserts",
        "evictions",
        "collisions",
        "full",
        "busy",
        "empty",
        "sent",
    ];

    /// The u64 counters, in wire order (names in
    /// [`StackTableStatus::COUNTER_NAMES`]).
    #[must_use]
    pub const fn counters(&self) -> [u64; 8] {
        [
            self.hits,
            self.inserts,
            self.evictions,
            self.collisions,
            self.full,
            self.busy,
            self.empty,
            self.sent,
        ]
    }

    /// The state with `entries`, `used` and the counters in wire order.
    const fn from_counters(entries: u32, used: u32, counters: [u64; 8]) -> Self {
        let [
            hits,
            inserts,
            evictions,
            collisions,
            full,
            busy,
            empty,
            sent,
        ] = counters;
        Self {
            entries,
            used,
            hits,
            inserts,
            evictions,
            collisions,
            full,
            busy,
            empty,
            sent,
        }
    }
}

/// The capture-threads counters, in the status response
/// ([`crate::StatusResponse::thread_captures`]), from load on (a clear
/// resets none).
///
/// Layout (96 bytes): the twelve fields in [`ThreadCaptureStatus::FIELD_NAMES`]
/// order, u64 each.
///
/// Every requested id of an accepted request (one that passed every
/// request-level check, see [`crate::Ioctl::CaptureThreads`]) has one
/// outcome, and each queued APC ends one way, so, exact when no request,
/// APC or capture is under way (otherwise off by those in flight):
/// - `requested = queued + no_such_thread + no_slot + not_queued +
///   refused_system_thread + own`;
/// - `queued = delivered + run_down + in_flight`;
/// - `delivered` = the events of [`crate::Source::ThreadStack`]: its
///   [`crate::SourceStatus`]'s `captured + skipped_irql + skipped_stack +
///   filtered + not_kept + sampled_out` (every delivered APC is one
///   event, counted once by the source's counters);
/// - `late <= delivered`;
/// - `in_flight <= slots`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadCaptureStatus {
    /// Thread ids named by accepted requests.
    pub requested: u64,
    /// Of those, APCs queued ([`crate::ThreadRequestOutcome::Queued`]).
    pub queued: u64,
    /// Ids no thread had ([`crate::ThreadRequestOutcome::NoSuchThread`]).
    pub no_such_thread: u64,
    /// Ids refused because every slot was in use
    /// ([`crate::ThreadRequestOutcome::NoSlot`]).
    pub no_slot: u64,
    /// Ids whose APC the kernel refused ([`crate::ThreadRequestOutcome::NotQueued`]).
    pub not_queued: u64,
    /// Ids of system threads, refused
    /// ([`crate::ThreadRequestOutcome::SystemThread`]).
    pub refused_system_thread: u64,
    /// Ids of the requesting thread itself ([`crate::ThreadRequestOutcome::Own`]).
    pub own: u64,
    /// Queued APCs whose kernel routine ran in their thread: each one event
    /// of the thread-stack source.
    pub delivered: u64,
    /// Queued APCs a kernel ran down instead of delivering (their rundown
    /// routine ran): no event, no record. Windows delivers the kernel APCs
    /// still queued to an exiting thread in its exit path (a `delivered`
    /// record of that thread), so this stays 0 there; it is the count of a
    /// defence, for a kernel that would run them down.
    pub run_down: u64,
    /// Delivered APCs that ran after their request's timeout (their records
    /// have `late` set).
    pub late: u64,
    /// Queued APCs neither delivered nor run down yet (slots in use).
    pub in_flight: u64,
    /// The slots the driver keeps ([`crate::thread_capture::THREAD_CAPTURE_SLOTS`] when it could
    /// allocate them at load): the most APCs in flight at once. Reported
    /// as kept also where APCs cannot be queued ([`StatusResponse::apc`]
    /// not available), where none is ever used.
    pub slots: u64,
}

impl ThreadCaptureStatus {
    /// The names of the fields, in wire order; [`ThreadCaptureStatus::fields`]
    /// gives their values.
    pub const FIELD_NAMES: [&'static str; 12] = [
        "requested",
        "queued",
        "no_such_thread",
        "no_slot",
        "not_queued",
        "refused_system_thread",
        "own",
        "delivered",
        "run_down",
        "late",
        "in_flight",
        "slots",
    ];
    /// The encoded size.
    pub(crate) const SIZE: usize = 8 * Self::FIELD_NAMES.len();

    /// The fields, in wire order (names in [`ThreadCaptureStatus::FIELD_NAMES`]).
    #[must_use]
    pub const fn fields(&self) -> [u64; 12] {
        [
            self.requested,
            self.queued,
            self.no_such_thread,
            self.no_slot,
            self.not_queued,
            self.refused_system_thread,
            self.own,
            self.delivered,
            self.run_down,
            self.late,
            self.in_flight,
            self.slots,
        ]
    }

    /// The status with these fields, in wire order.
    #[must_use]
    pub const fn from_fields(fields: [u64; 12]) -> Self {
        let [
            requested,
            queued,
            no_such_thread,
            no_slot,
            not_queued,
            refused_system_thread,
            own,
            delivered,
            run_down,
            late,
            in_flight,
            slots,
        ] = fields;
        Self {
            requested,
            queued,
            no_such_thread,
            no_slot,
            not_queued,
            refused_system_thread,
            own,
            delivered,
            run_down,
            late,
            in_flight,
            slots,
        }
    }

    pub(crate) fn encode(&self, w: &mut Writer<'_>, at: usize) {
        for (index, field) in self.fields().into_iter().enumerate() {
            w.u64(at + 8 * index, field);
        }
    }

    pub(crate) fn decode(r: Reader<'_>, at: usize) -> Result<Self, DecodeError> {
        let mut fields = [0; 12];
        for (index, field) in fields.iter_mut().enumerate() {
            *field = r.u64(at + 8 * index)?;
        }
        Ok(Self::from_fields(fields))
    }
}

/// The status response.
///
/// Layout ([`STATUS_RESPONSE_SIZE`], 1648 bytes, little-endian). Reserved
/// bytes are written as zeros and not looked at when decoded. (ABI 12
/// added the eighth source's part, which moved every field after the
/// sources by 144 bytes, and the parts from 1480 on; ABI 14 a user part,
/// 8 bytes in each source's part, which moved them by 64 more.)
///
/// | offset | size | field |
/// |-------:|-----:|-------|
/// | 0    | 4   | `abi_version` (at this offset in every ABI version) |
/// | 4    | 4   | `size`: 1584 (idem) |
/// | 8    | 2×3 | `driver_version`: major, minor, patch |
/// | 14   | 2   | flags: bit 0 the `DisablePagingExecutive` value exists, bit 1 `AssumePagingExecutiveInEffect` is set; other bits refused |
/// | 16   | 4   | the `DisablePagingExecutive` value (0 when absent) |
/// | 20   | 4   | `ring_capacity` |
/// | 24   | 4   | `ring_used` |
/// | 28   | 4   | `outstanding_allocations` |
/// | 32   | 104 | `config` ([`CaptureConfig`]'s layout) |
/// | 136  | 8   | `dropped` |
/// | 144  | 8   | `cleared` |
/// | 152  | 8   | `sequences_spent` |
/// | 160  | 152×8 | `sources`, in [`Source::ALL`] order ([`SourceStatus`]'s layout) |
/// | 1376 | 8   | `driver_image.base` |
/// | 1384 | 4   | `driver_image.size` |
/// | 1388 | 4   | `apc_take_back` ([`HostRoutine`]; ABI 13's `ring_writers` was here) |
/// | 1392 | 4   | `ring_shards` |
/// | 1396 | 4   | `ring_used_bytes` |
/// | 1400 | 8   | `read` |
/// | 1408 | 4+2 | `object_altitude`: whole, fraction |
/// | 1414 | 2   | reserved |
/// | 1416 | 4+2 | `registry_altitude`: whole, fraction |
/// | 1422 | 2   | reserved |
/// | 1424 | 4   | whether `DisablePagingExecutive` is in effect ([`PagingInEffect`]; must agree with the value at 16: not configured exactly when the value is not 1) |
/// | 1428 | 4   | reserved |
/// | 1432 | 8   | the `Memory Management` key's last write time |
/// | 1440 | 8   | the boot time compared against |
/// | 1448 | 4   | `stack_table.entries` |
/// | 1452 | 4   | `stack_table.used` |
/// | 1456 | 8×8 | the stack table's counters, in [`StackTableStatus::COUNTER_NAMES`] order |
/// | 1520 | 4   | `user_walk` ([`HostRoutine`]) |
/// | 1524 | 4   | reserved |
/// | 1528 | 4   | `process_key` ([`HostRoutine`]) |
/// | 1532 | 4   | reserved |
/// | 1536 | 8   | `module_records` |
/// | 1544 | 4   | `apc` ([`HostRoutine`]) |
/// | 1548 | 4   | reserved |
/// | 1552 | 8×12 | `thread_captures` ([`ThreadCaptureStatus`]'s layout) |
///
/// A status request whose output buffer holds at least the 8-byte prefix
/// but not the whole response gets the prefix only, with
/// `STATUS_BUFFER_OVERFLOW`, so a client of any ABI version can read the
/// driver's version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatusResponse {
    /// The driver's version (major, minor, patch).
    pub driver_version: (u16, u16, u16),
    /// `DisablePagingExecutive` as found at load: configured, and whether
    /// in effect (see [`crate::paging`]). Layout: flags u16 at 14 (bit 0:
    /// the value exists, bit 1: the override is set), the value u32 at 16
    /// (0 when absent); the rest after the altitudes.
    pub paging_executive: PagingExecutive,
    /// Ring capacity in bytes, over all shards. Records take the bytes
    /// they need ([`crate::record_size`]), so how many fit depends on their
    /// stacks' depths.
    pub ring_capacity: u32,
    /// Records in the ring now, over all shards.
    pub ring_used: u32,
    /// Bytes in use in the ring now, over all shards: the records waiting,
    /// and the space a shard skipped at the end of its memory because the
    /// next record would not fit there (a record never wraps). At most
    /// `ring_capacity`.
    pub ring_used_bytes: u32,
    /// The ring's shards (one per processor, up to [`crate::MAX_SHARDS`]).
    pub ring_shards: u32,
    /// Pool allocations the driver holds.
    pub outstanding_allocations: u32,
    /// The capture configuration in force.
    pub config: CaptureConfig,
    /// Records lost because their shard was full.
    pub dropped: u64,
    /// Records discarded by clear requests.
    pub cleared: u64,
    /// Records copied out by read requests.
    pub read: u64,
    /// Sequence numbers spent, over all shards. The identities, exact
    /// whenever no capture and no read or clear is under way (otherwise
    /// off by those in flight):
    /// `sequences_spent = read + ring_used + dropped + cleared` (module
    /// records included in each), and `sequences_spent` =
    /// [`StatusResponse::module_records`] + the sum of every source's
    /// [`SourceStatus::captured`].
    pub sequences_spent: u64,
    /// Per source, in [`Source::ALL`] order.
    pub sources: [SourceStatus; Source::COUNT],
    /// Where kstack.sys is loaded.
    pub driver_image: DriverImage,
    /// The altitude the object-handle callbacks registered at (see
    /// [`crate::altitude`]); none when they are not registered.
    pub object_altitude: Altitude,
    /// The altitude the registry callback registered at; none when it is
    /// not registered.
    pub registry_altitude: Altitude,
    /// The stack table.
    pub stack_table: StackTableStatus,
    /// Whether the driver can walk user stacks (decided at load: it needs
    /// both `RtlWalkFrameChain` and `KeAreApcsDisabled`); when it cannot,
    /// every record of a source with user frames on says
    /// [`UserPart::Unavailable`].
    pub user_walk: HostRoutine,
    /// Whether module records carry process keys: whether the driver can
    /// call `PsGetProcessCreateTimeQuadPart` (decided at load); when it
    /// cannot, every module record's `process_key` is 0 (see
    /// [`crate::module_record`]).
    pub process_key: HostRoutine,
    /// Module records that entered the ring (kept, or dropped because
    /// their shard was full), from load on: one per image load and per
    /// process exit the driver's callbacks saw while it was loaded
    /// (see [`crate::module_record`]).
    pub module_records: u64,
    /// Whether the driver can queue the special kernel APCs of
    /// capture-threads requests: whether it can call `KeInsertQueueApc`
    /// (decided at load; [`crate::host_routine::APC_ROUTINE`]). When it
    /// cannot, every capture-threads request fails with
    /// `KSTACK_STATUS_NO_APC` (under Wine: [`HostRoutine::HostStub`]), and
    /// the thread-stack source is unavailable (its `registration` is
    /// `KSTACK_STATUS_NO_APC`).
    pub apc: HostRoutine,
    /// Whether unload can take back the capture-threads APCs still queued:
    /// whether the driver can call `KeRemoveQueueApc` (decided at load;
    /// [`crate::host_routine::APC_TAKE_BACK_ROUTINE`]; undocumented, and
    /// not exported by every kernel). When it can, unload takes them back
    /// and waits only for those being delivered; when it cannot, unload
    /// waits up to 5 s for every queued APC, and a thread that does not
    /// take its APC by then takes it later (in its exit path at the
    /// latest), with kstack.sys mapped until it has. `NotExported` whenever
    /// `apc` is not `Available`.
    pub apc_take_back: HostRoutine,
    /// The capture-threads counters ([`crate::Ioctl::CaptureThreads`]).
    pub thread_captures: ThreadCaptureStatus,
}

const FLAG_PAGING_EXECUTIVE_SET: u16 = 1;
const FLAG_PAGING_OVERRIDE_SET: u16 = 2;
const FLAGS_KNOWN: u16 = FLAG_PAGING_EXECUTIVE_SET | FLAG_PAGING_OVERRIDE_SET;
const SOURCE_AVAILABLE: u32 = 1;

impl StatusResponse {
    /// Writes the response into `out`: all of it when it fits, else only the
    /// version prefix. Returns the bytes written and whether all fit.
    ///
    /// `out` must hold at least [`STATUS_PREFIX_SIZE`] bytes
    /// ([`crate::Ioctl::check_lengths`] ensures it).
    pub fn encode(&self, out: &mut [u8]) -> (usize, bool) {
        let complete = out.len() >= STATUS_RESPONSE_SIZE;
        let mut w = Writer::new(out);
        encode_prefix(&mut w, STATUS_RESPONSE_SIZE);
        if !complete {
            return (STATUS_PREFIX_SIZE, false);
        }
        let (major, minor, patch) = self.driver_version;
        w.u16(8, major);
        w.u16(10, minor);
        w.u16(12, patch);
        let paging = self.paging_executive;
        let (paging_flag, paging_value) = match paging.configured {
            None => (0, 0),
            Some(value) => (FLAG_PAGING_EXECUTIVE_SET, value),
        };
        let override_flag = if paging.override_set {
            FLAG_PAGING_OVERRIDE_SET
        } else {
            0
        };
        w.u16(14, paging_flag | override_flag);
        w.u32(16, paging_value);
        w.u32(20, self.ring_capacity);
        w.u32(24, self.ring_used);
        w.u32(28, self.outstanding_allocations);
        self.config.encode(&mut w, CONFIG_OFFSET);
        w.u64(COUNTERS_OFFSET, self.dropped);
        w.u64(COUNTERS_OFFSET + 8, self.cleared);
        w.u64(COUNTERS_OFFSET + 16, self.sequences_spent);
        for (index, source) in self.sources.iter().enumerate() {
            let at = SOURCES_OFFSET + SOURCE_STATUS_SIZE * index;
            w.i32(at, source.registration);
            w.u32(
                at + 4,
                if source.available {
                    SOURCE_AVAILABLE
                } else {
                    0
                },
            );
            w.u64(at + 8, source.captured);
            w.u64(at + 16, source.skipped_irql);
            w.u64(at + 24, source.skipped_stack);
            w.u64(at + 32, source.filtered);
            w.u64(at + 40, source.not_kept);
            w.u64(at + 48, source.sampled_out);
            for (part, &count) in source.user_parts.iter().enumerate() {
                w.u64(at + 56 + 8 * part, count);
            }
        }
        w.u64(DRIVER_IMAGE_OFFSET, self.driver_image.base);
        w.u32(DRIVER_IMAGE_OFFSET + 8, self.driver_image.size);
        w.u32(DRIVER_IMAGE_OFFSET + 12, self.apc_take_back as u32);
        w.u32(RING_SHARDS_OFFSET, self.ring_shards);
        w.u32(RING_SHARDS_OFFSET + 4, self.ring_used_bytes);
        w.u64(READ_OFFSET, self.read);
        for (index, altitude) in [self.object_altitude, self.registry_altitude]
            .into_iter()
            .enumerate()
        {
            let at = ALTITUDES_OFFSET + 8 * index;
            w.u32(at, altitude.whole);
            w.u16(at + 4, altitude.fraction);
            w.u16(at + 6, 0);
        }
        w.u32(PAGING_OFFSET, paging.in_effect as u32);
        w.u32(PAGING_OFFSET + 4, 0);
        w.u64(PAGING_OFFSET + 8, paging.key_written);
        w.u64(PAGING_OFFSET + 16, paging.boot_time);
        let table = &self.stack_table;
        w.u32(STACK_TABLE_OFFSET, table.entries);
        w.u32(STACK_TABLE_OFFSET + 4, table.used);
        for (index, counter) in table.counters().into_iter().enumerate() {
            w.u64(STACK_TABLE_OFFSET + 8 + 8 * index, counter);
        }
        w.u32(USER_WALK_OFFSET, self.user_walk as u32);
        w.u32(USER_WALK_OFFSET + 4, 0);
        w.u32(MODULES_OFFSET, self.process_key as u32);
        w.u32(MODULES_OFFSET + 4, 0);
        w.u64(MODULES_OFFSET + 8, self.module_records);
        w.u32(APC_OFFSET, self.apc as u32);
        w.u32(APC_OFFSET + 4, 0);
        self.thread_captures.encode(&mut w, THREAD_CAPTURES_OFFSET);
        (STATUS_RESPONSE_SIZE, true)
    }

    /// Decodes a status response, version first: a driver of another ABI
    /// version is reported as such whatever else its reply holds.
    ///
    /// # Errors
    /// [`DecodeError::AbiVersion`] first; then any malformed field.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let r = Reader::new(bytes);
        check_prefix(r, STATUS_RESPONSE_SIZE)?;
        check_exact_length(bytes, STATUS_RESPONSE_SIZE)?;
        let flags = r.u16(14)?;
        if flags & !FLAGS_KNOWN != 0 {
            return Err(DecodeError::UnknownFlags {
                bits: u32::from(flags),
            });
        }
        let mut sources = [SourceStatus::ZERO; Source::COUNT];
        for (index, source) in sources.iter_mut().enumerate() {
            *source = SourceStatus::decode(r, SOURCES_OFFSET + SOURCE_STATUS_SIZE * index)?;
        }
        let configured = if flags & FLAG_PAGING_EXECUTIVE_SET == 0 {
            None
        } else {
            Some(r.u32(16)?)
        };
        let mut table_counters = [0; 8];
        for (index, counter) in table_counters.iter_mut().enumerate() {
            *counter = r.u64(STACK_TABLE_OFFSET + 8 + 8 * index)?;
        }
        let routine = |offset| {
            let value = r.u32(offset)?;
            HostRoutine::from_wire(value).ok_or(DecodeError::HostRoutine { value })
        };
        let user_walk = routine(USER_WALK_OFFSET)?;
        let process_key = routine(MODULES_OFFSET)?;
        let apc = routine(APC_OFFSET)?;
        let apc_take_back = routine(DRIVER_IMAGE_OFFSET + 12)?;
        let state = r.u32(PAGING_OFFSET)?;
        let in_effect = PagingInEffect::from_wire(state)
            .filter(|in_effect| {
                (*in_effect == PagingInEffect::NotConfigured) == (configured != Some(1))
            })
            .ok_or(DecodeError::PagingState { value: state })?;
        Ok(Self {
            driver_version: (r.u16(8)?, r.u16(10)?, r.u16(12)?),
            paging_executive: PagingExecutive {
                configured,
                in_effect,
                override_set: flags & FLAG_PAGING_OVERRIDE_SET != 0,
                key_written: r.u64(PAGING_OFFSET + 8)?,
                boot_time: r.u64(PAGING_OFFSET + 16)?,
            },
            ring_capacity: r.u32(20)?,
            ring_used: r.u32(24)?,
            ring_shards: r.u32(RING_SHARDS_OFFSET)?,
            ring_used_bytes: r.u32(RING_SHARDS_OFFSET + 4)?,
            outstanding_allocations: r.u32(28)?,
            config: CaptureConfig::decode(r, CONFIG_OFFSET)?,
            dropped: r.u64(COUNTERS_OFFSET)?,
            cleared: r.u64(COUNTERS_OFFSET + 8)?,
            read: r.u64(READ_OFFSET)?,
            sequences_spent: r.u64(COUNTERS_OFFSET + 16)?,
            sources,
            driver_image: DriverImage {
                base: r.u64(DRIVER_IMAGE_OFFSET)?,
                size: r.u32(DRIVER_IMAGE_OFFSET + 8)?,
            },
            object_altitude: Altitude {
                whole: r.u32(ALTITUDES_OFFSET)?,
                fraction: r.u16(ALTITUDES_OFFSET + 4)?,
            },
            registry_altitude: Altitude {
                whole: r.u32(ALTITUDES_OFFSET + 8)?,
                fraction: r.u16(ALTITUDES_OFFSET + 12)?,
            },
            stack_table: StackTableStatus::from_counters(
                r.u32(STACK_TABLE_OFFSET)?,
                r.u32(STACK_TABLE_OFFSET + 4)?,
                table_counters,
            ),
            user_walk,
            process_key,
            module_records: r.u64(MODULES_OFFSET + 8)?,
            apc,
            apc_take_back,
            thread_captures: ThreadCaptureStatus::decode(r, THREAD_CAPTURES_OFFSET)?,
        })
    }
}

/// The header of a read response. Layout (24 bytes): `abi_version` u32,
/// `record_count` u32, `payload_bytes` u32, `flags` u32 (bit 0: more records
/// were waiting when the read ended), `dropped` u64 (the drop counter then).
/// Whole records follow, back to back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadHeader {
    /// Records in the payload, trace and module records together.
    pub record_count: u32,
    /// Payload bytes after the header.
    pub payload_bytes: u32,
    /// Records were still waiting when the buffer filled.
    pub more_pending: bool,
    /// The driver's drop counter at the time of the read.
    pub dropped: u64,
}

const READ_MORE_PENDING: u32 = 1;

impl ReadHeader {
    /// Writes the header into the front of `out` (at least
    /// [`READ_HEADER_SIZE`] bytes, as the length check guarantees).
    pub fn encode(&self, out: &mut [u8]) {
        let mut w = Writer::new(out);
        w.u32(0, ABI_VERSION);
        w.u32(4, self.record_count);
        w.u32(8, self.payload_bytes);
        w.u32(
            12,
            if self.more_pending {
                READ_MORE_PENDING
            } else {
                0
            },
        );
        w.u64(16, self.dropped);
    }

    /// Decodes a read response: its header, and its payload's records. The
    /// payload must be exactly `payload_bytes` long and hold exactly
    /// `record_count` whole records; check with [`Records`] while iterating.
    ///
    /// # Errors
    /// A wrong ABI version, unknown flags, or a payload length that
    /// disagrees with the bytes received.
    pub fn decode(bytes: &[u8]) -> Result<(Self, Records<'_>), DecodeError> {
        let r = Reader::new(bytes);
        check_abi_version(r)?;
        let flags = r.u32(12)?;
        if flags & !READ_MORE_PENDING != 0 {
            return Err(DecodeError::UnknownFlags { bits: flags });
        }
        let header = Self {
            record_count: r.u32(4)?,
            payload_bytes: r.u32(8)?,
            more_pending: flags == READ_MORE_PENDING,
            dropped: r.u64(16)?,
        };
        // The reads above succeeded, so the header is whole.
        let payload = bytes.get(READ_HEADER_SIZE..).unwrap_or_default();
        if usize::try_from(header.payload_bytes).ok() != Some(payload.len()) {
            return Err(DecodeError::Length {
                expected: READ_HEADER_SIZE.saturating_add(header.payload_bytes as usize),
                actual: bytes.len(),
            });
        }
        Ok((header, Records::new(payload)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        RecordFlags, RecordHeader, SourceFacts, SourceSet, encode_record,
        ntstatus::{STATUS_NOT_SUPPORTED, STATUS_SUCCESS},
        stack_id,
    };

    fn sample_status() -> StatusResponse {
        let mut sources = [SourceStatus {
            registration: STATUS_SUCCESS,
            available: true,
            captured: 3,
            skipped_irql: 0,
            skipped_stack: 0,
            filtered: 0,
            not_kept: 0,
            sampled_out: 0,
            user_parts: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12],
        }; Source::COUNT];
        sources[Source::Registry.index()] = SourceStatus {
            registration: STATUS_NOT_SUPPORTED,
            available: false,
            captured: 0,
            skipped_irql: 0,
            skipped_stack: 0,
            filtered: 0,
            not_kept: 0,
            sampled_out: 7,
            user_parts: [0; UserPart::COUNT],
        };
        sources[Source::Timer.index()].skipped_irql = 7;
        sources[Source::Registry.index()].skipped_stack = 9;
        sources[Source::Process.index()].filtered = 11;
        sources[Source::OnDemand.index()].not_kept = 13;
        // Every byte of the last source's counters set, so a field written
        // at a wrong offset next to them shows.
        sources[Source::ThreadStack.index()].filtered = u64::MAX - 1;
        StatusResponse {
            driver_version: (0, 1, 0),
            paging_executive: PagingExecutive::decide(
                Some(1),
                Some(0x01DC_0000_0000_0000),
                Some(0x01DC_0000_0000_0001),
                true,
            ),
            ring_capacity: 4096 * 576,
            ring_used: 12,
            ring_used_bytes: 12 * 96,
            ring_shards: 2,
            outstanding_allocations: 1,
            config: CaptureConfig {
                sources: SourceSet::EMPTY.with(Source::Timer).with(Source::OnDemand),
                frames_to_skip: 1,
                frames_to_capture: 62,
                processes: crate::ProcessFilter::new(&[4, 8], &[0]).unwrap(),
                sample_every: [1, 2, 3, 4, 5, 6, 1, 1],
                timer_period_ms: 10,
                user_frames: [30, 30, 30, 30, 30, 0, 1, 2],
            },
            dropped: 5,
            cleared: 6,
            read: 67,
            sequences_spent: 100,
            sources,
            driver_image: DriverImage {
                base: 0xFFFF_F801_2340_0000,
                size: 0x2_0000,
            },
            object_altitude: Altitude {
                whole: 385_291,
                fraction: 2,
            },
            registry_altitude: Altitude {
                whole: 385_290,
                fraction: 0xFFFF,
            },
            stack_table: StackTableStatus {
                entries: 4096,
                used: 30,
                hits: 1_000,
                inserts: 40,
                evictions: 10,
                collisions: 1,
                full: 2,
                busy: 3,
                empty: 4,
                // Every byte set, as for the last source's counters.
                sent: u64::MAX - 2,
            },
            user_walk: HostRoutine::HostStub,
            process_key: HostRoutine::NotExported,
            module_records: 17,
            apc: HostRoutine::Available,
            apc_take_back: HostRoutine::NotExported,
            // Each its own value; every byte of the last set, so a field
            // written past the end shows.
            thread_captures: ThreadCaptureStatus::from_fields([
                21,
                15,
                1,
                2,
                1,
                1,
                1,
                11,
                1,
                3,
                3,
                u64::MAX - 3,
            ]),
        }
    }

    #[test]
    fn status_fields_are_in_their_named_order() {
        let fields: [u64; 12] = core::array::from_fn(|index| 100 + index as u64);
        let status = ThreadCaptureStatus::from_fields(fields);
        assert_eq!(status.fields(), fields);
        assert_eq!(
            (status.requested, status.own, status.late, status.slots),
            (100, 106, 109, 111)
        );
        let mut bytes = [0_u8; 96];
        status.encode(&mut Writer::new(&mut bytes), 0);
        assert_eq!(&bytes[8 * 5..8 * 6], &105_u64.to_le_bytes());
        assert_eq!(
            ThreadCaptureStatus::decode(Reader::new(&bytes), 0),
            Ok(status)
        );
    }

    #[test]
    fn message_sizes_are_the_documented_ones() {
        assert_eq!(CONFIGURE_REQUEST_SIZE, 112);
        assert_eq!(CAPTURE_NOW_REQUEST_SIZE, 16);
        assert_eq!(INJECT_REQUEST_SIZE, 40);
        assert_eq!(FAULT_PROBE_REQUEST_SIZE, 16);
        assert_eq!(STATUS_RESPONSE_SIZE, 1648);
        assert_eq!(ThreadCaptureStatus::SIZE, 96);
        assert_eq!(READ_HEADER_SIZE, 24);
    }

    /// `value`'s little-endian bytes, as a row of a layout table.
    fn le<const N: usize>(value: impl Into<u128>) -> Vec<u8> {
        value.into().to_le_bytes()[..N].to_vec()
    }

    #[test]
    fn the_documented_status_layout_table_is_the_encoding() {
        let status = sample_status();
        let mut out = [0xAA_u8; STATUS_RESPONSE_SIZE];
        status.encode(&mut out);
        let mut config = [0_u8; CAPTURE_CONFIG_SIZE];
        status.config.encode(&mut Writer::new(&mut config), 0);
        // `SourceStatus`'s table: registration, state, six counters, then
        // the user parts.
        let sources: Vec<u8> = status
            .sources
            .iter()
            .flat_map(|source| {
                let mut bytes = source.registration.to_le_bytes().to_vec();
                bytes.extend(le::<4>(u32::from(source.available)));
                for counter in [
                    source.captured,
                    source.skipped_irql,
                    source.skipped_stack,
                    source.filtered,
                    source.not_kept,
                    source.sampled_out,
                ]
                .into_iter()
                .chain(source.user_parts)
                {
                    bytes.extend(le::<8>(counter));
                }
                bytes
            })
            .collect();
        let table = status.stack_table;
        let paging = status.paging_executive;
        // Each row of `StatusResponse`'s table: offset, then its bytes.
        let rows: [(usize, Vec<u8>); 40] = [
            (0, le::<4>(ABI_VERSION)),
            (4, le::<4>(1648_u32)),
            (8, [le::<2>(0_u16), le::<2>(1_u16), le::<2>(0_u16)].concat()),
            (14, le::<2>(3_u16)),
            (16, le::<4>(1_u32)),
            (20, le::<4>(status.ring_capacity)),
            (24, le::<4>(status.ring_used)),
            (28, le::<4>(status.outstanding_allocations)),
            (32, config.to_vec()),
            (136, le::<8>(status.dropped)),
            (144, le::<8>(status.cleared)),
            (152, le::<8>(status.sequences_spent)),
            (160, sources),
            (1376, le::<8>(status.driver_image.base)),
            (1384, le::<4>(status.driver_image.size)),
            (1388, le::<4>(HostRoutine::NotExported as u32)),
            (1392, le::<4>(status.ring_shards)),
            (1396, le::<4>(status.ring_used_bytes)),
            (1400, le::<8>(status.read)),
            (1408, le::<4>(status.object_altitude.whole)),
            (1412, le::<2>(status.object_altitude.fraction)),
            (1414, vec![0; 2]),
            (1416, le::<4>(status.registry_altitude.whole)),
            (1420, le::<2>(status.registry_altitude.fraction)),
            (1422, vec![0; 2]),
            (1424, le::<4>(PagingInEffect::BeforeBoot as u32)),
            (1428, vec![0; 4]),
            (1432, le::<8>(paging.key_written)),
            (1440, le::<8>(paging.boot_time)),
            (1448, le::<4>(table.entries)),
            (1452, le::<4>(table.used)),
            (
                1456,
                table.counters().into_iter().flat_map(le::<8>).collect(),
            ),
            (1520, le::<4>(HostRoutine::HostStub as u32)),
            (1524, vec![0; 4]),
            (1528, le::<4>(HostRoutine::NotExported as u32)),
            (1532, vec![0; 4]),
            (1536, le::<8>(status.module_records)),
            (1544, le::<4>(HostRoutine::Available as u32)),
            (1548, vec![0; 4]),
            (
                1552,
                status
                    .thread_captures
                    .fields()
                    .into_iter()
                    .flat_map(le::<8>)
                    .collect(),
            ),
        ];
        crate::wire::assert_layout(
            &out,
            rows.iter()
                .map(|(offset, bytes)| (*offset, bytes.as_slice())),
        );
        assert_eq!(
            (paging.configured, paging.override_set, paging.in_effect),
            (Some(1), true, PagingInEffect::BeforeBoot),
            "the flags and state the rows above expect"
        );
        assert_eq!(
            (status.user_walk, status.process_key, status.apc),
            (
                HostRoutine::HostStub,
                HostRoutine::NotExported,
                HostRoutine::Available
            )
        );
    }

    #[test]
    fn reserved_status_bytes_are_not_looked_at() {
        let status = sample_status();
        let mut out = [0_u8; STATUS_RESPONSE_SIZE];
        status.encode(&mut out);
        for range in [
            1414..1416,
            1422..1424,
            1428..1432,
            1524..1528,
            1532..1536,
            1548..1552,
        ] {
            out[range].fill(0xFF);
        }
        assert_eq!(StatusResponse::decode(&out), Ok(status));
    }

    #[test]
    fn a_status_written_over_old_bytes_has_zero_reserved_bytes_and_every_field() {
        let status = sample_status();
        let mut out = [0xAA_u8; STATUS_RESPONSE_SIZE];
        status.encode(&mut out);
        let reserved = [
            ALTITUDES_OFFSET + 6..ALTITUDES_OFFSET + 8,
            ALTITUDES_OFFSET + 14..ALTITUDES_OFFSET + 16,
            PAGING_OFFSET + 4..PAGING_OFFSET + 8,
            USER_WALK_OFFSET + 4..USER_WALK_OFFSET + 8,
            MODULES_OFFSET + 4..MODULES_OFFSET + 8,
            APC_OFFSET + 4..APC_OFFSET + 8,
        ];
        for range in reserved {
            assert!(
                out[range.clone()].iter().all(|&byte| byte == 0),
                "{range:?}"
            );
        }
        assert_eq!(StatusResponse::decode(&out), Ok(status));
    }

    #[test]
    fn fault_probe_requests_round_trip_and_refuse_damage() {
        for target in [FaultProbe::Mapped, FaultProbe::Unmapped] {
            let bytes = encode_fault_probe_request(target);
            assert_eq!(decode_fault_probe_request(&bytes), Ok(target));
            let mut other = bytes;
            other[STATUS_PREFIX_SIZE + 7] = 1;
            assert!(decode_fault_probe_request(&other).is_err());
            assert!(decode_fault_probe_request(&bytes[..FAULT_PROBE_REQUEST_SIZE - 1]).is_err());
        }
        let mut unknown = encode_fault_probe_request(FaultProbe::Mapped);
        unknown[STATUS_PREFIX_SIZE] = 2;
        assert!(decode_fault_probe_request(&unknown).is_err());
    }

    #[test]
    fn inject_requests_round_trip_and_refuse_damage() {
        let facts = SourceFacts::Thread {
            event: crate::source_facts::Lifecycle::Create,
            process_id: 1234,
            thread_id: 99,
        };
        let bytes = encode_inject_request(&facts);
        assert_eq!(decode_inject_request(&bytes), Ok(facts));
        assert!(decode_inject_request(&bytes[..INJECT_REQUEST_SIZE - 1]).is_err());
        let mut unknown = bytes;
        unknown[STATUS_PREFIX_SIZE] = 0xEE;
        assert_eq!(
            decode_inject_request(&unknown),
            Err(DecodeError::UnknownSource { value: 0xEE })
        );
        let mut bad_event = bytes;
        bad_event[STATUS_PREFIX_SIZE + 8] = 9;
        assert!(decode_inject_request(&bad_event).is_err());
    }

    #[test]
    fn status_round_trips_and_has_the_documented_size() {
        assert_eq!(STATUS_RESPONSE_SIZE, 1648);
        let status = sample_status();
        let mut out = [0_u8; STATUS_RESPONSE_SIZE];
        assert_eq!(status.encode(&mut out), (STATUS_RESPONSE_SIZE, true));
        assert_eq!(StatusResponse::decode(&out), Ok(status));
    }

    #[test]
    fn a_short_status_buffer_gets_the_version_prefix_only() {
        let mut out = [0xAA_u8; 16];
        assert_eq!(
            sample_status().encode(&mut out),
            (STATUS_PREFIX_SIZE, false)
        );
        assert_eq!(&out[..4], &ABI_VERSION.to_le_bytes());
        assert_eq!(&out[4..8], &1648_u32.to_le_bytes());
        assert_eq!(out[8], 0xAA, "nothing past the prefix");
    }

    #[test]
    fn a_status_from_another_abi_version_is_reported_as_such() {
        let mut out = [0_u8; STATUS_RESPONSE_SIZE];
        sample_status().encode(&mut out);
        out[0] = 99;
        assert_eq!(
            StatusResponse::decode(&out),
            Err(DecodeError::AbiVersion {
                ours: ABI_VERSION,
                theirs: 99
            })
        );
        // Even a prefix alone says so.
        assert_eq!(
            StatusResponse::decode(&out[..8]),
            Err(DecodeError::AbiVersion {
                ours: ABI_VERSION,
                theirs: 99
            })
        );
    }

    #[test]
    fn malformed_statuses_are_errors() {
        let mut out = [0_u8; STATUS_RESPONSE_SIZE];
        sample_status().encode(&mut out);
        assert!(StatusResponse::decode(&out[..STATUS_RESPONSE_SIZE - 1]).is_err());
        let mut bad = out;
        bad[14] |= 0x80;
        assert!(StatusResponse::decode(&bad).is_err());
        let mut bad = out;
        bad[SOURCES_OFFSET + 4] = 2;
        assert!(StatusResponse::decode(&bad).is_err());
        for routine in [USER_WALK_OFFSET, MODULES_OFFSET, APC_OFFSET] {
            let mut bad = out;
            bad[routine] = 3;
            assert_eq!(
                StatusResponse::decode(&bad),
                Err(DecodeError::HostRoutine { value: 3 })
            );
        }
    }

    #[test]
    fn every_paging_state_round_trips_and_contradictions_are_refused() {
        let mut status = sample_status();
        for configured in [None, Some(0), Some(1), Some(7)] {
            for times in [(None, None), (Some(5), Some(9)), (Some(9), Some(5))] {
                for override_set in [false, true] {
                    status.paging_executive =
                        PagingExecutive::decide(configured, times.0, times.1, override_set);
                    let mut out = [0_u8; STATUS_RESPONSE_SIZE];
                    status.encode(&mut out);
                    assert_eq!(StatusResponse::decode(&out), Ok(status));
                }
            }
        }
        let mut out = [0_u8; STATUS_RESPONSE_SIZE];
        sample_status().encode(&mut out);
        let mut unknown = out;
        unknown[PAGING_OFFSET] = 5;
        assert_eq!(
            StatusResponse::decode(&unknown),
            Err(DecodeError::PagingState { value: 5 })
        );
        // "Before boot" with no value configured cannot be.
        let mut contradiction = out;
        contradiction[14] &= !1;
        contradiction[PAGING_OFFSET] = PagingInEffect::BeforeBoot as u8;
        assert!(StatusResponse::decode(&contradiction).is_err());
        // The value 1 with "not configured" neither.
        let mut contradiction = out;
        contradiction[PAGING_OFFSET] = PagingInEffect::NotConfigured as u8;
        assert!(StatusResponse::decode(&contradiction).is_err());
    }

    #[test]
    fn configure_request_round_trips_and_checks_everything() {
        let config = sample_status().config;
        let bytes = encode_configure_request(&config);
        assert_eq!(decode_configure_request(&bytes), Ok(config));

        assert_eq!(
            decode_configure_request(&bytes[..CONFIGURE_REQUEST_SIZE - 1]),
            Err(DecodeError::Length {
                expected: CONFIGURE_REQUEST_SIZE,
                actual: CONFIGURE_REQUEST_SIZE - 1
            })
        );
        let mut bad = bytes;
        bad[..4].copy_from_slice(&(ABI_VERSION + 1).to_le_bytes());
        assert_eq!(
            decode_configure_request(&bad),
            Err(DecodeError::AbiVersion {
                ours: ABI_VERSION,
                theirs: ABI_VERSION + 1
            })
        );
        let mut bad = bytes;
        bad[4] = 23;
        assert_eq!(
            decode_configure_request(&bad),
            Err(DecodeError::SizeField {
                expected: CONFIGURE_REQUEST_SIZE,
                declared: 23
            })
        );
        let mut bad = bytes;
        bad[STATUS_PREFIX_SIZE + 6] = 0;
        assert!(matches!(
            decode_configure_request(&bad),
            Err(DecodeError::Config(_))
        ));
    }

    #[test]
    fn capture_now_request_round_trips() {
        let bytes = encode_capture_now_request(0x1234_5678_9ABC_DEF0);
        assert_eq!(
            decode_capture_now_request(&bytes),
            Ok(0x1234_5678_9ABC_DEF0)
        );
        assert!(decode_capture_now_request(&bytes[..15]).is_err());
    }

    #[test]
    fn read_response_round_trips_with_its_records() {
        let frames = [0xFFFF_F800_0000_1000, 0xFFFF_F800_0000_2000];
        let record = RecordHeader {
            sequence: 9,
            timestamp: 1,
            process_id: 4,
            thread_id: 8,
            processor: 0,
            shard: 0,
            irql: 0,
            flags: RecordFlags::NONE,
            user_frame_count: 1,
            user_part: UserPart::Captured,
            os_hash: 0,
            stack_id: stack_id(&frames),
            facts: SourceFacts::OnDemand { tag: 1 },
        };
        let mut buffer = [0_u8; READ_HEADER_SIZE + 200];
        let size = encode_record(&record, &frames, &mut buffer[READ_HEADER_SIZE..]).unwrap();
        let header = ReadHeader {
            record_count: 1,
            payload_bytes: u32::try_from(size).unwrap(),
            more_pending: true,
            dropped: 3,
        };
        header.encode(&mut buffer);
        let bytes = &buffer[..READ_HEADER_SIZE + size];
        let (decoded, records) = ReadHeader::decode(bytes).unwrap();
        assert_eq!(decoded, header);
        let records: Vec<_> = records.collect::<Result<_, _>>().unwrap();
        assert_eq!(records.len(), 1);
        assert!(matches!(records[0], crate::Entry::Trace(view) if view.header == record));

        assert!(
            ReadHeader::decode(&bytes[..bytes.len() - 1]).is_err(),
            "payload shorter than declared"
        );
        assert!(ReadHeader::decode(&bytes[..READ_HEADER_SIZE - 1]).is_err());
    }
}
