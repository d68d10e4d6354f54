//! OAuth 2.1 for the Streamable HTTP transport (`serve --http --oauth`, or `--oauth-issuer`), as
//! the MCP authorization spec asks of an MCP server:
//!
//! - **resource server**: Protected Resource Metadata (RFC 9728) at
//!   `/.well-known/oauth-protected-resource[/mcp | /servers/NAME/mcp]`; a request without a
//!   valid token gets `401` and `WWW-Authenticate: Bearer resource_metadata="…", scope="…"`, a
//!   token without the endpoint's scope `403 insufficient_scope`; every token is checked for its
//!   issuer, its audience (the endpoint's resource, RFC 8707), its expiry and its scope;
//! - **built-in authorization server** ([`Kind::BuiltIn`]): people sign in with an access key the
//!   operator issued (`sandbox-mcp keys create`), whose tenant becomes the grant's; see
//!   [`routes`];
//! - **external issuer** ([`Kind::External`]): JWTs checked against the issuer's JWKS
//!   ([`issuer`]).
//!
//! Scopes: `sandboxes` (the sandbox tools at `/mcp`) and `servers` (hosted servers at
//! `/servers/NAME/mcp`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderValue, StatusCode};

pub mod cimd;
pub mod clients;
pub mod issuer;
pub mod jwt;
mod page;
pub mod routes;
pub mod store;

pub use store::Store;

/// The scope of the sandbox tools (`/mcp`).
pub const SANDBOXES: &str = "sandboxes";
/// The scope of hosted servers (`/servers/NAME/mcp`).
pub const SERVERS: &str = "servers";
/// Every scope the built-in server grants.
pub const SCOPES: [&str; 4] = [SANDBOXES, SERVERS, "openid", "offline_access"];

/// Who signs in on the built-in server's page: the access keys of the HTTP transport.
pub trait Accounts: Send + Sync {
    /// The key's id and tenant, when `key` is an active access key.
    fn sign_in(&self, key: &str) -> Option<Account>;
    /// Whether the key with this id is still active (tokens die with their key).
    fn active(&self, key_id: &str) -> bool;
}

#[derive(Debug, Clone)]
pub struct Account {
    pub key_id: String,
    pub tenant: String,
}

/// How OAuth is served.
pub enum Kind {
    /// The built-in authorization server, its state under `data_dir`.
    BuiltIn {
        data_dir: PathBuf,
        accounts: Arc<dyn Accounts>,
    },
    /// Tokens of an external issuer.
    External {
        issuer: String,
        audiences: Vec<String>,
        tenant_claim: String,
    },
}

pub struct Settings {
    pub kind: Kind,
    /// The server's public URL (`https://mcp.example.com`), when it is reached under another name
    /// than its `Host` header says, or behind a proxy that ends TLS.
    pub public_url: Option<String>,
    /// Extra trust roots (PEM) for the metadata documents and issuers this server fetches.
    pub ca_file: Option<PathBuf>,
    /// Ranges metadata documents may be fetched from though they are private (CIDRs).
    pub allow_nets: Vec<String>,
    /// Lifetime of the built-in server's access tokens.
    pub access_ttl: Duration,
}

/// Who a token stands for.
#[derive(Debug, Clone)]
pub struct Principal {
    pub tenant: String,
}

/// Why a request is refused, as RFC 6750 says it.
#[derive(Debug, Clone)]
pub struct Denied {
    pub status: StatusCode,
    /// `invalid_token`, `insufficient_scope`, or empty (no token at all).
    pub error: &'static str,
    pub description: String,
    /// The scope to ask for, with `insufficient_scope`.
    pub scope: Option<&'static str>,
}

impl Denied {
    pub fn invalid(description: impl Into<String>) -> Denied {
        Denied {
            status: StatusCode::UNAUTHORIZED,
            error: "invalid_token",
            description: description.into(),
            scope: None,
        }
    }

    pub fn scope(scope: &str) -> Denied {
        let scope = if scope == SERVERS { SERVERS } else { SANDBOXES };
        Denied {
            status: StatusCode::FORBIDDEN,
            error: "insufficient_scope",
            description: format!("the token lacks the {scope:?} scope this endpoint needs"),
            scope: Some(scope),
        }
    }

    pub fn forbidden(description: impl Into<String>) -> Denied {
        Denied {
            status: StatusCode::FORBIDDEN,
            error: "invalid_token",
            description: description.into(),
            scope: None,
        }
    }

    /// No token was sent.
    pub fn missing() -> Denied {
        Denied {
            status: StatusCode::UNAUTHORIZED,
            error: "",
            description: "this endpoint needs a bearer token: sign in through OAuth (the resource metadata says where), or send an access key".into(),
            scope: None,
        }
    }
}

/// The protected endpoint a request path belongs to: the path of its resource and its scope.
/// `/mcp?name=NAME` (a hosted server by query) is a hosted server on `/mcp`'s resource.
pub fn endpoint(path: &str, query: Option<&str>) -> (String, &'static str) {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match parts.as_slice() {
        ["servers", name, "mcp"] if !name.is_empty() => (format!("/servers/{name}/mcp"), SERVERS),
        ["mcp"] if query.is_some_and(|q| q.split('&').any(|p| p.starts_with("name="))) => {
            ("/mcp".into(), SERVERS)
        }
        _ => ("/mcp".into(), SANDBOXES),
    }
}

/// Whether `path` is a protected endpoint's resource path.
fn resource_path(path: &str) -> bool {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    matches!(parts.as_slice(), ["mcp"])
        || matches!(parts.as_slice(), ["servers", name, "mcp"] if !name.is_empty()
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)))
}

enum Mode {
    BuiltIn(Box<routes::BuiltIn>),
    External(issuer::External),
}

/// OAuth for one HTTP server.
pub struct OAuth {
    public_url: Option<String>,
    mode: Mode,
}

impl std::fmt::Debug for OAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mode = match &self.mode {
            Mode::BuiltIn(_) => "built-in".to_string(),
            Mode::External(e) => format!("issuer {}", e.issuer),
        };
        f.debug_struct("OAuth")
            .field("public_url", &self.public_url)
            .field("mode", &mode)
            .finish()
    }
}

impl OAuth {
    pub fn new(settings: Settings) -> Result<Arc<OAuth>, String> {
        let public_url = match settings.public_url {
            Some(u) => Some(check_public_url(&u)?),
            None => None,
        };
        let roots = match &settings.ca_file {
            None => Vec::new(),
            Some(path) => {
                let pem = std::fs::read(path)
                    .map_err(|e| format!("--oauth-ca-file {}: {e}", path.display()))?;
                reqwest::Certificate::from_pem_bundle(&pem)
                    .map_err(|e| format!("--oauth-ca-file {}: {e}", path.display()))?
            }
        };
        let mode = match settings.kind {
            Kind::External {
                issuer,
                audiences,
                tenant_claim,
            } => Mode::External(issuer::External::new(
                &issuer,
                audiences,
                tenant_claim,
                roots,
            )?),
            Kind::BuiltIn { data_dir, accounts } => {
                let mut guard = sandbox_mcp_model::addrs::Guard {
                    operator_allowed: Vec::new(),
                    host_addrs: sandbox_mcp_model::addrs::host_addresses(),
                };
                for n in &settings.allow_nets {
                    guard.operator_allowed.push(
                        sandbox_mcp_model::addrs::Cidr::parse(n)
                            .ok_or_else(|| format!("--oauth-allow-net {n:?} is not a CIDR"))?,
                    );
                }
                Mode::BuiltIn(Box::new(routes::BuiltIn::open(
                    &data_dir,
                    accounts,
                    cimd::Fetcher::new(guard, roots),
                    settings.access_ttl,
                )?))
            }
        };
        Ok(Arc::new(OAuth { public_url, mode }))
    }

    /// The host name the public URL names, to be accepted in `Host` and `Origin`.
    pub fn public_host(&self) -> Option<String> {
        public_url_host(self.public_url.as_deref()?).ok()
    }

    /// The server's base URL (no trailing slash): the public URL, or `http://` and the request's
    /// `Host` (already checked against the allowed hosts).
    pub fn base(&self, headers: &HeaderMap) -> String {
        if let Some(u) = &self.public_url {
            return u.clone();
        }
        let host = headers
            .get(http::header::HOST)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("localhost");
        format!("http://{host}")
    }

    /// The issuer tokens come from.
    fn issuer(&self, base: &str) -> String {
        match &self.mode {
            Mode::BuiltIn(_) => base.to_string(),
            Mode::External(e) => e.issuer.clone(),
        }
    }

    /// Checks a bearer token for the endpoint at `path`.
    pub async fn authenticate(
        &self,
        headers: &HeaderMap,
        token: &str,
        path: &str,
        query: Option<&str>,
    ) -> Result<Principal, Denied> {
        let base = self.base(headers);
        let (rpath, scope) = endpoint(path, query);
        let resource = format!("{base}{rpath}");
        match &self.mode {
            Mode::External(e) => e.check(token, &resource, scope).await,
            Mode::BuiltIn(b) => b.check(token, &base, &resource, scope),
        }
    }

    /// The `WWW-Authenticate` value for a refusal at `path`.
    pub fn challenge(
        &self,
        headers: &HeaderMap,
        path: &str,
        query: Option<&str>,
        denied: &Denied,
    ) -> HeaderValue {
        let base = self.base(headers);
        let (rpath, scope) = endpoint(path, query);
        let quote = |s: &str| {
            s.replace(['"', '\\'], "'")
                .replace(|c: char| c.is_control(), " ")
        };
        let mut v = format!(
            "Bearer resource_metadata=\"{base}/.well-known/oauth-protected-resource{rpath}\", scope=\"{}\"",
            denied.scope.unwrap_or(scope)
        );
        if !denied.error.is_empty() {
            v.push_str(&format!(
                ", error=\"{}\", error_description=\"{}\"",
                denied.error,
                quote(&denied.description)
            ));
        }
        HeaderValue::from_str(&v).unwrap_or_else(|_| HeaderValue::from_static("Bearer"))
    }

    /// The Protected Resource Metadata document of a resource path (`""` for the whole server).
    fn resource_metadata(&self, base: &str, path: &str) -> Option<serde_json::Value> {
        let (resource, scopes) = if path.is_empty() {
            (base.to_string(), vec![SANDBOXES, SERVERS])
        } else if resource_path(path) {
            (format!("{base}{path}"), vec![endpoint(path, None).1])
        } else {
            return None;
        };
        Some(serde_json::json!({
            "resource": resource,
            "authorization_servers": [self.issuer(base)],
            "scopes_supported": scopes,
            "bearer_methods_supported": ["header"],
            "resource_name": "sandbox-mcp",
        }))
    }
}

/// The host of `--public-url` (checked as [`check_public_url`] does), lowercased: the HTTP
/// server accepts it in `Host` and `Origin` whether or not OAuth is on.
pub fn public_url_host(url: &str) -> Result<String, String> {
    let origin = check_public_url(url)?;
    reqwest::Url::parse(&origin)
        .ok()
        .and_then(|u| {
            u.host_str()
                .map(|h| h.trim_matches(['[', ']']).to_ascii_lowercase())
        })
        .ok_or_else(|| format!("--public-url {url:?} names no host"))
}

/// `--public-url`: an http(s) origin, without a path, query or fragment.
fn check_public_url(url: &str) -> Result<String, String> {
    let u = reqwest::Url::parse(url).map_err(|e| format!("--public-url {url:?}: {e}"))?;
    if !matches!(u.scheme(), "http" | "https")
        || u.host_str().is_none()
        || !matches!(u.path(), "" | "/")
        || u.query().is_some()
        || u.fragment().is_some()
        || !u.username().is_empty()
    {
        return Err(format!(
            "--public-url {url:?} must be an origin such as https://mcp.example.com (no path)"
        ));
    }
    Ok(u.as_str().trim_end_matches('/').to_string())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_and_their_scopes() {
        assert_eq!(endpoint("/mcp", None), ("/mcp".into(), SANDBOXES));
        assert_eq!(
            endpoint("/mcp", Some("name=time")),
            ("/mcp".into(), SERVERS)
        );
        assert_eq!(
            endpoint("/servers/time/mcp", None),
            ("/servers/time/mcp".into(), SERVERS)
        );
        assert!(resource_path("/servers/time/mcp") && resource_path("/mcp"));
        assert!(!resource_path("/servers//mcp") && !resource_path("/other"));
        assert_eq!(
            check_public_url("https://mcp.example.com/").unwrap(),
            "https://mcp.example.com"
        );
        assert!(check_public_url("https://mcp.example.com/x").is_err());
        assert!(check_public_url("ftp://x").is_err());
        assert_eq!(
            public_url_host("https://MCP.example.com:8443").unwrap(),
            "mcp.example.com"
        );
        assert_eq!(public_url_host("http://[::1]:80/").unwrap(), "::1");
        assert!(public_url_host("https://mcp.example.com/mcp").is_err());
    }
}
