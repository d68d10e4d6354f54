//! Test images: layer tars written header by header (so hostile names can be written too), and
//! images of every accepted form around them, with real digests, imported into a temporary
//! directory.

use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use tar::EntryType;

use super::image::{host_arch, sha256};
use super::{Image, ImportError, Limits, import};

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Form {
    Docker,
    OciArchive,
    OciLayout,
}

pub(crate) const MTIME: u64 = 1_700_000_000;

/// A layer tar written header by header, names as raw bytes: the tar crate's `set_path`
/// refuses the hostile ones (`..`, absolute) these tests need.
pub(crate) struct Layer(tar::Builder<Vec<u8>>);

impl Layer {
    pub(crate) fn new() -> Self {
        Layer(tar::Builder::new(Vec::new()))
    }

    pub(crate) fn raw(
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

    pub(crate) fn file(self, name: &str, data: &[u8], mode: u32) -> Self {
        self.raw(EntryType::Regular, name.as_bytes(), b"", mode, data, |_| {})
    }

    pub(crate) fn dir(self, name: &str, mode: u32) -> Self {
        self.raw(
            EntryType::Directory,
            name.as_bytes(),
            b"",
            mode,
            b"",
            |_| {},
        )
    }

    pub(crate) fn symlink(self, name: &str, target: &str) -> Self {
        let (name, target) = (name.as_bytes(), target.as_bytes());
        self.raw(EntryType::Symlink, name, target, 0o777, b"", |_| {})
    }

    pub(crate) fn link(self, name: &str, target: &str) -> Self {
        let (name, target) = (name.as_bytes(), target.as_bytes());
        self.raw(EntryType::Link, name, target, 0o644, b"", |_| {})
    }

    pub(crate) fn bytes(self) -> Vec<u8> {
        self.0.into_inner().unwrap()
    }
}

pub(crate) fn gz(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

/// Bytes that do not compress, so a cut lands inside a file's data.
pub(crate) fn noise(len: usize) -> Vec<u8> {
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
pub(crate) fn tar_of(files: &[(String, Vec<u8>)], dot: bool) -> Vec<u8> {
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

pub(crate) fn hex_of(bytes: &[u8]) -> String {
    sha256(bytes)["sha256:".len()..].to_string()
}

/// Writes an image of `layers` (layer tars) under `dir` in `form`, with real digests and
/// diff_ids; the keys of `config` replace the default config's.
pub(crate) fn image(
    dir: &Path,
    form: Form,
    layers: Vec<Vec<u8>>,
    gzip: bool,
    config: Value,
) -> PathBuf {
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

pub(crate) struct Run {
    _tmp: tempfile::TempDir,
    pub(crate) work: PathBuf,
    result: Result<Image, ImportError>,
}

impl Run {
    pub(crate) fn layer(&self, i: usize) -> PathBuf {
        self.work.join("layers").join(i.to_string())
    }

    pub(crate) fn image(&self) -> &Image {
        self.result
            .as_ref()
            .unwrap_or_else(|e| panic!("import failed: {e}"))
    }

    pub(crate) fn error(&self) -> String {
        match &self.result {
            Ok(_) => panic!("the image was imported, but should have been refused"),
            Err(e) => e.to_string(),
        }
    }
}

pub(crate) fn import_source(
    tmp: tempfile::TempDir,
    source: &Path,
    limits: &Limits,
    chown: bool,
) -> Run {
    let work = tmp.path().join("work");
    fs::create_dir(&work).unwrap();
    let result = import(source, &work, limits, chown);
    Run {
        _tmp: tmp,
        work,
        result,
    }
}

pub(crate) fn run_with(
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

pub(crate) fn run(layers: Vec<Vec<u8>>) -> Run {
    run_with(
        Form::Docker,
        layers,
        false,
        json!({}),
        &Limits::default(),
        false,
    )
}

pub(crate) fn mode_of(path: &Path) -> u32 {
    fs::symlink_metadata(path).unwrap().mode() & 0o7777
}

/// A PAX record, `<len> <key>=<value>\n`, whose length counts its own digits.
pub(crate) fn pax(key: &str, value: &str) -> Vec<u8> {
    let body = format!(" {key}={value}\n");
    let mut len = body.len() + 1;
    while format!("{len}{body}").len() != len {
        len += 1;
    }
    format!("{len}{body}").into_bytes()
}

pub(crate) fn octal(field: &mut [u8], n: u64) {
    let digits = format!("{n:0w$o}\0", w = field.len() - 1);
    field.copy_from_slice(digits.as_bytes());
}
