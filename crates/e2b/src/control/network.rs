//! E2B's network options on the engine's egress rules, which mean the same: `allowOut` takes
//! CIDRs and domain names, `denyOut` CIDRs, and an allowed destination is reached even when a
//! denied range holds it (E2B's "allow takes precedence"). `allow_internet_access: false` is
//! denying everything. Set at create, and replaced whole by `PUT /sandboxes/{id}/network`; new
//! rules apply to the next connection.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use sandbox_mcp_model::record::NetworkRules;

use super::{D, parse_body, refuse, view};
use crate::Failure;

/// Everything, as the SDKs' `ctx.all_traffic` names it (and IPv6's, which the engine also has).
const ALL: [&str; 2] = ["0.0.0.0/0", "::/0"];

/// E2B's `network` of a create, or the body of a network update.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(super) struct Network {
    allow_out: Option<Vec<String>>,
    deny_out: Option<Vec<String>>,
    /// Whether the sandbox's ports need the traffic token: this door serves no ports but the
    /// code interpreter's, which always does.
    #[allow(dead_code)]
    allow_public_traffic: Option<bool>,
    mask_request_host: Option<String>,
    egress_proxy: Option<serde_json::Value>,
    rules: Option<serde_json::Value>,
    #[serde(rename = "allow_internet_access")]
    allow_internet_access: Option<bool>,
}

/// The engine's rules for E2B's options (`internet`: the create's `allow_internet_access`).
pub(super) fn rules(network: Network, internet: Option<bool>) -> Result<NetworkRules, Failure> {
    refuse(&[
        (
            network.mask_request_host.is_some(),
            "network.maskRequestHost is not supported here: sandbox ports are reached through the engine's previews",
        ),
        (
            network.egress_proxy.is_some(),
            "network.egressProxy is not supported here: the engine relays and logs every connection itself",
        ),
        (
            network.rules.is_some(),
            "network.rules (request transforms) are not supported here; the engine's brokered secrets put credentials into requests (see its README)",
        ),
    ])?;
    let mut deny_out = network.deny_out.unwrap_or_default();
    if network.allow_internet_access.or(internet) == Some(false) {
        deny_out.extend(ALL.map(String::from));
    }
    // E2B's "all traffic" is IPv4's; the engine's relay carries IPv6 too, which it covers.
    if deny_out.iter().any(|d| d == ALL[0]) && !deny_out.iter().any(|d| d == ALL[1]) {
        deny_out.push(ALL[1].into());
    }
    deny_out.dedup();
    Ok(NetworkRules {
        allow_out: network.allow_out.unwrap_or_default(),
        deny_out,
    })
}

/// `PUT /sandboxes/{id}/network`: replaces the sandbox's egress rules.
pub(super) async fn update(
    State(door): D,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let done = async {
        let network: Network = parse_body(&body)?;
        let rules = rules(network, None)?;
        let (_, tenant) = view(&door, &headers, &id).await?;
        door.manager
            .lifecycle
            .update(&id, tenant.as_deref(), None, Some(rules))
            .await?;
        Ok::<_, Failure>(StatusCode::NO_CONTENT)
    };
    done.await.into_response()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn parsed(json: &str) -> Network {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn e2b_options_become_the_engines_rules() {
        let r = rules(
            parsed(r#"{"denyOut": ["0.0.0.0/0"], "allowOut": ["1.1.1.1", "pypi.org"]}"#),
            None,
        )
        .unwrap();
        assert_eq!(r.allow_out, ["1.1.1.1", "pypi.org"]);
        assert_eq!(r.deny_out, ["0.0.0.0/0", "::/0"]);
        let closed = rules(Network::default(), Some(false)).unwrap();
        assert_eq!((closed.allow_out.len(), closed.deny_out.len()), (0, 2));
        let open = rules(Network::default(), Some(true)).unwrap();
        assert!(open.deny_out.is_empty());
        let update = rules(parsed(r#"{"allow_internet_access": false}"#), None).unwrap();
        assert_eq!(update.deny_out, ["0.0.0.0/0", "::/0"]);
        for unsupported in [
            r#"{"maskRequestHost": "x"}"#,
            r#"{"rules": {}}"#,
            r#"{"egressProxy": {}}"#,
        ] {
            let e = rules(parsed(unsupported), None).unwrap_err();
            assert!(e.message().contains("not supported"), "{}", e.message());
        }
    }
}
