//! The capture sources, one file each. Every callback hands its facts to
//! `recorder::record` and knows nothing else of the loaded driver.
//! `loaded` registers each callback once at load and unregisters it once at
//! unload; enabling a source only flips a bit in the configuration, which
//! the callback checks (the timer also starts and stops). The on-demand
//! source is the capture-now request, served in kstack-driver-core's
//! `requests`.

pub mod image_load;
pub mod object_handles;
pub mod process;
pub mod registry_operations;
pub mod thread;
pub mod thread_stack;
pub mod timer;
