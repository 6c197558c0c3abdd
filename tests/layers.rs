//! The layering of `src/`, held by a test: every module imports only from its own layer or a
//! lower one, and no two top-level modules import each other (directly or round a cycle).
//!
//! The layers are the table in `docs/design/README.md` (section Layers) and the module map at the
//! top of `src/lib.rs`. The test reads every `.rs` file under `src/`, drops comments and string
//! literals, and collects each path that starts at the crate root: `crate::name`, `use crate::{…}`
//! groups (each item of the group), and `super::` chains that climb out of their top-level module.
//! A name that goes up a layer fails the test, naming the file, the line and the name; so does a
//! cycle between modules of one layer. A top-level module missing from [`LAYERS`] fails too: a new
//! module takes a place in the table before it lands.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every top-level module of the crate and its layer, lowest first.
const LAYERS: &[(&str, u8)] = &[
    // 1: BSON helpers every layer shares, MongoDB's limits, the lock a panic cannot poison.
    ("value", 1),
    ("limits", 1),
    ("sync", 1),
    // 2: bytes to messages; shard keys, hashing, chunk maps and routing snapshots.
    ("wire", 2),
    ("routing", 2),
    // 2: the security core (SCRAM, roles, TLS settings): it reads nothing above value/.
    ("auth", 2),
    // 3: the document engine; shard connections, pools, the queue and the limiter.
    ("engine", 3),
    ("backend", 3),
    // 4: the configuration.
    ("config", 4),
    // 5: what every server shares; the router's view of its shards.
    ("command", 5),
    ("cluster", 5),
    // 6: the read and write paths, the listener and connection tasks.
    ("read", 6),
    ("write", 6),
    ("frontend", 6),
    // 7: the embedded shard; where routing metadata comes from.
    ("embedded", 7),
    ("metadata", 7),
    // 8: the router's service.
    ("router", 8),
    // 9: benchmarks, the fuzz entry points, the binary.
    ("bench", 9),
    ("demo", 9),
    ("fuzz", 9),
    ("main", 9),
];

/// Imports known to break the layering (upward, or closing a cycle within a layer), each
/// `(importing module, imported module)`. It is empty and stays so: a new entry needs a reason
/// stronger than the layering, and an entry that no longer occurs fails the test too.
const KNOWN_VIOLATIONS: &[(&str, &str)] = &[];

/// One import of a top-level module by a file.
#[derive(Debug, Clone)]
struct Import {
    file: PathBuf,
    line: usize,
    from: String,
    to: String,
}

fn layer_of(module: &str) -> Option<u8> {
    LAYERS.iter().find(|(m, _)| *m == module).map(|(_, l)| *l)
}

/// The source with comments, string and character literals blanked out (newlines kept, so
/// line numbers still hold).
fn strip(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    let blank = |out: &mut Vec<u8>, c: u8| out.push(if c == b'\n' { b'\n' } else { b' ' });
    while i < b.len() {
        let c = b[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                out.push(b' ');
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, b[i]);
                    i += 1;
                }
            }
        } else if c == b'r'
            && (b.get(i + 1) == Some(&b'"') || b.get(i + 1) == Some(&b'#'))
            && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_'))
        {
            // A raw string: r"…", r#"…"#, …
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&b'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= b.len() {
                    break;
                }
                if b[j] == b'"'
                    && b[j + 1..]
                        .iter()
                        .take(hashes)
                        .filter(|&&h| h == b'#')
                        .count()
                        == hashes
                {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            for &x in &b[i..j.min(b.len())] {
                blank(&mut out, x);
            }
            i = j;
        } else if c == b'"' {
            out.push(b' ');
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    blank(&mut out, b[i]);
                    i += 1;
                }
                if i < b.len() {
                    blank(&mut out, b[i]);
                    i += 1;
                }
            }
            out.push(b' ');
            i += 1;
        } else if c == b'\'' {
            // A character literal ('x', '\n', '\u{..}') or a lifetime ('a): a literal closes
            // within a few bytes.
            let close = if b.get(i + 1) == Some(&b'\\') {
                b[i + 2..]
                    .iter()
                    .position(|&x| x == b'\'')
                    .map(|p| i + 2 + p)
            } else if b.get(i + 2) == Some(&b'\'') {
                Some(i + 2)
            } else {
                // Multi-byte UTF-8 character.
                let len = src[i + 1..].chars().next().map(char::len_utf8).unwrap_or(1);
                (b.get(i + 1 + len) == Some(&b'\'')).then_some(i + 1 + len)
            };
            match close {
                Some(end) => {
                    out.extend(std::iter::repeat_n(b' ', end + 1 - i));
                    i = end + 1;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The identifier that starts at `i` (after skipping whitespace), and where it ends.
fn ident_at(b: &[u8], mut i: usize) -> (String, usize) {
    while i < b.len() && b[i].is_ascii_whitespace() {
        i += 1;
    }
    let start = i;
    while i < b.len() && is_ident(b[i]) {
        i += 1;
    }
    (String::from_utf8_lossy(&b[start..i]).into_owned(), i)
}

/// The first segment of each item of a `{…}` group starting at `open` (the brace).
fn group_heads(b: &[u8], open: usize) -> Vec<(String, usize)> {
    let mut heads = Vec::new();
    let mut depth = 0;
    let mut expect_head = true;
    let mut i = open;
    while i < b.len() {
        match b[i] {
            b'{' => {
                depth += 1;
                expect_head = depth == 1;
                i += 1;
            }
            b'}' => {
                depth -= 1;
                i += 1;
                if depth == 0 {
                    break;
                }
            }
            b',' => {
                expect_head = depth == 1;
                i += 1;
            }
            c if expect_head && is_ident(c) => {
                let (name, end) = ident_at(b, i);
                heads.push((name, i));
                expect_head = false;
                i = end;
            }
            _ => i += 1,
        }
    }
    heads
}

/// The module path of a file under `src/` (`src/a/b/mod.rs` → `[a, b]`).
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap_or_default();
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_string());
    }
    parts
}

/// Every reference to a top-level module other than the file's own, with its line.
fn imports_of(root: &Path, file: &Path) -> Vec<Import> {
    let rel = file.strip_prefix(root).unwrap_or(file);
    let path = module_path(rel);
    let Some(own) = path.first().cloned() else {
        return Vec::new();
    };
    let src = std::fs::read_to_string(file).unwrap_or_default();
    let code = strip(&src);
    let b = code.as_bytes();
    let line_of = |pos: usize| code[..pos].bytes().filter(|&c| c == b'\n').count() + 1;
    let mut found = Vec::new();
    let mut push = |to: String, pos: usize| {
        if to != own && !to.is_empty() && to != "self" {
            found.push(Import {
                file: rel.to_path_buf(),
                line: line_of(pos),
                from: own.clone(),
                to,
            });
        }
    };
    let mut i = 0;
    while i < b.len() {
        let at_word = i == 0 || !is_ident(b[i - 1]);
        if at_word && code[i..].starts_with("crate") && code[i + 5..].trim_start().starts_with("::")
        {
            let after = i + 5 + (code[i + 5..].len() - code[i + 5..].trim_start().len()) + 2;
            let rest = code[after..].trim_start();
            let j = after + (code[after..].len() - rest.len());
            if rest.starts_with('{') {
                for (name, pos) in group_heads(b, j) {
                    push(name, pos);
                }
            } else {
                let (name, _) = ident_at(b, j);
                push(name, j);
            }
            i = after;
        } else if at_word && code[i..].starts_with("super::") {
            // A chain of `super::` climbs from the file's module; out of the top-level module it
            // names another one.
            let mut depth = path.len() as isize;
            let mut j = i;
            while code[j..].starts_with("super::") {
                depth -= 1;
                j += "super::".len();
                j += code[j..].len() - code[j..].trim_start().len();
            }
            if depth <= 0 {
                if code[j..].starts_with('{') {
                    for (name, pos) in group_heads(b, j) {
                        push(name, pos);
                    }
                } else {
                    let (name, _) = ident_at(b, j);
                    push(name, j);
                }
            }
            i = j;
        } else {
            i += 1;
        }
    }
    found
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

fn all_imports() -> Vec<Import> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    files
        .iter()
        .filter(|f| !f.ends_with("lib.rs"))
        .flat_map(|f| imports_of(&root, f))
        .collect()
}

/// The modules of the crate, from `src/` itself.
fn top_modules() -> BTreeSet<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    std::fs::read_dir(&root)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| p.is_dir() || p.extension().is_some_and(|e| e == "rs"))
                .filter_map(|p| {
                    p.file_stem()
                        .map(|s| s.to_string_lossy().into_owned())
                        .filter(|s| s != "lib")
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn every_module_has_a_layer() {
    let missing: Vec<String> = top_modules()
        .into_iter()
        .filter(|m| layer_of(m).is_none())
        .collect();
    assert!(
        missing.is_empty(),
        "modules without a layer (add them to LAYERS in tests/layers.rs and to the module map \
         in src/lib.rs): {missing:?}"
    );
}

#[test]
fn no_module_imports_from_a_higher_layer() {
    let modules = top_modules();
    let mut upward = Vec::new();
    let mut seen_known = BTreeSet::new();
    for imp in all_imports() {
        if !modules.contains(&imp.to) {
            // A name at the crate root that is not a module (a macro or a re-export).
            continue;
        }
        if KNOWN_VIOLATIONS.contains(&(imp.from.as_str(), imp.to.as_str())) {
            seen_known.insert((imp.from.clone(), imp.to.clone()));
            continue;
        }
        let (Some(from), Some(to)) = (layer_of(&imp.from), layer_of(&imp.to)) else {
            continue;
        };
        if to > from {
            upward.push(format!(
                "src/{}:{}: `{}` (layer {from}) imports `crate::{}` (layer {to})",
                imp.file.display(),
                imp.line,
                imp.from,
                imp.to
            ));
        }
    }
    assert!(
        upward.is_empty(),
        "imports that go up a layer:\n{}",
        upward.join("\n")
    );
    let stale: Vec<_> = KNOWN_VIOLATIONS
        .iter()
        .filter(|(f, t)| !seen_known.contains(&(f.to_string(), t.to_string())))
        .collect();
    assert!(
        stale.is_empty(),
        "known violations that no longer occur (take them out of KNOWN_VIOLATIONS): {stale:?}"
    );
}

#[test]
fn no_import_cycle_between_modules() {
    let modules = top_modules();
    let mut edges: BTreeMap<String, BTreeMap<String, Import>> = BTreeMap::new();
    for imp in all_imports() {
        if !modules.contains(&imp.to) || !modules.contains(&imp.from) {
            continue;
        }
        if KNOWN_VIOLATIONS.contains(&(imp.from.as_str(), imp.to.as_str())) {
            continue;
        }
        edges
            .entry(imp.from.clone())
            .or_default()
            .entry(imp.to.clone())
            .or_insert(imp);
    }
    // A depth-first search that reports the first cycle it closes, with the import that closes
    // each of its edges.
    fn visit(
        m: &str,
        edges: &BTreeMap<String, BTreeMap<String, Import>>,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|s| s == m) {
            let mut cycle: Vec<String> = stack[at..].to_vec();
            cycle.push(m.to_string());
            return Some(cycle);
        }
        if done.contains(m) {
            return None;
        }
        stack.push(m.to_string());
        for next in edges
            .get(m)
            .map(|e| e.keys().cloned().collect::<Vec<_>>())
            .unwrap_or_default()
        {
            if let Some(c) = visit(&next, edges, stack, done) {
                return Some(c);
            }
        }
        stack.pop();
        done.insert(m.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for m in &modules {
        if let Some(cycle) = visit(m, &edges, &mut Vec::new(), &mut done) {
            let steps: Vec<String> = cycle
                .windows(2)
                .map(|w| {
                    let imp = &edges[&w[0]][&w[1]];
                    format!(
                        "src/{}:{}: `{}` imports `crate::{}`",
                        imp.file.display(),
                        imp.line,
                        w[0],
                        w[1]
                    )
                })
                .collect();
            panic!("import cycle {}:\n{}", cycle.join(" → "), steps.join("\n"));
        }
    }
}

/// The scanner itself: groups, nested paths, `super::` out of a module, and names inside
/// comments and strings that are not imports.
#[test]
fn the_scanner_reads_what_rustc_reads() {
    let dir = std::env::temp_dir().join(format!("sluice-layers-{}", std::process::id()));
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("a/b")).unwrap();
    let file = src.join("a/b/c.rs");
    std::fs::write(
        &file,
        "//! see crate::doc_only\n\
         use crate::{x::Y, z as w, q::{r, s}};\n\
         use super::super::super::sibling::T;\n\
         use super::super::cousin::U;\n\
         use super::inner;\n\
         fn f() { let s = \"crate::in_string\"; let c = '\"'; crate::inline::g(); }\n\
         /* crate::in_block */\n",
    )
    .unwrap();
    let mut names: Vec<(String, usize)> = imports_of(&src, &file)
        .into_iter()
        .map(|i| (i.to, i.line))
        .collect();
    names.sort();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(
        names,
        vec![
            ("inline".to_string(), 6),
            ("q".to_string(), 2),
            ("sibling".to_string(), 3),
            ("x".to_string(), 2),
            ("z".to_string(), 2),
        ]
    );
}
