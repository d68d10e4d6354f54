//! What building a sandbox reports when it fails: the step that failed and the error that stopped
//! it (kept as its source, not flattened into text), or a refusal with its reason. The launcher
//! and the agent's in-sandbox setup return it; the launcher's report carries its text to the
//! engine, which runs in another process.

use std::error::Error;

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// A step failed.
    #[error("{step}: {source}")]
    Step {
        step: String,
        #[source]
        source: Box<dyn Error + Send + Sync>,
    },
    /// Something refused to go on, with the reason (the other half of the launcher, say).
    #[error("{0}")]
    Refused(String),
}

/// Names the step a result belongs to.
pub fn ctx<T, E: Into<Box<dyn Error + Send + Sync>>>(
    result: Result<T, E>,
    step: &str,
) -> Result<T, BuildError> {
    result.map_err(|e| BuildError::Step {
        step: step.to_string(),
        source: e.into(),
    })
}
