//! What E2B's door must refuse, by raw HTTP: another tenant's sandboxes, another sandbox's (or
//! no) token, a killed sandbox, what has no meaning here, bad input; and that what comes in
//! through it stays inside the sandbox.

use reqwest::StatusCode;
use serde_json::{Value, json};

use super::E2bEngine;
use crate::require_sandboxes;

pub(super) const KEYS: &str = "key-alpha alpha\nkey-beta beta\n";

fn http() -> reqwest::Client {
    sandbox_mcp_api::http_builder().no_proxy().build().unwrap()
}

pub(super) async fn control(
    engine: &E2bEngine,
    key: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut req = http()
        .request(method, format!("{}{path}", engine.e2b))
        .header("X-API-KEY", key);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let res = req.send().await.unwrap();
    let status = res.status();
    let text = res.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

async fn create(engine: &E2bEngine, key: &str) -> (String, String, String) {
    let (status, made) = control(
        engine,
        key,
        reqwest::Method::POST,
        "/sandboxes",
        Some(json!({"templateID": "base", "timeout": 300})),
    )
    .await;
    assert_eq!(status, 201, "{made}");
    (
        made["sandboxID"].as_str().unwrap().to_string(),
        made["envdAccessToken"].as_str().unwrap().to_string(),
        made["trafficAccessToken"].as_str().unwrap().to_string(),
    )
}

/// An envd call: (status, body) of a unary Connect call, or the frames of a stream.
async fn envd(
    engine: &E2bEngine,
    sandbox: &str,
    headers: &[(&str, &str)],
    path: &str,
    content_type: &str,
    body: Vec<u8>,
) -> (StatusCode, Vec<u8>) {
    let mut req = http()
        .post(format!("{}{path}", engine.e2b))
        .header("E2b-Sandbox-Id", sandbox)
        .header("Content-Type", content_type)
        .body(body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let res = req.send().await.unwrap();
    (res.status(), res.bytes().await.unwrap().to_vec())
}

fn enveloped(v: &Value) -> Vec<u8> {
    let json = v.to_string().into_bytes();
    let mut out = vec![0];
    out.extend_from_slice(&(json.len() as u32).to_be_bytes());
    out.extend_from_slice(&json);
    out
}

/// The (flags, message) of each frame of a Connect stream.
fn frames(mut body: &[u8]) -> Vec<(u8, Value)> {
    let mut out = Vec::new();
    while body.len() >= 5 {
        let len = u32::from_be_bytes(body[1..5].try_into().unwrap()) as usize;
        out.push((body[0], serde_json::from_slice(&body[5..5 + len]).unwrap()));
        body = &body[5 + len..];
    }
    assert!(body.is_empty(), "trailing bytes: {body:?}");
    out
}

async fn start(
    engine: &E2bEngine,
    sandbox: &str,
    token: &str,
    cmd: &[&str],
) -> (StatusCode, Vec<(u8, Value)>) {
    start_as(engine, sandbox, token, None, cmd).await
}

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

#[tokio::test]
async fn one_key_never_reaches_another_tenants_sandboxes() {
    require_sandboxes!();
    let engine = E2bEngine::start(KEYS).await;
    let (id, _, _) = create(&engine, "key-alpha").await;
    use reqwest::Method as M;
    for (method, path, body) in [
        (M::GET, format!("/sandboxes/{id}"), None),
        (M::DELETE, format!("/sandboxes/{id}"), None),
        (M::POST, format!("/sandboxes/{id}/pause"), None),
        (
            M::POST,
            format!("/sandboxes/{id}/connect"),
            Some(json!({"timeout": 10})),
        ),
        (
            M::POST,
            format!("/v2/sandboxes/{id}/connect"),
            Some(json!({"timeout": 10})),
        ),
        (
            M::POST,
            format!("/sandboxes/{id}/timeout"),
            Some(json!({"timeout": 10})),
        ),
        (
            M::POST,
            format!("/sandboxes/{id}/snapshots"),
            Some(json!({"name": "taken-by-beta"})),
        ),
    ] {
        let (status, body) = control(&engine, "key-beta", method.clone(), &path, body).await;
        assert_eq!(status, 404, "{method} {path}: {body}");
    }
    // A snapshot is its tenant's template: another tenant neither lists, starts nor deletes it.
    let (status, snap) = control(
        &engine,
        "key-alpha",
        M::POST,
        &format!("/sandboxes/{id}/snapshots"),
        Some(json!({"name": "alpha-snap"})),
    )
    .await;
    assert_eq!(
        (status, &snap["snapshotID"]),
        (StatusCode::CREATED, &json!("alpha-snap"))
    );
    let (_, listed) = control(&engine, "key-beta", M::GET, "/snapshots", None).await;
    assert_eq!(listed, json!([]));
    let made = json!({"templateID": "alpha-snap", "timeout": 30});
    let (status, body) = control(&engine, "key-beta", M::POST, "/sandboxes", Some(made)).await;
    assert_eq!(status, 404, "{body}");
    let (status, _) = control(
        &engine,
        "key-beta",
        M::DELETE,
        "/templates/alpha-snap",
        None,
    )
    .await;
    assert_eq!(status, 404);
    let (_, listed) = control(&engine, "key-alpha", M::GET, "/snapshots", None).await;
    assert_eq!(
        listed,
        json!([{"snapshotID": "alpha-snap", "names": ["alpha-snap"]}])
    );
    let (status, listed) = control(&engine, "key-beta", M::GET, "/v2/sandboxes", None).await;
    assert_eq!((status, listed), (StatusCode::OK, json!([])));
    let (_, listed) = control(&engine, "key-alpha", M::GET, "/v2/sandboxes", None).await;
    assert_eq!(listed[0]["sandboxID"], id.as_str(), "{listed}");
    // Still there and running for its own tenant.
    let (status, got) = control(
        &engine,
        "key-alpha",
        M::GET,
        &format!("/sandboxes/{id}"),
        None,
    )
    .await;
    assert_eq!(
        (status, got["state"].clone()),
        (StatusCode::OK, json!("running")),
        "{got}"
    );
    // No key, or a key the engine does not have: refused, saying what to set.
    for key in ["", "not-a-key"] {
        let (status, body) = control(&engine, key, M::GET, "/v2/sandboxes", None).await;
        assert_eq!(status, 401, "{body}");
        assert!(
            body["message"].as_str().unwrap().contains("E2B_API_KEY"),
            "{body}"
        );
    }
}

#[tokio::test]
async fn an_envd_token_opens_its_own_sandbox_only() {
    require_sandboxes!();
    let engine = E2bEngine::start(KEYS).await;
    let (a, token_a, traffic_a) = create(&engine, "key-alpha").await;
    let (b, token_b, _) = create(&engine, "key-alpha").await;
    let (status, f) = start(&engine, &a, &token_a, &["sh", "-c", "echo hi; exit 3"]).await;
    assert_eq!(status, 200);
    assert!(
        f[0].1["event"]["start"]["pid"].as_u64().unwrap() > 0,
        "{f:?}"
    );
    assert_eq!(f[1].1["event"]["data"]["stdout"], "aGkK", "{f:?}");
    assert_eq!(f[2].1["event"]["end"]["exitCode"], 3, "{f:?}");
    assert_eq!(f.last().unwrap(), &(2, json!({})), "{f:?}");
    // Another sandbox's token, the traffic token, no token: refused, before anything runs.
    for token in [token_b.as_str(), traffic_a.as_str(), "", "AAAA"] {
        let (status, f) = start(&engine, &a, token, &["touch", "/tmp/ran"]).await;
        assert_eq!(status, 200);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].1["error"]["code"], "unauthenticated", "{f:?}");
    }
    let get = |token: &str, sandbox: &str| {
        http()
            .get(format!("{}/files?path=/tmp/ran", engine.e2b))
            .header("E2b-Sandbox-Id", sandbox.to_string())
            .header("X-Access-Token", token.to_string())
            .send()
    };
    assert_eq!(get(&token_b, &a).await.unwrap().status(), 401);
    assert_eq!(
        get(&token_a, &a).await.unwrap().status(),
        404,
        "nothing ran"
    );
    // The traffic token opens the code interpreter's port of its sandbox, and nothing else.
    let execute = |sandbox: &str, token: &str| {
        http()
            .post(format!("{}/execute", engine.e2b))
            .header("E2b-Sandbox-Id", sandbox.to_string())
            .header("E2b-Sandbox-Port", "49999")
            .header("E2B-Traffic-Access-Token", token.to_string())
            .json(&json!({"code": "6 * 7"}))
            .send()
    };
    let ok = execute(&a, &traffic_a).await.unwrap();
    assert_eq!(ok.status(), 200);
    assert!(ok.text().await.unwrap().contains("\"42\""));
    assert_eq!(execute(&b, &traffic_a).await.unwrap().status(), 401);
    // A killed sandbox answers as E2B's proxy does.
    let (status, _) = control(
        &engine,
        "key-alpha",
        reqwest::Method::DELETE,
        &format!("/sandboxes/{a}"),
        None,
    )
    .await;
    assert_eq!(status, 204);
    let (status, body) = control(
        &engine,
        "key-alpha",
        reqwest::Method::DELETE,
        &format!("/sandboxes/{a}"),
        None,
    )
    .await;
    assert_eq!(status, 404, "{body}");
    let gone = get(&token_a, &a).await.unwrap();
    assert_eq!(gone.status(), 502);
    let body: Value = gone.json().await.unwrap();
    assert_eq!(
        body,
        json!({"sandboxId": a, "message": "The sandbox was not found", "code": 502})
    );
}

#[tokio::test]
async fn what_has_no_meaning_here_and_bad_input_get_clear_errors() {
    require_sandboxes!();
    let engine = E2bEngine::start(KEYS).await;
    use reqwest::Method as M;
    let (id, token, _) = create(&engine, "key-alpha").await;
    for (method, path, body, status, words) in [
        (
            M::POST,
            "/sandboxes".to_string(),
            json!({"templateID": "nope"}),
            404,
            "nope",
        ),
        (
            M::POST,
            "/sandboxes".to_string(),
            json!({"templateID": "base", "autoPause": true}),
            400,
            "autoPause",
        ),
        (
            M::POST,
            "/sandboxes".to_string(),
            json!({"templateID": "base", "envVars": {"1BAD": "x"}}),
            400,
            "1BAD",
        ),
        (
            M::POST,
            "/sandboxes".to_string(),
            json!({"templateID": "base", "metadata": {"a=b": "x"}}),
            400,
            "a=b",
        ),
        (
            M::POST,
            "/sandboxes".to_string(),
            json!({"timeout": 3}),
            400,
            "templateID",
        ),
        (
            M::POST,
            format!("/sandboxes/{id}/snapshots"),
            json!({"name": "team/Snap:v1"}),
            400,
            "template name",
        ),
        (
            M::POST,
            format!("/sandboxes/{id}/fork"),
            json!({"count": 0}),
            400,
            "count",
        ),
        (
            M::GET,
            "/teams".to_string(),
            json!(null),
            501,
            "not supported",
        ),
        (
            M::POST,
            format!("/sandboxes/{id}/timeout"),
            json!({"timeout": 99_999_999}),
            400,
            "30 days",
        ),
        (
            M::GET,
            "/v2/sandboxes?state=frozen".to_string(),
            json!(null),
            400,
            "frozen",
        ),
    ] {
        let body = (!body.is_null()).then_some(body);
        let (got, answer) = control(&engine, "key-alpha", method.clone(), &path, body).await;
        assert_eq!(got.as_u16(), status, "{method} {path}: {answer}");
        let message = answer["message"].as_str().unwrap_or_default();
        assert!(message.contains(words), "{method} {path}: {answer}");
        assert_eq!(answer["code"], status, "{answer}");
    }
    // Bad envd requests: refused with Connect's codes, nothing started.
    let (_, f) = start(&engine, &id, &token, &[""]).await;
    assert_eq!(f[0].1["error"]["code"], "invalid_argument", "{f:?}");
    let (status, body) = envd(
        &engine,
        &id,
        &[("X-Access-Token", &token)],
        "/process.Process/Start",
        "application/connect+json",
        b"\x00\x00\x00\x00\x05{".to_vec(),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(frames(&body)[0].1["error"]["code"], "invalid_argument");
    let (status, body) = envd(
        &engine,
        &id,
        &[("X-Access-Token", &token)],
        "/filesystem.Filesystem/Stat",
        "application/json",
        b"{\"path\": \"/no/such/file\"}".to_vec(),
    )
    .await;
    assert_eq!(status, 404, "{}", String::from_utf8_lossy(&body));
    let (status, body) = envd(
        &engine,
        &id,
        &[("X-Access-Token", &token)],
        "/process.Process/SendSignal",
        "application/json",
        b"{\"process\": {\"pid\": 999999}, \"signal\": \"SIGNAL_SIGKILL\"}".to_vec(),
    )
    .await;
    assert_eq!(status, 404, "{}", String::from_utf8_lossy(&body));
    // An upload without a path, or with a broken multipart body.
    let (status, _) = envd(
        &engine,
        &id,
        &[("X-Access-Token", &token)],
        "/files",
        "application/octet-stream",
        b"x".to_vec(),
    )
    .await;
    assert_eq!(status, 400);
    let (status, _) = envd(
        &engine,
        &id,
        &[("X-Access-Token", &token)],
        "/files?path=/tmp/f",
        "multipart/form-data; boundary=B",
        b"--B\r\nbroken".to_vec(),
    )
    .await;
    assert_eq!(status, 400);
}

/// Files and processes that come in through the door land in the sandbox, never on the host,
/// whatever path they name.
#[tokio::test]
async fn what_comes_through_the_door_stays_in_the_sandbox() {
    require_sandboxes!();
    let engine = E2bEngine::start(KEYS).await;
    let (id, token, _) = create(&engine, "key-alpha").await;
    let marker = format!("e2b-door-{}", std::process::id());
    for path in [
        format!("/tmp/{marker}"),
        format!("../../../../../tmp/{marker}.rel"),
        format!("/proc/self/root/tmp/{marker}.proc"),
    ] {
        let (status, body) = envd(
            &engine,
            &id,
            &[("X-Access-Token", &token)],
            &format!("/files?path={path}"),
            "application/octet-stream",
            b"inside".to_vec(),
        )
        .await;
        assert!(
            status == 200 || status == 400 || status == 403,
            "{path}: {status} {}",
            String::from_utf8_lossy(&body)
        );
    }
    let (_, f) = start(
        &engine,
        &id,
        &token,
        &[
            "sh",
            "-c",
            &format!("echo process > /tmp/{marker}.sh; ls /tmp"),
        ],
    )
    .await;
    let listed = f[1].1["event"]["data"]["stdout"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(!listed.is_empty(), "{f:?}");
    for suffix in ["", ".rel", ".proc", ".sh"] {
        assert!(
            !std::path::Path::new(&format!("/tmp/{marker}{suffix}")).exists(),
            "/tmp/{marker}{suffix} appeared on the host"
        );
    }
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
