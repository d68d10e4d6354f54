//! Client ID Metadata Documents: a client whose `client_id` is an `https://` URL is described by
//! the JSON document at that URL. Fetching it is a request this server makes on behalf of anyone
//! who can reach its authorization page, so:
//!
//! - only `https://` URLs with a path, no user info, no fragment, port 443 or named explicitly;
//! - the name is resolved here and *every* address checked: loopback, private, link-local (cloud
//!   metadata), the other special-purpose ranges and this host's own addresses are refused unless
//!   the operator opened them (`--oauth-allow-net`); the connection then goes to the checked
//!   address, so a second DNS answer cannot move it (rebinding);
//! - no redirects, no proxy, 5 s in all, at most [`MAX_DOCUMENT`] bytes;
//! - the document must name itself as `client_id` and list its redirect URIs;
//! - good documents are cached for ten minutes, at most [`MAX_CACHED`] of them;
//! - at most [`MAX_FETCHES`] fetches at once: anyone may ask for one, so the server must not become
//!   a way to flood other hosts.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

use sandbox_mcp_model::addrs::Guard;

use crate::clients::{ClientInfo, check_redirect_uri, clean_name};

/// Largest document read.
pub const MAX_DOCUMENT: usize = 16 * 1024;
const MAX_CACHED: usize = 256;
/// Fetches in flight at most.
pub const MAX_FETCHES: usize = 8;
const CACHE_FOR: Duration = Duration::from_secs(600);
const TIMEOUT: Duration = Duration::from_secs(5);

pub struct Fetcher {
    guard: Guard,
    extra_roots: Vec<reqwest::Certificate>,
    cache: Mutex<HashMap<String, (Instant, ClientInfo)>>,
    in_flight: tokio::sync::Semaphore,
}

/// Whether `client_id` asks to be resolved as a metadata document.
pub fn is_document_url(client_id: &str) -> bool {
    client_id.starts_with("https://")
}

impl Fetcher {
    pub fn new(guard: Guard, extra_roots: Vec<reqwest::Certificate>) -> Fetcher {
        Fetcher {
            guard,
            extra_roots,
            cache: Mutex::new(HashMap::new()),
            in_flight: tokio::sync::Semaphore::new(MAX_FETCHES),
        }
    }

    pub async fn client(&self, client_id: &str) -> Result<ClientInfo, String> {
        if let Some((at, info)) = self
            .cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(client_id)
            && at.elapsed() < CACHE_FOR
        {
            return Ok(info.clone());
        }
        let Ok(_permit) = self.in_flight.try_acquire() else {
            return Err(
                "too many client metadata documents are being fetched right now; try again in a few seconds"
                    .into(),
            );
        };
        let info = self.fetch(client_id).await?;
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        cache.retain(|_, (at, _)| at.elapsed() < CACHE_FOR);
        if cache.len() >= MAX_CACHED {
            let oldest = cache
                .iter()
                .min_by_key(|(_, (at, _))| *at)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                cache.remove(&k);
            }
        }
        cache.insert(client_id.to_string(), (Instant::now(), info.clone()));
        Ok(info)
    }

    async fn fetch(&self, client_id: &str) -> Result<ClientInfo, String> {
        let url = reqwest::Url::parse(client_id)
            .map_err(|e| format!("the client_id is not a URL: {e}"))?;
        if url.scheme() != "https" {
            return Err("a client metadata document is fetched over https only".into());
        }
        if url.fragment().is_some() || !url.username().is_empty() || url.password().is_some() {
            return Err("a client_id URL has no fragment and no user info".into());
        }
        if url.path() == "/" || url.path().is_empty() {
            return Err("a client_id URL must have a path".into());
        }
        if url.path().split('/').any(|seg| seg == "." || seg == "..") {
            return Err("a client_id URL has no `.` or `..` segments".into());
        }
        let host = url
            .host_str()
            .ok_or("the client_id URL has no host")?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let port = url.port_or_known_default().unwrap_or(443);
        let addrs: Vec<IpAddr> = match host.parse::<IpAddr>() {
            Ok(ip) => vec![ip],
            Err(_) => tokio::time::timeout(TIMEOUT, tokio::net::lookup_host((host.as_str(), port)))
                .await
                .map_err(|_| format!("resolving {host} took too long"))?
                .map_err(|e| format!("cannot resolve {host}: {e}"))?
                .map(|a| a.ip())
                .collect(),
        };
        let first = *addrs
            .first()
            .ok_or_else(|| format!("{host} has no address"))?;
        for ip in &addrs {
            if let Some(why) = self.guard.refuses(*ip) {
                return Err(format!(
                    "the client metadata document's host {host} is refused: {why}"
                ));
            }
        }
        let mut builder = sandbox_mcp_api::http_builder()
            .no_proxy()
            .https_only(true)
            .redirect(reqwest::redirect::Policy::none())
            .timeout(TIMEOUT)
            .connect_timeout(TIMEOUT);
        if !self.extra_roots.is_empty() {
            builder = builder.tls_certs_merge(self.extra_roots.iter().cloned());
        }
        if host.parse::<IpAddr>().is_err() {
            builder = builder.resolve(&host, SocketAddr::new(first, port));
        }
        let http = builder
            .build()
            .map_err(|e| format!("cannot make an HTTP client: {e}"))?;
        let mut response = http
            .get(url.clone())
            .header("accept", "application/json")
            .send()
            .await
            .map_err(|e| format!("cannot fetch the client metadata document: {e}"))?;
        if !response.status().is_success() {
            return Err(format!(
                "the client metadata document answered {} (redirects are not followed)",
                response.status()
            ));
        }
        if response
            .content_length()
            .is_some_and(|n| n > MAX_DOCUMENT as u64)
        {
            return Err(format!(
                "the client metadata document is larger than {MAX_DOCUMENT} bytes"
            ));
        }
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| format!("cannot read the client metadata document: {e}"))?
        {
            body.extend_from_slice(&chunk);
            if body.len() > MAX_DOCUMENT {
                return Err(format!(
                    "the client metadata document is larger than {MAX_DOCUMENT} bytes"
                ));
            }
        }
        let doc: Value = serde_json::from_slice(&body)
            .map_err(|e| format!("the client metadata document is not JSON: {e}"))?;
        parse_document(client_id, &doc)
    }
}

/// Checks a document against the URL it was fetched from.
pub fn parse_document(client_id: &str, doc: &Value) -> Result<ClientInfo, String> {
    if doc.get("client_id").and_then(Value::as_str) != Some(client_id) {
        return Err(
            "the client metadata document's client_id is not the URL it was fetched from".into(),
        );
    }
    let method = doc
        .get("token_endpoint_auth_method")
        .and_then(Value::as_str)
        .unwrap_or("none");
    if method != "none" {
        return Err(format!(
            "token_endpoint_auth_method {method:?} is not supported for metadata-document clients (use \"none\")"
        ));
    }
    if doc.get("client_secret").is_some() || doc.get("client_secret_expires_at").is_some() {
        return Err("a client metadata document must not carry a client secret".into());
    }
    let uris: Vec<String> = doc
        .get("redirect_uris")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect()
        })
        .unwrap_or_default();
    if uris.is_empty() || uris.len() > 20 {
        return Err("the client metadata document must list 1 to 20 redirect_uris".into());
    }
    for u in &uris {
        check_redirect_uri(u)?;
    }
    let name = doc
        .get("client_name")
        .and_then(Value::as_str)
        .map(clean_name)
        .filter(|n| !n.is_empty());
    Ok(ClientInfo {
        client_id: client_id.to_string(),
        name,
        redirect_uris: uris,
        secret_sha256: None,
        kind: "metadata document",
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn fetches_in_flight_are_bounded_and_private_hosts_refused() {
        let f = Fetcher::new(Guard::default(), vec![]);
        let e = f.client("https://127.0.0.1/client.json").await.unwrap_err();
        assert!(e.contains("loopback"), "{e}");
        let held = f.in_flight.try_acquire_many(MAX_FETCHES as u32).unwrap();
        let e = f.client("https://127.0.0.1/client.json").await.unwrap_err();
        assert!(e.contains("too many"), "{e}");
        drop(held);
        let doc = serde_json::json!({"client_id": "https://a.example/c", "redirect_uris": ["https://a.example/cb"]});
        assert!(parse_document("https://a.example/c", &doc).is_ok());
        assert!(parse_document("https://b.example/c", &doc).is_err());
    }
}
