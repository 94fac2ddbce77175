//! A web viewer in Debian's headless Chromium: a small HTTP server on
//! 127.0.0.1 serves the viewer's files and the profile (a viewer fetches
//! its profile, which a `file://` page may not), and Chromium loads the
//! page and hands back its DOM or a screenshot. `cargo xtask test` installs
//! Chromium; without it the tests fail and say how to install it.

use std::{
    collections::BTreeMap,
    io::{BufRead as _, BufReader, Write as _},
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

/// Serves files from its roots (the first that holds a name wins) until the
/// test process ends, and remembers every request and its status.
pub struct Server {
    pub port: u16,
    log: Arc<Mutex<Vec<String>>>,
}

impl Server {
    pub fn start(roots: Vec<PathBuf>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let log = Arc::new(Mutex::new(Vec::new()));
        let roots = Arc::new(roots);
        let server_log = Arc::clone(&log);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let (roots, log) = (Arc::clone(&roots), Arc::clone(&server_log));
                // A thread per connection: Chromium may open a connection it
                // sends nothing on, which must not hold up the others.
                std::thread::spawn(move || {
                    if let Ok(stream) = stream {
                        respond(&stream, &roots, &log);
                    }
                });
            }
        });
        Self { port, log }
    }

    /// Every request so far, as `GET /path 200`.
    pub fn requests(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }
}

fn respond(stream: &TcpStream, roots: &[PathBuf], log: &Mutex<Vec<String>>) {
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut reader = BufReader::new(stream);
    let mut request = String::new();
    if reader.read_line(&mut request).is_err() {
        return;
    }
    // The rest of the head is not needed, but read so that closing the
    // socket does not reset the connection before the reply is read.
    let mut line = String::new();
    while reader.read_line(&mut line).is_ok_and(|read| read > 2) {
        line.clear();
    }
    let path = request
        .split_whitespace()
        .nth(1)
        .unwrap_or("/")
        .split(['?', '#'])
        .next()
        .unwrap()
        .trim_start_matches('/');
    let file = roots
        .iter()
        .map(|root| root.join(path))
        .find(|file| !path.is_empty() && !path.contains("..") && file.is_file());
    let (status, body) = match &file {
        Some(file) => ("200 OK", std::fs::read(file).unwrap()),
        None => ("404 Not Found", Vec::new()),
    };
    log.lock()
        .unwrap()
        .push(format!("GET /{path} {}", &status[..3]));
    let mut stream = stream;
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        content_type(path),
        body.len()
    );
    let _ = stream.write_all(head.as_bytes());
    let _ = stream.write_all(&body);
}

/// Browsers refuse a style sheet, and a module or WebAssembly, served as
/// another type.
fn content_type(path: &str) -> &'static str {
    match Path::new(path)
        .extension()
        .and_then(|extension| extension.to_str())
    {
        Some("html") => "text/html; charset=utf-8",
        Some("js" | "mjs") => "text/javascript",
        Some("css") => "text/css",
        Some("json") => "application/json",
        Some("wasm") => "application/wasm",
        Some("png") => "image/png",
        Some("ico") => "image/x-icon",
        Some("woff2") => "font/woff2",
        _ => "application/octet-stream",
    }
}

/// Long enough for a loaded machine; a page that never finishes (speedscope
/// `alert()`s about a file it does not recognize, and a dialog blocks a
/// headless Chromium) fails the test instead of hanging it.
const CHROMIUM_DEADLINE: Duration = Duration::from_mins(1);

/// Runs headless Chromium, with a fresh profile, on `url` with `args`
/// added, and returns what it printed. It exits once the page has settled
/// (virtual time runs ahead of the wall clock, so timers and animations do
/// not make it wait).
fn chromium(args: &[&str], url: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let stdout_path = dir.path().join("stdout");
    let stderr_path = dir.path().join("stderr");
    let mut child = Command::new("chromium")
        .args([
            "--headless",
            // Run as root in a container, which has no user namespaces.
            "--no-sandbox",
            // No GPU here: software WebGL, which speedscope draws with, has
            // to be asked for now that Chromium no longer falls back to it.
            "--disable-gpu",
            "--enable-unsafe-swiftshader",
            // A container's /dev/shm can be 64 MiB, too small for Chromium's
            // shared memory: use /tmp instead.
            "--disable-dev-shm-usage",
            // Without these Chromium opens connections of its own, which are
            // refused many at a time on an offline machine.
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-quic",
            "--no-first-run",
            "--virtual-time-budget=10000",
            "--window-size=1400,900",
        ])
        .arg(format!(
            "--user-data-dir={}",
            dir.path().join("profile").display()
        ))
        .args(args)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout_path).unwrap())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .spawn()
        .unwrap_or_else(|error| {
            panic!(
                "cannot run `chromium` ({error}): headless Chromium loads the export in its \
                 viewer; install it with `apt-get install -y chromium` (cargo xtask test does)"
            )
        });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > CHROMIUM_DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "chromium did not finish {url} within {CHROMIUM_DEADLINE:?} (a page that opens a \
                 dialog never does); its log:\n{}",
                std::fs::read_to_string(&stderr_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        status.success(),
        "chromium {args:?} {url} failed ({status}):\n{}",
        std::fs::read_to_string(&stderr_path).unwrap_or_default()
    );
    std::fs::read_to_string(&stdout_path).unwrap()
}

/// The page's DOM once it has settled.
pub fn dom(url: &str) -> String {
    chromium(&["--dump-dom"], url)
}

/// The page's pixels, as `(red, green, blue)` per pixel, row by row.
pub fn screenshot(url: &str) -> Vec<[u8; 3]> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("page.png");
    chromium(&[&format!("--screenshot={}", path.display())], url);
    let file = std::fs::File::open(&path).unwrap();
    let mut decoder = png::Decoder::new(BufReader::new(file));
    decoder.set_transformations(png::Transformations::normalize_to_color8());
    let mut reader = decoder.read_info().unwrap();
    let mut pixels = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut pixels).unwrap();
    let channels = info.color_type.samples();
    assert!(channels >= 3, "a colour screenshot: {info:?}");
    pixels[..info.buffer_size()]
        .chunks_exact(channels)
        .map(|pixel| [pixel[0], pixel[1], pixel[2]])
        .collect()
}

/// The colours (not greys: not text, borders or background) that cover at
/// least `min_pixels` pixels each: the bars a flame graph draws.
pub fn large_colour_areas(pixels: &[[u8; 3]], min_pixels: usize) -> BTreeMap<[u8; 3], usize> {
    let mut areas = BTreeMap::<[u8; 3], usize>::new();
    for &pixel in pixels {
        if pixel[0] != pixel[1] || pixel[1] != pixel[2] {
            *areas.entry(pixel).or_default() += 1;
        }
    }
    areas.retain(|_, count| *count >= min_pixels);
    areas
}
