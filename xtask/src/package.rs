//! Builds the real `kstack.sys` and the client on Linux and lays them out in
//! the package folder: `kstack.sys`, `kstack.pdb`, `kstack.inf`,
//! `kstack.exe` and the test-VM scripts in `scripts`, the layout `cargo make`
//! gives on Windows (which adds the signed `kstack.cat` and the test
//! certificate).

use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};
use kstack_tests::wine_host::{INJECTION_DRIVER_DIR, PROBE_DRIVER, TEST_PROGRAMS};

use crate::{
    inf_stamp,
    process::{self, Run},
    wdk_mingw::{self, LinuxWdk},
};

/// The driver's target; the client is also checked for it.
pub const MSVC_TARGET: &str = "x86_64-pc-windows-msvc";
/// The client's target for running under Wine.
const GNU_TARGET: &str = "x86_64-pc-windows-gnu";
/// Tells integration tests where the package folder is.
pub const PACKAGE_DIR_ENV: &str = "KSTACK_PACKAGE_DIR";
/// Tells the Wine tests where the Wine-only helpers are.
pub const WINE_SUPPORT_DIR_ENV: &str = "KSTACK_WINE_SUPPORT_DIR";

/// A built package.
pub struct Built {
    pub dir: PathBuf,
    pub toolchain: LinuxWdk,
}

pub fn package_dir(workspace: &Path) -> PathBuf {
    workspace.join("target/kstack-package")
}

/// Builds the release driver and client and copies them into the package;
/// then the Wine-only helpers, the test-injection driver among them.
pub fn build(workspace: &Path) -> Result<Built> {
    let toolchain = wdk_mingw::prepare(workspace)?;
    let driver_out = driver_target_dir(workspace)
        .join(MSVC_TARGET)
        .join("release");
    process::step("building kstack.sys (x86_64-pc-windows-msvc, rust-lld)");
    driver_cargo(workspace, &toolchain, "build")
        .args(["--release"])
        .run()?;
    let dir = package_dir(workspace);
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    // Cargo names a cdylib NAME.dll; a kernel driver is the same image as NAME.sys.
    copy(&driver_out.join("kstack.dll"), &dir.join("kstack.sys"))?;
    copy(&driver_out.join("kstack.pdb"), &dir.join("kstack.pdb"))?;
    // Differs from the release build only in the driver crate.
    process::step("building kstack.sys with the test-injection feature (Wine tests only)");
    driver_cargo(workspace, &toolchain, "build")
        .args(["--release", "--features", "test-injection"])
        .run()?;
    let injection_dir = wine_support_dir(workspace).join(INJECTION_DRIVER_DIR);
    fs::create_dir_all(&injection_dir)
        .with_context(|| format!("creating {}", injection_dir.display()))?;
    copy(
        &driver_out.join("kstack.dll"),
        &injection_dir.join("kstack.sys"),
    )?;
    copy(
        &driver_out.join("kstack.pdb"),
        &injection_dir.join("kstack.pdb"),
    )?;
    process::step("building the client (x86_64-pc-windows-gnu, mingw-w64)");
    process::cargo(
        workspace,
        &[
            "build",
            "--locked",
            "--release",
            "--package",
            "kstack-client",
            "--package",
            "kstack-ioctl-storm",
            "--target",
            GNU_TARGET,
        ],
    )
    .args([
        "--config",
        "target.x86_64-pc-windows-gnu.linker=\"x86_64-w64-mingw32-gcc\"",
    ])
    .run()?;
    let gnu_out = workspace.join("target").join(GNU_TARGET).join("release");
    copy(&gnu_out.join("kstack.exe"), &dir.join("kstack.exe"))?;
    build_wine_support(workspace, &gnu_out)?;
    inf_stamp::write(&workspace.join("inf/kstack.inx"), &dir.join("kstack.inf"))?;
    copy_scripts(&workspace.join("scripts/windows"), &dir.join("scripts"))?;
    Ok(Built { dir, toolchain })
}

/// The driver builds' target folder.
fn driver_target_dir(workspace: &Path) -> PathBuf {
    workspace.join("target/driver")
}

/// Where the Wine-only helpers go (never into the package).
pub fn wine_support_dir(workspace: &Path) -> PathBuf {
    workspace.join("target/kstack-wine")
}

/// Puts the Wine-only helpers in place: the test programs (built with the
/// client, in `gnu_out`), the `bcryptprimitives.dll` shim Rust programs
/// need under Wine 8 (see tests/wine/bcryptprimitives.c), and the do-nothing
/// driver whose load the module-record test watches
/// (`tests/wine/probe_driver.c`).
fn build_wine_support(workspace: &Path, gnu_out: &Path) -> Result<()> {
    let dir = wine_support_dir(workspace);
    for program in TEST_PROGRAMS {
        copy(&gnu_out.join(program), &dir.join(program))?;
    }
    Run::new("x86_64-w64-mingw32-gcc")
        .args(["-O2", "-shared", "-o"])
        .args([dir.join("bcryptprimitives.dll")])
        .args([workspace.join("tests/wine/bcryptprimitives.c")])
        .args(["-ladvapi32"])
        .run()?;
    Run::new("x86_64-w64-mingw32-gcc")
        .args(["-O2", "-shared", "-nostdlib", "-nostartfiles"])
        .args(["-Wl,--subsystem,native", "-Wl,--entry,DriverEntry", "-o"])
        .args([dir.join(PROBE_DRIVER)])
        .args([workspace.join("tests/wine/probe_driver.c")])
        .run()
}

/// Lints the driver with the same toolchain setup as its build.
pub fn driver_clippy(workspace: &Path, toolchain: &LinuxWdk) -> Result<()> {
    // --release shares the build-script output (wdk-sys bindings) with the build.
    driver_cargo(workspace, toolchain, "clippy")
        .args(["--release", "--", "-D", "warnings"])
        .run()?;
    driver_cargo(workspace, toolchain, "clippy")
        .args([
            "--release",
            "--features",
            "test-injection",
            "--",
            "-D",
            "warnings",
        ])
        .run()
}

/// A cargo command for the driver crate with the Linux stand-ins wired in:
/// the WDK-shaped tree, bindgen in GNU mode, the patched vendored wdk-build,
/// and rust-lld as the linker.
fn driver_cargo(workspace: &Path, toolchain: &LinuxWdk, subcommand: &str) -> Run {
    process::cargo(
        workspace,
        &[
            subcommand,
            "--locked",
            "--package",
            "kstack-driver",
            "--target",
            MSVC_TARGET,
        ],
    )
    .args([
        "--config".to_owned(),
        "source.crates-io.replace-with=\"kstack-linux-vendor\"".to_owned(),
        "--config".to_owned(),
        format!(
            "source.kstack-linux-vendor.directory=\"{}\"",
            toolchain.vendor_dir.display()
        ),
        "--config".to_owned(),
        format!("target.{MSVC_TARGET}.linker=\"rust-lld\""),
    ])
    // Its own target folder: its dependencies come from the vendored
    // source, and sharing a folder with the crates.io builds of the same
    // crates makes each build redo the other's.
    .env("CARGO_TARGET_DIR", driver_target_dir(workspace))
    .env("WDKContentRoot", &toolchain.content_root)
    .env("BINDGEN_EXTRA_CLANG_ARGS", &toolchain.bindgen_clang_args)
}

/// Copies the test-VM scripts (`*.ps1`, `*.psm1`) into the package's
/// `scripts` folder, where they find the package as their parent folder.
fn copy_scripts(from: &Path, to: &Path) -> Result<()> {
    fs::create_dir_all(to).with_context(|| format!("creating {}", to.display()))?;
    for entry in fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let path = entry?.path();
        let is_script = path
            .extension()
            .is_some_and(|extension| extension == "ps1" || extension == "psm1");
        if is_script && let Some(name) = path.file_name() {
            copy(&path, &to.join(name))?;
        }
    }
    Ok(())
}

fn copy(from: &Path, to: &Path) -> Result<()> {
    fs::copy(from, to)
        .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    Ok(())
}
