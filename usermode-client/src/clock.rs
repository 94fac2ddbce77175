//! The record clock: Windows system time (100 ns intervals since
//! 1601-01-01 UTC), as the driver stamps records and the client stamps
//! module lists, read now and turned into Unix time and RFC 3339 text.

use time::{OffsetDateTime, format_description::well_known::Rfc3339};

/// 100 ns intervals between 1601-01-01 and 1970-01-01.
pub(crate) const UNIX_EPOCH_AS_FILETIME: u64 = 116_444_736_000_000_000;

/// A Windows system time (100 ns units since 1601) as RFC 3339 UTC, or
/// `None` when the driver had no clock (0) or the value is out of range.
#[must_use]
pub fn system_time_text(filetime: u64) -> Option<String> {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(system_time_unix_nanos(filetime)?))
        .ok()?
        .format(&Rfc3339)
        .ok()
}

/// The system time now, in the record clock's units (100 ns since 1601;
/// 0 if the clock is before 1970).
#[must_use]
pub fn system_time_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()
        .and_then(|since| u64::try_from(since.as_nanos() / 100).ok())
        .map_or(0, |ticks| ticks + UNIX_EPOCH_AS_FILETIME)
}

/// A Windows system time as nanoseconds since 1970-01-01 UTC, or `None`
/// when the driver had no clock (0) or the time is before 1970.
#[must_use]
pub fn system_time_unix_nanos(filetime: u64) -> Option<u64> {
    filetime
        .checked_sub(UNIX_EPOCH_AS_FILETIME)?
        .checked_mul(100)
}

/// A CPU time in 100 ns units, in milliseconds: `12.5 ms`.
#[must_use]
pub fn cpu_time_text(time: u64) -> String {
    #[expect(clippy::cast_precision_loss, reason = "milliseconds to a tenth")]
    let milliseconds = time as f64 / 10_000.0;
    format!("{milliseconds:.1} ms")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_time_converts_to_utc() {
        assert_eq!(
            system_time_text(UNIX_EPOCH_AS_FILETIME).as_deref(),
            Some("1970-01-01T00:00:00Z")
        );
        assert_eq!(
            system_time_text(UNIX_EPOCH_AS_FILETIME + 17_637_984_010_000_000).as_deref(),
            Some("2025-11-22T08:00:01Z")
        );
        assert_eq!(
            system_time_text(0),
            None,
            "before 1970: treated as no clock"
        );
        assert_eq!(
            system_time_unix_nanos(UNIX_EPOCH_AS_FILETIME + 7),
            Some(700)
        );
        assert_eq!(system_time_unix_nanos(0), None);
    }
}
