//! The one change the engine makes to a dump before restoring it: which namespaces the restore
//! joins instead of creating.
//!
//! CRIU records, in `inventory.img`, the namespaces CRIU itself ran in at dump time
//! (`root_ids`); every namespace of the dumped tree that differs from those it recreates on
//! restore. A tree is dumped from the host, so its pid, user, mount, IPC, UTS and cgroup
//! namespaces all differ — yet the restore must put it into the *target* sandbox's existing ones
//! (joined with `--join-ns`, inherited as the external pid namespace, or entered before CRIU
//! starts). Rewriting `root_ids` to the tree's own ids says exactly that: these namespaces are
//! not to be made. (With none to make, CRIU also reads the target's own `/proc` rather than
//! mounting one, which the Landlock domain it runs in would refuse.)
//!
//! Images are CRIU's protobuf entries, each preceded by its length (after a magic number); only
//! the fields needed here are decoded, everything else is copied as it was.

use std::io;
use std::path::Path;

use super::proto::{Value, decode, encode};

/// `task_kobj_ids_entry` fields: pid, ipc, uts, mnt, user and cgroup namespace ids.
const JOINED_NS_FIELDS: [u64; 6] = [5, 7, 8, 9, 10, 11];
/// `inventory_entry.root_ids`.
const ROOT_IDS: u64 = 3;
/// Largest image read here (they hold ids only).
const MAX_IMAGE: u64 = 1 << 20;

/// Makes the restore of the dump in `dir`, whose root process is `root_pid` (as the sandbox
/// sees it), join the target's user, mount, IPC, UTS and cgroup namespaces instead of making
/// new ones.
pub fn join_target_namespaces(dir: &Path, root_pid: i32) -> io::Result<()> {
    let ids = read_image(&dir.join(format!("ids-{root_pid}.img")), 8)?;
    let task = ids
        .entries
        .first()
        .ok_or_else(|| bad("ids image has no entry"))?;
    let task_fields = decode(task)?;
    let inventory_path = dir.join("inventory.img");
    let mut inventory = read_image(&inventory_path, 4)?;
    let entry = inventory
        .entries
        .first_mut()
        .ok_or_else(|| bad("inventory image has no entry"))?;
    let mut fields = decode(entry)?;
    for field in fields.iter_mut().filter(|f| f.number == ROOT_IDS) {
        let Value::Bytes(root) = &field.value else {
            return Err(bad("root_ids is not a message"));
        };
        let mut root_fields = decode(root)?;
        for f in root_fields.iter_mut() {
            if JOINED_NS_FIELDS.contains(&f.number)
                && let Some(own) = task_fields.iter().find(|t| t.number == f.number)
            {
                f.value = own.value.clone();
            }
        }
        field.value = Value::Bytes(encode(&root_fields));
    }
    *entry = encode(&fields);
    write_image(&inventory_path, &inventory)
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("CRIU image: {what}"))
}

struct Image {
    head: Vec<u8>,
    entries: Vec<Vec<u8>>,
}

fn read_image(path: &Path, head: usize) -> io::Result<Image> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_IMAGE)
        .read_to_end(&mut bytes)?;
    if bytes.len() < head {
        return Err(bad("image too short"));
    }
    let mut entries = Vec::new();
    let mut i = head;
    while i < bytes.len() {
        let len = bytes
            .get(i..i + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
            .ok_or_else(|| bad("truncated entry length"))?;
        i += 4;
        let entry = bytes
            .get(i..i + len)
            .ok_or_else(|| bad("truncated entry"))?;
        entries.push(entry.to_vec());
        i += len;
    }
    Ok(Image {
        head: bytes[..head].to_vec(),
        entries,
    })
}

fn write_image(path: &Path, image: &Image) -> io::Result<()> {
    let mut out = image.head.clone();
    for e in &image.entries {
        out.extend_from_slice(&(e.len() as u32).to_le_bytes());
        out.extend_from_slice(e);
    }
    let tmp = path.with_extension("img.tmp");
    std::fs::write(&tmp, out)?;
    std::fs::rename(tmp, path)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::proto::Field;
    use super::*;

    #[test]
    fn root_ids_take_the_tree_s_namespaces_and_nothing_else_changes() {
        let dir = tempfile::tempdir().unwrap();
        let ids = |vals: [u64; 12]| {
            encode(
                &vals
                    .iter()
                    .enumerate()
                    .map(|(n, v)| Field {
                        number: n as u64 + 1,
                        value: Value::Varint(*v),
                    })
                    .collect::<Vec<_>>(),
            )
        };
        let task = ids([2, 2, 2, 2, 9, 2, 10, 11, 12, 13, 14, 5]);
        let root = ids([1, 1, 1, 1, 1, 2, 3, 4, 6, 7, 8, 5]);
        let inventory = encode(&[
            Field {
                number: 1,
                value: Value::Varint(2),
            },
            Field {
                number: ROOT_IDS,
                value: Value::Bytes(root),
            },
            Field {
                number: 13,
                value: Value::Bytes(b"run-id".to_vec()),
            },
        ]);
        let img = |head: &[u8], entry: &[u8]| {
            let mut v = head.to_vec();
            v.extend_from_slice(&(entry.len() as u32).to_le_bytes());
            v.extend_from_slice(entry);
            v
        };
        std::fs::write(dir.path().join("ids-7.img"), img(&[1; 8], &task)).unwrap();
        std::fs::write(dir.path().join("inventory.img"), img(&[2; 4], &inventory)).unwrap();
        join_target_namespaces(dir.path(), 7).unwrap();
        let got = read_image(&dir.path().join("inventory.img"), 4).unwrap();
        assert_eq!(got.head, vec![2; 4]);
        let fields = decode(&got.entries[0]).unwrap();
        assert_eq!(fields.len(), 3);
        assert_eq!(fields[2].value, Value::Bytes(b"run-id".to_vec()));
        let Value::Bytes(root) = &fields[1].value else {
            panic!()
        };
        let root: Vec<u64> = decode(root)
            .unwrap()
            .iter()
            .map(|f| match f.value {
                Value::Varint(v) => v,
                _ => 0,
            })
            .collect();
        // net (6) and time (12) stay CRIU's; pid, ipc, uts, mnt, user, cgroup become the tree's.
        assert_eq!(root, vec![1, 1, 1, 1, 9, 2, 10, 11, 12, 13, 14, 5]);
    }

    #[test]
    fn a_truncated_image_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("ids-1.img"),
            [1, 2, 3, 4, 5, 6, 7, 8, 200, 0, 0, 0, 1],
        )
        .unwrap();
        assert!(join_target_namespaces(dir.path(), 1).is_err());
    }
}
