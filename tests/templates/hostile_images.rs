//! Hostile and broken images: refused with the reason, leaving nothing, and never a way to read
//! the host's files through the image's symlinks.

use serde_json::json;

use crate::common::{TestEngine, ok, sh};
use crate::require_sandboxes;

use super::{import, layers, sandbox_from, with_builtins};

#[tokio::test]
async fn a_hostile_or_broken_image_is_refused_and_leaves_nothing() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let layers_before = layers(&engine);
    use crate::images::raw_layer;
    use tar::EntryType::{Char, Link, Regular, Symlink};
    let evil = raw_layer(&[(b"../../etc/passwd", Regular, b"", b"evil")]);
    let through_link = raw_layer(&[
        (b"etc", Symlink, b"/etc", b""),
        (b"etc/cron.d/x", Regular, b"", b"evil"),
    ]);
    let hard_link = raw_layer(&[(b"shadow", Link, b"/etc/shadow", b"")]);
    let device = raw_layer(&[(b"dev/sda", Char, b"", b"")]);
    let good = crate::images::docker_save(&[crate::images::busybox_layer()], json!({}));
    let mut corrupt = crate::images::docker_save(&[crate::images::busybox_layer()], json!({}));
    // Flip a byte inside the busybox binary: the layer no longer matches its digest.
    let at = corrupt.len() / 2;
    corrupt[at] ^= 0xff;
    let truncated = good[..good.len() / 2].to_vec();
    for (name, archive, expected) in [
        (
            "evil",
            crate::images::docker_save(&[evil], json!({})),
            "leaves the image root",
        ),
        (
            "through-link",
            crate::images::docker_save(&[through_link], json!({})),
            "writes through the symlink",
        ),
        (
            "hard-link",
            crate::images::docker_save(&[hard_link], json!({})),
            "not a file of this layer",
        ),
        (
            "device",
            crate::images::docker_save(&[device], json!({})),
            "device node",
        ),
        ("corrupt", corrupt, "sha256"),
        ("truncated", truncated, ""),
        ("garbage", b"not an image at all".to_vec(), ""),
        // Refused after unpacking, before any layer reaches the store.
        (
            "ghost",
            crate::images::docker_save(&[crate::images::busybox_layer()], json!({"User": "ghost"})),
            "User ghost is not in its /etc/passwd",
        ),
    ] {
        let (status, body) = import(&engine, name, archive).await;
        assert_eq!(status, 400, "{name}: {body}");
        let message = body["message"].as_str().unwrap();
        assert!(message.contains(expected), "{name}: {message}");
    }
    let (status, body) = import(&engine, "base", good.clone()).await;
    assert_eq!(status, 409, "{body}");
    let (status, body) = import(&engine, "Bad", good).await;
    assert_eq!(status, 400, "{body}");
    // Nothing half-made: no template, no layer, no upload, no scratch directory.
    let client = engine.mcp().await;
    let list = ok(&client, "sandbox_template_list", json!({})).await;
    assert_eq!(
        list["templates"].as_array().unwrap().len(),
        with_builtins(&[]).len(),
        "{list}"
    );
    assert_eq!(layers(&engine), layers_before);
    let uploads = std::fs::read_dir(engine.data_dir().join("uploads"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(uploads, 0);
}

/// The files the engine reads from an image it imports (`/etc/passwd` for its `User`, the CA
/// bundle it adds the egress CA to) are resolved inside the image, as a sandbox of it would see
/// them: an image whose symlinks point at host directories or files — absolute, climbing out
/// with `..`, at the file itself, at its parent directory, in an upper or a lower layer — gets
/// none of the host's files into its sandboxes, while links inside the image still work.
#[tokio::test]
async fn an_image_import_never_reads_host_files_through_the_images_symlinks() {
    require_sandboxes!();
    let engine = TestEngine::start().await;
    let client = engine.mcp().await;
    let host = tempfile::tempdir_in("/tmp").unwrap();
    let hd = host.path().to_str().unwrap().to_string();
    std::fs::create_dir_all(host.path().join("ssl/certs")).unwrap();
    std::fs::write(
        host.path().join("passwd"),
        "hostuser:x:4242:4242:host:/host-home-secret:/bin/sh\n",
    )
    .unwrap();
    std::fs::write(
        host.path().join("ssl/certs/ca-certificates.crt"),
        "HOST-SECRET-CERTIFICATE\n",
    )
    .unwrap();
    let up = "../".repeat(12);
    let climb = format!("{up}{}", &hd[1..]);
    let busybox = crate::images::busybox_layer;
    let links = |links: &[(&str, &str)]| crate::images::layer(&[], links);
    // A User found only in the host's passwd: the import must not find it.
    for (name, stack) in [
        ("abs-dir", vec![busybox(), links(&[("etc", hd.as_str())])]),
        (
            "rel-dir",
            vec![busybox(), links(&[("etc", climb.as_str())])],
        ),
        (
            "abs-file",
            vec![
                busybox(),
                links(&[("etc/passwd", format!("{hd}/passwd").as_str())]),
            ],
        ),
        (
            "rel-file",
            vec![links(&[("etc/passwd", format!("{climb}/passwd").as_str())])],
        ),
        (
            "chain",
            vec![busybox(), links(&[("etc", "/cfg"), ("cfg", hd.as_str())])],
        ),
    ] {
        let image = crate::images::docker_save(&stack, json!({"User": "hostuser"}));
        let (status, body) = import(&engine, name, image).await;
        assert_eq!(status, 400, "{name}: {body}");
        let message = body["message"].as_str().unwrap();
        assert!(
            message.contains("User hostuser is not in its /etc/passwd"),
            "{name}: {message}"
        );
    }
    // The CA bundle through a link to the host's directory: the sandbox's bundle holds the
    // egress CA and nothing of the host's.
    let image = crate::images::docker_save(
        &[
            busybox(),
            links(&[("etc/ssl", format!("{hd}/ssl").as_str())]),
        ],
        json!({}),
    );
    let (status, body) = import(&engine, "ssl-link", image).await;
    assert_eq!(status, 201, "{body}");
    let id = sandbox_from(&client, "ssl-link").await;
    let bundle = sh(&client, &id, "cat /etc/ssl/certs/ca-certificates.crt").await;
    assert!(!bundle.contains("HOST-SECRET"), "{bundle}");
    assert!(bundle.contains("BEGIN CERTIFICATE"), "{bundle}");
    // Links inside the image resolve against its own root: an absolute link to its own
    // directory, and one climbing past its root, find its own passwd (and the user's home).
    let own = crate::images::layer(
        &[(
            "real/passwd",
            b"root:x:0:0:root:/root:/bin/sh\nimguser:x:1234:1234::/home/imguser:/bin/sh\n",
            0o644,
        )],
        &[("etc/passwd", "../../../../../../real/passwd")],
    );
    let image = crate::images::docker_save(&[busybox(), own], json!({"User": "imguser"}));
    let (status, body) = import(&engine, "own-link", image).await;
    assert_eq!(status, 201, "{body}");
    let id = sandbox_from(&client, "own-link").await;
    assert_eq!(sh(&client, &id, "echo $HOME").await, "/home/imguser\n");
}
