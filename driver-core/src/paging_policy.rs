//! When a stack walk is allowed.
//!
//! `RtlCaptureStackBackTrace` reads unwind data and stack memory. At
//! `DISPATCH_LEVEL` or above the kernel cannot service a page fault, and on
//! x64 that data can be paged out (Microsoft's remedy for diagnosis is
//! `DisablePagingExecutive`=1 under `HKLM\SYSTEM\CurrentControlSet\Control\
//! Session Manager\Memory Management`, which keeps kernel and driver code and
//! its metadata resident; it costs memory and is meant to be temporary).
//! The kernel applies that value only at boot, so kstack walks at elevated
//! IRQL only when the value is 1 *and in effect* (decided at load, failing
//! closed: [`kstack_abi::paging`]), and otherwise counts the event as
//! skipped.

use kstack_abi::{
    PagingExecutive, Source, SourceSet,
    ntstatus::{KSTACK_STATUS_PAGING_EXECUTIVE_REQUIRED, NtStatus},
};

/// `DISPATCH_LEVEL` on x64.
pub const DISPATCH_LEVEL: u8 = 2;

/// Whether to walk the stack now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WalkDecision {
    /// Walk.
    Walk,
    /// Do not walk: the IRQL is too high for the paging policy.
    SkipIrql,
}

/// Decides a walk at `irql` under `paging`.
///
/// Max IRQL: any.
#[must_use]
pub const fn walk_decision(irql: u8, paging: PagingExecutive) -> WalkDecision {
    if irql < DISPATCH_LEVEL || paging.allows_elevated_walks() {
        WalkDecision::Walk
    } else {
        WalkDecision::SkipIrql
    }
}

/// Checks that every source in `sources` can walk where it runs: a source
/// whose callback always runs at `DISPATCH_LEVEL` (the timer) would only
/// ever skip, so enabling it while paging is allowed is refused.
///
/// # Errors
/// [`KSTACK_STATUS_PAGING_EXECUTIVE_REQUIRED`].
pub fn check_sources(sources: SourceSet, paging: PagingExecutive) -> Result<(), NtStatus> {
    let needs_resident_code = sources.iter().any(Source::runs_at_dispatch_level);
    if needs_resident_code && !paging.allows_elevated_walks() {
        return Err(KSTACK_STATUS_PAGING_EXECUTIVE_REQUIRED);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kind of setting; only the last two are in effect.
    const SETTINGS: [PagingExecutive; 7] = [
        PagingExecutive::NOT_SET,
        PagingExecutive::decide(Some(0), Some(1), Some(2), true),
        PagingExecutive::decide(Some(2), Some(1), Some(2), true),
        // Configured since boot, or unknown: not in effect.
        PagingExecutive::decide(Some(1), Some(2), Some(1), false),
        PagingExecutive::decide(Some(1), None, Some(1), false),
        PagingExecutive::decide(Some(1), Some(1), Some(2), false),
        PagingExecutive::assumed(),
    ];

    fn in_effect(paging: PagingExecutive) -> bool {
        SETTINGS[5..].contains(&paging)
    }

    #[test]
    fn below_dispatch_level_always_walks() {
        for paging in SETTINGS {
            for irql in 0..DISPATCH_LEVEL {
                assert_eq!(
                    walk_decision(irql, paging),
                    WalkDecision::Walk,
                    "{irql} {paging:?}"
                );
            }
        }
    }

    #[test]
    fn at_or_above_dispatch_level_walks_only_with_paging_executive_disabled_in_effect() {
        for irql in DISPATCH_LEVEL..=15 {
            for paging in SETTINGS {
                let expected = if in_effect(paging) {
                    WalkDecision::Walk
                } else {
                    WalkDecision::SkipIrql
                };
                assert_eq!(walk_decision(irql, paging), expected, "{irql} {paging:?}");
            }
        }
    }

    #[test]
    fn every_source_and_setting_combination() {
        for source in Source::ALL {
            for paging in SETTINGS {
                let result = check_sources(SourceSet::EMPTY.with(source), paging);
                let refused = source == Source::Timer && !in_effect(paging);
                assert_eq!(result.is_err(), refused, "{source:?} {paging:?}");
            }
        }
        assert_eq!(
            check_sources(SourceSet::EMPTY, PagingExecutive::NOT_SET),
            Ok(())
        );
        assert_eq!(
            check_sources(SourceSet::ALL, PagingExecutive::NOT_SET),
            Err(KSTACK_STATUS_PAGING_EXECUTIVE_REQUIRED)
        );
    }
}
