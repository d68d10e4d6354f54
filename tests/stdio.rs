//! The real binary over stdio: framing, protocol versions, bad input, shutdown.
//!
//! This file holds the client (the binary as a child process, JSON-RPC lines on its stdin and
//! stdout); the tests are by theme: [`protocol`] (versions, framing, bad input), [`engines`] (the
//! embedded, standalone and remote engines), [`lifecycle`] (exit, session sandboxes, the data dir)
//! and [`settings`] (help, RUST_LOG, flags).

use std::process::{Command, Stdio};

use serde_json::{Value, json};

use sandbox_mcp_testkit::engine::free_port;
use sandbox_mcp_testkit::stdio::JsonLines;

use crate::common::BIN;

mod engines;
mod lifecycle;
mod protocol;
mod settings;

/// The binary as a child process speaking JSON-RPC lines ([`JsonLines`], whose stdin, stdout
/// and child the tests reach through it), with what these tests ask of it.
struct Server(JsonLines);

impl std::ops::Deref for Server {
    type Target = JsonLines;
    fn deref(&self) -> &JsonLines {
        &self.0
    }
}

impl std::ops::DerefMut for Server {
    fn deref_mut(&mut self) -> &mut JsonLines {
        &mut self.0
    }
}

impl Server {
    fn spawn(envs: &[(&str, &str)]) -> Self {
        let mut cmd = Command::new(BIN);
        cmd.stderr(Stdio::null()); // debug logs would fill an unread pipe
        cmd.env_remove("SANDBOX_MCP_URL").env("RUST_LOG", "debug");
        for (k, v) in envs {
            cmd.env(k, v);
        }
        Self(JsonLines::spawn(&mut cmd))
    }

    /// A server whose control plane is a closed port: fine for anything but tool calls.
    fn offline() -> Self {
        let port = free_port();
        Self::spawn(&[("SANDBOX_MCP_URL", &format!("http://127.0.0.1:{port}"))])
    }

    fn send(&mut self, message: Value) {
        self.0.send(&message);
    }

    /// How many of the server's threads have this name (`/proc/PID/task/*/comm`).
    fn threads_named(&self, name: &str) -> usize {
        let tasks = std::fs::read_dir(format!("/proc/{}/task", self.child.id())).unwrap();
        tasks
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .filter(|comm| comm.trim_end() == name)
            .count()
    }

    /// The next line on stdout, which must be a JSON-RPC message.
    fn recv(&mut self) -> Value {
        let line = self.read_line();
        let value: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("stdout carried a non-JSON line {line:?}: {e}"));
        assert_eq!(value["jsonrpc"], "2.0", "{line}");
        value
    }

    fn initialize(&mut self, version: &str) -> Value {
        self.send(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}}}));
        let response = self.recv();
        self.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        response
    }

    fn close_and_wait(&mut self) -> std::process::ExitStatus {
        drop(self.stdin.take());
        crate::common::exit_within(&mut self.child, 20, "the server after stdin closed")
    }
}
