//! The engine's interception CA: created once per data dir (`egress-ca.pem`, its key 0600),
//! trusted by every sandbox from creation, and minting a leaf certificate per host name whose
//! TLS the engine terminates; and the TLS settings for the real hosts, verified against the
//! system's roots plus `--egress-ca`.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;

use sandbox_mcp_model::ids;

/// Leaf certificates are valid from this long ago (a sandbox clock a little behind still
/// accepts them) …
const BACKDATE_SECS: i64 = 3600;
/// … for this long, and minted again when less than a day is left.
const LEAF_SECS: i64 = 7 * 24 * 3600;
/// Leaf certificates kept (one per host name).
const MAX_CACHED: usize = 1024;

/// The engine's interception CA and what it mints.
pub struct Interceptor {
    /// The CA certificate, PEM: what sandboxes trust.
    ca_pem: String,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    /// One key for every leaf (minting is then one signature).
    leaf_key: rcgen::KeyPair,
    leaf_signer: Arc<dyn rustls::sign::SigningKey>,
    certs: Mutex<HashMap<String, (Arc<CertifiedKey>, i64)>>,
    upstream: Arc<rustls::ClientConfig>,
}

pub(super) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn ca_params() -> rcgen::CertificateParams {
    let mut p = rcgen::CertificateParams::default();
    p.distinguished_name = rcgen::DistinguishedName::new();
    p.distinguished_name
        .push(rcgen::DnType::CommonName, "sandbox-mcp egress CA");
    p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    p.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    p
}

fn at(unix_secs: i64) -> time::OffsetDateTime {
    time::OffsetDateTime::from_unix_timestamp(unix_secs).unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

/// Where sandboxes find the CA: the system bundle (the host's, plus this CA) and the CA alone.
const BUNDLE_IN_SANDBOX: &str = "/etc/ssl/certs/ca-certificates.crt";
const CA_IN_SANDBOX: &str = "/etc/ssl/certs/sandbox-mcp-egress-ca.pem";

/// The variables every sandbox gets so that common clients trust the CA (curl and git use the
/// system bundle anyway; Python's requests and pip carry their own unless told; Node adds
/// extra CAs from a file).
pub fn trust_env() -> Vec<(String, String)> {
    [
        ("SSL_CERT_FILE", BUNDLE_IN_SANDBOX),
        ("REQUESTS_CA_BUNDLE", BUNDLE_IN_SANDBOX),
        ("CURL_CA_BUNDLE", BUNDLE_IN_SANDBOX),
        ("PIP_CERT", BUNDLE_IN_SANDBOX),
        ("GIT_SSL_CAINFO", BUNDLE_IN_SANDBOX),
        ("NODE_EXTRA_CA_CERTS", CA_IN_SANDBOX),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

impl Interceptor {
    /// Loads the CA from `dir` (`egress-ca.pem`, `egress-ca.key` 0600), creating it on first
    /// use, and trusts the system's roots plus `extra_ca` upstream.
    pub fn open(dir: &Path, extra_ca: &[std::path::PathBuf]) -> std::io::Result<Self> {
        use std::os::unix::fs::OpenOptionsExt;
        let (cert_path, key_path) = (dir.join("egress-ca.pem"), dir.join("egress-ca.key"));
        let err = |e: rcgen::Error| std::io::Error::other(format!("egress CA: {e}"));
        let (ca_pem, key) = match std::fs::read_to_string(&key_path) {
            Ok(key_pem) => (
                std::fs::read_to_string(&cert_path)?,
                rcgen::KeyPair::from_pem(&key_pem).map_err(err)?,
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let key = rcgen::KeyPair::generate().map_err(err)?;
                let mut params = ca_params();
                let now = ids::now_ms() / 1000;
                params.not_before = at(now - 24 * 3600);
                params.not_after = at(now + 10 * 365 * 24 * 3600);
                let cert = params.self_signed(&key).map_err(err)?;
                std::io::Write::write_all(
                    &mut std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .mode(0o600)
                        .open(&key_path)?,
                    key.serialize_pem().as_bytes(),
                )?;
                sandbox_mcp_sys::durable::write_atomically(
                    &cert_path,
                    cert.pem().as_bytes(),
                    0o644,
                )?;
                (cert.pem(), key)
            }
            Err(e) => return Err(e),
        };
        let issuer = rcgen::Issuer::new(ca_params(), key);
        let leaf_key = rcgen::KeyPair::generate().map_err(err)?;
        let der = PrivateKeyDer::try_from(leaf_key.serialize_der())
            .map_err(|e| std::io::Error::other(format!("leaf key: {e}")))?;
        let leaf_signer = rustls::crypto::ring::sign::any_supported_type(&der)
            .map_err(|e| std::io::Error::other(format!("leaf key: {e}")))?;
        let mut roots = rustls::RootCertStore::empty();
        for bundle in [
            "/etc/ssl/certs/ca-certificates.crt",
            "/etc/pki/tls/certs/ca-bundle.crt",
        ] {
            if let Ok(certs) = CertificateDer::pem_file_iter(bundle) {
                roots.add_parsable_certificates(certs.flatten());
            }
        }
        for file in extra_ca {
            let certs: Vec<_> = CertificateDer::pem_file_iter(file)
                .map_err(|e| std::io::Error::other(format!("--egress-ca {}: {e}", file.display())))?
                .flatten()
                .collect();
            let (added, _) = roots.add_parsable_certificates(certs);
            if added == 0 {
                return Err(std::io::Error::other(format!(
                    "--egress-ca {}: no PEM certificate in it",
                    file.display()
                )));
            }
        }
        let mut upstream = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(std::io::Error::other)?
            .with_root_certificates(roots)
            .with_no_client_auth();
        upstream.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Self {
            ca_pem,
            issuer,
            leaf_key,
            leaf_signer,
            certs: Mutex::new(HashMap::new()),
            upstream: Arc::new(upstream),
        })
    }

    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// TLS to the real hosts: the system's roots plus `--egress-ca`, h2 or HTTP/1.1.
    pub(super) fn upstream(&self) -> Arc<rustls::ClientConfig> {
        self.upstream.clone()
    }

    /// A certificate for `host`, minted on first use and cached.
    pub(super) fn cert_for(&self, host: &str) -> Result<Arc<CertifiedKey>, String> {
        let now = ids::now_ms() / 1000;
        let mut certs = self.certs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((cert, until)) = certs.get(host)
            && *until - now > 24 * 3600
        {
            return Ok(cert.clone());
        }
        let mut params = rcgen::CertificateParams::new(vec![host.to_string()])
            .map_err(|e| format!("certificate for {host}: {e}"))?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, host);
        params.not_before = at(now - BACKDATE_SECS);
        params.not_after = at(now + LEAF_SECS);
        params.use_authority_key_identifier_extension = true;
        let cert = params
            .signed_by(&self.leaf_key, &self.issuer)
            .map_err(|e| format!("certificate for {host}: {e}"))?;
        let key = Arc::new(CertifiedKey::new(
            vec![cert.der().clone()],
            self.leaf_signer.clone(),
        ));
        if certs.len() >= MAX_CACHED {
            certs.clear();
        }
        certs.insert(host.to_string(), (key.clone(), now + LEAF_SECS));
        Ok(key)
    }
}

/// Serves one certificate, whatever the client asks for (the relay already knows the name).
#[derive(Debug)]
pub(super) struct One(pub(super) Arc<CertifiedKey>);

impl rustls::server::ResolvesServerCert for One {
    fn resolve(&self, _: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
}
