//! Named volumes as PersistentVolumeClaims of the operator's storage class (`--storage-class`):
//! one claim per volume, asking for the volume's size and `ReadWriteMany` (sandboxes on any node
//! mount it at once), named from the engine's key so two tenants' volumes never meet; each
//! sandbox's pod mounts its claims.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeClaimVolumeSource, Pod,
    Volume, VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, PostParams};

use sandbox_mcp_model::driver::{DriverError, Storage, VolumeBind};

use crate::pod::MANAGED_BY;

/// A volume's size when the engine asks for none (it always does: see the engine's default).
const DEFAULT_BYTES: u64 = 1 << 30;
/// Label naming the volume a claim holds (its key: the name and a digest of the owner).
const VOLUME_LABEL: &str = "sandbox-mcp/volume";

/// The claim of volume `key`: a DNS name from a digest of the key (names may hold `_`).
pub(crate) fn claim_name(key: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, key.as_bytes());
    let hex: String = digest.as_ref()[..12]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sandbox-volume-{hex}")
}

/// Adds the claims of `volumes` to a sandbox's pod: one pod volume each, mounted in the sandbox
/// container at its path (read-only where asked, in both places).
pub(crate) fn mount_claims(pod: &mut Pod, volumes: &[VolumeBind]) {
    let Some(spec) = pod.spec.as_mut() else {
        return;
    };
    for (i, v) in volumes.iter().enumerate() {
        let name = format!("volume-{i}");
        spec.volumes.get_or_insert_with(Vec::new).push(Volume {
            name: name.clone(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim_name(&v.key),
                read_only: Some(v.read_only),
            }),
            ..Default::default()
        });
        if let Some(main) = spec.containers.first_mut() {
            main.volume_mounts
                .get_or_insert_with(Vec::new)
                .push(VolumeMount {
                    name,
                    mount_path: v.target.clone(),
                    read_only: Some(v.read_only),
                    ..Default::default()
                });
        }
    }
}

/// The driver's storage when volumes are claims: no files of sandboxes the engine can reach.
pub(crate) struct Claims {
    claims: Api<PersistentVolumeClaim>,
    class: String,
    runtime: tokio::runtime::Handle,
}

impl Claims {
    pub(crate) fn new(
        client: kube::Client,
        namespace: &str,
        class: &str,
        runtime: tokio::runtime::Handle,
    ) -> Self {
        Self {
            claims: Api::namespaced(client, namespace),
            class: class.to_string(),
            runtime,
        }
    }
}

impl Storage for Claims {
    fn name(&self) -> &'static str {
        "kubernetes"
    }

    fn disk_bytes(&self, _id: &str) -> u64 {
        0
    }

    fn create_volume(&self, key: &str, quota_bytes: Option<u64>) -> Result<(), DriverError> {
        let bytes = quota_bytes.unwrap_or(DEFAULT_BYTES);
        let claim = PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some(claim_name(key)),
                labels: Some(BTreeMap::from([
                    (MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string()),
                    (VOLUME_LABEL.to_string(), label_value(key)),
                ])),
                ..Default::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: Some(vec!["ReadWriteMany".into()]),
                storage_class_name: Some(self.class.clone()),
                resources: Some(VolumeResourceRequirements {
                    requests: Some(BTreeMap::from([(
                        "storage".to_string(),
                        Quantity(format!("{}Mi", (bytes >> 20).max(1))),
                    )])),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            status: None,
        };
        self.runtime.block_on(async {
            match self.claims.create(&PostParams::default(), &claim).await {
                Ok(_) => Ok(()),
                // Made already (a retry after a crash): the same key is the same volume.
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
                Err(e) => Err(DriverError::Launch(format!(
                    "cannot create the volume's PersistentVolumeClaim: {}",
                    crate::describe(&e)
                ))),
            }
        })
    }

    fn remove_volume(&self, key: &str) -> Result<(), DriverError> {
        self.runtime.block_on(async {
            match self
                .claims
                .delete(&claim_name(key), &DeleteParams::default())
                .await
            {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                Err(e) => Err(DriverError::Launch(format!(
                    "cannot delete the volume's PersistentVolumeClaim: {}",
                    crate::describe(&e)
                ))),
            }
        })
    }
}

/// A label value from a volume key: at most 63 of its characters that labels allow.
fn label_value(key: &str) -> String {
    key.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .take(63)
        .collect::<String>()
        .trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn claim_names_are_dns_names_of_their_key() {
        let (a, b) = (claim_name("data_1.0011"), claim_name("data-1.0011"));
        assert_ne!(a, b);
        assert!(
            a.len() <= 63
                && a.bytes()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        );
        assert_eq!(label_value("data_1.00ff"), "data-1.00ff");
    }
}
