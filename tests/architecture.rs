//! The layers of `src/`, written down in docs/architecture.md and held here (issue 47).
//!
//! This test does not link the service: it reads the source. It collects every path a file
//! of `src/` names through `crate::`, `super::`, `self::` or a child module, in `use` trees
//! (`{…}` groups expanded) and inline, leaving out comments, literals, `#[cfg(test)]` items
//! and the files only tests compile. It fails, naming the file and line of each import
//! that makes the fault, on
//! - a circle between top-level modules (the `pub mod` list of src/lib.rs),
//! - an arrow up: a module importing a module on a floor above its own (`FLOORS`),
//! - a circle between the files of one top-level module, side by side (a file and its own
//!   submodules are one unit: a child uses its parent's items, the parent its child's),
//! - a file of `src/` over `MAX_LINES` lines.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use regex::Regex;

/// The floors, top to bottom: a module imports its own floor and those below, never one
/// above. The one copy of the table; docs/architecture.md describes each module.
#[rustfmt::skip]
const FLOORS: &[(&str, &[&str])] = &[
    ("the wiring", &["app"]),
    ("the edge", &["http"]),
    ("settings and callers", &["config", "caller"]),
    ("the loop", &["assistant", "approvals", "idempotency"]),
    ("the effects", &["payments", "outbox", "journal", "model", "webhooks"]),
    ("the ground", &["db", "metrics", "telemetry", "retry", "worker", "secret"]),
];
/// Arrows up being mended: (the file that imports, the module imported, who mends it).
#[rustfmt::skip]
const KNOWN_ARROWS_UP: &[(&str, &str, &str)] = &[];
/// Top-level modules whose files still import in a circle: (module, who mends it and how).
#[rustfmt::skip]
const KNOWN_FILE_CIRCLES: &[(&str, &str)] = &[];
const MAX_LINES: usize = 600;
const DOC: &str = "docs/architecture.md";
const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Edges between two modules (or files), with the imports that make them.
type Graph = BTreeMap<(String, String), Vec<String>>;

/// One import: where it is written, the absolute path it names, and whether it is a `pub use`.
struct Import {
    at: String,
    from: Vec<String>,
    path: Vec<String>,
    reexport: bool,
}

#[test]
fn layers_hold() {
    let mut failures = Vec::new();
    // Every file's code (comments, literals and test items blanked) by its module path.
    let mut files = BTreeMap::new();
    for (rel, text) in rust_files(&Path::new(ROOT).join("src")) {
        let lines = text.lines().count();
        if lines > MAX_LINES {
            failures.push(format!("src/{rel}: {lines} lines, over {MAX_LINES}"));
        }
        if rel != "main.rs" {
            files.insert(module_of(&rel), (rel, drop_cfg_test(&strip(&text))));
        } // main.rs is the top, and the binary: nothing imports it
    }
    // The crate as built without tests: the files that lib.rs reaches by `mod` lines.
    let mut reached = BTreeSet::from([vec![]]);
    let mut todo = vec![vec![]];
    while let Some(m) = todo.pop() {
        for child in children(&files[&m].1) {
            let path = [m.clone(), vec![child]].concat();
            if files.contains_key(&path) && reached.insert(path.clone()) {
                todo.push(path);
            }
        }
    }
    files.retain(|m, _| reached.contains(m));
    let floor = |m: &str| FLOORS.iter().position(|(_, ms)| ms.contains(&m));
    for m in files.keys().filter(|m| m.len() == 1) {
        if floor(&m[0]).is_none() {
            failures.push(format!("src/lib.rs: `{}` is on no floor of FLOORS", m[0]));
        }
    }
    // Each module of the table has its paragraph in the doc.
    let doc = std::fs::read_to_string(Path::new(ROOT).join(DOC)).unwrap();
    for m in FLOORS.iter().flat_map(|(_, ms)| *ms) {
        if !doc.contains(&format!("### `{m}`")) {
            failures.push(format!("{DOC}: no paragraph `### `{m}``"));
        }
    }
    let imports: Vec<Import> = files
        .iter()
        .flat_map(|(m, (r, c))| imports_of(m, r, c))
        .collect();
    // A path through a `pub use` leads to the file that defines the item.
    let mut reexports = BTreeMap::new();
    for i in imports.iter().filter(|i| i.reexport) {
        let name = i.path.last().unwrap().clone();
        reexports.insert([i.from.clone(), vec![name]].concat(), i.path.clone());
    }
    let locate = |mut path: Vec<String>| -> Vec<String> {
        for hop in 0.. {
            let in_files = |n: &usize| files.contains_key(&path[..*n]);
            let file = (0..=path.len()).rev().find(in_files).unwrap();
            match reexports.get(&path[..(file + 1).min(path.len())]) {
                Some(to) if file < path.len() && to != &path && hop < 8 => path = to.clone(),
                _ => return path[..file].to_vec(),
            }
        }
        unreachable!()
    };
    let (mut modules, mut within) = (Graph::new(), Graph::new());
    for i in &imports {
        let to = locate(i.path.clone());
        let from = &i.from;
        if from.is_empty() || to.is_empty() || (i.reexport && to.starts_with(from)) {
            continue; // lib.rs, or a doorway to a file's own child
        }
        let at = format!("{}: {}", i.at, i.path.join("::"));
        if from[0] != to[0] {
            let edge = (from[0].clone(), to[0].clone());
            modules.entry(edge).or_default().push(at);
        } else if !from.starts_with(&to) && !to.starts_with(from) {
            let edge = (from.join("/"), to.join("/"));
            within.entry(edge).or_default().push(at);
        }
    }
    // A known arrow up excuses the imports of its one file, not a new one.
    let known_up = |a: &str, b: &str| {
        let module = |file: &str| file.split(['/', '.']).nth(1) == Some(a);
        KNOWN_ARROWS_UP.iter().find(|k| module(k.0) && k.1 == b)
    };
    for ((a, b), ats) in &modules {
        let (Some(fa), Some(fb)) = (floor(a), floor(b)) else {
            continue;
        };
        let known = known_up(a, b).filter(|_| fb < fa);
        let excused = |at: &String| known.is_some_and(|k| at.starts_with(&format!("{}:", k.0)));
        let (old, new): (Vec<String>, Vec<String>) = ats.iter().cloned().partition(excused);
        if let Some(k) = known {
            eprintln!("known arrow up {a} -> {b} ({}): {old:?}", k.2);
        }
        if fb < fa && !new.is_empty() {
            let (from, to) = (FLOORS[fa].0, FLOORS[fb].0);
            let ats = new.join("\n    ");
            failures.push(format!(
                "arrow up: `{a}` ({from}) must not import `{b}` ({to}):\n    {ats}"
            ));
        }
    }
    for (file, b, _) in KNOWN_ARROWS_UP {
        let (in_file, to_b) = (format!("{file}:"), format!(": {b}::"));
        let mut ats = modules.values().flatten();
        if !ats.any(|at| at.starts_with(&in_file) && at.contains(&to_b)) {
            failures.push(format!("KNOWN_ARROWS_UP: {file} -> {b} is gone: remove it"));
        }
    }
    // A known arrow up is reported once, above, not again as a circle.
    modules.retain(|(a, b), _| known_up(a, b).is_none());
    for circle in circles(&modules) {
        failures.push(format!(
            "circle between modules {}",
            evidence(&modules, &circle)
        ));
    }
    let mut circled = BTreeSet::new();
    for circle in circles(&within) {
        let first = circle.first().unwrap();
        let top = first.split('/').next().unwrap().to_string();
        match KNOWN_FILE_CIRCLES.iter().find(|k| k.0 == top) {
            Some(k) => eprintln!("known file circle in {top}/ ({}): {circle:?}", k.1),
            None => failures.push(format!(
                "circle between files {}",
                evidence(&within, &circle)
            )),
        }
        circled.insert(top);
    }
    for (top, _) in KNOWN_FILE_CIRCLES.iter().filter(|k| !circled.contains(k.0)) {
        failures.push(format!("KNOWN_FILE_CIRCLES: {top}/ has none: remove it"));
    }
    let failures = failures.join("\n\n");
    assert!(
        failures.is_empty(),
        "{DOC}'s layers are broken:\n\n{failures}\n"
    );
}

/// The circles of `graph`: each set of nodes that reach one another, of more than one.
fn circles(graph: &Graph) -> Vec<BTreeSet<String>> {
    let next = |n: String| graph.keys().filter(move |e| e.0 == n).map(|e| e.1.clone());
    let reach = |n: &String| {
        let (mut seen, mut todo) = (BTreeSet::new(), vec![n.clone()]);
        while let Some(m) = todo.pop() {
            todo.extend(next(m).filter(|b| seen.insert(b.clone())));
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> =
        graph.keys().map(|(a, _)| (a, reach(a))).collect();
    let mut found: Vec<BTreeSet<String>> = Vec::new();
    for (n, from_n) in reaches.iter().filter(|(n, r)| r.contains(**n)) {
        let back = |m: &&String| reaches.get(m).is_some_and(|r| r.contains(*n));
        let circle: BTreeSet<String> = from_n.iter().filter(back).cloned().collect();
        if !found.contains(&circle) {
            found.push(circle);
        }
    }
    found
}

/// A circle's nodes, and the imports between them.
fn evidence(graph: &Graph, circle: &BTreeSet<String>) -> String {
    let inside = |((a, b), _): &(&(String, String), _)| circle.contains(a) && circle.contains(b);
    let ats: Vec<String> = graph
        .iter()
        .filter(inside)
        .flat_map(|(_, ats)| ats.clone())
        .collect();
    format!("{circle:?}:\n    {}", ats.join("\n    "))
}

/// The imports of the file `rel` (module path `module`) as absolute paths; a path into
/// another crate, or to an item of the file itself, is left out.
fn imports_of(module: &[String], rel: &str, code: &str) -> Vec<Import> {
    let line = |at: usize| code[..at].matches('\n').count() + 1;
    let children = children(code);
    let absolute = |path: &str| -> Option<Vec<String>> {
        let segs: Vec<&str> = path.split("::").map(str::trim).collect();
        let ups = segs.iter().take_while(|s| **s == "super").count();
        let (base, rest) = match segs[0] {
            "crate" | "$crate" => (&[][..], &segs[1..]),
            "self" => (module, &segs[1..]),
            "super" => (&module[..module.len().saturating_sub(ups)], &segs[ups..]),
            first if children.contains(first) => (module, &segs[..]),
            _ => return None,
        };
        let rest = rest.iter().filter(|s| **s != "*").map(|s| s.to_string());
        Some(base.iter().cloned().chain(rest).collect())
    };
    let import = |at: usize, path: Vec<String>, reexport: bool| Import {
        at: format!("src/{rel}:{}", line(at)),
        from: module.to_vec(),
        path,
        reexport,
    };
    let mut found = Vec::new();
    let mut inline = code.to_string(); // with the `use` items blanked
    let uses = Regex::new(r"(\bpub(?:\([^)]*\))?\s+)?\buse\s+([^;]+);").unwrap();
    for u in uses.captures_iter(code) {
        let tree = u.get(2).unwrap();
        let mut leaves = Vec::new();
        expand(tree.as_str(), tree.start(), "", &mut leaves);
        for (at, path) in leaves {
            let path = absolute(&path);
            found.extend(path.map(|p| import(at, p, u.get(1).is_some())));
        }
        inline.replace_range(tree.range(), &" ".repeat(tree.len()));
    }
    let paths = Regex::new(r"(?:^|[^\w:.$])((?:\$?\w+)(?:::\w+)+)").unwrap();
    for p in paths.captures_iter(&inline).map(|c| c.get(1).unwrap()) {
        found.extend(absolute(p.as_str()).map(|path| import(p.start(), path, false)));
    }
    found
}

/// Expands a `use` tree (`a::{b, c::{d as e, self}}`), found at `offset`, into its leaves.
fn expand(tree: &str, offset: usize, prefix: &str, leaves: &mut Vec<(usize, String)>) {
    let offset = offset + tree.len() - tree.trim_start().len();
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        let path = format!("{prefix}{}", tree.split(" as ").next().unwrap().trim());
        let path = path.trim_end_matches("::self"); // `a::{self}` is `a`
        return leaves.push((offset, path.to_string()));
    };
    let head = format!("{prefix}{}", &tree[..open]);
    let (mut depth, mut from) = (0, open + 1);
    for (k, c) in tree.char_indices().filter(|&(k, _)| k > open) {
        match c {
            '{' => depth += 1,
            '}' | ',' if depth == 0 => {
                if !tree[from..k].trim().is_empty() {
                    expand(&tree[from..k], offset + from, &head, leaves);
                }
                from = k + 1;
            }
            '}' => depth -= 1,
            _ => {}
        }
    }
}

/// The modules a file declares (`mod x;`, `pub mod x;`, `mod x { … }`).
fn children(code: &str) -> BTreeSet<String> {
    let decl = Regex::new(r"\bmod\s+(\w+)").unwrap();
    decl.captures_iter(code).map(|c| c[1].to_string()).collect()
}

/// Blanks comments, strings and char literals, keeping every byte's place and line.
fn strip(text: &str) -> String {
    let noise = Regex::new(concat!(
        r"(?s)//[^\n]*|/\*.*?\*/",
        r####"|r##".*?"##|r#".*?"#|\br".*?""####,
        r#"|"(?:\\.|[^"\\])*""#,
        r"|'(?:\\[^']{1,10}|[^'\\])'",
    ))
    .unwrap();
    let code = noise.replace_all(text, |c: &regex::Captures| blank(&c[0]));
    code.into_owned()
}

/// Spaces in place of `text`, line breaks kept: every byte stays where it was.
fn blank(text: &str) -> String {
    text.bytes()
        .map(|b| if b == b'\n' { '\n' } else { ' ' })
        .collect()
}

/// Blanks each item under `#[cfg(test)]`: up to its `;`, or through its `{…}` block.
fn drop_cfg_test(code: &str) -> String {
    let mut out = code.to_string();
    for (at, _) in code.match_indices("#[cfg(test)]") {
        let body = at + code[at..].find(['{', ';']).unwrap();
        let mut depth = 0;
        let end = code[body..].char_indices().find(|&(_, c)| {
            depth += match c {
                '{' => 1,
                '}' => -1,
                _ => 0,
            };
            depth == 0
        });
        let end = body + end.unwrap().0 + 1;
        out.replace_range(at..end, &blank(&code[at..end]));
    }
    out
}

/// The module path of a file: `db/group/mod.rs` is `["db", "group"]`; lib.rs is `[]`.
fn module_of(rel: &str) -> Vec<String> {
    match rel.trim_end_matches(".rs").trim_end_matches("/mod") {
        "lib" | "main" => vec![],
        path => path.split('/').map(String::from).collect(),
    }
}

/// Every `.rs` file under `dir`, by its path from `dir`, with its text.
fn rust_files(dir: &Path) -> Vec<(String, String)> {
    let mut found = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for path in std::fs::read_dir(&d).unwrap().map(|e| e.unwrap().path()) {
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(dir).unwrap().display().to_string();
                found.push((rel, std::fs::read_to_string(&path).unwrap()));
            }
        }
    }
    found
}
