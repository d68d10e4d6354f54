//! What an image says about itself: the `docker save` manifest, or the OCI index (nested ones
//! followed, this host's platform picked) and manifest, then the config; the plan of layers to
//! unpack that comes of them, every document and blob checked against the digest and size that
//! name it before it is used.
//!
//! Only sha256 digests are accepted, and a digest is checked to be 64 hex digits before it
//! becomes a blob's name, so no name built from one leaves `blobs/sha256/`.

use std::io::{self, Read};

use ring::digest;
use serde::Deserialize;
use serde::de::DeserializeOwned;

use sandbox_mcp_model::ids::hex;

use super::archive::{Store, clean};
use super::meter::Meter;
use super::{ImportError, io_err};

/// Largest manifest, index or config read: real ones are a few KiB.
const MAX_JSON: u64 = 4 << 20;
const MAX_LAYERS: usize = 128;
const MAX_INDEX_DEPTH: usize = 4;

/// The engine's platform in OCI terms.
pub(crate) fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

pub(crate) fn check_platform(os: &str, architecture: &str) -> Result<(), ImportError> {
    let host = host_arch();
    if os == "linux" && architecture == host {
        return Ok(());
    }
    Err(ImportError::Platform {
        image: format!("{os}/{architecture}"),
        host: format!("linux/{host}"),
    })
}

#[derive(Deserialize)]
pub(crate) struct Descriptor {
    #[serde(rename = "mediaType", default)]
    media_type: String,
    digest: String,
    size: u64,
    #[serde(default)]
    platform: Option<Platform>,
}

#[derive(Deserialize)]
struct Platform {
    #[serde(default)]
    os: String,
    #[serde(default)]
    architecture: String,
}

#[derive(Deserialize)]
struct Index {
    #[serde(default)]
    manifests: Vec<Descriptor>,
}

#[derive(Deserialize)]
struct Manifest {
    config: Descriptor,
    #[serde(default)]
    layers: Vec<Descriptor>,
}

/// One image of a `docker save` manifest.json.
#[derive(Deserialize)]
struct DockerImage {
    #[serde(rename = "Config")]
    config: String,
    #[serde(rename = "Layers", default)]
    layers: Vec<String>,
}

#[derive(Deserialize)]
pub(crate) struct Config {
    #[serde(default)]
    pub(crate) architecture: String,
    #[serde(default)]
    pub(crate) os: String,
    #[serde(default)]
    pub(crate) config: Option<RunConfig>,
    rootfs: RootFs,
}

#[derive(Deserialize, Default)]
pub(crate) struct RunConfig {
    #[serde(rename = "Env", default)]
    pub(crate) env: Option<Vec<String>>,
    #[serde(rename = "WorkingDir", default)]
    pub(crate) working_dir: Option<String>,
    #[serde(rename = "User", default)]
    pub(crate) user: Option<String>,
}

#[derive(Deserialize)]
struct RootFs {
    #[serde(default)]
    diff_ids: Vec<String>,
}

/// What to unpack, read and checked before anything is written.
pub(crate) struct Plan {
    pub(crate) config: Config,
    pub(crate) layers: Vec<LayerRef>,
}

pub(crate) struct LayerRef {
    /// Name of the blob in the store.
    pub(crate) name: String,
    /// "layer 2 (sha256:…)", for messages.
    pub(crate) label: String,
    /// The descriptor to verify the blob against before unpacking (OCI only).
    pub(crate) blob: Option<Descriptor>,
    /// sha256 of the uncompressed layer tar.
    pub(crate) diff_id: String,
}

pub(crate) fn docker_plan(store: &Store) -> Result<Plan, ImportError> {
    let images: Vec<DockerImage> = read_json(store, "manifest.json", "manifest.json", None)?;
    // Several images: the first one, as `docker load` would list it first.
    let Some(image) = images.into_iter().next() else {
        return Err(ImportError::Format(
            "manifest.json lists no image: save the image again".into(),
        ));
    };
    let what = format!("the image config {}", image.config);
    let expect = digest_in_name(&image.config);
    let config: Config = read_json(
        store,
        &image.config,
        &what,
        expect.as_deref().map(|d| (d, None)),
    )?;
    let diff_ids = check_layers(&config, image.layers.len(), "manifest.json")?;
    let layers = (image.layers.into_iter().zip(diff_ids).enumerate())
        .map(|(i, (name, diff_id))| LayerRef {
            name,
            label: format!("layer {i} ({diff_id})"),
            blob: None,
            diff_id,
        })
        .collect();
    Ok(Plan { config, layers })
}

pub(crate) fn oci_plan(store: &Store) -> Result<Plan, ImportError> {
    let index: Index = read_json(store, "index.json", "index.json", None)?;
    let chosen = choose(store, index, "index.json", 0)?;
    let manifest: Manifest = read_blob_json(store, &chosen, "the image manifest")?;
    let config: Config = read_blob_json(store, &manifest.config, "the image config")?;
    let diff_ids = check_layers(&config, manifest.layers.len(), "the image manifest")?;
    let mut layers = Vec::with_capacity(diff_ids.len());
    for (i, (descriptor, diff_id)) in manifest.layers.into_iter().zip(diff_ids).enumerate() {
        let label = format!("layer {i} ({})", descriptor.digest);
        layers.push(LayerRef {
            name: blob_name(&descriptor.digest, &label)?,
            label,
            blob: Some(descriptor),
            diff_id,
        });
    }
    Ok(Plan { config, layers })
}

/// Picks this host's manifest from an index, following nested indexes: the first whose platform
/// is linux on this architecture, else the first without a platform (its config is checked).
fn choose(
    store: &Store,
    mut index: Index,
    what: &str,
    depth: usize,
) -> Result<Descriptor, ImportError> {
    let host = host_arch();
    let fits = |d: &Descriptor| {
        (d.platform.as_ref()).is_some_and(|p| p.os == "linux" && p.architecture == host)
    };
    let pick = (index.manifests.iter().position(fits))
        .or_else(|| index.manifests.iter().position(|d| d.platform.is_none()));
    let Some(pick) = pick else {
        if index.manifests.is_empty() {
            return Err(ImportError::Format(format!(
                "{what} lists no image manifest: save the image again"
            )));
        }
        let offered: Vec<String> = (index.manifests.iter().filter_map(|d| d.platform.as_ref()))
            .map(|p| format!("{}/{}", p.os, p.architecture))
            .collect();
        return Err(ImportError::Platform {
            image: offered.join(", "),
            host: format!("linux/{host}"),
        });
    };
    let chosen = index.manifests.swap_remove(pick);
    let nested = matches!(
        chosen.media_type.as_str(),
        "application/vnd.oci.image.index.v1+json"
            | "application/vnd.docker.distribution.manifest.list.v2+json"
    );
    if !nested {
        return Ok(chosen);
    }
    if depth >= MAX_INDEX_DEPTH {
        return Err(ImportError::Format(format!(
            "the image's indexes nest more than {MAX_INDEX_DEPTH} deep: save the image again"
        )));
    }
    let inner: Index = read_blob_json(store, &chosen, "a nested image index")?;
    choose(
        store,
        inner,
        &format!("the image index {}", chosen.digest),
        depth + 1,
    )
}

/// The config's diff_ids, checked against the manifest's layer count.
fn check_layers(config: &Config, layers: usize, lister: &str) -> Result<Vec<String>, ImportError> {
    if layers > MAX_LAYERS {
        return Err(ImportError::Limit(format!(
            "the image has {layers} layers and at most {MAX_LAYERS} can be imported: squash it \
             (e.g. a multi-stage build that copies the result into one layer)"
        )));
    }
    let diff_ids = &config.rootfs.diff_ids;
    if diff_ids.len() != layers {
        return Err(ImportError::Format(format!(
            "the image config lists {} layer digests (rootfs.diff_ids) but {lister} lists {layers} \
             layers: the image is malformed; save it again",
            diff_ids.len()
        )));
    }
    for d in diff_ids {
        sha256_hex(d, "a layer of the image config (rootfs.diff_ids)")?;
    }
    Ok(diff_ids.clone())
}

/// The hex of a `sha256:` digest, the only algorithm accepted. Checking it is 64 hex digits also
/// makes `blobs/sha256/<hex>` a safe name.
fn sha256_hex<'a>(digest: &'a str, what: &str) -> Result<&'a str, ImportError> {
    match digest.split_once(':') {
        Some(("sha256", hex)) if is_hex64(hex) => Ok(hex),
        _ => Err(ImportError::Format(format!(
            "{what} has the digest {digest:?}, and only sha256 digests (`sha256:` and 64 lowercase \
             hex digits) are supported: re-save the image with sha256 digests"
        ))),
    }
}

fn is_hex64(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fn blob_name(digest: &str, what: &str) -> Result<String, ImportError> {
    Ok(format!("blobs/sha256/{}", sha256_hex(digest, what)?))
}

/// The digest a `docker save` name carries: `<hex>.json` (old docker) or `blobs/sha256/<hex>`.
fn digest_in_name(name: &str) -> Option<String> {
    let name = clean(name)?;
    let hex = (name.strip_prefix("blobs/sha256/"))
        .or_else(|| name.rsplit('/').next()?.strip_suffix(".json"))?;
    is_hex64(hex).then(|| format!("sha256:{hex}"))
}

fn read_blob_json<T: DeserializeOwned>(
    store: &Store,
    d: &Descriptor,
    what: &str,
) -> Result<T, ImportError> {
    let what = format!("{what} {}", d.digest);
    read_json(
        store,
        &blob_name(&d.digest, &what)?,
        &what,
        Some((&d.digest, Some(d.size))),
    )
}

/// Reads at most [`MAX_JSON`] bytes of JSON, checking `expect` (digest, size) when given.
fn read_json<T: DeserializeOwned>(
    store: &Store,
    name: &str,
    what: &str,
    expect: Option<(&str, Option<u64>)>,
) -> Result<T, ImportError> {
    let blob = store.blob(name, what)?;
    if blob.size > MAX_JSON {
        return Err(ImportError::Limit(format!(
            "{what} is {} bytes, larger than the 4 MiB any image needs: this is not an image the \
             engine can import",
            blob.size
        )));
    }
    if let Some((_, Some(size))) = expect {
        check_size(what, blob.size, size)?;
    }
    let mut bytes = Vec::new();
    (blob.reader.take(MAX_JSON))
        .read_to_end(&mut bytes)
        .map_err(io_err(format!(
            "read {what} from {}",
            store.source.display()
        )))?;
    if let Some((digest, _)) = expect {
        check_digest(what, digest, &sha256(&bytes))?;
    }
    serde_json::from_slice(&bytes).map_err(|e| {
        ImportError::Format(format!(
            "{what} is not what an image holds there ({e}): the image is malformed; save it again"
        ))
    })
}

/// Checks a blob's size and digest against its descriptor, before it is unpacked.
pub(crate) fn verify_blob(
    store: &Store,
    name: &str,
    d: &Descriptor,
    what: &str,
) -> Result<(), ImportError> {
    let blob = store.blob(name, what)?;
    check_size(what, blob.size, d.size)?;
    let mut meter = Meter::new(blob.reader, u64::MAX);
    io::copy(&mut meter, &mut io::sink()).map_err(io_err(format!(
        "read {what} from {}",
        store.source.display()
    )))?;
    check_digest(what, &d.digest, &meter.digest())
}

fn check_size(what: &str, actual: u64, expected: u64) -> Result<(), ImportError> {
    if actual == expected {
        return Ok(());
    }
    Err(ImportError::Integrity {
        what: what.to_string(),
        problem: format!("is {actual} bytes, but its descriptor says {expected}"),
    })
}

fn check_digest(what: &str, expected: &str, actual: &str) -> Result<(), ImportError> {
    if actual == expected {
        return Ok(());
    }
    Err(ImportError::Integrity {
        what: what.to_string(),
        problem: format!("has the digest {actual}, not {expected}, which names it"),
    })
}

pub(crate) fn sha256(bytes: &[u8]) -> String {
    format!(
        "sha256:{}",
        hex(digest::digest(&digest::SHA256, bytes).as_ref())
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
