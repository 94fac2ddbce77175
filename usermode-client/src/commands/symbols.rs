//! `--symbols`: how frames are named, after a module list and, on
//! Windows, PDB symbols through dbghelp.

use clap::Args;
#[cfg(windows)]
use kstack_client::naming::pdb_symbols;
use kstack_client::{
    device::transport::Transport,
    error::ClientError,
    naming::{modules::ModuleMap, process_modules, symbol_path, symbolizer::Symbolizer},
};

use super::live::live_modules;

#[derive(Args)]
pub struct SymbolsArg {
    /// Name frames `module!function+0xoffset` from PDB symbols found on
    /// this symbol path (`;`-separated folders and `srv*CACHE*URL`
    /// symbol servers): through dbghelp on Windows; elsewhere PDB files
    /// found by the image identities a saved capture carries, downloaded
    /// into a server's cache once. Default: `_NT_SYMBOL_PATH`; "" for none.
    #[arg(long, value_name = "PATH")]
    symbols: Option<String>,
    /// Show kstack.sys's own frames at the top of each stack (the capture
    /// path); without it stacks start at the first frame below them.
    #[arg(long)]
    tracer_frames: bool,
}

/// Where the module list frames are named after comes from.
#[derive(Clone, Copy)]
pub enum ModuleOrigin {
    /// This machine's kernel, now: its images are in the system folders.
    Live,
    /// A saved capture, perhaps from another machine: images and PDBs are
    /// found on the symbol path only.
    Saved,
}

impl SymbolsArg {
    /// Names frames after `modules`, and after functions too when a symbol
    /// path is set. A dbghelp that will not start costs the function names
    /// only.
    ///
    /// # Errors
    /// `--symbols` off Windows.
    pub fn symbolizer(
        &self,
        modules: ModuleMap,
        origin: ModuleOrigin,
    ) -> Result<Symbolizer, ClientError> {
        let symbolizer = self.naming(modules, origin)?;
        Ok(if self.tracer_frames {
            symbolizer.showing_tracer_frames()
        } else {
            symbolizer
        })
    }

    /// The module and function naming of [`SymbolsArg::symbolizer`].
    #[cfg(windows)]
    #[expect(
        clippy::unnecessary_wraps,
        reason = "the same signature as off Windows, where --symbols is refused"
    )]
    fn naming(&self, modules: ModuleMap, origin: ModuleOrigin) -> Result<Symbolizer, ClientError> {
        let symbolizer = Symbolizer::new(modules);
        let environment = std::env::var(symbol_path::ENVIRONMENT_VARIABLE).ok();
        let Some(path) = symbol_path::chosen(self.symbols.as_deref(), environment.as_deref())
        else {
            return Ok(symbolizer);
        };
        let image_dirs = match origin {
            ModuleOrigin::Live => {
                symbol_path::system_image_dirs(std::env::var_os("SystemRoot").as_deref())
            }
            ModuleOrigin::Saved => Vec::new(),
        };
        Ok(match pdb_symbols::Dbghelp::start(&path, image_dirs) {
            Ok(dbghelp) => symbolizer.with_functions(Box::new(dbghelp)),
            Err(error) => {
                kstack_client::eprintln_fitted!(
                    "kstack: warning: dbghelp did not start ({error}); frames are named module+0xoffset"
                );
                symbolizer
            }
        })
    }

    /// Off Windows there is no dbghelp: PDB files are read in Rust
    /// (`pdb_files`), found on the symbol path (`--symbols`, else
    /// `_NT_SYMBOL_PATH`) by the identity a saved capture carries for each
    /// image.
    #[cfg(not(windows))]
    #[expect(clippy::unnecessary_wraps, reason = "the same signature as on Windows")]
    fn naming(&self, modules: ModuleMap, _origin: ModuleOrigin) -> Result<Symbolizer, ClientError> {
        let environment = std::env::var(symbol_path::ENVIRONMENT_VARIABLE).ok();
        let symbolizer = Symbolizer::new(modules);
        Ok(
            match symbol_path::chosen(self.symbols.as_deref(), environment.as_deref()) {
                Some(path) => symbolizer.with_functions(Box::new(
                    kstack_client::naming::pdb_files::PdbFiles::new(&path),
                )),
                None => symbolizer,
            },
        )
    }
}

impl SymbolsArg {
    /// How a live session names frames: the kernel's modules, the running
    /// processes' modules for user frames (listed here, once, at start; the
    /// driver's module records then keep them current, see
    /// `Symbolizer::note_modules`), and functions when a symbol path is
    /// set.
    ///
    /// # Errors
    /// The status request's error, or `--symbols` off Windows.
    pub fn live_symbolizer(&self, device: &mut impl Transport) -> Result<Symbolizer, ClientError> {
        Ok(self
            .symbolizer(live_modules(device)?, ModuleOrigin::Live)?
            .with_processes(process_modules::list_running()))
    }
}
