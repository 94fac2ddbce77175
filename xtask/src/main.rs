//! `cargo xtask`: kstack's build, test and demo entry points on a Linux host.
//!
//! Every command first makes sure the machine has what it needs (Debian
//! packages, rustup targets, the WDK-shaped tree, the patched wdk-build), so
//! each works on a fresh Debian 12 machine that only has rustup and cargo.
//! On Windows, build the driver with the real WDK through cargo-make instead
//! (see README.md).

#[cfg(target_os = "linux")]
mod host_setup;
#[cfg(target_os = "linux")]
mod package;
#[cfg(target_os = "linux")]
mod process;
#[cfg(target_os = "linux")]
mod wdk_mingw;

#[cfg(target_os = "linux")]
use std::path::{Path, PathBuf};

#[cfg(target_os = "linux")]
use anyhow::{Context, Result, bail};

#[cfg(target_os = "linux")]
const USAGE: &str = "\
usage: cargo xtask <command>

commands:
  setup        install what the Linux build needs (idempotent)
  build        build kstack.sys and the client into the package folder
  test         build everything, then run lints and every test (CI runs this)
  demo         build the package and show what it holds
  package-dir  print the package folder
  help         print this text";

#[cfg(not(target_os = "linux"))]
fn main() {
    eprintln!(
        "xtask: `cargo xtask` drives the Linux build; on Windows build with the WDK through `cargo make` (README.md)"
    );
    std::process::exit(1);
}

#[cfg(target_os = "linux")]
fn main() {
    if let Err(error) = run(&std::env::args().skip(1).collect::<Vec<_>>()) {
        eprintln!("xtask: error: {error:#}");
        std::process::exit(1);
    }
}

#[cfg(target_os = "linux")]
fn run(args: &[String]) -> Result<()> {
    let [command] = args else {
        bail!("expected exactly one command\n\n{USAGE}");
    };
    let workspace = workspace_root()?;
    match command.as_str() {
        "setup" => {
            wdk_mingw::prepare(&workspace)?;
        }
        "build" => {
            package::build(&workspace)?;
        }
        "test" => test(&workspace)?,
        "demo" => demo(&workspace)?,
        "package-dir" => println!("{}", package::package_dir(&workspace).display()),
        "help" | "--help" | "-h" => println!("{USAGE}"),
        other => bail!("unknown command `{other}`\n\n{USAGE}"),
    }
    Ok(())
}

#[cfg(target_os = "linux")]
/// Builds the real artifacts, then runs formatting, lint and every test.
fn test(workspace: &Path) -> Result<()> {
    let built = package::build(workspace)?;
    process::step("formatting check");
    process::cargo(workspace, &["fmt", "--all", "--check"]).run()?;
    process::step("clippy (host crates)");
    process::cargo(
        workspace,
        &[
            "clippy",
            "--locked",
            "--workspace",
            "--exclude",
            "kstack-driver",
            "--all-targets",
        ],
    )
    .args(["--", "-D", "warnings"])
    .run()?;
    process::step("clippy (driver, x86_64-pc-windows-msvc)");
    package::driver_clippy(workspace, &built.toolchain)?;
    process::step("cargo check of the client for x86_64-pc-windows-msvc");
    process::cargo(
        workspace,
        &[
            "check",
            "--locked",
            "--package",
            "kstack-client",
            "--target",
            package::MSVC_TARGET,
        ],
    )
    .run()?;
    process::step("loom model check of the ring and the rundown gate");
    // Own target dir: --cfg loom changes every crate's build.
    process::cargo(
        workspace,
        &[
            "test",
            "--locked",
            "--release",
            "--package",
            "kstack-driver-core",
            "--test",
            "loom",
        ],
    )
    .env("RUSTFLAGS", "--cfg loom")
    .env("CARGO_TARGET_DIR", workspace.join("target/loom"))
    .run()?;
    process::step("tests");
    process::cargo(
        workspace,
        &[
            "test",
            "--locked",
            "--workspace",
            "--exclude",
            "kstack-driver",
        ],
    )
    .env(package::PACKAGE_DIR_ENV, &built.dir)
    .env(
        package::WINE_SUPPORT_DIR_ENV,
        package::wine_support_dir(workspace),
    )
    .run()?;
    Ok(())
}

#[cfg(target_os = "linux")]
/// Until the Wine demo exists: build the package and say where it is.
fn demo(workspace: &Path) -> Result<()> {
    let built = package::build(workspace)?;
    println!();
    println!("kstack package: {}", built.dir.display());
    for entry in std::fs::read_dir(&built.dir).context("reading the package folder")? {
        let entry = entry?;
        println!(
            "  {:<14} {:>9} bytes",
            entry.file_name().to_string_lossy(),
            entry.metadata()?.len()
        );
    }
    println!();
    println!("On a Windows test VM (test signing on, see README.md), as Administrator:");
    println!("  sc.exe create kstack type= kernel start= demand binPath= C:\\kstack\\kstack.sys");
    println!("  sc.exe start kstack");
    println!("  kstack.exe status");
    Ok(())
}

#[cfg(target_os = "linux")]
/// The workspace root: the parent of this crate's manifest directory.
fn workspace_root() -> Result<PathBuf> {
    let manifest_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .map(Path::to_path_buf)
        .context("xtask's manifest directory has no parent")
}
