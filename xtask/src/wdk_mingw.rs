//! The Linux stand-in for a WDK: a WDK-shaped folder made from mingw-w64's
//! DDK headers and import libraries, and a vendored wdk-build with the small
//! Linux-host patch. See `../shared/PLATFORM-NOTES.md` for what was measured.
//!
//! Windows builds never see any of this: they use the real WDK and the
//! untouched crates.io crates.

use std::{
    collections::BTreeSet,
    fmt::Write as _,
    fs,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};

use crate::{
    host_setup,
    process::{self, Run},
};

/// wdk-build wants `Include/<version>` and `Lib/<version>` folders named like
/// an SDK release. The headers behind this name are mingw-w64's, not that
/// SDK's.
const SDK_VERSION: &str = "10.0.22621.0";
/// Where Debian's mingw-w64 packages put headers and GNU import libraries.
const MINGW_INCLUDE: &str = "/usr/share/mingw-w64/include";
const MINGW_LIB: &str = "/usr/x86_64-w64-mingw32/lib";
/// The kernel import libraries wdk-sys links, by their mingw archive names.
const KERNEL_IMPORT_LIBS: &[&str] = &["ntoskrnl", "hal", "wmilib"];
/// Bump when the tree's recipe changes, so existing trees are rebuilt.
const TREE_RECIPE_REVISION: &str = "1";
/// The wdk-build release the patch is written for (Cargo.lock must agree).
const PATCHED_WDK_BUILD: &str = "wdk-build-0.6.0";

/// What a Linux driver build needs, once prepared.
pub struct LinuxWdk {
    /// Passed to wdk-build as `WDKContentRoot`.
    pub content_root: PathBuf,
    /// Directory source replacing crates.io, with wdk-build patched.
    pub vendor_dir: PathBuf,
    /// Extra clang arguments so bindgen parses mingw headers (GNU mode).
    pub bindgen_clang_args: String,
}

/// Installs prerequisites and (re)creates whatever is missing or stale.
pub fn prepare(workspace: &Path) -> Result<LinuxWdk> {
    host_setup::ensure()?;
    let target = workspace.join("target");
    let content_root = target.join("wdk-mingw");
    ensure_wdk_tree(workspace, &content_root)?;
    let vendor_dir = target.join("linux-vendor");
    ensure_patched_vendor(workspace, &vendor_dir)?;
    let resource_dir = clang_resource_dir()?;
    Ok(LinuxWdk {
        content_root,
        vendor_dir,
        bindgen_clang_args: format!(
            // GNU mode: in MSVC mode clang drops __GNUC__ and mingw's _mingw.h
            // then breaks clang's intrinsics headers. -mms-bitfields keeps the
            // MSVC bit-field layout.
            "--target=x86_64-w64-mingw32 -fno-ms-compatibility -mms-bitfields -resource-dir={}",
            resource_dir.display()
        ),
    })
}

fn compat_header(workspace: &Path) -> PathBuf {
    workspace.join("xtask/wdk-mingw/kstack_mingw_compat.h")
}

fn wdk_build_patch(workspace: &Path) -> PathBuf {
    workspace.join(format!(
        "xtask/wdk-mingw/{PATCHED_WDK_BUILD}-linux-host.patch"
    ))
}

/// Rebuilds the tree only when its inputs changed, so wdk-sys's bindgen run
/// (the slow part of a clean build) is not repeated needlessly.
fn ensure_wdk_tree(workspace: &Path, root: &Path) -> Result<()> {
    let compat =
        fs::read_to_string(compat_header(workspace)).context("reading the mingw compat header")?;
    let mingw_version = Run::new("dpkg-query")
        .args(["-W", "-f=${Version}", "mingw-w64-common"])
        .stdout()?;
    let stamp = format!("recipe {TREE_RECIPE_REVISION}\nmingw-w64 {mingw_version}\n{compat}");
    let stamp_path = root.join("kstack-stamp.txt");
    if fs::read_to_string(&stamp_path).is_ok_and(|existing| existing == stamp) {
        return Ok(());
    }
    process::step(&format!(
        "generating the WDK-shaped tree in {}",
        root.display()
    ));
    if root.exists() {
        fs::remove_dir_all(root).with_context(|| format!("removing {}", root.display()))?;
    }
    let include = root.join("Include").join(SDK_VERSION);
    let km = include.join("km");
    let crt = km.join("crt");
    let lib = root.join("Lib").join(SDK_VERSION).join("km/x64");
    for dir in [&crt, &lib] {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    symlink(MINGW_INCLUDE, include.join("shared")).context("linking the shared headers")?;
    link_ddk_headers(&km, &compat)?;
    // clang's amxintrin.h declares a struct bindgen turns into invalid Rust;
    // this empty header comes first on the include path and hides it.
    fs::write(
        crt.join("amxintrin.h"),
        "/* intentionally empty: see kstack xtask/src/wdk_mingw.rs */\n",
    )?;
    for name in KERNEL_IMPORT_LIBS {
        write_import_lib(root, &lib, name)?;
    }
    // wdk-sys links this /GS helper library; rustc output uses no /GS cookies,
    // so an empty archive satisfies the linker.
    Run::new("llvm-ar")
        .args(["rc"])
        .args([lib.join("BufferOverflowFastFailK.lib")])
        .run()?;
    fs::write(&stamp_path, stamp)?;
    Ok(())
}

/// Links every mingw DDK header into `km`, except `ntstrsafe.h` (the last one
/// wdk-sys includes), which becomes a wrapper adding what mingw lacks.
fn link_ddk_headers(km: &Path, compat: &str) -> Result<()> {
    let ddk = Path::new(MINGW_INCLUDE).join("ddk");
    let entries = fs::read_dir(&ddk).with_context(|| format!("reading {}", ddk.display()))?;
    for entry in entries {
        let path = entry?.path();
        let Some(name) = path.file_name() else {
            continue;
        };
        if name != "ntstrsafe.h" {
            symlink(&path, km.join(name))?;
        }
    }
    fs::write(km.join("kstack_mingw_compat.h"), compat)?;
    fs::write(
        km.join("ntstrsafe.h"),
        format!(
            "/* Generated by kstack's xtask: mingw-w64's ntstrsafe.h plus WDK declarations it lacks. */\n\
             #include \"{}\"\n#include \"kstack_mingw_compat.h\"\n",
            ddk.join("ntstrsafe.h").display()
        ),
    )?;
    Ok(())
}

/// Turns mingw's GNU import archive `lib<name>.a` into an MS-style
/// `<name>.lib` for the same DLL, with data exports marked DATA.
fn write_import_lib(root: &Path, lib_dir: &Path, name: &str) -> Result<()> {
    let archive = Path::new(MINGW_LIB).join(format!("lib{name}.a"));
    let dll = Run::new("x86_64-w64-mingw32-dlltool")
        .args(["-I"])
        .args([&archive])
        .stdout()?;
    let symbols = Run::new("llvm-nm").args([&archive]).stdout()?;
    let def = module_definition(dll.trim(), &symbols)?;
    let def_path = root.join(format!("{name}.def"));
    fs::write(&def_path, def)?;
    Run::new("llvm-dlltool")
        .args(["-m", "i386:x86-64", "-d"])
        .args([&def_path])
        .args(["-l"])
        .args([lib_dir.join(format!("{name}.lib"))])
        .run()
}

/// A `.def` file from `llvm-nm` output of a GNU import archive: each export
/// has an `__imp_` pointer (`I`); functions also have a thunk (`T`), data
/// exports do not.
fn module_definition(dll: &str, nm_output: &str) -> Result<String> {
    let mut imports = BTreeSet::new();
    let mut thunks = BTreeSet::new();
    for line in nm_output.lines() {
        let mut fields = line.split_whitespace().rev();
        let (Some(symbol), Some(kind)) = (fields.next(), fields.next()) else {
            continue;
        };
        match kind {
            "I" => {
                if let Some(export) = symbol.strip_prefix("__imp_") {
                    imports.insert(export);
                }
            }
            "T" => {
                thunks.insert(symbol);
            }
            _ => {}
        }
    }
    if imports.is_empty() {
        bail!("no exports found for {dll}");
    }
    let mut def = format!("LIBRARY {dll}\nEXPORTS\n");
    for export in imports {
        let data = if thunks.contains(export) { "" } else { " DATA" };
        writeln!(def, "{export}{data}")?;
    }
    Ok(def)
}

/// A vendored copy of every dependency with wdk-build patched: as a
/// directory source it replaces crates.io for Linux driver builds only, and
/// keeps the original checksum so Cargo.lock stays the Windows one.
fn ensure_patched_vendor(workspace: &Path, vendor_dir: &Path) -> Result<()> {
    let lock = fs::read_to_string(workspace.join("Cargo.lock")).context("reading Cargo.lock")?;
    let patch_path = wdk_build_patch(workspace);
    let patch = fs::read_to_string(&patch_path).context("reading the wdk-build patch")?;
    let stamp = format!("{lock}\n{patch}");
    let stamp_path = vendor_dir.with_extension("stamp");
    if vendor_dir.is_dir()
        && fs::read_to_string(&stamp_path).is_ok_and(|existing| existing == stamp)
    {
        return Ok(());
    }
    process::step("vendoring dependencies and patching wdk-build for a Linux host");
    let _ = fs::remove_file(&stamp_path);
    // cargo vendor keeps crate folders that already exist; start clean so the
    // patch always meets pristine sources.
    if vendor_dir.exists() {
        fs::remove_dir_all(vendor_dir)
            .with_context(|| format!("removing {}", vendor_dir.display()))?;
    }
    process::cargo(
        workspace,
        &["vendor", "--locked", "--versioned-dirs", "--quiet"],
    )
    .args([vendor_dir])
    .output()?;
    let crate_dir = vendor_dir.join(PATCHED_WDK_BUILD);
    if !crate_dir.is_dir() {
        bail!(
            "Cargo.lock does not use {PATCHED_WDK_BUILD}, the release {} is written for: \
             update the patch together with the wdk-build version",
            patch_path.display()
        );
    }
    Run::new("patch")
        .args(["--quiet", "--forward", "-p1", "-d"])
        .args([&crate_dir])
        .args(["-i"])
        .args([&patch_path])
        .run()?;
    clear_file_checksums(&crate_dir.join(".cargo-checksum.json"))?;
    fs::write(&stamp_path, stamp)?;
    Ok(())
}

/// Cargo checks vendored files against `files`; the patched ones no longer
/// match, so the list is emptied. `package` (the .crate checksum Cargo.lock
/// records) stays as it was.
fn clear_file_checksums(path: &Path) -> Result<()> {
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut checksums: serde_json::Value = serde_json::from_str(&text)?;
    let Some(files) = checksums.get_mut("files") else {
        bail!("{} has no `files` entry", path.display());
    };
    *files = serde_json::json!({});
    fs::write(path, serde_json::to_string(&checksums)?)?;
    Ok(())
}

/// libclang's resource directory (with `mmintrin.h`), which bindgen's libclang
/// does not find by itself here. The newest installed LLVM wins, as in
/// clang-sys.
fn clang_resource_dir() -> Result<PathBuf> {
    let mut candidates = Vec::new();
    for llvm in fs::read_dir("/usr/lib").context("reading /usr/lib")? {
        let llvm = llvm?.path();
        let Some(version) = llvm
            .file_name()
            .and_then(|name| name.to_str())
            .and_then(|name| name.strip_prefix("llvm-"))
            .and_then(|version| version.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(resources) = fs::read_dir(llvm.join("lib/clang")) else {
            continue;
        };
        for resource in resources {
            let resource = resource?.path();
            if resource.join("include/mmintrin.h").is_file() {
                candidates.push((version, resource));
            }
        }
    }
    candidates.into_iter().max().map(|(_, dir)| dir).context(
        "no clang resource directory with include/mmintrin.h under /usr/lib/llvm-*/lib/clang",
    )
}

#[cfg(test)]
mod tests {
    use super::module_definition;

    #[test]
    fn module_definition_marks_exports_without_thunks_as_data() {
        let nm = "\
libntoskrnls00001.o:
00000000 I __imp_KeBugCheckEx
00000000 T KeBugCheckEx
libntoskrnls00002.o:
00000000 I __imp_PsProcessType
00000000 I __lib64_libntoskrnl_a_iname
";
        let def = module_definition("ntoskrnl.exe", nm).unwrap();
        assert_eq!(
            def,
            "LIBRARY ntoskrnl.exe\nEXPORTS\nKeBugCheckEx\nPsProcessType DATA\n"
        );
    }

    #[test]
    fn module_definition_rejects_an_archive_without_exports() {
        assert!(module_definition("x.dll", "foo.o:\n00000000 t .text\n").is_err());
    }
}
