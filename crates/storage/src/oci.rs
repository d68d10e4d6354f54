//! Importing OCI images: a `docker save` tarball, an OCI archive (a tar of an OCI image layout)
//! or an OCI image layout directory becomes one directory per layer, to be stacked as overlayfs
//! lower layers (always mounted with `userxattr`).
//!
//! Invariants:
//! - Nothing is written outside `<work>/layers/<i>/`. The unpacking runs as root on the host while
//!   the image is untrusted, so every entry path is normalised lexically (`..` refused), every
//!   parent is checked with `symlink_metadata` to be a real directory of this layer, and files are
//!   created with `O_CREAT | O_EXCL | O_NOFOLLOW`: no symlink is ever followed while writing.
//! - Every byte unpacked is covered by a sha256 the image names: descriptors' digests are checked
//!   before a blob is used, and each layer's uncompressed stream against its `diff_id` while it is
//!   unpacked (a mismatch found at the end is still an error; the caller deletes `work`).
//! - Memory is bounded whatever the image says: JSON documents are at most 4 MiB, the tar metadata
//!   the tar crate holds in memory (long names, PAX records) at most 1 MiB per entry, and file
//!   data is streamed. Declared sizes count against [`Limits`] before any data is read.
//! - The layers carry no device, no setuid/setgid bit and no extended attribute from the image;
//!   the only xattr written is overlayfs's `user.overlay.opaque`, and the only device the 0:0
//!   whiteout overlayfs reads as "deleted".
//!
//! `image` reads what the image says (index, manifests, config, their digests) and picks this
//! host's platform; `archive` is the store its blobs are read from (a directory, or a tar read in
//! place); `unpack` writes one layer; `meter` hashes what is read and bounds what the tar crate
//! may buffer.

mod archive;
#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod fixture;
mod image;
mod meter;
mod unpack;

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use archive::Store;
use image::{check_platform, docker_plan, oci_plan, verify_blob};
use unpack::{Totals, Unpacker};

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    pub max_bytes: u64,
    pub max_files: u64,
}

impl Default for Limits {
    /// 8 GiB of file content (declared sizes, so sparse files count at their apparent size) and
    /// 500 000 entries, summed over all layers.
    fn default() -> Self {
        Limits {
            max_bytes: 8 << 30,
            max_files: 500_000,
        }
    }
}

#[derive(Debug)]
pub struct Image {
    /// Unpacked layer directories, bottom layer first: `<work>/layers/0`, `<work>/layers/1`, …
    pub layers: Vec<PathBuf>,
    /// The image config's `config.Env` split at the first '=' (entries without '=' skipped).
    pub env: Vec<(String, String)>,
    /// `config.WorkingDir` if non-empty.
    pub workdir: Option<String>,
    /// `config.User` if non-empty (as written: "1000", "1000:1000", "app", "app:staff").
    pub user: Option<String>,
    /// `config.Cmd`/`Entrypoint` are ignored.
    pub architecture: String,
    /// Bytes of file content written, summed over layers.
    pub bytes: u64,
    pub files: u64,
}

/// Why an image was not imported. Layers are named by index (from 0, bottom first, as in
/// `layers/<i>`) and digest; entries by their path in the layer.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// Not one of the accepted forms, or its metadata is missing or malformed.
    #[error("{0}")]
    Format(String),
    #[error(
        "the image is for {image}; this engine runs {host}: import the {host} variant of the image \
         (e.g. `docker pull --platform {host}` before `docker save`)"
    )]
    Platform { image: String, host: String },
    /// A digest or size differs from the one that names the blob.
    #[error("{what} {problem}: the image is corrupt or was altered; save or pull it again")]
    Integrity { what: String, problem: String },
    #[error("{layer} is truncated or corrupt ({detail}): save the image again")]
    Corrupt { layer: String, detail: String },
    #[error(
        "{layer} is zstd-compressed, and zstd layers are not supported yet: re-save the image \
         with gzip or uncompressed layers (`docker save` writes uncompressed ones; or \
         `skopeo copy --dest-compress-format gzip`)"
    )]
    Zstd { layer: String },
    /// An entry that unpacking must not create (it would write outside the layer, or is a
    /// device).
    #[error("{layer}: entry {entry} {why}; the image is refused (rebuild it without that entry)")]
    Unsafe {
        layer: String,
        entry: String,
        why: String,
    },
    #[error("{0}")]
    Limit(String),
    #[error("cannot {what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> ImportError {
    move |source| ImportError::Io {
        what: what.into(),
        source,
    }
}

fn corrupt(layer: &str) -> impl Fn(io::Error) -> ImportError + '_ {
    move |e| ImportError::Corrupt {
        layer: layer.to_string(),
        detail: e.to_string(),
    }
}

/// Imports the image at `source` (a `docker save` tarball, an OCI archive, or an OCI image layout
/// directory) into `work/layers/<i>/`. `work` is an existing empty directory; on error the caller
/// deletes it. With `chown` (the engine runs as root) files get their tar header's uid/gid
/// (clamped to 65534); otherwise they belong to the engine's user.
pub fn import(
    source: &Path,
    work: &Path,
    limits: &Limits,
    chown: bool,
) -> Result<Image, ImportError> {
    let store = Store::open(source)?;
    // docker ≥ 25 writes both files; manifest.json is what `docker load` reads.
    let plan = if store.has("manifest.json") {
        docker_plan(&store)?
    } else if store.has("index.json") {
        oci_plan(&store)?
    } else {
        return Err(not_an_image(
            source,
            "it holds neither manifest.json nor index.json, or it is truncated",
        ));
    };
    check_platform(&plan.config.os, &plan.config.architecture)?;

    let layers_dir = work.join("layers");
    fs::create_dir(&layers_dir).map_err(io_err(format!("create {}", layers_dir.display())))?;
    let mut totals = Totals::default();
    let mut layers = Vec::with_capacity(plan.layers.len());
    for (i, layer) in plan.layers.iter().enumerate() {
        if let Some(descriptor) = &layer.blob {
            verify_blob(&store, &layer.name, descriptor, &layer.label)?;
        }
        let root = layers_dir.join(i.to_string());
        fs::create_dir(&root).map_err(io_err(format!("create {}", root.display())))?;
        let blob = store.blob(&layer.name, &layer.label)?;
        Unpacker::new(&root, &layer.label, limits, chown, &mut totals).run(blob, &layer.diff_id)?;
        layers.push(root);
    }

    let run = plan.config.config.unwrap_or_default();
    let env = (run.env.unwrap_or_default().iter())
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Ok(Image {
        layers,
        env,
        workdir: run.working_dir.filter(|w| !w.is_empty()),
        user: run.user.filter(|u| !u.is_empty()),
        architecture: plan.config.architecture,
        bytes: totals.written,
        files: totals.entries,
    })
}

fn not_an_image(source: &Path, why: &str) -> ImportError {
    ImportError::Format(format!(
        "{} is not an image this engine can import ({why}): give a `docker save` tarball, an OCI \
         archive (a tar of an OCI image layout) or an OCI image layout directory",
        source.display()
    ))
}
