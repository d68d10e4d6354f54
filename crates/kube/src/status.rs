//! Why a sandbox pod cannot start, or why it ended, in words for the caller: which container (the
//! init container that copies the agent in, or the sandbox container the agent runs in), how it
//! ended (exit code, signal, reason, message) or what it waits on, and what to check. Pure
//! functions of the pod, unit-tested on the statuses a cluster reports.
//!
//! A pod whose start failed is deleted at once, so the error (and the namespace's events, which it
//! points to) is what anyone gets to see of it: the containers' termination message falls back to
//! their last log lines (`terminationMessagePolicy: FallbackToLogsOnError`, set by
//! [`super::pod::build`]), which is where the agent, or the runtime failing to start it, says why.
//! The cluster's text is untrusted (a sandbox writes the log it comes from): it is cut and
//! stripped of control characters before a caller sees it.

use k8s_openapi::api::core::v1::{
    ContainerStateTerminated, ContainerStateWaiting, ContainerStatus, Pod, PodStatus,
};

use super::pod::{CONTAINER, INIT_CONTAINER};

/// Most bytes of a message from the cluster kept in an error (the kubelet keeps 2 KiB of a log).
const MAX_MESSAGE: usize = 2048;
/// Most bytes of a reason or a container name (short words, when the cluster writes them).
const MAX_WORD: usize = 128;

/// Container waiting reasons that will not resolve by waiting.
const STUCK: [&str; 8] = [
    "ErrImagePull",
    "ImagePullBackOff",
    "ErrImageNeverPull",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
    "CrashLoopBackOff",
];

/// The waiting reasons of an image that cannot be had.
const IMAGE_REASONS: [&str; 4] = [
    "ErrImagePull",
    "ImagePullBackOff",
    "ErrImageNeverPull",
    "InvalidImageName",
];

/// What went wrong with a pod, as its status says.
#[derive(Debug)]
enum Fault {
    /// The kubelet ended the pod at its `activeDeadlineSeconds`.
    Deadline,
    /// The node evicted it; the kubelet's message.
    Evicted(String),
    /// A container ended, or waits on something waiting will not fix.
    Container {
        name: String,
        /// "exited with code 1 (Error): …", "is waiting (ErrImagePull): …".
        what: String,
        waiting: Option<String>,
        oom: bool,
    },
    /// It ended, nothing says why: its phase, and the pod's reason and message if any.
    Ended(String),
}

/// Why the pod will not run, if it will not: it ended, one of its containers ended before the
/// sandbox was up, or one waits on something waiting will not fix. `None`: it may still run.
pub fn start_failure(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    let (detail, hint) = match fault(status)? {
        Fault::Deadline => (
            "its timeout passed before it ran".to_string(),
            "give it a longer timeout_seconds",
        ),
        Fault::Evicted(message) => (
            format!("the node evicted it{}", colon(&message)),
            "the node is short of resources; retry, or ask for a smaller shape",
        ),
        Fault::Container {
            name,
            what,
            waiting,
            oom,
        } => {
            let hint = match (name.as_str(), waiting.as_deref()) {
                _ if oom => "it ran out of memory: ask for a larger memory_mb",
                (INIT_CONTAINER, Some(_)) => "check --agent-image and --image-pull-policy",
                (INIT_CONTAINER, None) => {
                    "--agent-image must hold a static sandbox-mcp at /sandbox-mcp (cargo build-static builds it)"
                }
                (_, Some(r)) if IMAGE_REASONS.contains(&r) => {
                    "check the template's image (--default-image, or --template-image NAME=IMAGE) and --image-pull-policy"
                }
                _ => {
                    "the agent from --agent-image must be a static sandbox-mcp (cargo build-static builds it) that the template's image lets run"
                }
            };
            (format!("its {} {what}", role(&name)), hint)
        }
        // The events may say more.
        Fault::Ended(what) => (format!("it ended ({what})"), ""),
    };
    let events = match (&pod.metadata.namespace, &pod.metadata.name) {
        (Some(ns), Some(name)) => format!(
            "its events: kubectl get events -n {} --field-selector involvedObject.name={}",
            clean(ns, MAX_WORD),
            clean(name, MAX_WORD)
        ),
        _ => String::new(),
    };
    let parts: Vec<&str> = [detail.as_str(), hint, &events]
        .into_iter()
        .filter(|p| !p.is_empty())
        .collect();
    Some(format!(
        "the sandbox's pod cannot start: {}",
        parts.join("; ")
    ))
}

/// Why the sandbox `id` of a pod that ended (phase `Failed` or `Succeeded`) is gone. Ends with
/// what to do, "create a new sandbox" (the tools add with which tool).
pub fn gone(pod: &Pod, id: &str) -> String {
    let fault = pod.status.as_ref().and_then(fault);
    let why = match fault {
        Some(Fault::Deadline) => "its timeout passed (the kubelet ended the pod)".to_string(),
        Some(Fault::Evicted(message)) => format!(
            "the node evicted its pod (the node ran short of resources){}",
            colon(&message)
        ),
        Some(Fault::Container {
            name,
            what,
            oom: true,
            ..
        }) => format!(
            "its {} {what}: its agent ran out of memory (raise memory_mb)",
            role(&name)
        ),
        Some(Fault::Container { name, what, .. }) => format!("its {} {what}", role(&name)),
        Some(Fault::Ended(what)) => format!("its pod ended ({what})"),
        None => "its pod ended".to_string(),
    };
    format!("sandbox {id} is gone: {why}; create a new sandbox")
}

/// The pod's fault: a deadline or an eviction first (they explain their containers' ends), then
/// the first container in trouble, init containers first; for a pod that ended with none, its
/// phase and reason. `None` while nothing is wrong.
fn fault(status: &PodStatus) -> Option<Fault> {
    let reason = status.reason.as_deref();
    match reason {
        Some("DeadlineExceeded") => return Some(Fault::Deadline),
        Some("Evicted") => {
            return Some(Fault::Evicted(clean(
                status.message.as_deref().unwrap_or(""),
                MAX_MESSAGE,
            )));
        }
        _ => {}
    }
    let init = status.init_container_statuses.iter().flatten();
    let main = status.container_statuses.iter().flatten();
    if let Some(found) = init
        .map(|c| (c, true))
        .chain(main.map(|c| (c, false)))
        .find_map(|(c, init)| container(c, init))
    {
        return Some(found);
    }
    let phase = status.phase.as_deref().unwrap_or("Pending");
    if phase != "Failed" && phase != "Succeeded" {
        return None;
    }
    let mut what = clean(phase, MAX_WORD);
    if let Some(r) = reason {
        what = format!("{what}, {}", clean(r, MAX_WORD));
    }
    if let Some(m) = status.message.as_deref().filter(|m| !m.trim().is_empty()) {
        what = format!("{what}: {}", clean(m, MAX_MESSAGE));
    }
    Some(Fault::Ended(what))
}

/// A container's trouble, if it has one: it ended (an init container only when it failed: ending
/// is its job), or waits on a reason in [`STUCK`].
fn container(c: &ContainerStatus, init: bool) -> Option<Fault> {
    let state = c.state.as_ref()?;
    let name = clean(&c.name, MAX_WORD);
    if let Some(t) = &state.terminated {
        if init && t.exit_code == 0 {
            return None;
        }
        return Some(Fault::Container {
            what: terminated(t),
            oom: t.reason.as_deref() == Some("OOMKilled"),
            waiting: None,
            name,
        });
    }
    let w = state.waiting.as_ref()?;
    let reason = w.reason.as_deref().filter(|r| STUCK.contains(r))?;
    Some(Fault::Container {
        what: waiting(w),
        oom: false,
        waiting: Some(reason.to_string()),
        name,
    })
}

/// "exited with code 139 (SIGSEGV, Error): …" or "was killed by signal 9 (SIGKILL, OOMKilled)".
fn terminated(t: &ContainerStateTerminated) -> String {
    let reason = t.reason.as_deref().map(|r| clean(r, MAX_WORD));
    let (verb, signal) = match t.signal {
        Some(s) => (format!("was killed by signal {s}"), signal_name(s)),
        // A process that a signal ended exits with 128 + its number, as the runtime reports it.
        None => (
            format!("exited with code {}", t.exit_code),
            (t.exit_code > 128)
                .then(|| signal_name(t.exit_code - 128))
                .flatten(),
        ),
    };
    let notes: Vec<&str> = signal.into_iter().chain(reason.as_deref()).collect();
    let notes = if notes.is_empty() {
        String::new()
    } else {
        format!(" ({})", notes.join(", "))
    };
    format!(
        "{verb}{notes}{}",
        colon(&clean(t.message.as_deref().unwrap_or(""), MAX_MESSAGE))
    )
}

/// "is waiting (ErrImageNeverPull): …".
fn waiting(w: &ContainerStateWaiting) -> String {
    format!(
        "is waiting ({}){}",
        clean(w.reason.as_deref().unwrap_or(""), MAX_WORD),
        colon(&clean(w.message.as_deref().unwrap_or(""), MAX_MESSAGE))
    )
}

fn signal_name(n: i32) -> Option<&'static str> {
    nix::sys::signal::Signal::try_from(n)
        .ok()
        .map(|s| s.as_str())
}

/// Which container, in words.
fn role(name: &str) -> String {
    match name {
        INIT_CONTAINER => {
            format!("init container {name} (which copies sandbox-mcp from --agent-image)")
        }
        CONTAINER => format!("container {name} (which runs the agent in the template's image)"),
        other => format!("container {other}"),
    }
}

/// ": text", or nothing for no text.
fn colon(text: &str) -> String {
    if text.is_empty() {
        String::new()
    } else {
        format!(": {text}")
    }
}

/// Untrusted text made safe to show: control and invisible formatting characters (bidi
/// overrides, zero-width ones) read as spaces, each run of white space as one space, and it is cut
/// at `max` bytes (at a character boundary, marked with `…`).
fn clean(text: &str, max: usize) -> String {
    let mut out = String::new();
    let mut gap = false;
    for c in text.chars() {
        if c.is_whitespace() || c.is_control() || invisible(c) {
            gap = !out.is_empty();
            continue;
        }
        let needed = c.len_utf8() + usize::from(gap);
        if out.len() + needed > max {
            out.push('…');
            return out;
        }
        if gap {
            out.push(' ');
            gap = false;
        }
        out.push(c);
    }
    out
}

/// Formatting characters that change how text around them reads, or hide in it.
fn invisible(c: char) -> bool {
    matches!(c, '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2060}'..='\u{2069}' | '\u{FEFF}')
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use k8s_openapi::api::core::v1::ContainerState;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn pod(status: Option<PodStatus>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("sbx-abc".into()),
                namespace: Some("sandboxes".into()),
                ..Default::default()
            },
            spec: None,
            status,
        }
    }

    fn ended(name: &str, t: ContainerStateTerminated) -> ContainerStatus {
        ContainerStatus {
            name: name.into(),
            state: Some(ContainerState {
                terminated: Some(t),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn waits(name: &str, reason: &str, message: &str) -> ContainerStatus {
        ContainerStatus {
            name: name.into(),
            state: Some(ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some(reason.into()),
                    message: Some(message.into()),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn failed(
        init: Vec<ContainerStatus>,
        main: Vec<ContainerStatus>,
        phase: &str,
    ) -> Option<PodStatus> {
        Some(PodStatus {
            phase: Some(phase.into()),
            init_container_statuses: Some(init),
            container_statuses: Some(main),
            ..Default::default()
        })
    }

    #[test]
    fn a_failed_init_container_is_named_with_its_exit_code_and_message() {
        let status = failed(
            vec![ended(
                INIT_CONTAINER,
                ContainerStateTerminated {
                    exit_code: 127,
                    reason: Some("Error".into()),
                    message: Some("sandbox-mcp: applet not found\n".into()),
                    ..Default::default()
                },
            )],
            vec![waits(CONTAINER, "PodInitializing", "")],
            "Failed",
        );
        let message = start_failure(&pod(status)).unwrap();
        assert_eq!(
            message,
            "the sandbox's pod cannot start: its init container agent (which copies sandbox-mcp \
             from --agent-image) exited with code 127 (Error): sandbox-mcp: applet not found; \
             --agent-image must hold a static sandbox-mcp at /sandbox-mcp (cargo build-static \
             builds it); its events: kubectl get events -n sandboxes --field-selector \
             involvedObject.name=sbx-abc"
        );
    }

    #[test]
    fn an_init_container_that_did_its_job_is_no_fault() {
        let done = ended(
            INIT_CONTAINER,
            ContainerStateTerminated {
                exit_code: 0,
                reason: Some("Completed".into()),
                ..Default::default()
            },
        );
        let running = ContainerStatus {
            name: CONTAINER.into(),
            state: Some(ContainerState {
                running: Some(Default::default()),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            start_failure(&pod(failed(vec![done], vec![running], "Running"))),
            None
        );
    }

    #[test]
    fn a_crash_names_its_signal_from_the_exit_code_or_the_signal_field() {
        let crashed =
            |t| start_failure(&pod(failed(vec![], vec![ended(CONTAINER, t)], "Failed"))).unwrap();
        let message = crashed(ContainerStateTerminated {
            exit_code: 139,
            reason: Some("Error".into()),
            ..Default::default()
        });
        assert!(
            message.contains(
                "its container sandbox (which runs the agent in the template's image) exited with code 139 (SIGSEGV, Error);"
            ),
            "{message}"
        );
        assert!(message.contains("static sandbox-mcp"), "{message}");
        let message = crashed(ContainerStateTerminated {
            exit_code: 0,
            signal: Some(6),
            ..Default::default()
        });
        assert!(
            message.contains("was killed by signal 6 (SIGABRT);"),
            "{message}"
        );
        // No signal past 128 + the last one, no reason: just the code.
        let message = crashed(ContainerStateTerminated {
            exit_code: 255,
            ..Default::default()
        });
        assert!(message.contains("exited with code 255;"), "{message}");
    }

    #[test]
    fn an_oom_kill_says_to_raise_memory() {
        let status = failed(
            vec![],
            vec![ended(
                CONTAINER,
                ContainerStateTerminated {
                    exit_code: 137,
                    reason: Some("OOMKilled".into()),
                    ..Default::default()
                },
            )],
            "Failed",
        );
        let p = pod(status);
        assert_eq!(
            gone(&p, "sbx_abc"),
            "sandbox sbx_abc is gone: its container sandbox (which runs the agent in the \
             template's image) exited with code 137 (SIGKILL, OOMKilled): its agent ran out of \
             memory (raise memory_mb); create a new sandbox"
        );
        let at_start = start_failure(&p).unwrap();
        assert!(
            at_start.contains("ask for a larger memory_mb"),
            "{at_start}"
        );
    }

    #[test]
    fn images_that_cannot_be_had_name_the_container_and_the_setting() {
        let never = waits(
            CONTAINER,
            "ErrImageNeverPull",
            "Container image \"example/py:3\" is not present with pull policy of Never",
        );
        let message = start_failure(&pod(failed(vec![], vec![never], "Pending"))).unwrap();
        assert!(
            message.contains(
                "its container sandbox (which runs the agent in the template's image) is waiting \
                 (ErrImageNeverPull): Container image \"example/py:3\" is not present"
            ),
            "{message}"
        );
        assert!(message.contains("--template-image NAME=IMAGE"), "{message}");
        let backoff = waits(
            INIT_CONTAINER,
            "ImagePullBackOff",
            "Back-off pulling image \"example/agent:1\"",
        );
        let message = start_failure(&pod(failed(vec![backoff], vec![], "Pending"))).unwrap();
        assert!(
            message.contains("its init container agent") && message.contains("ImagePullBackOff"),
            "{message}"
        );
        assert!(
            message.contains("check --agent-image and --image-pull-policy"),
            "{message}"
        );
        // Waiting for a reason that passes (an image being pulled, init containers running).
        for reason in ["ContainerCreating", "PodInitializing"] {
            let pending = failed(vec![], vec![waits(CONTAINER, reason, "")], "Pending");
            assert_eq!(start_failure(&pod(pending)), None, "{reason}");
        }
    }

    #[test]
    fn evictions_and_deadlines_are_the_pods_own() {
        let p = pod(Some(PodStatus {
            phase: Some("Failed".into()),
            reason: Some("Evicted".into()),
            message: Some("The node was low on resource: memory.".into()),
            container_statuses: Some(vec![ended(
                CONTAINER,
                ContainerStateTerminated {
                    exit_code: 137,
                    reason: Some("Error".into()),
                    ..Default::default()
                },
            )]),
            ..Default::default()
        }));
        assert_eq!(
            gone(&p, "sbx_abc"),
            "sandbox sbx_abc is gone: the node evicted its pod (the node ran short of \
             resources): The node was low on resource: memory.; create a new sandbox"
        );
        assert!(
            start_failure(&p)
                .unwrap()
                .contains("the node evicted it: The node was low on resource: memory.;")
        );
        let p = pod(Some(PodStatus {
            phase: Some("Failed".into()),
            reason: Some("DeadlineExceeded".into()),
            ..Default::default()
        }));
        assert!(gone(&p, "sbx_abc").contains("its timeout passed"));
    }

    #[test]
    fn no_status_is_no_fault_until_the_pod_ended() {
        assert_eq!(start_failure(&pod(None)), None);
        assert_eq!(
            gone(&pod(None), "sbx_abc"),
            "sandbox sbx_abc is gone: its pod ended; create a new sandbox"
        );
        let bare = pod(Some(PodStatus {
            phase: Some("Failed".into()),
            ..Default::default()
        }));
        assert_eq!(
            start_failure(&bare).unwrap(),
            "the sandbox's pod cannot start: it ended (Failed); its events: kubectl get events \
             -n sandboxes --field-selector involvedObject.name=sbx-abc"
        );
        assert_eq!(
            gone(&bare, "sbx_abc"),
            "sandbox sbx_abc is gone: its pod ended (Failed); create a new sandbox"
        );
    }

    #[test]
    fn text_from_the_cluster_is_cut_and_stripped() {
        assert_eq!(
            clean("  line 1\r\n\tline\u{1b}[31m 2\u{202E}\u{0}x ", 100),
            "line 1 line [31m 2 x"
        );
        let long = "é".repeat(5000);
        let cut = clean(&long, MAX_MESSAGE);
        assert!(cut.len() <= MAX_MESSAGE + '…'.len_utf8(), "{}", cut.len());
        assert!(cut.ends_with('…'));
        assert_eq!(clean("short", 5), "short");
        assert_eq!(clean("shorts", 5), "short…");
        // A hostile log as a container's message: one bounded line in the error.
        let hostile = format!("fake\n\nERROR: {}", "\u{7}x".repeat(10_000));
        let status = failed(
            vec![ended(
                INIT_CONTAINER,
                ContainerStateTerminated {
                    exit_code: 1,
                    message: Some(hostile),
                    ..Default::default()
                },
            )],
            vec![],
            "Failed",
        );
        let message = start_failure(&pod(status)).unwrap();
        assert!(!message.chars().any(char::is_control), "{message}");
        assert!(message.len() < MAX_MESSAGE + 600, "{}", message.len());
        assert!(
            message.contains("exited with code 1: fake ERROR: x x"),
            "{message}"
        );
    }
}
