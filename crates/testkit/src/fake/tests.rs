//! The fake on its own, as a driver's caller sees it: the protocol its agents speak, what its
//! knobs do to them, and what its storage copies.

use std::time::Duration;

use sandbox_mcp_model::driver::{
    CloneKind, DriverError, FsRef, Isolation, Liveness, Shape, StartSpec, Storage, TemplateLayout,
};
use sandbox_mcp_protocol::{
    ExchangeError, ExecOutcome, ExecSpec, Frame, Ping, ReadFile, Request, Stream, WriteFile,
    exchange, read_frame, write_frame,
};

use super::FakeDriver;

fn spec(id: &str) -> StartSpec {
    StartSpec {
        id: id.into(),
        uid_slot: 0,
        shape: Shape {
            vcpus: 1.0,
            memory_mb: 256,
            disk_mb: 256,
            max_pids: 64,
        },
        template: TemplateLayout {
            name: "base".into(),
            mounts: Vec::new(),
        },
        env: vec![("WHO".into(), "fake".into())],
        workdir: None,
        user: None,
        volumes: Vec::new(),
        record: sandbox_mcp_model::Record {
            id: id.into(),
            name: None,
            template: "base".into(),
            status: sandbox_mcp_model::Status::Creating,
            metadata: Default::default(),
            env: Vec::new(),
            shape: Shape {
                vcpus: 1.0,
                memory_mb: 256,
                disk_mb: 256,
                max_pids: 64,
            },
            uid_slot: 0,
            created_at: 0,
            last_active_at: 0,
            expires_at: None,
            tenant: None,
            network: Default::default(),
            secrets: Default::default(),
            desktop: None,
            volumes: Vec::new(),
            on_timeout: Default::default(),
        },
        same_boot: false,
    }
}

fn exec(command: &str, stream: bool) -> ExecSpec {
    ExecSpec {
        command: command.into(),
        cwd: None,
        env: vec![("EXTRA".into(), "1".into())],
        timeout_ms: 5_000,
        max_output_bytes: 1024,
        stream,
    }
}

async fn started(id: &str) -> (tempfile::TempDir, FakeDriver) {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeDriver::new(dir.path()).unwrap();
    fake.start(&spec(id)).await.unwrap();
    (dir, fake)
}

async fn run(fake: &FakeDriver, id: &str, command: &str) -> ExecOutcome {
    let mut conn = fake.connect(id).await.unwrap();
    exchange(&mut conn, exec(command, false))
        .await
        .unwrap()
        .unwrap()
}

#[tokio::test]
async fn the_agent_speaks_the_protocol_on_the_sandbox_s_files() {
    let (_dir, fake) = started("a").await;
    let mut conn = fake.connect("a").await.unwrap();
    let pong = exchange(&mut conn, Ping {}).await.unwrap().unwrap();
    assert_eq!(pong.version, "fake-1");

    let out = run(
        &fake,
        "a",
        "printenv WHO; printenv EXTRA; echo x > f; cat /root/f",
    )
    .await;
    assert_eq!(
        (out.exit_code, out.stdout.as_str()),
        (Some(0), "fake\n1\nx\n")
    );
    assert_eq!(
        std::fs::read(fake.files_of("a").join("root/f")).unwrap(),
        b"x\n"
    );
    let out = run(&fake, "a", "nope || exit 4").await;
    assert_eq!(out.exit_code, Some(4));
    assert!(out.stderr.contains("nope: not found"), "{out:?}");

    let mut conn = fake.connect("a").await.unwrap();
    let write = WriteFile {
        path: "../etc/../tmp/g".into(),
        data_b64: "aGk=".into(),
        owner: None,
        metadata: Default::default(),
    };
    let written = exchange(&mut conn, write).await.unwrap().unwrap();
    assert_eq!(written.path, "/tmp/g");
    let mut conn = fake.connect("a").await.unwrap();
    let read = ReadFile {
        path: "/tmp/g".into(),
        max_bytes: 1,
    };
    let refused = exchange(&mut conn, read).await.unwrap().unwrap_err();
    assert!(refused.message.contains("at most 1"), "{refused:?}");
}

#[tokio::test]
async fn output_is_streamed_before_the_reply() {
    let (_dir, fake) = started("a").await;
    let mut conn = fake.connect("a").await.unwrap();
    let request: Request = exec("echo one; echo two >&2", true).into();
    write_frame(&mut conn, &request).await.unwrap();
    let mut frames = Vec::new();
    while let Some(frame) = read_frame::<_, Frame<ExecOutcome>>(&mut conn)
        .await
        .unwrap()
    {
        frames.push(frame);
    }
    assert!(
        matches!(&frames[0], Frame::Output(o) if o.stream == Stream::Stdout && o.data == "one\n")
    );
    assert!(
        matches!(&frames[1], Frame::Output(o) if o.stream == Stream::Stderr && o.data == "two\n")
    );
    assert!(matches!(&frames[2], Frame::Reply(r) if r.stdout == "one\n"));
}

#[tokio::test]
async fn knobs_hang_crash_oom_and_gone_do_what_they_say() {
    let (_dir, fake) = started("a").await;
    fake.oom_next_exec("a");
    let out = run(&fake, "a", "echo hi").await;
    assert_eq!((out.exit_code, out.signal), (None, Some(9)));
    assert_eq!(fake.usage("a").oom_kills, 1);

    // Hung: the connection is accepted, nothing comes back.
    fake.hang("a");
    let mut conn = fake.connect("a").await.unwrap();
    let waited = tokio::time::timeout(Duration::from_millis(200), exchange(&mut conn, Ping {}));
    assert!(waited.await.is_err(), "a hung agent answered");
    assert_eq!(fake.liveness("a").await, Liveness::Running);

    // Crashed mid-command: the connection closes; liveness says stopped, connecting is refused.
    fake.start(&spec("a")).await.unwrap();
    let mut conn = fake.connect("a").await.unwrap();
    let call = tokio::spawn(async move { exchange(&mut conn, exec("sleep 30", false)).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    fake.crash("a");
    assert!(matches!(call.await.unwrap(), Err(ExchangeError::Closed)));
    assert_eq!(fake.liveness("a").await, Liveness::Stopped);
    assert!(matches!(
        fake.connect("a").await,
        Err(DriverError::Agent(_))
    ));

    fake.gone("a", "deleted");
    assert_eq!(fake.liveness("a").await, Liveness::Gone);
    assert!(matches!(fake.connect("a").await, Err(DriverError::Gone(m)) if m == "deleted"));
    assert!(fake.sandbox_dirs().is_empty());
}

#[tokio::test]
async fn storage_copies_files_and_fails_the_clone_it_was_told_to() {
    let (_dir, fake) = started("a").await;
    run(&fake, "a", "mkdir -p d && echo 1 > d/f").await;
    let from = FsRef {
        name: "a".into(),
        slot: Some(0),
    };
    fake.clone_fs(&from, "snap", CloneKind::Snapshot).unwrap();
    fake.fail_clone_after(1);
    let child = CloneKind::Sandbox {
        limit_bytes: 1 << 20,
    };
    fake.clone_fs(&from, "b", child).unwrap();
    assert!(fake.clone_fs(&from, "c", child).is_err());
    fake.clone_fs(&from, "c", child).unwrap();
    assert_eq!(fake.sandbox_dirs(), ["a", "b", "c"]);
    assert_eq!(fake.snapshot_dirs(), ["snap"]);
    assert_eq!(
        std::fs::read(fake.files_of("c").join("root/d/f")).unwrap(),
        b"1\n"
    );

    run(&fake, "a", "echo 2 > d/f; touch new").await;
    let snap = FsRef {
        name: "snap".into(),
        slot: None,
    };
    fake.replace_fs("a", &snap, 1 << 20).unwrap();
    fake.start(&spec("a")).await.unwrap();
    assert_eq!(run(&fake, "a", "cat d/f; ls").await.stdout, "1\nd\n");
    assert_eq!(fake.disk_bytes("a"), 2);

    // Slots: claimed apart from what the engine holds, released, reconciled.
    let slots = fake.claim_slots(&[0, 1], 2).unwrap();
    assert_eq!(slots, [2, 3]);
    fake.release_slot(2);
    assert_eq!(fake.slots(), [3]);
    fake.reconcile_slots(&[7]);
    assert_eq!(fake.slots(), [7]);
}
