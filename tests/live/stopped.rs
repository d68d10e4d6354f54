//! What runs while CRIU's code is inside a dumped process: nothing else of the sandbox.

use std::time::Duration;

use serde_json::json;

use super::{background, live_engine};
use crate::common::{create, ok, sh};
use crate::require_sandboxes;

/// A job to dump: 64 MB held (a dump long enough to be seen), its pid where the watcher reads it.
const TARGET: &str = "exec python3 -c 'import os, time\nbig = b\"x\" * (64 << 20)\nopen(\"/tmp/target.pid\", \"w\").write(str(os.getpid()))\ntime.sleep(3600)'";

/// A daemon outside every job (so no dump stops it but the engine's own stop): it reads the
/// target's size in memory again and again (`/proc/PID/stat`, which needs no ptrace access: each
/// command is a Landlock domain of its own, and its maps are out of reach), keeps every size other
/// than the first (the target sleeps: only CRIU's parasite, mapped in while it is inside, changes
/// it), and counts its reads.
const WATCHER: &str = "setsid python3 -c 'import os, time
while not os.path.exists(\"/tmp/target.pid\"):
    time.sleep(0.01)
pid = open(\"/tmp/target.pid\").read()
def size():
    return int(open(f\"/proc/{pid}/stat\").read().rsplit(\")\", 1)[1].split()[20])
first, n = size(), 0
while True:
    now = size()
    n += 1
    if now != first:
        open(\"/tmp/saw\", \"a\").write(f\"{now - first} bytes more\\n\")
    if n % 50 == 0:
        open(\"/tmp/reads.new\", \"w\").write(str(n))
        os.rename(\"/tmp/reads.new\", \"/tmp/reads\")
' > /tmp/watcher.log 2>&1 < /dev/null &";

/// The sandbox's other processes are stopped once CRIU has frozen the tree and before its
/// parasite enters it, and stay so until it has left: a process outside every tree that reads
/// the dumped process's size without pause never sees the parasite's mapping in it, though it
/// runs before and after each fork.
#[tokio::test]
async fn nothing_else_in_the_sandbox_runs_while_criu_is_inside_a_dumped_process() {
    require_sandboxes!();
    let Some((_engine, client)) = live_engine().await else {
        return;
    };
    let id = create(&client).await;
    background(&client, &id, TARGET).await;
    sh(&client, &id, WATCHER).await;
    let reads = async || -> u64 {
        let read = "for i in $(seq 1000); do [ -f /tmp/reads ] && break; sleep 0.02; done; cat /tmp/reads /tmp/watcher.log";
        let out = sh(&client, &id, read).await;
        out.trim()
            .parse()
            .unwrap_or_else(|_| panic!("the watcher: {out}"))
    };
    for round in 1..=3 {
        let before = reads().await;
        let forked = ok(
            &client,
            "sandbox_fork",
            json!({"sandbox_id": id, "memory": true}),
        )
        .await;
        assert_eq!(
            forked["memory"]["carried"],
            json!(["job job_1"]),
            "{forked}"
        );
        assert!(
            forked["memory"]["skipped"]
                .to_string()
                .contains("1 process(es) outside every job"),
            "{forked}"
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while reads().await <= before + 100 {
            assert!(
                std::time::Instant::now() < deadline,
                "the watcher does not run on after fork {round}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let saw = sh(&client, &id, "cat /tmp/saw 2>/dev/null; true").await;
        assert_eq!(
            saw, "",
            "fork {round}: a process ran beside CRIU's parasite"
        );
    }
}
