//! Where the tests find what `cargo xtask test` built: the package folder
//! (`KSTACK_PACKAGE_DIR`) and the Wine support folder with the
//! test-injection build (`KSTACK_WINE_SUPPORT_DIR`), each else its default
//! under the workspace's `target`.

use std::{
    env,
    path::{Path, PathBuf},
};

use crate::wine_host::INJECTION_DRIVER_DIR;

/// The variable `cargo xtask test` sets to the package folder.
pub const PACKAGE_DIR_ENV: &str = "KSTACK_PACKAGE_DIR";
/// The variable `cargo xtask test` sets to the Wine support folder.
pub const WINE_SUPPORT_DIR_ENV: &str = "KSTACK_WINE_SUPPORT_DIR";

/// The workspace's root folder.
///
/// # Panics
/// Never: the tests crate is a folder of the workspace.
#[must_use]
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate's manifest directory has a parent (the workspace)")
        .to_path_buf()
}

/// `$variable`, else `default` in the workspace.
fn dir_from_env(variable: &str, default: &str) -> PathBuf {
    match env::var_os(variable) {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => workspace().join(default),
    }
}

/// The package folder: `$KSTACK_PACKAGE_DIR`, else `target/kstack-package`.
#[must_use]
pub fn package_dir() -> PathBuf {
    dir_from_env(PACKAGE_DIR_ENV, "target/kstack-package")
}

/// The test-injection build's folder.
#[must_use]
pub fn injection_build_dir() -> PathBuf {
    dir_from_env(WINE_SUPPORT_DIR_ENV, "target/kstack-wine").join(INJECTION_DRIVER_DIR)
}
