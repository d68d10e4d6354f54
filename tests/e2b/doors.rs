//! What E2B's door must refuse, by raw HTTP: another tenant's sandboxes, another sandbox's (or
//! no) token, a killed sandbox, what has no meaning here, bad input; and that what comes in
//! through it stays inside the sandbox.

use reqwest::StatusCode;
use serde_json::{Value, json};

use super::E2bEngine;
use crate::require_sandboxes;

pub(super) const KEYS: &str = "key-alpha alpha\nkey-beta beta\n";

pub(super) fn http() -> reqwest::Client {
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

pub(super) async fn create(engine: &E2bEngine, key: &str) -> (String, String, String) {
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
pub(super) async fn envd(
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

pub(super) fn enveloped(v: &Value) -> Vec<u8> {
    let json = v.to_string().into_bytes();
    let mut out = vec![0];
    out.extend_from_slice(&(json.len() as u32).to_be_bytes());
    out.extend_from_slice(&json);
    out
}

/// The (flags, message) of each frame of a Connect stream.
pub(super) fn frames(mut body: &[u8]) -> Vec<(u8, Value)> {
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
    super::envd::start_as(engine, sandbox, token, None, cmd).await
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
    // A key bound to a tenant cannot name another with X-Sandbox-Tenant (only an unbound key may
    // narrow itself), at the door or on the engine's own API.
    for (base, get, list) in [
        (&engine.e2b, format!("/sandboxes/{id}"), "/v2/sandboxes"),
        (&engine.api, format!("/v1/sandboxes/{id}"), "/v1/sandboxes"),
    ] {
        let as_alpha = |path: &str| {
            http()
                .get(format!("{base}{path}"))
                .header("X-API-KEY", "key-beta")
                .bearer_auth("key-beta")
                .header("X-Sandbox-Tenant", "alpha")
                .send()
        };
        let r = as_alpha(&get).await.unwrap();
        assert_eq!(r.status(), 404, "{base}{get}");
        let r = as_alpha(list).await.unwrap();
        assert_eq!(r.status(), 200, "{base}{list}");
        let body: Value = r.json().await.unwrap();
        assert!(!body.to_string().contains(&id), "{base}{list}: {body}");
    }
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
    // Sent as a traffic token to envd's routes, it opens none of them, whatever port the request
    // claims: the port header is the client's to set.
    let as_traffic = [
        ("E2B-Traffic-Access-Token", traffic_a.as_str()),
        ("E2b-Sandbox-Port", "49999"),
    ];
    let body =
        enveloped(&json!({"process": {"cmd": "touch", "args": ["/tmp/ran"]}, "stdin": false}));
    let (status, bytes) = envd(
        &engine,
        &a,
        &as_traffic,
        "/process.Process/Start",
        "application/connect+json",
        body,
    )
    .await;
    let f = frames(&bytes);
    assert_eq!(status, 200);
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].1["error"]["code"], "unauthenticated", "{f:?}");
    for (method, path) in [
        (reqwest::Method::GET, "/files?path=/etc/hostname"),
        (reqwest::Method::POST, "/files?path=/tmp/ran"),
    ] {
        let mut r = http()
            .request(method.clone(), format!("{}{path}", engine.e2b))
            .header("E2b-Sandbox-Id", a.clone());
        for (k, v) in as_traffic {
            r = r.header(k, v);
        }
        let r = r.send().await.unwrap();
        assert_eq!(r.status(), 401, "{method} {path}");
    }
    assert_eq!(
        get(&token_a, &a).await.unwrap().status(),
        404,
        "still nothing ran"
    );
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

/// A create that names no timeout gets E2B's default (15 s), as E2B's API does; a refresh that
/// names no duration, the same from then.
#[tokio::test]
async fn a_create_or_refresh_without_a_timeout_gets_e2bs_default() {
    require_sandboxes!();
    let engine = E2bEngine::start(KEYS).await;
    let seconds = |v: &Value, field: &str| {
        chrono::DateTime::parse_from_rfc3339(v[field].as_str().unwrap())
            .unwrap()
            .timestamp_millis()
    };
    let (status, made) = control(
        &engine,
        "key-alpha",
        reqwest::Method::POST,
        "/sandboxes",
        Some(json!({"templateID": "base"})),
    )
    .await;
    assert_eq!(status, 201, "{made}");
    let id = made["sandboxID"].as_str().unwrap().to_string();
    let path = format!("/sandboxes/{id}");
    let (status, read) = control(&engine, "key-alpha", reqwest::Method::GET, &path, None).await;
    assert_eq!(status, 200, "{read}");
    assert_eq!(
        seconds(&read, "endAt") - seconds(&read, "startedAt"),
        15_000,
        "{read}"
    );
    let before = chrono::Utc::now().timestamp_millis();
    let (status, body) = control(
        &engine,
        "key-alpha",
        reqwest::Method::POST,
        &format!("{path}/refreshes"),
        Some(json!({})),
    )
    .await;
    assert_eq!(status, 204, "{body}");
    let (_, read) = control(&engine, "key-alpha", reqwest::Method::GET, &path, None).await;
    let left = seconds(&read, "endAt") - before;
    assert!((14_000..=16_000).contains(&left), "{read}");
    control(&engine, "key-alpha", reqwest::Method::DELETE, &path, None).await;
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
            json!({"templateID": "base", "autoPause": true, "autoResume": {"enabled": true}}),
            400,
            "autoResume",
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
    // An upload over the limit is answered before its body is read to its end: the answer
    // says `Connection: close`, so the SDK's pooled client never sends its next call on the
    // connection the door is closing. One whose body was read (a wrong token, found after)
    // keeps the connection.
    let addr = engine.e2b.trim_start_matches("http://");
    for (access, len, status, close) in [
        (token.as_str(), 9 << 20, 413, true),
        ("wrong", 4096, 401, false),
    ] {
        let head = format!(
            "POST /files?path=/tmp/big HTTP/1.1\r\nHost: {addr}\r\nE2b-Sandbox-Id: {id}\r\nX-Access-Token: {access}\r\nContent-Type: multipart/form-data; boundary=B\r\n"
        );
        let answer = crate::common::send_raw(addr, &head, len).await;
        assert_eq!(answer.status(), status, "{}", answer.head);
        assert_eq!(answer.says_close(), close, "{}", answer.head);
        assert_eq!(answer.closed, close, "{}", answer.head);
    }
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
