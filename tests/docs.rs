//! The documents stay true: README names every setting the binary has, with the flag and default
//! `--help` gives it, server.json matches the package, CI runs README's test command, and
//! docs/architecture.md's crates table is the dependency graph.

use std::process::Command;

use crate::common::BIN;

fn root(path: &str) -> String {
    std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Every `SANDBOX_MCP_*` variable any subcommand's `--help` shows.
fn env_vars() -> std::collections::BTreeSet<String> {
    let mut vars = std::collections::BTreeSet::new();
    for args in [
        &["--help"][..],
        &["serve", "--help"],
        &["engine", "--help"],
        &["keys", "create", "--help"],
    ] {
        let out = Command::new(BIN).args(args).output().unwrap();
        let help = String::from_utf8_lossy(&out.stdout);
        for word in help.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if word.starts_with("SANDBOX_MCP_") {
                vars.insert(word.to_string());
            }
        }
    }
    vars
}

#[test]
fn readme_documents_every_environment_variable() {
    let readme = root("README.md");
    let vars = env_vars();
    assert!(vars.len() >= 15, "{vars:?}");
    for var in &vars {
        assert!(
            readme.contains(&format!("`{var}`")),
            "README.md does not document {var}"
        );
    }
}

#[test]
fn server_json_matches_the_package() {
    let server: serde_json::Value = serde_json::from_str(&root("server.json")).unwrap();
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(server["version"], version);
    let description = server["description"].as_str().unwrap();
    assert!(
        (1..=100).contains(&description.len()),
        "the registry allows 100 characters"
    );
    let name = server["name"].as_str().unwrap();
    assert_eq!(name.matches('/').count(), 1, "{name}");
    let vars = env_vars();
    for package in server["packages"].as_array().unwrap() {
        assert_eq!(package["version"], version);
        assert_eq!(package["transport"]["type"], "stdio");
        for env in package["environmentVariables"].as_array().unwrap() {
            let var = env["name"].as_str().unwrap();
            assert!(
                vars.contains(var),
                "server.json names {var}, which the binary does not read"
            );
        }
    }
}

#[test]
fn ci_runs_readmes_test_command() {
    let readme = root("README.md");
    let ci = root(".ci/run");
    let command = readme
        .lines()
        .find(|l| l.contains("# the whole test suite"))
        .and_then(|l| l.split('#').next())
        .map(str::trim)
        .expect("README gives the test command");
    assert!(
        ci.lines().any(|l| l.trim() == command),
        ".ci/run must run `{command}`"
    );
    for step in [
        "cargo fmt --check",
        "cargo clippy --all-targets -- -D warnings",
    ] {
        assert!(
            ci.lines().any(|l| l.trim() == step),
            ".ci/run must run `{step}`"
        );
    }
}

#[test]
fn documented_toolset_costs_match_the_snapshot() {
    let snap = root("snapshots/toolset_costs.snap");
    let costs: serde_json::Value = serde_json::from_str(&snap[snap.find('{').unwrap()..]).unwrap();
    let tokens = |cell: &str| -> f64 {
        let digits: String = cell.chars().filter(char::is_ascii_digit).collect();
        digits
            .parse()
            .unwrap_or_else(|_| panic!("no number in {cell:?}"))
    };
    for (doc, set) in ["README.md", "docs/tool-defs.md"]
        .into_iter()
        .flat_map(|doc| ["all", "core", "code", "computer"].map(|set| (doc, set)))
    {
        let text = root(doc);
        let row = text
            .lines()
            .find(|l| l.starts_with(&format!("| `{set}` |")))
            .unwrap_or_else(|| panic!("{doc} has no cost row for `{set}`"));
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let want = &costs[set];
        assert_eq!(cells[2], want["tools"].to_string(), "{row}");
        // README rounds; within 3% of the pinned figure is true enough.
        for (cell, key) in [
            (cells[3], "model_facing_tokens"),
            (cells[4], "tools_list_tokens"),
        ] {
            let pinned = want[key].as_f64().unwrap();
            let shown = tokens(cell);
            assert!(
                (shown - pinned).abs() <= pinned * 0.03,
                "{doc} says {cell} for `{set}` {key}; the snapshot says {pinned}"
            );
        }
    }
}

/// The crates table of docs/architecture.md is the dependency graph: every workspace crate has a
/// row, and its "may use" column names exactly the workspace crates its `Cargo.toml` does (a new
/// edge between layers is a change of that document, reviewed as such).
#[test]
fn architecture_lists_every_crate_and_exactly_its_edges() {
    let doc = root("docs/architecture.md");
    let table = doc
        .split("\n## Crates\n")
        .nth(1)
        .expect("docs/architecture.md has a \"Crates\" section");
    let mut documented = std::collections::BTreeMap::new();
    for row in table.lines().skip_while(|l| !l.starts_with('|')) {
        if !row.starts_with("| `") {
            if row.starts_with('|') {
                continue;
            }
            break;
        }
        let cells: Vec<&str> = row.split(" | ").collect();
        let name = cells[0].split('`').nth(1).unwrap_or_default().to_string();
        let uses: std::collections::BTreeSet<String> = cells[cells.len() - 1]
            .trim_end_matches(" |")
            .split(", ")
            .map(|u| u.split(" (").next().unwrap().trim().to_string())
            .filter(|u| u != "—" && !u.is_empty())
            .collect();
        documented.insert(name, uses);
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let packages = meta["packages"].as_array().unwrap();
    // A crate by its directory under crates/, as the table names it.
    let dir_of = |package: &serde_json::Value| -> Option<String> {
        let manifest = std::path::Path::new(package["manifest_path"].as_str().unwrap());
        let dir = manifest.parent()?;
        (dir.parent()?.file_name()? == "crates")
            .then(|| dir.file_name().unwrap().to_string_lossy().into_owned())
    };
    let by_name: std::collections::BTreeMap<String, String> = packages
        .iter()
        .filter_map(|p| Some((p["name"].as_str()?.to_string(), dir_of(p)?)))
        .collect();
    let mut actual = std::collections::BTreeMap::new();
    for package in packages {
        let Some(dir) = dir_of(package) else {
            continue;
        };
        let uses: std::collections::BTreeSet<String> = package["dependencies"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| d["kind"].is_null() || d["kind"] == "build")
            .filter_map(|d| by_name.get(d["name"].as_str()?).cloned())
            .collect();
        actual.insert(dir, uses);
    }
    documented.remove("sandbox-mcp");
    assert_eq!(
        documented, actual,
        "docs/architecture.md's crates table (left) differs from the crates' Cargo.toml (right)"
    );
}

/// A setting as `--help` shows it: its long flag, its variable, its default.
#[derive(Debug, Default, Clone)]
struct Setting {
    flag: String,
    default: Option<String>,
}

/// Every setting with a variable, by variable, from the `--help` of each subcommand.
fn settings() -> std::collections::BTreeMap<String, Vec<Setting>> {
    let mut by_var: std::collections::BTreeMap<String, Vec<Setting>> = Default::default();
    for args in [
        &["--help"][..],
        &["serve", "--help"],
        &["engine", "--help"],
        &["run", "--help"],
        &["keys", "create", "--help"],
    ] {
        let out = Command::new(BIN).args(args).output().unwrap();
        let help = String::from_utf8_lossy(&out.stdout).to_string();
        let mut current: Option<(Setting, Option<String>)> = None;
        let mut flush = |entry: Option<(Setting, Option<String>)>| {
            if let Some((setting, Some(var))) = entry {
                by_var.entry(var).or_default().push(setting);
            }
        };
        for line in help.lines() {
            let t = line.trim_start();
            if t.starts_with('-') && line.len() - t.len() <= 6 {
                flush(current.take());
                let flag = t
                    .split([' ', ',', '='])
                    .find(|w| w.starts_with("--"))
                    .unwrap_or("")
                    .to_string();
                current = Some((
                    Setting {
                        flag,
                        default: None,
                    },
                    None,
                ));
            } else if let Some((setting, var)) = current.as_mut() {
                if let Some(v) = t.strip_prefix("[env: ") {
                    *var = Some(v.split('=').next().unwrap().to_string());
                }
                if let Some(d) = t.split("[default: ").nth(1) {
                    setting.default = Some(d.trim_end_matches(']').to_string());
                }
            }
        }
        flush(current.take());
    }
    by_var
}

/// README's configuration tables pair each variable with the flag `--help` pairs it with, and
/// where they give a default as one literal, it is the one `--help` shows.
#[test]
fn readme_pairs_each_variable_with_its_flag_and_default() {
    let readme = root("README.md");
    let known = settings();
    let mut rows = 0;
    for line in readme.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let (Some(var), Some(flag), Some(default)) = (
            cells.get(1).and_then(|c| c.strip_prefix("`SANDBOX_MCP_")),
            cells.get(2),
            cells.get(3),
        ) else {
            continue;
        };
        let var = format!("SANDBOX_MCP_{}", var.trim_end_matches('`'));
        let Some(shown) = known.get(&var) else {
            continue;
        };
        rows += 1;
        let flag = flag.trim_matches('`');
        assert!(
            shown.iter().any(|s| s.flag == flag),
            "README pairs {var} with {flag}; --help with {:?}",
            shown.iter().map(|s| &s.flag).collect::<Vec<_>>()
        );
        let literal = default
            .strip_prefix('`')
            .and_then(|d| d.strip_suffix('`'))
            .filter(|d| !d.contains('`'));
        if let Some(literal) = literal
            && let Some(helped) = shown.iter().find_map(|s| s.default.clone())
        {
            assert_eq!(literal, helped, "{var}'s default");
        }
    }
    assert!(rows >= 40, "only {rows} rows of README's tables were read");
}
