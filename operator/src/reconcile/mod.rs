//! The StreamApp controller: fetches, calls the pure builders and decisions, applies.
//!
//! A running StreamApp's reconcile observes (the StatefulSet, pods, claims, Kafka), asks the
//! pure [`plan`] what to do (replicas, the reset's step, the scale-in's, when to look again),
//! and carries it out. Every object is applied with server-side apply under one field manager
//! ([`crate::owned::FIELD_MANAGER`]), forced, so the operator owns exactly the fields it sets;
//! the status is applied the same way without `pods`, which the agents own. [`objects`] reads
//! and writes the objects, [`operations`] works in the StreamApp's Kafka (topic checks, lag,
//! reset, cleanup).

pub mod doctor;
mod node_loss;
mod objects;
mod operations;
mod plan;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolumeClaim, Pod, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::jiff::Timestamp;
use kube::api::PartialObjectMeta;
use kube::runtime::controller::{Action, Config as ControllerConfig};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use streamapp_api::crd::StreamApp;
use tracing::{debug, info, warn};

use crate::cleanup::{FinalizerChange, finalizer_change};
use crate::error::{Error, Result};
use crate::events::workload_changes;
use crate::kafka::Kafka;
use crate::metrics::Metrics;
use crate::node_loss::NodeLossFinding;
use crate::owned;
use crate::pod_health::pod_problems;
use crate::preflight::{Blocker, INVALID_CONFIG, preflight};
use crate::status::{Findings, compute_status};
use crate::{
    disruption_budget, network_policy, processor_config, rbac, rollout, secrets, service,
    statefulset,
};
use objects::*;

/// Requeue after a successful reconcile: a safety net, watches trigger the real work.
pub const REQUEUE: Duration = Duration::from_secs(5 * 60);
/// Requeue while a topic is missing or the brokers do not answer.
pub const REQUEUE_WHILE_KAFKA_TROUBLE: Duration = Duration::from_secs(15);
/// Changes that arrive within this of each other are reconciled once.
pub const DEBOUNCE: Duration = Duration::from_millis(500);
/// First retry after a failed reconcile; it doubles with each failure up to [`RETRY_MAX`].
pub const RETRY_FIRST: Duration = Duration::from_secs(5);
pub const RETRY_MAX: Duration = Duration::from_secs(5 * 60);

/// What a reconcile needs.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    /// Failed reconciles in a row, per StreamApp (for the back-off).
    failures: std::sync::Mutex<BTreeMap<(String, String), u32>>,
    /// How fast each StreamApp's consumer group made progress (the lag's estimate in seconds).
    rates: operations::ProgressRates,
    /// The last look at each StreamApp's Kafka.
    kafka_views: operations::KafkaViews,
    /// What the transaction doctor remembers of each StreamApp.
    doctors: doctor::Doctors,
}

impl Context {
    pub fn new(client: Client, metrics: Arc<Metrics>, instance: String) -> Self {
        let reporter = Reporter {
            controller: "streamapp-operator".into(),
            instance: Some(instance),
        };
        Context {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            metrics,
            failures: Default::default(),
            rates: Default::default(),
            kafka_views: Default::default(),
            doctors: Default::default(),
        }
    }

    fn key(app: &StreamApp) -> (String, String) {
        (app.namespace().unwrap_or_default(), app.name_any())
    }

    /// Counts a failure; returns the failures in a row.
    fn failed(&self, app: &StreamApp) -> u32 {
        let mut failures = self.failures.lock().unwrap();
        let n = failures.entry(Self::key(app)).or_default();
        *n += 1;
        *n
    }

    fn succeeded(&self, app: &StreamApp) {
        self.failures.lock().unwrap().remove(&Self::key(app));
    }
}

/// Runs the controller until the stream of StreamApps ends. `namespace`: watch only this one
/// (None: all).
pub async fn run_controller(ctx: Arc<Context>, namespace: Option<String>) {
    let client = ctx.client.clone();
    fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + DeserializeOwned
            + Clone,
    {
        match namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        }
    }
    let ns = namespace.as_deref();
    // Owned objects are watched only when they carry our label (the operator does not cache
    // every ConfigMap or Role of the cluster), and only their metadata: a reconcile reads
    // what it needs itself, so the watches only say when to run.
    let owned = || watcher::Config::default().labels(&owned::managed_by_selector());
    fn meta<K>(
        client: &Client,
        namespace: Option<&str>,
        config: watcher::Config,
    ) -> impl futures::Stream<Item = std::result::Result<PartialObjectMeta<K>, watcher::Error>>
    + Send
    + 'static
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug
            + Send
            + Sync
            + 'static,
    {
        // An Api of PartialObjectMeta makes metadata-only requests.
        watcher(api::<PartialObjectMeta<K>>(client, namespace), config).touched_objects()
    }
    let controller = Controller::new(api::<StreamApp>(&client, ns), watcher::Config::default());
    let apps = controller.store();
    // The transaction doctor looks at every app on a timer of its own, and has one reconciled
    // when what it found changed.
    let (doctor_found, doctor_changes) = futures::channel::mpsc::unbounded();
    // Stopped with the controller (a lost lease drops this future): a follower ends nothing.
    let _doctor = doctor::Running(tokio::spawn(doctor::run(
        ctx.clone(),
        apps.clone(),
        doctor_found,
    )));
    // Ready once the StreamApps are all in the cache: reconciles see the whole picture.
    let synced = apps.clone();
    let metrics = ctx.metrics.clone();
    tokio::spawn(async move {
        // Asked again every second: a wait that starts before the first list is done was seen
        // not to wake up (kube-runtime 5); once the store is ready the call returns at once.
        loop {
            match tokio::time::timeout(Duration::from_secs(1), synced.wait_until_ready()).await {
                Ok(Ok(())) => {
                    metrics.probes.set_ready(true);
                    break;
                }
                Ok(Err(_)) => break,
                Err(_) => {}
            }
        }
    });
    controller
        .reconcile_on(doctor_changes)
        .owns_stream(meta::<StatefulSet>(&client, ns, owned()))
        .owns_stream(meta::<Service>(&client, ns, owned()))
        .owns_stream(meta::<ConfigMap>(&client, ns, owned()))
        .owns_stream(meta::<PodDisruptionBudget>(&client, ns, owned()))
        .owns_stream(meta::<NetworkPolicy>(&client, ns, owned()))
        .owns_stream(meta::<ServiceAccount>(&client, ns, owned()))
        .owns_stream(meta::<Role>(&client, ns, owned()))
        .owns_stream(meta::<RoleBinding>(&client, ns, owned()))
        // Pods and claims belong to the StatefulSet, not to the StreamApp: mapped by their app
        // label, so a pod that cannot start (which changes no StatefulSet count) and a volume
        // that finished growing are seen too.
        .watches_stream(meta::<Pod>(&client, ns, owned()), by_app_label)
        .watches_stream(
            meta::<PersistentVolumeClaim>(&client, ns, owned()),
            by_app_label,
        )
        // Secrets are not ours: every StreamApp that reads a changed one is reconciled (its
        // pods roll, see `secrets`).
        .watches_stream(
            meta::<Secret>(&client, ns, watcher::Config::default()),
            move |secret: PartialObjectMeta<Secret>| {
                let (name, ns) = (secret.name_any(), secret.namespace());
                apps.state()
                    .into_iter()
                    .filter(|app| app.namespace() == ns && secrets::referenced(app).contains(&name))
                    .map(|app| ObjectRef::from_obj(&*app))
                    .collect::<Vec<_>>()
            },
        )
        // A burst of changes (an agent's report, a pod's status, the StatefulSet's) is one
        // reconcile, not one each.
        .with_config(
            ControllerConfig::default()
                .concurrency(16)
                .debounce(DEBOUNCE),
        )
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok((app, _)) => debug!(app = %app, "reconciled"),
                Err(e) => debug!(error = %e, "reconcile failed"),
            }
        })
        .await;
}

/// The StreamApp a pod or claim belongs to, by its app label.
fn by_app_label<K: Resource>(object: PartialObjectMeta<K>) -> Option<ObjectRef<StreamApp>> {
    let app = object.labels().get(owned::APP_LABEL)?.clone();
    Some(ObjectRef::<StreamApp>::new(&app).within(&object.namespace()?))
}

/// Backs off after a failure, exponentially per StreamApp: a StreamApp whose reconcile keeps
/// failing (an API server refusing something) is retried less and less often, the others are
/// not slowed down.
pub fn error_policy(app: Arc<StreamApp>, error: &Error, ctx: Arc<Context>) -> Action {
    let failures = ctx.failed(&app);
    let delay = retry_delay(failures);
    warn!(app = %app.name_any(), namespace = ?app.namespace(), error = %error, failures, retry_in_s = delay.as_secs(), "reconcile failed");
    ctx.metrics.reconcile_failed(error);
    Action::requeue(delay)
}

/// 5 s after the first failure, doubling, at most 5 minutes.
pub fn retry_delay(failures: u32) -> Duration {
    let exp = failures.saturating_sub(1).min(6);
    (RETRY_FIRST * 2u32.pow(exp)).min(RETRY_MAX)
}

/// Brings one StreamApp's objects and status in line with its spec.
pub async fn reconcile(app: Arc<StreamApp>, ctx: Arc<Context>) -> Result<Action> {
    let _timer = ctx.metrics.reconcile_started();
    let action = reconcile_app(&app, &ctx).await;
    if action.is_ok() {
        ctx.succeeded(&app);
    }
    action
}

async fn reconcile_app(app: &StreamApp, ctx: &Context) -> Result<Action> {
    let client = &ctx.client;
    let ns = app.namespace().unwrap_or_default();
    let name = app.name_any();
    let id = format!("{ns}/{name}");

    if app.metadata.deletion_timestamp.is_some() {
        // With deletionPolicy: Delete the finalizer holds the StreamApp until Kafka is cleaned
        // up; the garbage collector deletes the owned objects afterwards.
        let pods = list_pods(client, app).await?;
        let kafka = kafka_of(client, app).await?;
        let (seen, _) = operations::observe(ctx, app, &kafka, true).await;
        return Ok(
            match operations::run_cleanup(ctx, app, &pods, &kafka, seen.as_ref()).await? {
                Some(again) => Action::requeue(again),
                None => Action::await_change(),
            },
        );
    }
    match finalizer_change(app) {
        FinalizerChange::Add => operations::set_finalizer(ctx, app, true).await?,
        FinalizerChange::Remove => operations::set_finalizer(ctx, app, false).await?,
        FinalizerChange::Keep => {}
    }

    let rendered = match processor_config::render(app) {
        Ok(rendered) => rendered,
        Err(e) => {
            // Nothing a retry changes: report it and wait for the spec to change.
            let findings = Findings {
                blocker: Some(Blocker {
                    reason: INVALID_CONFIG,
                    message: format!("the processor configuration cannot be rendered: {e}"),
                }),
                ..Default::default()
            };
            let live = read_statefulset(client, app).await?;
            write_status(
                ctx,
                app,
                compute_status(app, live.as_ref(), &findings, Timestamp::now()),
            )
            .await?;
            return Ok(Action::await_change());
        }
    };
    let blocker = preflight(app, &rendered.config).err();
    let paused =
        streamapp_api::annotations::is_true(app.annotations(), streamapp_api::annotations::PAUSED);
    if paused {
        // Only observe and report: nothing the spec asks for is applied.
        let live = read_statefulset(client, app).await?;
        let pods = list_pods(client, app).await?;
        let findings = Findings {
            blocker,
            desired_config_hash: Some(rendered.hash.clone()),
            pod_uids: pod_uids(&pods),
            pods: pod_problems(&pods, Timestamp::now()),
            paused: true,
            ..Default::default()
        };
        write_status(
            ctx,
            app,
            compute_status(app, live.as_ref(), &findings, Timestamp::now()),
        )
        .await?;
        return Ok(Action::requeue(REQUEUE));
    }

    apply(client, &ns, &rbac::desired_service_account(app)).await?;
    apply(client, &ns, &rbac::desired_role(app)).await?;
    apply(client, &ns, &rbac::desired_role_binding(app)).await?;
    apply(client, &ns, &service::desired_service(app)).await?;
    apply(
        client,
        &ns,
        &disruption_budget::desired_disruption_budget(app),
    )
    .await?;
    if network_policy::wanted(app) {
        apply(client, &ns, &network_policy::desired_network_policy(app)).await?;
    } else {
        delete_if_present::<NetworkPolicy>(client, &ns, &owned::workload_name(app)).await?;
    }

    let live = read_statefulset(client, app).await?;
    if let Some(live) = live.as_ref().filter(|l| rollout::needs_recreate(l)) {
        objects::replace_statefulset(ctx, app, live).await?;
        // The next reconcile creates the new StatefulSet once the old one is gone.
        return Ok(Action::requeue(Duration::from_secs(2)));
    }

    // Kafka: topics, lag, and what a reset in progress needs.
    let secrets = read_secrets(client, app).await?;
    let kafka = Kafka::for_app(app, &secrets_by_name(&secrets));
    let (seen, kafka_finding) = operations::observe(ctx, app, &kafka, plan::resetting(app)).await;
    let pods = list_pods(client, app).await?;
    let claims = list_claims(client, app).await?;
    let internal_topics = operations::internal_topics_present(app, seen.as_ref());
    let uids = pod_uids(&pods);
    let plan = plan::plan(
        app,
        &plan::Observed {
            live_replicas: live.as_ref().and_then(|l| l.spec.as_ref()?.replicas),
            ready_replicas: live
                .as_ref()
                .and_then(|l| l.status.as_ref()?.ready_replicas)
                .unwrap_or(0),
            pod_uids: &uids,
            claims: claims.len(),
            kafka: &kafka_finding,
            group_empty: operations::group_empty(seen.as_ref()),
            internal_topics: internal_topics.len(),
        },
        Timestamp::now(),
    );
    let reset_status =
        operations::run_reset_step(ctx, app, &plan.reset, &kafka, &claims, &internal_topics)
            .await?;
    let replicas = plan.replicas;
    // Pods of nodes that are gone: replaced, or held with a reason (spec.nodeLoss).
    let node_loss = node_loss::run(ctx, app, &pods, &claims, seen.as_ref(), replicas).await;
    if let Err(e) = &node_loss {
        warn!(app = %id, error = %e, "could not look at the nodes for spec.nodeLoss");
    }

    let storage = resize_claims(ctx, app, &ns).await?;
    let mut notices = Vec::new();
    let sts = match &blocker {
        // Nothing new rolls out: the pods keep the last configuration that passed the checks.
        Some(b) => {
            info!(app = %id, reason = b.reason, "rollout blocked");
            // Scaling is not part of the rollout: `kubectl scale` still works.
            match &live {
                Some(live) if live.spec.as_ref().and_then(|s| s.replicas) != Some(replicas) => {
                    Some(scale_statefulset(ctx, app, live, replicas).await?)
                }
                _ => live.clone(),
            }
        }
        None => {
            create_config_map(
                client,
                &ns,
                &processor_config::desired_config_map(app, &rendered),
            )
            .await?;
            let secrets_hash = secrets::contents_hash(&secrets);
            let mut desired =
                statefulset::desired_statefulset(app, &rendered.hash, secrets_hash.as_deref());
            statefulset::set_replicas(&mut desired, replicas);
            if let Some(live) = &live {
                statefulset::keep_claim_template_sizes(&mut desired, live);
            }
            notices.extend(workload_changes(live.as_ref(), &desired));
            Some(apply(client, &ns, &desired).await?)
        }
    };

    delete_stale_config_maps(client, app, &rendered.hash, &pods).await?;
    let now = Timestamp::now();
    let findings = Findings {
        blocker,
        storage: storage.finding(),
        desired_config_hash: Some(rendered.hash.clone()),
        pods: pod_problems(&pods, now),
        pod_uids: uids.clone(),
        paused: false,
        kafka: kafka_finding,
        effective_replicas: (replicas != app.spec.replicas).then_some(replicas),
        reset: reset_status,
        scale_in: plan.scale_in_waiting,
        transactions: ctx.doctors.finding(app),
        node_loss: Some(match &node_loss {
            Ok(plan) => NodeLossFinding::Planned {
                reason: plan.reason,
                message: plan.message.clone(),
            },
            Err(e) => NodeLossFinding::CannotObserve(e.to_string()),
        }),
    };
    let status = compute_status(app, sts.as_ref(), &findings, now);
    for notice in notices {
        publish(ctx, app, notice).await;
    }
    write_status(ctx, app, status).await?;
    prune_pod_reports(ctx, app, &uids).await?;
    operations::remove_departed_members(ctx, app, &kafka, seen.as_ref(), replicas, &pods).await;
    let mut requeue = plan.requeue;
    if let Ok(node_plan) = &node_loss {
        requeue = requeue.min(node_loss_requeue(node_plan));
    }
    Ok(Action::requeue(requeue))
}

/// When to look at the nodes again: when a node that is not Ready would count as lost, and
/// soon while pods of lost nodes are being replaced or held.
fn node_loss_requeue(plan: &crate::node_loss::Plan) -> Duration {
    let acting =
        (plan.reason != crate::node_loss::Reason::AllNodesReady).then_some(Duration::from_secs(10));
    [plan.recheck_after, acting]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(REQUEUE)
}

/// The UID of each pod, by name.
fn pod_uids(pods: &[Pod]) -> BTreeMap<String, String> {
    pods.iter()
        .filter_map(|p| Some((p.name_any(), p.metadata.uid.clone()?)))
        .collect()
}

/// The StreamApp's Kafka connection, or why there is none.
async fn kafka_of(client: &Client, app: &StreamApp) -> Result<std::result::Result<Kafka, String>> {
    let secrets = read_secrets(client, app).await?;
    Ok(Kafka::for_app(app, &secrets_by_name(&secrets)))
}

fn secrets_by_name(found: &[(String, Option<Secret>)]) -> BTreeMap<String, Secret> {
    found
        .iter()
        .filter_map(|(name, s)| Some((name.clone(), s.clone()?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_back_off_from_five_seconds_to_five_minutes() {
        let delays: Vec<u64> = (1..=9).map(|n| retry_delay(n).as_secs()).collect();
        assert_eq!(delays, [5, 10, 20, 40, 80, 160, 300, 300, 300]);
    }
}
