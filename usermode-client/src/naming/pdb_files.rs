//! Function names from PDB files read in Rust (`pdb-addr2line`), on
//! Windows and elsewhere alike: each module's PDB is found on the symbol
//! path by the image's identity (`naming::identity`), and only a PDB whose
//! GUID and age are the image's is used.
//!
//! The image's identity is the one a saved capture carries; when there is
//! none (a live session, a capture of format 3 or older) it is read from
//! the image: at the path the module list or a module record gave, else by
//! name in the image folders (a live session's: where the kernel loads its
//! modules from) and the symbol path's folders, as the debuggers find
//! images. An image whose `SizeOfImage` is not the module's is another
//! build's and is refused.
//!
//! Where it looks, for a PDB `name.pdb` whose symbol server key is `KEY`
//! (GUID and age), in each entry of the path in order (`;`-separated, in
//! the Windows debuggers' syntax):
//! - a folder `DIR`: the store folder `DIR/name.pdb/KEY` (a symbol store's
//!   layout), then `DIR/name.pdb` (checked: another build's PDB is
//!   refused);
//! - `srv*CACHE*URL` (or `cache*CACHE`): the store folder
//!   `CACHE/name.pdb/KEY`, and when the cache lacks it, the server's
//!   `URL/name.pdb/KEY`, downloaded into the cache as `name.pdb` (through a
//!   temporary file, kept only once its GUID and age are checked), so each
//!   PDB is downloaded once. HTTPS goes through rustls off Windows and the
//!   system's TLS and certificate store on Windows.
//!
//! A store folder (local or on the server) is asked, as the debuggers'
//! symsrv asks, for `name.pdb`, then `name.pd_` (the PDB compressed in a
//! cabinet, as `symstore /compress` files it: expanded), then `file.ptr`
//! (`PATH:` where the PDB is, followed; `MSG:` why there is none, said).
//!
//! What was not found, or refused, is said once per PDB (or image) on
//! stderr, with every place looked at; those frames stay
//! `module+0xoffset`.

use std::{
    collections::HashMap,
    io::Cursor,
    path::{Path, PathBuf},
};

use pdb_addr2line::{Context, ContextPdbData, pdb::PDB};

use crate::naming::{
    identity::{self, DebugIdentity, ImageIdentity},
    modules::Module,
    symbolizer::{Function, FunctionSource, SourceFrame},
};

/// One entry of the symbol path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathEntry {
    /// A folder of PDBs, flat or in a symbol store's layout.
    Folder(PathBuf),
    /// A symbol server's local cache, and where it downloads from.
    Server {
        /// The cache folder (a symbol store's layout).
        cache: PathBuf,
        /// The server, when named.
        url: Option<String>,
    },
}

/// Parses a symbol path (`--symbols`, `_NT_SYMBOL_PATH`): entries separated
/// by `;`, each a folder, `srv*CACHE*URL`, `srv*URL` (no cache: nothing
/// local to read), `symsrv*symsrv.dll*CACHE*URL` or `cache*CACHE`.
#[must_use]
pub fn parse_path(path: &str) -> Vec<PathEntry> {
    path.split(';')
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
        .filter_map(|entry| {
            let parts: Vec<&str> = entry.split('*').collect();
            match parts
                .first()
                .map(|kind| kind.to_ascii_lowercase())
                .as_deref()
            {
                Some("srv") => server(&parts[1..]),
                Some("symsrv") => server(parts.get(2..).unwrap_or_default()),
                Some("cache") => parts.get(1).map(|cache| PathEntry::Server {
                    cache: PathBuf::from(cache),
                    url: None,
                }),
                _ => Some(PathEntry::Folder(PathBuf::from(entry))),
            }
        })
        .collect()
}

/// `CACHE*URL`, `URL` or `CACHE` after `srv*`.
fn server(parts: &[&str]) -> Option<PathEntry> {
    let is_url = |part: &&str| part.contains("://");
    let cache = parts
        .iter()
        .find(|part| !is_url(part) && !part.is_empty())?;
    Some(PathEntry::Server {
        cache: PathBuf::from(cache),
        url: parts
            .iter()
            .find(|part| is_url(part))
            .map(|url| (*url).to_owned()),
    })
}

/// A PDB read and ready to answer, or why there is none.
enum Loaded {
    Ready(Box<Symbols>),
    Missing,
}

/// A PDB's function and line tables, ready for lookups. The context
/// borrows the PDB's data, which is therefore kept for the rest of the
/// run (a command reads a handful of PDBs, once each).
struct Symbols {
    context: Context<'static, 'static>,
}

/// Function names from the PDBs on a symbol path.
pub struct PdbFiles {
    path: Vec<PathEntry>,
    /// Where images without an identity are looked for by name, before
    /// the symbol path's folders.
    image_dirs: Vec<PathBuf>,
    /// By PDB name and key.
    loaded: HashMap<(String, String), Loaded>,
    /// Identities read from images, by module (`None`: no image found).
    read_images: HashMap<Module, Option<ImageIdentity>>,
    /// The HTTP agent of every download, made at the first: its
    /// connections are kept for the next PDB from the same server.
    agent: std::cell::OnceCell<ureq::Agent>,
}

impl PdbFiles {
    /// Reads PDBs found along `path` (see the module).
    #[must_use]
    pub fn new(path: &str) -> Self {
        Self {
            path: parse_path(path),
            image_dirs: Vec::new(),
            loaded: HashMap::new(),
            read_images: HashMap::new(),
            agent: std::cell::OnceCell::new(),
        }
    }

    /// Looks for images without an identity in `dirs` first.
    #[must_use]
    pub fn with_image_dirs(mut self, dirs: Vec<PathBuf>) -> Self {
        self.image_dirs = dirs;
        self
    }

    /// The identity of `module`'s image read from the image (see the
    /// module), once; what was not found is said on stderr, once.
    fn read_image(&mut self, module: &Module, image: Option<&str>) -> Option<&ImageIdentity> {
        if !self.read_images.contains_key(module) {
            let found = self.find_image(module, image);
            self.read_images.insert(module.clone(), found);
        }
        self.read_images.get(module)?.as_ref()
    }

    fn find_image(&self, module: &Module, image: Option<&str>) -> Option<ImageIdentity> {
        let folders = self.path.iter().filter_map(|entry| match entry {
            PathEntry::Folder(dir) => Some(dir),
            PathEntry::Server { .. } => None,
        });
        let candidates = image.map(PathBuf::from).into_iter().chain(
            self.image_dirs
                .iter()
                .chain(folders)
                .map(|dir| dir.join(&module.name)),
        );
        let mut looked = Vec::new();
        for candidate in candidates {
            if !candidate.is_file() {
                looked.push(format!("{} (absent)", candidate.display()));
                continue;
            }
            match identity::of_file(&candidate) {
                Ok(found) if found.size_of_image == module.size => {
                    return Some(found);
                }
                Ok(found) => looked.push(format!(
                    "{} (another build: SizeOfImage {:#x}, the module's {:#x})",
                    candidate.display(),
                    found.size_of_image,
                    module.size
                )),
                Err(why) => looked.push(format!("{} ({why})", candidate.display())),
            }
        }
        crate::eprintln_fitted!(
            "kstack: no image of {} to find its PDB by: looked at {}; its frames stay {}+0xoffset",
            module.name,
            if looked.is_empty() {
                "nothing (no image path, image folder or symbol path folder)".to_owned()
            } else {
                looked.join(", ")
            },
            module.name
        );
        None
    }

    /// Where `debug`'s PDB may be, in the path's order.
    fn candidates(&self, debug: &DebugIdentity) -> Vec<Candidate> {
        let name = &debug.pdb_name;
        let key = debug.symbol_server_key();
        let stored = |dir: &Path| dir.join(name).join(&key);
        let mut candidates = Vec::new();
        for entry in &self.path {
            match entry {
                PathEntry::Folder(dir) => {
                    candidates.push(Candidate::Store(stored(dir)));
                    candidates.push(Candidate::File(dir.join(name)));
                }
                PathEntry::Server { cache, url } => {
                    candidates.push(Candidate::Store(stored(cache)));
                    if let Some(url) = url {
                        candidates.push(Candidate::Server {
                            url: format!("{}/{name}/{key}", url.trim_end_matches('/')),
                            cache: stored(cache),
                        });
                    }
                }
            }
        }
        candidates
    }

    /// The PDB of `debug`, read once; what was not found or did not match
    /// is said on stderr, once.
    fn load(&mut self, module: &Module, debug: &DebugIdentity) -> Option<&Symbols> {
        let key = (debug.pdb_name.clone(), debug.symbol_server_key());
        if !self.loaded.contains_key(&key) {
            let loaded = self.find(module, debug);
            self.loaded.insert(key.clone(), loaded);
        }
        match self.loaded.get(&key)? {
            Loaded::Ready(symbols) => Some(symbols),
            Loaded::Missing => None,
        }
    }

    fn find(&self, module: &Module, debug: &DebugIdentity) -> Loaded {
        let mut looked = Vec::new();
        for candidate in self.candidates(debug) {
            let found = match candidate {
                Candidate::File(path) => read_file_at(&path, debug, &mut looked),
                Candidate::Store(dir) => read_store(&dir, debug, &mut looked),
                Candidate::Server { url, cache } => download(
                    self.agent.get_or_init(http_agent),
                    &url,
                    &cache,
                    debug,
                    &mut looked,
                ),
            };
            if let Some(symbols) = found {
                return Loaded::Ready(Box::new(symbols));
            }
        }
        crate::eprintln_fitted!(
            "kstack: no symbols for {} ({} {}): looked at {}; its frames stay {}+0xoffset",
            module.name,
            debug.pdb_name,
            debug.symbol_server_key(),
            if looked.is_empty() {
                "nothing (the symbol path has no folder or cache)".to_owned()
            } else {
                looked.join(", ")
            },
            module.name
        );
        Loaded::Missing
    }
}

/// A place a PDB may be.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Candidate {
    /// A file that is the PDB or another build's (a flat folder).
    File(PathBuf),
    /// A symbol store's folder for one PDB (`name.pdb/KEY`): its
    /// `name.pdb`, compressed `name.pd_` or `file.ptr`.
    Store(PathBuf),
    /// A symbol server's folder for one PDB (`URL/name.pdb/KEY`), and the
    /// cache's folder for it, where what is downloaded is kept as
    /// `name.pdb`.
    Server { url: String, cache: PathBuf },
}

/// What a symbol store's folder for one PDB may hold, in the order the
/// debuggers' symsrv asks for them.
#[derive(Clone, Copy)]
enum StoredAs {
    /// `name.pdb`.
    Plain,
    /// `name.pd_`: a cabinet holding it.
    Compressed,
    /// `file.ptr`: `PATH:` where the PDB is, or `MSG:` why there is none.
    Pointer,
}

impl StoredAs {
    const ALL: [Self; 3] = [Self::Plain, Self::Compressed, Self::Pointer];

    fn file_name(self, pdb_name: &str) -> String {
        match self {
            Self::Plain => pdb_name.to_owned(),
            Self::Compressed => compressed_name(pdb_name),
            Self::Pointer => "file.ptr".to_owned(),
        }
    }
}

/// `name.pd_` for `name.pdb`: the name's last character replaced by `_`.
fn compressed_name(name: &str) -> String {
    let mut compressed = name.to_owned();
    compressed.pop();
    compressed.push('_');
    compressed
}

/// The PDB in a symbol store's folder for it (see [`StoredAs`]).
fn read_store(dir: &Path, debug: &DebugIdentity, looked: &mut Vec<String>) -> Option<Symbols> {
    for stored in StoredAs::ALL {
        let path = dir.join(stored.file_name(&debug.pdb_name));
        let Ok(bytes) = std::fs::read(&path) else {
            continue;
        };
        match unpack(stored, bytes).and_then(|pdb| open(pdb, debug)) {
            Ok(symbols) => return Some(symbols),
            Err(why) => looked.push(format!("{} ({why})", path.display())),
        }
    }
    looked.push(format!("{} (absent)", dir.display()));
    None
}

/// The PDB at `path`, when it is `debug`'s.
fn read_file_at(path: &Path, debug: &DebugIdentity, looked: &mut Vec<String>) -> Option<Symbols> {
    let opened = std::fs::read(path)
        .map_err(|error| {
            if error.kind() == std::io::ErrorKind::NotFound {
                "absent".to_owned()
            } else {
                error.to_string()
            }
        })
        .and_then(|bytes| open(bytes, debug));
    opened
        .map_err(|why| looked.push(format!("{} ({why})", path.display())))
        .ok()
}

/// The PDB's bytes from what a store holds as `stored`: a cabinet
/// expanded, a pointer followed (to a plain or compressed file).
fn unpack(stored: StoredAs, bytes: Vec<u8>) -> Result<Vec<u8>, String> {
    match stored {
        StoredAs::Plain => Ok(bytes),
        StoredAs::Compressed => expand(bytes),
        StoredAs::Pointer => {
            let text = String::from_utf8_lossy(&bytes);
            let text = text.trim();
            if let Some(message) = text.strip_prefix("MSG:") {
                return Err(format!("the store says: {}", message.trim()));
            }
            let target = text
                .strip_prefix("PATH:")
                .ok_or_else(|| format!("a file.ptr that is neither PATH: nor MSG: ({text:.40})"))?
                .trim();
            let pointed = std::fs::read(target).map_err(|error| format!("{target}: {error}"))?;
            if target.ends_with('_') {
                expand(pointed)
            } else {
                Ok(pointed)
            }
        }
    }
}

/// The one file a `name.pd_` cabinet holds.
fn expand(cabinet: Vec<u8>) -> Result<Vec<u8>, String> {
    let mut cabinet = cab::Cabinet::new(std::io::Cursor::new(cabinet))
        .map_err(|error| format!("not a cabinet: {error}"))?;
    let name = cabinet
        .folder_entries()
        .flat_map(cab::FolderEntry::file_entries)
        .map(|file| file.name().to_owned())
        .next()
        .ok_or("an empty cabinet")?;
    let mut expanded = Vec::new();
    std::io::Read::read_to_end(
        &mut cabinet
            .read_file(&name)
            .map_err(|error| format!("expanding {name}: {error}"))?,
        &mut expanded,
    )
    .map_err(|error| format!("expanding {name}: {error}"))?;
    Ok(expanded)
}

/// The longest a PDB's download may take (the kernel's is tens of MB).
const DOWNLOAD_TIMEOUT: std::time::Duration = std::time::Duration::from_mins(5);

/// The agent downloads go through: each download at most
/// [`DOWNLOAD_TIMEOUT`]; on Windows the system's TLS (schannel) and
/// certificate store, as Windows' own tools trust them.
fn http_agent() -> ureq::Agent {
    let config = ureq::Agent::config_builder().timeout_global(Some(DOWNLOAD_TIMEOUT));
    #[cfg(windows)]
    let config = config.tls_config(
        ureq::tls::TlsConfig::builder()
            .provider(ureq::tls::TlsProvider::NativeTls)
            .root_certs(ureq::tls::RootCerts::PlatformVerifier)
            .build(),
    );
    config.build().into()
}

/// Downloads `debug`'s PDB from a symbol server's folder for it (`url`)
/// through `agent`: `name.pdb`, else `name.pd_`, else `file.ptr`, as
/// symsrv asks; what is found is kept in the cache folder as `name.pdb`,
/// written through a temporary file beside it once it reads as `debug`'s
/// PDB.
fn download(
    agent: &ureq::Agent,
    url: &str,
    cache: &Path,
    debug: &DebugIdentity,
    looked: &mut Vec<String>,
) -> Option<Symbols> {
    for stored in StoredAs::ALL {
        let file_url = format!("{url}/{}", stored.file_name(&debug.pdb_name));
        let fetched = match agent.get(&file_url).call() {
            Ok(response) => {
                let mut bytes = Vec::new();
                std::io::Read::read_to_end(&mut response.into_body().into_reader(), &mut bytes)
                    .map(|_| bytes)
                    .map_err(|error| format!("downloading: {error}"))
            }
            // Not there as this: the next form may be.
            Err(ureq::Error::StatusCode(404)) => continue,
            Err(ureq::Error::StatusCode(code)) => Err(format!("HTTP {code}")),
            Err(other) => Err(other.to_string()),
        };
        let kept = fetched
            .and_then(|bytes| unpack(stored, bytes))
            .and_then(|pdb| {
                let temp = stage(cache, &pdb)?;
                let symbols = open(pdb, debug)?;
                let to = cache.join(&debug.pdb_name);
                temp.persist(&to)
                    .map_err(|error| format!("{}: {}", to.display(), error.error))?;
                Ok(symbols)
            });
        return kept
            .map_err(|why| looked.push(format!("{file_url} ({why})")))
            .ok();
    }
    looked.push(format!(
        "{url} (HTTP 404 for {}, {} and file.ptr)",
        debug.pdb_name,
        compressed_name(&debug.pdb_name)
    ));
    None
}

/// `pdb` written to a temporary file in the cache folder `dir`, to be
/// renamed into place once checked (and removed if dropped before).
fn stage(dir: &Path, pdb: &[u8]) -> Result<tempfile::NamedTempFile, String> {
    let in_dir = |error: std::io::Error| format!("{}: {error}", dir.display());
    std::fs::create_dir_all(dir).map_err(in_dir)?;
    let mut temp = tempfile::Builder::new()
        .prefix(".kstack-")
        .suffix(".pdb")
        .tempfile_in(dir)
        .map_err(in_dir)?;
    std::io::Write::write_all(&mut temp, pdb).map_err(in_dir)?;
    Ok(temp)
}

/// The PDB in `data`, if it is `debug`'s: its GUID and age checked.
fn open(data: Vec<u8>, debug: &DebugIdentity) -> Result<Symbols, String> {
    let mut pdb = PDB::open(Cursor::new(data)).map_err(|error| format!("not a PDB: {error}"))?;
    let information = pdb
        .pdb_information()
        .map_err(|error| format!("no PDB information: {error}"))?;
    let found = information.guid.to_string().replace('-', "").to_uppercase();
    if found != debug.guid_text() || information.age < debug.age {
        return Err(format!(
            "another build's PDB: GUID {found} age {}, the image's {} age {}",
            information.age,
            debug.guid_text(),
            debug.age
        ));
    }
    let data = ContextPdbData::try_from_pdb(pdb).map_err(|error| error.to_string())?;
    let data: &'static ContextPdbData<'static, 'static, Cursor<Vec<u8>>> =
        Box::leak(Box::new(data));
    let context = data.make_context().map_err(|error| error.to_string())?;
    Ok(Symbols { context })
}

/// A function's name without the `()` the PDB's inline records end it
/// with (the debuggers name it without).
fn function_name(name: &str) -> String {
    name.trim_end_matches("()").to_owned()
}

impl FunctionSource for PdbFiles {
    fn function(
        &mut self,
        module: &Module,
        image: Option<&str>,
        identity: Option<&ImageIdentity>,
        address: u64,
    ) -> Option<Function> {
        let identity = match identity {
            Some(identity) => identity.clone(),
            None => self.read_image(module, image)?.clone(),
        };
        let debug = identity.debug.as_ref()?;
        let rva = u32::try_from(address.checked_sub(module.base)?).ok()?;
        let symbols = self.load(module, debug)?;
        let frames = symbols.context.find_frames(rva).ok()??;
        // The outermost frame is the function the address is in; the others
        // were inlined into it.
        let name = frames
            .frames
            .last()?
            .function
            .as_deref()
            .map(function_name)?;
        let source = frames
            .frames
            .iter()
            .map(|frame| SourceFrame {
                function: frame.function.as_deref().map(function_name),
                file: frame.file.as_deref().map(str::to_owned),
                line: frame.line,
            })
            .collect();
        Some(Function {
            name,
            offset: u64::from(rva - frames.start_rva),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symbol_paths_parse_in_the_debuggers_syntax() {
        assert_eq!(
            parse_path(
                r"srv*C:\cache*https://msdl.microsoft.com/download/symbols; D:\pdbs ;;cache*E:\c"
            ),
            [
                PathEntry::Server {
                    cache: PathBuf::from(r"C:\cache"),
                    url: Some("https://msdl.microsoft.com/download/symbols".to_owned()),
                },
                PathEntry::Folder(PathBuf::from(r"D:\pdbs")),
                PathEntry::Server {
                    cache: PathBuf::from(r"E:\c"),
                    url: None,
                },
            ]
        );
        assert_eq!(
            parse_path("symsrv*symsrv.dll*/tmp/cache*http://127.0.0.1:8000"),
            [PathEntry::Server {
                cache: PathBuf::from("/tmp/cache"),
                url: Some("http://127.0.0.1:8000".to_owned()),
            }]
        );
        // A server without a cache has nothing local to read.
        assert_eq!(parse_path("srv*https://example.com/symbols"), []);
    }

    #[test]
    fn a_pdb_is_looked_for_in_each_entry_in_order() {
        let files = PdbFiles::new("/a;srv*/cache*http://x");
        let debug = DebugIdentity {
            pdb_name: "kstack.pdb".to_owned(),
            guid: [0; 16],
            age: 2,
        };
        let key = debug.symbol_server_key();
        assert_eq!(
            files.candidates(&debug),
            [
                Candidate::Store(PathBuf::from(format!("/a/kstack.pdb/{key}"))),
                Candidate::File(PathBuf::from("/a/kstack.pdb")),
                Candidate::Store(PathBuf::from(format!("/cache/kstack.pdb/{key}"))),
                Candidate::Server {
                    url: format!("http://x/kstack.pdb/{key}"),
                    cache: PathBuf::from(format!("/cache/kstack.pdb/{key}")),
                },
            ]
        );
        assert_eq!(compressed_name("kstack.pdb"), "kstack.pd_");
    }
}
