//! The driver's modules import one another without a circle: every
//! `crate::` path in `driver/src` names a module, and the graph of those
//! names has no cycle. A source's callback reaches the ring through
//! `recorder` alone, never through the loaded driver's state.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

/// `driver/src`.
fn driver_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../driver/src")
}

/// Every module file under `dir`, by its module path (`sources::timer`;
/// `lib.rs`, the crate root, is the empty path).
fn modules(dir: &Path, prefix: &str, found: &mut BTreeMap<String, String>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .unwrap_or_else(|error| panic!("{}: {error}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path
            .file_stem()
            .and_then(|stem| stem.to_str())
            .expect("UTF-8 file names")
            .to_owned();
        let join = |name: &str| {
            if prefix.is_empty() {
                name.to_owned()
            } else {
                format!("{prefix}::{name}")
            }
        };
        if path.is_dir() {
            modules(&path, &join(&name), found);
        } else if path.extension().is_some_and(|extension| extension == "rs") {
            let module = match name.as_str() {
                "lib" => String::new(),
                "mod" => prefix.to_owned(),
                _ => join(&name),
            };
            let text = fs::read_to_string(&path).expect("a readable source file");
            found.insert(module, text);
        }
    }
}

/// The modules `text` names through `crate::` paths, as the longest module
/// path each one starts with. `use crate::{a, b::{c, d}}` names `a`, `b::c`
/// and `b::d` (or `b` where those are items, not modules).
fn imports(text: &str, known: &BTreeSet<String>) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (at, _) in text.match_indices("crate::") {
        let rest = &text[at + "crate::".len()..];
        for path in expand(rest) {
            let mut module = String::new();
            let mut longest = None;
            for part in path.split("::") {
                if !module.is_empty() {
                    module.push_str("::");
                }
                module.push_str(part);
                if known.contains(&module) {
                    longest = Some(module.clone());
                }
            }
            if let Some(module) = longest {
                found.insert(module);
            }
        }
    }
    found
}

/// The paths a `crate::` reference spells, braces expanded.
fn expand(rest: &str) -> Vec<String> {
    let head: String = rest
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
        .collect();
    let head = head.trim_end_matches(':').to_owned();
    let after = &rest[head.len()..];
    let after = after.strip_prefix("::").unwrap_or(after);
    let Some(group) = after.strip_prefix('{') else {
        return vec![head];
    };
    // The brace group, to its matching close.
    let mut depth = 1;
    let end = group
        .char_indices()
        .find_map(|(index, c)| {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                _ => {}
            }
            (depth == 0).then_some(index)
        })
        .unwrap_or(group.len());
    split_top_level(&group[..end])
        .into_iter()
        .flat_map(|item| {
            expand(item.trim())
                .into_iter()
                .map(|tail| {
                    if head.is_empty() {
                        tail
                    } else {
                        format!("{head}::{tail}")
                    }
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// `a, b::{c, d}, e` split at the commas outside braces.
fn split_top_level(group: &str) -> Vec<&str> {
    let mut items = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (index, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&group[start..index]);
                start = index + 1;
            }
            _ => {}
        }
    }
    items.push(&group[start..]);
    items
        .into_iter()
        .filter(|item| !item.trim().is_empty())
        .collect()
}

/// A cycle in `graph`, if there is one.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
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

/// The import graph of `driver/src`, self-references left out.
fn driver_graph() -> BTreeMap<String, BTreeSet<String>> {
    let mut files = BTreeMap::new();
    modules(&driver_src(), "", &mut files);
    let known: BTreeSet<String> = files
        .keys()
        .filter(|name| !name.is_empty())
        .cloned()
        .collect();
    files
        .iter()
        .map(|(module, text)| {
            let mut targets = imports(text, &known);
            targets.remove(module);
            (module.clone(), targets)
        })
        .collect()
}

#[test]
fn the_reader_expands_groups_and_finds_cycles() {
    let known: BTreeSet<String> = ["a", "b", "b::c", "d"].map(str::to_owned).into();
    let found = imports(
        "use crate::{a::Item, b::{c::{self, X}, Y}};\nfn f() { crate::d::g(); }",
        &known,
    );
    assert_eq!(found, ["a", "b", "b::c", "d"].map(str::to_owned).into());
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    graph.insert("a".into(), ["b".to_owned()].into());
    graph.insert("b".into(), ["c".to_owned()].into());
    assert_eq!(find_cycle(&graph), None);
    graph.insert("c".into(), ["a".to_owned()].into());
    assert_eq!(
        find_cycle(&graph),
        Some(["a", "b", "c", "a"].map(str::to_owned).to_vec())
    );
}

#[test]
fn driver_modules_import_without_a_circle() {
    let graph = driver_graph();
    assert!(graph.contains_key("sources::timer") && graph.contains_key("recorder"));
    if let Some(cycle) = find_cycle(&graph) {
        panic!("driver/src imports in a circle: {}", cycle.join(" -> "));
    }
}

#[test]
fn sources_reach_the_ring_through_the_recorder_only() {
    let graph = driver_graph();
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
