//! `sandbox-mcp tools`: the tools this server offers, as a table for people or as the tools/list
//! JSON the model receives.

use sandbox_mcp_server::tooldefs::registry;

/// `sandbox-mcp tools`: the table (or the JSON) is written in one go, and a reader that stops
/// early (`| head`) is not an error.
pub(super) fn run(selection: &str, json: bool) -> anyhow::Result<()> {
    let out = tools_text(selection, json)?;
    match std::io::Write::write_all(&mut std::io::stdout().lock(), out.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

fn tools_text(selection: &str, json: bool) -> anyhow::Result<String> {
    use std::fmt::Write as _;
    let mut out = String::new();
    let registry = registry();
    let selected = registry.select(selection).map_err(anyhow::Error::msg)?;
    if json {
        let tools: Vec<_> = selected
            .iter()
            .map(|d| sandbox_mcp_server::server::to_mcp_tool(d))
            .collect();
        writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "tools": tools }))?
        )?;
        return Ok(out);
    }
    writeln!(
        out,
        "{} — {} tools (from {} v{})\n",
        env!("CARGO_PKG_NAME"),
        selected.len(),
        registry.api_title,
        registry.api_version
    )?;
    writeln!(
        out,
        "{:<28} {:<12} {:<7} {:<44} SOURCE",
        "TOOL", "HINTS", "METHOD", "PATH"
    )?;
    for t in &selected {
        let a = t.annotations;
        let hints = [
            (a.read_only, "ro"),
            (a.destructive, "destr"),
            (a.idempotent, "idem"),
            (a.open_world, "open"),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, s)| *s)
        .collect::<Vec<_>>()
        .join(",");
        writeln!(
            out,
            "{:<28} {:<12} {:<7} {:<44} {}",
            t.name, hints, t.method, t.path, t.source
        )?;
    }
    let excluded: Vec<_> = registry
        .inventory
        .iter()
        .filter(|i| i.excluded.is_some())
        .collect();
    if !excluded.is_empty() {
        writeln!(out, "\nOperations not offered as tools:")?;
        for i in excluded {
            writeln!(
                out,
                "  {} ({} {}): {}",
                i.operation,
                i.method,
                i.path,
                i.excluded.as_deref().unwrap_or("")
            )?;
        }
    }
    if !registry.toolsets.is_empty() {
        writeln!(
            out,
            "\nToolsets (--tools): all, {}",
            registry
                .toolsets
                .keys()
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        )?;
    }
    Ok(out)
}
