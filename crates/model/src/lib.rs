//! The engine's domain, below everything that acts on it: what a sandbox is ([`record`]), how
//! ids look ([`ids`]), what the engine is configured with ([`config`]), and the seam between the
//! engine and the drivers that run sandboxes ([`driver`]). The engine's services and both drivers
//! (namespaces, Kubernetes) build on these types; none of them is in here.

pub mod addrs;
pub mod config;
pub mod driver;
pub mod ids;
pub mod record;

pub use record::{Binding, NetworkRules, Preview, Record, Shape, Snapshot, Status};

/// The built-in template every other (but an imported image) is layered on.
pub const BASE_TEMPLATE: &str = "base";
/// The built-in template of desktop sandboxes.
pub const DESKTOP_TEMPLATE: &str = "desktop";

/// Longest text from inside a sandbox that becomes part of an error message.
pub const MAX_SANDBOX_MESSAGE: usize = 2048;

/// Text from inside a sandbox cut to [`MAX_SANDBOX_MESSAGE`] bytes, saying how much was left out.
pub fn clip(text: &str) -> String {
    if text.len() <= MAX_SANDBOX_MESSAGE {
        return text.to_string();
    }
    let mut end = MAX_SANDBOX_MESSAGE;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… [{} more bytes]", &text[..end], text.len() - end)
}
