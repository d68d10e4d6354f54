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

use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::fs::{self, File, FileTimes, OpenOptions, Permissions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ring::digest;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use tar::EntryType;

use sandbox_mcp_model::ids::hex;
use sandbox_mcp_sys::layers;

/// Largest manifest, index or config read: real ones are a few KiB.
const MAX_JSON: u64 = 4 << 20;
const MAX_LAYERS: usize = 128;
/// Most tar metadata read in one place: the long names and PAX records before an entry (the tar
/// crate holds them in memory), or the padding after a layer's end-of-archive marker.
const MAX_META: u64 = 1 << 20;
/// Most entries indexed in an outer archive (a `docker save` has about four per layer).
const MAX_ARCHIVE_ENTRIES: usize = 100_000;
const MAX_INDEX_DEPTH: usize = 4;
/// Ids at or above `nobody` are clamped to it: they would fall outside the sandbox's id map.
const NOBODY: u64 = 65534;
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

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
        let unpacker = Unpacker {
            root: &root,
            label: &layer.label,
            limits,
            chown,
            totals: &mut totals,
            // The layer root is 0755 unless the layer says otherwise (`./`).
            dirs: vec![(PathBuf::new(), 0o755, None)],
            buf: vec![0; 256 << 10],
        };
        unpacker.run(blob, &layer.diff_id)?;
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

/// The engine's platform in OCI terms.
fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

fn check_platform(os: &str, architecture: &str) -> Result<(), ImportError> {
    let host = host_arch();
    if os == "linux" && architecture == host {
        return Ok(());
    }
    Err(ImportError::Platform {
        image: format!("{os}/{architecture}"),
        host: format!("linux/{host}"),
    })
}

// ---- Image metadata ----

#[derive(Deserialize)]
struct Descriptor {
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
struct Config {
    #[serde(default)]
    architecture: String,
    #[serde(default)]
    os: String,
    #[serde(default)]
    config: Option<RunConfig>,
    rootfs: RootFs,
}

#[derive(Deserialize, Default)]
struct RunConfig {
    #[serde(rename = "Env", default)]
    env: Option<Vec<String>>,
    #[serde(rename = "WorkingDir", default)]
    working_dir: Option<String>,
    #[serde(rename = "User", default)]
    user: Option<String>,
}

#[derive(Deserialize)]
struct RootFs {
    #[serde(default)]
    diff_ids: Vec<String>,
}

/// What to unpack, read and checked before anything is written.
struct Plan {
    config: Config,
    layers: Vec<LayerRef>,
}

struct LayerRef {
    /// Name of the blob in the store.
    name: String,
    /// "layer 2 (sha256:…)", for messages.
    label: String,
    /// The descriptor to verify the blob against before unpacking (OCI only).
    blob: Option<Descriptor>,
    /// sha256 of the uncompressed layer tar.
    diff_id: String,
}

fn docker_plan(store: &Store) -> Result<Plan, ImportError> {
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

fn oci_plan(store: &Store) -> Result<Plan, ImportError> {
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
fn verify_blob(store: &Store, name: &str, d: &Descriptor, what: &str) -> Result<(), ImportError> {
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

fn sha256(bytes: &[u8]) -> String {
    format!(
        "sha256:{}",
        hex(digest::digest(&digest::SHA256, bytes).as_ref())
    )
}

// ---- Reading the source ----

/// Where the image's files are read from: a directory, or an uncompressed tar read in place (its
/// entries indexed, never extracted).
struct Store {
    source: PathBuf,
    files: Files,
}

enum Files {
    Dir,
    Tar {
        file: File,
        index: HashMap<String, Node>,
    },
}

enum Node {
    Data {
        offset: u64,
        size: u64,
    },
    /// A symlink or hard link, as the archive name it points to.
    Link(String),
}

struct Blob<'a> {
    reader: Box<dyn Read + 'a>,
    size: u64,
}

impl Store {
    fn open(source: &Path) -> Result<Store, ImportError> {
        let read = || format!("read {}", source.display());
        let meta = fs::metadata(source).map_err(io_err(read()))?;
        if meta.is_dir() {
            return Ok(Store {
                source: source.to_path_buf(),
                files: Files::Dir,
            });
        }
        let mut file = File::open(source).map_err(io_err(read()))?;
        let mut head = [0; 512];
        let n = read_full(&mut file, &mut head).map_err(io_err(read()))?;
        if head.starts_with(&GZIP_MAGIC) {
            return Err(not_an_image(
                source,
                "it is gzip-compressed; decompress it first",
            ));
        }
        if !is_tar(&head[..n]) {
            return Err(not_an_image(source, "it is not a tar archive"));
        }
        file.rewind().map_err(io_err(read()))?;
        let index = index(source, &file)?;
        Ok(Store {
            source: source.to_path_buf(),
            files: Files::Tar { file, index },
        })
    }

    fn has(&self, name: &str) -> bool {
        match &self.files {
            Files::Dir => self.source.join(name).is_file(),
            Files::Tar { index, .. } => index.contains_key(name),
        }
    }

    fn blob(&self, name: &str, what: &str) -> Result<Blob<'_>, ImportError> {
        let missing = || {
            ImportError::Format(format!(
                "the image has no {name}, which {what} needs: it is incomplete or truncated; save \
                 it again"
            ))
        };
        let Some(clean_name) = clean(name) else {
            return Err(ImportError::Format(format!(
                "{what} is named {name}, which is outside the image: the image is malformed"
            )));
        };
        let read = || format!("read {name} from {}", self.source.display());
        match &self.files {
            Files::Dir => {
                let path = self.source.join(&clean_name);
                let file = match File::open(&path) {
                    Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(missing()),
                    other => other.map_err(io_err(read()))?,
                };
                let size = file.metadata().map_err(io_err(read()))?.len();
                Ok(Blob {
                    reader: Box::new(file),
                    size,
                })
            }
            Files::Tar { file, index } => {
                let mut name = clean_name;
                // Old `docker save` links a layer that appears twice to its first copy.
                for _ in 0..8 {
                    match index.get(&name) {
                        Some(Node::Link(target)) => name = target.clone(),
                        Some(&Node::Data { offset, size }) => {
                            let mut file = file;
                            file.seek(SeekFrom::Start(offset)).map_err(io_err(read()))?;
                            return Ok(Blob {
                                reader: Box::new(file.take(size)),
                                size,
                            });
                        }
                        None => break,
                    }
                }
                Err(missing())
            }
        }
    }
}

/// Indexes an outer tar: name → where its data lies in the file (or what it links to).
fn index(source: &Path, file: &File) -> Result<HashMap<String, Node>, ImportError> {
    let broken = |detail: String| {
        ImportError::Format(format!(
            "{} is truncated or corrupt ({detail}): save the image again",
            source.display()
        ))
    };
    let len = (file.metadata())
        .map_err(io_err(format!("read {}", source.display())))?
        .len();
    let meter = Meter::new(file, MAX_META);
    let budget = meter.budget.clone();
    let mut archive = tar::Archive::new(meter);
    let mut index = HashMap::new();
    let entries = archive
        .entries_with_seek()
        .map_err(|e| broken(e.to_string()))?;
    for entry in entries {
        let entry = entry.map_err(|e| broken(e.to_string()))?;
        budget.set(MAX_META);
        if index.len() >= MAX_ARCHIVE_ENTRIES {
            return Err(not_an_image(source, "it has over 100 000 entries"));
        }
        // JSON names only UTF-8 paths, so other names can never be asked for.
        let Ok(raw) = std::str::from_utf8(&entry.path_bytes()).map(str::to_string) else {
            continue;
        };
        let Some(name) = clean(&raw) else { continue };
        let kind = entry.header().entry_type();
        let link = || {
            entry
                .link_name_bytes()
                .and_then(|l| String::from_utf8(l.into_owned()).ok())
        };
        let node = match kind {
            EntryType::Regular | EntryType::Continuous => {
                let (offset, size) = (entry.raw_file_position(), entry.size());
                if offset.checked_add(size).is_none_or(|end| end > len) {
                    return Err(broken(format!(
                        "its entry {name} ends past the end of the file"
                    )));
                }
                Node::Data { offset, size }
            }
            EntryType::Symlink => {
                let Some(target) = link() else { continue };
                let base = name.rsplit_once('/').map_or("", |(dir, _)| dir);
                let joined = if target.starts_with('/') {
                    target
                } else {
                    format!("{base}/{target}")
                };
                let Some(target) = clean(&joined) else {
                    continue;
                };
                Node::Link(target)
            }
            EntryType::Link => {
                let Some(target) = link().as_deref().and_then(clean) else {
                    continue;
                };
                Node::Link(target)
            }
            _ => continue,
        };
        index.insert(name, node);
    }
    Ok(index)
}

/// An archive name made canonical: no leading `/` or `./`, no `.` or empty components, `..`
/// resolved; `None` if it climbs above the root.
fn clean(name: &str) -> Option<String> {
    let mut parts: Vec<&str> = Vec::new();
    for part in name.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            part => parts.push(part),
        }
    }
    Some(parts.join("/"))
}

/// Starts like a tar: a ustar/GNU header (every tool that writes images writes one), an
/// end-of-archive block (an empty layer), or nothing at all.
fn is_tar(head: &[u8]) -> bool {
    head.is_empty()
        || (head.len() == 512 && (&head[257..262] == b"ustar" || head.iter().all(|b| *b == 0)))
}

fn read_full(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match reader.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Passes reads through, hashing them, and fails once `budget` bytes have passed
/// since its owner last refilled it. The owner refills it with each entry's size plus
/// [`MAX_META`], so what the tar crate reads into memory between entries (long names, PAX
/// records) is bounded, whatever sizes a hostile archive declares.
struct Meter<R> {
    inner: R,
    sha: digest::Context,
    budget: Rc<Cell<u64>>,
}

impl<R> Meter<R> {
    /// A hashing meter with `budget` bytes to start with.
    fn new(inner: R, budget: u64) -> Self {
        Meter {
            inner,
            sha: digest::Context::new(&digest::SHA256),
            budget: Rc::new(Cell::new(budget)),
        }
    }

    /// `sha256:<hex>` of everything read so far.
    fn digest(&self) -> String {
        format!("sha256:{}", hex(self.sha.clone().finish().as_ref()))
    }
}

impl<R: Read> Read for Meter<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.budget.get();
        if left == 0 && !buf.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "more than 1 MiB of tar metadata, or of data after the end of the archive",
            ));
        }
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        self.budget.set(left - n as u64);
        self.sha.update(&buf[..n]);
        Ok(n)
    }
}

impl<R: Seek> Seek for Meter<R> {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        self.inner.seek(pos)
    }
}

// ---- Unpacking one layer ----

#[derive(Default)]
struct Totals {
    entries: u64,
    /// Declared sizes, counted before any data is read.
    declared: u64,
    written: u64,
}

struct Unpacker<'a> {
    root: &'a Path,
    label: &'a str,
    limits: &'a Limits,
    chown: bool,
    totals: &'a mut Totals,
    /// Directories' modes and mtimes, applied once the layer is complete (see `finish_dirs`).
    dirs: Vec<(PathBuf, u32, Option<SystemTime>)>,
    buf: Vec<u8>,
}

impl Unpacker<'_> {
    fn run(mut self, blob: Blob<'_>, diff_id: &str) -> Result<(), ImportError> {
        let label = self.label;
        let mut reader = blob.reader;
        let mut head = [0; 512];
        let n = read_full(&mut reader, &mut head).map_err(corrupt(label))?;
        let head = io::Cursor::new(head[..n].to_vec());
        // Compression is told by magic bytes: media types are often wrong in the wild.
        let stream: Box<dyn Read + '_> = if head.get_ref().starts_with(&GZIP_MAGIC) {
            // Multi-member streams are read whole, as docker's (Go's) gzip reader does.
            Box::new(flate2::read::MultiGzDecoder::new(head.chain(reader)))
        } else if head.get_ref().starts_with(&ZSTD_MAGIC) {
            return Err(ImportError::Zstd {
                layer: label.to_string(),
            });
        } else if is_tar(head.get_ref()) {
            Box::new(head.chain(reader))
        } else {
            return Err(ImportError::Format(format!(
                "{label} is neither a tar archive nor a gzip-compressed one (it starts with {}): \
                 only uncompressed and gzip layers can be imported; re-save the image",
                hex(&head.get_ref()[..n.min(4)])
            )));
        };

        let meter = Meter::new(stream, MAX_META);
        let budget = meter.budget.clone();
        let mut archive = tar::Archive::new(meter);
        for entry in archive.entries().map_err(corrupt(label))? {
            let mut entry = entry.map_err(corrupt(label))?;
            budget.set(entry.size().saturating_add(MAX_META));
            self.entry(&mut entry)?;
        }
        // diff_id covers the whole stream, padding after the end-of-archive marker included.
        let mut meter = archive.into_inner();
        budget.set(MAX_META);
        io::copy(&mut meter, &mut io::sink()).map_err(corrupt(label))?;
        let actual = meter.digest();
        if actual != diff_id {
            return Err(ImportError::Integrity {
                what: label.to_string(),
                problem: format!(
                    "unpacks to {actual}, not to {diff_id}, the diff_id its config gives"
                ),
            });
        }
        self.finish_dirs()
    }

    fn refuse(&self, entry: &str, why: impl Into<String>) -> ImportError {
        ImportError::Unsafe {
            layer: self.label.to_string(),
            entry: entry.to_string(),
            why: why.into(),
        }
    }

    fn entry<R: Read>(&mut self, entry: &mut tar::Entry<'_, R>) -> Result<(), ImportError> {
        let label = self.label;
        let header = entry.header();
        let kind = header.entry_type();
        let raw = entry.path_bytes().into_owned();
        let shown = String::from_utf8_lossy(&raw).into_owned();

        self.totals.entries += 1;
        if self.totals.entries > self.limits.max_files {
            return Err(ImportError::Limit(format!(
                "the image holds more than {} files and directories (the import limit; {label} \
                 passed it): use a smaller image",
                self.limits.max_files
            )));
        }
        // Counted before any data is read, so a 10 GB entry is refused without writing a byte.
        // A sparse file counts at its apparent size: that is what reading it in the sandbox costs.
        let mut size = entry.size();
        if kind.is_gnu_sparse() {
            let real = header.as_gnu().map(|g| g.real_size()).transpose();
            size = size.max(real.map_err(corrupt(label))?.unwrap_or(0));
        }
        self.totals.declared = self.totals.declared.saturating_add(size);
        if self.totals.declared > self.limits.max_bytes {
            return Err(ImportError::Limit(format!(
                "the image holds more than {} of files (the import limit; entry {shown} of {label} \
                 passed it): use a smaller image",
                human(self.limits.max_bytes)
            )));
        }
        // Metadata the tar crate has applied already, or that carries nothing we keep (global
        // PAX records, volume labels).
        if matches!(
            kind,
            EntryType::XGlobalHeader
                | EntryType::XHeader
                | EntryType::GNULongName
                | EntryType::GNULongLink
        ) || kind.as_byte() == b'V'
        {
            return Ok(());
        }

        let rel = entry_path(&raw).map_err(|why| self.refuse(&shown, why))?;
        let Some(name) = rel.file_name() else {
            // The image root itself: only its mode (and owner) can be taken.
            return match kind {
                EntryType::Directory => self.dir(header, &rel, &shown),
                _ => Ok(()),
            };
        };
        if let Some(hidden) = name.as_bytes().strip_prefix(b".wh.") {
            // Whiteouts, whatever their entry type (OCI image spec, "Whiteouts").
            return match hidden {
                b".wh..opq" => self.opaque(&rel, &shown),
                // Other `.wh..wh.` names are aufs bookkeeping, as docker skips them.
                h if h.starts_with(b".wh.") => Ok(()),
                b"" | b"." | b".." => Err(self.refuse(&shown, "is a whiteout that names no file")),
                h => self.whiteout(&rel.with_file_name(OsStr::from_bytes(h)), &shown),
            };
        }
        match kind {
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
                self.file(entry, &rel, &shown)
            }
            EntryType::Directory => self.dir(header, &rel, &shown),
            EntryType::Symlink => self.symlink(entry, &rel, &shown),
            EntryType::Link => self.hard_link(entry, &rel, &shown),
            EntryType::Fifo => self.fifo(header, &rel, &shown),
            EntryType::Char | EntryType::Block => {
                Err(self.refuse(&shown, "is a device node, and images may not carry devices"))
            }
            other => Err(self.refuse(
                &shown,
                format!(
                    "has the tar entry type {:?}, which this importer does not know",
                    other.as_byte() as char
                ),
            )),
        }
    }

    /// Makes every parent of `rel` a real directory of this layer (creating missing ones), then
    /// clears `rel` for the new entry: later entries replace earlier ones, as in docker. Returns
    /// the host path and whether a directory is kept there (only when `dir`).
    fn prepare(
        &mut self,
        rel: &Path,
        shown: &str,
        dir: bool,
    ) -> Result<(PathBuf, bool), ImportError> {
        let mut host = self.root.to_path_buf();
        let mut walked = PathBuf::new();
        for part in rel.parent().into_iter().flat_map(Path::iter) {
            host.push(part);
            walked.push(part);
            match fs::symlink_metadata(&host) {
                Ok(m) if m.is_dir() => {}
                // Writing through a symlink could reach any path on the host.
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(self.refuse(
                        shown,
                        format!("writes through the symlink {}", walked.display()),
                    ));
                }
                Ok(_) => {
                    return Err(self.refuse(
                        shown,
                        format!(
                            "needs {} to be a directory, but it is not",
                            walked.display()
                        ),
                    ));
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    (fs::DirBuilder::new().mode(0o700))
                        .create(&host)
                        .map_err(io_err(format!("create {}", host.display())))?;
                    // 0755 like docker's, set in `finish_dirs` (mkdir's mode is under the umask).
                    self.dirs.push((walked.clone(), 0o755, None));
                }
                Err(e) => return Err(io_err(format!("read {}", host.display()))(e)),
            }
        }
        let path = self.root.join(rel);
        let cleared = match fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() && dir => return Ok((path, true)),
            // remove_dir_all does not follow symlinks inside the tree it removes.
            Ok(m) if m.is_dir() => fs::remove_dir_all(&path),
            Ok(_) => fs::remove_file(&path),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        };
        cleared.map_err(io_err(format!("replace {}", path.display())))?;
        Ok((path, false))
    }

    /// What `rel` is in this layer, reached without passing through a symlink (`None` if it is
    /// missing or only reachable through one).
    fn lookup(&self, rel: &Path) -> Result<Option<fs::FileType>, ImportError> {
        let mut host = self.root.to_path_buf();
        for part in rel.iter() {
            if !fs::symlink_metadata(&host).is_ok_and(|m| m.is_dir()) {
                return Ok(None);
            }
            host.push(part);
        }
        match fs::symlink_metadata(&host) {
            Ok(m) => Ok(Some(m.file_type())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err(format!("read {}", host.display()))(e)),
        }
    }

    fn file<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        rel: &Path,
        shown: &str,
    ) -> Result<(), ImportError> {
        let (path, _) = self.prepare(rel, shown, false)?;
        let write = || format!("write {}", path.display());
        // O_EXCL fails rather than open whatever is at `path`; O_NOFOLLOW says it twice.
        let mut file = (OpenOptions::new().write(true).create_new(true).mode(0o600))
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .map_err(io_err(write()))?;
        let mut len = 0u64;
        loop {
            let n = entry.read(&mut self.buf).map_err(corrupt(self.label))?;
            if n == 0 {
                break;
            }
            let chunk = &self.buf[..n];
            // Zero runs become holes, so sparse files stay sparse on disk.
            let done = if chunk.iter().all(|b| *b == 0) {
                file.seek(SeekFrom::Current(n as i64)).map(drop)
            } else {
                file.write_all(chunk)
            };
            done.map_err(io_err(write()))?;
            len += n as u64;
        }
        if len != entry.size() {
            // The stream ended inside the entry's data.
            return Err(ImportError::Corrupt {
                layer: self.label.to_string(),
                detail: format!(
                    "the data of {shown} ends after {len} of {} bytes",
                    entry.size()
                ),
            });
        }
        file.set_len(len).map_err(io_err(write()))?;
        self.totals.written += len;
        let header = entry.header();
        if self.chown {
            let (uid, gid) = owner(header).map_err(corrupt(self.label))?;
            std::os::unix::fs::fchown(&file, Some(uid), Some(gid)).map_err(io_err(write()))?;
        }
        // After chown, which clears setuid/setgid anyway.
        let mode = mode(header).map_err(corrupt(self.label))?;
        file.set_permissions(Permissions::from_mode(mode))
            .map_err(io_err(write()))?;
        if let Some(t) = mtime(header) {
            let times = FileTimes::new().set_accessed(t).set_modified(t);
            file.set_times(times).map_err(io_err(write()))?;
        }
        Ok(())
    }

    fn dir(&mut self, header: &tar::Header, rel: &Path, shown: &str) -> Result<(), ImportError> {
        let (path, kept) = self.prepare(rel, shown, true)?;
        let write = || format!("create {}", path.display());
        if !kept {
            // Owner-writable until `finish_dirs`, so its entries can be written.
            fs::DirBuilder::new()
                .mode(0o700)
                .create(&path)
                .map_err(io_err(write()))?;
        }
        self.own(&path, header)?;
        let mode = mode(header).map_err(corrupt(self.label))?;
        self.dirs.push((rel.to_path_buf(), mode, mtime(header)));
        Ok(())
    }

    fn symlink<R: Read>(
        &mut self,
        entry: &tar::Entry<'_, R>,
        rel: &Path,
        shown: &str,
    ) -> Result<(), ImportError> {
        let target = entry.link_name_bytes().filter(|t| !t.is_empty());
        let Some(target) = target else {
            return Err(self.refuse(shown, "is a symlink without a target"));
        };
        let (path, _) = self.prepare(rel, shown, false)?;
        // Any target is fine: it resolves inside the sandbox's root, and nothing here follows it.
        std::os::unix::fs::symlink(OsStr::from_bytes(&target), &path)
            .map_err(io_err(format!("create {}", path.display())))?;
        self.own(&path, entry.header())
    }

    fn hard_link<R: Read>(
        &mut self,
        entry: &tar::Entry<'_, R>,
        rel: &Path,
        shown: &str,
    ) -> Result<(), ImportError> {
        let raw = entry.link_name_bytes().unwrap_or_default();
        let target_shown = String::from_utf8_lossy(&raw).into_owned();
        let target = entry_path(&raw).map_err(|why| {
            self.refuse(
                shown,
                format!("is a hard link to {target_shown}, which {why}"),
            )
        })?;
        if target == rel {
            return Ok(());
        }
        let (path, _) = self.prepare(rel, shown, false)?;
        // Only a file this layer wrote: a link to anything else could pull a host file (or one
        // reached through a symlink) into the image.
        if !self.lookup(&target)?.is_some_and(|t| t.is_file()) {
            return Err(self.refuse(
                shown,
                format!("is a hard link to {target_shown}, which is not a file of this layer"),
            ));
        }
        // std's hard_link is linkat without AT_SYMLINK_FOLLOW.
        fs::hard_link(self.root.join(&target), &path)
            .map_err(io_err(format!("create {}", path.display())))
    }

    fn fifo(&mut self, header: &tar::Header, rel: &Path, shown: &str) -> Result<(), ImportError> {
        let (path, _) = self.prepare(rel, shown, false)?;
        let write = || format!("create {}", path.display());
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .map_err(|e| io_err(write())(e.into()))?;
        self.own(&path, header)?;
        // `path` is the FIFO just made and its parents real directories: chmod follows nothing.
        let mode = mode(header).map_err(corrupt(self.label))?;
        fs::set_permissions(&path, Permissions::from_mode(mode)).map_err(io_err(write()))
    }

    /// `dir/.wh.NAME`: an overlayfs whiteout (a 0:0 character device, which the kernel lets
    /// anyone make since 5.8) hides NAME of the layers below.
    fn whiteout(&mut self, rel: &Path, shown: &str) -> Result<(), ImportError> {
        let (path, _) = self.prepare(rel, shown, false)?;
        layers::whiteout(&path).map_err(io_err(format!("create the whiteout {}", path.display())))
    }

    /// `dir/.wh..wh..opq`: `dir` hides everything below it in lower layers. overlayfs mounted
    /// with `userxattr` reads `user.overlay.opaque`.
    fn opaque(&mut self, rel: &Path, shown: &str) -> Result<(), ImportError> {
        // Creates the marker's parents, `dir` included.
        self.prepare(rel, shown, false)?;
        let dir = self.root.join(rel.parent().unwrap_or(Path::new("")));
        layers::mark_opaque(&dir).map_err(io_err(format!(
            "mark {} opaque (the filesystem under the work dir must support user xattrs)",
            dir.display()
        )))
    }

    fn own(&self, path: &Path, header: &tar::Header) -> Result<(), ImportError> {
        if !self.chown {
            return Ok(());
        }
        let (uid, gid) = owner(header).map_err(corrupt(self.label))?;
        std::os::unix::fs::lchown(path, Some(uid), Some(gid))
            .map_err(io_err(format!("chown {}", path.display())))
    }

    /// Applies directory modes and mtimes last: a read-only directory (0555) would otherwise stop
    /// an unprivileged engine writing its entries, and each entry written bumps its mtime. Later
    /// entries win; children go before parents; a directory a later entry replaced is skipped, and
    /// each is opened with O_NOFOLLOW, so no chmod lands through a symlink.
    fn finish_dirs(&mut self) -> Result<(), ImportError> {
        let mut seen = HashSet::new();
        for (rel, mode, mtime) in std::mem::take(&mut self.dirs).into_iter().rev() {
            if !seen.insert(rel.clone()) || !self.lookup(&rel)?.is_some_and(|t| t.is_dir()) {
                continue;
            }
            let path = self.root.join(&rel);
            let write = || format!("set the mode of {}", path.display());
            let dir = (OpenOptions::new().read(true))
                .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&path)
                .map_err(io_err(write()))?;
            dir.set_permissions(Permissions::from_mode(mode))
                .map_err(io_err(write()))?;
            if let Some(t) = mtime {
                let times = FileTimes::new().set_accessed(t).set_modified(t);
                dir.set_times(times).map_err(io_err(write()))?;
            }
        }
        Ok(())
    }
}

/// An entry path relative to the layer root: `./` and `/` prefixes stripped (an absolute name
/// means the same file of the image root), `.` and empty components dropped; any `..` refused,
/// since nothing may be reached outside the layer.
fn entry_path(raw: &[u8]) -> Result<PathBuf, &'static str> {
    let mut path = PathBuf::new();
    for part in raw.split(|b| *b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => return Err("leaves the image root"),
            part if part.contains(&0) => return Err("has a NUL byte in its name"),
            part => path.push(OsStr::from_bytes(part)),
        }
    }
    Ok(path)
}

/// The permission bits kept: setuid and setgid are dropped (a setuid binary would be a way up
/// for whoever runs in the sandbox); sticky stays.
fn mode(header: &tar::Header) -> io::Result<u32> {
    Ok(header.mode()? & 0o1777)
}

fn owner(header: &tar::Header) -> io::Result<(u32, u32)> {
    let clamp = |id: u64| id.min(NOBODY) as u32;
    Ok((clamp(header.uid()?), clamp(header.gid()?)))
}

fn mtime(header: &tar::Header) -> Option<SystemTime> {
    UNIX_EPOCH.checked_add(Duration::from_secs(header.mtime().ok()?))
}

fn human(n: u64) -> String {
    for (unit, name) in [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")] {
        if n >= unit && n.is_multiple_of(unit) {
            return format!("{} {name}", n / unit);
        }
    }
    format!("{n} bytes")
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use serde_json::{Value, json};
    use std::os::unix::fs::{FileTypeExt, MetadataExt};

    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Form {
        Docker,
        OciArchive,
        OciLayout,
    }

    const MTIME: u64 = 1_700_000_000;

    /// A layer tar written header by header, names as raw bytes: the tar crate's `set_path`
    /// refuses the hostile ones (`..`, absolute) these tests need.
    struct Layer(tar::Builder<Vec<u8>>);

    impl Layer {
        fn new() -> Self {
            Layer(tar::Builder::new(Vec::new()))
        }

        fn raw(
            mut self,
            kind: EntryType,
            name: &[u8],
            link: &[u8],
            mode: u32,
            data: &[u8],
            edit: impl FnOnce(&mut tar::Header),
        ) -> Self {
            let mut h = tar::Header::new_gnu();
            h.as_old_mut().name[..name.len()].copy_from_slice(name);
            h.as_old_mut().linkname[..link.len()].copy_from_slice(link);
            h.set_entry_type(kind);
            h.set_mode(mode);
            h.set_size(data.len() as u64);
            h.set_mtime(MTIME);
            h.set_uid(0);
            h.set_gid(0);
            edit(&mut h);
            h.set_cksum();
            self.0.append(&h, data).unwrap();
            self
        }

        fn file(self, name: &str, data: &[u8], mode: u32) -> Self {
            self.raw(EntryType::Regular, name.as_bytes(), b"", mode, data, |_| {})
        }

        fn dir(self, name: &str, mode: u32) -> Self {
            self.raw(
                EntryType::Directory,
                name.as_bytes(),
                b"",
                mode,
                b"",
                |_| {},
            )
        }

        fn symlink(self, name: &str, target: &str) -> Self {
            let (name, target) = (name.as_bytes(), target.as_bytes());
            self.raw(EntryType::Symlink, name, target, 0o777, b"", |_| {})
        }

        fn link(self, name: &str, target: &str) -> Self {
            let (name, target) = (name.as_bytes(), target.as_bytes());
            self.raw(EntryType::Link, name, target, 0o644, b"", |_| {})
        }

        fn bytes(self) -> Vec<u8> {
            self.0.into_inner().unwrap()
        }
    }

    fn gz(bytes: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(bytes).unwrap();
        e.finish().unwrap()
    }

    /// Bytes that do not compress, so a cut lands inside a file's data.
    fn noise(len: usize) -> Vec<u8> {
        let mut x = 0x2545_f491_u32;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect()
    }

    /// An outer archive; `dot` prefixes names with `./`, as `tar -C layout .` does.
    fn tar_of(files: &[(String, Vec<u8>)], dot: bool) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, data) in files {
            let mut h = tar::Header::new_ustar();
            let name = if dot {
                format!("./{name}")
            } else {
                name.clone()
            };
            h.set_path(&name).unwrap();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append(&h, &data[..]).unwrap();
        }
        b.into_inner().unwrap()
    }

    fn hex_of(bytes: &[u8]) -> String {
        sha256(bytes)["sha256:".len()..].to_string()
    }

    /// Writes an image of `layers` (layer tars) under `dir` in `form`, with real digests and
    /// diff_ids; the keys of `config` replace the default config's.
    fn image(dir: &Path, form: Form, layers: Vec<Vec<u8>>, gzip: bool, config: Value) -> PathBuf {
        let diff_ids: Vec<String> = layers.iter().map(|l| sha256(l)).collect();
        let mut cfg = json!({
            "architecture": host_arch(),
            "os": "linux",
            "config": {
                "Env": ["PATH=/usr/bin:/bin", "EQ=a=b", "NOEQUALS"],
                "WorkingDir": "/app",
                "User": "1000:1000",
                "Cmd": ["sh"],
            },
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        });
        if let (Some(cfg), Value::Object(over)) = (cfg.as_object_mut(), config) {
            cfg.extend(over);
        }
        let config_bytes = serde_json::to_vec(&cfg).unwrap();
        let blobs: Vec<Vec<u8>> = (layers.into_iter())
            .map(|l| if gzip { gz(&l) } else { l })
            .collect();
        let mut files = Vec::new();
        if form == Form::Docker {
            let names: Vec<String> = (0..blobs.len()).map(|i| format!("{i}/layer.tar")).collect();
            let config_name = format!("{}.json", hex_of(&config_bytes));
            files.extend(names.iter().cloned().zip(blobs));
            files.push((config_name.clone(), config_bytes));
            let manifest = json!([{"Config": config_name, "RepoTags": ["t:1"], "Layers": names}]);
            files.push((
                "manifest.json".into(),
                serde_json::to_vec(&manifest).unwrap(),
            ));
        } else {
            let desc = |media: &str, b: &[u8]| json!({"mediaType": media, "digest": sha256(b), "size": b.len()});
            let media = "application/vnd.oci.image.layer.v1.tar";
            let manifest = json!({
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": desc("application/vnd.oci.image.config.v1+json", &config_bytes),
                "layers": blobs.iter().map(|b| desc(media, b)).collect::<Vec<_>>(),
            });
            let manifest_bytes = serde_json::to_vec(&manifest).unwrap();
            let mut m = desc(
                "application/vnd.oci.image.manifest.v1+json",
                &manifest_bytes,
            );
            m["platform"] = json!({"os": cfg["os"], "architecture": cfg["architecture"]});
            let index = json!({"schemaVersion": 2, "manifests": [m]});
            files.push((
                "oci-layout".into(),
                br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec(),
            ));
            files.push(("index.json".into(), serde_json::to_vec(&index).unwrap()));
            for b in [config_bytes, manifest_bytes].into_iter().chain(blobs) {
                files.push((format!("blobs/sha256/{}", hex_of(&b)), b));
            }
        }
        if form == Form::OciLayout {
            let root = dir.join("layout");
            for (name, data) in &files {
                let path = root.join(name);
                fs::create_dir_all(path.parent().unwrap()).unwrap();
                fs::write(path, data).unwrap();
            }
            return root;
        }
        let path = dir.join("image.tar");
        fs::write(&path, tar_of(&files, form == Form::OciArchive)).unwrap();
        path
    }

    struct Run {
        _tmp: tempfile::TempDir,
        work: PathBuf,
        result: Result<Image, ImportError>,
    }

    impl Run {
        fn layer(&self, i: usize) -> PathBuf {
            self.work.join("layers").join(i.to_string())
        }

        fn image(&self) -> &Image {
            self.result
                .as_ref()
                .unwrap_or_else(|e| panic!("import failed: {e}"))
        }

        fn error(&self) -> String {
            match &self.result {
                Ok(_) => panic!("the image was imported, but should have been refused"),
                Err(e) => e.to_string(),
            }
        }
    }

    fn import_source(tmp: tempfile::TempDir, source: &Path, limits: &Limits, chown: bool) -> Run {
        let work = tmp.path().join("work");
        fs::create_dir(&work).unwrap();
        let result = import(source, &work, limits, chown);
        Run {
            _tmp: tmp,
            work,
            result,
        }
    }

    fn run_with(
        form: Form,
        layers: Vec<Vec<u8>>,
        gzip: bool,
        config: Value,
        limits: &Limits,
        chown: bool,
    ) -> Run {
        let tmp = tempfile::tempdir().unwrap();
        let source = image(tmp.path(), form, layers, gzip, config);
        import_source(tmp, &source, limits, chown)
    }

    fn run(layers: Vec<Vec<u8>>) -> Run {
        run_with(
            Form::Docker,
            layers,
            false,
            json!({}),
            &Limits::default(),
            false,
        )
    }

    fn mode_of(path: &Path) -> u32 {
        fs::symlink_metadata(path).unwrap().mode() & 0o7777
    }

    /// A PAX record, `<len> <key>=<value>\n`, whose length counts its own digits.
    fn pax(key: &str, value: &str) -> Vec<u8> {
        let body = format!(" {key}={value}\n");
        let mut len = body.len() + 1;
        while format!("{len}{body}").len() != len {
            len += 1;
        }
        format!("{len}{body}").into_bytes()
    }

    fn octal(field: &mut [u8], n: u64) {
        let digits = format!("{n:0w$o}\0", w = field.len() - 1);
        field.copy_from_slice(digits.as_bytes());
    }

    #[test]
    fn imports_each_form() {
        let forms = [
            (Form::Docker, false),
            (Form::OciArchive, true),
            (Form::OciLayout, false),
            (Form::OciLayout, true),
        ];
        for (form, gzip) in forms {
            let bottom = Layer::new()
                .dir("./", 0o755)
                .dir("etc", 0o755)
                .file("etc/hello", b"hello", 0o644)
                .dir("bin/", 0o755)
                .file("bin/tool", b"#!/bin/sh\n", 0o755)
                .symlink("bin/alias", "tool")
                .link("bin/same", "./bin/tool")
                .file("deep//./implicit/file", b"x", 0o600)
                .dir("private", 0o700)
                .raw(EntryType::Fifo, b"run/pipe", b"", 0o620, b"", |_| {})
                .raw(
                    EntryType::Regular,
                    b"caf\xe9",
                    b"",
                    0o644,
                    b"latin-1",
                    |_| {},
                )
                .bytes();
            let top = Layer::new()
                .file("./etc/hello", b"bye", 0o640)
                .dir("readonly", 0o555)
                .file("readonly/f", b"r", 0o444)
                .bytes();
            let run = run_with(
                form,
                vec![bottom, top],
                gzip,
                json!({}),
                &Limits::default(),
                false,
            );
            let image = run.image();
            assert_eq!(image.layers, vec![run.layer(0), run.layer(1)], "{form:?}");
            let (l0, l1) = (&image.layers[0], &image.layers[1]);
            assert_eq!(fs::read(l0.join("etc/hello")).unwrap(), b"hello");
            assert_eq!(fs::read(l1.join("etc/hello")).unwrap(), b"bye");
            assert_eq!(mode_of(&l1.join("etc/hello")), 0o640);
            assert_eq!(mode_of(&l0.join("bin/tool")), 0o755);
            assert_eq!(
                fs::read_link(l0.join("bin/alias")).unwrap(),
                Path::new("tool")
            );
            let ino = |p: &str| fs::symlink_metadata(l0.join(p)).unwrap().ino();
            assert_eq!(ino("bin/same"), ino("bin/tool"));
            assert_eq!(fs::read(l0.join("deep/implicit/file")).unwrap(), b"x");
            assert_eq!(mode_of(&l0.join("deep/implicit")), 0o755);
            assert_eq!(mode_of(&l0.join("private")), 0o700);
            assert_eq!(mode_of(&l1.join("readonly")), 0o555);
            assert_eq!(fs::read(l1.join("readonly/f")).unwrap(), b"r");
            let pipe = fs::symlink_metadata(l0.join("run/pipe")).unwrap();
            assert!(pipe.file_type().is_fifo());
            assert_eq!(pipe.mode() & 0o7777, 0o620);
            assert_eq!(
                fs::read(l0.join(OsStr::from_bytes(b"caf\xe9"))).unwrap(),
                b"latin-1"
            );
            for p in ["etc/hello", "etc", "bin"] {
                let mtime = fs::symlink_metadata(l0.join(p)).unwrap().mtime();
                assert_eq!(mtime as u64, MTIME, "{p}");
            }

            let env = [("PATH", "/usr/bin:/bin"), ("EQ", "a=b")].map(|(k, v)| (k.into(), v.into()));
            assert_eq!(image.env, env);
            assert_eq!(image.workdir.as_deref(), Some("/app"));
            assert_eq!(image.user.as_deref(), Some("1000:1000"));
            assert_eq!(image.architecture, host_arch());
            assert_eq!(image.files, 11 + 3);
            assert_eq!(image.bytes, 5 + 10 + 1 + 7 + 3 + 1);
        }
    }

    #[test]
    fn old_docker_links_a_repeated_layer() {
        let layer = Layer::new().file("f", b"same", 0o644).bytes();
        let diff_id = sha256(&layer);
        let config = json!({"architecture": host_arch(), "os": "linux",
            "rootfs": {"type": "layers", "diff_ids": [diff_id, diff_id]}});
        let config = serde_json::to_vec(&config).unwrap();
        let manifest = json!([{"Config": "config.json", "Layers": ["a/layer.tar", "b/layer.tar"]}]);
        let mut b = tar::Builder::new(Vec::new());
        let mut add = |name: &str, data: &[u8], link: Option<&str>| {
            let mut h = tar::Header::new_ustar();
            h.set_path(name).unwrap();
            h.set_mode(0o644);
            h.set_size(data.len() as u64);
            if let Some(link) = link {
                h.set_entry_type(EntryType::Symlink);
                h.set_link_name(link).unwrap();
            }
            h.set_cksum();
            b.append(&h, data).unwrap();
        };
        add("a/layer.tar", &layer, None);
        add("b/layer.tar", b"", Some("../a/layer.tar"));
        add("config.json", &config, None);
        add(
            "manifest.json",
            &serde_json::to_vec(&manifest).unwrap(),
            None,
        );
        let tmp = tempfile::tempdir().unwrap();
        let source = tmp.path().join("image.tar");
        fs::write(&source, b.into_inner().unwrap()).unwrap();
        let run = import_source(tmp, &source, &Limits::default(), false);
        run.image();
        assert_eq!(fs::read(run.layer(1).join("f")).unwrap(), b"same");
        assert!(run.image().env.is_empty() && run.image().workdir.is_none());
    }

    #[test]
    fn whiteouts_and_opaque_directories() {
        let probe = tempfile::tempdir().unwrap();
        let xattrs = layers::mark_opaque(probe.path());
        let bottom = Layer::new()
            .file("a/gone", b"1", 0o644)
            .file("a/kept", b"1", 0o644)
            .file("a/link", b"1", 0o644)
            .file("d/old", b"2", 0o644)
            .file("s/x", b"3", 0o644)
            .bytes();
        let mut top = Layer::new()
            .file("a/.wh.gone", b"", 0o644)
            // A whiteout is one whatever its entry type, and never counts as a device.
            .symlink("a/.wh.link", "anything")
            .raw(EntryType::Char, b"s/.wh.x", b"", 0o600, b"", |_| {})
            .file(".wh.top", b"", 0o644);
        if xattrs.is_ok() {
            top = top
                .file("d/.wh..wh..opq", b"", 0o644)
                .file("d/new", b"3", 0o644);
        }
        let run = run(vec![bottom, top.bytes()]);
        run.image();
        let l1 = run.layer(1);
        for hidden in ["a/gone", "a/link", "s/x", "top"] {
            let meta = fs::symlink_metadata(l1.join(hidden)).unwrap();
            assert!(meta.file_type().is_char_device(), "{hidden}");
            assert_eq!(meta.rdev(), 0, "{hidden}");
        }
        assert!(!l1.join("a/.wh.gone").exists() && !l1.join("a/kept").exists());
        match xattrs {
            Ok(()) => {
                assert_eq!(
                    layers::get_xattr(&l1.join("d"), "user.overlay.opaque").as_deref(),
                    Some(&b"y"[..])
                );
                assert!(l1.join("d/new").is_file() && !l1.join("d/.wh..wh..opq").exists());
                assert_eq!(
                    layers::get_xattr(&run.layer(0).join("d"), "user.overlay.opaque"),
                    None
                );
            }
            Err(e) => eprintln!(
                "skipping the opaque-directory check: this filesystem refuses user xattrs ({e})"
            ),
        }
    }

    #[test]
    fn refuses_entries_that_leave_the_root() {
        for name in ["../../escaped", "a/../../../escaped", "./.."] {
            let run = run(vec![Layer::new().file(name, b"x", 0o644).bytes()]);
            let msg = run.error();
            assert!(
                msg.contains(&format!("entry {name} leaves the image root")),
                "{msg}"
            );
            assert!(!run.work.join("escaped").exists());
            assert!(!run.work.parent().unwrap().join("escaped").exists());
        }
        for name in [".wh..", "a/.wh..."] {
            let msg = run(vec![Layer::new().file(name, b"", 0o644).bytes()]).error();
            assert!(msg.contains("is a whiteout that names no file"), "{msg}");
        }
    }

    #[test]
    fn absolute_names_land_inside_the_layer() {
        let before = fs::read("/etc/passwd").ok();
        let marker = b"sandbox-mcp oci test: must never reach the host\n";
        let run = run(vec![
            Layer::new().file("/etc/passwd", marker, 0o644).bytes(),
        ]);
        run.image();
        assert_eq!(fs::read(run.layer(0).join("etc/passwd")).unwrap(), marker);
        assert_eq!(fs::read("/etc/passwd").ok(), before);
    }

    #[test]
    fn refuses_writes_through_symlinks() {
        let name = format!("sandbox-mcp-oci-test-{}", std::process::id());
        let cases = [
            (Layer::new().symlink("evil", "/etc"), "evil", "evil"),
            (Layer::new().symlink("up", "../../../../.."), "up", "up"),
            (
                Layer::new().dir("a", 0o755).symlink("a/b", "/etc"),
                "a/b/c",
                "a/b",
            ),
            (Layer::new().dir("d", 0o755).symlink("d", "/etc"), "d", "d"),
        ];
        for (layer, dir, link) in cases {
            let entry = format!("{dir}/{name}");
            let run = run(vec![layer.file(&entry, b"x", 0o644).bytes()]);
            let msg = run.error();
            assert!(
                msg.contains(&format!("entry {entry} writes through the symlink {link}")),
                "{msg}"
            );
            assert!(!Path::new("/etc").join(&name).exists());
            assert!(!run.work.parent().unwrap().join(&name).exists());
        }
        let msg = run(vec![
            Layer::new()
                .file("f", b"", 0o644)
                .file("f/g", b"", 0o644)
                .bytes(),
        ])
        .error();
        assert!(msg.contains("entry f/g needs f to be a directory"), "{msg}");
    }

    #[test]
    fn directory_modes_never_land_through_a_later_symlink() {
        let target = tempfile::tempdir().unwrap();
        fs::set_permissions(target.path(), Permissions::from_mode(0o755)).unwrap();
        let target_name = target.path().to_str().unwrap();
        let run = run(vec![
            Layer::new()
                .dir("d", 0o700)
                .symlink("d", target_name)
                .bytes(),
        ]);
        run.image();
        assert!(
            fs::symlink_metadata(run.layer(0).join("d"))
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(mode_of(target.path()), 0o755);
    }

    #[test]
    fn refuses_hard_links_outside_the_layer() {
        let not_ours = "is not a file of this layer";
        let cases = [
            ("/etc/shadow", not_ours),
            ("../../x", "leaves the image root"),
            ("missing", not_ours),
            ("s/passwd", not_ours),
            ("lnk", not_ours),
            ("dir", not_ours),
        ];
        for (target, why) in cases {
            let layer = Layer::new()
                .file("file", b"f", 0o644)
                .symlink("s", "/etc")
                .symlink("lnk", "file")
                .dir("dir", 0o755)
                .link("h", target);
            let run = run(vec![layer.bytes()]);
            let msg = run.error();
            let expected = format!("entry h is a hard link to {target}, which {why}");
            assert!(msg.contains(&expected), "{msg}");
            assert!(!run.layer(0).join("h").exists());
        }
        let lower = Layer::new().file("f", b"f", 0o644).bytes();
        let msg = run(vec![lower, Layer::new().link("h", "f").bytes()]).error();
        assert!(
            msg.contains("layer 1 (sha256:") && msg.contains(not_ours),
            "{msg}"
        );
    }

    #[test]
    fn refuses_device_nodes() {
        for kind in [EntryType::Char, EntryType::Block] {
            let layer = Layer::new().raw(kind, b"dev/sda", b"", 0o660, b"", |h| {
                h.set_device_major(8).unwrap();
                h.set_device_minor(0).unwrap();
            });
            let run = run(vec![layer.bytes()]);
            let msg = run.error();
            assert!(msg.starts_with("layer 0 (sha256:"), "{msg}");
            assert!(
                msg.contains("entry dev/sda is a device node, and images may not carry devices")
            );
            assert!(fs::symlink_metadata(run.layer(0).join("dev/sda")).is_err());
        }
    }

    #[test]
    fn strips_setuid_setgid_and_xattrs() {
        let records = [
            pax("SCHILY.xattr.user.evil", "1"),
            pax("SCHILY.xattr.security.capability", "x"),
        ];
        let layer = Layer::new()
            .file("bin/su", b"x", 0o4755)
            .file("bin/wall", b"x", 0o2755)
            .dir("shared", 0o2775)
            .dir("tmp", 0o1777)
            .raw(
                EntryType::XHeader,
                b"PaxHeaders/cap",
                b"",
                0o644,
                &records.concat(),
                |_| {},
            )
            .file("bin/ping", b"x", 0o755);
        let run = run(vec![layer.bytes()]);
        run.image();
        let l0 = run.layer(0);
        for (path, mode) in [
            ("bin/su", 0o755),
            ("bin/wall", 0o755),
            ("shared", 0o775),
            ("tmp", 0o1777),
        ] {
            assert_eq!(mode_of(&l0.join(path)), mode, "{path}");
        }
        assert_eq!(layers::get_xattr(&l0.join("bin/ping"), "user.evil"), None);
        assert_eq!(
            layers::get_xattr(&l0.join("bin/ping"), "security.capability"),
            None
        );
    }

    #[test]
    fn sizes_count_before_any_data_is_read() {
        // The archive simply ends after the header: nothing may be read or written for it.
        let big = Layer::new().raw(EntryType::Regular, b"big", b"", 0o644, b"", |h| {
            h.set_size(10 << 30)
        });
        let run = run(vec![big.bytes()]);
        let msg = run.error();
        assert!(
            msg.contains("the image holds more than 8 GiB of files (the import limit"),
            "{msg}"
        );
        assert!(msg.contains("entry big of layer 0"), "{msg}");
        assert!(fs::symlink_metadata(run.layer(0).join("big")).is_err());

        // A sparse file counts at its apparent size (2 GiB here, 512 bytes in the archive).
        let sparse = |real: u64| {
            Layer::new().raw(
                EntryType::GNUSparse,
                b"sparse",
                b"",
                0o644,
                &[7; 512],
                |h| {
                    let g = h.as_gnu_mut().unwrap();
                    octal(&mut g.sparse[0].offset, real - 512);
                    octal(&mut g.sparse[0].numbytes, 512);
                    octal(&mut g.realsize, real);
                },
            )
        };
        let limits = Limits {
            max_bytes: 1 << 30,
            ..Limits::default()
        };
        let run = run_with(
            Form::Docker,
            vec![sparse(2 << 30).bytes()],
            false,
            json!({}),
            &limits,
            false,
        );
        let msg = run.error();
        assert!(msg.contains("more than 1 GiB of files"), "{msg}");
        assert!(fs::symlink_metadata(run.layer(0).join("sparse")).is_err());

        // Under the limit it unpacks, holes included.
        let run = run_with(
            Form::Docker,
            vec![sparse(1 << 20).bytes()],
            false,
            json!({}),
            &limits,
            false,
        );
        run.image();
        let data = fs::read(run.layer(0).join("sparse")).unwrap();
        assert_eq!(data.len(), 1 << 20);
        assert!(data[..(1 << 20) - 512].iter().all(|b| *b == 0) && data.ends_with(&[7; 512]));
        assert_eq!(run.image().bytes, 1 << 20);
    }

    #[test]
    fn counts_entries_against_the_limit() {
        let limits = Limits {
            max_files: 1000,
            ..Limits::default()
        };
        let layer = |n: usize| {
            (0..n)
                .fold(Layer::new(), |l, i| l.file(&format!("f{i}"), b"", 0o644))
                .bytes()
        };
        let ok = run_with(
            Form::Docker,
            vec![layer(1000)],
            false,
            json!({}),
            &limits,
            false,
        );
        assert_eq!(ok.image().files, 1000);
        let msg = run_with(
            Form::Docker,
            vec![layer(1001)],
            false,
            json!({}),
            &limits,
            false,
        )
        .error();
        assert!(
            msg.contains("more than 1000 files and directories"),
            "{msg}"
        );
    }

    #[test]
    fn refuses_blobs_whose_digest_does_not_match() {
        let layer = Layer::new().file("f", b"data", 0o644).bytes();
        let digest = sha256(&gz(&layer));
        let tmp = tempfile::tempdir().unwrap();
        let source = image(
            tmp.path(),
            Form::OciLayout,
            vec![layer.clone()],
            true,
            json!({}),
        );
        let blob = source.join("blobs/sha256").join(&digest["sha256:".len()..]);
        let mut bytes = fs::read(&blob).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0xff;
        fs::write(&blob, bytes).unwrap();
        let run = import_source(tmp, &source, &Limits::default(), false);
        let msg = run.error();
        assert!(
            msg.contains(&format!("layer 0 ({digest}) has the digest sha256:")),
            "{msg}"
        );
        assert!(!run.layer(0).exists(), "verified before unpacking");

        let wrong = format!("sha256:{}", "0".repeat(64));
        let config = json!({"rootfs": {"type": "layers", "diff_ids": [wrong]}});
        let run = run_with(
            Form::Docker,
            vec![layer],
            false,
            config,
            &Limits::default(),
            false,
        );
        let msg = run.error();
        assert!(
            msg.contains(&format!("not to {wrong}, the diff_id its config gives")),
            "{msg}"
        );
    }

    #[test]
    fn refuses_truncated_archives_and_layers() {
        let layer = Layer::new().file("noise", &noise(64 << 10), 0o644).bytes();
        for form in [Form::Docker, Form::OciArchive] {
            let tmp = tempfile::tempdir().unwrap();
            let source = image(tmp.path(), form, vec![layer.clone()], false, json!({}));
            let bytes = fs::read(&source).unwrap();
            fs::write(&source, &bytes[..bytes.len() / 2]).unwrap();
            let msg = import_source(tmp, &source, &Limits::default(), false).error();
            assert!(msg.contains("is truncated or corrupt"), "{form:?}: {msg}");
        }
        // A layer cut short, its diff_id computed over what is left: the tar stream ends early.
        let cut = layer[..20 << 10].to_vec();
        let msg = run(vec![cut.clone()]).error();
        let expected = format!("layer 0 ({}) is truncated or corrupt", sha256(&cut));
        assert!(msg.contains(&expected), "{msg}");
        // The same for a gzip stream cut short.
        let blob = gz(&layer);
        let cut = blob[..blob.len() / 2].to_vec();
        let config = json!({"rootfs": {"type": "layers", "diff_ids": [sha256(&layer)]}});
        let msg = run_with(
            Form::Docker,
            vec![cut],
            false,
            config,
            &Limits::default(),
            false,
        )
        .error();
        assert!(msg.contains("is truncated or corrupt"), "{msg}");
    }

    #[test]
    fn refuses_other_platforms() {
        let other = if host_arch() == "arm64" {
            "amd64"
        } else {
            "arm64"
        };
        for form in [Form::Docker, Form::OciArchive] {
            let layer = Layer::new().file("f", b"", 0o644).bytes();
            let config = json!({"architecture": other});
            let msg = run_with(form, vec![layer], false, config, &Limits::default(), false).error();
            let expected = format!(
                "the image is for linux/{other}; this engine runs linux/{}",
                host_arch()
            );
            assert!(msg.starts_with(&expected), "{form:?}: {msg}");
        }
        let config = json!({"os": "windows"});
        let msg = run_with(
            Form::Docker,
            vec![],
            false,
            config,
            &Limits::default(),
            false,
        )
        .error();
        assert!(msg.starts_with("the image is for windows/"), "{msg}");
    }

    #[test]
    fn root_and_metadata_entries() {
        let layer = Layer::new()
            .raw(
                EntryType::XGlobalHeader,
                b"pax_global_header",
                b"",
                0o644,
                &pax("comment", "x"),
                |_| {},
            )
            .dir("./", 0o750)
            .file("/", b"not the root", 0o644)
            .file("f", b"f", 0o644);
        let ok = run(vec![layer.bytes()]);
        ok.image();
        assert_eq!(mode_of(&ok.layer(0)), 0o750);
        assert_eq!(fs::read(ok.layer(0).join("f")).unwrap(), b"f");

        let unknown = Layer::new().raw(EntryType::new(b'D'), b"dumpdir", b"", 0o755, b"", |_| {});
        let msg = run(vec![unknown.bytes()]).error();
        assert!(
            msg.contains(
                "entry dumpdir has the tar entry type 'D', which this importer does not know"
            ),
            "{msg}"
        );
    }

    #[test]
    fn refuses_zstd_and_unknown_layers() {
        let zstd = [&ZSTD_MAGIC[..], &[0; 64]].concat();
        let msg = run(vec![zstd]).error();
        assert!(
            msg.contains("zstd layers are not supported yet: re-save the image with gzip"),
            "{msg}"
        );
        let msg = run(vec![b"BZh91AY&SY not a tar".to_vec()]).error();
        assert!(
            msg.contains("is neither a tar archive nor a gzip-compressed one"),
            "{msg}"
        );
    }

    #[test]
    fn refuses_what_is_not_an_image() {
        let tmp = tempfile::tempdir().unwrap();
        let three = "give a `docker save` tarball, an OCI archive (a tar of an OCI image layout) or an OCI image layout directory";
        let junk = tmp.path().join("junk");
        fs::write(&junk, noise(4096)).unwrap();
        let gzipped = tmp.path().join("image.tar.gz");
        fs::write(&gzipped, gz(&tar_of(&[("x".into(), vec![1])], false))).unwrap();
        let other_tar = tmp.path().join("other.tar");
        fs::write(&other_tar, tar_of(&[("x".into(), vec![1])], false)).unwrap();
        let empty_dir = tmp.path().join("dir");
        fs::create_dir(&empty_dir).unwrap();
        let cases = [
            (junk, "it is not a tar archive"),
            (gzipped, "it is gzip-compressed; decompress it first"),
            (other_tar, "neither manifest.json nor index.json"),
            (empty_dir, "neither manifest.json nor index.json"),
        ];
        for (source, why) in cases {
            let work = tmp.path().join("work");
            let msg = import(&source, &work, &Limits::default(), false)
                .unwrap_err()
                .to_string();
            assert!(msg.contains(why) && msg.contains(three), "{msg}");
        }
    }

    #[test]
    fn refuses_oversized_metadata() {
        let tmp = tempfile::tempdir().unwrap();
        for name in ["manifest.json", "index.json"] {
            let source = tmp.path().join(format!("{name}.tar"));
            fs::write(
                &source,
                tar_of(&[(name.to_string(), vec![b' '; 5 << 20])], false),
            )
            .unwrap();
            let work = tmp.path().join("work");
            let msg = import(&source, &work, &Limits::default(), false)
                .unwrap_err()
                .to_string();
            assert!(
                msg.contains(&format!("{name} is 5242880 bytes, larger than the 4 MiB")),
                "{msg}"
            );
        }
        // A GNU long name the tar crate would read into memory whole.
        let long = [vec![b'a'; 2 << 20], vec![0]].concat();
        let layer = Layer::new()
            .file("first", b"", 0o644)
            .raw(
                EntryType::GNULongName,
                b"././@LongLink",
                b"",
                0o644,
                &long,
                |_| {},
            )
            .file("short", b"", 0o644);
        let msg = run(vec![layer.bytes()]).error();
        assert!(msg.contains("more than 1 MiB of tar metadata"), "{msg}");

        let layers = vec![Layer::new().bytes(); MAX_LAYERS + 1];
        let msg = run(layers).error();
        assert!(
            msg.contains("the image has 129 layers and at most 128 can be imported"),
            "{msg}"
        );
    }

    #[test]
    fn chown_takes_header_ids_clamped_to_nobody() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipping the chown test: it needs root");
            return;
        }
        let ids = |uid: u64| {
            move |h: &mut tar::Header| {
                h.set_uid(uid);
                h.set_gid(uid);
            }
        };
        let layer = Layer::new()
            .raw(EntryType::Regular, b"mine", b"", 0o4755, b"x", ids(1000))
            .raw(EntryType::Regular, b"far", b"", 0o644, b"x", ids(70_000))
            .raw(EntryType::Directory, b"d", b"", 0o755, b"", ids(1000))
            .raw(EntryType::Symlink, b"l", b"mine", 0o777, b"", ids(1000))
            .bytes();
        let run = run_with(
            Form::Docker,
            vec![layer.clone()],
            false,
            json!({}),
            &Limits::default(),
            true,
        );
        run.image();
        for (path, id) in [("mine", 1000), ("far", 65534), ("d", 1000), ("l", 1000)] {
            let meta = fs::symlink_metadata(run.layer(0).join(path)).unwrap();
            assert_eq!((meta.uid(), meta.gid()), (id, id), "{path}");
        }
        assert_eq!(mode_of(&run.layer(0).join("mine")), 0o755);
        let run = run_with(
            Form::Docker,
            vec![layer],
            false,
            json!({}),
            &Limits::default(),
            false,
        );
        run.image();
        assert_eq!(
            fs::symlink_metadata(run.layer(0).join("far"))
                .unwrap()
                .uid(),
            0
        );
    }
}
