//! What envd does through the door on a caller's behalf, and its bounds: accounts from the
//! sandbox's own `/etc/passwd` (never the agent's id), signed file URLs (one file of one sandbox,
//! one way, until expiry), and the agent's watches (bounded per sandbox).

use reqwest::StatusCode;
use serde_json::{Value, json};

use super::E2bEngine;
use super::doors::{KEYS, create, envd, enveloped, frames, http};
use crate::require_sandboxes;

/// A process started as the account `user` names (the SDKs' `Authorization: Basic`), or as the
/// sandbox's default account.
pub(super) async fn start_as(
    engine: &E2bEngine,
    sandbox: &str,
    token: &str,
    user: Option<&str>,
    cmd: &[&str],
) -> (StatusCode, Vec<(u8, Value)>) {
    use base64::Engine as _;
    let body = enveloped(&json!({"process": {"cmd": cmd[0], "args": &cmd[1..]}, "stdin": false}));
    let basic = user.map(|u| {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{u}:"))
        )
    });
    let mut headers = vec![("X-Access-Token", token)];
    if let Some(b) = &basic {
        headers.push(("Authorization", b));
    }
    let (status, bytes) = envd(
        engine,
        sandbox,
        &headers,
        "/process.Process/Start",
        "application/connect+json",
        body,
    )
    .await;
    (status, frames(&bytes))
}

/// The stdout a started process printed, and how its stream ended (the trailer's error code).
pub(super) fn outcome(frames: &[(u8, Value)]) -> (String, Option<String>) {
    use base64::Engine as _;
    let mut out = Vec::new();
    let mut error = None;
    for (flags, v) in frames {
        if let Some(b) = v["event"]["data"]["stdout"].as_str() {
            out.extend(base64::engine::general_purpose::STANDARD.decode(b).unwrap());
        }
        if flags & 2 != 0 {
            error = v["error"]["code"].as_str().map(str::to_string);
        }
    }
    (String::from_utf8_lossy(&out).into_owned(), error)
}

/// Accounts come from the sandbox's own /etc/passwd, which its code may rewrite: an account
/// whose id is the agent's (the one id the sandbox does not map), or no id of the sandbox at all,
/// runs nothing and owns nothing, and the agent answers on as before.
#[tokio::test]
async fn a_rewritten_passwd_never_makes_a_process_or_a_file_the_agents() {
    require_sandboxes!();
    let engine = E2bEngine::start(KEYS).await;
    let (id, token, _) = create(&engine, "key-alpha").await;
    let (_, f) = start_as(&engine, &id, &token, None, &["id", "-un"]).await;
    assert_eq!(outcome(&f), ("user\n".to_string(), None), "{f:?}");
    let forge = "echo 'agent:x:65535:65535::/:/bin/sh' >> /etc/passwd; \
                 echo 'beyond:x:4294967294:4294967294::/:/bin/sh' >> /etc/passwd; \
                 echo 'twin:x:0:0::/root:/bin/sh' >> /etc/passwd; \
                 rm /etc/group && mkfifo /etc/group && echo forged";
    let (_, f) = start_as(&engine, &id, &token, Some("root"), &["sh", "-c", forge]).await;
    assert_eq!(outcome(&f).0, "forged\n", "{f:?}");
    for account in ["agent", "beyond"] {
        let (_, f) = start_as(&engine, &id, &token, Some(account), &["id"]).await;
        let (out, error) = outcome(&f);
        assert!(out.is_empty() && error.is_some(), "{account} ran: {f:?}");
        let (status, body) = envd(
            &engine,
            &id,
            &[("X-Access-Token", &token)],
            &format!("/files?path=/tmp/{account}.txt&username={account}"),
            "application/octet-stream",
            b"x".to_vec(),
        )
        .await;
        assert!(
            status.is_client_error() || status.is_server_error(),
            "{account} owns a file: {status} {}",
            String::from_utf8_lossy(&body)
        );
    }
    // Root under another name is the sandbox's root, nothing more; a FIFO for /etc/group blocks
    // nothing (listings name groups by number).
    let (_, f) = start_as(&engine, &id, &token, Some("twin"), &["id", "-u"]).await;
    assert_eq!(outcome(&f), ("0\n".to_string(), None), "{f:?}");
    let listed = envd(
        &engine,
        &id,
        &[("X-Access-Token", &token)],
        "/filesystem.Filesystem/ListDir",
        "application/json",
        br#"{"path": "/tmp"}"#.to_vec(),
    )
    .await;
    assert_eq!(listed.0, 200, "{}", String::from_utf8_lossy(&listed.1));
    let listing: Value = serde_json::from_slice(&listed.1).unwrap();
    let names: Vec<&str> = listing["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert!(
        !names
            .iter()
            .any(|n| n.starts_with("agent") || n.starts_with("beyond")),
        "{names:?}"
    );
    let (_, f) = start_as(&engine, &id, &token, None, &["id", "-un"]).await;
    assert_eq!(outcome(&f), ("user\n".to_string(), None), "{f:?}");
}

/// A signed file URL, as the SDKs make one from a sandbox's envd token.
fn signed_url(
    engine: &E2bEngine,
    token: &str,
    path: &str,
    op: &str,
    expiry: Option<i64>,
) -> String {
    use base64::Engine as _;
    use sha2::Digest as _;
    let mut raw = format!("{path}:{op}:user:{token}");
    if let Some(at) = expiry {
        raw.push_str(&format!(":{at}"));
    }
    let sig = base64::engine::general_purpose::STANDARD_NO_PAD
        .encode(sha2::Sha256::digest(raw))
        .replace('+', "%2B")
        .replace('/', "%2F");
    let mut url = format!(
        "{}/files?path={path}&username=user&signature=v1_{sig}",
        engine.e2b
    );
    if let Some(at) = expiry {
        url.push_str(&format!("&signature_expiration={at}"));
    }
    url
}

/// A signed URL opens the one file of the one sandbox whose token signed it, for the one
/// operation, until it expires; a watch is bounded like everything an agent keeps.
#[tokio::test]
async fn a_signed_url_opens_one_file_of_one_sandbox_and_watches_are_bounded() {
    require_sandboxes!();
    let engine = E2bEngine::start(KEYS).await;
    let (a, a_token, _) = create(&engine, "key-alpha").await;
    let (b, b_token, _) = create(&engine, "key-beta").await;
    for (id, token, text) in [(&a, &a_token, "alpha's"), (&b, &b_token, "beta's")] {
        let (status, _) = envd(
            &engine,
            id,
            &[("X-Access-Token", token)],
            "/files?path=/home/user/f.txt",
            "application/octet-stream",
            text.as_bytes().to_vec(),
        )
        .await;
        assert_eq!(status, 200);
    }
    let get = |url: String, sandbox: Option<String>| async move {
        let mut req = http().get(url);
        if let Some(id) = sandbox {
            req = req.header("E2b-Sandbox-Id", id);
        }
        let res = req.send().await.unwrap();
        (res.status().as_u16(), res.text().await.unwrap())
    };
    let now = sandbox_mcp_model::ids::now_ms() / 1000;
    let url = signed_url(
        &engine,
        &a_token,
        "/home/user/f.txt",
        "read",
        Some(now + 60),
    );
    assert_eq!(get(url.clone(), None).await, (200, "alpha's".to_string()));
    // Named for another sandbox, the signature opens nothing there.
    assert_eq!(get(url.clone(), Some(b.clone())).await.0, 401);
    // Another path, another operation, a token of no sandbox, or past its expiry: refused.
    let other_path = url.replace("f.txt", "g.txt");
    assert_eq!(get(other_path, None).await.0, 401);
    let write = signed_url(&engine, &a_token, "/home/user/f.txt", "write", None);
    assert_eq!(get(write.clone(), None).await.0, 401);
    // Signed for `user`, it does not act as root: the account is part of what is signed.
    let as_root = url.replace("username=user", "username=root");
    assert_ne!(as_root, url);
    assert_eq!(get(as_root, None).await.0, 401);
    let forged = signed_url(&engine, "not-a-token", "/home/user/f.txt", "read", None);
    let (status, body) = get(forged, None).await;
    assert_eq!(
        (status, body.contains("invalid signature")),
        (401, true),
        "{body}"
    );
    let old = signed_url(
        &engine,
        &a_token,
        "/home/user/f.txt",
        "read",
        Some(now - 60),
    );
    let (status, body) = get(old, None).await;
    assert_eq!(status, 401);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap(),
        json!({"code": 401, "message": "signature is already expired"})
    );
    // The write signature uploads, and only there.
    let res = http().post(write).body("rewritten").send().await.unwrap();
    let status = res.status().as_u16();
    assert_eq!(status, 200, "{}", res.text().await.unwrap());
    let url = signed_url(&engine, &b_token, "/home/user/f.txt", "read", None);
    assert_eq!(get(url, None).await, (200, "beta's".to_string()));
    // Watches: 32 per sandbox, then a clear refusal; removing one makes room.
    let watch = |method: &'static str, body: Value| {
        let (engine, a, a_token) = (&engine, a.clone(), a_token.clone());
        async move {
            let (status, bytes) = envd(
                engine,
                &a,
                &[("X-Access-Token", &a_token)],
                &format!("/filesystem.Filesystem/{method}"),
                "application/json",
                body.to_string().into_bytes(),
            )
            .await;
            (
                status.as_u16(),
                serde_json::from_slice::<Value>(&bytes).unwrap(),
            )
        }
    };
    let mut ids = Vec::new();
    for _ in 0..32 {
        let (status, made) = watch("CreateWatcher", json!({"path": "/home/user"})).await;
        assert_eq!(status, 200, "{made}");
        ids.push(made["watcherId"].as_str().unwrap().to_string());
    }
    let (status, refused) = watch("CreateWatcher", json!({"path": "/home/user"})).await;
    assert_eq!(status, 400, "{refused}");
    assert!(
        refused["message"].as_str().unwrap().contains("32 watches"),
        "{refused}"
    );
    let (status, _) = watch("RemoveWatcher", json!({"watcherId": ids[0]})).await;
    assert_eq!(status, 200);
    let (status, made) = watch("CreateWatcher", json!({"path": "/home/user"})).await;
    assert_eq!(status, 200, "{made}");
}
