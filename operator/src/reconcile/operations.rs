//! The reconciler's work in the StreamApp's Kafka: looking at its topics and consumer group,
//! and carrying out the application reset and the deletion cleanup that [`crate::reset`] and
//! [`crate::cleanup`] decide.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolumeClaim, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use streamapp_api::config::{changelog_topic, internal_topics, pod_of_group_member};
use streamapp_api::crd::StreamApp;
use tracing::{debug, info, warn};

use super::Context;
use super::objects::{publish, publish_related};
use crate::cleanup::{self, FINALIZER, Step};
use crate::error::{Error, Result};
use crate::events::Notice;
use crate::kafka::{self, Kafka, Observation};
use crate::processor_config::application_id;
use crate::reset;
use crate::scaling;
use crate::status::KafkaFinding;

/// A StreamApp in the operator's per-app tables: (namespace, name).
type AppKey = (String, String);

/// Since when the rate is measured, the committed records then, and the last rate (records/s).
type RateSample = (Instant, i64, Option<f64>);

/// The rate the consumer group made progress at, per StreamApp: the lag's estimate in seconds.
#[derive(Default)]
pub struct ProgressRates {
    samples: std::sync::Mutex<BTreeMap<AppKey, RateSample>>,
}

/// Rates are measured over at least this long.
const RATE_WINDOW: Duration = Duration::from_secs(10);

impl ProgressRates {
    /// Seconds to process `lag` at the rate the committed offsets (summed: `committed`) moved.
    fn lag_seconds(&self, app: &StreamApp, committed: i64, lag: i64) -> Option<i64> {
        let key = (app.namespace().unwrap_or_default(), app.name_any());
        let mut samples = self.samples.lock().unwrap();
        let now = Instant::now();
        let entry = samples.entry(key).or_insert((now, committed, None));
        let elapsed = now.duration_since(entry.0);
        if elapsed >= RATE_WINDOW {
            let rate = (committed - entry.1).max(0) as f64 / elapsed.as_secs_f64();
            *entry = (now, committed, Some(rate));
        }
        if lag == 0 {
            return Some(0);
        }
        entry
            .2
            .filter(|r| *r > 0.0)
            .map(|rate| (lag as f64 / rate).ceil() as i64)
    }
}

/// The last look at each StreamApp's Kafka: reconciles run on every agent report, and asking
/// the brokers each time would be load for nothing (an unreachable cluster would also hold
/// every reconcile for a request timeout).
#[derive(Default)]
pub struct KafkaViews {
    last: std::sync::Mutex<BTreeMap<AppKey, View>>,
}

/// When a look was taken, and what it saw (or why it failed).
type View = (Instant, std::result::Result<Observation, String>);

/// How old a look may be: a successful one, a failed one, and either while a reset or a cleanup
/// waits on what it sees.
const VIEW_TTL: Duration = Duration::from_secs(10);
const FAILED_VIEW_TTL: Duration = Duration::from_secs(30);
const URGENT_VIEW_TTL: Duration = Duration::from_secs(1);

impl KafkaViews {
    fn get(
        &self,
        app: &StreamApp,
        urgent: bool,
    ) -> Option<std::result::Result<Observation, String>> {
        let key = (app.namespace().unwrap_or_default(), app.name_any());
        let last = self.last.lock().unwrap();
        let (at, seen) = last.get(&key)?;
        let ttl = match (urgent, seen.is_ok()) {
            (true, _) => URGENT_VIEW_TTL,
            (false, true) => VIEW_TTL,
            (false, false) => FAILED_VIEW_TTL,
        };
        (at.elapsed() < ttl).then(|| seen.clone())
    }

    /// Drops the last look, after the operator changed what it saw.
    fn forget(&self, app: &StreamApp) {
        let key = (app.namespace().unwrap_or_default(), app.name_any());
        self.last.lock().unwrap().remove(&key);
    }

    fn put(&self, app: &StreamApp, seen: std::result::Result<Observation, String>) {
        let key = (app.namespace().unwrap_or_default(), app.name_any());
        self.last
            .lock()
            .unwrap()
            .insert(key, (Instant::now(), seen));
    }
}

/// The topics the processors of `app` use: input, outputs, and the internal ones.
fn topics(app: &StreamApp) -> Vec<String> {
    let t = &app.spec.topology;
    let mut topics = vec![
        t.input_topic.clone(),
        t.output_topic.clone(),
        t.dead_letter_topic.clone(),
    ];
    topics.extend(t.duplicates_topic.clone());
    topics.extend(internal_topics(&application_id(app)));
    topics
}

/// The repartition topic, when the app's topology repartitions.
fn repartition_topic(app: &StreamApp) -> Option<String> {
    app.spec
        .topology
        .repartitions()
        .then(|| streamapp_api::config::repartition_topic(&application_id(app)))
}

/// A look at the StreamApp's Kafka (a recent one when there is one; `urgent`: at most a second
/// old), and what it means for the status.
pub(super) async fn observe(
    ctx: &Context,
    app: &StreamApp,
    kafka: &std::result::Result<Kafka, String>,
    urgent: bool,
) -> (Option<Observation>, KafkaFinding) {
    let kafka = match kafka {
        Ok(k) => k,
        Err(why) => return (None, KafkaFinding::Unreachable(why.clone())),
    };
    let observed = match ctx.kafka_views.get(app, urgent) {
        Some(recent) => recent,
        None => {
            let seen = kafka
                .observe(
                    topics(app),
                    app.spec.topology.input_topic.clone(),
                    repartition_topic(app),
                    application_id(app),
                )
                .await;
            ctx.kafka_views.put(app, seen.clone());
            seen
        }
    };
    match observed {
        Err(why) => (None, KafkaFinding::Unreachable(why)),
        Ok(seen) => {
            let changelog = changelog_topic(&application_id(app));
            let problems = kafka::topic_problems(app, &seen.topics, &changelog);
            let input_partitions = seen
                .topics
                .partitions
                .get(&app.spec.topology.input_topic)
                .copied()
                .flatten();
            let lag = input_partitions.map(|_| kafka::lag(&seen.input_ends, &seen.committed));
            let committed: i64 = seen.committed.iter().flatten().sum();
            let lag_seconds = lag.and_then(|l| ctx.rates.lag_seconds(app, committed, l));
            let repartition_lag = repartition_topic(app)
                .filter(|t| seen.topics.partitions.get(t).copied().flatten().is_some())
                .map(|_| kafka::lag(&seen.repartition_ends, &seen.repartition_committed));
            let finding = KafkaFinding::Seen {
                problems,
                input_partitions,
                lag,
                lag_seconds,
                repartition_lag,
            };
            (Some(seen), finding)
        }
    }
}

/// Removes from the consumer group the static members of pods a scale-in took away for good
/// ([`scaling::departed_members`] decides which), so their partitions move now instead of after
/// the session timeout, and says so in an Event. Best effort: a failure is logged, and the
/// members then expire with the session timeout as they would have.
pub(super) async fn remove_departed_members(
    ctx: &Context,
    app: &StreamApp,
    kafka: &std::result::Result<Kafka, String>,
    seen: Option<&Observation>,
    replicas: i32,
    pods: &[Pod],
) {
    let (Ok(kafka), Some(seen)) = (kafka, seen) else {
        return;
    };
    let members = match &seen.static_members {
        Ok(members) => members,
        Err(why) => {
            debug!(app = %app.name_any(), error = %why, "could not list the group's static members");
            return;
        }
    };
    let pods: Vec<String> = pods.iter().map(|p| p.name_any()).collect();
    let departed = scaling::departed_members(&app.name_any(), replicas, members, &pods);
    if departed.is_empty() {
        return;
    }
    let group = application_id(app);
    match kafka.remove_static_members(group.clone(), departed).await {
        Ok(removed) => {
            // The last look still lists them: look again rather than remove them twice.
            ctx.kafka_views.forget(app);
            if removed.is_empty() {
                return;
            }
            info!(app = %app.name_any(), members = ?removed, "removed the group members of pods that were scaled away");
            let mut by_pod: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
            for member in &removed {
                by_pod
                    .entry(pod_of_group_member(member))
                    .or_default()
                    .push(member);
            }
            for (pod, members) in by_pod {
                let note = format!(
                    "removed {} from consumer group {group}: pod {pod} was scaled away, so its partitions move now rather than after the session timeout",
                    members.join(", ")
                );
                let notice = Notice {
                    warning: false,
                    reason: "RemovedGroupMembers",
                    note,
                };
                let related = ObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(pod.to_string()),
                    namespace: app.namespace(),
                    ..Default::default()
                };
                publish_related(ctx, app, notice, Some(related)).await;
            }
        }
        Err(why) => warn!(app = %app.name_any(), error = %why,
            "removing the group members of pods that were scaled away failed; they leave with the session timeout"),
    }
}

/// Whether the consumer group has no members (or does not exist); false when Kafka could not
/// be asked.
pub(super) fn group_empty(seen: Option<&Observation>) -> bool {
    seen.is_some_and(|s| {
        s.group_state
            .as_deref()
            .is_some_and(|state| matches!(state, "Empty" | "Dead"))
    })
}

/// Internal topics of the StreamApp that still exist.
pub(super) fn internal_topics_present(app: &StreamApp, seen: Option<&Observation>) -> Vec<String> {
    let Some(seen) = seen else { return Vec::new() };
    internal_topics(&application_id(app))
        .into_iter()
        .filter(|t| seen.topics.partitions.get(t).copied().flatten().is_some())
        .collect()
}

/// Carries out the reset step `plan` asks for; returns the reset status to report.
pub(super) async fn run_reset_step(
    ctx: &Context,
    app: &StreamApp,
    plan: &reset::Plan,
    kafka: &std::result::Result<Kafka, String>,
    claims: &[PersistentVolumeClaim],
    internal_topics: &[String],
) -> Result<Option<streamapp_api::crd::ResetStatus>> {
    let ns = app.namespace().unwrap_or_default();
    match &plan.action {
        reset::Action::ResetOffsets(target) => {
            let outcome = match kafka {
                Ok(k) => {
                    k.reset_offsets(
                        application_id(app),
                        app.spec.topology.input_topic.clone(),
                        target.clone(),
                    )
                    .await
                }
                Err(why) => Err(why.clone()),
            };
            match outcome {
                Ok(()) => {
                    info!(app = %app.name_any(), ?target, "reset the consumer group's offsets");
                    publish(ctx, app, Notice {
                        warning: false,
                        reason: "ResetOffsets",
                        note: format!("moved consumer group {}'s offsets to {target:?}; clearing the state next", application_id(app)),
                    })
                    .await;
                    Ok(reset::after_offsets_reset(plan))
                }
                Err(why) => {
                    warn!(app = %app.name_any(), error = %why, "resetting offsets failed; retrying");
                    Ok(plan
                        .status
                        .clone()
                        .map(|s| streamapp_api::crd::ResetStatus {
                            message: Some(format!("moving the offsets failed, retrying: {why}")),
                            ..s
                        }))
                }
            }
        }
        reset::Action::ClearState => {
            let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
            for claim in claims
                .iter()
                .filter(|c| c.metadata.deletion_timestamp.is_none())
            {
                match api
                    .delete(&claim.name_any(), &DeleteParams::default())
                    .await
                {
                    Ok(_) => {}
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(e) => {
                        return Err(Error::kube(format!(
                            "deleting volume claim {ns}/{}",
                            claim.name_any()
                        ))(e));
                    }
                }
            }
            if !internal_topics.is_empty() {
                let deleted = match kafka {
                    Ok(k) => k.delete_topics(internal_topics).await,
                    Err(why) => Err(why.clone()),
                };
                if let Err(why) = deleted {
                    return Ok(plan
                        .status
                        .clone()
                        .map(|s| streamapp_api::crd::ResetStatus {
                            message: Some(format!(
                                "deleting the internal topics failed, retrying: {why}"
                            )),
                            ..s
                        }));
                }
            }
            Ok(plan.status.clone())
        }
        _ => Ok(plan.status.clone()),
    }
}

/// The cleanup of a StreamApp being deleted (see [`crate::cleanup`]). Returns how soon to look
/// again, None once the finalizer is gone.
pub(super) async fn run_cleanup(
    ctx: &Context,
    app: &StreamApp,
    pods: &[Pod],
    kafka: &std::result::Result<Kafka, String>,
    seen: Option<&Observation>,
) -> Result<Option<Duration>> {
    let ns = app.namespace().unwrap_or_default();
    let name = app.name_any();
    let since = app
        .metadata
        .deletion_timestamp
        .as_ref()
        .map_or_else(Timestamp::now, |t| t.0);
    let step = cleanup::plan(app, since, Timestamp::now(), pods.len(), group_empty(seen));
    match step {
        Step::Nothing => Ok(None),
        Step::StopPods { .. } => {
            // The StatefulSet goes to 0; each pod drains on its way out.
            let patch = serde_json::json!({ "spec": { "replicas": 0 } });
            match Api::<k8s_openapi::api::apps::v1::StatefulSet>::namespaced(
                ctx.client.clone(),
                &ns,
            )
            .patch_scale(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(Error::kube(format!("stopping the pods of {ns}/{name}"))(e)),
            }
            Ok(Some(Duration::from_secs(2)))
        }
        Step::DeleteFromKafka => {
            let topics = internal_topics(&application_id(app));
            let deleted = match kafka {
                Ok(k) => match k.delete_group(&application_id(app)).await {
                    Ok(()) => k.delete_topics(&topics).await,
                    Err(e) => Err(e),
                },
                Err(why) => Err(why.clone()),
            };
            match deleted {
                Ok(()) => {
                    info!(app = %name, "deleted the consumer group and internal topics");
                    publish(
                        ctx,
                        app,
                        Notice {
                            warning: false,
                            reason: "CleanedUp",
                            note: format!(
                                "deleted consumer group {} and topics {} (deletionPolicy: Delete)",
                                application_id(app),
                                topics.join(", ")
                            ),
                        },
                    )
                    .await;
                    remove_finalizer(ctx, app).await?;
                    Ok(None)
                }
                Err(why) => {
                    warn!(app = %name, error = %why, "cleanup failed; retrying");
                    Ok(Some(Duration::from_secs(5)))
                }
            }
        }
        Step::GiveUp => {
            publish(ctx, app, Notice {
                warning: true,
                reason: "CleanupAbandoned",
                note: format!(
                    "could not delete consumer group {} and the internal topics within {:?}; they are left in Kafka",
                    application_id(app),
                    cleanup::TIMEOUT
                ),
            })
            .await;
            remove_finalizer(ctx, app).await?;
            Ok(None)
        }
    }
}

/// Adds or removes the cleanup finalizer (a JSON patch that tests the list it replaces, so a
/// finalizer someone else added in between is not lost).
pub(super) async fn set_finalizer(ctx: &Context, app: &StreamApp, present: bool) -> Result<()> {
    let ns = app.namespace().unwrap_or_default();
    let current: Vec<String> = app.metadata.finalizers.clone().unwrap_or_default();
    let mut wanted: Vec<String> = current
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    if present {
        wanted.push(FINALIZER.to_string());
    }
    let ops = if app.metadata.finalizers.is_some() {
        serde_json::json!([
            { "op": "test", "path": "/metadata/finalizers", "value": current },
            { "op": "replace", "path": "/metadata/finalizers", "value": wanted },
        ])
    } else {
        serde_json::json!([{ "op": "add", "path": "/metadata/finalizers", "value": wanted }])
    };
    let patch: json_patch::Patch = serde_json::from_value(ops).expect("a valid JSON patch");
    Api::<StreamApp>::namespaced(ctx.client.clone(), &ns)
        .patch(
            &app.name_any(),
            &PatchParams::default(),
            &Patch::<()>::Json(patch),
        )
        .await
        .map_err(Error::kube(format!(
            "updating the finalizers of {ns}/{}",
            app.name_any()
        )))?;
    Ok(())
}

async fn remove_finalizer(ctx: &Context, app: &StreamApp) -> Result<()> {
    set_finalizer(ctx, app, false).await
}
