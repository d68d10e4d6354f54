//! Builds from steps: one build sandbox per `run` step, each step's result a layer, cached by
//! parent and step.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sandbox_mcp_protocol::ExecSpec;
use sandbox_mcp_storage::templates::{BuildFailure, MAX_LAYERS, TemplateFile};
use sandbox_mcp_sys::layers;

use super::{BUILD_TENANT, Step, TAIL, Templates};
use crate::services::CreateRequest;
use crate::state::NetworkRules;

impl Templates {
    /// Runs the steps, one build sandbox per `run` step, each step's result a layer added to
    /// `file`. Returns why the build failed, if it did.
    pub(super) async fn build(
        self: &Arc<Self>,
        file: &mut TemplateFile,
        steps: &[Step],
        network: &NetworkRules,
        timeout: Duration,
    ) -> Result<(), BuildFailure> {
        let started = Instant::now();
        // The cache key of everything below the first step: the parent's stack — and the
        // owner, for a tenant's build: tenants never share a cached layer (one would learn what
        // another built, and when).
        let mut key = layers::id_of(&[file.layers.join("/").as_bytes(), &[u8::from(file.foreign)]]);
        if let Some(owner) = &file.owner {
            key = layers::id_of(&[key.as_bytes(), b"owner", owner.as_bytes()]);
        }
        let mut bytes = 0u64;
        for (i, step) in steps.iter().enumerate() {
            let n = i + 1;
            let text = step.describe();
            let json = serde_json::to_vec(step).unwrap_or_default();
            key = layers::id_of(&[key.as_bytes(), &json]);
            let command = match step {
                Step::Env(k, v) => {
                    file.env.retain(|(name, _)| name != k);
                    file.env.push((k.clone(), v.clone()));
                    continue;
                }
                Step::Workdir(d) => {
                    file.workdir = Some(d.clone());
                    continue;
                }
                Step::Run(command) => command,
            };
            if self.catalog.has_layer(&key) {
                // Cached: this parent ran this step before.
                file.layers.push(key.clone());
                continue;
            }
            if file.layers.len() >= MAX_LAYERS {
                return Err(BuildFailure::new(
                    n,
                    &text,
                    format!(
                        "the template would stack more than {MAX_LAYERS} layers; combine run steps with &&"
                    ),
                ));
            }
            let Some(left) = timeout.checked_sub(started.elapsed()) else {
                return Err(BuildFailure::new(
                    n,
                    &text,
                    format!(
                        "the build ran past its time limit of {} s",
                        timeout.as_secs()
                    ),
                ));
            };
            // The build sandbox starts from the template as built so far.
            self.catalog
                .put(file.clone())
                .await
                .map_err(|e| BuildFailure::new(n, &text, e.to_string()))?;
            let made = self
                .run_step(file, command, network, left, n, &text, &key)
                .await?;
            bytes += made;
            file.size_bytes = bytes;
            file.layers.push(key.clone());
        }
        Ok(())
    }

    /// Runs one `run` step in a fresh build sandbox and publishes its result as layer `key`.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn run_step(
        self: &Arc<Self>,
        file: &TemplateFile,
        command: &str,
        network: &NetworkRules,
        left: Duration,
        n: usize,
        text: &str,
        key: &str,
    ) -> Result<u64, BuildFailure> {
        let fail = |message: String| BuildFailure::new(n, text, message);
        let template = self
            .catalog
            .template(&file.key())
            .map_err(|e| fail(e.to_string()))?;
        let view = self
            .lifecycle
            .create_from(
                CreateRequest {
                    name: Some(format!("build of {}", file.name)),
                    tenant: Some(BUILD_TENANT.to_string()),
                    network: network.clone(),
                    ..Default::default()
                },
                &template,
                template.shape,
            )
            .await
            .map_err(|e| fail(format!("cannot start the build sandbox: {e}")))?;
        let id = view.record.id.clone();
        let result = self
            .agent
            .exec(
                &id,
                Some(BUILD_TENANT),
                ExecSpec {
                    command: command.to_string(),
                    cwd: file.workdir.clone(),
                    env: Vec::new(),
                    timeout_ms: u64::try_from(left.as_millis()).unwrap_or(u64::MAX),
                    max_output_bytes: TAIL as u64,
                    stream: false,
                },
            )
            .await;
        let outcome = match result {
            Ok(r) => {
                let o = r.outcome;
                let exit_code = o.exit_code.map(i64::from);
                let message = if o.timed_out {
                    Some(format!(
                        "step {n} ran past the build's time limit ({} s were left when it started)",
                        left.as_secs()
                    ))
                } else if r.oom_killed {
                    Some(format!(
                        "step {n} ran out of memory (the template's shape allows {} MB); raise shape.memory_mb",
                        file.shape.memory_mb
                    ))
                } else if o.exit_code != Some(0) {
                    Some(format!(
                        "step {n} exited with {}",
                        o.exit_code.map_or_else(
                            || format!("signal {}", o.signal.unwrap_or(0)),
                            |c| format!("code {c}")
                        )
                    ))
                } else {
                    None
                };
                match message {
                    Some(m) => Err(BuildFailure {
                        exit_code: exit_code.filter(|_| !o.timed_out),
                        output_tail: tail_of(&o.stdout, &o.stderr),
                        ..fail(m)
                    }),
                    None => Ok(()),
                }
            }
            Err(e) => Err(fail(format!("step {n} could not run: {e}"))),
        };
        let captured = match outcome {
            Ok(()) => self
                .capture_stopped(&id, file, key)
                .await
                .map_err(|e| fail(format!("cannot save step {n}'s result: {e}"))),
            Err(f) => Err(f),
        };
        if let Err(e) = self.lifecycle.kill(&id, Some(BUILD_TENANT)).await {
            tracing::warn!(sandbox = %id, "cannot delete a build sandbox: {e}");
        }
        captured
    }
}

/// The end of a step's output: stdout's tail, then stderr's, at most [`TAIL`] bytes.
fn tail_of(stdout: &str, stderr: &str) -> String {
    let both = if stderr.is_empty() {
        stdout.to_string()
    } else if stdout.is_empty() {
        stderr.to_string()
    } else if stdout.ends_with('\n') {
        format!("{stdout}{stderr}")
    } else {
        format!("{stdout}\n{stderr}")
    };
    if both.len() <= TAIL {
        return both;
    }
    let mut start = both.len() - TAIL;
    while !both.is_char_boundary(start) {
        start += 1;
    }
    both[start..].to_string()
}
