//! Whiteouts, opaque directories and later mounts hiding what lies below them.

use std::ffi::{CStr, CString};
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use sandbox_mcp_sys::layers;

use super::super::fixture::*;
use super::super::open::WHITEOUT;
use super::super::{Side, diff};

fn set_xattr(path: &Path, name: &CStr, value: &[u8]) {
    let p = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: NUL-terminated strings and a buffer of the length given.
    let r = unsafe {
        libc::lsetxattr(
            p.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(r, 0, "{}", io::Error::last_os_error());
}

#[test]
fn whiteouts_and_opaque_directories_hide_the_lower_layers() {
    let tmp = tempfile::tempdir().unwrap();
    let (lower, ua, ub) = (
        tmp.path().join("lower"),
        tmp.path().join("a"),
        tmp.path().join("b"),
    );
    put(&lower, "f", b"f");
    put(&lower, "g", b"g");
    put(&lower, "d/x", b"x");
    put(&lower, "d/y", b"y");
    put(&lower, "d/sub/z", b"z");
    put(&lower, "e/keep", b"k");
    fs::create_dir_all(&ua).unwrap();
    put(&ub, "d/w", b"w");
    layers::mark_opaque(&ub.join("d")).unwrap();
    layers::whiteout(&ub.join("f")).unwrap();
    // The other form of whiteout: an empty file carrying the xattr.
    put(&ub, "g", b"");
    set_xattr(&ub.join("g"), WHITEOUT, b"");
    // An empty file without it is just an empty file.
    put(&ub, "e/keep", b"");
    // A whiteout over nothing is nothing.
    layers::whiteout(&ub.join("never")).unwrap();
    let d = diff(&side(&ua, &[&lower]), &side(&ub, &[&lower]), "/", 100).unwrap();
    assert_eq!(
        list(&d),
        vec![
            removed("/d/sub"),
            removed("/d/sub/z"),
            added("/d/w"),
            removed("/d/x"),
            removed("/d/y"),
            modified("/e/keep", &["content"]),
            removed("/f"),
            removed("/g"),
        ]
    );
    // Seen the other way round, and with the opaque directory in a lower layer instead.
    let d = diff(&side(&ub, &[&lower]), &side(&ua, &[&lower]), "/", 100).unwrap();
    assert_eq!((d.added, d.removed, d.modified), (6, 1, 1));
    let top = tmp.path().join("top");
    put(&top, "d/only", b"o");
    layers::mark_opaque(&top.join("d")).unwrap();
    let d = diff(
        &side(&ua, &[&lower]),
        &side(&ua, &[&top, &lower]),
        "/d",
        100,
    )
    .unwrap();
    assert_eq!(
        list(&d),
        vec![
            added("/d/only"),
            removed("/d/sub"),
            removed("/d/sub/z"),
            removed("/d/x"),
            removed("/d/y"),
        ]
    );
}

#[test]
fn a_later_mount_owns_everything_under_its_target() {
    let tmp = tempfile::tempdir().unwrap();
    let p = |n: &str| tmp.path().join(n);
    let (root_lower, usr_lower) = (p("root-lower"), p("usr-lower"));
    put(&root_lower, "etc/os", b"os");
    // Hidden by the /usr mount.
    put(&root_lower, "usr/old", b"old");
    put(&usr_lower, "bin/sh", b"sh");
    put(&p("ra"), "usr/ignored", b"i");
    put(&p("rb"), "usr/ignored-too", b"i");
    put(&p("ub"), "bin/new", b"n");
    fs::create_dir_all(p("ua")).unwrap();
    let two = |root_upper: &Path, usr_upper: &Path| Side {
        mounts: vec![
            mount("/", root_upper, &[&root_lower]),
            mount("/usr", usr_upper, &[&usr_lower]),
        ],
        id_base: None,
        stacked: 0,
    };
    let (a, b) = (two(&p("ra"), &p("ua")), two(&p("rb"), &p("ub")));
    assert_eq!(
        list(&diff(&a, &b, "/", 100).unwrap()),
        vec![added("/usr/bin/new")]
    );
    assert_eq!(
        list(&diff(&a, &b, "/usr/bin", 100).unwrap()),
        vec![added("/usr/bin/new")]
    );
    // Against a side without the /usr mount, its /usr is the root mount's.
    let one = Side {
        mounts: vec![mount("/", &p("rb"), &[&root_lower])],
        id_base: None,
        stacked: 0,
    };
    assert_eq!(
        list(&diff(&a, &one, "/", 100).unwrap()),
        vec![
            removed("/usr/bin"),
            removed("/usr/bin/sh"),
            added("/usr/ignored-too"),
            added("/usr/old"),
        ]
    );
    // Without a root mount, only what is under the others is there.
    let only_usr = |u: &Path| Side {
        mounts: vec![mount("/usr", u, &[&usr_lower])],
        id_base: None,
        stacked: 0,
    };
    let (a2, b2) = (only_usr(&p("ua")), only_usr(&p("ub")));
    assert_eq!(
        list(&diff(&a2, &b2, "/usr", 100).unwrap()),
        vec![added("/usr/bin/new")]
    );
    assert_eq!(list(&diff(&a2, &b2, "/", 100).unwrap()), vec![]);
    // A mount whose target the root mount lacks still appears.
    let c = tmp.path().join("opt-lower");
    put(&c, "tool", b"t");
    let mut with_opt = two(&p("ra"), &p("ua"));
    with_opt.mounts.push(mount("/opt", &p("none"), &[&c]));
    assert_eq!(
        list(&diff(&a, &with_opt, "/", 100).unwrap()),
        vec![added("/opt"), added("/opt/tool")]
    );
}
