//! Debian packages and rustup targets the Linux build and tests need,
//! installed only when missing.

use anyhow::{Result, bail};

use crate::process::{self, Run};

/// Debian 12 packages, and what each one is for.
const DEBIAN_PACKAGES: &[(&str, &str)] = &[
    (
        "chromium",
        "headless Chromium, which opens the speedscope export in speedscope's own viewer in the \
         client's export tests",
    ),
    (
        "golang-go",
        "go tool pprof, which reads the client's pprof export in its tests",
    ),
    (
        "gcab",
        "makes the compressed PDB (name.pd_, a cabinet) the symbol server test serves",
    ),
    ("libclang-dev", "libclang for bindgen (wdk-sys bindings)"),
    (
        "llvm",
        "llvm-dlltool and llvm-ar for the WDK import libraries, and llvm-pdbutil, which reads \
         kstack.pdb for the second kernel host",
    ),
    (
        "mingw-w64",
        "DDK headers, GNU import libraries, and the linker for the client",
    ),
    ("patch", "applies the wdk-build Linux-host patch"),
    (
        "time",
        "GNU time: each command's peak memory in `cargo xtask bench size`",
    ),
    (
        "python3-venv",
        "Python's venv module: the second kernel host's venv (speakeasy-emulator, \
         target/kernel-host/venv)",
    ),
    (
        "wine",
        "Wine 8, which hosts kstack.sys for the end-to-end tests and the demo",
    ),
    ("wine64", "Wine's 64-bit loader"),
];

/// Debian packages installed only when their command is not on PATH, and
/// what each is for: a Node.js from elsewhere (`NodeSource`'s) brings its own
/// npm, which Debian's npm package would clash with.
const DEBIAN_PACKAGES_FOR_COMMANDS: &[(&str, &str, &str)] = &[(
    "npm",
    "npm",
    "npm pack fetches speedscope's file-format schema and viewer for the client's export tests",
)];

/// Rust targets: the driver (msvc, linked by rust-lld) and the client that
/// runs under Wine (gnu, linked by mingw-w64).
const RUST_TARGETS: &[&str] = &["x86_64-pc-windows-msvc", "x86_64-pc-windows-gnu"];

/// The nightly toolchain `cargo miri` runs on, pinned so that a new nightly
/// cannot turn CI red on its own (the newest at the time of writing).
pub const MIRI_TOOLCHAIN: &str = "nightly-2026-10-30";

/// Installs whatever is missing; does nothing on a machine that has it all.
pub fn ensure() -> Result<()> {
    ensure_debian_packages()?;
    ensure_rust_targets()?;
    ensure_miri()
}

/// The pinned nightly with Miri, and Miri's own sysroot.
fn ensure_miri() -> Result<()> {
    let installed = Run::new("rustup")
        .args(["run", MIRI_TOOLCHAIN, "cargo", "miri", "--version"])
        .stdout()
        .is_ok();
    if !installed {
        process::step(&format!(
            "installing {MIRI_TOOLCHAIN} with Miri, which checks kstack-abi's and kstack-driver-core's tests \
             for undefined behaviour and data races"
        ));
        Run::new("rustup")
            .args([
                "toolchain",
                "install",
                MIRI_TOOLCHAIN,
                "--profile",
                "minimal",
            ])
            .args(["--component", "miri,rust-src"])
            .run()?;
    }
    // Builds Miri's sysroot once; quick when it is there.
    Run::new("rustup")
        .args(["run", MIRI_TOOLCHAIN, "cargo", "miri", "setup"])
        .stdout()
        .map(drop)
}

fn ensure_debian_packages() -> Result<()> {
    let wanted: Vec<(&str, &str)> = DEBIAN_PACKAGES
        .iter()
        .copied()
        .filter(|&(name, _)| !debian_package_installed(name))
        .chain(
            DEBIAN_PACKAGES_FOR_COMMANDS
                .iter()
                .filter(|&&(command, _, _)| which(command).is_none())
                .map(|&(_, name, why)| (name, why)),
        )
        .collect();
    if wanted.is_empty() {
        return Ok(());
    }
    let missing: Vec<&str> = wanted.iter().map(|&(name, _)| name).collect();
    process::step(&format!(
        "installing Debian packages: {}",
        missing.join(" ")
    ));
    for (name, why) in &wanted {
        println!("    {name}: {why}");
    }
    let as_root = is_root()?;
    if !as_root && which("sudo").is_none() {
        bail!(
            "these Debian packages are missing and neither root nor sudo is available: {}",
            missing.join(" ")
        );
    }
    let apt = |args: &[&str]| {
        let run = if as_root {
            Run::new("apt-get")
        } else {
            Run::new("sudo").args(["apt-get"])
        };
        run.args(args).env("DEBIAN_FRONTEND", "noninteractive")
    };
    apt(&["update", "-qq"]).run()?;
    apt(&["install", "-y", "-qq", "--no-install-recommends"])
        .args(&missing)
        .run()
}

fn debian_package_installed(name: &str) -> bool {
    Run::new("dpkg-query")
        .args(["-W", "-f=${Status}", name])
        .stdout()
        .is_ok_and(|status| status.contains("install ok installed"))
}

fn ensure_rust_targets() -> Result<()> {
    let installed = Run::new("rustup")
        .args(["target", "list", "--installed"])
        .stdout()?;
    let missing: Vec<&str> = RUST_TARGETS
        .iter()
        .copied()
        .filter(|target| !installed.lines().any(|line| line.trim() == *target))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    process::step(&format!("adding Rust targets: {}", missing.join(" ")));
    Run::new("rustup")
        .args(["target", "add"])
        .args(&missing)
        .run()
}

fn is_root() -> Result<bool> {
    Ok(Run::new("id").args(["-u"]).stdout()?.trim() == "0")
}

/// The full path of `program` if it is on PATH.
pub fn which(program: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(program))
            .find(|candidate| candidate.is_file())
    })
}
