//! How frames are named for people: the kernel's module list
//! ([`system_modules`]) and user-mode modules per process over time
//! ([`process_modules`]), both as [`modules`] maps, each image with its
//! [`identity`] (how symbol servers file it and its PDB); function names,
//! inlined calls and source lines from the PDB files found by that
//! identity along the [`symbol_path`] ([`pdb_files`], on every host); and
//! the [`symbolizer`] that every output names frames through.

pub mod identity;
pub mod modules;
pub mod pdb_files;
pub mod process_modules;
pub mod symbol_path;
pub mod symbolizer;
pub mod system_modules;
