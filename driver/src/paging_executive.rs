//! Reads, at load, what decides whether `DisablePagingExecutive`=1 is in
//! effect: the value, when its key was last written, when the system booted,
//! and the service's override. The decision itself, and its documentation,
//! is `kstack_abi::paging`.

use kstack_abi::{PagingExecutive, paging::ASSUME_IN_EFFECT_VALUE};

use crate::{
    registry::{self, Dword, ParametersKey, read_setting},
    routines::Routines,
    unicode::{unicode_string, utf16},
};

/// `SystemTimeOfDayInformation`, the class of `ZwQuerySystemInformation`.
const SYSTEM_TIME_OF_DAY_INFORMATION: u32 = 3;

/// Reads everything and decides; anything unreadable counts against "in
/// effect".
///
/// Max IRQL: `PASSIVE_LEVEL`.
pub fn read(routines: &Routines, parameters: Option<&ParametersKey>) -> PagingExecutive {
    let key = unicode_string(utf16!(
        r"\Registry\Machine\SYSTEM\CurrentControlSet\Control\Session Manager\Memory Management"
    ));
    let (configured, key_written) =
        match registry::read_dword_and_key_time(&key, utf16!("DisablePagingExecutive")) {
            Ok((Dword::Value(value), written)) => (Some(value), written),
            Ok((Dword::Absent | Dword::WrongType, _)) | Err(_) => (None, None),
        };
    let override_set = read_setting(parameters, utf16!(ASSUME_IN_EFFECT_VALUE)) == Some(1);
    PagingExecutive::decide(configured, key_written, boot_time(routines), override_set)
}

/// The earlier of the kernel's boot time and that time before any clock
/// change (`BootTime`, `BootTime - BootTimeBias`): a key written after boot
/// carries a time at or after one of them.
///
/// Max IRQL: `PASSIVE_LEVEL`.
fn boot_time(routines: &Routines) -> Option<u64> {
    let query = routines.query_system_information?;
    // SYSTEM_TIMEOFDAY_INFORMATION (48 bytes): BootTime, CurrentTime,
    // TimeZoneBias (i64 each), TimeZoneId, Reserved (u32 each),
    // BootTimeBias, SleepTimeBias (u64 each).
    let mut information = [0_u64; 6];
    let mut returned = 0_u32;
    // SAFETY: the buffer outlives the call and its length is passed with it.
    let status = unsafe {
        query(
            SYSTEM_TIME_OF_DAY_INFORMATION,
            information.as_mut_ptr().cast(),
            u32::try_from(size_of_val(&information)).unwrap_or(0),
            &raw mut returned,
        )
    };
    let [boot, _, _, _, bias, _] = information;
    if status < 0 || returned < 40 || boot == 0 {
        return None;
    }
    Some(boot.min(boot.wrapping_sub(bias)))
}
