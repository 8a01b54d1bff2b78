//! Rollouts that cannot get stuck.
//!
//! With `podManagementPolicy: OrderedReady` a pod rolled to a template that never becomes
//! ready (an image that does not exist, a crash at start) blocks the StatefulSet for good:
//! reverting the spec does not replace it until someone deletes the pod by hand (Kubernetes'
//! "forced rollback"). With `Parallel` the StatefulSet controller replaces such an outdated pod
//! itself once the spec is reverted, still one pod at a time and waiting for readiness during
//! rollouts (e2e: a_bad_image_rolled_out_then_reverted_heals_without_deleting_a_pod_by_hand).
//!
//! The policy is immutable, though: a StatefulSet an earlier operator version made with
//! `OrderedReady` is deleted with `propagationPolicy: Orphan` — its pods keep running and keep
//! their volumes — and created again with `Parallel`, which adopts the same pods. This decides
//! when; the reconciler deletes.

use k8s_openapi::api::apps::v1::StatefulSet;

use crate::statefulset::POD_MANAGEMENT_POLICY;

/// Whether the live StatefulSet must be replaced (orphaning its pods) to get the current pod
/// management policy.
pub fn needs_recreate(live: &StatefulSet) -> bool {
    let policy = live
        .spec
        .as_ref()
        .and_then(|s| s.pod_management_policy.as_deref())
        .unwrap_or("OrderedReady");
    policy != POD_MANAGEMENT_POLICY
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sts(policy: Option<&str>) -> StatefulSet {
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": "orders" },
            "spec": {
                "podManagementPolicy": policy,
                "selector": {}, "serviceName": "orders", "template": {},
            },
        }))
        .unwrap()
    }

    #[test]
    fn a_statefulset_made_with_ordered_ready_is_recreated_and_a_parallel_one_is_not() {
        assert!(needs_recreate(&sts(Some("OrderedReady"))));
        assert!(needs_recreate(&sts(None)), "OrderedReady is the default");
        assert!(!needs_recreate(&sts(Some("Parallel"))));
    }
}
