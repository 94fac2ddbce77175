//! The kernel as the capture sees it: what the driver crate supplies
//! ([`Platform`], on Windows `driver/src/kernel.rs`), what it reports of the
//! current thread ([`UserThread`]), and the routines it may lack
//! ([`Routine`]). Host tests supply fakes.

/// What the capture needs from the kernel. Every method is callable at up
/// to `DISPATCH_LEVEL`.
pub trait Platform {
    /// The current IRQL.
    fn irql(&self) -> u8;
    /// The current process and thread ids.
    fn current_ids(&self) -> (u32, u32);
    /// The current processor number. Below `DISPATCH_LEVEL` the thread may
    /// run elsewhere by the time it is used: good only for picking the
    /// shard of a counter bumped atomically.
    fn processor(&self) -> u32;
    /// Runs `section` at `DISPATCH_LEVEL` or above, passing it the
    /// processor it runs on (read after raising): raises first when below
    /// `DISPATCH_LEVEL` and lowers back after, else runs it as it is.
    fn at_dispatch<R>(&self, section: impl FnOnce(u32) -> R) -> R;
    /// The record clock: 100 ns units since 1601-01-01 UTC, monotonic (see
    /// `kstack_abi::RecordHeader::timestamp`).
    fn timestamp(&self) -> u64;
    /// Bytes of kernel stack left below the caller's frame, as the WDK's
    /// inline `IoGetRemainingStackSize` computes them.
    fn remaining_stack(&self) -> usize;
    /// `RtlCaptureStackBackTrace(frames_to_skip, frames.len(), frames, &hash)`:
    /// returns the frames written and the OS BackTraceHash.
    fn walk_stack(&self, frames_to_skip: u32, frames: &mut [u64]) -> (usize, u32);
    /// What the user walk needs to know of the current thread. Called only
    /// below `DISPATCH_LEVEL` and only when the driver can walk user stacks
    /// ([`HostRoutine::Available`]).
    fn user_thread(&self) -> UserThread;
    /// `RtlWalkFrameChain(frames, frames.len(), RTL_WALK_USER_MODE_STACK)`
    /// on a stack of its own of at least
    /// [`USER_WALK_STACK`](crate::kernel_stack::USER_WALK_STACK) bytes,
    /// inside the driver's exception scope: the user frames written.
    /// Called only below `DISPATCH_LEVEL`, on a thread
    /// [`Platform::user_thread`] found to be neither a system thread nor
    /// attached, and only when the driver can walk user stacks.
    ///
    /// # Errors
    /// Why no frames came back: the walk raised an exception, or no stack
    /// could be had for it.
    fn walk_user_stack(&self, frames: &mut [u64]) -> Result<usize, UserWalkFailure>;
}

/// Why a user walk gave no frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UserWalkFailure {
    /// The walk raised an exception; the driver's exception scope caught it.
    Faulted,
    /// The kernel could not give the walk a stack of its own; nothing was
    /// walked.
    NoStack,
}

/// The kernel routines the driver uses only where the host implements them
/// (see [`HostRoutine`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Routine {
    /// `RtlWalkFrameChain`: user frames.
    UserWalk,
    /// `PsGetProcessCreateTimeQuadPart`: module records' process keys.
    ProcessKey,
    /// `KeInsertQueueApc`: the special kernel APCs of capture-threads
    /// requests.
    Apc,
    /// `KeRemoveQueueApc`: unload taking those APCs back.
    ApcTakeBack,
}

impl Routine {
    pub(crate) const COUNT: usize = 4;
}

/// The current thread, as far as the user walk cares.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[expect(
    clippy::struct_excessive_bools,
    reason = "four independent facts the walk checks in turn"
)]
pub struct UserThread {
    /// A system thread: no user stack.
    pub system: bool,
    /// Attached to another process's address space (`KeStackAttachProcess`):
    /// its own user stack is not mapped.
    pub attached: bool,
    /// Its process is a 32-bit (WoW64) process.
    pub wow64: bool,
    /// Inside a critical or guarded region (`KeAreApcsDisabled`): it may
    /// hold a lock that paging its user stack in would need.
    pub critical_region: bool,
}
