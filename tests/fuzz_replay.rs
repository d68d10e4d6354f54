//! The fuzz targets' properties (tests/fuzz/properties.rs) on stable: the checked-in corpus, then
//! deterministic mutations of it. `cargo fuzz` (nightly, in CI) explores much further.

use std::path::Path;

#[path = "fuzz/properties.rs"]
mod properties;

/// A small deterministic PRNG (xorshift64*), so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

const TOKENS: &[&[u8]] = &[
    b"\"",
    b"{",
    b"}",
    b"[",
    b"]",
    b":",
    b",",
    b"null",
    b"true",
    b"-1",
    b"1e309",
    b"0.5",
    b"18446744073709551616",
    b"\\u0000",
    b"..",
    b"/",
    b"\\",
    b"\xff",
    b"\xe4\xb8\xad",
    b"\"id\"",
];

fn mutate(rng: &mut Rng, seed: &[u8], corpus: &[Vec<u8>]) -> Vec<u8> {
    let mut v = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        match rng.below(6) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] ^= 1 << rng.below(8);
            }
            1 if !v.is_empty() => {
                let i = rng.below(v.len());
                let n = 1 + rng.below(8.min(v.len() - i));
                v.drain(i..i + n);
            }
            2 => {
                let i = rng.below(v.len() + 1);
                let t = TOKENS[rng.below(TOKENS.len())];
                v.splice(i..i, t.iter().copied());
            }
            3 if !corpus.is_empty() => {
                let other = &corpus[rng.below(corpus.len())];
                let i = rng.below(v.len() + 1);
                let j = rng.below(other.len() + 1);
                v.truncate(i);
                v.extend_from_slice(&other[j..]);
            }
            4 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] = rng.next() as u8;
            }
            _ => {
                let i = rng.below(v.len() + 1);
                let len = rng.below(16);
                let bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
                v.splice(i..i, bytes);
            }
        }
    }
    v
}

/// A random JSON value: the edge cases schemas and typed clients disagree on.
fn random_value(rng: &mut Rng, depth: usize) -> serde_json::Value {
    use serde_json::json;
    let strings = [
        "",
        "x",
        "sbx_0123456789abcdefghjkmnpqrs",
        "sbx_",
        "job_1",
        "job_99999999999",
        "python",
        "node",
        "ruby",
        "../../etc/passwd",
        "/root/a",
        "a\u{0}b",
        "é中",
        "default",
        "utf8",
        "base64",
        "running",
        "paused",
        "k=v",
        "k=v,x=y",
        "=",
        "  ",
    ];
    match rng.below(if depth > 2 { 6 } else { 8 }) {
        0 => json!(strings[rng.below(strings.len())]),
        1 => json!("y".repeat(rng.below(3) * 300 + rng.below(70))),
        2 => json!(rng.next() as i64 >> rng.below(64)),
        3 => json!([0, 1, -1, 600000, 600001, u64::MAX as i64][rng.below(6)]),
        4 => json!([0.5, -0.0, 1e300, 3.0][rng.below(4)]),
        5 => [json!(null), json!(true), json!(false)][rng.below(3)].clone(),
        6 => {
            let mut m = serde_json::Map::new();
            for _ in 0..rng.below(4) {
                m.insert(
                    strings[rng.below(strings.len())].to_string(),
                    random_value(rng, depth + 1),
                );
            }
            serde_json::Value::Object(m)
        }
        _ => serde_json::Value::Array(
            (0..rng.below(3))
                .map(|_| random_value(rng, depth + 1))
                .collect(),
        ),
    }
}

/// Tool arguments mutated as JSON: a value replaced, a key dropped or added.
fn mutate_tool_args(rng: &mut Rng, seed: &[u8]) -> Option<Vec<u8>> {
    let (&tool, json) = seed.split_first()?;
    let serde_json::Value::Object(mut map) = serde_json::from_slice(json).ok()? else {
        return None;
    };
    for _ in 0..1 + rng.below(3) {
        let keys: Vec<String> = map.keys().cloned().collect();
        match rng.below(4) {
            0 | 1 if !keys.is_empty() => {
                let k = &keys[rng.below(keys.len())];
                map.insert(k.clone(), random_value(rng, 0));
            }
            2 if !keys.is_empty() => {
                map.remove(&keys[rng.below(keys.len())]);
            }
            _ => {
                let names = [
                    "timeout_ms",
                    "cwd",
                    "env",
                    "background",
                    "encoding",
                    "max_bytes",
                    "recursive",
                    "status",
                    "metadata",
                    "template",
                    "name",
                    "since_offset",
                    "language",
                    "context_id",
                ];
                map.insert(names[rng.below(names.len())].into(), random_value(rng, 0));
            }
        }
    }
    let mut out = vec![tool];
    out.extend(serde_json::to_vec(&map).ok()?);
    Some(out)
}

fn replay(target: &str, run: fn(&[u8]), mutations: usize) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fuzz/corpus")
        .join(target);
    let mut corpus: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .collect();
    corpus.sort();
    assert!(!corpus.is_empty(), "no corpus for {target}");
    for input in &corpus {
        run(input);
    }
    let mut rng = Rng(0x5EED_0000 ^ target.len() as u64);
    for _ in 0..mutations {
        let seed = &corpus[rng.below(corpus.len())];
        let structured = (target == "tool_args" && rng.below(4) != 0)
            .then(|| mutate_tool_args(&mut rng, seed))
            .flatten();
        let input = structured.unwrap_or_else(|| mutate(&mut rng, seed, &corpus));
        let outcome = std::panic::catch_unwind(|| run(&input));
        if outcome.is_err() {
            panic!(
                "{target}: property broken for input {:?} (bytes {:?})",
                String::from_utf8_lossy(&input),
                input
            );
        }
    }
}

#[test]
fn tool_argument_mapping() {
    replay("tool_args", properties::tool_args, 20000);
}

#[test]
fn path_handling() {
    replay("paths", properties::paths, 20000);
}

#[test]
fn stdio_id_scanner() {
    replay("id_scanner", properties::id_scanner, 20000);
}

#[test]
fn dns_messages() {
    replay("dns", properties::traffic::dns, 20000);
}

#[test]
fn tls_client_hello() {
    replay("client_hello", properties::traffic::client_hello, 20000);
}

#[test]
fn http_host() {
    replay("http_host", properties::traffic::http_host, 20000);
}

// Each input is an import into a directory of its own: fewer mutations.
#[test]
fn oci_manifests() {
    replay("oci_manifest", properties::image::oci_manifest, 2000);
}

#[test]
fn oci_tar_entries() {
    replay("oci_tar", properties::image::oci_tar, 2000);
}

#[test]
fn agent_frames() {
    replay("agent_frame", properties::frames::agent_frame, 20000);
}

#[test]
fn mux_frames() {
    replay("mux_frame", properties::frames::mux_frame, 20000);
}

#[test]
fn attach_chunks() {
    replay("attach_chunk", properties::frames::attach_chunk, 20000);
}
