//! Conversions into and out of the API's generated types: from what the agent answers and what
//! the manager keeps, to what the spec says a response is. Each is an [`Api`] (or, where the
//! generated type checks a constraint, [`TryApi`]) impl, so a handler converts with `.api()` or
//! `.try_api()`.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;

use sandbox_mcp_api::limits;
use sandbox_mcp_api::types;
use sandbox_mcp_engine::error::EngineError;
use sandbox_mcp_engine::services::{
    Diffed, ExecResult, NetworkLogPage, PreviewView, Restored, SandboxView, SecretView,
    ShapeRequest,
};
use sandbox_mcp_engine::state::{NetworkRules, OnTimeout, Snapshot, Status};
use sandbox_mcp_model::driver::CloneMethod;
use sandbox_mcp_model::driver::Shape;
use sandbox_mcp_model::ids;
use sandbox_mcp_network::EgressDefault;
use sandbox_mcp_protocol::{
    CodeOutcome, ContextInfo, DirEntry, FileKind, JobInfo, JobState, Language, Zip,
};
use sandbox_mcp_storage::diff;
use sandbox_mcp_storage::templates::{BuildFailure, Template, TemplateStatus};

/// A value the engine made that the API's own types refuse: a bug, not the caller's fault.
pub(super) fn internal(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> EngineError {
    EngineError::Response(e.into())
}

/// Into `T`, across the API's edge: an API type from the engine's, the agent's or the model's,
/// or back. Both sides are mostly other crates' types, so this crate's own trait, not `From`.
pub(crate) trait Api<T> {
    fn api(self) -> T;
}

/// Into the API's type `T`, when that can fail (a value the API's type cannot hold).
pub(crate) trait TryApi<T> {
    fn try_api(self) -> Result<T, EngineError>;
}

/// A sandbox id the engine holds, in the API's type.
pub(super) fn api_sandbox_id(id: &str) -> Result<types::SandboxId, EngineError> {
    types::SandboxId::try_from(id.to_string()).map_err(internal)
}

/// `Api` between two enums whose variants match one to one by name.
macro_rules! same_variants {
    ($from:path => $to:path: $($variant:ident),+) => {
        impl Api<$to> for $from {
            fn api(self) -> $to {
                use $from as Source;
                use $to as Target;
                match self {
                    $(Source::$variant => Target::$variant,)+
                }
            }
        }
    };
}

same_variants!(JobState => types::JobState: Running, Exited);
same_variants!(Language => types::Language: Python, Node);
same_variants!(types::Language => Language: Python, Node);
same_variants!(FileKind => types::FileType: File, Dir, Symlink, Other);
same_variants!(TemplateStatus => types::TemplateStatus: Building, Ready, Failed);

impl Api<types::OnTimeout> for OnTimeout {
    fn api(self) -> types::OnTimeout {
        match self {
            OnTimeout::Kill => types::OnTimeout::Kill,
            OnTimeout::Pause => types::OnTimeout::Pause,
            OnTimeout::Stop => types::OnTimeout::Stop,
        }
    }
}

impl Api<OnTimeout> for types::OnTimeout {
    fn api(self) -> OnTimeout {
        match self {
            types::OnTimeout::Kill => OnTimeout::Kill,
            types::OnTimeout::Pause => OnTimeout::Pause,
            types::OnTimeout::Stop => OnTimeout::Stop,
        }
    }
}

impl Api<types::SandboxStatus> for Status {
    fn api(self) -> types::SandboxStatus {
        match self {
            Status::Running => types::SandboxStatus::Running,
            Status::Creating | Status::Paused | Status::Killing => types::SandboxStatus::Paused,
        }
    }
}

impl Api<Status> for types::SandboxStatus {
    fn api(self) -> Status {
        match self {
            types::SandboxStatus::Running => Status::Running,
            types::SandboxStatus::Paused => Status::Paused,
        }
    }
}

impl Api<types::Shape> for &Shape {
    fn api(self) -> types::Shape {
        types::Shape {
            vcpus: self.vcpus,
            memory_mb: self.memory_mb,
            disk_mb: self.disk_mb,
            max_pids: self.max_pids,
        }
    }
}

impl Api<types::FileEntry> for DirEntry {
    fn api(self) -> types::FileEntry {
        types::FileEntry {
            name: self.name,
            type_: self.kind.api(),
            size: self.size,
            mtime: ids::time(self.mtime * 1000),
        }
    }
}

impl Api<types::DirArchive> for Zip {
    fn api(self) -> types::DirArchive {
        types::DirArchive {
            path: self.path,
            zip_base64: self.zip_b64,
            zip_bytes: self.zip_bytes,
            files: self.files,
            skipped: self.skipped,
        }
    }
}

impl Api<types::ExecResult> for ExecResult {
    fn api(self) -> types::ExecResult {
        let o = self.outcome;
        types::ExecResult {
            exit_code: o.exit_code,
            signal: o.signal,
            stdout: o.stdout,
            stderr: o.stderr,
            truncated: o.truncated,
            stdout_bytes: o.stdout_bytes,
            stderr_bytes: o.stderr_bytes,
            stdout_file: o.stdout_file,
            stderr_file: o.stderr_file,
            timed_out: o.timed_out,
            oom_killed: Some(self.oom_killed),
            duration_ms: o.duration_ms,
            job_id: None,
        }
    }
}

impl TryApi<types::JobSummary> for &JobInfo {
    fn try_api(self) -> Result<types::JobSummary, EngineError> {
        Ok(types::JobSummary {
            job_id: types::JobId::try_from(self.job_id.clone()).map_err(internal)?,
            command: self.command.clone(),
            status: self.status.api(),
            exit_code: self.exit_code,
            signal: self.signal,
            started_at: ids::time(self.started_at),
            finished_at: self.finished_at.map(ids::time),
            output_bytes: self.output_bytes,
            log_file: self.log_file.clone(),
        })
    }
}

impl TryApi<types::JobStatus> for JobInfo {
    fn try_api(self) -> Result<types::JobStatus, EngineError> {
        Ok(types::JobStatus {
            job_id: types::JobId::try_from(self.job_id.clone()).map_err(internal)?,
            status: self.status.api(),
            exit_code: self.exit_code,
            signal: self.signal,
            started_at: ids::time(self.started_at),
            finished_at: self.finished_at.map(ids::time),
            output_bytes: self.output_bytes,
            log_file: self.log_file,
            has_more: self.next_offset < self.output_bytes,
            output: self.output.unwrap_or_default(),
            offset: self.offset,
            next_offset: self.next_offset,
            dropped_bytes: self.dropped_bytes,
            command: self.command,
        })
    }
}

impl TryApi<types::CodeContext> for ContextInfo {
    fn try_api(self) -> Result<types::CodeContext, EngineError> {
        Ok(types::CodeContext {
            context_id: types::ContextId::try_from(self.context_id).map_err(internal)?,
            language: self.language.api(),
            cwd: self.cwd,
            created_at: ids::time(self.created_at),
            alive: self.alive,
            is_default: self.is_default,
        })
    }
}

impl TryApi<types::RunCodeResult> for CodeOutcome {
    fn try_api(self) -> Result<types::RunCodeResult, EngineError> {
        Ok(types::RunCodeResult {
            context_id: types::ContextId::try_from(self.context_id).map_err(internal)?,
            language: self.language.api(),
            result: self.result,
            error: self.error.map(|e| types::CodeError {
                name: e.name,
                message: e.message,
                traceback: e.traceback,
            }),
            stdout: self.stdout,
            stderr: self.stderr,
            stdout_bytes: self.stdout_bytes,
            stderr_bytes: self.stderr_bytes,
            truncated: self.truncated,
            stdout_file: self.stdout_file,
            stderr_file: self.stderr_file,
            timed_out: self.timed_out,
            context_lost: self.context_lost,
            context_restarted: self.context_restarted,
            duration_ms: self.duration_ms,
        })
    }
}

impl TryApi<types::Sandbox> for &SandboxView {
    fn try_api(self) -> Result<types::Sandbox, EngineError> {
        let view = self;
        let r = &view.record;
        let mut metadata = BTreeMap::new();
        for (k, v) in &r.metadata {
            metadata.insert(
                k.clone(),
                types::MetadataValue::try_from(v.clone()).map_err(internal)?,
            );
        }
        Ok(types::Sandbox {
            id: api_sandbox_id(&r.id)?,
            name: r.name.clone(),
            status: r.status.api(),
            template: sandbox_mcp_storage::templates::name_of_key(&r.template).to_string(),
            shape: (&r.shape).api(),
            metadata: types::Metadata(metadata),
            env_var_names: r.env.iter().map(|(k, _)| k.clone()).collect(),
            desktop: r.desktop.map(|d| types::Desktop {
                width: d.width.into(),
                height: d.height.into(),
                display: sandbox_mcp_protocol::DISPLAY.into(),
            }),
            created_at: ids::time(r.created_at),
            last_active_at: ids::time(r.last_active_at),
            expires_at: r.expires_at.map(ids::time),
            on_timeout: r.on_timeout.api(),
            network: types::NetworkPolicy {
                allow_out: r.network.allow_out.clone(),
                deny_out: r.network.deny_out.clone(),
                default: match view.network.default {
                    EgressDefault::Open => types::NetworkPolicyDefault::Open,
                    EgressDefault::Closed => types::NetworkPolicyDefault::Closed,
                },
                mode: if view.network.filtered {
                    types::NetworkPolicyMode::Filtered
                } else {
                    types::NetworkPolicyMode::LoopbackOnly
                },
            },
            jobs: view
                .jobs
                .iter()
                .map(TryApi::try_api)
                .collect::<Result<_, _>>()?,
            secrets: r
                .secrets
                .iter()
                .map(|(env, b)| {
                    Ok(types::SecretBinding {
                        env: env.parse().map_err(internal)?,
                        secret: b.secret.parse().map_err(internal)?,
                    })
                })
                .collect::<Result<_, EngineError>>()?,
            volumes: r
                .volumes
                .iter()
                .map(|m| {
                    Ok(types::VolumeMount {
                        name: m.name.parse().map_err(internal)?,
                        path: m.path.parse().map_err(internal)?,
                        read_only: m.read_only,
                    })
                })
                .collect::<Result<_, EngineError>>()?,
            usage: view.usage.map(|(u, disk)| types::Usage {
                cpu_seconds: u.cpu_seconds,
                memory_bytes: u.memory_bytes,
                pids: u.pids,
                disk_bytes: disk,
            }),
        })
    }
}

impl TryApi<types::NetworkLog> for NetworkLogPage {
    fn try_api(self) -> Result<types::NetworkLog, EngineError> {
        let page = self;
        let entries = page
            .entries
            .into_iter()
            .map(|e| {
                let r = e.row;
                Ok(types::NetworkLogEntry {
                    time: ids::time(r.at),
                    last_time: ids::time(r.last_at),
                    host: r.host,
                    address: r.addr,
                    port: r.port,
                    protocol: r.protocol.parse().map_err(internal)?,
                    verdict: r.verdict.parse().map_err(internal)?,
                    rule: r.rule,
                    bytes_sent: r.sent,
                    bytes_received: r.received,
                    duration_ms: r.duration_ms,
                    count: std::num::NonZeroU64::new(r.count.max(1))
                        .ok_or_else(|| internal("count 0"))?,
                })
            })
            .collect::<Result<_, EngineError>>()?;
        Ok(types::NetworkLog {
            entries,
            next_cursor: page.next_cursor.map(|c| c.to_string()),
        })
    }
}

/// Egress rules as given (the manager parses them under the engine's default).
impl Api<NetworkRules> for &types::NetworkRules {
    fn api(self) -> NetworkRules {
        NetworkRules {
            allow_out: self.allow_out.iter().map(|r| r.to_string()).collect(),
            deny_out: self.deny_out.iter().map(|r| r.to_string()).collect(),
        }
    }
}

/// A shape asked for (of a template or a sandbox), within the spec's bounds, which the
/// generated type does not check.
/// A request's shape, or the template's own when it names none.
impl TryApi<ShapeRequest> for &Option<types::ShapeRequest> {
    fn try_api(self) -> Result<ShapeRequest, EngineError> {
        self.as_ref()
            .map(TryApi::try_api)
            .transpose()
            .map(Option::unwrap_or_default)
    }
}

impl TryApi<ShapeRequest> for &types::ShapeRequest {
    fn try_api(self) -> Result<ShapeRequest, EngineError> {
        use limits::shape_request::*;
        let bad = |f: &str, lo: f64, hi: f64| {
            EngineError::InvalidArgument(format!("shape.{f} must be between {lo} and {hi}"))
        };
        let int = |v: Option<u64>, f: &str, range: RangeInclusive<u64>| match v {
            Some(x) if !range.contains(&x) => {
                Err(bad(f, *range.start() as f64, *range.end() as f64))
            }
            _ => Ok(()),
        };
        if let Some(v) = self.vcpus
            && !(VCPUS_MINIMUM..=VCPUS_MAXIMUM).contains(&v)
        {
            return Err(bad("vcpus", VCPUS_MINIMUM, VCPUS_MAXIMUM));
        }
        int(
            self.memory_mb,
            "memory_mb",
            MEMORY_MB_MINIMUM..=MEMORY_MB_MAXIMUM,
        )?;
        int(self.disk_mb, "disk_mb", DISK_MB_MINIMUM..=DISK_MB_MAXIMUM)?;
        int(
            self.max_pids,
            "max_pids",
            MAX_PIDS_MINIMUM..=MAX_PIDS_MAXIMUM,
        )?;
        Ok(ShapeRequest {
            vcpus: self.vcpus,
            memory_mb: self.memory_mb,
            disk_mb: self.disk_mb,
            max_pids: self.max_pids,
        })
    }
}

impl Api<types::BuildFailure> for &BuildFailure {
    fn api(self) -> types::BuildFailure {
        types::BuildFailure {
            step: self.step as u64,
            step_text: Some(self.step_text.clone()).filter(|s| !s.is_empty()),
            exit_code: self.exit_code,
            message: self.message.clone(),
            output_tail: self.output_tail.clone(),
        }
    }
}

/// A template, with the name of the engine's default template (which it may be).
impl TryApi<types::Template> for (&Template, &str) {
    fn try_api(self) -> Result<types::Template, EngineError> {
        let (t, default) = self;
        let f = &t.file;
        Ok(types::Template {
            name: types::TemplateName::try_from(t.name.clone()).map_err(internal)?,
            description: f.description.clone(),
            shape: (&t.shape).api(),
            default: t.key == default,
            shared: t.owner().is_none(),
            status: t.status().api(),
            size_bytes: f.size_bytes,
            parent: f.parent.clone(),
            warm: (f.warm > 0).then_some(f.warm),
            failure: f.failure.as_ref().map(Api::api),
        })
    }
}

impl TryApi<types::Preview> for PreviewView {
    fn try_api(self) -> Result<types::Preview, EngineError> {
        let p = &self.preview;
        let port =
            std::num::NonZeroU16::new(p.port).ok_or_else(|| internal("a preview of port 0"))?;
        let time = |ms: i64| {
            chrono::DateTime::from_timestamp_millis(ms)
                .ok_or_else(|| internal(format!("time {ms} out of range")))
        };
        Ok(types::Preview {
            port: port.into(),
            url: self.url,
            path_url: self.path_url,
            public: p.public,
            token: (!p.public).then(|| p.token.clone()),
            created_at: time(p.created_at)?,
            expires_at: p.expires_at.map(time).transpose()?,
            expired: p.expires_at.is_some_and(|at| at <= ids::now_ms()),
        })
    }
}

impl TryApi<types::Secret> for SecretView {
    fn try_api(self) -> Result<types::Secret, EngineError> {
        Ok(types::Secret {
            name: self.meta.name.parse().map_err(internal)?,
            hosts: self.meta.hosts,
            headers: self.meta.headers,
            created_at: ids::time(self.meta.created_at),
            updated_at: ids::time(self.meta.updated_at),
            used_by: self
                .used_by
                .iter()
                .map(|id| id.parse().map_err(internal))
                .collect::<Result<_, _>>()?,
        })
    }
}

/// A snapshot id the engine holds, in the API's type.
pub(super) fn api_snapshot_id(id: &str) -> Result<types::SnapshotId, EngineError> {
    types::SnapshotId::try_from(id.to_string()).map_err(internal)
}

impl Api<types::CopyMethod> for CloneMethod {
    fn api(self) -> types::CopyMethod {
        match self {
            CloneMethod::Snapshot => types::CopyMethod::Btrfs,
            CloneMethod::Copy => types::CopyMethod::Copy,
            CloneMethod::Layers => types::CopyMethod::Layers,
        }
    }
}

impl TryApi<types::Snapshot> for Snapshot {
    fn try_api(self) -> Result<types::Snapshot, EngineError> {
        Ok(types::Snapshot {
            id: api_snapshot_id(&self.id)?,
            sandbox_id: api_sandbox_id(&self.sandbox_id)?,
            name: self.name,
            created_at: ids::time(self.created_at),
            size_bytes: self.size_bytes,
            method: self.method.parse().map_err(internal)?,
            memory_bytes: self.memory_bytes,
        })
    }
}

impl TryApi<types::RestoreResult> for Restored {
    fn try_api(self) -> Result<types::RestoreResult, EngineError> {
        let note = format!(
            "The files are back to snapshot {}. {} process(es) were stopped, {} background job(s) ended and {} REPL context(s) reset; the sandbox restarted on the restored files with its environment, network rules, secrets and preview URLs.",
            self.snapshot.id, self.stopped_processes, self.ended_jobs, self.lost_contexts
        );
        let note = match &self.memory {
            Some(m) if !m.carried.is_empty() => format!(
                "{note} Then the snapshot's processes came back: {}.",
                m.carried.join(", ")
            ),
            _ => note,
        };
        Ok(types::RestoreResult {
            sandbox_id: api_sandbox_id(&self.snapshot.sandbox_id)?,
            snapshot_id: api_snapshot_id(&self.snapshot.id)?,
            method: self.method.api(),
            stopped_processes: self.stopped_processes,
            ended_jobs: self.ended_jobs,
            lost_contexts: self.lost_contexts,
            memory: self.memory.map(TryApi::try_api).transpose()?,
            note,
        })
    }
}

impl Api<types::DiffEntry> for diff::Entry {
    fn api(self) -> types::DiffEntry {
        types::DiffEntry {
            path: self.path,
            change: match self.change {
                diff::Change::Added => types::DiffEntryChange::Added,
                diff::Change::Removed => types::DiffEntryChange::Removed,
                diff::Change::Modified => types::DiffEntryChange::Modified,
            },
            type_: match self.kind {
                diff::Kind::File => types::DiffEntryType::File,
                diff::Kind::Dir => types::DiffEntryType::Dir,
                diff::Kind::Symlink => types::DiffEntryType::Symlink,
                diff::Kind::Other => types::DiffEntryType::Other,
            },
            size: self.size,
            what: self.what.iter().filter_map(|w| w.parse().ok()).collect(),
        }
    }
}

/// A diff as the API shows it: the exact counts, the first `limit` changes.
pub(super) fn diff_result(
    against: String,
    diffed: Diffed,
    limit: usize,
) -> Result<types::DiffResult, EngineError> {
    let Diffed { diff, saved_to } = diffed;
    let total = diff.added + diff.removed + diff.modified;
    let entries: Vec<types::DiffEntry> =
        diff.entries.into_iter().take(limit).map(Api::api).collect();
    Ok(types::DiffResult {
        against,
        added: diff.added,
        removed: diff.removed,
        modified: diff.modified,
        truncated: (entries.len() as u64) < total,
        entries,
        saved_to,
    })
}

impl TryApi<types::LiveReport> for sandbox_mcp_model::driver::LiveReport {
    fn try_api(self) -> Result<types::LiveReport, EngineError> {
        let short = |s: &str, max: usize| {
            let mut end = s.len().min(max);
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            s[..end].to_string()
        };
        Ok(types::LiveReport {
            carried: self
                .carried
                .iter()
                .take(512)
                .map(|s| types::LiveReportCarriedItem::try_from(short(s, 1024)).map_err(internal))
                .collect::<Result<_, _>>()?,
            skipped: self
                .skipped
                .iter()
                .take(512)
                .map(|s| types::LiveReportSkippedItem::try_from(short(s, 4096)).map_err(internal))
                .collect::<Result<_, _>>()?,
        })
    }
}
