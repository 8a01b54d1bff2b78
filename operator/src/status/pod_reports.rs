//! Which of the agents' entries in `status.pods` count: those written by the pod of that name
//! that exists now, below `spec.replicas`. An old pod's agent (a node that came back) or a
//! scaled-away pod's last report never counts, and is pruned.

use std::collections::BTreeMap;

use kube::ResourceExt;
use streamapp_api::crd::{PodStateStatus, StreamApp};

/// Whether `report` was written by another pod than the one of its name that exists now
/// (`pod_uids`: UID by pod name): an old pod's agent on a node that came back, writing over
/// its replacement's entry. A report without a UID (an older agent) is taken as it is.
pub fn report_is_stale(report: &PodStateStatus, pod_uids: &BTreeMap<String, String>) -> bool {
    match (&report.uid, pod_uids.get(&report.name)) {
        (Some(reported), Some(live)) => reported != live,
        _ => false,
    }
}

/// Entries of `status.pods` to remove, with their index and UID: those of pods beyond
/// `spec.replicas` that no longer exist (scaled away; their agents wrote a last report and are
/// gone), and those written by another pod than the one of that name that exists now
/// ([`report_is_stale`]). The entry of a pod that still runs, even one shutting down, stays.
pub fn stale_pod_reports(
    app: &StreamApp,
    pod_uids: &BTreeMap<String, String>,
) -> Vec<(usize, String, Option<String>)> {
    let name = app.name_any();
    let Some(status) = &app.status else {
        return Vec::new();
    };
    let scaled_away = |p: &PodStateStatus| {
        !pod_uids.contains_key(&p.name)
            && crate::owned::pod_ordinal(&name, &p.name)
                .is_none_or(|ordinal| ordinal >= app.spec.replicas)
    };
    status
        .pods
        .iter()
        .enumerate()
        .filter(|(_, p)| scaled_away(p) || report_is_stale(p, pod_uids))
        .map(|(i, p)| (i, p.name.clone(), p.uid.clone()))
        .collect()
}

/// The agents' reports of pods that should exist: `<name>-<ordinal>` below `spec.replicas`,
/// written by the pod of that name that exists now. Entries of scaled-away pods stay in
/// `status.pods` (their agents own them) until they are pruned, but no longer count.
pub fn current_reports<'a>(
    app: &'a StreamApp,
    pod_uids: &BTreeMap<String, String>,
) -> Vec<&'a PodStateStatus> {
    let name = app.name_any();
    let Some(status) = &app.status else {
        return Vec::new();
    };
    status
        .pods
        .iter()
        .filter(|p| {
            crate::owned::pod_ordinal(&name, &p.name)
                .is_some_and(|ordinal| ordinal < app.spec.replicas)
        })
        .filter(|p| !report_is_stale(p, pod_uids))
        .collect()
}
