//! `--symbols`: how frames are named, after a module list and PDB files
//! found along the symbol path (`naming::pdb_files`, the same on every
//! host).

use clap::Args;
use kstack_client::{
    device::transport::Transport,
    error::ClientError,
    naming::{
        modules::ModuleMap, pdb_files::PdbFiles, process_modules, symbol_path,
        symbolizer::Symbolizer,
    },
};

use super::live::live_modules;

#[derive(Args)]
pub struct SymbolsArg {
    /// Name frames `module!function+0xoffset` from PDB symbols found on
    /// this symbol path (`;`-separated folders and `srv*CACHE*URL`
    /// symbol servers), found by each image's identity (the one a saved
    /// capture carries, else read from the image), downloaded into a
    /// server's cache once. Default: `_NT_SYMBOL_PATH`; "" for none.
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
    /// path is set.
    pub fn symbolizer(&self, modules: ModuleMap, origin: ModuleOrigin) -> Symbolizer {
        let symbolizer = self.naming(modules, origin);
        if self.tracer_frames {
            symbolizer.showing_tracer_frames()
        } else {
            symbolizer
        }
    }

    /// The module and function naming of [`SymbolsArg::symbolizer`]: live,
    /// images without an identity are looked for where the kernel loads
    /// its modules from first.
    fn naming(&self, modules: ModuleMap, origin: ModuleOrigin) -> Symbolizer {
        let symbolizer = Symbolizer::new(modules);
        let environment = std::env::var(symbol_path::ENVIRONMENT_VARIABLE).ok();
        let Some(path) = symbol_path::chosen(self.symbols.as_deref(), environment.as_deref())
        else {
            return symbolizer;
        };
        let image_dirs = match origin {
            ModuleOrigin::Live => {
                symbol_path::system_image_dirs(std::env::var_os("SystemRoot").as_deref())
            }
            ModuleOrigin::Saved => Vec::new(),
        };
        symbolizer.with_functions(Box::new(PdbFiles::new(&path).with_image_dirs(image_dirs)))
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
    /// The status request's error.
    pub fn live_symbolizer(&self, device: &mut impl Transport) -> Result<Symbolizer, ClientError> {
        Ok(self
            .symbolizer(live_modules(device)?, ModuleOrigin::Live)
            .with_processes(process_modules::list_running()))
    }
}
