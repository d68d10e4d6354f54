//! The store end to end: values sealed at rest and per tenant, bad secrets refused with what to
//! do, the headers a value may go in, and a key file others can read.

use rusqlite::Connection;

use super::*;

fn store() -> (tempfile::TempDir, SecretStore) {
    let dir = tempfile::tempdir().unwrap();
    let s = SecretStore::open(
        &dir.path().join("state.db"),
        &dir.path().join("secrets.key"),
    )
    .unwrap();
    (dir, s)
}

fn new(name: &str, hosts: &[&str]) -> NewSecret {
    NewSecret {
        name: name.into(),
        hosts: hosts.iter().map(|h| h.to_string()).collect(),
        ..NewSecret::default()
    }
}

#[test]
fn values_are_sealed_at_rest_and_per_tenant() {
    let (dir, s) = store();
    let value = b"sk-test-1234567890abcdef";
    s.set(None, &new("api", &["api.example.test"]), value)
        .unwrap();
    s.set(
        Some("t2"),
        &new("api", &["other.test"]),
        b"tenant-two-value",
    )
    .unwrap();
    let (meta, v) = s.open_value(None, "api").unwrap().unwrap();
    assert_eq!(v.as_bytes(), value);
    assert!(meta.allows("API.example.test."));
    assert!(!meta.allows("example.test"));
    assert_eq!(
        s.open_value(Some("t2"), "api")
            .unwrap()
            .unwrap()
            .1
            .as_bytes(),
        b"tenant-two-value"
    );
    assert!(s.open_value(Some("t3"), "api").unwrap().is_none());
    // Neither the database nor its WAL holds the value in clear.
    for f in ["state.db", "state.db-wal"] {
        if let Ok(bytes) = std::fs::read(dir.path().join(f)) {
            assert!(!bytes.windows(value.len()).any(|w| w == value), "{f}");
        }
    }
    // A sealed value moved to another row does not open.
    let conn = Connection::open(dir.path().join("state.db")).unwrap();
    conn.execute(
        "UPDATE secrets SET nonce = (SELECT nonce FROM secrets WHERE tenant = ''),
         sealed = (SELECT sealed FROM secrets WHERE tenant = '') WHERE tenant = 't2'",
        [],
    )
    .unwrap();
    assert!(s.open_value(Some("t2"), "api").is_err());
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(dir.path().join("secrets.key"))
            .unwrap()
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);
}

#[test]
fn bad_secrets_are_refused_with_what_to_do() {
    let (_dir, s) = store();
    let headers = |h: &[&str]| NewSecret {
        headers: h.iter().map(|h| h.to_string()).collect(),
        ..new("api", &["a.test"])
    };
    let cases: [(NewSecret, &[u8], &str); 16] = [
        (new("api", &[]), b"v", "no hosts"),
        (new("api", &["not a host"]), b"v", "not a host pattern"),
        (new("api", &["10.0.0.1"]), b"v", "not a host pattern"),
        (new("api key", &["a.test"]), b"v", "not a secret name"),
        (new("api", &["a.test"]), b"", "empty"),
        (new("api", &["a.test"]), &[b'x'; 1 << 20], "at most"),
        (new("api", &["a.test"]), b"line\n", "line break"),
        (
            NewSecret {
                format: Some("Bearer".into()),
                ..new("api", &["a.test"])
            },
            b"v",
            "{value}",
        ),
        // Headers servers echo back or route by never carry a value.
        (headers(&["Origin"]), b"v", "cannot carry a secret"),
        (headers(&["Referer"]), b"v", "cannot carry a secret"),
        (headers(&["host"]), b"v", "cannot carry a secret"),
        (
            headers(&["X-Forwarded-Host"]),
            b"v",
            "cannot carry a secret",
        ),
        (headers(&["Content-Type"]), b"v", "cannot carry a secret"),
        (
            headers(&["Authorization", "User-Agent"]),
            b"v",
            "cannot carry a secret",
        ),
        (headers(&["bad header"]), b"v", "not an HTTP header name"),
        (
            headers(&["a", "b", "c", "d", "e"]),
            b"v",
            "at most 4 headers",
        ),
    ];
    for (secret, value, says) in cases {
        let e = s.set(None, &secret, value).unwrap_err().to_string();
        assert!(e.contains(says), "{secret:?}: {e}");
    }
    assert!(s.list(None).unwrap().is_empty());
}

#[test]
fn a_value_goes_in_authorization_unless_its_operator_names_its_headers() {
    let (dir, s) = store();
    let meta = s.set(None, &new("a", &["a.test"]), b"v").unwrap();
    assert_eq!(meta.headers, vec!["Authorization"]);
    assert!(meta.allows_header("authorization") && !meta.allows_header("x-api-key"));
    let meta = s
        .set(
            None,
            &NewSecret {
                headers: vec!["X-Api-Key".into(), "Authorization".into()],
                ..new("b", &["a.test"])
            },
            b"v",
        )
        .unwrap();
    assert!(meta.allows_header("x-api-key") && meta.allows_header("AUTHORIZATION"));
    // Rows of older engines: one header name, or none (any header then; Authorization now).
    let conn = Connection::open(dir.path().join("state.db")).unwrap();
    conn.execute("UPDATE secrets SET header = 'X-Key' WHERE name = 'a'", [])
        .unwrap();
    conn.execute("UPDATE secrets SET header = NULL WHERE name = 'b'", [])
        .unwrap();
    assert_eq!(s.meta(None, "a").unwrap().unwrap().headers, vec!["X-Key"]);
    assert_eq!(
        s.meta(None, "b").unwrap().unwrap().headers,
        vec!["Authorization"]
    );
}

#[test]
fn a_key_readable_by_others_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("secrets.key");
    std::fs::write(&key, [7u8; 32]).unwrap();
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let e = SecretStore::open(&dir.path().join("state.db"), &key).unwrap_err();
    assert!(e.to_string().contains("chmod 600"), "{e}");
}
