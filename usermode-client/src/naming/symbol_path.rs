//! Where PDB symbols are looked for: the symbol path (`--symbols`, else
//! `_NT_SYMBOL_PATH`, as the Windows debuggers and Sysinternals tools take
//! it), and, in a live session, the folders the kernel loads its modules
//! from, where an image is found to read, from its debug directory, which
//! PDB matches it (`pdb_files`).

use std::{
    ffi::OsStr,
    path::{Path, PathBuf},
};

/// The environment variable the Windows debuggers read the symbol path
/// from.
pub const ENVIRONMENT_VARIABLE: &str = "_NT_SYMBOL_PATH";

/// The symbol path in force: `--symbols` when given, else the environment's.
/// Either one empty means none, so `--symbols ""` turns symbols off.
#[must_use]
pub fn chosen(flag: Option<&str>, environment: Option<&str>) -> Option<String> {
    flag.or(environment)
        .map(str::trim)
        .filter(|path| !path.is_empty())
        .map(str::to_owned)
}

/// Where a running Windows keeps the images of its kernel modules, given
/// `%SystemRoot%`: drivers first (most modules), then `System32`
/// (`ntoskrnl.exe`, `hal.dll`).
#[must_use]
pub fn system_image_dirs(system_root: Option<&OsStr>) -> Vec<PathBuf> {
    system_root.map_or_else(Vec::new, |root| {
        let system32 = Path::new(root).join("System32");
        vec![system32.join("drivers"), system32]
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_wins_and_empty_means_none() {
        let chosen = |flag, environment| chosen(flag, environment);
        assert_eq!(
            chosen(Some(r"C:\sym"), Some(r"D:\env")).as_deref(),
            Some(r"C:\sym")
        );
        assert_eq!(
            chosen(None, Some(r"srv*C:\sym")).as_deref(),
            Some(r"srv*C:\sym")
        );
        assert_eq!(
            chosen(Some(""), Some(r"D:\env")),
            None,
            "--symbols \"\" turns them off"
        );
        assert_eq!(chosen(None, Some("  ")), None);
        assert_eq!(chosen(None, None), None);
    }

    #[test]
    fn system_images_are_searched_in_drivers_then_system32() {
        let root = Path::new("root");
        assert_eq!(
            system_image_dirs(Some(root.as_os_str())),
            [root.join("System32").join("drivers"), root.join("System32")]
        );
        assert_eq!(system_image_dirs(None), Vec::<PathBuf>::new());
    }
}
