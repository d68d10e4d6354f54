//! Special files: no file operation blocks on a FIFO, a device or a socket, and a slow one does
//! not stall the agent's other calls.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::{TestEngine, call, create, err, ok, sh, text};
use crate::require_sandboxes;

/// `f`, which must finish within 20 s (a blocked agent never would).
async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .unwrap_or_else(|_| panic!("{what} blocked"))
}

#[tokio::test]
async fn special_files_never_block_a_file_tool() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let id = create(&client).await;
    sh(
        &client,
        &id,
        "mkfifo /root/fifo /root/fifo2 /dev/shm/fifo && echo a > /root/a && echo b > /root/b && \
         python3 -c \"import socket; socket.socket(socket.AF_UNIX).bind('/root/sock')\" && \
         mkdir -p /tmp/sandbox-mcp/jobs && mkfifo /tmp/sandbox-mcp/jobs/job_1.log && echo made",
    )
    .await;
    for path in ["fifo", "/dev/zero", "/dev/null", "sock", "/proc/self/fd/0"] {
        let r = within("files_read", async {
            let r = call(
                &client,
                "sandbox_files_read",
                json!({"sandbox_id": id, "path": path}),
            )
            .await;
            json!({"error": r.is_error, "text": text(&r)})
        })
        .await;
        assert_eq!(r["error"], true, "{path}: {r}");
        assert!(
            r["text"].as_str().unwrap().contains("not a regular file"),
            "{path}: {r}"
        );
    }
    // Writing or moving onto a FIFO replaces it; moving a FIFO across filesystems is refused.
    within(
        "files_write",
        ok(
            &client,
            "sandbox_files_write",
            json!({"sandbox_id": id, "path": "fifo", "content": "w"}),
        ),
    )
    .await;
    within(
        "files_move",
        ok(
            &client,
            "sandbox_files_move",
            json!({"sandbox_id": id, "from": "a", "to": "fifo2"}),
        ),
    )
    .await;
    within(
        "files_move",
        ok(
            &client,
            "sandbox_files_move",
            json!({"sandbox_id": id, "from": "b", "to": "/dev/shm/fifo"}),
        ),
    )
    .await;
    sh(&client, &id, "mkfifo /root/fifo3").await;
    let refused = within("files_move", async {
        json!(
            err(
                &client,
                "sandbox_files_move",
                json!({"sandbox_id": id, "from": "fifo3", "to": "/dev/shm/x"})
            )
            .await
        )
    })
    .await;
    assert!(
        refused.as_str().unwrap().contains("not a regular file"),
        "{refused}"
    );
    assert_eq!(
        sh(&client, &id, "cat /root/fifo /root/fifo2 /dev/shm/fifo").await,
        "wa\nb\n"
    );
    let zip = within(
        "download_dir",
        ok(
            &client,
            "sandbox_files_download_dir",
            json!({"sandbox_id": id, "path": "/root"}),
        ),
    )
    .await;
    let skipped = zip["skipped"].to_string();
    assert!(
        skipped.contains("fifo3") && skipped.contains("sock"),
        "{zip}"
    );
    within(
        "files_list",
        ok(
            &client,
            "sandbox_files_list",
            json!({"sandbox_id": id, "path": "/root"}),
        ),
    )
    .await;
    within(
        "files_delete",
        ok(
            &client,
            "sandbox_files_delete",
            json!({"sandbox_id": id, "path": "fifo3"}),
        ),
    )
    .await;
    // The agent's own job log was a planted FIFO: it is replaced, and the job works.
    let job = ok(
        &client,
        "sandbox_exec",
        json!({"sandbox_id": id, "command": "echo from-the-job", "background": true}),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let status = within(
        "job_status",
        ok(
            &client,
            "sandbox_job_status",
            json!({"sandbox_id": id, "job_id": job["job_id"]}),
        ),
    )
    .await;
    assert_eq!(status["output"], "from-the-job\n", "{status}");
    assert_eq!(
        sh(&client, &id, "echo still-serving").await,
        "still-serving\n"
    );
}

#[tokio::test]
async fn a_slow_file_operation_does_not_hold_up_other_calls() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let id = create(&client).await;
    // Incompressible data to zip: the zip takes a while, and runs on a file thread.
    sh(
        &client,
        &id,
        "mkdir /root/big && for i in 1 2 3 4 5 6 7 8; do head -c 1000000 /dev/urandom > /root/big/$i; done",
    )
    .await;
    let zip = async {
        let r = ok(
            &client,
            "sandbox_files_download_dir",
            json!({"sandbox_id": id, "path": "/root/big"}),
        )
        .await;
        (Instant::now(), r["files"].clone())
    };
    let execs = async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        for _ in 0..5 {
            assert_eq!(sh(&client, &id, "echo quick").await, "quick\n");
        }
        Instant::now()
    };
    let ((zip_done, files), execs_done) = tokio::join!(zip, execs);
    assert_eq!(files, 8);
    assert!(
        execs_done < zip_done,
        "five quick execs waited for the zip to finish"
    );
}
