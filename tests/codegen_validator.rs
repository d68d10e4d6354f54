//! The build-time validator on broken tool-defs: every mistake fails with the file, the tool and
//! the fix. The messages are pinned in snapshots/validator_errors.snap.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sandbox_mcp_codegen::{ToolDefFile, build_registry};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn real_tool_defs() -> Vec<ToolDefFile> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(Path::new(ROOT).join("tool-defs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    paths.sort();
    paths
        .into_iter()
        .map(|p| ToolDefFile {
            name: format!("tool-defs/{}", p.file_name().unwrap().to_string_lossy()),
            text: std::fs::read_to_string(p).unwrap(),
        })
        .collect()
}

fn spec_text() -> String {
    std::fs::read_to_string(Path::new(ROOT).join("openapi/sandbox-mcp.json")).unwrap()
}

fn errors_with(extra: Option<(&str, String)>, drop_file: Option<&str>) -> Vec<String> {
    let mut files: Vec<ToolDefFile> = real_tool_defs()
        .into_iter()
        .filter(|f| Some(f.name.as_str()) != drop_file)
        .collect();
    if let Some((name, text)) = extra {
        files.push(ToolDefFile {
            name: format!("tool-defs/{name}"),
            text,
        });
    }
    match build_registry("openapi/sandbox-mcp.json", &spec_text(), &files) {
        Ok(_) => Vec::new(),
        Err(errors) => errors.iter().map(ToString::to_string).collect(),
    }
}

#[test]
fn the_real_tool_defs_are_valid() {
    assert_eq!(errors_with(None, None), Vec::<String>::new());
}

#[test]
fn broken_tool_defs_are_rejected_with_file_tool_and_fix() {
    let dir = Path::new(ROOT).join("tests/fixtures/broken-tool-defs");
    let mut cases: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    names.sort();
    for path in names {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let errors = errors_with(Some((&name, std::fs::read_to_string(&path).unwrap())), None);
        assert!(!errors.is_empty(), "{name} should fail validation");
        for e in &errors {
            assert!(
                e.starts_with("tool-defs/"),
                "{name}: error does not name its file: {e}"
            );
        }
        cases.insert(name, errors);
    }
    // An operation nobody binds or excludes.
    cases.insert(
        "(40-templates.toml removed)".into(),
        errors_with(None, Some("tool-defs/40-templates.toml")),
    );
    crate::snapshots::settings().bind(|| insta::assert_json_snapshot!("validator_errors", cases));
}

#[test]
fn specific_mistakes_say_how_to_fix_them() {
    let errors = |file: &str| {
        let text = std::fs::read_to_string(
            Path::new(ROOT)
                .join("tests/fixtures/broken-tool-defs")
                .join(file),
        )
        .unwrap();
        errors_with(Some((file, text)), None).join("\n")
    };
    let e = errors("unknown_operation.toml");
    assert!(
        e.contains("tool `sandbox_run`") && e.contains("Did you mean `exec_command`?"),
        "{e}"
    );
    let e = errors("unknown_key.toml");
    assert!(
        e.contains("unknown field `descripton`") && e.contains("correct its spelling"),
        "{e}"
    );
    let e = errors("duplicate_name.toml");
    assert!(
        e.contains("already used by a tool in tool-defs/20-exec.toml"),
        "{e}"
    );
    let e = errors("bad_defaults.toml");
    assert!(
        e.contains("[defaults.errors] `not_found` names a placeholder that no tool in this file has as an argument; check its spelling"),
        "one sentence, one space: {e}"
    );
    let e = errors("bad_hide_in.toml");
    for needle in [
        "[args.cwd] hide_in names `computer`, which is not one of the tool's toolsets (core)",
        "[args.env] sets both hide and hide_in",
        "[args.command] hides a required argument without a default",
    ] {
        assert!(e.contains(needle), "missing `{needle}` in:\n{e}");
    }
    let e = errors("bad_overrides.toml");
    for needle in [
        "[args.comand] names no argument",
        "Did you mean `command`?",
        "hides a required argument without a default",
        "[args.timeout_ms] default \"fast\" does not fit",
        "[caps.stdot] names no field",
        "[caps.exit_code] the field is integer",
        "key `not_a_code` is not an error code",
        "placeholder `{sandbox}`",
        "unclosed or malformed placeholder",
        "must name an integer argument",
        "both read_only and destructive",
    ] {
        assert!(e.contains(needle), "missing `{needle}` in:\n{e}");
    }
}

/// The compiled build script itself fails on a broken tool-def, naming the file: what a developer
/// sees from `cargo build`.
#[test]
fn the_build_script_fails_on_a_broken_tool_def() {
    let target = Path::new(crate::common::BIN).parent().unwrap();
    let mut scripts: Vec<PathBuf> = std::fs::read_dir(target.join("build"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("build-script-build"))
        .filter(|p| {
            p.exists()
                && p.parent()
                    .unwrap()
                    .file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("sandbox-mcp-server-")
        })
        .collect();
    scripts.sort_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok());
    let Some(script) = scripts.pop() else {
        eprintln!(
            "SKIPPED the_build_script_fails_on_a_broken_tool_def: no compiled build script found next to the binary"
        );
        return;
    };
    let work = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(work.path().join("openapi")).unwrap();
    std::fs::copy(
        Path::new(ROOT).join("openapi/sandbox-mcp.json"),
        work.path().join("openapi/sandbox-mcp.json"),
    )
    .unwrap();
    std::fs::create_dir_all(work.path().join("tool-defs")).unwrap();
    for f in real_tool_defs() {
        std::fs::write(work.path().join(&f.name), f.text).unwrap();
    }
    std::fs::write(
        work.path().join("tool-defs/99-broken.toml"),
        std::fs::read_to_string(
            Path::new(ROOT).join("tests/fixtures/broken-tool-defs/unknown_operation.toml"),
        )
        .unwrap(),
    )
    .unwrap();
    let out_dir = work.path().join("out");
    std::fs::create_dir_all(&out_dir).unwrap();
    // The script reads the spec and tool-defs two levels above its crate's manifest.
    let manifest = work.path().join("crates/mcp-server");
    std::fs::create_dir_all(&manifest).unwrap();
    let output = std::process::Command::new(&script)
        .current_dir(&manifest)
        .env("CARGO_MANIFEST_DIR", &manifest)
        .env("OUT_DIR", &out_dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(!output.status.success(), "the build should fail:\n{stdout}");
    assert!(
        stdout.contains(
            "tool-defs/99-broken.toml: tool `sandbox_run`: unknown operation `exec_commnd`"
        ),
        "{stdout}"
    );
}
