//! HTTP/2 upstreams get the value too.

use serde_json::{Value, json};

use crate::common::*;
use crate::require_sandboxes;
use crate::testnet::TestNet;

use super::{VALUE, engine_for, example_bound};

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
