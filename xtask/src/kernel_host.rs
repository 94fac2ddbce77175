//! The second kernel host (issue 25): the real kstack.sys under the
//! speakeasy emulator (the `speakeasy-emulator` package) with a modelled
//! ntoskrnl. Its Python harness (`tests/kernel_host/run.py`) builds every
//! request and reads every reply through the `kernel-host-abi` bridge
//! (kstack-tests), so the ABI stays written once, in kstack-abi.

use std::{
    ffi::OsStr,
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};
use kstack_tests::wine_host::INJECTION_DRIVER_DIR;
use serde_json::Value;

use crate::{
    package,
    process::{self, Run},
};

/// The harness and its pinned requirements.
const HARNESS_DIR: &str = "tests/kernel_host";
/// The harness's own Python environment.
const VENV_DIR: &str = "target/kernel-host/venv";
/// In the venv: the requirements it was last installed from.
const INSTALLED_REQUIREMENTS: &str = "installed-requirements.txt";

/// Runs the harness on the package in `package_dir` and the test-injection
/// build; fails when it does. Its output (the summary line CI reads) is
/// inherited.
pub fn run(workspace: &Path, package_dir: &Path) -> Result<()> {
    harness(workspace, package_dir, None)
}

/// Takes the harness's measurement `name` (`tests/kernel_host/measure.py`) on
/// the package in `package_dir`; its line is printed.
pub fn measure(workspace: &Path, package_dir: &Path, name: &str) -> Result<()> {
    harness(workspace, package_dir, Some(name))
}

fn harness(workspace: &Path, package_dir: &Path, measurement: Option<&str>) -> Result<()> {
    let python = ensure_venv(workspace)?;
    process::step("pyflakes over the kernel host's harness");
    Run::new(&python)
        .args(["-m", "pyflakes"])
        .args([workspace.join(HARNESS_DIR)])
        .run()?;
    let bridge = build_bridge(workspace)?;
    let model_driver = build_model_driver(workspace)?;
    let injection = package::wine_support_dir(workspace).join(INJECTION_DRIVER_DIR);
    let arguments = [
        ("--image", package_dir.join("kstack.sys")),
        ("--pdb", package_dir.join("kstack.pdb")),
        ("--test-image", injection.join("kstack.sys")),
        ("--test-pdb", injection.join("kstack.pdb")),
        ("--model-driver", model_driver),
        ("--abi-bridge", bridge),
    ];
    let mut harness = Run::new(python)
        .args([workspace.join(HARNESS_DIR).join("run.py")])
        .current_dir(workspace);
    for (flag, path) in &arguments {
        harness = harness.args([OsStr::new(flag), path.as_os_str()]);
    }
    if let Some(name) = measurement {
        harness = harness.args(["--measure", name]);
    }
    harness.run()
}

/// Builds `model-driver.sys` (`tests/kernel_host/model_driver.c`), the
/// small test driver whose cases pin the modelled kernel, with mingw-w64
/// (as the Wine tests' probe driver is built); returns its path.
fn build_model_driver(workspace: &Path) -> Result<PathBuf> {
    process::step("building the kernel host's model driver (mingw-w64)");
    let driver = workspace.join("target/kernel-host/model-driver.sys");
    Run::new("x86_64-w64-mingw32-gcc")
        .args(["-O2", "-ffreestanding", "-Wall", "-Wextra", "-Werror"])
        .args(["-shared", "-nostdlib", "-nostartfiles"])
        .args(["-Wl,--subsystem,native", "-Wl,--entry,DriverEntry", "-o"])
        .args([&driver])
        .args([workspace.join(HARNESS_DIR).join("model_driver.c")])
        .args(["-lntoskrnl"])
        .run()?;
    Ok(driver)
}

/// The venv's Python, with the pinned requirements installed; pip runs
/// only when the requirements differ from those last installed.
fn ensure_venv(workspace: &Path) -> Result<PathBuf> {
    let requirements_path = workspace.join(HARNESS_DIR).join("requirements.txt");
    let requirements = fs::read_to_string(&requirements_path)
        .with_context(|| format!("reading {}", requirements_path.display()))?;
    let venv = workspace.join(VENV_DIR);
    let python = venv.join("bin/python");
    let stamp = venv.join(INSTALLED_REQUIREMENTS);
    if python.is_file()
        && fs::read_to_string(&stamp).is_ok_and(|installed| installed == requirements)
    {
        return Ok(python);
    }
    process::step(&format!(
        "Python venv for the second kernel host in {}, with what {} pins",
        venv.display(),
        requirements_path.display()
    ));
    if !python.is_file() {
        Run::new("python3")
            .args(["-m", "venv"])
            .args([&venv])
            .run()?;
    }
    Run::new(venv.join("bin/pip"))
        .args(["install", "--quiet", "-r"])
        .args([&requirements_path])
        .run()?;
    fs::write(&stamp, &requirements).with_context(|| format!("writing {}", stamp.display()))?;
    Ok(python)
}

/// Builds the ABI bridge; returns the executable's path as cargo reports
/// it (wherever the target folder is).
fn build_bridge(workspace: &Path) -> Result<PathBuf> {
    process::step("building the kernel host's ABI bridge (kernel-host-abi)");
    let messages = process::cargo(
        workspace,
        &[
            "build",
            "--locked",
            "--package",
            "kstack-tests",
            "--bin",
            "kernel-host-abi",
            "--message-format=json-render-diagnostics",
        ],
    )
    .stdout()?;
    messages
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find_map(|message| message["executable"].as_str().map(PathBuf::from))
        .context("cargo reported no kernel-host-abi executable")
}
