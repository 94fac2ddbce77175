//! `DisablePagingExecutive`: configured, and in effect.
//!
//! A stack walk at `DISPATCH_LEVEL` or above must not need a page fault.
//! With `DisablePagingExecutive`=1 under
//! `HKLM\SYSTEM\CurrentControlSet\Control\Session Manager\Memory Management`
//! the kernel keeps its own and drivers' code resident, but it reads the
//! value only at boot: a value written since this boot is configured, not in
//! effect. kstack walks at elevated IRQL only when the value is in effect.
//!
//! How the driver decides, at load ([`PagingExecutive::decide`]): the value
//! must be 1, and then either
//! - the `Memory Management` key was last written before this boot
//!   ([`PagingInEffect::BeforeBoot`]). The registry keeps one write time per
//!   key, not per value, and the kernel moves its boot time when the clock
//!   is set; so the key's write time must be earlier than both the boot time
//!   now reported and the boot time before any clock change (`BootTime` and
//!   `BootTime - BootTimeBias` of `SystemTimeOfDayInformation`). Windows
//!   writes values under that key at every boot (the page-file values),
//!   but a write of data identical to what is stored leaves the key's
//!   write time alone, so on a machine whose settings did not change the
//!   time stays before the boot. A write of new data after boot, Windows'
//!   own included (a changed page-file configuration, or its
//!   `TempPageFile` value set or cleared, moves the time for that one
//!   boot), makes the driver unable to tell, and it then says not in
//!   effect. "Shut down" with Fast Startup on is no boot: the next start
//!   resumes the kernel session that was running, with its paging
//!   settings and its boot time, so a value set before it is still
//!   written since boot; only a restart (or a shutdown with Fast Startup
//!   off, `shutdown /s /full`) applies it; or
//! - the service's `Parameters\AssumePagingExecutiveInEffect` is the DWORD 1
//!   ([`PagingInEffect::AssumedByOverride`]): an explicit statement by the
//!   person who rebooted the test machine with the value set, for the case
//!   the write times cannot show it. Status reports it.
//!
//! It fails closed: a write time or boot time that cannot be read means not
//! in effect ([`PagingInEffect::Unknown`]).

use crate::wire_types::wire_enum;

/// The `REG_DWORD` under the service's `Parameters` key that, when 1, makes
/// the driver take a `DisablePagingExecutive` of 1 as in effect even when
/// the registry's write times cannot show it. Set it only after rebooting
/// with the value set.
pub const ASSUME_IN_EFFECT_VALUE: &str = "AssumePagingExecutiveInEffect";

wire_enum! {
/// Whether `DisablePagingExecutive` is in effect, and what showed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PagingInEffect: u32 {
    /// The value is not 1 (or absent): not in effect.
    NotConfigured = 0,
    /// The value is 1, but the key was written at or after this boot: not
    /// in effect as far as the driver can tell (a reboot applies it).
    WrittenSinceBoot = 1,
    /// The value is 1, but the key's write time or the boot time could not
    /// be read: not in effect.
    Unknown = 2,
    /// The value is 1 and the key was last written before this boot: in
    /// effect.
    BeforeBoot = 3,
    /// The value is 1, the write times do not show it in effect, and
    /// `Parameters\AssumePagingExecutiveInEffect` is 1: taken as in effect.
    AssumedByOverride = 4,
}
}

impl PagingInEffect {
    /// Whether the value is taken as in effect.
    #[must_use]
    pub const fn in_effect(self) -> bool {
        matches!(self, Self::BeforeBoot | Self::AssumedByOverride)
    }
}

/// `DisablePagingExecutive` as the driver found it at load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PagingExecutive {
    /// The value (`None`: absent, not a DWORD, or unreadable).
    pub configured: Option<u32>,
    /// Whether it is in effect.
    pub in_effect: PagingInEffect,
    /// `Parameters\AssumePagingExecutiveInEffect` was 1 (it matters only
    /// when the value is 1 and the write times do not show it in effect).
    pub override_set: bool,
    /// When the `Memory Management` key was last written (100 ns units
    /// since 1601, UTC; 0: unknown or not needed).
    pub key_written: u64,
    /// The boot time compared against, the earlier of `BootTime` and
    /// `BootTime - BootTimeBias` (same units; 0: unknown or not needed).
    pub boot_time: u64,
}

impl PagingExecutive {
    /// Nothing configured: what a driver without the value reports.
    pub const NOT_SET: Self = Self::decide(None, None, None, false);

    /// Decides from what the driver read at load: the value, the key's last
    /// write time, the boot time (the earlier of the two, see the module
    /// docs) and the override. Times are 100 ns units since 1601; `None`
    /// when unreadable.
    #[must_use]
    pub const fn decide(
        configured: Option<u32>,
        key_written: Option<u64>,
        boot_time: Option<u64>,
        override_set: bool,
    ) -> Self {
        let in_effect = match (configured, key_written, boot_time) {
            (Some(1), Some(written), Some(boot)) if written < boot => PagingInEffect::BeforeBoot,
            (Some(1), ..) if override_set => PagingInEffect::AssumedByOverride,
            (Some(1), Some(_), Some(_)) => PagingInEffect::WrittenSinceBoot,
            (Some(1), ..) => PagingInEffect::Unknown,
            _ => PagingInEffect::NotConfigured,
        };
        let needed = matches!(configured, Some(1));
        Self {
            configured,
            in_effect,
            override_set,
            key_written: match key_written {
                Some(time) if needed => time,
                _ => 0,
            },
            boot_time: match boot_time {
                Some(time) if needed => time,
                _ => 0,
            },
        }
    }

    /// Whether a stack walk at `DISPATCH_LEVEL` or above is allowed: only
    /// when `DisablePagingExecutive`=1 is in effect.
    #[must_use]
    pub const fn allows_elevated_walks(self) -> bool {
        self.in_effect.in_effect()
    }

    /// A test machine's setting: the value 1 taken as in effect by the
    /// override (what the Wine harness and the demo set).
    #[must_use]
    pub const fn assumed() -> Self {
        Self::decide(Some(1), None, None, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALUES: [Option<u32>; 4] = [None, Some(0), Some(1), Some(2)];
    const TIMES: [Option<u64>; 4] = [None, Some(99), Some(100), Some(101)];

    #[test]
    fn in_effect_needs_the_value_1_and_a_write_before_boot_or_the_override() {
        for configured in VALUES {
            for key_written in TIMES {
                for boot_time in TIMES {
                    for override_set in [false, true] {
                        let paging = PagingExecutive::decide(
                            configured,
                            key_written,
                            boot_time,
                            override_set,
                        );
                        let proven =
                            matches!((key_written, boot_time), (Some(w), Some(b)) if w < b);
                        let expected = configured == Some(1) && (proven || override_set);
                        let case = (configured, key_written, boot_time, override_set);
                        assert_eq!(paging.allows_elevated_walks(), expected, "{case:?}");
                        assert_eq!(
                            paging.in_effect == PagingInEffect::NotConfigured,
                            configured != Some(1),
                            "{case:?}"
                        );
                        assert_eq!(paging.configured, configured);
                        assert_eq!(paging.override_set, override_set);
                    }
                }
            }
        }
    }

    #[test]
    fn each_state_says_why() {
        let at = |written, boot, override_set| {
            PagingExecutive::decide(Some(1), written, boot, override_set).in_effect
        };
        assert_eq!(at(Some(99), Some(100), false), PagingInEffect::BeforeBoot);
        // Proof wins over the override.
        assert_eq!(at(Some(99), Some(100), true), PagingInEffect::BeforeBoot);
        // Written at the boot instant: not before it.
        assert_eq!(
            at(Some(100), Some(100), false),
            PagingInEffect::WrittenSinceBoot
        );
        assert_eq!(
            at(Some(101), Some(100), true),
            PagingInEffect::AssumedByOverride
        );
        assert_eq!(at(None, Some(100), false), PagingInEffect::Unknown);
        assert_eq!(at(Some(99), None, false), PagingInEffect::Unknown);
        assert_eq!(at(None, None, true), PagingInEffect::AssumedByOverride);
        assert_eq!(
            PagingExecutive::NOT_SET.in_effect,
            PagingInEffect::NotConfigured
        );
        assert_eq!(
            PagingExecutive::assumed().in_effect,
            PagingInEffect::AssumedByOverride
        );
    }

    #[test]
    fn times_are_kept_only_when_they_decided_something() {
        let paging = PagingExecutive::decide(Some(1), Some(5), Some(9), false);
        assert_eq!((paging.key_written, paging.boot_time), (5, 9));
        let paging = PagingExecutive::decide(Some(0), Some(5), Some(9), false);
        assert_eq!((paging.key_written, paging.boot_time), (0, 0));
    }

    #[test]
    fn wire_values_round_trip() {
        for state in PagingInEffect::ALL {
            assert_eq!(PagingInEffect::from_wire(state as u32), Some(state));
        }
        assert_eq!(PagingInEffect::from_wire(5), None);
    }
}
