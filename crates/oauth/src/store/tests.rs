//! The store's own promises: codes work once, secrets are kept hashed, and what callers can
//! make (self-registered clients, grants per key) is bounded.

use super::*;

#[test]
fn codes_work_once_and_secrets_are_stored_hashed() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let (client, secret) = store
        .add_client(
            "dynamic",
            "App",
            &["https://app.example/cb".into()],
            "client_secret_basic",
        )
        .unwrap();
    let secret = secret.unwrap();
    let code = store
        .grant_code(
            &client.client_id,
            "App",
            "team",
            "key_1",
            "sandboxes",
            "http://h/mcp",
            "https://app.example/cb",
            "c",
            None,
        )
        .unwrap();
    let first = store.take_code(&code).unwrap().unwrap();
    assert!(!first.used && !first.expired);
    assert!(store.take_code(&code).unwrap().unwrap().used);
    let (access, refresh) = store
        .issue(&first.grant.id, "sandboxes", 60_000, 60_000)
        .unwrap();
    assert_eq!(
        store
            .token(&access, "access", false)
            .unwrap()
            .unwrap()
            .grant
            .tenant,
        "team"
    );
    assert!(store.token(&access, "refresh", true).unwrap().is_none());
    assert!(
        !store
            .token(&refresh, "refresh", true)
            .unwrap()
            .unwrap()
            .used
    );
    assert!(
        store
            .token(&refresh, "refresh", true)
            .unwrap()
            .unwrap()
            .used
    );
    let file = std::fs::read(dir.path().join("oauth.db")).unwrap();
    let text = String::from_utf8_lossy(&file);
    for s in [&secret, &code, &access, &refresh] {
        assert!(!text.contains(s.as_str()));
    }
    assert!(store.revoke_grant(&first.grant.id, "test").unwrap());
    assert!(store.token(&access, "access", false).unwrap().is_none());
}

#[test]
fn self_registration_and_grants_per_key_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let uris = ["https://app.example/cb".to_string()];
    for _ in 0..MAX_DYNAMIC_CLIENTS {
        store.add_client("dynamic", "c", &uris, "none").unwrap();
    }
    let e = store.add_client("dynamic", "c", &uris, "none").unwrap_err();
    assert!(e.contains("too many registered clients"), "{e}");
    // The operator's own registrations are not counted against strangers'.
    let (client, _) = store
        .add_client("registered", "ops", &uris, "none")
        .unwrap();
    for _ in 0..MAX_GRANTS_PER_KEY + 5 {
        store
            .grant_code(
                &client.client_id,
                "ops",
                "t",
                "key_1",
                "sandboxes",
                "r",
                &uris[0],
                "c",
                None,
            )
            .unwrap();
    }
    let active = store
        .grants()
        .unwrap()
        .into_iter()
        .filter(|g| g.key_id == "key_1" && g.revoked_at.is_none())
        .count();
    assert_eq!(
        active as i64, MAX_GRANTS_PER_KEY,
        "the oldest grants made room"
    );
}
