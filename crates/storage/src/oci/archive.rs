//! Where an image's files are read from: an OCI image layout directory, or an uncompressed tar
//! (a `docker save` tarball or an OCI archive) read in place — its entries indexed by name with
//! their offsets, never extracted, links between entries followed a bounded number of times.
//!
//! Names are made canonical before they are looked up, and one that climbs above the root is
//! never found; the index holds at most [`MAX_ARCHIVE_ENTRIES`] names.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use tar::EntryType;

use super::meter::{MAX_META, Meter};
use super::{ImportError, io_err, not_an_image};

/// Most entries indexed in an outer archive (a `docker save` has about four per layer).
const MAX_ARCHIVE_ENTRIES: usize = 100_000;
pub(crate) const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Where the image's files are read from: a directory, or an uncompressed tar read in place (its
/// entries indexed, never extracted).
pub(crate) struct Store {
    pub(crate) source: PathBuf,
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

pub(crate) struct Blob<'a> {
    pub(crate) reader: Box<dyn Read + 'a>,
    pub(crate) size: u64,
}

impl Store {
    pub(crate) fn open(source: &Path) -> Result<Store, ImportError> {
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

    pub(crate) fn has(&self, name: &str) -> bool {
        match &self.files {
            Files::Dir => self.source.join(name).is_file(),
            Files::Tar { index, .. } => index.contains_key(name),
        }
    }

    pub(crate) fn blob(&self, name: &str, what: &str) -> Result<Blob<'_>, ImportError> {
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
pub(crate) fn clean(name: &str) -> Option<String> {
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
pub(crate) fn is_tar(head: &[u8]) -> bool {
    head.is_empty()
        || (head.len() == 512 && (&head[257..262] == b"ustar" || head.iter().all(|b| *b == 0)))
}

pub(crate) fn read_full(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
