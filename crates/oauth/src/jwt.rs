//! JSON Web Tokens, as far as this server needs them: verifying an external issuer's signed
//! access tokens against its JWKS, and signing the built-in server's ID tokens (ES256).
//!
//! Only asymmetric algorithms are accepted: `none` and every HMAC algorithm are refused before a
//! key is looked at, so a token "signed" with a public key as an HMAC secret, or not at all, never
//! verifies. The algorithm must fit the key's type and curve, and the key's own `alg` when it
//! names one.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use ring::signature::{self, UnparsedPublicKey};
use serde_json::Value;

/// Algorithms accepted in an external issuer's tokens.
pub const ALLOWED_ALGS: [&str; 8] = [
    "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384",
];
/// EdDSA (Ed25519) is accepted too; kept apart because its key type differs.
pub const EDDSA: &str = "EdDSA";

pub fn b64(bytes: &[u8]) -> String {
    B64.encode(bytes)
}

pub fn unb64(text: &str) -> Option<Vec<u8>> {
    B64.decode(text.trim_end_matches('=')).ok()
}

/// A public key from a JWKS.
#[derive(Debug, Clone)]
pub struct Jwk {
    pub kid: Option<String>,
    pub alg: Option<String>,
    key: Key,
}

#[derive(Debug, Clone)]
enum Key {
    Rsa {
        n: Vec<u8>,
        e: Vec<u8>,
    },
    /// The uncompressed point (0x04 ‖ x ‖ y) and the curve's name.
    Ec {
        crv: &'static str,
        point: Vec<u8>,
    },
    Ed25519(Vec<u8>),
}

impl Jwk {
    fn parse(v: &Value) -> Option<Jwk> {
        let s = |k: &str| v.get(k).and_then(Value::as_str);
        if s("use").is_some_and(|u| u != "sig") {
            return None;
        }
        let key = match s("kty")? {
            "RSA" => Key::Rsa {
                n: unb64(s("n")?)?,
                e: unb64(s("e")?)?,
            },
            "EC" => {
                let (crv, len) = match s("crv")? {
                    "P-256" => ("P-256", 32),
                    "P-384" => ("P-384", 48),
                    _ => return None,
                };
                let (x, y) = (unb64(s("x")?)?, unb64(s("y")?)?);
                if x.len() != len || y.len() != len {
                    return None;
                }
                let mut point = vec![4u8];
                point.extend(x);
                point.extend(y);
                Key::Ec { crv, point }
            }
            "OKP" if s("crv")? == "Ed25519" => Key::Ed25519(unb64(s("x")?)?),
            _ => return None,
        };
        Some(Jwk {
            kid: s("kid").map(String::from),
            alg: s("alg").map(String::from),
            key,
        })
    }

    /// Whether `alg` may be used with this key.
    fn fits(&self, alg: &str) -> bool {
        if self.alg.as_deref().is_some_and(|a| a != alg) {
            return false;
        }
        match &self.key {
            Key::Rsa { .. } => alg.starts_with("RS") || alg.starts_with("PS"),
            Key::Ec { crv, .. } => {
                (alg, *crv) == ("ES256", "P-256") || (alg, *crv) == ("ES384", "P-384")
            }
            Key::Ed25519(_) => alg == EDDSA,
        }
    }

    fn verify(&self, alg: &str, message: &[u8], sig: &[u8]) -> bool {
        if !self.fits(alg) {
            return false;
        }
        match &self.key {
            Key::Rsa { n, e } => {
                let params: &signature::RsaParameters = match alg {
                    "RS256" => &signature::RSA_PKCS1_2048_8192_SHA256,
                    "RS384" => &signature::RSA_PKCS1_2048_8192_SHA384,
                    "RS512" => &signature::RSA_PKCS1_2048_8192_SHA512,
                    "PS256" => &signature::RSA_PSS_2048_8192_SHA256,
                    "PS384" => &signature::RSA_PSS_2048_8192_SHA384,
                    "PS512" => &signature::RSA_PSS_2048_8192_SHA512,
                    _ => return false,
                };
                signature::RsaPublicKeyComponents { n, e }
                    .verify(params, message, sig)
                    .is_ok()
            }
            Key::Ec { point, .. } => {
                let algorithm: &dyn signature::VerificationAlgorithm = match alg {
                    "ES256" => &signature::ECDSA_P256_SHA256_FIXED,
                    "ES384" => &signature::ECDSA_P384_SHA384_FIXED,
                    _ => return false,
                };
                UnparsedPublicKey::new(algorithm, point)
                    .verify(message, sig)
                    .is_ok()
            }
            Key::Ed25519(x) => UnparsedPublicKey::new(&signature::ED25519, x)
                .verify(message, sig)
                .is_ok(),
        }
    }
}

/// The usable signing keys of a JWKS document (`{"keys": [...]}`); others are skipped.
pub fn parse_jwks(doc: &Value) -> Vec<Jwk> {
    doc.get("keys")
        .and_then(Value::as_array)
        .map(|keys| keys.iter().filter_map(Jwk::parse).collect())
        .unwrap_or_default()
}

/// A token split into its parts, not yet verified.
pub struct Unverified<'a> {
    pub alg: String,
    pub kid: Option<String>,
    pub claims: Value,
    signing_input: &'a str,
    signature: Vec<u8>,
}

/// Splits a compact JWS; refuses anything but three base64url parts with JSON objects, and any
/// algorithm that is not an allowed asymmetric one.
pub fn split(token: &str) -> Result<Unverified<'_>, String> {
    let mut parts = token.split('.');
    let (Some(h), Some(c), Some(s), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("not a signed JWT (three base64url parts)".into());
    };
    let header: Value = unb64(h)
        .and_then(|b| serde_json::from_slice(&b).ok())
        .filter(Value::is_object)
        .ok_or("the JWT header is not a JSON object")?;
    let claims: Value = unb64(c)
        .and_then(|b| serde_json::from_slice(&b).ok())
        .filter(Value::is_object)
        .ok_or("the JWT claims are not a JSON object")?;
    let alg = header
        .get("alg")
        .and_then(Value::as_str)
        .unwrap_or("none")
        .to_string();
    if !(ALLOWED_ALGS.contains(&alg.as_str()) || alg == EDDSA) {
        return Err(format!(
            "algorithm {alg:?} is not accepted (only {} and {EDDSA})",
            ALLOWED_ALGS.join(", ")
        ));
    }
    if header.get("crit").is_some() {
        return Err("critical JWT header extensions are not supported".into());
    }
    let signature = unb64(s).ok_or("the JWT signature is not base64url")?;
    Ok(Unverified {
        alg,
        kid: header.get("kid").and_then(Value::as_str).map(String::from),
        claims,
        signing_input: &token[..h.len() + 1 + c.len()],
        signature,
    })
}

impl Unverified<'_> {
    /// Whether one of `keys` (the one named by `kid`, or any when the token names none) signed it.
    pub fn verified_by(&self, keys: &[Jwk]) -> bool {
        keys.iter()
            .filter(|k| self.kid.is_none() || k.kid == self.kid)
            .any(|k| k.verify(&self.alg, self.signing_input.as_bytes(), &self.signature))
    }

    /// Whether `keys` has a key with this token's `kid` (or any key when it names none).
    pub fn key_known(&self, keys: &[Jwk]) -> bool {
        keys.iter().any(|k| self.kid.is_none() || k.kid == self.kid)
    }
}

/// An ES256 key pair that signs ID tokens.
pub struct Signer {
    pair: signature::EcdsaKeyPair,
    kid: String,
}

impl Signer {
    /// From a PKCS#8 document, or a new key (returned as PKCS#8 to be kept) when `pkcs8` is None.
    pub fn load_or_generate(pkcs8: Option<&[u8]>) -> Result<(Signer, Vec<u8>), String> {
        let rng = ring::rand::SystemRandom::new();
        let alg = &signature::ECDSA_P256_SHA256_FIXED_SIGNING;
        let der = match pkcs8 {
            Some(d) => d.to_vec(),
            None => signature::EcdsaKeyPair::generate_pkcs8(alg, &rng)
                .map_err(|_| "cannot generate a signing key")?
                .as_ref()
                .to_vec(),
        };
        let pair = signature::EcdsaKeyPair::from_pkcs8(alg, &der, &rng)
            .map_err(|_| "the signing key file is not an ES256 PKCS#8 key")?;
        use ring::signature::KeyPair as _;
        let kid = b64(&sha2_256(pair.public_key().as_ref())[..12]);
        Ok((Signer { pair, kid }, der))
    }

    pub fn jwks(&self) -> Value {
        use ring::signature::KeyPair as _;
        let point = self.pair.public_key().as_ref();
        serde_json::json!({"keys": [{
            "kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256", "kid": self.kid,
            "x": b64(&point[1..33]), "y": b64(&point[33..65]),
        }]})
    }

    pub fn sign(&self, claims: &Value) -> Result<String, String> {
        let header = serde_json::json!({"alg": "ES256", "typ": "JWT", "kid": self.kid});
        let input = format!(
            "{}.{}",
            b64(header.to_string().as_bytes()),
            b64(claims.to_string().as_bytes())
        );
        let rng = ring::rand::SystemRandom::new();
        let sig = self
            .pair
            .sign(&rng, input.as_bytes())
            .map_err(|_| "cannot sign")?;
        Ok(format!("{input}.{}", b64(sig.as_ref())))
    }
}

pub fn sha2_256(bytes: &[u8]) -> [u8; 32] {
    use sha2::Digest as _;
    sha2::Sha256::digest(bytes).into()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn signed_tokens_verify_and_tampered_or_hmac_ones_do_not() {
        let (signer, der) = Signer::load_or_generate(None).unwrap();
        let (again, _) = Signer::load_or_generate(Some(&der)).unwrap();
        assert_eq!(signer.jwks(), again.jwks());
        let keys = parse_jwks(&signer.jwks());
        let token = signer.sign(&serde_json::json!({"sub": "a"})).unwrap();
        let t = split(&token).unwrap();
        assert!(t.verified_by(&keys));
        // Another claim set under the same signature.
        let mut parts: Vec<&str> = token.split('.').collect();
        let forged = b64(br#"{"sub":"b"}"#);
        parts[1] = &forged;
        assert!(!split(&parts.join(".")).unwrap().verified_by(&keys));
        for alg in ["none", "HS256", "HS512", "nOnE"] {
            let h = b64(format!(r#"{{"alg":"{alg}"}}"#).as_bytes());
            let e = split(&format!("{h}.{}.", b64(b"{}"))).err().unwrap();
            assert!(e.contains("not accepted"), "{e}");
        }
        assert!(split("a.b").is_err());
        // An ES256 key is not used for ES384 or RS256.
        let h = b64(br#"{"alg":"RS256"}"#);
        let rs = format!("{h}.{}.{}", b64(b"{}"), b64(b"sig"));
        assert!(!split(&rs).unwrap().verified_by(&keys));
    }
}
