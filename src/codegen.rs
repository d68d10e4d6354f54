//! Build-time generation of the MCP tool surface from `openapi/` and `tool-defs/`.
//!
//! `build.rs` compiles this module (and the test suite does, to exercise the validator on broken
//! fixtures); the server binary never does. The flow is raw input → validated registry → code:
//!
//! 1. [`spec`] walks the OpenAPI document (parsed with openapiv3) into operations, and turns
//!    OpenAPI schemas into self-contained JSON Schemas (refs inlined, constraints kept).
//! 2. [`raw`] parses each `tool-defs/*.toml` into serde structs that reject unknown keys.
//! 3. [`bind`] checks every tool against the spec and builds the [`model::Registry`].
//! 4. [`dispatch`] writes the Rust `match` from tool name to typed client call.
//!
//! Every mistake is reported with the file, the tool and the fix, and all of them at once.

#[path = "jsonschema.rs"]
pub mod jsonschema;
#[path = "tooldefs/model.rs"]
pub mod model;

// This file is loaded through `#[path]` (from build.rs and the tests), which resolves nested
// modules like a `mod.rs`: hence explicit paths.
#[path = "codegen/bind.rs"]
pub mod bind;
#[path = "codegen/dispatch.rs"]
pub mod dispatch;
#[path = "codegen/raw.rs"]
pub mod raw;
#[path = "codegen/spec.rs"]
pub mod spec;

use std::fmt;

/// One problem found in the spec or a tool-def, located as precisely as possible.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodegenError {
    /// `tool-defs/<name>.toml`, or `openapi/...` for spec problems.
    pub file: String,
    /// The tool (or `[[exclude]]` operation) the problem is in, when there is one.
    pub tool: Option<String>,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl fmt::Display for CodegenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.tool {
            Some(entry) if entry.starts_with("[[") => {
                write!(f, "{}: {entry}: {}", self.file, self.message)
            }
            Some(tool) => write!(f, "{}: tool `{tool}`: {}", self.file, self.message),
            None => write!(f, "{}: {}", self.file, self.message),
        }
    }
}

/// One tool-def file: its name relative to the crate root and its text.
pub struct ToolDefFile {
    pub name: String,
    pub text: String,
}

/// Builds and validates the registry. Returns every error found, sorted by file.
pub fn build_registry(
    spec_file: &str,
    spec_text: &str,
    files: &[ToolDefFile],
) -> Result<(spec::Spec, model::Registry), Vec<CodegenError>> {
    let spec = spec::Spec::parse(spec_file, spec_text).map_err(|e| vec![e])?;
    let mut errors = Vec::new();
    let mut parsed = Vec::new();
    for file in files {
        match raw::parse_file(&file.name, &file.text) {
            Ok(f) => parsed.push(f),
            Err(mut e) => errors.append(&mut e),
        }
    }
    match bind::bind(&spec, &parsed) {
        Ok(registry) if errors.is_empty() => Ok((spec, registry)),
        Ok(_) => Err(errors),
        Err(mut e) => {
            errors.append(&mut e);
            Err(errors)
        }
    }
}

/// Edit distance, for "did you mean" suggestions.
pub(crate) fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            cur[j + 1] = (prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// " Did you mean `x`?" when a candidate is close enough, else "".
pub(crate) fn did_you_mean<'a>(wrong: &str, candidates: impl Iterator<Item = &'a str>) -> String {
    candidates
        .map(|c| (levenshtein(wrong, c), c))
        .filter(|(d, c)| *d <= 3.max(c.len() / 3))
        .min()
        .map(|(_, c)| format!(" Did you mean `{c}`?"))
        .unwrap_or_default()
}
