//! The state database: records, their columns, and data dirs from before each column.

use super::*;

fn record(id: &str, slot: u32) -> Record {
    Record {
        id: id.into(),
        name: Some("n".into()),
        template: "base".into(),
        status: Status::Creating,
        metadata: [("k".to_string(), "v".to_string())].into(),
        env: vec![("A".into(), "1".into())],
        shape: Shape {
            vcpus: 1.0,
            memory_mb: 512,
            disk_mb: 1024,
            max_pids: 100,
        },
        uid_slot: slot,
        created_at: 1,
        last_active_at: 1,
        expires_at: None,
        tenant: None,
        network: NetworkRules {
            allow_out: vec!["pypi.org".into()],
            deny_out: vec!["0.0.0.0/0".into()],
        },
        secrets: [(
            "API_KEY".to_string(),
            Binding {
                secret: "api".into(),
                standin: "sbxsecret_x".into(),
                hosts: vec!["api.example.test".into()],
            },
        )]
        .into(),
        desktop: Some(sandbox_mcp_protocol::Screen {
            width: 1024,
            height: 768,
        }),
        volumes: vec![sandbox_mcp_model::record::Mounted {
            name: "data".into(),
            path: "/data".into(),
            read_only: true,
            source: sandbox_mcp_model::record::MountSource::Volume {
                key: "data.00".into(),
            },
        }],
        on_timeout: OnTimeout::Stop,
    }
}

#[test]
fn records_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    {
        let store = Store::open(&path).unwrap();
        store.insert(&record("sbx_a", 1)).unwrap();
        store.set_status("sbx_a", Status::Running).unwrap();
        store.insert(&record("sbx_b", 2)).unwrap();
        assert!(
            store.insert(&record("sbx_c", 2)).is_err(),
            "uid slots are unique"
        );
        store.delete("sbx_b").unwrap();
    }
    let store = Store::open(&path).unwrap();
    let all = store.all().unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].status, Status::Running);
    assert_eq!(all[0].env, vec![("A".to_string(), "1".to_string())]);
    assert_eq!(all[0].network, record("x", 9).network);
}

#[test]
fn a_batch_is_stored_whole_or_not_at_all() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("state.db")).unwrap();
    // The second record takes the first's uid slot: the batch fails, and nothing of it stays.
    assert!(
        store
            .insert_all(&[record("sbx_1", 1), record("sbx_2", 1)])
            .is_err()
    );
    assert!(store.all().unwrap().is_empty());
    store
        .insert_all(&[record("sbx_1", 1), record("sbx_2", 2)])
        .unwrap();
    store
        .set_status_all(&["sbx_1", "sbx_2"], Status::Running)
        .unwrap();
    let all = store.all().unwrap();
    assert_eq!(all.len(), 2);
    assert!(all.iter().all(|r| r.status == Status::Running));
}

#[test]
fn an_update_replaces_only_what_it_gives() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("state.db")).unwrap();
    let original = record("sbx_u", 1);
    store.insert(&original).unwrap();
    let labels: BTreeMap<String, String> = [("p".to_string(), "x".to_string())].into();
    store.update("sbx_u", Some(&labels), None).unwrap();
    let r = store.get("sbx_u").unwrap().unwrap();
    assert_eq!((&r.metadata, &r.network), (&labels, &original.network));
    store
        .update("sbx_u", None, Some(&NetworkRules::default()))
        .unwrap();
    let r = store.get("sbx_u").unwrap().unwrap();
    assert_eq!(
        (&r.metadata, &r.network),
        (&labels, &NetworkRules::default())
    );
}

#[test]
fn a_data_dir_from_before_networks_gains_the_column() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    {
        let c = Connection::open(&path).unwrap();
        let old = SCHEMA
            .replace(",\n    network TEXT NOT NULL DEFAULT '{}'", "")
            .replace(",\n    secrets TEXT NOT NULL DEFAULT '{}'", "");
        c.execute_batch(&old).unwrap();
        for column in ["network", "secrets"] {
            let cols: i64 = c
                .query_row(
                    "SELECT count(*) FROM pragma_table_info('sandboxes') WHERE name = ?1",
                    [column],
                    |r| r.get(0),
                )
                .unwrap();
            assert_eq!(cols, 0, "the old schema has no {column} column");
        }
        // A sandbox from then: its timeout killed it, as it still does.
        c.execute_batch(
            "INSERT INTO sandboxes (id, template, status, metadata, env, vcpus, memory_mb,
             disk_mb, max_pids, uid_slot, created_at, last_active_at, expires_at)
             VALUES ('sbx_then', 'base', 'running', '{}', '[]', 1, 512, 1024, 64, 9, 1, 1, 5)",
        )
        .unwrap();
    }
    let store = Store::open(&path).unwrap();
    let then = store.get("sbx_then").unwrap().unwrap();
    assert_eq!(
        (then.expires_at, then.on_timeout),
        (Some(5), OnTimeout::Kill)
    );
    let mut r = record("sbx_old", 3);
    r.network = NetworkRules::default();
    r.secrets = BTreeMap::new();
    store.insert(&r).unwrap();
    let back = store.get("sbx_old").unwrap().unwrap();
    assert_eq!(back.network, NetworkRules::default());
    assert!(back.secrets.is_empty());
    assert_eq!(back.on_timeout, OnTimeout::Stop);
}
