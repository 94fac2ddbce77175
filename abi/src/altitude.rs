//! Altitudes of the object and registry callbacks.
//!
//! `ObRegisterCallbacks` and `CmRegisterCallbackEx` order drivers by an
//! altitude, a decimal string, and refuse a second driver at an altitude
//! already taken (`STATUS_FLT_INSTANCE_ALTITUDE_COLLISION`). kstack starts at
//! a base altitude (the default, or the service's `Parameters\ObjectAltitude`
//! / `Parameters\RegistryAltitude` DWORD) and on a collision tries the
//! fractional altitudes just above it, `base.1` to `base.15`
//! ([`ALTITUDE_TRIES`] in all). Status reports the altitude in use.

use crate::ntstatus::NtStatus;

/// The default base altitude of the object-handle callbacks.
pub const OBJECT_ALTITUDE_DEFAULT: u32 = 385_291;
/// The default base altitude of the registry callback.
pub const REGISTRY_ALTITUDE_DEFAULT: u32 = 385_290;
/// The `Parameters` value that sets the object callbacks' base altitude.
pub const OBJECT_ALTITUDE_VALUE: &str = "ObjectAltitude";
/// The `Parameters` value that sets the registry callback's base altitude.
pub const REGISTRY_ALTITUDE_VALUE: &str = "RegistryAltitude";
/// Whole altitudes a setting may choose (Microsoft's allocated ranges run
/// from 20000 to 429999); a setting outside is ignored for the default.
pub const ALTITUDE_RANGE: core::ops::RangeInclusive<u32> = 20_000..=429_999;
/// Altitudes tried before a registration gives up: the base and 15
/// fractions above it.
pub const ALTITUDE_TRIES: u16 = 16;
/// UTF-16 units an altitude's text needs at most ("429999.15").
pub const ALTITUDE_CHARS: usize = 9;

/// `STATUS_FLT_INSTANCE_ALTITUDE_COLLISION`: another driver holds the
/// altitude.
#[expect(
    clippy::cast_possible_wrap,
    reason = "NTSTATUS values are the bit patterns of their unsigned codes"
)]
pub const STATUS_FLT_INSTANCE_ALTITUDE_COLLISION: NtStatus = 0xC01C_0011_u32 as NtStatus;

/// An altitude: `whole`, and `.fraction` when `fraction` is not 0. The
/// default (`whole` 0) stands for none: the callback is not registered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Altitude {
    /// The whole part.
    pub whole: u32,
    /// The fractional part's digits as a number (0: none).
    pub fraction: u16,
}

impl Altitude {
    /// The base altitude for a `Parameters` setting: the setting when it is
    /// in [`ALTITUDE_RANGE`], else `default`.
    #[must_use]
    pub fn base(setting: Option<u32>, default: u32) -> u32 {
        setting
            .filter(|whole| ALTITUDE_RANGE.contains(whole))
            .unwrap_or(default)
    }

    /// The altitudes tried from `base`, in order.
    pub fn candidates(base: u32) -> impl Iterator<Item = Self> {
        (0..ALTITUDE_TRIES).map(move |fraction| Self {
            whole: base,
            fraction,
        })
    }

    /// Whether this stands for a registered callback.
    #[must_use]
    pub const fn is_some(self) -> bool {
        self.whole != 0
    }

    /// Writes the altitude's text ("385291", "385291.3") into `out`;
    /// returns the units written.
    pub fn to_utf16(self, out: &mut [u16; ALTITUDE_CHARS]) -> usize {
        let mut written = push_decimal(self.whole, out, 0);
        if self.fraction != 0 {
            written = push_unit(u16::from(b'.'), out, written);
            written = push_decimal(u32::from(self.fraction), out, written);
        }
        written
    }

    /// The altitude packed in a u64 (`whole` in the high bits), for an
    /// atomic.
    #[must_use]
    pub fn to_bits(self) -> u64 {
        u64::from(self.whole) << 16 | u64::from(self.fraction)
    }

    /// The altitude [`Altitude::to_bits`] packed.
    #[must_use]
    pub fn from_bits(bits: u64) -> Self {
        Self {
            whole: u32::try_from(bits >> 16).unwrap_or(0),
            fraction: u16::try_from(bits & 0xFFFF).unwrap_or(0),
        }
    }
}

/// Writes `unit` at `at` if there is room; returns the next place.
fn push_unit(unit: u16, out: &mut [u16], at: usize) -> usize {
    match out.get_mut(at) {
        Some(place) => {
            *place = unit;
            at + 1
        }
        None => at,
    }
}

/// Writes `number`'s decimal digits from `at`; returns the next place.
fn push_decimal(number: u32, out: &mut [u16], mut at: usize) -> usize {
    let mut divisor = 1;
    while number / divisor >= 10 {
        divisor *= 10;
    }
    loop {
        let digit = u16::try_from(number / divisor % 10).unwrap_or(0);
        at = push_unit(u16::from(b'0') + digit, out, at);
        if divisor == 1 {
            return at;
        }
        divisor /= 10;
    }
}

impl core::fmt::Display for Altitude {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        if self.fraction == 0 {
            write!(f, "{}", self.whole)
        } else {
            write!(f, "{}.{}", self.whole, self.fraction)
        }
    }
}

/// Registers at the first altitude from `base` that no other driver holds:
/// `register` is called with each candidate in turn until it returns
/// anything but [`STATUS_FLT_INSTANCE_ALTITUDE_COLLISION`]. Returns the last
/// status and, when it succeeded, the altitude in use.
///
/// Max IRQL: as `register`'s (`PASSIVE_LEVEL` for the kernel's routines).
pub fn register_at_free_altitude(
    base: u32,
    mut register: impl FnMut(Altitude) -> NtStatus,
) -> (NtStatus, Altitude) {
    let mut status = STATUS_FLT_INSTANCE_ALTITUDE_COLLISION;
    for altitude in Altitude::candidates(base) {
        status = register(altitude);
        if status != STATUS_FLT_INSTANCE_ALTITUDE_COLLISION {
            return (
                status,
                if status >= 0 {
                    altitude
                } else {
                    Altitude::default()
                },
            );
        }
    }
    (status, Altitude::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_whole_part_means_registered() {
        assert!(!Altitude::default().is_some());
        assert!(
            Altitude {
                whole: 385_291,
                fraction: 0
            }
            .is_some()
        );
        assert!(
            !Altitude {
                whole: 0,
                fraction: 3
            }
            .is_some()
        );
    }

    fn text(altitude: Altitude) -> String {
        let mut out = [0_u16; ALTITUDE_CHARS];
        let written = altitude.to_utf16(&mut out);
        String::from_utf16(&out[..written]).unwrap()
    }

    #[test]
    fn altitudes_are_written_as_the_kernel_reads_them() {
        assert_eq!(
            text(Altitude {
                whole: 385_291,
                fraction: 0
            }),
            "385291"
        );
        assert_eq!(
            text(Altitude {
                whole: 385_291,
                fraction: 7
            }),
            "385291.7"
        );
        assert_eq!(
            text(Altitude {
                whole: 429_999,
                fraction: 15
            }),
            "429999.15"
        );
        assert_eq!(
            Altitude {
                whole: 20_000,
                fraction: 3
            }
            .to_string(),
            "20000.3"
        );
    }

    #[test]
    fn a_collision_moves_up_a_fraction_and_gives_up_after_the_last() {
        let mut tried = Vec::new();
        let (status, altitude) = register_at_free_altitude(385_291, |altitude| {
            tried.push(altitude.to_string());
            if altitude.fraction < 2 {
                STATUS_FLT_INSTANCE_ALTITUDE_COLLISION
            } else {
                0
            }
        });
        assert_eq!((status, altitude.to_string().as_str()), (0, "385291.2"));
        assert_eq!(tried, ["385291", "385291.1", "385291.2"]);

        let mut calls = 0;
        let (status, altitude) = register_at_free_altitude(385_291, |_| {
            calls += 1;
            STATUS_FLT_INSTANCE_ALTITUDE_COLLISION
        });
        assert_eq!(calls, ALTITUDE_TRIES);
        assert_eq!(status, STATUS_FLT_INSTANCE_ALTITUDE_COLLISION);
        assert!(!altitude.is_some());

        let other_failure = -1_073_741_823; // STATUS_UNSUCCESSFUL
        let (status, altitude) = register_at_free_altitude(385_291, |_| other_failure);
        assert_eq!(
            (status, altitude),
            (other_failure, Altitude::default()),
            "no retry"
        );
    }

    #[test]
    fn settings_outside_the_allocated_range_keep_the_default() {
        assert_eq!(Altitude::base(None, 385_291), 385_291);
        assert_eq!(Altitude::base(Some(321_000), 385_291), 321_000);
        assert_eq!(Altitude::base(Some(19_999), 385_291), 385_291);
        assert_eq!(Altitude::base(Some(430_000), 385_291), 385_291);
        for altitude in [
            Altitude {
                whole: 429_999,
                fraction: 15,
            },
            Altitude::default(),
        ] {
            assert_eq!(Altitude::from_bits(altitude.to_bits()), altitude);
        }
    }
}
