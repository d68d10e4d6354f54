//! The engine ↔ agent protocol: one request per connection, answered by frames.
//!
//! A frame is a 4-byte big-endian length and that many bytes of JSON. Each request is a type that
//! names its reply ([`Call::Reply`]); the agent answers with a [`Frame`] of that type — exec and
//! run_code may send `Output` frames before it — or with an `Error` frame. So an agent handler
//! that returned the wrong reply would not compile, and an agent that sent one anyway fails the
//! engine's decoding with one error. Byte payloads travel base64-encoded.
//!
//! Each module holds the requests of one resource with their replies and the `call!` lines
//! binding them; `frame` is the wire format and `call` the binding itself.

#[macro_use]
mod call;
mod attach;
mod code;
mod desktop;
mod exec;
mod files;
mod frame;
mod jobs;
pub mod keys;
mod live;
pub mod mux;
mod sandbox;
mod watch;

pub use attach::*;
pub use call::{Call, Request};
pub use code::*;
pub use desktop::*;
pub use exec::*;
pub use files::*;
pub use frame::*;
pub use jobs::*;
pub use live::*;
pub use sandbox::*;
pub use watch::*;
