//! Conversions into and out of the API's generated types: from what the agent answers and what
//! the manager keeps, to what the spec says a response is. Each is a `From` (or, where the
//! generated type checks a constraint, `TryFrom`) impl, so a handler converts with `.into()` or
//! `.try_into()`.

use std::collections::BTreeMap;

use crate::client::types;
use crate::engine::diff;
use crate::engine::driver::CloneMethod;
use crate::engine::driver::Shape;
use crate::engine::error::EngineError;
use crate::engine::ids;
use crate::engine::manager::{
    Diffed, ExecResult, NetworkLogPage, PreviewView, Restored, SandboxView, SecretView,
    ShapeRequest,
};
use crate::engine::network::EgressDefault;
use crate::engine::state::{NetworkRules, Snapshot, Status};
use crate::engine::templates::{BuildFailure, Template, TemplateStatus};
use sandbox_mcp_protocol::{
    CodeOutcome, ContextInfo, DirEntry, FileKind, JobInfo, JobState, Language, Zip,
};

/// A value the engine made that the API's own types refuse: a bug, not the caller's fault.
pub(super) fn internal(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> EngineError {
    EngineError::Response(e.into())
}

/// A sandbox id the engine holds, in the API's type.
pub(super) fn api_sandbox_id(id: &str) -> Result<types::SandboxId, EngineError> {
    types::SandboxId::try_from(id.to_string()).map_err(internal)
}

impl From<Status> for types::SandboxStatus {
    fn from(s: Status) -> Self {
        match s {
            Status::Running => Self::Running,
            Status::Creating | Status::Paused | Status::Killing => Self::Paused,
        }
    }
}

impl From<types::SandboxStatus> for Status {
    fn from(s: types::SandboxStatus) -> Self {
        match s {
            types::SandboxStatus::Running => Self::Running,
            types::SandboxStatus::Paused => Self::Paused,
        }
    }
}

impl From<&Shape> for types::Shape {
    fn from(s: &Shape) -> Self {
        Self {
            vcpus: s.vcpus,
            memory_mb: s.memory_mb,
            disk_mb: s.disk_mb,
            max_pids: s.max_pids,
        }
    }
}

impl From<JobState> for types::JobState {
    fn from(s: JobState) -> Self {
        match s {
            JobState::Running => Self::Running,
            JobState::Exited => Self::Exited,
        }
    }
}

impl From<Language> for types::Language {
    fn from(l: Language) -> Self {
        match l {
            Language::Python => Self::Python,
            Language::Node => Self::Node,
        }
    }
}

impl From<types::Language> for Language {
    fn from(l: types::Language) -> Self {
        match l {
            types::Language::Python => Self::Python,
            types::Language::Node => Self::Node,
        }
    }
}

impl From<FileKind> for types::FileType {
    fn from(k: FileKind) -> Self {
        match k {
            FileKind::File => Self::File,
            FileKind::Dir => Self::Dir,
            FileKind::Symlink => Self::Symlink,
            FileKind::Other => Self::Other,
        }
    }
}

impl From<DirEntry> for types::FileEntry {
    fn from(e: DirEntry) -> Self {
        Self {
            name: e.name,
            type_: e.kind.into(),
            size: e.size,
            mtime: ids::time(e.mtime * 1000),
        }
    }
}

impl From<Zip> for types::DirArchive {
    fn from(z: Zip) -> Self {
        Self {
            path: z.path,
            zip_base64: z.zip_b64,
            zip_bytes: z.zip_bytes,
            files: z.files,
            skipped: z.skipped,
        }
    }
}

impl From<ExecResult> for types::ExecResult {
    fn from(r: ExecResult) -> Self {
        let o = r.outcome;
        Self {
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
            oom_killed: Some(r.oom_killed),
            duration_ms: o.duration_ms,
            job_id: None,
        }
    }
}

impl TryFrom<&JobInfo> for types::JobSummary {
    type Error = EngineError;

    fn try_from(j: &JobInfo) -> Result<Self, EngineError> {
        Ok(Self {
            job_id: types::JobId::try_from(j.job_id.clone()).map_err(internal)?,
            command: j.command.clone(),
            status: j.status.into(),
            exit_code: j.exit_code,
            signal: j.signal,
            started_at: ids::time(j.started_at),
            finished_at: j.finished_at.map(ids::time),
            output_bytes: j.output_bytes,
            log_file: j.log_file.clone(),
        })
    }
}

impl TryFrom<JobInfo> for types::JobStatus {
    type Error = EngineError;

    fn try_from(j: JobInfo) -> Result<Self, EngineError> {
        Ok(Self {
            job_id: types::JobId::try_from(j.job_id.clone()).map_err(internal)?,
            status: j.status.into(),
            exit_code: j.exit_code,
            signal: j.signal,
            started_at: ids::time(j.started_at),
            finished_at: j.finished_at.map(ids::time),
            output_bytes: j.output_bytes,
            log_file: j.log_file,
            has_more: j.next_offset < j.output_bytes,
            output: j.output.unwrap_or_default(),
            offset: j.offset,
            next_offset: j.next_offset,
            dropped_bytes: j.dropped_bytes,
            command: j.command,
        })
    }
}

impl TryFrom<ContextInfo> for types::CodeContext {
    type Error = EngineError;

    fn try_from(c: ContextInfo) -> Result<Self, EngineError> {
        Ok(Self {
            context_id: types::ContextId::try_from(c.context_id).map_err(internal)?,
            language: c.language.into(),
            cwd: c.cwd,
            created_at: ids::time(c.created_at),
            alive: c.alive,
            is_default: c.is_default,
        })
    }
}

impl TryFrom<CodeOutcome> for types::RunCodeResult {
    type Error = EngineError;

    fn try_from(o: CodeOutcome) -> Result<Self, EngineError> {
        Ok(Self {
            context_id: types::ContextId::try_from(o.context_id).map_err(internal)?,
            language: o.language.into(),
            result: o.result,
            error: o.error.map(|e| types::CodeError {
                name: e.name,
                message: e.message,
                traceback: e.traceback,
            }),
            stdout: o.stdout,
            stderr: o.stderr,
            stdout_bytes: o.stdout_bytes,
            stderr_bytes: o.stderr_bytes,
            truncated: o.truncated,
            stdout_file: o.stdout_file,
            stderr_file: o.stderr_file,
            timed_out: o.timed_out,
            context_lost: o.context_lost,
            context_restarted: o.context_restarted,
            duration_ms: o.duration_ms,
        })
    }
}

impl TryFrom<&SandboxView> for types::Sandbox {
    type Error = EngineError;

    fn try_from(view: &SandboxView) -> Result<Self, EngineError> {
        let r = &view.record;
        let mut metadata = BTreeMap::new();
        for (k, v) in &r.metadata {
            metadata.insert(
                k.clone(),
                types::MetadataValue::try_from(v.clone()).map_err(internal)?,
            );
        }
        Ok(Self {
            id: api_sandbox_id(&r.id)?,
            name: r.name.clone(),
            status: r.status.into(),
            template: crate::engine::templates::name_of_key(&r.template).to_string(),
            shape: (&r.shape).into(),
            metadata: types::Metadata(metadata),
            env_var_names: r.env.iter().map(|(k, _)| k.clone()).collect(),
            desktop: r.desktop.map(|d| types::Desktop {
                width: d.width.into(),
                height: d.height.into(),
                display: crate::engine::manager::DISPLAY.into(),
            }),
            created_at: ids::time(r.created_at),
            last_active_at: ids::time(r.last_active_at),
            expires_at: r.expires_at.map(ids::time),
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
                .map(types::JobSummary::try_from)
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
            usage: view.usage.map(|(u, disk)| types::Usage {
                cpu_seconds: u.cpu_seconds,
                memory_bytes: u.memory_bytes,
                pids: u.pids,
                disk_bytes: disk,
            }),
        })
    }
}

impl TryFrom<NetworkLogPage> for types::NetworkLog {
    type Error = EngineError;

    fn try_from(page: NetworkLogPage) -> Result<Self, EngineError> {
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
impl From<&types::NetworkRules> for NetworkRules {
    fn from(n: &types::NetworkRules) -> Self {
        Self {
            allow_out: n.allow_out.iter().map(|r| r.to_string()).collect(),
            deny_out: n.deny_out.iter().map(|r| r.to_string()).collect(),
        }
    }
}

/// A shape asked for (of a template or a sandbox), within the spec's bounds, which the
/// generated type does not check.
impl TryFrom<&types::ShapeRequest> for ShapeRequest {
    type Error = EngineError;

    fn try_from(s: &types::ShapeRequest) -> Result<Self, EngineError> {
        let bad = |f: &str, lo: f64, hi: f64| {
            EngineError::InvalidArgument(format!("shape.{f} must be between {lo} and {hi}"))
        };
        let int = |v: Option<u64>, f: &str, lo: u64, hi: u64| match v {
            Some(x) if !(lo..=hi).contains(&x) => Err(bad(f, lo as f64, hi as f64)),
            _ => Ok(()),
        };
        if let Some(v) = s.vcpus
            && !(0.1..=64.0).contains(&v)
        {
            return Err(bad("vcpus", 0.1, 64.0));
        }
        int(s.memory_mb, "memory_mb", 64, 262_144)?;
        int(s.disk_mb, "disk_mb", 64, 1_048_576)?;
        int(s.max_pids, "max_pids", 16, 65_536)?;
        Ok(Self {
            vcpus: s.vcpus,
            memory_mb: s.memory_mb,
            disk_mb: s.disk_mb,
            max_pids: s.max_pids,
        })
    }
}

impl From<TemplateStatus> for types::TemplateStatus {
    fn from(s: TemplateStatus) -> Self {
        match s {
            TemplateStatus::Building => Self::Building,
            TemplateStatus::Ready => Self::Ready,
            TemplateStatus::Failed => Self::Failed,
        }
    }
}

impl From<&BuildFailure> for types::BuildFailure {
    fn from(x: &BuildFailure) -> Self {
        Self {
            step: x.step as u64,
            step_text: Some(x.step_text.clone()).filter(|s| !s.is_empty()),
            exit_code: x.exit_code,
            message: x.message.clone(),
            output_tail: x.output_tail.clone(),
        }
    }
}

/// A template, with the name of the engine's default template (which it may be).
impl TryFrom<(&Template, &str)> for types::Template {
    type Error = EngineError;

    fn try_from((t, default): (&Template, &str)) -> Result<Self, EngineError> {
        let f = &t.file;
        Ok(Self {
            name: types::TemplateName::try_from(t.name.clone()).map_err(internal)?,
            description: f.description.clone(),
            shape: (&t.shape).into(),
            default: t.key == default,
            shared: t.owner().is_none(),
            status: t.status().into(),
            size_bytes: f.size_bytes,
            parent: f.parent.clone(),
            warm: (f.warm > 0).then_some(f.warm),
            failure: f.failure.as_ref().map(Into::into),
        })
    }
}

impl TryFrom<PreviewView> for types::Preview {
    type Error = EngineError;

    fn try_from(v: PreviewView) -> Result<Self, EngineError> {
        let p = &v.preview;
        let port =
            std::num::NonZeroU16::new(p.port).ok_or_else(|| internal("a preview of port 0"))?;
        let time = |ms: i64| {
            chrono::DateTime::from_timestamp_millis(ms)
                .ok_or_else(|| internal(format!("time {ms} out of range")))
        };
        Ok(types::Preview {
            port: port.into(),
            url: v.url,
            path_url: v.path_url,
            public: p.public,
            token: (!p.public).then(|| p.token.clone()),
            created_at: time(p.created_at)?,
            expires_at: p.expires_at.map(time).transpose()?,
            expired: p.expires_at.is_some_and(|at| at <= ids::now_ms()),
        })
    }
}

impl TryFrom<SecretView> for types::Secret {
    type Error = EngineError;

    fn try_from(v: SecretView) -> Result<Self, EngineError> {
        Ok(types::Secret {
            name: v.meta.name.parse().map_err(internal)?,
            hosts: v.meta.hosts,
            headers: v.meta.headers,
            created_at: ids::time(v.meta.created_at),
            updated_at: ids::time(v.meta.updated_at),
            used_by: v
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

impl From<CloneMethod> for types::CopyMethod {
    fn from(m: CloneMethod) -> Self {
        match m {
            CloneMethod::Snapshot => Self::Btrfs,
            CloneMethod::Copy => Self::Copy,
        }
    }
}

impl TryFrom<Snapshot> for types::Snapshot {
    type Error = EngineError;

    fn try_from(s: Snapshot) -> Result<Self, EngineError> {
        Ok(Self {
            id: api_snapshot_id(&s.id)?,
            sandbox_id: api_sandbox_id(&s.sandbox_id)?,
            name: s.name,
            created_at: ids::time(s.created_at),
            size_bytes: s.size_bytes,
            method: s.method.parse().map_err(internal)?,
        })
    }
}

impl TryFrom<Restored> for types::RestoreResult {
    type Error = EngineError;

    fn try_from(r: Restored) -> Result<Self, EngineError> {
        let note = format!(
            "The files are back to snapshot {}. {} process(es) were stopped, {} background job(s) ended and {} REPL context(s) reset; the sandbox restarted on the restored files with its environment, network rules, secrets and preview URLs.",
            r.snapshot.id, r.stopped_processes, r.ended_jobs, r.lost_contexts
        );
        Ok(Self {
            sandbox_id: api_sandbox_id(&r.snapshot.sandbox_id)?,
            snapshot_id: api_snapshot_id(&r.snapshot.id)?,
            method: r.method.into(),
            stopped_processes: r.stopped_processes,
            ended_jobs: r.ended_jobs,
            lost_contexts: r.lost_contexts,
            note,
        })
    }
}

impl From<diff::Entry> for types::DiffEntry {
    fn from(e: diff::Entry) -> Self {
        Self {
            path: e.path,
            change: match e.change {
                diff::Change::Added => types::DiffEntryChange::Added,
                diff::Change::Removed => types::DiffEntryChange::Removed,
                diff::Change::Modified => types::DiffEntryChange::Modified,
            },
            type_: match e.kind {
                diff::Kind::File => types::DiffEntryType::File,
                diff::Kind::Dir => types::DiffEntryType::Dir,
                diff::Kind::Symlink => types::DiffEntryType::Symlink,
                diff::Kind::Other => types::DiffEntryType::Other,
            },
            size: e.size,
            what: e.what.iter().filter_map(|w| w.parse().ok()).collect(),
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
    let entries: Vec<types::DiffEntry> = diff
        .entries
        .into_iter()
        .take(limit)
        .map(Into::into)
        .collect();
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// The spec's id patterns are exactly the engine's id formats: every id the engine makes is
    /// valid API data, and a character outside its alphabet is refused by both.
    #[test]
    fn the_spec_id_patterns_are_the_engine_id_formats() {
        for _ in 0..100 {
            assert!(api_sandbox_id(&ids::sandbox_id()).is_ok());
            assert!(api_snapshot_id(&ids::snapshot_id()).is_ok());
        }
        for c in (b'!'..=b'~').map(char::from) {
            let sandbox = format!("sbx_{c}{}", "0".repeat(25));
            let snapshot = format!("snap_{c}{}", "0".repeat(25));
            assert_eq!(
                types::SandboxId::try_from(sandbox.clone()).is_ok(),
                ids::is_sandbox_id(&sandbox),
                "{sandbox}"
            );
            assert_eq!(
                types::SnapshotId::try_from(snapshot.clone()).is_ok(),
                ids::is_snapshot_id(&snapshot),
                "{snapshot}"
            );
        }
        let against = |s: &str| types::DiffRequest::builder().against(s).try_into();
        let ok: Result<types::DiffRequest, _> = against(&ids::snapshot_id());
        assert!(ok.is_ok());
        let bad: Result<types::DiffRequest, _> = against("sbx_iiiiiiiiiiiiiiiiiiiiiiiiii");
        assert!(bad.is_err());
    }
}
