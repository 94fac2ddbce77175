//! Function names from PDB symbols through dbghelp (Windows only).
//!
//! One dbghelp session keyed by a private value, not a process handle: the
//! modules are kernel images and other processes' images, not this
//! process's, so nothing is invaded. Each module is loaded at its base the
//! first time a frame falls in it. A user image of one process may sit at
//! the base of another process's image; one session holds one image per
//! base, so the first one asked for keeps it and the other's frames are
//! named `module+0xoffset`.
//! dbghelp finds the image by the path given (live sessions: the system
//! folders the kernel loads from) or by name on the symbol path, reads the
//! image's debug directory, and loads only the PDB whose GUID and age match
//! it, from the symbol path (folders or `srv*` symbol servers).

use std::{
    collections::HashMap,
    io,
    mem::{offset_of, size_of},
    os::windows::ffi::OsStrExt,
    path::PathBuf,
};

use windows_sys::Win32::{
    Foundation::{GetLastError, HANDLE},
    System::Diagnostics::Debug::{
        MAX_SYM_NAME, SYMBOL_INFOW, SYMOPT_DEFERRED_LOADS, SYMOPT_FAIL_CRITICAL_ERRORS,
        SYMOPT_IGNORE_NT_SYMPATH, SYMOPT_NO_PROMPTS, SYMOPT_UNDNAME, SymCleanup, SymFromAddrW,
        SymInitializeW, SymLoadModuleExW, SymSetOptions,
    },
};

use crate::naming::{
    identity::ImageIdentity,
    modules::Module,
    symbol_path,
    symbolizer::{Function, FunctionSource},
};

/// Its address keys the session: unique in the process, non-zero, and
/// above any handle value, so dbghelp never mistakes it for a real process.
static SESSION_KEY: u8 = 0;

/// Name buffer, in UTF-16 units, that `SymFromAddrW` may fill.
const NAME_UNITS: usize = MAX_SYM_NAME as usize;

/// A dbghelp session; one per process at a time (dbghelp's options are
/// global and its functions single-threaded).
pub struct Dbghelp {
    session: HANDLE,
    image_dirs: Vec<PathBuf>,
    /// Modules asked for, by base: the name, and whether dbghelp took it.
    loaded: HashMap<u64, (String, bool)>,
}

impl Dbghelp {
    /// Starts a session searching `symbol_path` (`;`-separated folders and
    /// symbol servers); images are looked for in `image_dirs` first.
    ///
    /// # Errors
    /// Why dbghelp would not start.
    pub fn start(symbol_path: &str, image_dirs: Vec<PathBuf>) -> io::Result<Self> {
        let session = (&raw const SESSION_KEY).cast_mut().cast();
        // SAFETY: plain flags; no pointers.
        unsafe {
            SymSetOptions(
                SYMOPT_UNDNAME
                    | SYMOPT_DEFERRED_LOADS
                    | SYMOPT_FAIL_CRITICAL_ERRORS
                    | SYMOPT_NO_PROMPTS
                    // The path given is the whole path (--symbols replaces
                    // the environment's).
                    | SYMOPT_IGNORE_NT_SYMPATH,
            )
        };
        let path = wide(symbol_path.as_ref());
        // SAFETY: `path` is NUL-terminated and outlives the call; the key is
        // non-zero; FALSE: no process is enumerated.
        if unsafe { SymInitializeW(session, path.as_ptr(), 0) } == 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            session,
            image_dirs,
            loaded: HashMap::new(),
        })
    }

    /// Loads `module` once, from `image` when known, else found by name in
    /// the image folders or on the symbol path; whether dbghelp holds it
    /// (not when another image holds its base).
    fn load(&mut self, module: &Module, image: Option<&str>) -> bool {
        if let Some((name, loaded)) = self.loaded.get(&module.base) {
            return *loaded && *name == module.name;
        }
        let image = match image {
            Some(path) => wide(path.as_ref()),
            None => symbol_path::find_image(&module.name, &self.image_dirs)
                .map_or_else(|| wide(module.name.as_ref()), |path| wide(path.as_os_str())),
        };
        // SAFETY: the session is open; `image` is NUL-terminated; no file
        // handle, module name or extra data.
        let base = unsafe {
            SymLoadModuleExW(
                self.session,
                std::ptr::null_mut(),
                image.as_ptr(),
                std::ptr::null(),
                module.base,
                module.size,
                std::ptr::null(),
                0,
            )
        };
        // 0 with no error: this base is already loaded.
        let error = if base == 0 {
            // SAFETY: reads this thread's last error.
            unsafe { GetLastError() }
        } else {
            0
        };
        let loaded = error == 0;
        if !loaded {
            // Said once per module, so a missing image is no mystery.
            crate::eprintln_fitted!(
                "kstack: note: dbghelp cannot load {name} ({}); its frames are named {name}+0xoffset. \
                 Put the image on the symbol path, beside its PDB",
                io::Error::from_raw_os_error(error.cast_signed()),
                name = module.name
            );
        }
        self.loaded
            .insert(module.base, (module.name.clone(), loaded));
        loaded
    }
}

impl FunctionSource for Dbghelp {
    fn function(
        &mut self,
        module: &Module,
        image: Option<&str>,
        // dbghelp reads the identity from the image itself.
        _identity: Option<&ImageIdentity>,
        address: u64,
    ) -> Option<Function> {
        if !self.load(module, image) {
            return None;
        }
        // SYMBOL_INFOW ends in a one-unit name; the name continues past it.
        let mut buffer = vec![0_u64; (size_of::<SYMBOL_INFOW>() + NAME_UNITS * 2).div_ceil(8)];
        let info = buffer.as_mut_ptr().cast::<SYMBOL_INFOW>();
        let header = SYMBOL_INFOW {
            SizeOfStruct: u32::try_from(size_of::<SYMBOL_INFOW>()).ok()?,
            MaxNameLen: MAX_SYM_NAME,
            ..SYMBOL_INFOW::default()
        };
        // SAFETY: the buffer is 8-aligned (u64s) and longer than the header.
        unsafe { info.write(header) };
        let mut displacement = 0_u64;
        // SAFETY: the session is open; `info` has SizeOfStruct set and room
        // for MaxNameLen units of name.
        if unsafe { SymFromAddrW(self.session, address, &raw mut displacement, info) } == 0 {
            return None;
        }
        // SAFETY: dbghelp filled the header in place.
        let found = unsafe { info.read() };
        let units = usize::try_from(found.NameLen).ok()?.min(NAME_UNITS - 1);
        let name = info
            .wrapping_byte_add(offset_of!(SYMBOL_INFOW, Name))
            .cast::<u16>();
        // SAFETY: dbghelp wrote NameLen units (at most MaxNameLen - 1 are
        // read) from `Name` on, inside the buffer.
        let name = String::from_utf16_lossy(unsafe { std::slice::from_raw_parts(name, units) });
        // Lines would need SymGetLineFromAddrW64: dbghelp names functions only.
        (!name.is_empty()).then_some(Function {
            name,
            offset: displacement,
            source: Vec::new(),
        })
    }
}

impl Drop for Dbghelp {
    fn drop(&mut self) {
        // SAFETY: the session was opened by `start` and is closed once.
        unsafe { SymCleanup(self.session) };
    }
}

/// A NUL-terminated UTF-16 copy of `text`.
fn wide(text: &std::ffi::OsStr) -> Vec<u16> {
    text.encode_wide().chain([0]).collect()
}
