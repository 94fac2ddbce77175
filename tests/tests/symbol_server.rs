//! The Linux client names frames from a symbol server: a plain-HTTP server
//! on 127.0.0.1, started here, serves the package's `kstack.pdb` in the
//! symbol store layout (`kstack.pdb/<GUID><age>/kstack.pdb`). A capture
//! whose kstack.sys carries the package image's identity is named through
//! `srv*CACHE*URL`: the first time downloaded into the cache, the second
//! time from the cache with no request; a PDB of another build is refused;
//! a PDB the server lacks leaves the frame `kstack.sys+0x...` and says
//! where it looked. A module without an identity is named from its image
//! found by name on the symbol path. Compressed PDBs (`name.pd_`, made by
//! gcab) and `file.ptr` pointers are read, on the server and in a store.
//!
//! Needs the package (`cargo xtask test` builds it first; or set
//! `KSTACK_PACKAGE_DIR` and `KSTACK_WINE_SUPPORT_DIR`).

use std::{
    collections::HashMap,
    io::{BufRead, BufReader, Write},
    net::TcpListener,
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
};

use kstack_abi::{RecordFlags, RecordHeader, SourceFacts, UserPart, stack_id};
use kstack_client::{
    capture::{reader::read_whole, trace::TraceRecord, writer::CaptureWriter},
    naming::{
        identity::{self, ImageIdentity},
        modules::{Module, ModuleMap},
        pdb_files::PdbFiles,
        symbolizer::{SourceFrame, Symbolizer},
    },
};
use kstack_tests::folders::{injection_build_dir, package_dir};

/// Where kstack.sys is loaded in the capture.
const BASE: u64 = 0xFFFF_F806_3110_0000;

fn injection_pdb() -> PathBuf {
    injection_build_dir().join("kstack.pdb")
}

/// A symbol server: `files` by URL path, every request counted.
struct Server {
    url: String,
    requests: Arc<AtomicUsize>,
    files: Arc<Mutex<HashMap<String, Vec<u8>>>>,
}

impl Server {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a port on 127.0.0.1");
        let url = format!("http://{}", listener.local_addr().unwrap());
        let requests = Arc::new(AtomicUsize::new(0));
        let files: Arc<Mutex<HashMap<String, Vec<u8>>>> = Arc::default();
        let (counted, served) = (Arc::clone(&requests), Arc::clone(&files));
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let mut request_line = String::new();
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                if reader.read_line(&mut request_line).is_err() {
                    continue;
                }
                // The rest of the request's head.
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|read| read > 2) {
                    line.clear();
                }
                counted.fetch_add(1, Ordering::SeqCst);
                let path = request_line
                    .split(' ')
                    .nth(1)
                    .unwrap_or_default()
                    .to_owned();
                let body = served.lock().unwrap().get(&path).cloned();
                let _ = match body {
                    Some(body) => write!(
                        stream,
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    )
                    .and_then(|()| stream.write_all(&body)),
                    None => write!(
                        stream,
                        "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    ),
                };
            }
        });
        Self {
            url,
            requests,
            files,
        }
    }

    fn serve(&self, path: &str, body: Vec<u8>) {
        self.files.lock().unwrap().insert(path.to_owned(), body);
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

/// A saved capture of one record whose frame 0 is kstack.sys's entry
/// point, kstack.sys carrying `identity`.
fn capture(identity: &ImageIdentity, entry_rva: u32) -> Vec<u8> {
    capture_of(identity.size_of_image, Some(identity), entry_rva)
}

/// [`capture`] with kstack.sys `size` bytes long, and without an identity
/// when `identity` is `None` (as captures before format 4).
fn capture_of(size: u32, identity: Option<&ImageIdentity>, entry_rva: u32) -> Vec<u8> {
    let mut modules = ModuleMap::new([Module {
        base: BASE,
        size,
        name: "kstack.sys".to_owned(),
    }]);
    if let Some(identity) = identity {
        modules.set_identity(BASE, identity.clone());
    }
    let frames = [BASE + u64::from(entry_rva)];
    let record = TraceRecord {
        header: RecordHeader {
            sequence: 1,
            timestamp: 134_083_512_000_000_000,
            process_id: 4,
            thread_id: 8,
            processor: 0,
            shard: 0,
            irql: 0,
            flags: RecordFlags::NONE,
            user_frame_count: 0,
            user_part: UserPart::Off,
            os_hash: 1,
            stack_id: stack_id(&frames),
            facts: SourceFacts::OnDemand { tag: 1 },
        },
        frames: frames.into(),
        sample: None,
    };
    let mut writer = CaptureWriter::new(Vec::new(), &modules).unwrap();
    writer.append(&record).unwrap();
    writer.finish().unwrap().out
}

/// Frame 0 of `capture` named through `symbol_path`.
fn frame_0(capture: &[u8], symbol_path: &str) -> String {
    frame_0_and_source(capture, symbol_path).0
}

/// Frame 0 of `capture` named through `symbol_path`, and where in the
/// source it is.
fn frame_0_and_source(capture: &[u8], symbol_path: &str) -> (String, Vec<SourceFrame>) {
    let read = read_whole(capture).unwrap();
    let symbolizer = Symbolizer::new(read.modules)
        .showing_tracer_frames()
        .with_functions(Box::new(PdbFiles::new(symbol_path)));
    let record = &read.records[0];
    let source = symbolizer.source(None, record.frames[0]);
    (record.locations(&symbolizer).remove(0), source)
}

/// The package's kstack.sys: its identity and its entry point's RVA.
fn package_image() -> (ImageIdentity, u32) {
    let image = package_dir().join("kstack.sys");
    let identity = identity::of_file(&image).unwrap_or_else(|error| {
        panic!("{error}: run `cargo xtask test`, which builds the package first")
    });
    let bytes = std::fs::read(&image).unwrap();
    let pe = object::read::pe::PeFile64::parse(&*bytes).unwrap();
    let entry_rva = pe
        .nt_headers()
        .optional_header
        .address_of_entry_point
        .get(object::LittleEndian);
    (identity, entry_rva)
}

#[test]
fn frames_are_named_from_a_symbol_server_once_then_from_the_cache() {
    let (identity, entry_rva) = package_image();
    let debug = identity.debug.clone().expect("kstack.sys names its PDB");
    let capture = capture(&identity, entry_rva);
    let server = Server::start();
    let stored = format!("/kstack.pdb/{}/kstack.pdb", debug.symbol_server_key());
    server.serve(
        &stored,
        std::fs::read(package_dir().join("kstack.pdb")).unwrap(),
    );
    let cache = tempfile::tempdir().unwrap();
    let path = format!("srv*{}*{}", cache.path().display(), server.url);

    // Cold: one request, the PDB lands in the cache.
    let named = frame_0(&capture, &path);
    assert_eq!(named, "kstack.sys!kstack::driver_entry+0x0");
    assert_eq!(server.requests(), 1);
    assert!(cache.path().join(&stored[1..]).is_file(), "cached");
    // Warm: named the same, no request; with its source line.
    let (warm, source) = frame_0_and_source(&capture, &path);
    assert_eq!(warm, named);
    assert_eq!(server.requests(), 1, "served from the cache");
    let own = source.last().expect("kstack.pdb has line information");
    assert_eq!(own.function.as_deref(), Some("kstack::driver_entry"));
    assert!(
        own.file
            .as_deref()
            .is_some_and(|file| file.ends_with("lib.rs"))
            && own.line.is_some(),
        "{own:?}"
    );

    // Another build's PDB under this key is refused, and not cached.
    let other_cache = tempfile::tempdir().unwrap();
    server.serve(&stored, std::fs::read(injection_pdb()).unwrap());
    let other_path = format!("srv*{}*{}", other_cache.path().display(), server.url);
    let refused = frame_0(&capture, &other_path);
    assert!(refused.starts_with("kstack.sys+0x"), "{refused}");
    assert!(
        !other_cache.path().join(&stored[1..]).exists(),
        "not cached"
    );

    // A PDB the server lacks: the module keeps module+offset.
    server.files.lock().unwrap().clear();
    let missing = frame_0(&capture, &other_path);
    assert_eq!(missing, format!("kstack.sys+{entry_rva:#x}"));
}

/// A module without an identity (a live session, a capture before format
/// 4) is named once its image is found by name on the symbol path, as the
/// debuggers find images; an image of another size is another build's.
#[test]
fn a_module_without_identity_is_named_from_its_image_on_the_symbol_path() {
    let (identity, entry_rva) = package_image();
    let package = package_dir().display().to_string();
    let unidentified = capture_of(identity.size_of_image, None, entry_rva);
    assert_eq!(
        frame_0(&unidentified, &package),
        "kstack.sys!kstack::driver_entry+0x0"
    );
    // The PDB alone: no image to read which PDB is the module's.
    let pdb_only = tempfile::tempdir().unwrap();
    std::fs::copy(
        package_dir().join("kstack.pdb"),
        pdb_only.path().join("kstack.pdb"),
    )
    .unwrap();
    let unnamed = frame_0(&unidentified, &pdb_only.path().display().to_string());
    assert_eq!(unnamed, format!("kstack.sys+{entry_rva:#x}"));
    // An image whose size is not the module's is refused.
    let larger = capture_of(identity.size_of_image + 0x1000, None, entry_rva);
    assert_eq!(
        frame_0(&larger, &package),
        format!("kstack.sys+{entry_rva:#x}")
    );
}

/// `kstack.pdb` compressed into a cabinet by gcab (an independent
/// writer), as `symstore /compress` files it: `kstack.pd_`.
fn compressed_pdb(dir: &std::path::Path) -> Vec<u8> {
    std::fs::copy(package_dir().join("kstack.pdb"), dir.join("kstack.pdb")).unwrap();
    let made = std::process::Command::new("gcab")
        .current_dir(dir)
        .args(["-c", "-n", "-z", "kstack.pd_", "kstack.pdb"])
        .status()
        .expect("gcab (apt package gcab; `cargo xtask test` installs it)");
    assert!(made.success());
    std::fs::remove_file(dir.join("kstack.pdb")).unwrap();
    std::fs::read(dir.join("kstack.pd_")).unwrap()
}

/// A server (or store) may hold a PDB compressed (`name.pd_`) or a
/// `file.ptr` pointing at it, asked for in that order after `name.pdb`,
/// as the debuggers' symsrv does; either is kept in the cache expanded.
#[test]
fn compressed_pdbs_and_file_pointers_are_read() {
    let (identity, entry_rva) = package_image();
    let debug = identity.debug.clone().unwrap();
    let key = debug.symbol_server_key();
    let capture = capture(&identity, entry_rva);
    let named = "kstack.sys!kstack::driver_entry+0x0";
    let unnamed = format!("kstack.sys+{entry_rva:#x}");
    let work = tempfile::tempdir().unwrap();
    let compressed = compressed_pdb(work.path());
    let server = Server::start();
    let folder = format!("/kstack.pdb/{key}");

    // Compressed on the server: two requests (pdb, pd_), kept expanded.
    server.serve(&format!("{folder}/kstack.pd_"), compressed.clone());
    let cache = tempfile::tempdir().unwrap();
    let path = format!("srv*{}*{}", cache.path().display(), server.url);
    assert_eq!(frame_0(&capture, &path), named);
    assert_eq!(server.requests(), 2, "kstack.pdb, then kstack.pd_");
    let cached = cache.path().join(&folder[1..]).join("kstack.pdb");
    assert_eq!(
        std::fs::read(&cached).unwrap(),
        std::fs::read(package_dir().join("kstack.pdb")).unwrap()
    );

    // A pointer on the server to a file this machine reads.
    server.files.lock().unwrap().clear();
    let pointed = work.path().join("pointed.pdb");
    std::fs::copy(package_dir().join("kstack.pdb"), &pointed).unwrap();
    server.serve(
        &format!("{folder}/file.ptr"),
        format!("PATH:{}", pointed.display()).into_bytes(),
    );
    let cache = tempfile::tempdir().unwrap();
    let path = format!("srv*{}*{}", cache.path().display(), server.url);
    assert_eq!(frame_0(&capture, &path), named);
    assert!(cache.path().join(&folder[1..]).join("kstack.pdb").is_file());
    // A pointer that says why there is none.
    server.serve(
        &format!("{folder}/file.ptr"),
        b"MSG: withheld by the publisher".to_vec(),
    );
    let cache = tempfile::tempdir().unwrap();
    let path = format!("srv*{}*{}", cache.path().display(), server.url);
    assert_eq!(frame_0(&capture, &path), unnamed);

    // In a local store, compressed; and a damaged cabinet is refused.
    let store = tempfile::tempdir().unwrap();
    let stored = store.path().join(&folder[1..]);
    std::fs::create_dir_all(&stored).unwrap();
    std::fs::write(stored.join("kstack.pd_"), &compressed).unwrap();
    assert_eq!(
        frame_0(&capture, &store.path().display().to_string()),
        named
    );
    std::fs::write(
        stored.join("kstack.pd_"),
        &compressed[..compressed.len() / 2],
    )
    .unwrap();
    assert_eq!(
        frame_0(&capture, &store.path().display().to_string()),
        unnamed
    );
}
