//! Requests about the sandbox as a whole: is its agent there, kill every process but the agent,
//! and (unprivileged sandboxes) hand the engine sockets made in the sandbox's network namespace.

use serde::{Deserialize, Serialize};

/// Is the agent there, and which one is it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Ping {}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Pong {
    pub pid: u32,
    pub version: String,
}

/// Kill every process in the sandbox except the agent (after an OOM kill, say).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct KillAll {}

/// A request done, with nothing to report.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Done {}

/// Unprivileged sandboxes: the engine asks for the egress sockets the agent made in the
/// sandbox's network namespace. Before the reply frame, the agent sends one byte over the
/// connection, carrying the two descriptors (TCP listener, DNS socket) when it has them.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct HandOverEgress {}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct EgressHandover {
    /// Why the agent has no sockets to hand over (the kernel refused the rules, say).
    pub why_not: Option<String>,
}

/// Unprivileged sandboxes: a preview's way in. The agent connects to `127.0.0.1:port` in the
/// sandbox's namespace and passes the connected socket the same way as [`HandOverEgress`].
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ConnectPort {
    pub port: u16,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PortConnected {
    /// Nothing listens on the port.
    pub refused: bool,
    /// Another reason there is no connection.
    pub error: Option<String>,
}

call!(Ping(Ping) => Pong);
call!(HandOverEgress(HandOverEgress) => EgressHandover);
call!(ConnectPort(ConnectPort) => PortConnected);
call!(KillAll(KillAll) => Done);
