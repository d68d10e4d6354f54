//! Running code in an interpreter that keeps its state between calls (a context), and managing
//! contexts.

use serde::{Deserialize, Serialize};

use crate::call::{OUTPUT_REPLY, small};

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum Language {
    Python,
    Node,
}

impl Language {
    pub fn as_str(self) -> &'static str {
        match self {
            Language::Python => "python",
            Language::Node => "node",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunCodeSpec {
    pub code: String,
    /// A context made with `CreateContext`; `None` uses the language's default context.
    pub context_id: Option<String>,
    /// Language of the default context (ignored when `context_id` names one).
    pub language: Language,
    pub timeout_ms: u64,
    pub max_output_bytes: u64,
    pub stream: bool,
    /// Variables an interpreter this cell starts gets beside the sandbox's (a running one keeps
    /// its own).
    #[serde(default)]
    pub env: Vec<(String, String)>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CodeOutcome {
    pub context_id: String,
    pub language: Language,
    pub stdout: String,
    pub stderr: String,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    pub truncated: bool,
    pub stdout_file: Option<String>,
    pub stderr_file: Option<String>,
    /// repr() / util.inspect() of the last expression, when it has a value.
    pub result: Option<String>,
    pub error: Option<CodeError>,
    pub timed_out: bool,
    /// The interpreter died during this call; its state is gone and the next call starts fresh.
    pub context_lost: bool,
    /// This call ran in a fresh interpreter because the previous one had died.
    pub context_restarted: bool,
    pub duration_ms: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CodeError {
    pub name: String,
    pub message: String,
    pub traceback: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CreateContext {
    pub language: Language,
    pub cwd: Option<String>,
    /// Variables the interpreter starts with beside the sandbox's (bound secrets' stand-ins).
    #[serde(default)]
    pub env: Vec<(String, String)>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ListContexts {}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ContextList {
    pub contexts: Vec<ContextInfo>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DeleteContext {
    pub context_id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ContextDeleted {
    pub context_id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ContextInfo {
    pub context_id: String,
    pub language: Language,
    pub cwd: String,
    /// Milliseconds since the Unix epoch.
    pub created_at: i64,
    /// Whether an interpreter is running for it (a context starts one on first use).
    pub alive: bool,
    pub is_default: bool,
}

call!(RunCode(RunCodeSpec) => CodeOutcome, limit: |_: &RunCodeSpec| OUTPUT_REPLY, env);
call!(CreateContext(CreateContext) => ContextInfo, limit: small, env);
call!(ListContexts(ListContexts) => ContextList);
call!(DeleteContext(DeleteContext) => ContextDeleted);
