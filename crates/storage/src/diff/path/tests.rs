//! Names and `under` as the caller gives and sees them: odd bytes escaped, bad paths refused.

use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;

use super::super::diff;
use super::super::fixture::*;

#[test]
fn odd_names_are_escaped_and_never_collide() {
    let tmp = tempfile::tempdir().unwrap();
    let (ua, ub) = (tmp.path().join("a"), tmp.path().join("b"));
    fs::create_dir_all(&ua).unwrap();
    fs::create_dir_all(&ub).unwrap();
    for name in [
        &b"a\nb"[..],
        b"a\\x0ab",
        b"c\xff",
        b"c\\xff",
        b"tab\there",
        "é\u{85}".as_bytes(),
    ] {
        fs::write(ub.join(OsStr::from_bytes(name)), b"").unwrap();
    }
    let d = diff(&side(&ua, &[]), &side(&ub, &[]), "/", 100).unwrap();
    let paths: Vec<&str> = d.entries.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        vec![
            "/a\\\\x0ab",
            "/a\\x0ab",
            "/c\\\\xff",
            "/c\\xff",
            "/tab\\x09here",
            "/é\\xc2\\x85",
        ]
    );
    assert!(paths.iter().all(|p| p.chars().all(|c| !c.is_control())));
}

#[test]
fn under_limits_the_walk_and_must_be_absolute() {
    let tmp = tempfile::tempdir().unwrap();
    let (ua, ub) = (tmp.path().join("a"), tmp.path().join("b"));
    put(&ua, "x/keep", b"k");
    put(&ub, "x/keep", b"k");
    set_mtime(&ua.join("x/keep"), 1);
    set_mtime(&ub.join("x/keep"), 1);
    put(&ub, "x/1", b"1");
    put(&ub, "x/sub/2", b"2");
    put(&ub, "y/3", b"3");
    let (a, b) = (side(&ua, &[]), side(&ub, &[]));
    let under = |u: &str| list(&diff(&a, &b, u, 100).unwrap());
    assert_eq!(
        under("/x"),
        vec![added("/x/1"), added("/x/sub"), added("/x/sub/2")]
    );
    assert_eq!(under("/x/"), under("/x"));
    assert_eq!(under("//x/./sub"), vec![added("/x/sub"), added("/x/sub/2")]);
    assert_eq!(under("/x/1"), vec![added("/x/1")]);
    assert_eq!(under("/y"), vec![added("/y"), added("/y/3")]);
    assert_eq!(under("/nope"), vec![]);
    assert_eq!(under("/x/keep/deeper"), vec![]);
    assert_eq!(diff(&a, &b, "/", 100).unwrap().added, 5);
    for bad in ["x", "", "/x/../y", "/..", "/x\0"] {
        let e = diff(&a, &b, bad, 100).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{bad:?}");
    }
}
