//! Clients of the built-in authorization server, whatever registered them: the operator
//! (`sandbox-mcp oauth clients add`), the client itself (RFC 7591), or a metadata document at
//! its `client_id` URL ([`crate::cimd`]). The same rules hold for each one's redirect URIs.

use serde_json::{Value, json};

use crate::store::Store;

/// What the authorization server knows about a client.
#[derive(Debug, Clone)]
pub struct ClientInfo {
    pub client_id: String,
    /// The name it gave, if any (shown as the client's claim, never as a verified fact).
    pub name: Option<String>,
    pub redirect_uris: Vec<String>,
    /// Confidential clients authenticate at the token endpoint.
    pub secret_sha256: Option<String>,
    /// How it was registered, as the consent page says it.
    pub kind: &'static str,
}

/// Schemes a redirect URI never has: they run code, read local files, or mean nothing.
const BAD_SCHEMES: [&str; 12] = [
    "javascript",
    "data",
    "file",
    "vbscript",
    "about",
    "blob",
    "filesystem",
    "view-source",
    "ftp",
    "ws",
    "wss",
    "chrome",
];

/// Whether a redirect URI may be registered: an absolute URI without a fragment; `https`, `http`
/// on a loopback host only, or an app's own scheme (RFC 8252); no user info.
pub fn check_redirect_uri(uri: &str) -> Result<(), String> {
    if uri.len() > 2000 {
        return Err("a redirect URI is at most 2000 characters".into());
    }
    let url = reqwest::Url::parse(uri).map_err(|e| format!("redirect URI {uri:?}: {e}"))?;
    if url.fragment().is_some() {
        return Err(format!("redirect URI {uri:?} must not have a fragment"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(format!("redirect URI {uri:?} must not carry user info"));
    }
    let scheme = url.scheme();
    if BAD_SCHEMES.contains(&scheme) {
        return Err(format!(
            "redirect URI {uri:?}: the scheme {scheme} is not allowed"
        ));
    }
    if scheme == "http" {
        let loopback = matches!(url.host_str(), Some("localhost" | "127.0.0.1" | "[::1]"));
        if !loopback {
            return Err(format!(
                "redirect URI {uri:?}: plain http is allowed only on a loopback host (localhost, 127.0.0.1, [::1]); use https"
            ));
        }
    }
    if scheme == "https" && url.host_str().is_none_or(str::is_empty) {
        return Err(format!("redirect URI {uri:?} has no host"));
    }
    Ok(())
}

/// A client's self-chosen name, made safe to show: control characters dropped, at most 80
/// characters.
pub fn clean_name(name: &str) -> String {
    name.chars()
        .filter(|c| !c.is_control())
        .take(80)
        .collect::<String>()
        .trim()
        .to_string()
}

/// Validates RFC 7591 registration metadata; returns the name, redirect URIs and auth method.
pub fn check_registration(doc: &Value) -> Result<(String, Vec<String>, String), (String, String)> {
    let invalid = |e: String| ("invalid_client_metadata".to_string(), e);
    let uris: Vec<String> = match doc.get("redirect_uris").and_then(Value::as_array) {
        Some(a) if !a.is_empty() && a.len() <= 20 => a
            .iter()
            .map(|v| v.as_str().map(String::from))
            .collect::<Option<_>>()
            .ok_or_else(|| invalid("redirect_uris must be strings".into()))?,
        _ => {
            return Err((
                "invalid_redirect_uri".into(),
                "redirect_uris must list 1 to 20 URIs".into(),
            ));
        }
    };
    for u in &uris {
        check_redirect_uri(u).map_err(|e| ("invalid_redirect_uri".to_string(), e))?;
    }
    let method = doc
        .get("token_endpoint_auth_method")
        .and_then(Value::as_str)
        .unwrap_or("client_secret_basic");
    if !["none", "client_secret_basic", "client_secret_post"].contains(&method) {
        return Err(invalid(format!(
            "token_endpoint_auth_method {method:?} is not supported: use none, client_secret_basic or client_secret_post"
        )));
    }
    let strings = |k: &str| -> Vec<String> {
        doc.get(k)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default()
    };
    if let Some(g) = strings("grant_types")
        .iter()
        .find(|g| !["authorization_code", "refresh_token"].contains(&g.as_str()))
    {
        return Err(invalid(format!(
            "grant type {g:?} is not supported: authorization_code and refresh_token are"
        )));
    }
    if let Some(r) = strings("response_types")
        .iter()
        .find(|r| r.as_str() != "code")
    {
        return Err(invalid(format!(
            "response type {r:?} is not supported: code is"
        )));
    }
    let name = doc
        .get("client_name")
        .and_then(Value::as_str)
        .map(clean_name)
        .unwrap_or_default();
    Ok((name, uris, method.to_string()))
}

/// The registration response (RFC 7591 §3.2.1).
pub fn registration_response(
    c: &crate::store::Client,
    secret: Option<&str>,
    issued_at: i64,
) -> Value {
    let mut v = json!({
        "client_id": c.client_id,
        "client_id_issued_at": issued_at / 1000,
        "client_name": c.name,
        "redirect_uris": c.redirect_uris,
        "token_endpoint_auth_method": c.auth_method,
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
    });
    if let Some(s) = secret {
        v["client_secret"] = json!(s);
        v["client_secret_expires_at"] = json!(0);
    }
    v
}

/// A stored client, as the server uses it; None when unknown or revoked.
pub fn stored(store: &Store, client_id: &str) -> Result<Option<ClientInfo>, String> {
    Ok(store
        .client(client_id)?
        .filter(|c| c.revoked_at.is_none())
        .map(|c| ClientInfo {
            client_id: c.client_id,
            name: (!c.name.is_empty()).then_some(c.name),
            redirect_uris: c.redirect_uris,
            secret_sha256: c.secret_sha256,
            kind: if c.kind == "registered" {
                "registered by the operator"
            } else {
                "registered itself"
            },
        }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirect_uris() {
        for ok in [
            "https://claude.ai/api/mcp/auth_callback",
            "http://127.0.0.1:33418/callback",
            "http://localhost/cb",
            "http://[::1]:8080/cb",
            "cursor://anysphere.cursor-retrieval/oauth/callback",
            "com.example.app:/oauth2redirect",
        ] {
            assert!(check_redirect_uri(ok).is_ok(), "{ok}");
        }
        for bad in [
            "http://evil.example/cb",
            "http://127.0.0.1.evil.example/cb",
            "https://app.example/cb#frag",
            "https://user:pw@app.example/cb",
            "javascript:alert(1)",
            "data:text/html,hi",
            "file:///etc/passwd",
            "/relative",
            "",
        ] {
            assert!(check_redirect_uri(bad).is_err(), "{bad}");
        }
    }
}
