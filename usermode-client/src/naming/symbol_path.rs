//! Where PDB symbols are looked for: the symbol path (`--symbols`, else
//! `_NT_SYMBOL_PATH`, as the Windows debuggers and Sysinternals tools take
//! it), and, in a live session, the folders the kernel loads its modules
//! from, where dbghelp finds each image and, through its debug directory,
//! which PDB matches it.

use std::{
    ffi::OsStr,
    path::{Path, PathBuf},
};

/// The environment variable the Windows debuggers and dbghelp read the
/// symbol path from.
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

/// The first file called `name` in `dirs`.
#[must_use]
pub fn find_image(name: &str, dirs: &[PathBuf]) -> Option<PathBuf> {
    dirs.iter()
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
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

    #[test]
    fn an_image_is_found_in_the_first_folder_holding_it() {
        let base = std::env::temp_dir().join(format!("kstack-find-image-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let (drivers, system32) = (base.join("drivers"), base.join("System32"));
        for dir in [&drivers, &system32] {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(system32.join("ntoskrnl.exe"), "").unwrap();
        std::fs::write(system32.join("both.sys"), "").unwrap();
        std::fs::write(drivers.join("both.sys"), "").unwrap();
        std::fs::create_dir(drivers.join("folder.sys")).unwrap();
        let dirs = [drivers.clone(), system32.clone()];
        assert_eq!(
            find_image("ntoskrnl.exe", &dirs),
            Some(system32.join("ntoskrnl.exe"))
        );
        assert_eq!(
            find_image("both.sys", &dirs),
            Some(drivers.join("both.sys"))
        );
        assert_eq!(
            find_image("folder.sys", &dirs),
            None,
            "a folder is no image"
        );
        assert_eq!(find_image("missing.sys", &dirs), None);
        assert_eq!(find_image("ntoskrnl.exe", &[]), None);
        std::fs::remove_dir_all(&base).unwrap();
    }
}
