//! Images: manifests, indexes, configs and layer tars (crates/storage, `oci`).

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::json;

use sandbox_mcp_storage::oci;

/// What an import may write: 1 MiB and 1000 entries.
const IMPORT_LIMITS: oci::Limits = oci::Limits {
    max_bytes: 1 << 20,
    max_files: 1000,
};
/// A file beside the import's work directory, which no image may touch.
const HOST_FILE: &[u8] = b"a file of the host\n";

fn sha256_hex(bytes: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// A directory of its own for one import: `image/` (the source), `work/` (where it unpacks) and
/// `outside/` (holding [`HOST_FILE`]), all removed on drop. In memory (/dev/shm) when the host
/// has it, as an import on a disk is twenty times slower; else in the temporary directory.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Scratch {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!("sandbox-mcp-fuzz-{}-{n}", std::process::id());
        let shm = Path::new("/dev/shm").join(&name);
        let root = match fs::create_dir(&shm) {
            Ok(()) => shm,
            Err(_) => std::env::temp_dir().join(name),
        };
        fs::create_dir_all(root.join("image/blobs/sha256")).expect("scratch directory");
        fs::create_dir(root.join("work")).expect("scratch directory");
        fs::create_dir(root.join("outside")).expect("scratch directory");
        fs::write(root.join("outside/secret"), HOST_FILE).expect("scratch file");
        Scratch(root)
    }

    fn image(&self) -> PathBuf {
        self.0.join("image")
    }

    fn work(&self) -> PathBuf {
        self.0.join("work")
    }

    /// Writes a blob into the image layout, returning its descriptor.
    fn blob(&self, media_type: &str, bytes: &[u8]) -> serde_json::Value {
        let hex = sha256_hex(bytes);
        fs::write(self.image().join("blobs/sha256").join(&hex), bytes).expect("blob");
        json!({"mediaType": media_type, "digest": format!("sha256:{hex}"), "size": bytes.len()})
    }

    fn file(&self, name: &str, bytes: &[u8]) {
        fs::write(self.image().join(name), bytes).expect("image file");
    }

    /// Imports `source` and checks what any import, failed or not, leaves behind: nothing outside
    /// `work/layers/<i>/`, the host file untouched (not linked to, not changed), the source
    /// unchanged, and in the layers only directories, files, symlinks, FIFOs and whiteouts (0:0
    /// devices), no setuid or setgid bit, and no more bytes than the limit.
    fn import(&self, source: &Path) -> Result<oci::Image, oci::ImportError> {
        let before = summary(&self.image());
        let result = oci::import(source, &self.work(), &IMPORT_LIMITS, false);
        let mut top: Vec<String> = (fs::read_dir(&self.0).expect("scratch"))
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        top.sort();
        assert_eq!(
            top,
            ["image", "outside", "work"],
            "written beside the work directory"
        );
        let outside: Vec<_> = fs::read_dir(self.0.join("outside"))
            .expect("outside")
            .collect();
        assert_eq!(
            outside.len(),
            1,
            "written into a directory outside the work directory"
        );
        let host = self.0.join("outside/secret");
        let meta = fs::symlink_metadata(&host).expect("the host file");
        assert!(
            meta.is_file() && meta.nlink() == 1,
            "the host file was replaced or linked to"
        );
        assert_eq!(
            fs::read(&host).expect("the host file"),
            HOST_FILE,
            "the host file changed"
        );
        assert_eq!(summary(&self.image()), before, "the source changed");
        let layers = self.work().join("layers");
        let mut bytes = 0;
        let mut inodes = std::collections::HashSet::new();
        for (path, meta) in tree(&self.work()) {
            let relative = path
                .strip_prefix(&layers)
                .ok()
                .map(|p| p.components().count());
            assert!(
                path == self.work() || path == layers || relative.is_some_and(|depth| depth >= 1),
                "{} is outside the layers",
                path.display()
            );
            let kind = meta.file_type();
            if kind.is_char_device() {
                assert_eq!(meta.rdev(), 0, "{}: a device", path.display());
            } else {
                assert!(
                    kind.is_dir() || kind.is_file() || kind.is_symlink() || kind.is_fifo(),
                    "{}: {kind:?}",
                    path.display()
                );
            }
            assert_eq!(
                meta.mode() & 0o6000,
                0,
                "{}: setuid or setgid",
                path.display()
            );
            if kind.is_file() && inodes.insert(meta.ino()) {
                bytes += meta.size();
            }
        }
        assert!(bytes <= IMPORT_LIMITS.max_bytes, "{bytes} bytes unpacked");
        if let Ok(image) = &result {
            assert!(
                image.bytes <= IMPORT_LIMITS.max_bytes && image.files <= IMPORT_LIMITS.max_files
            );
            assert_eq!(
                image.architecture,
                host_arch(),
                "an image of another platform"
            );
            for (i, layer) in image.layers.iter().enumerate() {
                assert_eq!(*layer, layers.join(i.to_string()));
            }
        }
        result
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // Directories an image made read-only first become writable again (without root).
        for (path, meta) in tree(&self.0) {
            if meta.is_dir() {
                let _ = fs::set_permissions(&path, fs::Permissions::from_mode(0o700));
            }
        }
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Every path under `root` (itself included) with its metadata, never following a symlink.
fn tree(root: &Path) -> Vec<(PathBuf, fs::Metadata)> {
    let mut out = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(path) = todo.pop() {
        let Ok(meta) = fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            // Walked even when an image made it unreadable (root reads it anyway).
            let _ = fs::set_permissions(&path, fs::Permissions::from_mode(meta.mode() | 0o700));
            if let Ok(entries) = fs::read_dir(&path) {
                todo.extend(entries.filter_map(|e| Some(e.ok()?.path())));
            }
        }
        out.push((path, meta));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// What `tree` finds, comparable: path, kind and mode, size, mtime.
fn summary(root: &Path) -> Vec<(PathBuf, u32, u64, i64)> {
    (tree(root).into_iter())
        .map(|(p, m)| (p, m.mode(), m.size(), m.mtime()))
        .collect()
}

/// The run configuration of [`image_config`].
fn run_config() -> serde_json::Value {
    json!({"Env": ["PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8", "NOEQUALS", "A=b=c"],
           "WorkingDir": "/app", "User": "1000:1000", "Cmd": ["sh"]})
}

/// An image config for this host with one layer whose uncompressed digest is `diff_id`.
fn image_config(diff_id: &str) -> Vec<u8> {
    let config = json!({
        "architecture": host_arch(),
        "os": "linux",
        "config": run_config(),
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{diff_id}")]},
        "history": [{"created_by": "COPY hello /hello"}]
    });
    serde_json::to_vec_pretty(&config).expect("JSON")
}

/// What an imported image's environment, working directory and user are, by the OCI spec's
/// reading of `config` (a JSON document).
fn expected_run(
    config: &serde_json::Value,
) -> (Vec<(String, String)>, Option<String>, Option<String>) {
    let run = &config["config"];
    let env = (run["Env"].as_array().into_iter().flatten())
        .filter_map(|v| v.as_str()?.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let text = |v: &serde_json::Value| v.as_str().filter(|s| !s.is_empty()).map(str::to_string);
    (env, text(&run["WorkingDir"]), text(&run["User"]))
}

/// A layer of one file, one directory and one symlink, as a tar.
fn small_layer() -> Vec<u8> {
    let mut out = Vec::new();
    for (name, kind, link, data) in [
        ("app/", b'5', "", &b""[..]),
        ("app/hello", b'0', "", b"hello\n"),
        ("app/link", b'2', "hello", b""),
    ] {
        let mut h = [0u8; 512];
        h[..name.len()].copy_from_slice(name.as_bytes());
        h[100..107].copy_from_slice(b"0000755");
        h[108..115].copy_from_slice(b"0000000");
        h[116..123].copy_from_slice(b"0000000");
        h[124..135].copy_from_slice(format!("{:011o}", data.len()).as_bytes());
        h[136..147].copy_from_slice(b"14000000000");
        h[156] = kind;
        h[157..157 + link.len()].copy_from_slice(link.as_bytes());
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
        out.extend_from_slice(&h);
        out.extend_from_slice(data);
        out.resize(out.len().next_multiple_of(512), 0);
    }
    out.resize(out.len() + 1024, 0);
    fix_tar_checksums(&mut out);
    out
}

/// Recomputes the checksum of each header of a tar (walking from header to header by the sizes
/// they declare), so that mutated headers reach the importer instead of failing the tar crate's
/// checksum test. Gzip streams are left alone.
fn fix_tar_checksums(tar: &mut [u8]) {
    if tar.starts_with(&[0x1f, 0x8b]) {
        return;
    }
    let mut at = 0usize;
    while let Some(block) = tar.get_mut(at..at + 512) {
        if block.iter().all(|b| *b == 0) {
            at += 512;
            continue;
        }
        block[148..156].fill(b' ');
        let sum: u32 = block.iter().map(|b| u32::from(*b)).sum();
        block[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        let size = std::str::from_utf8(&block[124..136])
            .ok()
            .and_then(|s| {
                u64::from_str_radix(s.trim_matches(|c: char| c == '\0' || c == ' '), 8).ok()
            })
            .unwrap_or(0);
        let Some(next) = usize::try_from(size.div_ceil(512).saturating_mul(512))
            .ok()
            .and_then(|data| at.checked_add(512)?.checked_add(data))
        else {
            return;
        };
        at = next;
    }
}

/// One layer's tar entries unpacked. Input: the layer (a tar, or a gzip of one), whose header
/// checksums the harness fixes; it is imported as the one layer of an OCI image layout, with the
/// digests that name it right (so the unpacking, not the digest check, meets the bytes).
///
/// Properties: those of every import (`Scratch::import`): nothing written outside the layer
/// directory — not through `..`, absolute names, symlinks or hard links, whatever the order of the
/// entries — the host file neither changed nor linked to, no device or setuid bit unpacked, no more
/// bytes than the limit whatever sizes the headers declare.
pub fn oci_tar(data: &[u8]) {
    let mut layer = data.to_vec();
    fix_tar_checksums(&mut layer);
    // The diff_id is the digest of the uncompressed stream.
    let mut tar = Vec::new();
    let gzip = layer.starts_with(&[0x1f, 0x8b]);
    if gzip {
        let gunzip = flate2::read::MultiGzDecoder::new(layer.as_slice());
        let _ = std::io::Read::read_to_end(&mut std::io::Read::take(gunzip, 4 << 20), &mut tar);
    }
    let scratch = Scratch::new();
    let media = "application/vnd.oci.image.layer.v1.tar";
    let layer_d = scratch.blob(media, &layer);
    let config = image_config(&sha256_hex(if gzip { &tar } else { &layer }));
    let config_d = scratch.blob("application/vnd.oci.image.config.v1+json", &config);
    let manifest = json!({"schemaVersion": 2, "config": config_d, "layers": [layer_d]});
    let manifest_d = scratch.blob(
        "application/vnd.oci.image.manifest.v1+json",
        &serde_json::to_vec(&manifest).expect("JSON"),
    );
    let index = json!({"schemaVersion": 2, "manifests": [manifest_d]});
    scratch.file("index.json", &serde_json::to_vec(&index).expect("JSON"));
    scratch.file("oci-layout", br#"{"imageLayoutVersion": "1.0.0"}"#);
    if let Ok(image) = scratch.import(&scratch.image()) {
        assert_eq!(image.layers.len(), 1);
        let config: serde_json::Value = serde_json::from_slice(&config).expect("JSON");
        assert_eq!(
            (image.env, image.workdir, image.user),
            expected_run(&config)
        );
    }
}

/// An image's metadata: index, manifest, config, `docker save`'s manifest.json, or the outer tar
/// holding them. Input: a byte saying which, then that document; the rest of the image is a
/// valid one-layer image for this host, with the digests that name the document right.
///
/// - 0: the OCI `index.json`; 1: the image manifest; 2: the image config; 3: `docker save`'s
///   `manifest.json` (blobs under `blobs/sha256/`); other values: the whole image as an archive
///   (a tar holding an image layout or a `docker save`).
///
/// In documents 0-3, `{layer}`, `{config}` and `{manifest}` stand for the hex digests of the
/// image's other blobs, and `{layer.size}`, `{config.size}`, `{manifest.size}` for their sizes,
/// so that the corpus names them right whatever they hold.
///
/// Properties: those of every import (`Scratch::import`); an image imported is for linux on this
/// host's architecture whatever the index offers, and its environment, working directory and user
/// are the config's.
pub fn oci_manifest(data: &[u8]) {
    let Some((&which, doc)) = data.split_first() else {
        return;
    };
    let scratch = Scratch::new();
    let mut blobs: Vec<(&str, String, usize)> = Vec::new();
    let fill = |doc: &[u8], blobs: &[(&str, String, usize)]| {
        let mut doc = String::from_utf8_lossy(doc).into_owned();
        for (name, hex, size) in blobs {
            doc = doc.replace(&format!("{{{name}}}"), hex);
            doc = doc.replace(&format!("{{{name}.size}}"), &size.to_string());
        }
        doc.into_bytes()
    };
    let layer = small_layer();
    let layer_d = scratch.blob("application/vnd.oci.image.layer.v1.tar", &layer);
    blobs.push(("layer", sha256_hex(&layer), layer.len()));
    let config = match which {
        2 => fill(doc, &blobs),
        _ => image_config(&sha256_hex(&layer)),
    };
    let config_d = scratch.blob("application/vnd.oci.image.config.v1+json", &config);
    blobs.push(("config", sha256_hex(&config), config.len()));
    let manifest = match which {
        1 => fill(doc, &blobs),
        _ => serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": config_d,
            "layers": [layer_d]
        }))
        .expect("JSON"),
    };
    let mut manifest_d = scratch.blob("application/vnd.oci.image.manifest.v1+json", &manifest);
    blobs.push(("manifest", sha256_hex(&manifest), manifest.len()));
    manifest_d["platform"] = json!({"architecture": host_arch(), "os": "linux"});
    let index = serde_json::to_vec(&json!({"schemaVersion": 2, "manifests": [manifest_d]}));
    let index = if which == 0 {
        fill(doc, &blobs)
    } else {
        index.expect("JSON")
    };
    scratch.file("index.json", &index);
    scratch.file("oci-layout", br#"{"imageLayoutVersion": "1.0.0"}"#);
    if which == 3 {
        fs::remove_file(scratch.image().join("index.json")).expect("index.json");
        scratch.file("manifest.json", &fill(doc, &blobs));
    }
    let source = if which > 3 {
        let archive = scratch.0.join("image/archive.tar");
        fs::write(&archive, doc).expect("archive");
        archive
    } else {
        scratch.image()
    };
    let Ok(image) = scratch.import(&source) else {
        return;
    };
    if which != 2 && which <= 3 {
        assert_eq!(image.layers.len(), 1);
    }
    if which > 3 {
        return;
    }
    let config: serde_json::Value =
        serde_json::from_slice(&config).expect("an imported config is JSON");
    assert_eq!(config["os"], "linux", "an image for another OS");
    assert_eq!(config["architecture"], host_arch());
    assert_eq!(
        (image.env, image.workdir, image.user),
        expected_run(&config)
    );
}
