//! Every crate of the workspace imports its own modules without a circle.
//! Each crate root (`src/lib.rs`, `src/main.rs`, `src/bin/*`, `tests/*`,
//! `benches/*`, `build.rs` of every workspace member) is read from source
//! text: its `mod` declarations give the modules, and its `crate::`,
//! `super::` and `self::` paths (and `use` of a child module by its bare
//! name) give the edges, test modules included. Neither the graph of
//! modules nor the coarser one of rooms (the top-level modules, each a
//! file or directory of its own) may hold a cycle. In driver/, a source's
//! callback reaches the ring through `recorder` alone, never through the
//! loaded driver's state.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

/// A module's path inside its crate; empty for the crate root.
type ModulePath = Vec<String>;

/// Which module imports which, self-references and the root as a target
/// left out (the root declares and re-exports everything).
type Graph = BTreeMap<String, BTreeSet<String>>;

/// The workspace directory.
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

/// Every crate root of every workspace member, as a path relative to the
/// workspace (`usermode-client/src/main.rs`).
fn crate_roots() -> Vec<String> {
    let manifest: toml_edit::DocumentMut = read(&workspace().join("Cargo.toml"))
        .parse()
        .expect("Cargo.toml parses");
    let members = manifest["workspace"]["members"]
        .as_array()
        .expect("[workspace] members");
    let mut roots = Vec::new();
    for member in members {
        let member = member.as_str().expect("member paths are strings");
        for file in ["src/lib.rs", "src/main.rs", "build.rs"] {
            if workspace().join(member).join(file).is_file() {
                roots.push(format!("{member}/{file}"));
            }
        }
        for dir in ["src/bin", "tests", "benches"] {
            let Ok(entries) = fs::read_dir(workspace().join(member).join(dir)) else {
                continue;
            };
            let mut files: Vec<String> = entries
                .map(|entry| entry.expect("a directory entry").file_name())
                .filter_map(|name| name.into_string().ok())
                .filter(|name| Path::new(name).extension().is_some_and(|ext| ext == "rs"))
                .map(|name| format!("{member}/{dir}/{name}"))
                .collect();
            files.sort();
            roots.extend(files);
        }
    }
    roots
}

/// `text` with comments, string and character literals blanked out: only
/// code is read (a doc link is not an import).
fn code_only(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let is_ident = |c: Option<&char>| c.is_some_and(|c| c.is_alphanumeric() || *c == '_');
    let mut code = String::with_capacity(text.len());
    let mut at = 0;
    while at < chars.len() {
        let c = chars[at];
        let next = chars.get(at + 1).copied();
        if c == '/' && next == Some('/') {
            while at < chars.len() && chars[at] != '\n' {
                at += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            loop {
                match (chars.get(at), chars.get(at + 1)) {
                    (Some('/'), Some('*')) => (depth, at) = (depth + 1, at + 2),
                    (Some('*'), Some('/')) => (depth, at) = (depth - 1, at + 2),
                    (Some(_), _) => at += 1,
                    (None, _) => break,
                }
                if depth == 0 {
                    break;
                }
            }
            code.push(' ');
        } else if c == 'r'
            && !is_ident(at.checked_sub(1).and_then(|before| chars.get(before)))
            && let Some(hashes) = chars[at + 1..].iter().position(|&c| c != '#')
            && chars.get(at + 1 + hashes) == Some(&'"')
        {
            // A raw string: to a quote followed by as many hashes.
            let close: Vec<char> = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes))
                .collect();
            at += 2 + hashes;
            while at < chars.len() && !chars[at..].starts_with(&close) {
                at += 1;
            }
            at += close.len();
            code.push_str("\"\"");
        } else if c == '"' {
            at += 1;
            while at < chars.len() && chars[at] != '"' {
                at += if chars[at] == '\\' { 2 } else { 1 };
            }
            at += 1;
            code.push_str("\"\"");
        } else if c == '\'' && next == Some('\\') {
            at += 2;
            while at < chars.len() && chars[at] != '\'' {
                at += 1;
            }
            at += 1;
            code.push(' ');
        } else if c == '\'' && chars.get(at + 2) == Some(&'\'') {
            at += 3;
            code.push(' ');
        } else {
            code.push(c);
            at += 1;
        }
    }
    code
}

/// Identifiers, `::`, and every other character but white space.
fn tokens(code: &str) -> Vec<String> {
    let chars: Vec<char> = code.chars().collect();
    let mut tokens = Vec::new();
    let mut at = 0;
    while at < chars.len() {
        let c = chars[at];
        if c.is_alphanumeric() || c == '_' {
            let start = at;
            while at < chars.len() && (chars[at].is_alphanumeric() || chars[at] == '_') {
                at += 1;
            }
            tokens.push(chars[start..at].iter().collect());
        } else if c == ':' && chars.get(at + 1) == Some(&':') {
            tokens.push("::".to_owned());
            at += 2;
        } else {
            if !c.is_whitespace() {
                tokens.push(c.to_string());
            }
            at += 1;
        }
    }
    tokens
}

fn is_ident(token: &str) -> bool {
    token
        .chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_')
}

/// The paths of a use tree (or of one plain path) starting at `at`,
/// braces expanded: `a::{b, c::{self, D}}` is `a::b`, `a::c::self`,
/// `a::c::D`; a glob names its module.
fn use_tree(tokens: &[String], at: &mut usize) -> Vec<Vec<String>> {
    let mut prefix: Vec<String> = Vec::new();
    loop {
        match tokens.get(*at).map(String::as_str) {
            Some("::") => *at += 1,
            Some("*") => {
                *at += 1;
                return vec![prefix];
            }
            Some("{") => {
                *at += 1;
                let mut paths = Vec::new();
                while let Some(token) = tokens.get(*at) {
                    match token.as_str() {
                        "}" => {
                            *at += 1;
                            break;
                        }
                        "," => *at += 1,
                        _ => {
                            let before = *at;
                            for tail in use_tree(tokens, at) {
                                paths.push([prefix.clone(), tail].concat());
                            }
                            // Whatever this reader does not know is skipped.
                            *at = (*at).max(before + 1);
                        }
                    }
                }
                return paths;
            }
            Some(token) if is_ident(token) => {
                prefix.push(token.to_owned());
                *at += 1;
                if tokens.get(*at).is_some_and(|next| next == "::") {
                    continue;
                }
                if tokens.get(*at).is_some_and(|next| next == "as") {
                    *at += 2;
                }
                return vec![prefix];
            }
            _ => return vec![prefix],
        }
    }
}

/// A path as read in a file: the module it was written in (the file's,
/// or an inline module inside it), its segments, and whether it is a
/// `use` (where a bare first segment may be a child module).
struct Written {
    within: ModulePath,
    segments: Vec<String>,
    in_use: bool,
}

/// What one file holds: the file modules it declares (`mod name;`, by
/// their full path) and the paths it writes.
fn read_file(code: &str, module: &ModulePath) -> (Vec<ModulePath>, Vec<Written>) {
    let tokens = tokens(code);
    let (mut declared, mut written) = (Vec::new(), Vec::new());
    // Inline modules open here: their names and the brace depth outside.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0;
    let within = |inline: &[(String, usize)]| {
        let mut path = module.clone();
        path.extend(inline.iter().map(|(name, _)| name.clone()));
        path
    };
    let mut at = 0;
    while at < tokens.len() {
        let token = tokens[at].as_str();
        let next = tokens.get(at + 1).map(String::as_str);
        let after = tokens.get(at + 2).map(String::as_str);
        match token {
            "{" => depth += 1,
            "}" => {
                depth -= 1;
                if inline.last().is_some_and(|(_, outside)| *outside == depth) {
                    inline.pop();
                }
            }
            "mod" if next.is_some_and(is_ident) && after == Some(";") => {
                let mut child = within(&inline);
                child.push(next.unwrap_or_default().to_owned());
                declared.push(child);
            }
            "mod" if next.is_some_and(is_ident) && after == Some("{") => {
                inline.push((next.unwrap_or_default().to_owned(), depth));
                at += 2;
                continue;
            }
            "use" | "crate" | "super" | "self"
                if token == "use"
                    || (next == Some("::")
                        && at
                            .checked_sub(1)
                            .is_none_or(|before| tokens[before] != "::")) =>
            {
                let in_use = token == "use";
                at += usize::from(in_use);
                for segments in use_tree(&tokens, &mut at) {
                    written.push(Written {
                        within: within(&inline),
                        segments,
                        in_use,
                    });
                }
                continue;
            }
            _ => {}
        }
        at += 1;
    }
    (declared, written)
}

/// The module a written path names: the longest known module its
/// resolved path starts with, or `None` for another crate's path.
fn resolve(written: &Written, known: &BTreeSet<ModulePath>) -> Option<ModulePath> {
    let mut segments = written.segments.iter().map(String::as_str).peekable();
    let mut path = match segments.peek().copied()? {
        "crate" => {
            segments.next();
            Vec::new()
        }
        "self" => {
            segments.next();
            written.within.clone()
        }
        "super" => {
            let mut path = written.within.clone();
            while segments.next_if_eq(&"super").is_some() {
                path.pop();
            }
            path
        }
        first if written.in_use => {
            let mut child = written.within.clone();
            child.push(first.to_owned());
            if !known.contains(&child) {
                return None;
            }
            written.within.clone()
        }
        _ => return None,
    };
    path.extend(
        segments
            .filter(|segment| *segment != "self")
            .map(str::to_owned),
    );
    (0..=path.len())
        .rev()
        .map(|length| path[..length].to_vec())
        .find(|prefix| known.contains(prefix))
}

/// The file of module `name` declared in `parent` (a crate root or a
/// `mod.rs` declares beside itself, `a.rs` in `a/`), with the inline
/// modules between.
fn module_file(parent: &Path, is_root: bool, inline: &[String], name: &str) -> PathBuf {
    let mut dir = parent.parent().expect("a file's directory").to_path_buf();
    let stem = parent.file_stem().and_then(|stem| stem.to_str());
    if !is_root && stem != Some("mod") {
        dir.push(stem.expect("UTF-8 file names"));
    }
    dir.extend(inline);
    let flat = dir.join(format!("{name}.rs"));
    if flat.is_file() {
        flat
    } else {
        dir.join(name).join("mod.rs")
    }
}

/// The import graph of the crate rooted at `root` (relative to the
/// workspace), modules named `a::b` and the root `""`.
fn crate_graph(root: &str) -> Graph {
    // Every file module, from the root down its `mod` declarations.
    let mut files: BTreeMap<ModulePath, (PathBuf, String)> = BTreeMap::new();
    let mut pending = vec![(ModulePath::new(), workspace().join(root))];
    while let Some((module, file)) = pending.pop() {
        let code = code_only(&read(&file));
        let (declared, _) = read_file(&code, &module);
        for child in declared {
            let name = child.last().expect("a declared name").clone();
            let inline = &child[module.len()..child.len() - 1];
            let child_file = module_file(&file, module.is_empty(), inline, &name);
            pending.push((child.clone(), child_file));
        }
        files.insert(module, (file, code));
    }
    let known: BTreeSet<ModulePath> = files.keys().cloned().collect();
    let name = |module: &ModulePath| module.join("::");
    files
        .iter()
        .map(|(module, (_, code))| {
            let (_, written) = read_file(code, module);
            let targets = written
                .iter()
                .filter_map(|written| resolve(written, &known))
                .filter(|target| !target.is_empty() && target != module)
                .map(|target| name(&target))
                .collect();
            (name(module), targets)
        })
        .collect()
}

/// The graph of rooms: each module counted as its top-level module.
fn rooms(graph: &Graph) -> Graph {
    let room = |module: &str| module.split("::").next().unwrap_or_default().to_owned();
    let mut rooms = Graph::new();
    for (module, targets) in graph {
        if module.is_empty() {
            continue;
        }
        let from = room(module);
        let entry = rooms.entry(from.clone()).or_default();
        entry.extend(targets.iter().map(|target| room(target)));
        entry.remove(&from);
    }
    rooms
}

/// A cycle in `graph`, if there is one.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &Graph,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|on_path| on_path == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

fn strings<const N: usize>(items: [&str; N]) -> BTreeSet<String> {
    items.map(str::to_owned).into()
}

#[test]
fn the_reader_resolves_paths_and_finds_cycles() {
    let code = code_only(
        "use crate::{a::Item, b::{c::{self, X}, Y}};\n\
         // crate::d::in_a_comment\n\
         /* crate::d::in /* a nested */ block */\n\
         const S: &str = \"crate::d::in_a_string\"; const R: &str = r#\"crate::d\"#;\n\
         fn f<'a>(c: &'a char) { let _ = ('\"', '\\''); crate::d::g(); }\n\
         mod tests { use super::*; use super::super::e::Z; }\n\
         use child::Thing; use std::fmt; mod child;",
    );
    let module = vec!["m".to_owned(), "n".to_owned()];
    let (declared, written) = read_file(&code, &module);
    assert_eq!(
        declared,
        vec![["m", "n", "child"].map(str::to_owned).to_vec()]
    );
    let known: BTreeSet<ModulePath> = [
        vec![],
        vec!["a"],
        vec!["b"],
        vec!["b", "c"],
        vec!["d"],
        vec!["m"],
        vec!["m", "e"],
        vec!["m", "n"],
        vec!["m", "n", "child"],
    ]
    .into_iter()
    .map(|path| path.into_iter().map(str::to_owned).collect())
    .collect();
    let found: BTreeSet<String> = written
        .iter()
        .filter_map(|written| resolve(written, &known))
        .map(|module| module.join("::"))
        .collect();
    assert_eq!(
        found,
        strings(["a", "b", "b::c", "d", "m::n", "m::e", "m::n::child"])
    );

    let mut graph = Graph::new();
    graph.insert("a".into(), strings(["b::x"]));
    graph.insert("b::x".into(), strings(["c"]));
    assert_eq!(find_cycle(&graph), None);
    graph.insert("b::y".into(), strings(["a"]));
    assert_eq!(find_cycle(&graph), None, "no module circle");
    assert_eq!(
        find_cycle(&rooms(&graph)),
        Some(["a", "b", "a"].map(str::to_owned).to_vec()),
        "but a circle of rooms"
    );
    graph.insert("c".into(), strings(["a"]));
    assert_eq!(
        find_cycle(&graph),
        Some(["a", "b::x", "c", "a"].map(str::to_owned).to_vec())
    );
}

#[test]
fn every_crate_is_read() {
    let roots = crate_roots();
    for root in [
        "abi/src/lib.rs",
        "driver-core/src/lib.rs",
        "driver/src/lib.rs",
        "usermode-client/src/lib.rs",
        "usermode-client/src/main.rs",
        "xtask/src/main.rs",
        "tests/src/lib.rs",
        "tests/ioctl-storm/src/main.rs",
    ] {
        assert!(
            roots.iter().any(|found| found == root),
            "{root} in {roots:?}"
        );
    }
    let client = crate_graph("usermode-client/src/lib.rs");
    assert!(client.len() > 20, "the client's modules: {client:?}");
}

#[test]
fn no_crate_imports_in_a_circle() {
    let mut circles = Vec::new();
    for root in crate_roots() {
        let graph = crate_graph(&root);
        if let Some(cycle) = find_cycle(&graph) {
            circles.push(format!("{root}: modules {}", cycle.join(" -> ")));
        } else if let Some(cycle) = find_cycle(&rooms(&graph)) {
            circles.push(format!("{root}: rooms {}", cycle.join(" -> ")));
        }
    }
    assert!(
        circles.is_empty(),
        "imports in a circle:\n{}",
        circles.join("\n")
    );
}

/// lib.rs of the client lists its rooms (`//! - [`room`]: ...`) in an
/// order where each depends only on those before it.
#[test]
fn the_client_map_lists_rooms_in_dependency_order() {
    let lib = read(&workspace().join("usermode-client/src/lib.rs"));
    let listed: Vec<String> = lib
        .lines()
        .filter_map(|line| line.strip_prefix("//! - [`"))
        .filter_map(|line| line.split_once('`'))
        .map(|(room, _)| room.to_owned())
        .collect();
    let graph = rooms(&crate_graph("usermode-client/src/lib.rs"));
    assert_eq!(
        listed.iter().cloned().collect::<BTreeSet<_>>(),
        graph.keys().cloned().collect(),
        "lib.rs lists every room once"
    );
    for (at, room) in listed.iter().enumerate() {
        for target in &graph[room] {
            assert!(
                listed[..at].contains(target),
                "{room} imports {target}, listed after it in lib.rs"
            );
        }
    }
}

#[test]
fn sources_reach_the_ring_through_the_recorder_only() {
    let graph = crate_graph("driver/src/lib.rs");
    for (module, targets) in &graph {
        if module.starts_with("sources") {
            assert!(
                !targets.contains("loaded"),
                "{module} imports the loaded driver's state: {targets:?}"
            );
        }
    }
    assert!(
        graph["sources::timer"].contains("recorder"),
        "the timer hands its facts to the recorder"
    );
}
