//! The Linux stand-in for the WDK's stampinf: turns `inf/kstack.inx` into
//! the package's `kstack.inf` with the two substitutions stampinf makes for
//! kstack (`stampinf -a amd64 -d * -v <version>`), so both platforms'
//! packages hold the same INF. It does not validate: `InfVerif` needs the
//! WDK (`tests/tests/windows_deliverables.rs` checks the result instead).

use std::{
    fmt::Write as _,
    fs,
    path::Path,
    time::{SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, Result, bail};

/// stampinf's `-a` value for x64.
const ARCH: &str = "amd64";

/// Writes `inf` from `inx`, dated today (UTC) and versioned
/// `<workspace version>.0`.
pub fn write(inx: &Path, inf: &Path) -> Result<()> {
    let text = fs::read_to_string(inx).with_context(|| format!("reading {}", inx.display()))?;
    let seconds = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .context("the clock is before 1970")?
        .as_secs();
    let date = civil_date(seconds / 86_400);
    let version = format!("{}.0", env!("CARGO_PKG_VERSION"));
    let stamped =
        stamp(&text, date, &version).with_context(|| format!("stamping {}", inx.display()))?;
    fs::write(inf, stamped).with_context(|| format!("writing {}", inf.display()))
}

/// Replaces `$ARCH$` and fills the `DriverVer` line of `[Version]` with
/// `MM/DD/YYYY,version`, keeping the text's line ends.
fn stamp(inx: &str, (year, month, day): (u64, u64, u64), version: &str) -> Result<String> {
    let mut out = String::with_capacity(inx.len() + 32);
    let mut section = String::new();
    let mut stamped = false;
    for line in inx.split_inclusive('\n') {
        let content = line.trim_end_matches(['\r', '\n']);
        let ending = &line[content.len()..];
        let trimmed = content.trim_start();
        if let Some(header) = trimmed.strip_prefix('[') {
            section = header.trim_end().trim_end_matches(']').to_ascii_lowercase();
        }
        let is_driver_ver = section == "version"
            && trimmed
                .split('=')
                .next()
                .is_some_and(|key| key.trim().eq_ignore_ascii_case("DriverVer"));
        if is_driver_ver {
            let _ = write!(out, "DriverVer   = {month:02}/{day:02}/{year:04},{version}");
            stamped = true;
        } else {
            out.push_str(&content.replace("$ARCH$", ARCH));
        }
        out.push_str(ending);
    }
    if !stamped {
        bail!("no `DriverVer =` line in [Version] to stamp");
    }
    Ok(out)
}

/// The proleptic Gregorian date of a day count since 1970-01-01
/// (Howard Hinnant's `civil_from_days`, for days on or after the epoch).
fn civil_date(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(civil_date(0), (1970, 1, 1));
        assert_eq!(civil_date(59), (1970, 3, 1));
        assert_eq!(civil_date(11_016), (2000, 2, 29));
        assert_eq!(civil_date(20_779), (2026, 11, 22));
    }

    #[test]
    fn stamps_arch_and_driver_ver_only() {
        let inx = "[Version]\r\nSignature = \"$WINDOWS NT$\"\r\nDriverVer =\r\n\
                   [DefaultInstall.NT$ARCH$]\r\nCopyFiles = files ; DriverVer = kept\r\n";
        let inf = stamp(inx, (2026, 1, 2), "0.1.0.0").unwrap();
        assert_eq!(
            inf,
            "[Version]\r\nSignature = \"$WINDOWS NT$\"\r\nDriverVer   = 01/02/2026,0.1.0.0\r\n\
             [DefaultInstall.NTamd64]\r\nCopyFiles = files ; DriverVer = kept\r\n"
        );
    }

    #[test]
    fn refuses_an_inx_without_driver_ver() {
        let error = stamp("[Version]\nSignature = x\n", (2026, 1, 2), "0.1.0.0").unwrap_err();
        assert!(error.to_string().contains("DriverVer"));
    }
}
