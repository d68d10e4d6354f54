//! Snapshots, forks, diffs and merges through MCP against the real engine: on the btrfs store
//! (copy-on-write snapshots) and on the copy path (a plain store), file by file.
//!
//! By theme: [`families`] (a family of forks diverges, is diffed and merged; an unprivileged engine
//! does it by copying), [`rollback`] (a snapshot undoes a mistake), [`refusals`] (bad requests make
//! nothing), [`diffs`] (special files, loops, odd names and modes), [`disk`] (the disk limit and
//! the sandbox cap hold copies too), [`crashes`] (an operation cut short leaves nothing half made),
//! [`carried`] (what a fork carries over and a restore keeps) and [`layers`] (without btrfs, forks
//! and snapshots of an idle sandbox stack layers instead of copying).

use serde_json::Value;

use crate::common::TestEngine;
use sandbox_mcp_model::config::DiskLimits;

mod carried;
mod crashes;
mod diffs;
mod disk;
mod families;
mod layers;
mod refusals;
mod rollback;

/// The store each test runs on, and the method its copies must report: restores and merges
/// (which copy another sandbox's or snapshot's files onto this one).
fn method_of(disk: DiskLimits) -> &'static str {
    match disk {
        DiskLimits::Off => "copy",
        _ => "btrfs",
    }
}

/// The method a fork or snapshot of a sandbox running nothing but its agent reports: on the
/// plain store its files become a layer the copies share.
fn stacked_method_of(disk: DiskLimits) -> &'static str {
    match disk {
        DiskLimits::Off => "layers",
        _ => "btrfs",
    }
}

/// An engine on the store `disk`, or `None` (with the reason printed) when the btrfs store
/// cannot be had here.
async fn engine_on(disk: DiskLimits) -> Option<TestEngine> {
    let engine = TestEngine::start_with(|c| c.disk_limits = disk).await;
    if disk != DiskLimits::Off && !engine.manager.driver().capabilities().disk_limits_enforced {
        assert!(
            std::env::var_os("SANDBOX_MCP_REQUIRE_SANDBOX").is_none(),
            "a btrfs sandbox store is required (root, btrfs in the kernel, mkfs.btrfs)"
        );
        eprintln!(
            "skipping the btrfs half: no btrfs sandbox store (root, btrfs in the kernel, mkfs.btrfs)"
        );
        return None;
    }
    Some(engine)
}

fn ids(v: &Value) -> Vec<String> {
    v["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_str().unwrap().to_string())
        .collect()
}

/// path → change of a diff's entries.
fn changes(diff: &Value) -> Vec<(String, String, Value)> {
    diff["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["path"].as_str().unwrap().to_string(),
                e["change"].as_str().unwrap().to_string(),
                e["what"].clone(),
            )
        })
        .collect()
}
