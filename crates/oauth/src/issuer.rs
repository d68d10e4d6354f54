//! An external identity provider (`--oauth-issuer URL`): its signed JWT access tokens are checked
//! here against the keys it publishes.
//!
//! The issuer's metadata (OpenID discovery, or RFC 8414) is read at first use and must name the
//! issuer exactly; its JWKS is cached and read again after ten minutes, or at once (at most every
//! [`REFETCH_AFTER`]) when a token names a key it does not hold, so a rotated key works at once and
//! a removed one stops at the next refetch. Each token must be signed by an allowed asymmetric
//! algorithm ([`crate::jwt`]), name the issuer as `iss` and an accepted audience in `aud`, be
//! within `exp`/`nbf` (a minute's leeway), carry the endpoint's scope, and have a tenant name in
//! the configured claim.

use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::Mutex;

use crate::jwt::{self, Jwk};
use crate::{Denied, Principal};

/// A token naming an unknown key makes the JWKS be read again, but not more often than this.
pub const REFETCH_AFTER: Duration = Duration::from_secs(1);
const MAX_AGE: Duration = Duration::from_secs(600);
const LEEWAY_S: i64 = 60;
const MAX_DOCUMENT: usize = 256 * 1024;

pub struct External {
    pub issuer: String,
    /// Accepted `aud` values besides the endpoint's own resource URL.
    pub audiences: Vec<String>,
    pub tenant_claim: String,
    http: reqwest::Client,
    keys: Mutex<Keys>,
}

#[derive(Default)]
struct Keys {
    jwks_uri: Option<String>,
    keys: Vec<Jwk>,
    fetched: Option<Instant>,
}

impl External {
    pub fn new(
        issuer: &str,
        audiences: Vec<String>,
        tenant_claim: String,
        extra_roots: Vec<reqwest::Certificate>,
    ) -> Result<External, String> {
        let url =
            reqwest::Url::parse(issuer).map_err(|e| format!("--oauth-issuer {issuer:?}: {e}"))?;
        let loopback = matches!(url.host_str(), Some("localhost" | "127.0.0.1" | "[::1]"));
        if url.scheme() != "https" && !(url.scheme() == "http" && loopback) {
            return Err(format!(
                "--oauth-issuer {issuer:?} must be an https URL (plain http only on loopback)"
            ));
        }
        let mut builder = sandbox_mcp_api::http_builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(10));
        if !extra_roots.is_empty() {
            builder = builder.tls_certs_merge(extra_roots);
        }
        Ok(External {
            issuer: issuer.to_string(),
            audiences,
            tenant_claim,
            http: builder.build().map_err(|e| e.to_string())?,
            keys: Mutex::new(Keys::default()),
        })
    }

    async fn get_json(&self, url: &str) -> Result<Value, String> {
        let mut r = self
            .http
            .get(url)
            .header("accept", "application/json")
            .send()
            .await
            .map_err(|e| format!("cannot reach {url}: {e}"))?;
        if !r.status().is_success() {
            return Err(format!("{url} answered {}", r.status()));
        }
        let mut body = Vec::new();
        while let Some(chunk) = r.chunk().await.map_err(|e| e.to_string())? {
            body.extend_from_slice(&chunk);
            if body.len() > MAX_DOCUMENT {
                return Err(format!("{url} sent more than {MAX_DOCUMENT} bytes"));
            }
        }
        serde_json::from_slice(&body).map_err(|e| format!("{url} is not JSON: {e}"))
    }

    async fn discover(&self) -> Result<String, String> {
        let base = self.issuer.trim_end_matches('/');
        let mut last = String::new();
        for url in [
            format!("{base}/.well-known/openid-configuration"),
            format!("{base}/.well-known/oauth-authorization-server"),
        ] {
            match self.get_json(&url).await {
                Ok(doc) => {
                    if doc.get("issuer").and_then(Value::as_str) != Some(self.issuer.as_str()) {
                        return Err(format!("{url} names another issuer than {}", self.issuer));
                    }
                    return doc
                        .get("jwks_uri")
                        .and_then(Value::as_str)
                        .map(String::from)
                        .ok_or_else(|| format!("{url} has no jwks_uri"));
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// The keys, read again when stale, or when `kid` is unknown and the last read is not too
    /// recent.
    async fn keys_for(&self, token: &jwt::Unverified<'_>) -> Result<Vec<Jwk>, String> {
        let mut k = self.keys.lock().await;
        let stale = k.fetched.is_none_or(|t| t.elapsed() > MAX_AGE);
        let unknown =
            !token.key_known(&k.keys) && k.fetched.is_none_or(|t| t.elapsed() >= REFETCH_AFTER);
        if stale || unknown {
            let uri = match &k.jwks_uri {
                Some(u) => u.clone(),
                None => self.discover().await?,
            };
            let doc = self.get_json(&uri).await?;
            k.keys = jwt::parse_jwks(&doc);
            k.jwks_uri = Some(uri);
            k.fetched = Some(Instant::now());
        }
        Ok(k.keys.clone())
    }

    pub async fn check(
        &self,
        token: &str,
        resource: &str,
        scope: &str,
    ) -> Result<Principal, Denied> {
        let t = jwt::split(token).map_err(Denied::invalid)?;
        let keys = self
            .keys_for(&t)
            .await
            .map_err(|e| Denied::invalid(format!("the issuer's keys cannot be read: {e}")))?;
        if !t.verified_by(&keys) {
            return Err(Denied::invalid(
                "the signature does not verify with the issuer's keys",
            ));
        }
        let c = &t.claims;
        if c.get("iss").and_then(Value::as_str) != Some(self.issuer.as_str()) {
            return Err(Denied::invalid("the token is from another issuer"));
        }
        let auds: Vec<&str> = match c.get("aud") {
            Some(Value::String(s)) => vec![s.as_str()],
            Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
            _ => vec![],
        };
        let accepted = |a: &&str| *a == resource || self.audiences.iter().any(|x| x == a);
        if !auds.iter().any(accepted) {
            return Err(Denied::invalid(format!(
                "the token's audience is not this resource ({resource})"
            )));
        }
        let now = sandbox_mcp_model::ids::now_ms() / 1000;
        let exp = c
            .get("exp")
            .and_then(Value::as_i64)
            .ok_or_else(|| Denied::invalid("the token has no exp"))?;
        if now > exp + LEEWAY_S {
            return Err(Denied::invalid("the token has expired"));
        }
        if c.get("nbf")
            .and_then(Value::as_i64)
            .is_some_and(|nbf| now + LEEWAY_S < nbf)
        {
            return Err(Denied::invalid("the token is not valid yet"));
        }
        let scopes: Vec<&str> = match (c.get("scope"), c.get("scp")) {
            (Some(Value::String(s)), _) | (None, Some(Value::String(s))) => {
                s.split_whitespace().collect()
            }
            (_, Some(Value::Array(a))) => a.iter().filter_map(Value::as_str).collect(),
            _ => vec![],
        };
        if !scopes.contains(&scope) {
            return Err(Denied::scope(scope));
        }
        let tenant = c
            .get(&self.tenant_claim)
            .and_then(Value::as_str)
            .ok_or_else(|| {
                Denied::forbidden(format!(
                    "the token has no {:?} claim to name a tenant (--oauth-tenant-claim)",
                    self.tenant_claim
                ))
            })?;
        if !sandbox_mcp_api::auth::valid_tenant(tenant) {
            return Err(Denied::forbidden(format!(
                "the token's {:?} claim is not a tenant name (1-63 of a-z, 0-9, `-`, `_`); choose another claim with --oauth-tenant-claim",
                self.tenant_claim
            )));
        }
        Ok(Principal {
            tenant: tenant.to_string(),
        })
    }
}
