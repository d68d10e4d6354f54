//! Whom envd's calls act as. E2B's sandboxes have an account `user` (home `/home/user`) that
//! commands run as and new files belong to, unless a call names another: the SDKs name one with
//! `Authorization: Basic base64("name:")` (process and filesystem calls) or `?username=` (`/files`).
//! Sandboxes here whose template has a `user` account (the built-in ones) behave the same; those
//! without one (an imported image, say) act as root. Either way `/home/user` exists, for relative
//! paths.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use std::time::Duration;

use axum::http::HeaderMap;
use sandbox_mcp_engine::error::EngineError;
use sandbox_mcp_protocol::{Delete, ReadFile, WriteFile};
use sandbox_mcp_sys::lock;

use crate::connect::RpcError;
use crate::{Door, HOME};

/// E2B's default account.
const DEFAULT: &str = "user";
/// Deadline of the calls that make a sandbox ready.
const DEADLINE: Duration = Duration::from_secs(30);

/// The account a request names in its `Authorization` header, if any.
pub(crate) fn named(headers: &HeaderMap) -> Result<Option<String>, RpcError> {
    let Some(value) = headers.get("authorization") else {
        return Ok(None);
    };
    let bad = || RpcError::invalid("the Authorization header is not Basic base64(\"user:\")");
    let encoded = value
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Basic "))
        .ok_or_else(bad)?;
    let decoded = B64.decode(encoded.trim()).map_err(|_| bad())?;
    let text = String::from_utf8(decoded).map_err(|_| bad())?;
    let name = text.split_once(':').map_or(text.as_str(), |(n, _)| n);
    Ok((!name.is_empty()).then(|| name.to_string()))
}

/// The account a call acts as: the one it names (the agent checks that the sandbox has it), or
/// the sandbox's default. Makes the sandbox ready the first time (see [`default`]).
pub(crate) async fn acting(
    door: &Door,
    id: &str,
    named: Option<String>,
) -> Result<String, EngineError> {
    let default = default(door, id).await?;
    Ok(named.unwrap_or(default))
}

/// The sandbox's default account, `user` where it has one and `root` otherwise, found the first
/// time, when `/home/user` is made too (belonging to `user` where it exists).
async fn default(door: &Door, id: &str) -> Result<String, EngineError> {
    if let Some(known) = lock(&door.accounts).get(id) {
        return Ok(known.clone());
    }
    let read = ReadFile {
        path: "/etc/passwd".into(),
        max_bytes: 1 << 20,
    };
    let has_user = match door.manager.agent.call(id, None, read, DEADLINE).await {
        Ok(file) => B64.decode(file.data_b64).is_ok_and(|text| {
            String::from_utf8_lossy(&text)
                .lines()
                .any(|l| l.starts_with(&format!("{DEFAULT}:")))
        }),
        Err(EngineError::NotFound(_)) => false,
        Err(e) => return Err(e),
    };
    let owner = has_user.then(|| DEFAULT.to_string());
    // The agent makes a file's missing parents (theirs to own): a placeholder made and deleted
    // leaves the home.
    let marker = crate::placeholder(HOME);
    let write = WriteFile {
        path: marker.clone(),
        data_b64: String::new(),
        owner,
        metadata: Default::default(),
    };
    door.manager.agent.call(id, None, write, DEADLINE).await?;
    let delete = Delete {
        path: marker,
        recursive: false,
    };
    match door.manager.agent.call(id, None, delete, DEADLINE).await {
        Ok(_) | Err(EngineError::NotFound(_)) => {}
        Err(e) => return Err(e),
    }
    let account = if has_user { DEFAULT } else { "root" }.to_string();
    lock(&door.accounts).insert(id.to_string(), account.clone());
    Ok(account)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_account_comes_from_a_basic_authorization_header() {
        let mut h = HeaderMap::new();
        assert_eq!(named(&h).unwrap(), None);
        h.insert("authorization", "Basic cm9vdDo=".parse().unwrap());
        assert_eq!(named(&h).unwrap().as_deref(), Some("root"));
        h.insert("authorization", "Basic Og==".parse().unwrap());
        assert_eq!(named(&h).unwrap(), None);
        h.insert("authorization", "Bearer x".parse().unwrap());
        assert!(named(&h).is_err());
        h.insert("authorization", "Basic !!!".parse().unwrap());
        assert!(named(&h).is_err());
    }
}
