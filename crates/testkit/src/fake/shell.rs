//! The fake agent's commands: a tiny interpreter instead of `/bin/sh -c`, over the sandbox's
//! directory. Words split on blanks, with `'…'` and `"…"` quoting; commands joined by `;`, `&&`,
//! `||` or newlines; a command's output sent elsewhere with `> FILE`, `>> FILE` or `>&2`.
//!
//! Commands: `true`, `false`, `:`, `echo [-n] WORDS`, `cat FILES`, `printenv NAME`, `pwd`,
//! `cd DIR`, `ls [DIR]`, `mkdir [-p] DIRS`, `touch FILES`, `rm [-r] [-f] PATHS`, `sleep SECONDS`,
//! `exit [N]`; and three faults: `agent-crash` (the agent dies: the connection closes with no
//! reply), `agent-hang` (the agent stops answering: this command's reply never comes) and
//! `oom-kill` (the command is killed by the OOM killer: `SIGKILL`, counted in `oom_kills`). Any
//! other word ends with 127, as a shell's "not found".

use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite};

use sandbox_mcp_protocol::{AgentError, ErrorKind, ExecOutcome, ExecSpec, Stream, write_output};

use super::AgentContext;
use super::agent::{dead, hangup};
use super::files::{in_sandbox, resolve};

const SIGKILL: i32 = 9;

/// How a list of commands goes on after one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Join {
    Always,
    IfOk,
    IfFailed,
}

/// Where a command's output goes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    Stdout,
    Stderr,
    File { path: String, append: bool },
}

#[derive(Debug)]
struct Command {
    /// How it follows the command before it.
    join: Join,
    words: Vec<String>,
    output: Target,
}

/// How one command ended.
enum Ended {
    Status(i32),
    Exit(i32),
    Signal(i32),
    TimedOut,
    /// The agent died, or the engine hung up: no reply.
    Abandoned,
}

/// What a command run prints, so far.
#[derive(Default)]
struct Printed {
    stdout: String,
    stderr: String,
    /// How much of each was streamed already.
    streamed: [usize; 2],
}

/// Runs `spec`; `None` when no reply is to be sent (the agent died mid-command, or the engine
/// hung up, cancelling it).
pub(crate) async fn run<R, W>(
    ctx: &AgentContext,
    spec: ExecSpec,
    rd: &mut R,
    wr: &mut W,
) -> Option<Result<ExecOutcome, AgentError>>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + Duration::from_millis(spec.timeout_ms);
    let commands = match parse(&spec.command) {
        Ok(c) => c,
        Err(e) => return Some(Err(AgentError::new(ErrorKind::InvalidArgument, e))),
    };
    let mut shell = Shell {
        ctx,
        cwd: spec.cwd.clone().unwrap_or_else(|| ctx.workdir.clone()),
        env: ctx.env.iter().chain(&spec.env).cloned().collect(),
        printed: Printed::default(),
    };
    let (mut status, mut signal, mut timed_out) = (0, None, false);
    if ctx.inner.take_oom_next(&ctx.id) {
        ctx.inner.count_oom(&ctx.id);
        signal = Some(SIGKILL);
    }
    for command in &commands {
        if signal.is_some() {
            break;
        }
        let runs = match command.join {
            Join::Always => true,
            Join::IfOk => status == 0,
            Join::IfFailed => status != 0,
        };
        if !runs {
            continue;
        }
        match shell.one(command, deadline, rd).await {
            Ended::Status(s) => status = s,
            Ended::Exit(s) => {
                status = s;
                break;
            }
            Ended::Signal(s) => signal = Some(s),
            Ended::TimedOut => {
                timed_out = true;
                signal = Some(SIGKILL);
            }
            Ended::Abandoned => return None,
        }
        if spec.stream {
            shell.printed.stream(wr).await;
        }
    }
    let cap = spec.max_output_bytes as usize;
    let Printed { stdout, stderr, .. } = shell.printed;
    Some(Ok(ExecOutcome {
        exit_code: signal.is_none().then_some(status),
        signal,
        truncated: stdout.len() > cap || stderr.len() > cap,
        stdout_bytes: stdout.len() as u64,
        stderr_bytes: stderr.len() as u64,
        stdout: clip(stdout, cap),
        stderr: clip(stderr, cap),
        timed_out,
        duration_ms: started.elapsed().as_millis() as u64,
        stdout_file: None,
        stderr_file: None,
    }))
}

struct Shell<'a> {
    ctx: &'a AgentContext,
    cwd: String,
    env: Vec<(String, String)>,
    printed: Printed,
}

impl Shell<'_> {
    async fn one<R: AsyncRead + Unpin>(
        &mut self,
        command: &Command,
        deadline: tokio::time::Instant,
        rd: &mut R,
    ) -> Ended {
        let Some((name, args)) = command.words.split_first() else {
            return Ended::Status(0);
        };
        let mut out = String::new();
        let status = match name.as_str() {
            "true" | ":" => 0,
            "false" => 1,
            "exit" => {
                return Ended::Exit(args.first().and_then(|a| a.parse().ok()).unwrap_or(0));
            }
            "echo" => {
                let (newline, words) = match args.split_first() {
                    Some((n, rest)) if n == "-n" => (false, rest),
                    _ => (true, args),
                };
                out.push_str(&words.join(" "));
                if newline {
                    out.push('\n');
                }
                0
            }
            "pwd" => {
                out = format!("{}\n", self.cwd);
                0
            }
            "printenv" => match args
                .first()
                .and_then(|n| self.env.iter().rev().find(|(k, _)| k == n))
            {
                Some((_, v)) => {
                    out = format!("{v}\n");
                    0
                }
                None => 1,
            },
            "cd" => match self.path(args.first().map_or("/root", String::as_str)) {
                Some((host, inside)) if host.is_dir() => {
                    self.cwd = inside;
                    0
                }
                _ => self.fail(format!("cd: {}: No such directory", args.join(" "))),
            },
            "cat" => self.each(args, "cat", |host| {
                std::fs::read(host).map(|data| out.push_str(&String::from_utf8_lossy(&data)))
            }),
            "ls" => {
                let dir = args.first().map_or(".", String::as_str);
                self.each(&[dir.to_string()], "ls", |host| {
                    let mut names: Vec<String> = std::fs::read_dir(host)?
                        .flatten()
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .collect();
                    names.sort();
                    names.iter().for_each(|n| out.push_str(&format!("{n}\n")));
                    Ok(())
                })
            }
            "mkdir" => self.each(without_flags(args), "mkdir", |p| std::fs::create_dir_all(p)),
            "touch" => self.each(args, "touch", |host| {
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(host)
                    .map(drop)
            }),
            "rm" => {
                let force = args.iter().any(|a| a.starts_with('-') && a.contains('f'));
                let status = self.each(without_flags(args), "rm", |host| {
                    if std::fs::symlink_metadata(host)?.is_dir() {
                        std::fs::remove_dir_all(host)
                    } else {
                        std::fs::remove_file(host)
                    }
                });
                if force { 0 } else { status }
            }
            "sleep" => {
                let seconds: f64 = args.first().and_then(|a| a.parse().ok()).unwrap_or(0.0);
                let mut condition = self.ctx.condition.clone();
                return tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs_f64(seconds.max(0.0))) => {
                        Ended::Status(0)
                    }
                    () = tokio::time::sleep_until(deadline) => Ended::TimedOut,
                    () = dead(&mut condition) => Ended::Abandoned,
                    () = hangup(rd) => Ended::Abandoned,
                };
            }
            "agent-crash" => {
                self.ctx
                    .inner
                    .crash_generation(&self.ctx.id, self.ctx.generation);
                return Ended::Abandoned;
            }
            "agent-hang" => {
                self.ctx
                    .inner
                    .hang_generation(&self.ctx.id, self.ctx.generation);
                0
            }
            "oom-kill" => {
                self.ctx.inner.count_oom(&self.ctx.id);
                return Ended::Signal(SIGKILL);
            }
            other => {
                self.fail(format!("sh: 1: {other}: not found"));
                127
            }
        };
        if tokio::time::Instant::now() >= deadline {
            return Ended::TimedOut;
        }
        match self.send(out, &command.output) {
            Ok(()) => Ended::Status(status),
            Err(e) => Ended::Status(self.fail(e)),
        }
    }

    /// Sandbox path `path` from the working directory: (host path, sandbox path).
    fn path(&self, path: &str) -> Option<(std::path::PathBuf, String)> {
        resolve(&self.ctx.files, &self.cwd, path).ok()
    }

    /// Runs `f` on each of `paths`; 1 if any failed (each failure said on stderr).
    fn each(
        &mut self,
        paths: &[String],
        name: &str,
        mut f: impl FnMut(&std::path::Path) -> std::io::Result<()>,
    ) -> i32 {
        let mut status = 0;
        for path in paths {
            let done = match self.path(path) {
                Some((host, _)) => f(&host),
                None => Err(std::io::ErrorKind::InvalidInput.into()),
            };
            if let Err(e) = done {
                let why = match e.kind() {
                    std::io::ErrorKind::NotFound => "No such file or directory".to_string(),
                    _ => e.to_string(),
                };
                status = self.fail(format!("{name}: {path}: {why}"));
            }
        }
        status
    }

    /// Says `message` on stderr; the status of a failed command.
    fn fail(&mut self, message: String) -> i32 {
        self.printed.stderr.push_str(&message);
        self.printed.stderr.push('\n');
        1
    }

    /// Puts a command's output where it goes.
    fn send(&mut self, out: String, target: &Target) -> Result<(), String> {
        match target {
            Target::Stdout => self.printed.stdout.push_str(&out),
            Target::Stderr => self.printed.stderr.push_str(&out),
            Target::File { path, append } => {
                let inside = in_sandbox(&self.cwd, path).map_err(|e| e.message)?;
                let (host, _) = self.path(&inside).ok_or("bad path")?;
                let mut file = std::fs::OpenOptions::new();
                file.create(true).write(true);
                if *append {
                    file.append(true);
                } else {
                    file.truncate(true);
                }
                let written = file
                    .open(&host)
                    .and_then(|mut f| std::io::Write::write_all(&mut f, out.as_bytes()));
                written.map_err(|e| format!("sh: 1: cannot create {inside}: {e}"))?;
            }
        }
        Ok(())
    }
}

impl Printed {
    /// Sends what was printed since the last time as `Output` frames.
    async fn stream<W: AsyncWrite + Unpin>(&mut self, wr: &mut W) {
        for (i, (stream, text)) in [
            (Stream::Stdout, &self.stdout),
            (Stream::Stderr, &self.stderr),
        ]
        .into_iter()
        .enumerate()
        {
            if text.len() > self.streamed[i] {
                let _ = write_output(wr, stream, text[self.streamed[i]..].to_string()).await;
                self.streamed[i] = text.len();
            }
        }
    }
}

/// The arguments that are not flags.
fn without_flags(args: &[String]) -> &[String] {
    let flags = args.iter().take_while(|a| a.starts_with('-')).count();
    &args[flags..]
}

/// `text` cut to at most `cap` bytes, on a character boundary.
fn clip(mut text: String, cap: usize) -> String {
    if text.len() > cap {
        let mut end = cap;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

/// A piece of a command line.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Word(String),
    /// `;`, newline, `&&`, `||`, `>`, `>>` or `>&2` (never from quoted text).
    Op(&'static str),
}

/// Splits a command line into commands.
fn parse(line: &str) -> Result<Vec<Command>, String> {
    let mut commands = Vec::new();
    let mut current = Command {
        join: Join::Always,
        words: Vec::new(),
        output: Target::Stdout,
    };
    let mut tokens = tokenize(line)?.into_iter();
    while let Some(token) = tokens.next() {
        let join = match token {
            Token::Word(w) => {
                current.words.push(w);
                continue;
            }
            Token::Op(">&2") => {
                current.output = Target::Stderr;
                continue;
            }
            Token::Op(op @ (">" | ">>")) => {
                let Some(Token::Word(path)) = tokens.next() else {
                    return Err(format!("syntax error: {op} needs a file"));
                };
                current.output = Target::File {
                    path,
                    append: op == ">>",
                };
                continue;
            }
            Token::Op("&&") => Join::IfOk,
            Token::Op("||") => Join::IfFailed,
            Token::Op(_) => Join::Always,
        };
        let next = Command {
            join,
            words: Vec::new(),
            output: Target::Stdout,
        };
        commands.push(std::mem::replace(&mut current, next));
    }
    commands.push(current);
    Ok(commands)
}

/// Words (quotes removed) and operators.
fn tokenize(line: &str) -> Result<Vec<Token>, String> {
    let mut tokens = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        let op = match c {
            '\'' | '"' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some(q) if q == c => break,
                        Some(x) => w.push(x),
                        None => return Err(format!("syntax error: unterminated {c}")),
                    }
                }
                continue;
            }
            ' ' | '\t' => {
                tokens.extend(word.take().map(Token::Word));
                continue;
            }
            '\n' | ';' => ";",
            '&' if chars.next_if_eq(&'&').is_some() => "&&",
            '|' if chars.next_if_eq(&'|').is_some() => "||",
            '>' => {
                // `1>` is `>`.
                if word.as_deref() == Some("1") {
                    word = None;
                }
                if chars.next_if_eq(&'>').is_some() {
                    ">>"
                } else if chars.next_if_eq(&'&').is_some() {
                    if chars.next_if_eq(&'2').is_none() {
                        return Err("syntax error: of >&N only >&2 is understood".into());
                    }
                    ">&2"
                } else {
                    ">"
                }
            }
            _ => {
                word.get_or_insert_with(String::new).push(c);
                continue;
            }
        };
        tokens.extend(word.take().map(Token::Word));
        tokens.push(Token::Op(op));
    }
    tokens.extend(word.map(Token::Word));
    Ok(tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &str) -> Vec<Vec<String>> {
        parse(line).unwrap().into_iter().map(|c| c.words).collect()
    }

    #[test]
    fn commands_split_on_operators_and_quotes_keep_words_whole() {
        assert_eq!(
            words("echo 'a; b' && cat x;exit 3"),
            [vec!["echo", "a; b"], vec!["cat", "x"], vec!["exit", "3"]]
        );
        let joins: Vec<Join> = parse("a && b || c; d")
            .unwrap()
            .iter()
            .map(|c| c.join)
            .collect();
        assert_eq!(
            joins,
            [Join::Always, Join::IfOk, Join::IfFailed, Join::Always]
        );
        let c = parse("echo hi >> /root/f").unwrap();
        assert_eq!(
            c[0].output,
            Target::File {
                path: "/root/f".into(),
                append: true
            }
        );
        assert_eq!(parse("echo oops >&2").unwrap()[0].output, Target::Stderr);
        assert_eq!(words("echo a 1>f"), [vec!["echo", "a"]]);
        assert!(parse("echo 'open").is_err());
        assert!(parse("echo >").is_err());
    }
}
