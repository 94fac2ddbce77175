//! The driver as a source of records: opening it (or saying plainly that
//! it needs Windows), the live module list, and how long to follow it.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use clap::Args;
#[cfg(windows)]
use kstack_client::device;
use kstack_client::{
    device::{
        session::{self, Follow, FollowSummary},
        transport::Transport,
    },
    error::ClientError,
    naming::{
        identity,
        modules::{Module, ModuleMap},
        system_modules::{self, SystemModule},
    },
};

#[derive(Args)]
pub struct FollowArgs {
    /// Follow the driver for this many seconds (more than 0) instead of
    /// draining it once.
    #[arg(long, value_name = "SECONDS", value_parser = positive_seconds)]
    pub duration: Option<f64>,
    /// Milliseconds between reads when the ring is empty [default: 50].
    #[arg(long, value_name = "MS")]
    interval: Option<u64>,
}

/// A number of seconds more than 0: a `--duration`.
pub fn positive_seconds(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(seconds) if seconds.is_finite() && seconds > 0.0 => Ok(seconds),
        _ => Err(format!("{text:?} is not a positive number of seconds")),
    }
}

impl FollowArgs {
    /// Follow until stopped (Ctrl-C or --duration).
    pub fn until_stopped(&self) -> Follow {
        Follow::UntilStopped {
            deadline: self.deadline(),
            interval: Duration::from_millis(self.interval.unwrap_or(50)),
        }
    }

    /// When --duration, counted from now, ends.
    pub fn deadline(&self) -> Option<Instant> {
        self.duration
            .map(|seconds| Instant::now() + Duration::from_secs_f64(seconds))
    }

    /// Between refreshes of `top --live`.
    pub fn refresh(&self) -> Duration {
        Duration::from_millis(self.interval.unwrap_or(1000))
    }

    /// Drain once, unless --duration asks to follow.
    pub fn drain_or_follow(&self) -> Follow {
        if self.duration.is_some() {
            self.until_stopped()
        } else {
            Follow::UntilDrained
        }
    }
}

pub fn follow_summary_text(summary: &FollowSummary) -> String {
    format!(
        "{} records, {} module records, {} sequence gaps, {} dropped by the driver (ring full) \
         meanwhile",
        summary.received, summary.modules, summary.gaps, summary.dropped
    )
}

/// The Ctrl-C flag. Without a console (a service, some Wine setups) there
/// is no Ctrl-C to catch; --duration still ends the wait.
pub fn stop_flag() -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    let _ = ctrlc::set_handler(move || flag.store(true, Ordering::Relaxed));
    stop
}

/// The module list frames are named after in a live session: the kernel's
/// list, with kstack.sys as the driver reports it replacing whatever the
/// list says about that range.
pub fn live_modules(device: &mut impl Transport) -> Result<ModuleMap, ClientError> {
    live_module_map(device, false)
}

/// [`live_modules`], each image with its identity read from its file where
/// it can be (for a capture to be named elsewhere, later): a kernel
/// module's from the path the kernel lists, kstack.sys's from there or
/// from where its INF installs it (`%SystemRoot%\System32\drivers`).
pub fn identified_live_modules(device: &mut impl Transport) -> Result<ModuleMap, ClientError> {
    live_module_map(device, true)
}

fn live_module_map(device: &mut impl Transport, identify: bool) -> Result<ModuleMap, ClientError> {
    let status = session::status(device)?;
    let system = system_module_list().unwrap_or_else(|error| {
        kstack_client::eprintln_fitted!(
            "kstack: warning: {error}; only frames inside kstack.sys get names"
        );
        Vec::new()
    });
    let system_root = std::env::var("SystemRoot").unwrap_or_default();
    let mut map = ModuleMap::new(system.iter().map(|entry| entry.module.clone()));
    if identify {
        for entry in &system {
            if let Some(identity) = system_modules::win32_path(&entry.path, &system_root)
                .and_then(|path| identity::of_file(&path).ok())
            {
                map.set_identity(entry.module.base, identity);
            }
        }
    }
    let Some(driver) = Module::from_driver_image(status.driver_image) else {
        return Ok(map);
    };
    let mut map = map.with_authoritative(driver.clone());
    if identify && map.identity(&driver).is_none() {
        let installed = std::path::Path::new(&system_root)
            .join("System32")
            .join("drivers")
            .join(&driver.name);
        if let Ok(identity) = identity::of_file(&installed) {
            map.set_identity(driver.base, identity);
        }
    }
    Ok(map)
}

#[cfg(windows)]
fn system_module_list() -> Result<Vec<SystemModule>, system_modules::ModuleListError> {
    system_modules::query()
}

#[cfg(not(windows))]
#[expect(
    clippy::unnecessary_wraps,
    reason = "the same signature as the Windows query"
)]
fn system_module_list() -> Result<Vec<SystemModule>, system_modules::ModuleListError> {
    // Live sessions need the device, so this is never reached off Windows.
    Ok(Vec::new())
}

#[cfg(windows)]
pub fn open_device() -> Result<device::Device, ClientError> {
    device::Device::open()
}

#[cfg(all(not(windows), not(feature = "test-support")))]
pub fn open_device() -> Result<NoDevice, ClientError> {
    Err(ClientError::NeedsWindows)
}

/// The client's own tests build it with `test-support`: then a test can
/// stand a driver that never runs dry in for the device (see
/// `EndlessDriver`); without one, as without the feature.
#[cfg(all(not(windows), feature = "test-support"))]
pub fn open_device() -> Result<kstack_client::device::test_support::EndlessDriver, ClientError> {
    kstack_client::device::test_support::EndlessDriver::from_environment()
        .ok_or(ClientError::NeedsWindows)
}

/// Stands in for the device where there is none, so commands type-check
/// and say plainly that they need Windows.
#[cfg(all(not(windows), not(feature = "test-support")))]
pub enum NoDevice {}

#[cfg(all(not(windows), not(feature = "test-support")))]
impl Transport for NoDevice {
    fn control(
        &mut self,
        _code: u32,
        _input: &[u8],
        _output: &mut [u8],
    ) -> kstack_client::device::transport::Reply {
        match *self {}
    }
}
