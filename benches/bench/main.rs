//! Every benchmark, in one run: `cargo bench` measures and rewrites docs/benchmarks.md.
//!
//! The engine runs as its own process (`sandbox-mcp engine`), as in production; the MCP server is
//! the real binary over stdio. Figures are medians and 95th percentiles of repeated runs on this
//! machine; targets come from the issues that set them. Timed assertions do not belong in tests on
//! shared machines, so the targets are checked here and reported, not enforced.
//!
//! A/B mode: `SANDBOX_MCP_BENCH_BASELINE=<another sandbox-mcp binary> cargo bench` measures that
//! build and this one in alternating rounds (`SANDBOX_MCP_BENCH_ROUNDS`, default 2) in the same
//! run, and writes docs/benchmarks-ab.md: per figure, each build's median over its rounds and the
//! ratio. That is how a change shows it costs nothing, on a machine whose speed drifts by the hour.
//!
//! With `SANDBOX_MCP_BENCH_ONLY=SECTION` as well, A/B mode measures that section alone (`mcp`
//! too: the MCP server's start, tools/list and call overhead) and writes
//! docs/benchmarks-ab-SECTION.md.
//!
//! `SANDBOX_MCP_BENCH_ONLY=network cargo bench` runs the network section alone (egress, previews,
//! secrets), `…=templates` the templates section, `…=forks` the snapshots and forks section,
//! `…=desktop` the computer-use section, `…=hosted` the hosted MCP servers' section (written to docs/benchmarks-hosted.md), `…=live` the forks with memory (written to docs/benchmarks-live.md), `…=volumes` volumes and workspaces (docs/benchmarks-volumes.md), `…=kubernetes` the kubernetes driver's section (docs/benchmarks-kubernetes.md), `…=e2b` E2B's SDK against the engine (docs/benchmarks-e2b.md), `…=http` and `…=mcp` the MCP layer's, and
//! prints its table and text instead of writing any file: for working on it. The kubernetes
//! section needs `SANDBOX_MCP_TEST_K8S_RIG` (as its tests do); without it, it says so.
//!
//! One file per section beside this one in `benches/bench/`, beside what they share: the binary measured and
//! its clients (`servers.rs`), figures and timing (`figures.rs`), the test internet (`testnet.rs`)
//! and its client (`probe.rs`, running `benches/probe.py`), the report (`report.rs`) and A/B mode
//! (`ab.rs`). Fixtures the tests use too come from the `sandbox-mcp-testkit` crate.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod ab;
mod desktop;
mod e2b;
mod engine;
mod figures;
mod forks;
mod hosted;
mod http;
mod kubernetes;
mod live;
mod mcp;
mod memory;
mod network;
mod previews;
mod probe;
mod report;
mod secrets;
mod servers;
mod templates;
mod testnet;
mod volumes;

use std::path::{Path, PathBuf};

use crate::ab::ab;
use crate::desktop::desktop_figures;
use crate::e2b::e2b_figures;
use crate::engine::engine_figures;
use crate::figures::Figure;
use crate::forks::fork_figures;
use crate::hosted::hosted_figures;
use crate::http::http_figures;
use crate::kubernetes::kubernetes_figures;
use crate::live::live_figures;
use crate::mcp::mcp_figures;
use crate::memory::idle_memory;
use crate::network::network_figures;
use crate::report::render;
use crate::servers::Engine;
use crate::templates::template_figures;
use crate::volumes::volume_figures;

/// Every figure of the binary `bin()` names, with the side-by-side section when `with_peer`.
fn suite(with_peer: bool) -> (Vec<Figure>, String) {
    let mut figures = Vec::new();
    // First, on an engine of its own: the sandboxes the other figures kill leave the kernel
    // tearing down their network namespaces for a while, which the transfers would feel.
    let mut network = Vec::new();
    let network_section = network_figures(&mut network);
    let engine = Engine::start();
    let side_by_side = mcp_figures(&engine, &mut figures, with_peer);
    http_figures(&engine, &mut figures);
    engine_figures(&engine, &mut figures);
    idle_memory(&engine, &mut figures);
    let hosted_section = hosted_figures(&engine, &mut figures);
    drop(engine);
    template_figures(&mut figures);
    let forks_section = fork_figures(&mut figures);
    let live_section = live_figures(&mut figures);
    let volume_section = volume_figures(&mut figures);
    let desktop_section = desktop_figures(&mut figures);
    let kubernetes_section = kubernetes_figures(&mut figures);
    let e2b_section = e2b_figures(&mut figures);
    // In the table, after the engine's own figures.
    figures.append(&mut network);
    (
        figures,
        side_by_side
            + &hosted_section
            + &network_section
            + &forks_section
            + &live_section
            + &volume_section
            + &desktop_section
            + &kubernetes_section
            + &e2b_section,
    )
}
/// One section's figures (`SANDBOX_MCP_BENCH_ONLY`), or None for a name that is no section.
fn section_figures(only: &str) -> Option<Vec<Figure>> {
    let mut figures = Vec::new();
    match only {
        "network" => drop(network_figures(&mut figures)),
        "templates" => drop(template_figures(&mut figures)),
        "forks" => drop(fork_figures(&mut figures)),
        "desktop" => drop(desktop_figures(&mut figures)),
        "kubernetes" => drop(kubernetes_figures(&mut figures)),
        "live" => drop(live_figures(&mut figures)),
        "volumes" => drop(volume_figures(&mut figures)),
        "e2b" => drop(e2b_figures(&mut figures)),
        "hosted" => drop(hosted_figures(&Engine::start(), &mut figures)),
        "mcp" => drop(mcp_figures(&Engine::start(), &mut figures, false)),
        "http" => http_figures(&Engine::start(), &mut figures),
        _ => return None,
    }
    Some(figures)
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` would pass nothing useful: skip then.
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("benches/bench/main.rs: run with `cargo bench`");
        return;
    }
    let only = std::env::var("SANDBOX_MCP_BENCH_ONLY").unwrap_or_default();
    let baseline = std::env::var("SANDBOX_MCP_BENCH_BASELINE").unwrap_or_default();
    // A/B of one section: written beside the full A/B file.
    if !baseline.is_empty() && !only.is_empty() {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("docs/benchmarks-ab-{only}.md"));
        std::fs::write(&path, ab(&baseline, Some(&only))).unwrap();
        eprintln!("wrote {}", path.display());
        return;
    }
    // Sections kept beside the full run's file: each alone takes minutes, the suite an hour.
    if ["live", "hosted", "volumes", "kubernetes", "e2b"].contains(&only.as_str()) {
        let mut figures = Vec::new();
        let section = if only == "live" {
            live_figures(&mut figures)
        } else if only == "e2b" {
            e2b_figures(&mut figures)
        } else if only == "volumes" {
            volume_figures(&mut figures)
        } else if only == "kubernetes" {
            kubernetes_figures(&mut figures)
        } else {
            let engine = Engine::start();
            hosted_figures(&engine, &mut figures)
        };
        let doc = render(&figures, &section).replacen(
            "Generated by `cargo bench` (benches/bench/main.rs), which rewrites this file.",
            &format!(
                "Generated by `SANDBOX_MCP_BENCH_ONLY={only} cargo bench --bench bench` \
                 (benches/bench/{only}.rs), which rewrites this file; the full `cargo bench` \
                 measures these rows too."
            ),
            1,
        );
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("docs/benchmarks-{only}.md"));
        std::fs::write(&path, doc).unwrap();
        eprintln!("wrote {}", path.display());
        return;
    }
    // The MCP layer's sections have no text of their own: their table.
    if only == "http" || only == "mcp" {
        let figures = section_figures(&only).unwrap_or_default();
        eprintln!("{}", render(&figures, ""));
        return;
    }
    if ["network", "templates", "forks", "desktop"].contains(&only.as_str()) {
        let mut figures = Vec::new();
        let section = match only.as_str() {
            "network" => network_figures(&mut figures),
            "templates" => template_figures(&mut figures),
            "desktop" => desktop_figures(&mut figures),
            _ => fork_figures(&mut figures),
        };
        eprintln!("{}", render(&figures, &section));
        return;
    }
    let (doc, file) = match std::env::var("SANDBOX_MCP_BENCH_BASELINE") {
        Ok(baseline) if !baseline.is_empty() => (ab(&baseline, None), "docs/benchmarks-ab.md"),
        _ => {
            let (figures, side_by_side) = suite(true);
            (render(&figures, &side_by_side), "docs/benchmarks.md")
        }
    };
    let path: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, doc).unwrap();
    eprintln!("wrote {}", path.display());
}
