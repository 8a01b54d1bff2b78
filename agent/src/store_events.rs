//! Kubernetes Events about stores, which the processor cannot publish itself (it has no API
//! access): a damaged store it moved to quarantine (the agent sees the new folder), and a
//! store that backs off because it cannot be used for now (a full disk, an I/O error, its
//! lock held; the processor's report says so). Each is told to `kubectl describe streamapp`
//! once.
//!
//! "Once" across agent restarts: at start the agent reads its pod's entry in the StreamApp's
//! status; a quarantine no newer than the entry's `lastQuarantineAt`, and a back-off that began
//! no later than its `backoffSince`, have been reported already.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client, Resource, ResourceExt};
use streamapp_api::crd::StreamApp;
use streamapp_api::health::TaskHealth;
use streamapp_api::state_volume::QuarantinedStore;
use tracing::{info, warn};

use crate::error::{Error, Result};

/// `reportingController` of the agent's Events.
pub const REPORTING_CONTROLLER: &str = "streamapp.dev/agent";
/// Reason of the Event for a quarantined store.
pub const QUARANTINE_REASON: &str = "StoreQuarantined";
/// Reason of the Event for a store that backs off.
pub const BACKOFF_REASON: &str = "StoreBackingOff";
/// Events' notes are limited to 1 kB.
const NOTE_LIMIT: usize = 1024;

/// Per partition, the time (Unix ms) of the newest quarantine (or back-off start) already
/// reported.
pub type Announced = BTreeMap<i32, i64>;

/// What the pod's status entry already says: quarantines (`lastQuarantineAt`) and back-offs
/// (`backoffSince`). Times in status have whole seconds, so anything within that second counts
/// as reported.
pub fn announced_in_status(app: &StreamApp, pod: &str) -> (Announced, Announced) {
    let Some(entry) = app
        .status
        .as_ref()
        .and_then(|s| s.pods.iter().find(|p| p.name == pod))
    else {
        return (Announced::new(), Announced::new());
    };
    let times = |field: fn(&streamapp_api::crd::TaskStateStatus) -> Option<&String>| {
        entry
            .tasks
            .iter()
            .filter_map(|t| {
                let at: Timestamp = field(t)?.parse().ok()?;
                Some((t.partition, at.as_millisecond() + 999))
            })
            .collect::<Announced>()
    };
    (
        times(|t| t.last_quarantine_at.as_ref()),
        times(|t| t.backoff_since.as_ref()),
    )
}

/// The back-offs in `tasks` that were not reported yet.
pub fn unannounced_backoffs<'a>(
    tasks: &'a [TaskHealth],
    announced: &Announced,
) -> Vec<&'a TaskHealth> {
    tasks
        .iter()
        .filter(|t| {
            t.backoff.as_ref().is_some_and(|b| {
                announced
                    .get(&t.partition)
                    .is_none_or(|at| b.since_ms > *at)
            })
        })
        .collect()
}

/// The quarantines in `found` that were not reported yet.
pub fn unannounced<'a>(
    found: &'a [QuarantinedStore],
    announced: &Announced,
) -> Vec<&'a QuarantinedStore> {
    found
        .iter()
        .filter(|q| announced.get(&q.partition).is_none_or(|at| q.at_ms > *at))
        .collect()
}

/// Publishes one Warning Event per new quarantine and per new back-off, regarding the
/// StreamApp.
pub struct StoreEvents {
    api: Api<Event>,
    regarding: ObjectReference,
    pod: String,
    /// `None` until known: then the first look at the disk is the baseline.
    announced: Option<Announced>,
    /// Back-offs reported: `None` until known, then the first report is the baseline.
    backoffs: Option<Announced>,
}

impl StoreEvents {
    /// `app` is the StreamApp as read at start-up, when that worked; without it, quarantines
    /// found on disk by the first [`StoreEvents::announce`] are taken as reported (better
    /// no Event than a repeated one).
    pub fn new(
        client: Client,
        namespace: &str,
        app_name: &str,
        pod: &str,
        app: Option<&StreamApp>,
    ) -> Self {
        let regarding = ObjectReference {
            api_version: Some(StreamApp::api_version(&()).into_owned()),
            kind: Some(StreamApp::kind(&()).into_owned()),
            name: Some(app_name.into()),
            namespace: Some(namespace.into()),
            uid: app.and_then(|a| a.uid()),
            ..Default::default()
        };
        let (announced, backoffs) = app
            .map(|app| announced_in_status(app, pod))
            .map_or((None, None), |(q, b)| (Some(q), Some(b)));
        StoreEvents {
            api: Api::namespaced(client, namespace),
            regarding,
            pod: pod.into(),
            announced,
            backoffs,
        }
    }

    /// Publishes an Event for each back-off in the processor's `tasks` not reported before.
    /// Returns how many.
    pub async fn announce_backoffs(&mut self, tasks: &[TaskHealth]) -> Result<usize> {
        let Some(announced) = &mut self.backoffs else {
            let mut baseline = Announced::new();
            for t in tasks {
                if let Some(b) = &t.backoff {
                    baseline.insert(t.partition, b.since_ms);
                }
            }
            self.backoffs = Some(baseline);
            return Ok(0);
        };
        let new: Vec<TaskHealth> = unannounced_backoffs(tasks, announced)
            .into_iter()
            .cloned()
            .collect();
        for t in &new {
            let since = t.backoff.as_ref().map_or(0, |b| b.since_ms);
            announced.insert(t.partition, since);
        }
        for t in &new {
            let Some(b) = &t.backoff else { continue };
            let note = format!(
                "pod {}: the store of partition {} cannot be used for now ({:?}: {}); the processor \
                 retries it with back-off and does not quarantine it. Free space or fix the volume.",
                self.pod, t.partition, b.kind, b.reason
            );
            self.publish(BACKOFF_REASON, "BackOff", note, t.partition)
                .await?;
            info!(partition = t.partition, kind = ?b.kind, "published a StoreBackingOff event");
        }
        Ok(new.len())
    }

    /// Publishes an Event for each quarantine in `found` not reported before. Returns how many.
    pub async fn announce(&mut self, found: &[QuarantinedStore]) -> Result<usize> {
        let Some(announced) = &mut self.announced else {
            // No knowledge of what was reported: start from what is there now.
            let mut baseline = Announced::new();
            for q in found {
                mark(&mut baseline, q);
            }
            self.announced = Some(baseline);
            return Ok(0);
        };
        let new: Vec<QuarantinedStore> =
            unannounced(found, announced).into_iter().cloned().collect();
        for q in &new {
            // Marked before publishing: a failed Event is logged, not retried every second.
            mark(announced, q);
        }
        for q in &new {
            let note = format!(
                "pod {}: the store of partition {} was damaged, moved to quarantine and rebuilt from the changelog: {}",
                self.pod, q.partition, q.reason
            );
            self.publish(QUARANTINE_REASON, "Quarantine", note, q.partition)
                .await?;
            info!(partition = q.partition, reason = %q.reason, "published a StoreQuarantined event");
        }
        Ok(new.len())
    }

    async fn publish(
        &self,
        reason: &str,
        action: &str,
        mut note: String,
        partition: i32,
    ) -> Result<()> {
        if note.len() > NOTE_LIMIT {
            let mut cut = NOTE_LIMIT - 3;
            while !note.is_char_boundary(cut) {
                cut -= 1;
            }
            note.truncate(cut);
            note.push_str("...");
        }
        let app = self.regarding.name.clone().unwrap_or_default();
        let now = Timestamp::now();
        let event = Event {
            // Named like kube-runtime's recorder names Events (`<object>.<hex nanoseconds>`);
            // generateName `<object>.` is refused, as a prefix must be a valid name itself.
            metadata: ObjectMeta {
                name: Some(format!("{app}.{:x}", now.as_nanosecond())),
                ..Default::default()
            },
            event_time: Some(MicroTime(now)),
            type_: Some("Warning".into()),
            reason: Some(reason.into()),
            action: Some(action.into()),
            note: Some(note),
            reporting_controller: Some(REPORTING_CONTROLLER.into()),
            reporting_instance: Some(self.pod.clone()),
            regarding: Some(self.regarding.clone()),
            ..Default::default()
        };
        self.api
            .create(&PostParams::default(), &event)
            .await
            .map(|_| ())
            .map_err(|source| {
                warn!(partition, reason, error = %source, "could not publish the event");
                Error::Event {
                    namespace: self.regarding.namespace.clone().unwrap_or_default(),
                    app,
                    source,
                }
            })
    }
}

fn mark(announced: &mut Announced, q: &QuarantinedStore) {
    let at = announced.entry(q.partition).or_insert(q.at_ms);
    *at = (*at).max(q.at_ms);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(partition: i32, at_ms: i64) -> QuarantinedStore {
        QuarantinedStore {
            path: Default::default(),
            partition,
            at_ms,
            reason: "damaged".into(),
        }
    }

    #[test]
    fn only_quarantines_newer_than_the_reported_ones_are_announced() {
        let found = [q(0, 1_000), q(0, 5_000), q(1, 2_000)];
        let announced = Announced::from([(0, 1_999)]);
        assert_eq!(unannounced(&found, &announced), vec![&found[1], &found[2]]);
    }

    #[test]
    fn the_status_entry_tells_which_quarantines_were_reported() {
        let app: StreamApp = serde_json::from_value(serde_json::json!({
            "apiVersion": "streamapp.dev/v1alpha1", "kind": "StreamApp",
            "metadata": { "name": "orders", "namespace": "shop" },
            "spec": { "image": "i", "kafka": { "bootstrapServers": "k:9092" },
                      "topology": { "inputTopic": "a", "outputTopic": "b", "deadLetterTopic": "c" } },
            "status": { "pods": [
                { "name": "orders-0", "tasks": [ { "partition": 2, "lastQuarantineAt": "2025-06-15T15:06:10Z" } ] },
                { "name": "orders-1", "tasks": [ { "partition": 3, "lastQuarantineAt": "2025-06-15T15:06:10Z" } ] },
            ] },
        }))
        .unwrap();
        let (announced, _) = announced_in_status(&app, "orders-0");
        assert_eq!(announced, Announced::from([(2, 1_749_999_970_999)]));
        // Reported with second precision: the same second is the same quarantine.
        assert!(unannounced(&[q(2, 1_749_999_970_500)], &announced).is_empty());
        assert_eq!(unannounced(&[q(2, 1_749_999_971_000)], &announced).len(), 1);
    }

    #[test]
    fn a_back_off_is_announced_once_per_episode() {
        use streamapp_api::health::{StoreBackoff, StoreUnavailable};
        let task = |partition: i32, since_ms: Option<i64>| TaskHealth {
            partition,
            backoff: since_ms.map(|since_ms| StoreBackoff {
                kind: StoreUnavailable::DiskFull,
                reason: "No space left on device".into(),
                since_ms,
                attempts: 3,
                retry_at_ms: since_ms + 4000,
            }),
            ..Default::default()
        };
        let tasks = [task(0, Some(5_000)), task(1, None), task(2, Some(9_000))];
        let announced = Announced::from([(0, 5_999)]);
        let new: Vec<i32> = unannounced_backoffs(&tasks, &announced)
            .iter()
            .map(|t| t.partition)
            .collect();
        assert_eq!(new, [2], "partition 0's episode was reported, 1 is fine");
        let later = [task(0, Some(60_000))];
        assert_eq!(
            unannounced_backoffs(&later, &announced).len(),
            1,
            "a new episode"
        );
    }
}
