//! A child process that speaks JSON-RPC one message per line on its stdin and stdout: the MCP
//! server over stdio, as the stdio tests drive it and the benchmarks time it. Dropping it leaves
//! the process alone; whoever needs it gone kills it.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use serde_json::Value;

pub struct JsonLines {
    pub child: Child,
    /// The server's stdin; `None` once taken to close it (its EOF).
    pub stdin: Option<ChildStdin>,
    pub stdout: BufReader<ChildStdout>,
}

impl JsonLines {
    /// Spawns `command` with its stdin and stdout piped here (its stderr as the caller set it).
    pub fn spawn(command: &mut Command) -> JsonLines {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        JsonLines {
            child,
            stdin,
            stdout,
        }
    }

    /// Writes `bytes` as they are (framing included) and flushes.
    pub fn send_raw(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(bytes).unwrap();
        stdin.flush().unwrap();
    }

    /// Writes `message` as one line.
    pub fn send(&mut self, message: &Value) {
        let mut line = serde_json::to_vec(message).unwrap();
        line.push(b'\n');
        self.send_raw(&line);
    }

    /// The next line on stdout, its newline included; empty at EOF.
    pub fn read_line(&mut self) -> String {
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line
    }
}
