//! Containment: hostile and careless code inside a sandbox, each case shown contained: the engine
//! stays up, other sandboxes and the host are unaffected. Many cases reproduce a finding of the
//! hardening review, from inside a sandbox or from a hijacked agent's socket. Tests that exhaust a
//! resource give back what they take: their sandboxes are killed at the end.
//!
//! By theme: [`escapes`] (the host and other sandboxes out of sight and reach), [`agent`] (the
//! agent out of reach of the code it runs), [`identity`] (what
//! identifies the machine), [`kernel_budgets`] (per-user kernel budgets are per
//! sandbox), [`uid_ranges`] (host-wide), [`runaway`] (fork, memory and disk bombs, processes that
//! will not die), [`floods`] (nothing from inside is buffered without a bound), [`paths`] (path
//! tricks and bad input to the file and exec tools), [`deep_trees`], [`special_files`] and
//! [`store_mounts`] (the sandbox store's mount across crashes).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::{McpClient, TestEngine, exec, ok};

/// Runs Python in the sandbox; its stdout.
async fn py(client: &McpClient, id: &str, code: &str) -> String {
    let r = exec(client, id, &format!("python3 - <<'EOF'\n{code}\nEOF")).await;
    assert_eq!(r["exit_code"], 0, "{r}");
    r["stdout"].as_str().unwrap().to_string()
}

/// Starts `code` as a background Python job that writes what it holds to /tmp/held and then
/// keeps holding it; waits for that report.
async fn hold(client: &McpClient, id: &str, code: &str) -> String {
    ok(
        client,
        "sandbox_files_write",
        json!({"sandbox_id": id, "path": "/root/hold.py", "content": code}),
    )
    .await;
    ok(
        client,
        "sandbox_exec",
        json!({"sandbox_id": id, "command": "python3 /root/hold.py", "background": true}),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = exec(client, id, "cat /tmp/held 2>/dev/null").await;
        let out = r["stdout"].as_str().unwrap_or("").to_string();
        if !out.is_empty() {
            return out;
        }
        assert!(Instant::now() < deadline, "the holder never reported");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn sandbox_dir(engine: &TestEngine, id: &str) -> PathBuf {
    engine.data_dir().join("sandboxes").join(id)
}

fn proc_field(pid: i32, file: &str, key: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/{file}"))
        .unwrap()
        .lines()
        .find(|l| l.starts_with(key))
        .unwrap_or_default()
        .to_string()
}

/// Per-user kernel budgets can only be told apart by host ids, which exist only as root.
macro_rules! require_own_ids {
    () => {
        $crate::require_cgroups!();
        if !nix::unistd::geteuid().is_root() {
            eprintln!(
                "SKIPPED {}: needs root (per-sandbox host ids)",
                module_path!()
            );
            return;
        }
    };
}

// After the macro, which some of them use.
mod agent;
mod deep_trees;
mod engine_files;
mod escapes;
mod floods;
mod identity;
mod kernel_budgets;
mod paths;
mod runaway;
mod special_files;
mod store_mounts;
mod uid_ranges;
