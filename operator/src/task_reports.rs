//! What the agents' per-pod reports say beyond the health of the stores themselves: stores
//! that back off (a full disk, an I/O error: not damage, nothing quarantined) and pods that own
//! no partition because there are more replicas than input partitions. Small pure functions,
//! used by [`crate::status`] for the StateHealthy condition.

use streamapp_api::crd::PodStateStatus;

/// Reason of StateHealthy=False while a store backs off.
pub const STORE_BACKING_OFF: &str = "StoreBackingOff";

/// The stores that back off, in words, or `None`.
pub fn stores_backing_off(reports: &[&PodStateStatus]) -> Option<String> {
    let lines: Vec<String> = reports
        .iter()
        .flat_map(|p| p.tasks.iter().map(move |t| (p, t)))
        .filter_map(|(p, t)| {
            let why = t.backoff.as_deref()?;
            let since = t
                .backoff_since
                .as_deref()
                .map(|s| format!(" since {s}"))
                .unwrap_or_default();
            Some(format!(
                "pod {} cannot use the store of partition {}{since} ({why}); it retries",
                p.name, t.partition
            ))
        })
        .collect();
    (!lines.is_empty()).then(|| lines.join("; "))
}

/// When `desired` replicas exceed the input topic's partitions (as the processors found them),
/// says so: the extra pods are ready and idle.
pub fn idle_replicas(desired: i32, reports: &[&PodStateStatus]) -> Option<String> {
    let partitions = reports.iter().filter_map(|p| p.input_partitions).max()?;
    (desired > partitions).then(|| {
        format!(
            "spec.replicas is {desired} but the input topic has {partitions} partitions: {} pods own no partition \
             (they stay ready and take partitions over when another pod goes)",
            desired - partitions
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use streamapp_api::crd::TaskStateStatus;

    fn pod(name: &str, partitions: Option<i32>, tasks: Vec<TaskStateStatus>) -> PodStateStatus {
        PodStateStatus {
            name: name.into(),
            input_partitions: partitions,
            tasks,
            ..Default::default()
        }
    }

    #[test]
    fn a_store_backing_off_is_named_with_its_pod_partition_and_reason() {
        let backing_off = TaskStateStatus {
            partition: 3,
            backoff: Some("DiskFull: No space left on device".into()),
            backoff_since: Some("2026-12-01T10:00:00Z".into()),
            ..Default::default()
        };
        let fine = TaskStateStatus {
            partition: 1,
            ..Default::default()
        };
        let a = pod("app-0", Some(4), vec![fine.clone()]);
        let b = pod("app-1", Some(4), vec![backing_off]);
        assert_eq!(stores_backing_off(&[&a]), None);
        assert_eq!(
            stores_backing_off(&[&a, &b]).as_deref(),
            Some(
                "pod app-1 cannot use the store of partition 3 since 2026-12-01T10:00:00Z \
                 (DiskFull: No space left on device); it retries"
            )
        );
    }

    #[test]
    fn more_replicas_than_partitions_are_reported_as_idle_pods() {
        let a = pod("app-0", Some(2), vec![]);
        let b = pod("app-1", None, vec![]);
        assert_eq!(
            idle_replicas(3, &[&a, &b]).as_deref(),
            Some(
                "spec.replicas is 3 but the input topic has 2 partitions: 1 pods own no partition \
                 (they stay ready and take partitions over when another pod goes)"
            )
        );
        assert_eq!(idle_replicas(2, &[&a, &b]), None);
        assert_eq!(
            idle_replicas(5, &[&b]),
            None,
            "unknown until a processor says"
        );
    }
}
