//! Owners compared as each sandbox sees them, through its side's id base.

use std::path::Path;

use super::super::fixture::*;
use super::super::{Side, diff};

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

#[test]
fn owners_are_compared_as_the_sandbox_sees_them() {
    if !is_root() {
        eprintln!("skipped: changing owners needs root");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (lower, ua, ub) = (
        tmp.path().join("lower"),
        tmp.path().join("a"),
        tmp.path().join("b"),
    );
    let own = |p: &Path, id: u32| std::os::unix::fs::lchown(p, Some(id), Some(id)).unwrap();
    for (upper, base) in [(&ua, 100_000), (&ub, 200_000)] {
        put(upper, "same", b"s");
        set_mtime(&upper.join("same"), 5);
        own(&upper.join("same"), base + 1000);
        put(upper, "other", b"o");
        set_mtime(&upper.join("other"), 5);
        // Both outside the range: nobody on both sides.
        put(upper, "stray", b"s");
        set_mtime(&upper.join("stray"), 5);
        own(&upper.join("stray"), base + 70_000);
    }
    own(&ua.join("other"), 100_005);
    own(&ub.join("other"), 200_006);
    // A lower file stores the sandbox's ids; its copy in b's upper, host ids.
    put(&lower, "up", b"u");
    own(&lower.join("up"), 1000);
    put(&ub, "up", b"u");
    own(&ub.join("up"), 201_000);
    put(&lower, "up2", b"u");
    own(&lower.join("up2"), 1000);
    put(&ub, "up2", b"u");
    own(&ub.join("up2"), 1000);
    let a = Side {
        id_base: Some(100_000),
        stacked: 0,
        ..side(&ua, &[&lower])
    };
    let b = Side {
        id_base: Some(200_000),
        stacked: 0,
        ..side(&ub, &[&lower])
    };
    let d = diff(&a, &b, "/", 100).unwrap();
    assert_eq!(
        list(&d),
        vec![modified("/other", &["owner"]), modified("/up2", &["owner"])]
    );
    // Without a base, host ids are compared as they are.
    let d = diff(&side(&ua, &[&lower]), &side(&ub, &[&lower]), "/", 100).unwrap();
    assert_eq!(d.modified, 4);
}

#[test]
fn a_stacked_layer_holds_host_ids_as_the_upper_does() {
    if !is_root() {
        eprintln!("skipped: changing owners needs root");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (frozen, ua, ub, template) = (
        tmp.path().join("frozen"),
        tmp.path().join("a"),
        tmp.path().join("b"),
        tmp.path().join("template"),
    );
    let own = |p: &Path, id: u32| std::os::unix::fs::lchown(p, Some(id), Some(id)).unwrap();
    // a's file was frozen into a layer under a's host ids; b has the same file in its upper.
    put(&frozen, "f", b"x");
    set_mtime(&frozen.join("f"), 5);
    own(&frozen.join("f"), 100_000 + 1000);
    put(&ub, "f", b"x");
    set_mtime(&ub.join("f"), 5);
    own(&ub.join("f"), 200_000 + 1000);
    std::fs::create_dir_all(&ua).unwrap();
    std::fs::create_dir_all(&template).unwrap();
    let a = Side {
        id_base: Some(100_000),
        stacked: 1,
        ..side(&ua, &[&frozen, &template])
    };
    let b = Side {
        id_base: Some(200_000),
        stacked: 0,
        ..side(&ub, &[&template])
    };
    assert_eq!(diff(&a, &b, "/", 100).unwrap().modified, 0);
    // Read as a template's layer, the same file would be owned by host id 101000.
    let wrong = Side { stacked: 0, ..a };
    let d = diff(&wrong, &b, "/", 100).unwrap();
    assert_eq!(list(&d), vec![modified("/f", &["owner"])]);
}
