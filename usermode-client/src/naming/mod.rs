//! How frames are named for people: the kernel's module list
//! ([`system_modules`]) and user-mode modules per process over time
//! ([`process_modules`]), both as [`modules`] maps, each image with its
//! [`identity`] (how symbol servers file it and its PDB); off Windows,
//! function names from PDB files found by that identity (`pdb_files`); on
//! Windows, function
//! names from PDB symbols (`pdb_symbols`, looked for along the
//! [`symbol_path`]); and the [`symbolizer`] that every output names
//! frames through.

pub mod identity;
pub mod modules;
#[cfg(not(windows))]
pub mod pdb_files;
#[cfg(windows)]
pub mod pdb_symbols;
pub mod process_modules;
pub mod symbol_path;
pub mod symbolizer;
pub mod system_modules;
