//! The capture sources, one file each. Every callback is registered once at
//! load and unregistered once at unload; enabling a source only flips a bit
//! in the configuration, which the callback checks (the timer also starts
//! and stops). The on-demand source is the capture-now request, served in
//! kstack-driver-core's `requests`.

pub mod image_load;
pub mod object_handles;
pub mod process;
pub mod registry_operations;
pub mod thread;
pub mod timer;

use kstack_abi::Source;
use kstack_driver_core::SourceRegistration;
use wdk_sys::{DRIVER_OBJECT, STATUS_SUCCESS};

use crate::loaded::LoadedDriver;

/// The base altitudes of the object and registry callbacks (see
/// `kstack_abi::altitude`).
pub struct Altitudes {
    pub object: u32,
    pub registry: u32,
}

/// Registers every source the kernel supports and records each result.
///
/// Max IRQL: `PASSIVE_LEVEL`.
pub fn register_all(driver: &LoadedDriver, driver_object: *mut DRIVER_OBJECT, bases: &Altitudes) {
    let (registry, registry_altitude) =
        driver
            .registry
            .register(&driver.routines, driver_object, bases.registry);
    let (objects, object_altitude) = driver.objects.register(bases.object);
    let results = [
        (Source::Process, process::register()),
        (Source::Thread, thread::register()),
        (Source::ImageLoad, image_load::register()),
        (Source::Registry, registry),
        (Source::ObjectHandle, objects),
        (Source::Timer, driver.timer.initialize()),
        (Source::OnDemand, STATUS_SUCCESS),
    ];
    for (source, status) in results {
        // The injection build makes every source but the timer and
        // capture-now (which Wine fires) injectable when the kernel lacks it.
        #[cfg(feature = "test-injection")]
        let status = if matches!(source, Source::Timer | Source::OnDemand) {
            status
        } else {
            crate::injection::registration(status)
        };
        driver
            .core
            .set_registration(source, SourceRegistration { status });
    }
    for (source, altitude) in [
        (Source::Registry, registry_altitude),
        (Source::ObjectHandle, object_altitude),
    ] {
        driver.core.set_altitude(source, altitude);
    }
}

/// Unregisters what [`register_all`] registered and stops the timer.
///
/// Max IRQL: `PASSIVE_LEVEL`.
pub fn unregister_all(driver: &LoadedDriver) {
    let registered = |source| driver.core.registration(source).available();
    if registered(Source::Process) {
        process::unregister();
    }
    if registered(Source::Thread) {
        thread::unregister();
    }
    if registered(Source::ImageLoad) {
        image_load::unregister();
    }
    if registered(Source::Registry) {
        driver.registry.unregister(&driver.routines);
    }
    if registered(Source::ObjectHandle) {
        driver.objects.unregister();
    }
    driver.timer.stop();
}
