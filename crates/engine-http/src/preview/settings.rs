//! The preview listener's settings (`--preview-listen`, `--preview-domain`) and binding it.

use std::net::SocketAddr;

use sandbox_mcp_model::config::PreviewConfig;

/// Parses `--preview-listen`: an address, or `off`.
pub fn parse_listen(s: &str) -> Result<Option<SocketAddr>, String> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    s.parse().map(Some).map_err(|_| {
        format!("{s:?} is not an address to listen on (write 127.0.0.1:8989, 0.0.0.0:8989, or off)")
    })
}

/// Parses `--preview-domain`: a host name (its labels letters, digits and `-`).
pub fn parse_domain(s: &str) -> Result<String, String> {
    let d = s.trim().trim_end_matches('.').to_ascii_lowercase();
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    };
    if d.len() <= 200 && d.split('.').all(label_ok) {
        Ok(d)
    } else {
        Err(format!(
            "{s:?} is not a domain (write localhost, or a wildcard DNS name such as preview.example.com)"
        ))
    }
}

/// Binds the preview listener, if previews are on.
pub(crate) fn bind(config: &PreviewConfig) -> std::io::Result<Option<std::net::TcpListener>> {
    let Some(addr) = config.listen else {
        return Ok(None);
    };
    let bound = match std::net::TcpListener::bind(addr) {
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && config.fallback => {
            let any = SocketAddr::new(addr.ip(), 0);
            let l = std::net::TcpListener::bind(any)?;
            tracing::warn!(
                "{addr} is taken (another engine?): previews are served on {} instead; set --preview-listen to choose",
                l.local_addr()?
            );
            Ok(l)
        }
        other => other,
    }
    .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen for previews on {addr}: {e}")))?;
    bound.set_nonblocking(true)?;
    Ok(Some(bound))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// The default address, taken (another engine), moves to a free port; an address the
    /// operator named, taken, is an error that names it; `off` binds nothing.
    #[test]
    fn a_taken_listen_address_moves_only_when_it_is_the_default() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        let config = |fallback| PreviewConfig {
            listen: Some(addr),
            fallback,
            domain: "localhost".into(),
        };
        let moved = bind(&config(true)).unwrap().unwrap();
        assert_ne!(moved.local_addr().unwrap().port(), addr.port());
        let e = bind(&config(false)).unwrap_err();
        assert!(
            e.to_string()
                .contains(&format!("cannot listen for previews on {addr}")),
            "{e}"
        );
        let off = PreviewConfig {
            listen: None,
            ..config(false)
        };
        assert!(bind(&off).unwrap().is_none());
    }

    #[test]
    fn settings_are_checked() {
        assert_eq!(parse_listen("off").unwrap(), None);
        assert!(parse_listen("localhost").is_err());
        assert_eq!(
            parse_domain("Preview.Example.com.").unwrap(),
            "preview.example.com"
        );
        for bad in ["", "a..b", "-a.b", "a_b.c", "a b"] {
            assert!(parse_domain(bad).is_err(), "{bad}");
        }
    }
}
