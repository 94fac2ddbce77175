//! Lets wdk-build configure the kernel-image link (entry point, subsystem,
//! WDK libraries) from `[package.metadata.wdk]`.

fn main() -> Result<(), wdk_build::ConfigError> {
    // A driver image carries a valid PE checksum; /RELEASE makes the linker
    // (link.exe on Windows, rust-lld on Linux) write it.
    println!("cargo::rustc-cdylib-link-arg=/RELEASE");
    // Compatible with CET shadow stacks (kernel-mode hardware-enforced
    // stack protection): the linker writes the extended DLL characteristics
    // debug entry that says so. kstack's code never returns anywhere but to
    // its caller (no longjmp, no unwinding: panic aborts).
    println!("cargo::rustc-cdylib-link-arg=/CETCOMPAT");
    wdk_build::configure_wdk_binary_build()
}
