//! Background jobs: commands that outlive the call that started them.
//!
//! A job's stdout and stderr go, interleaved as written, to a log file inside the sandbox
//! (`/tmp/sandbox-mcp/jobs/<id>.log`); `JobStatus` pages through it by byte offset. Offsets are
//! absolute and never reused: when a log outgrows its limit, its oldest half is dropped and
//! `dropped_bytes` says how much is gone. Jobs are bounded in number, running and kept.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use tokio::io::AsyncReadExt;

use super::live::{self, AgentEnds};
use super::reaper::{Exit, Reaper};
use super::safe_open;
use super::spawn::{self, Launch, Started, default_cwd, error};
use sandbox_mcp_protocol::{
    AgentError, ErrorKind, JobInfo, JobList, JobState, JobStatus, KillJob, PipeRole, StartJob,
    Tree, TreeKind, TreePipe,
};
use sandbox_mcp_sys::now_ms;

pub(crate) const JOB_DIR: &str = "/tmp/sandbox-mcp/jobs";
/// Most jobs running at once in one sandbox.
pub(crate) const MAX_RUNNING: usize = 64;
/// Most jobs remembered (finished ones are forgotten oldest first).
pub(crate) const MAX_KEPT: usize = 256;
/// A log is trimmed to half when it grows past this.
const LOG_LIMIT: u64 = 64 * 1024 * 1024;

struct Job {
    id: String,
    command: String,
    pid: i32,
    started_at: i64,
    finished_at: Cell<Option<i64>>,
    exit: Cell<Option<Exit>>,
    /// Bytes ever written by the job.
    bytes: Cell<u64>,
    /// Bytes dropped from the front of the log.
    dropped: Cell<u64>,
    log: PathBuf,
    pipe_inodes: Vec<u64>,
    /// An attached process (its stdio is a connection): cannot be carried to another sandbox.
    attached: bool,
}

impl Job {
    fn info(&self) -> JobInfo {
        let (exit_code, signal) = match self.exit.get() {
            Some(Exit::Code(c)) => (Some(c), None),
            Some(Exit::Signal(s)) => (None, Some(s)),
            Some(Exit::Unknown) => (None, None),
            None => (None, None),
        };
        JobInfo {
            job_id: self.id.clone(),
            command: short_command(&self.command),
            status: if self.exit.get().is_some() {
                JobState::Exited
            } else {
                JobState::Running
            },
            exit_code,
            signal,
            started_at: self.started_at,
            finished_at: self.finished_at.get(),
            output_bytes: self.bytes.get(),
            log_file: self.log.display().to_string(),
            output: None,
            offset: 0,
            next_offset: self.bytes.get(),
            dropped_bytes: self.dropped.get(),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    #[test]
    fn pages_never_end_inside_a_character() {
        let text = "aé€😀".as_bytes();
        for cut in 0..=text.len() {
            let end = super::utf8_safe_end(&text[..cut]);
            assert!(
                std::str::from_utf8(&text[..end]).is_ok(),
                "cut {cut} → {end}"
            );
            assert!(cut - end < 4);
        }
    }
}

#[derive(Default)]
pub(crate) struct Jobs {
    map: RefCell<BTreeMap<u64, Rc<Job>>>,
    next: Cell<u64>,
}

fn unknown(id: &str) -> AgentError {
    error(
        ErrorKind::NotFound,
        format!(
            "job {id} does not exist (or was forgotten after finishing); sandbox_info lists the sandbox's jobs"
        ),
    )
}

impl Jobs {
    fn find(&self, id: &str) -> Option<Rc<Job>> {
        self.map.borrow().values().find(|j| j.id == id).cloned()
    }

    /// Frees a slot by forgetting the oldest finished job; fails when too many are running.
    fn make_room(&self) -> Result<(), AgentError> {
        let running = self
            .map
            .borrow()
            .values()
            .filter(|j| j.exit.get().is_none())
            .count();
        if running >= MAX_RUNNING {
            return Err(error(
                ErrorKind::Conflict,
                format!(
                    "{running} background jobs are already running in this sandbox (the limit is {MAX_RUNNING}); wait for some or stop them with sandbox_job_kill"
                ),
            ));
        }
        let mut map = self.map.borrow_mut();
        while map.len() >= MAX_KEPT {
            let oldest_done = map
                .iter()
                .find(|(_, j)| j.exit.get().is_some())
                .map(|(k, _)| *k);
            match oldest_done {
                Some(k) => {
                    if let Some(j) = map.remove(&k) {
                        let _ = std::fs::remove_file(&j.log);
                    }
                }
                None => break,
            }
        }
        Ok(())
    }

    /// A slot for a new job: its number, id and log (created empty).
    fn open_slot(&self) -> Result<(u64, String, PathBuf, File), AgentError> {
        self.make_room()?;
        let n = self.next.get() + 1;
        let id = format!("job_{n}");
        let log = Path::new(JOB_DIR).join(format!("{id}.log"));
        // The log's name repeats after an agent restart; whatever sandbox code left there (a FIFO,
        // a symlink) is replaced, never opened.
        let file = std::fs::create_dir_all(JOB_DIR).and_then(|()| safe_open::recreate_own(&log));
        let file = file.map_err(|e| {
            error(
                ErrorKind::Io,
                format!("cannot create the job's log {}: {e}", log.display()),
            )
        })?;
        Ok((n, id, log, file))
    }

    /// Enters a started process as job `n`.
    fn register(
        &self,
        n: u64,
        id: String,
        command: String,
        started: &Started,
        log: PathBuf,
        attached: bool,
    ) -> Rc<Job> {
        self.next.set(n);
        let job = Rc::new(Job {
            id,
            command,
            pid: started.pid,
            started_at: now_ms(),
            finished_at: Cell::new(None),
            exit: Cell::new(None),
            bytes: Cell::new(0),
            dropped: Cell::new(0),
            log,
            pipe_inodes: started.pipe_inodes.clone(),
            attached,
        });
        self.map.borrow_mut().insert(n, job.clone());
        job
    }

    pub(crate) fn start(
        &self,
        StartJob { command, cwd, env }: StartJob,
        sandbox_env: &[(String, String)],
        reaper: &Reaper,
    ) -> Result<JobInfo, AgentError> {
        let cwd = cwd.unwrap_or_else(|| default_cwd().to_string());
        if command.contains('\0') {
            return Err(error(
                ErrorKind::InvalidArgument,
                "command contains a NUL byte",
            ));
        }
        spawn::check(&cwd, &env)?;
        let (n, id, log, file) = self.open_slot()?;
        let launch = Launch {
            program: "/bin/sh",
            args: &["-c", &command],
            cwd: &cwd,
            env: &[sandbox_env, &env],
            merge_output: true,
            ..Default::default()
        };
        let started = spawn::start(&launch, reaper).inspect_err(|_| {
            let _ = std::fs::remove_file(&log);
        })?;
        let job = self.register(n, id, command, &started, log, false);
        let info = job.info();
        follow(job, file, started.stdout, started.exit);
        Ok(info)
    }

    /// Each running job that is not attached, as a tree to carry; attached ones by name.
    pub(crate) fn trees(&self) -> (Vec<Tree>, Vec<String>) {
        let (mut trees, mut skipped) = (Vec::new(), Vec::new());
        for job in self.map.borrow().values() {
            if job.exit.get().is_some() {
                continue;
            }
            if job.attached {
                skipped.push(format!("job {} (an attached process)", job.id));
                continue;
            }
            let Some(&inode) = job.pipe_inodes.first() else {
                continue;
            };
            trees.push(Tree {
                kind: TreeKind::Job {
                    job_id: job.id.clone(),
                    command: job.command.clone(),
                    started_at: job.started_at,
                    output_bytes: job.bytes.get(),
                    dropped_bytes: job.dropped.get(),
                    log_file: job.log.display().to_string(),
                },
                pid: job.pid,
                pipes: vec![TreePipe {
                    inode,
                    role: PipeRole::Output,
                }],
            });
        }
        (trees, skipped)
    }

    /// Takes over a restored job as `kind` names it: its log goes on from where the parent's
    /// stopped (the log file came with the sandbox's files).
    pub(crate) fn adopt(
        &self,
        kind: TreeKind,
        pid: i32,
        mut ends: AgentEnds,
        exit: tokio::sync::oneshot::Receiver<Exit>,
    ) -> Result<(), AgentError> {
        let TreeKind::Job {
            job_id,
            command,
            started_at,
            output_bytes,
            dropped_bytes,
            ..
        } = kind
        else {
            return Err(error(ErrorKind::InvalidArgument, "not a job"));
        };
        let n: u64 = job_id
            .strip_prefix("job_")
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| error(ErrorKind::InvalidArgument, format!("bad job id {job_id}")))?;
        if self.map.borrow().contains_key(&n) {
            return Err(error(
                ErrorKind::Conflict,
                format!("job {job_id} already exists here"),
            ));
        }
        self.make_room()?;
        let log = Path::new(JOB_DIR).join(format!("{job_id}.log"));
        let file = safe_open::append_own(&log).map_err(|e| {
            error(
                ErrorKind::Io,
                format!("cannot reopen the job's log {}: {e}", log.display()),
            )
        })?;
        let output = live::receiver(ends.take(PipeRole::Output)?)?;
        let job = Rc::new(Job {
            id: job_id,
            command,
            pid,
            started_at,
            finished_at: Cell::new(None),
            exit: Cell::new(None),
            bytes: Cell::new(output_bytes),
            dropped: Cell::new(dropped_bytes),
            log,
            pipe_inodes: vec![
                nix::sys::stat::fstat(&output)
                    .map(|s| s.st_ino)
                    .unwrap_or(0),
            ],
            attached: false,
        });
        self.next.set(self.next.get().max(n));
        self.map.borrow_mut().insert(n, job.clone());
        follow(job, file, output, exit);
        Ok(())
    }

    /// Starts `launch` as a job whose log is the caller's to write (an attached process's
    /// stderr): the job, its log, and the process.
    pub(crate) fn start_attached(
        &self,
        command: String,
        launch: &Launch<'_>,
        reaper: &Reaper,
    ) -> Result<(JobLog, Started), AgentError> {
        let (n, id, log, file) = self.open_slot()?;
        let started = spawn::start(launch, reaper).inspect_err(|_| {
            let _ = std::fs::remove_file(&log);
        })?;
        let job = self.register(n, id, command, &started, log, true);
        Ok((JobLog { job, file }, started))
    }

    pub(crate) fn status(
        &self,
        JobStatus {
            job_id,
            since_offset: since,
            max_bytes,
        }: JobStatus,
    ) -> Result<JobInfo, AgentError> {
        let job = self.find(&job_id).ok_or_else(|| unknown(&job_id))?;
        let mut info = job.info();
        let total = job.bytes.get();
        let dropped = job.dropped.get();
        let offset = since.clamp(dropped, total);
        let want = (total - offset).min(max_bytes) as usize;
        let mut data = vec![0u8; want];
        let read = safe_open::read_own(&job.log)
            .and_then(|mut f| {
                f.seek(SeekFrom::Start(offset - dropped))?;
                let mut got = 0;
                while got < want {
                    match f.read(&mut data[got..])? {
                        0 => break,
                        n => got += n,
                    }
                }
                Ok(got)
            })
            .unwrap_or(0);
        data.truncate(read);
        // Do not split a UTF-8 character at the end of a page: leave it for the next one.
        if offset + (data.len() as u64) < total {
            let end = utf8_safe_end(&data);
            data.truncate(end);
        }
        info.output = Some(String::from_utf8_lossy(&data).into_owned());
        info.offset = offset;
        info.next_offset = offset + data.len() as u64;
        Ok(info)
    }

    pub(crate) fn kill(&self, KillJob { job_id }: KillJob) -> Result<JobInfo, AgentError> {
        let job = self.find(&job_id).ok_or_else(|| unknown(&job_id))?;
        if job.exit.get().is_none() {
            spawn::kill_group(job.pid);
            spawn::kill_pipe_holders(&job.pipe_inodes);
        }
        Ok(job.info())
    }

    pub(crate) fn list(&self) -> JobList {
        JobList {
            jobs: self.map.borrow().values().map(|j| j.info()).collect(),
        }
    }
}

/// A job's command as listed: its first 1000 characters, so 256 jobs always list in one frame.
/// Copies a job's output into its log and records its end.
fn follow(
    job: Rc<Job>,
    file: File,
    mut pipe: tokio::net::unix::pipe::Receiver,
    exit: tokio::sync::oneshot::Receiver<Exit>,
) {
    let mut log = JobLog {
        job: job.clone(),
        file,
    };
    tokio::task::spawn_local(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match pipe.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => log.append(&buf[..n]),
            }
        }
    });
    tokio::task::spawn_local(async move {
        let exit = exit.await.unwrap_or(Exit::Signal(libc::SIGKILL));
        job.exit.set(Some(exit));
        job.finished_at.set(Some(now_ms()));
    });
}

fn short_command(command: &str) -> String {
    match command.char_indices().nth(1000) {
        Some((cut, _)) => format!("{}…", &command[..cut]),
        None => command.to_string(),
    }
}

/// Where to cut `data` so it does not end inside a UTF-8 character (an incomplete trailing
/// sequence is left for the next page).
fn utf8_safe_end(data: &[u8]) -> usize {
    let len = data.len();
    for back in 1..=3.min(len) {
        let b = data[len - back];
        if b & 0xC0 != 0x80 {
            // A lead byte (or ASCII): how long its character is.
            let width = match b {
                0x00..=0x7F => 1,
                0xC0..=0xDF => 2,
                0xE0..=0xEF => 3,
                _ => 4,
            };
            return if width > back { len - back } else { len };
        }
    }
    len
}

/// A job's log as it is written: appended to, trimmed when it outgrows its limit, and the job's
/// end recorded.
pub(crate) struct JobLog {
    job: Rc<Job>,
    file: File,
}

impl JobLog {
    pub(crate) fn job_id(&self) -> &str {
        &self.job.id
    }

    pub(crate) fn pid(&self) -> i32 {
        self.job.pid
    }

    pub(crate) fn pipe_inodes(&self) -> &[u64] {
        &self.job.pipe_inodes
    }

    pub(crate) fn append(&mut self, data: &[u8]) {
        let job = &self.job;
        job.bytes.set(job.bytes.get() + data.len() as u64);
        if self.file.write_all(data).is_err() {
            // Disk full or the log was deleted: the writer must never block on it.
            return;
        }
        let kept = job.bytes.get() - job.dropped.get();
        if kept > LOG_LIMIT
            && let Ok(f) = trim(&job.log, kept / 2)
        {
            job.dropped.set(job.dropped.get() + kept / 2);
            self.file = f;
        }
    }

    pub(crate) fn finish(&self, exit: Exit) {
        self.job.exit.set(Some(exit));
        self.job.finished_at.set(Some(now_ms()));
    }
}

/// Drops the first `cut` bytes of a log; returns the new file, opened for appending. Not
/// `durable::write_atomically`: the log's directory is the sandbox's to write, so every open goes
/// through `safe_open` (no link followed out of the sandbox), and the kept half is streamed, not
/// held in memory.
fn trim(path: &Path, cut: u64) -> std::io::Result<File> {
    let tmp = path.with_extension("log.trim");
    {
        let mut src = safe_open::read_own(path)?;
        src.seek(SeekFrom::Start(cut))?;
        let mut dst = safe_open::recreate_own(&tmp)?;
        std::io::copy(&mut src, &mut dst)?;
    }
    std::fs::rename(&tmp, path)?;
    safe_open::append_own(path)
}
