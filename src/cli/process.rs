//! What the long-running subcommands (`serve`, `engine`) share: logs on stderr, filtered by
//! RUST_LOG, and the signals that end them.

pub(super) fn init_logging(default: &str) {
    use tracing_subscriber::filter::Targets;
    use tracing_subscriber::prelude::*;
    // `Targets` takes RUST_LOG's `level` and `target=level,…` forms, which is all we document;
    // EnvFilter's span and field filters would link a regex engine into every sandbox's agent.
    let default: Targets = default.parse().unwrap_or_default();
    let filter = match std::env::var("RUST_LOG") {
        Ok(spec) if !spec.trim().is_empty() => spec.parse().unwrap_or_else(|e| {
            eprintln!(
                "sandbox-mcp: RUST_LOG={spec:?} ignored ({e}); use a level or target=level,…"
            );
            default
        }),
        _ => default,
    };
    let _ = tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(false),
        )
        .with(filter)
        .try_init();
}

/// Resolves on SIGTERM or SIGINT.
pub(super) async fn terminated() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
