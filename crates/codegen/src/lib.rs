//! The MCP tool surface of sandbox-mcp, generated at build time from `openapi/` and `tool-defs/`.
//!
//! Always available, and used by the server at run time: [`model`] (the validated registry, read
//! back from the `tools.json` the build writes) and [`jsonschema`] (the validator every tool call
//! goes through). With the `generate` feature, used by the build scripts of `sandbox-mcp-api` and
//! `sandbox-mcp-server` and by the tests, the flow is raw input → validated registry → code:
//!
//! 1. `spec` walks the OpenAPI document (parsed with openapiv3) into operations, and turns
//!    OpenAPI schemas into self-contained JSON Schemas (refs inlined, constraints kept).
//! 2. `raw` parses each `tool-defs/*.toml` into serde structs that reject unknown keys.
//! 3. `bind` checks every tool against the spec and builds the [`model::Registry`].
//! 4. `dispatch` emits the Rust `match` from tool name to typed client call; `generate_tools`
//!    writes it, with the registry, to the MCP layer's `OUT_DIR`, and `generate_client` writes
//!    progenitor's typed client to the API crate's.
//! 5. `server` emits the engine's side of the same operations (the `EngineApi` trait, its query
//!    types and its axum router) and `limits` the bounds the spec states as constants;
//!    `generate_server` writes both to the API crate's `OUT_DIR`.
//!
//! Every mistake is reported with the file, the tool and the fix, and all of them at once.

pub mod deferred;
pub mod jsonschema;
pub mod model;

#[cfg(feature = "generate")]
pub mod bind;
#[cfg(feature = "generate")]
pub mod dispatch;
#[cfg(feature = "generate")]
mod generate;
#[cfg(feature = "generate")]
pub mod limits;
#[cfg(feature = "generate")]
pub mod raw;
#[cfg(feature = "generate")]
pub mod server;
#[cfg(feature = "generate")]
pub mod spec;

#[cfg(feature = "generate")]
pub(crate) use generate::did_you_mean;
#[cfg(feature = "generate")]
pub use generate::{
    CodegenError, Generated, ToolDefFile, build_registry, generate_client, generate_server,
    generate_tools, read_tool_defs,
};
