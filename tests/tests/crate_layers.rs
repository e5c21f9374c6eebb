//! The crate map in docs/ARCHITECTURE.md is the rule for which workspace crate may use which: each
//! crate's `[dependencies]` on workspace crates must be exactly its row's "depends on" column, so a
//! new dependency (or a crate added or folded away) fails here until the map says so. Cargo
//! already refuses cycles between crates; this keeps the layers the map draws.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap()
}

/// Crate name -> (path, the workspace crates its row says it depends on).
fn crate_map() -> BTreeMap<String, (String, BTreeSet<String>)> {
    let doc = std::fs::read_to_string(root().join("docs/ARCHITECTURE.md")).unwrap();
    let section = doc.split("## Crate map").nth(1).expect("docs/ARCHITECTURE.md has a `## Crate map` section");
    let section = section.split("\n## ").next().unwrap();
    let mut map = BTreeMap::new();
    for line in section.lines().filter(|l| l.starts_with("| `coa-")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // | crate | path | kind | depends on | what it is |
        let (name, path, deps) = (cells[1].trim_matches('`'), cells[2].trim_matches('`'), cells[4]);
        let deps = if deps.starts_with('(') || deps == "—" {
            BTreeSet::new() // dev-only crates and the bottom layer
        } else {
            deps.split(',').map(|d| format!("coa-{}", d.trim())).collect()
        };
        map.insert(name.to_string(), (path.trim_end_matches('/').to_string(), deps));
    }
    map
}

/// The workspace crates in the `[dependencies]` table of `manifest` (not dev- or build-dependencies).
fn workspace_dependencies(manifest: &str) -> BTreeSet<String> {
    let mut deps = BTreeSet::new();
    let mut in_deps = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_deps = line == "[dependencies]";
        } else if in_deps && line.starts_with("coa-") {
            deps.insert(line.split(|c: char| c == '.' || c == '=' || c.is_whitespace()).next().unwrap().to_string());
        }
    }
    deps
}

#[test]
fn every_crate_depends_on_exactly_what_the_crate_map_says() {
    let map = crate_map();
    let workspace = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let members: BTreeSet<String> = workspace
        .split("members")
        .nth(1)
        .and_then(|s| s.split(']').next())
        .unwrap()
        .split('"')
        .skip(1)
        .step_by(2)
        .map(|m| m.trim_end_matches('/').to_string())
        .collect();
    let mapped: BTreeSet<String> = map.values().map(|(path, _)| path.clone()).collect();
    assert_eq!(members, mapped, "docs/ARCHITECTURE.md's crate map lists other crates than the workspace's members");
    let mut wrong = Vec::new();
    for (name, (path, allowed)) in &map {
        let manifest = std::fs::read_to_string(root().join(path).join("Cargo.toml")).unwrap();
        let actual = workspace_dependencies(&manifest);
        if &actual != allowed {
            wrong.push(format!("{name}: Cargo.toml has {actual:?}, the crate map says {allowed:?}"));
        }
    }
    assert!(wrong.is_empty(), "update the crate map in docs/ARCHITECTURE.md or the dependency:\n{}", wrong.join("\n"));
}

#[test]
fn a_manifest_is_read_for_its_normal_dependencies_only() {
    let manifest = "[package]\nname = \"x\"\n\n[dependencies]\ncoa-schemas.workspace = true\ncoa-model = { path = \"../m\" }\nclap.workspace = true\n\n[dev-dependencies]\ncoa-tasks.workspace = true\n";
    let deps: Vec<String> = workspace_dependencies(manifest).into_iter().collect();
    assert_eq!(deps, ["coa-model", "coa-schemas"]);
}
