//! kstack.sys: a WDM driver that captures kernel stack traces.
//!
//! Where things are: [`recorder`] is the one way into the ring (every
//! source hands its facts to it) and holds the rundown gate; [`loaded`]
//! holds the per-load state, registers the sources and tears everything
//! down; [`sources`] has one file per capture source; [`dispatch`] serves
//! the IRPs; [`device`] owns the device, its DACL and its link; [`pool`]
//! allocates (tags in one place); [`routines`] finds optional kernel exports;
//! [`registry`] reads settings; [`unicode`] makes the kernel's strings; [`paging_executive`] reads what decides
//! whether `DisablePagingExecutive` is in effect; [`kernel`] is the only module touching WDK
//! struct fields. The logic (ring, paging policy, capture, requests) is in
//! kstack-driver-core, tested on the host. `DriverEntry` and `DriverUnload`
//! below are the single setup and teardown path.

#![no_std]

#[cfg(not(test))]
extern crate wdk_panic;

mod device;
mod dispatch;
mod fault_scope;
#[cfg(feature = "test-injection")]
mod injection;
mod kernel;
mod loaded;
mod paging_executive;
mod pool;
mod recorder;
mod registry;
mod routines;
mod sources;
mod stack_expansion;
mod unicode;

use kstack_abi::DriverImage;
use kstack_driver_core::{ring::capacity_for_setting, stack_table::entries_for_setting};
use wdk_sys::{
    DRIVER_OBJECT, IRP_MJ_CLOSE, IRP_MJ_CREATE, IRP_MJ_DEVICE_CONTROL, NTSTATUS, PCUNICODE_STRING,
    STATUS_SUCCESS,
};

use crate::{
    registry::{ParametersKey, read_setting},
    routines::Routines,
    unicode::utf16,
};

// kstack's own code does not allocate through `alloc` (all memory is set up
// at load, in pool.rs); this makes any use by a dependency come from tagged
// non-paged pool.
#[cfg(not(test))]
#[global_allocator]
static GLOBAL_ALLOCATOR: wdk_alloc::WdkAllocator = wdk_alloc::WdkAllocator;

/// The ring capacity in bytes, over all its shards, from the service's
/// `Parameters\RingCapacity` (in KiB).
///
/// Max IRQL: `PASSIVE_LEVEL`.
fn read_ring_capacity(parameters: Option<&ParametersKey>) -> usize {
    capacity_for_setting(read_setting(
        parameters,
        utf16!(kstack_abi::RING_CAPACITY_VALUE),
    ))
}

/// The driver's entry point: state, sources, then the device; on failure
/// the same teardown as unload.
///
/// # Safety
/// Called once by the kernel with its driver object and service key.
///
/// Max IRQL: `PASSIVE_LEVEL`.
#[unsafe(export_name = "DriverEntry")]
pub unsafe extern "system" fn driver_entry(
    driver: *mut DRIVER_OBJECT,
    service_key: PCUNICODE_STRING,
) -> NTSTATUS {
    let routines = Routines::resolve();
    // SAFETY: the kernel passes DriverEntry a valid service key path.
    let parameters = unsafe { service_key.as_ref() }.and_then(ParametersKey::new);
    let paging = paging_executive::read(&routines, parameters.as_ref());
    let ring_size = (
        read_ring_capacity(parameters.as_ref()),
        kernel::active_processor_count(),
        entries_for_setting(read_setting(
            parameters.as_ref(),
            utf16!(kstack_abi::STACK_TABLE_ENTRIES_VALUE),
        )),
    );
    // SAFETY: the kernel passes DriverEntry its valid driver object.
    let image = unsafe { driver.as_ref() }.map_or_else(DriverImage::default, kernel::driver_image);
    let loaded = match loaded::create(routines, paging, image, ring_size, parameters.as_ref()) {
        Ok(loaded) => loaded,
        Err(status) => return status,
    };
    let altitude = |value, default| {
        kstack_abi::Altitude::base(read_setting(parameters.as_ref(), value), default)
    };
    let altitudes = loaded::Altitudes {
        object: altitude(
            utf16!(kstack_abi::altitude::OBJECT_ALTITUDE_VALUE),
            kstack_abi::altitude::OBJECT_ALTITUDE_DEFAULT,
        ),
        registry: altitude(
            utf16!(kstack_abi::altitude::REGISTRY_ALTITUDE_VALUE),
            kstack_abi::altitude::REGISTRY_ALTITUDE_DEFAULT,
        ),
    };
    loaded::register_sources(loaded, driver, &altitudes);
    // The dispatch routines are in place before the device can be opened:
    // its link is visible as soon as `device::create` makes it.
    // SAFETY: the driver object is ours to fill in during DriverEntry; no
    // other reference to it is live.
    let driver_fields = unsafe { &mut *driver };
    for major in [IRP_MJ_CREATE, IRP_MJ_CLOSE, IRP_MJ_DEVICE_CONTROL] {
        driver_fields.MajorFunction[major as usize] = Some(dispatch::dispatch);
    }
    driver_fields.DriverUnload = Some(driver_unload);
    // SAFETY: `driver` is the kernel's driver object for this load.
    let device = match unsafe { device::create(driver) } {
        Ok(device) => device,
        Err(status) => {
            loaded::destroy();
            return status;
        }
    };
    loaded.thread_stacks.set_device(device);
    STATUS_SUCCESS
}

/// Unload: the device first (no new requests), then the single teardown.
///
/// # Safety
/// Called once by the kernel when the service stops.
///
/// Max IRQL: `PASSIVE_LEVEL`.
unsafe extern "C" fn driver_unload(driver: *mut DRIVER_OBJECT) {
    // SAFETY: the driver created exactly one device, still listed here.
    let device = unsafe { (*driver).DeviceObject };
    if !device.is_null() {
        // SAFETY: `device` came from `device::create` and is deleted once.
        unsafe { device::delete(device) };
    }
    loaded::destroy();
}
