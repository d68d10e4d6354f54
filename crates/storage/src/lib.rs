//! What sandboxes' files are made of, on the host: templates (stacks of read-only layers, the
//! built-in ones built from the host's userland), OCI images unpacked into layers without ever
//! following a link, and the diff of two sandbox filesystems, compared from outside.

pub mod diff;
pub mod oci;
pub mod templates;
pub mod workspace;
