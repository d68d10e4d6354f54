//! A pod's `activeDeadlineSeconds`, the kubelet's own kill at the sandbox's timeout, kept with
//! the timeout the engine records: set when a timeout is given to a pod that had none (a pod from
//! a warm pool handed to a caller), lowered when a timeout is shortened. It counts from the
//! pod's start, and the API server accepts it only lowered, never raised.

use k8s_openapi::api::core::v1::Pod;

/// The deadline to give `pod` for a sandbox that expires at `expires_at` (ms since the epoch),
/// when that is lower than the one it has, or it has none. `None`: nothing to change (no
/// timeout, a pod not started yet, or a deadline already as low).
pub(crate) fn lowered(pod: &Pod, expires_at: Option<i64>) -> Option<i64> {
    let expires_at = expires_at?;
    let started = pod
        .status
        .as_ref()?
        .start_time
        .as_ref()?
        .0
        .timestamp_millis();
    let seconds = seconds_between(started, expires_at);
    let current = pod.spec.as_ref()?.active_deadline_seconds;
    current.is_none_or(|c| seconds < c).then_some(seconds)
}

/// Whole seconds from `from_ms` to `at_ms`, rounded up, at least 1 (0 would mean no deadline):
/// what `activeDeadlineSeconds` says for a timeout at `at_ms` on a pod that starts at `from_ms`.
pub(crate) fn seconds_between(from_ms: i64, at_ms: i64) -> i64 {
    ((at_ms - from_ms).max(1000) + 999) / 1000
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use k8s_openapi::api::core::v1::{PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    fn pod(started_secs: Option<i64>, deadline: Option<i64>) -> Pod {
        Pod {
            spec: Some(PodSpec {
                active_deadline_seconds: deadline,
                ..Default::default()
            }),
            status: Some(PodStatus {
                start_time: started_secs
                    .map(|s| Time(k8s_openapi::chrono::DateTime::from_timestamp(s, 0).unwrap())),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_deadline_is_set_or_lowered_never_raised() {
        let ms = |s: i64| Some(s * 1000);
        // A pooled pod with none gets one, counted from its start (not from now).
        assert_eq!(lowered(&pod(Some(1_000), None), ms(1_300)), Some(300));
        // Shortened: lowered; rounded up to the second.
        assert_eq!(
            lowered(&pod(Some(1_000), Some(600)), Some(1_300_001)),
            Some(301)
        );
        // The same or later: left (the API server refuses a raise).
        assert_eq!(lowered(&pod(Some(1_000), Some(300)), ms(1_300)), None);
        assert_eq!(lowered(&pod(Some(1_000), Some(300)), ms(1_900)), None);
        // Already past: the least deadline there is, so the kubelet ends it at once.
        assert_eq!(lowered(&pod(Some(1_000), Some(300)), ms(900)), Some(1));
        // No timeout, or a pod not started: nothing to count from.
        assert_eq!(lowered(&pod(Some(1_000), None), None), None);
        assert_eq!(lowered(&pod(None, None), ms(1_300)), None);
    }
}
