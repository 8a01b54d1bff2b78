//! The StreamApp controller: fetches, calls the pure builders, applies.
//!
//! Every object is applied with server-side apply under one field manager ([`FIELD_MANAGER`]),
//! forced, so the operator owns exactly the fields it sets; the status is applied the same way
//! without `pods`, which the agents own.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolumeClaim, Pod, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, PartialObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Config as ControllerConfig};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use streamapp_api::crd::{StreamApp, StreamAppStatus};
use tracing::{debug, info, warn};

use crate::error::{Error, Result};
use crate::events::{Notice, status_changes, workload_changes};
use crate::metrics::Metrics;
use crate::owned::{self, FIELD_MANAGER};
use crate::pod_health::pod_problems;
use crate::preflight::{Blocker, INVALID_CONFIG, preflight};
use crate::status::{Findings, compute_status, needs_update};
use crate::storage::{StoragePlan, plan_storage};
use crate::{disruption_budget, processor_config, rbac, rollout, secrets, service, statefulset};

/// Requeue after a successful reconcile: a safety net, watches trigger the real work.
pub const REQUEUE: Duration = Duration::from_secs(5 * 60);
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
    controller
        .owns_stream(meta::<StatefulSet>(&client, ns, owned()))
        .owns_stream(meta::<Service>(&client, ns, owned()))
        .owns_stream(meta::<ConfigMap>(&client, ns, owned()))
        .owns_stream(meta::<PodDisruptionBudget>(&client, ns, owned()))
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
    if app.metadata.deletion_timestamp.is_some() {
        // Owner references let the garbage collector delete everything.
        return Ok(Action::await_change());
    }
    let client = &ctx.client;
    let ns = app.namespace().unwrap_or_default();
    let name = app.name_any();
    let id = format!("{ns}/{name}");

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
        let findings = Findings {
            blocker,
            desired_config_hash: Some(rendered.hash.clone()),
            pods: pod_problems(&list_pods(client, app).await?, Timestamp::now()),
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

    let live = read_statefulset(client, app).await?;
    if let Some(live) = live.as_ref().filter(|l| rollout::needs_recreate(l)) {
        replace_statefulset(ctx, app, live).await?;
        // The next reconcile creates the new StatefulSet once the old one is gone.
        return Ok(Action::requeue(Duration::from_secs(2)));
    }
    let storage = resize_claims(ctx, app, &ns).await?;

    let mut notices = Vec::new();
    let sts = match &blocker {
        // Nothing new rolls out: the pods keep the last configuration that passed the checks.
        Some(b) => {
            info!(app = %id, reason = b.reason, "rollout blocked");
            // Scaling is not part of the rollout: `kubectl scale` still works.
            match &live {
                Some(live)
                    if live.spec.as_ref().and_then(|s| s.replicas) != Some(app.spec.replicas) =>
                {
                    Some(scale_statefulset(ctx, app, live).await?)
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
            let secrets_hash = secrets_hash(client, app).await?;
            let mut desired =
                statefulset::desired_statefulset(app, &rendered.hash, secrets_hash.as_deref());
            if let Some(live) = &live {
                statefulset::keep_claim_template_sizes(&mut desired, live);
            }
            notices.extend(workload_changes(live.as_ref(), &desired));
            Some(apply(client, &ns, &desired).await?)
        }
    };

    let pods = list_pods(client, app).await?;
    delete_stale_config_maps(client, app, &rendered.hash, &pods).await?;
    let now = Timestamp::now();
    let problems = pod_problems(&pods, now);

    let findings = Findings {
        blocker,
        storage: storage.finding(),
        desired_config_hash: Some(rendered.hash.clone()),
        pods: problems,
        paused: false,
    };
    let status = compute_status(app, sts.as_ref(), &findings, now);
    for notice in notices {
        publish(ctx, app, notice).await;
    }
    write_status(ctx, app, status).await?;
    prune_pod_reports(ctx, app, &pods).await?;
    // Watches say when something changes (claims included); this is a safety net.
    Ok(Action::requeue(REQUEUE))
}

/// Sets only the replicas of the live StatefulSet (its template stays as it is), through its
/// scale subresource.
async fn scale_statefulset(
    ctx: &Context,
    app: &StreamApp,
    live: &StatefulSet,
) -> Result<StatefulSet> {
    let ns = app.namespace().unwrap_or_default();
    let name = app.name_any();
    let api = Api::<StatefulSet>::namespaced(ctx.client.clone(), &ns);
    let patch = serde_json::json!({ "spec": { "replicas": app.spec.replicas } });
    api.patch_scale(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(Error::kube(format!("scaling StatefulSet {ns}/{name}")))?;
    let from = live.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0);
    publish(
        ctx,
        app,
        Notice {
            warning: false,
            reason: "Scaled",
            note: format!(
                "scaled from {from} to {} replicas (the rest of the spec is not rolled out: see the Degraded condition)",
                app.spec.replicas
            ),
        },
    )
    .await;
    api.get(&name)
        .await
        .map_err(Error::kube(format!("reading StatefulSet {ns}/{name}")))
}

/// Deletes the live StatefulSet, leaving its pods (and their volumes) running, so that it can
/// be created again with what cannot change in place (see [`rollout`]).
async fn replace_statefulset(ctx: &Context, app: &StreamApp, live: &StatefulSet) -> Result<()> {
    let ns = app.namespace().unwrap_or_default();
    let name = app.name_any();
    if live.metadata.deletion_timestamp.is_none() {
        let policy = live
            .spec
            .as_ref()
            .and_then(|s| s.pod_management_policy.clone());
        Api::<StatefulSet>::namespaced(ctx.client.clone(), &ns)
            .delete(&name, &DeleteParams::orphan())
            .await
            .map_err(Error::kube(format!(
                "deleting StatefulSet {ns}/{name} (orphaning its pods)"
            )))?;
        publish(
            ctx,
            app,
            Notice {
                warning: false,
                reason: "ReplacingStatefulSet",
                note: format!(
                    "replacing StatefulSet {name} to change its podManagementPolicy from {} to {}; its pods keep running",
                    policy.as_deref().unwrap_or("OrderedReady"),
                    statefulset::POD_MANAGEMENT_POLICY
                ),
            },
        )
        .await;
    }
    Ok(())
}

async fn read_statefulset(client: &Client, app: &StreamApp) -> Result<Option<StatefulSet>> {
    let ns = app.namespace().unwrap_or_default();
    Api::<StatefulSet>::namespaced(client.clone(), &ns)
        .get_opt(&app.name_any())
        .await
        .map_err(Error::kube(format!(
            "reading StatefulSet {ns}/{}",
            app.name_any()
        )))
}

/// Creates the content-named configuration ConfigMap if it does not exist yet. It is immutable,
/// and its name is its content's hash: an existing one already holds exactly this.
async fn create_config_map(client: &Client, ns: &str, cm: &ConfigMap) -> Result<()> {
    let name = cm.metadata.name.clone().unwrap_or_default();
    match Api::<ConfigMap>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), cm)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(Error::kube(format!("creating ConfigMap {ns}/{name}"))(e)),
    }
}

/// Deletes the configuration ConfigMaps that no pod uses any more and that are not current.
async fn delete_stale_config_maps(
    client: &Client,
    app: &StreamApp,
    config_hash: &str,
    pods: &[Pod],
) -> Result<()> {
    let ns = app.namespace().unwrap_or_default();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let selector = format!(
        "{},{}={}",
        owned::selector_string(app),
        owned::COMPONENT_LABEL,
        owned::PROCESSOR_CONFIG
    );
    let mut existing: Vec<String> = api
        .list_metadata(&ListParams::default().labels(&selector))
        .await
        .map_err(Error::kube(format!(
            "listing the ConfigMaps of {ns}/{}",
            app.name_any()
        )))?
        .items
        .into_iter()
        .map(|cm| cm.name_any())
        .collect();
    let legacy = owned::legacy_config_map_name(app);
    if api
        .get_metadata_opt(&legacy)
        .await
        .map_err(Error::kube(format!("reading ConfigMap {ns}/{legacy}")))?
        .is_some()
    {
        existing.push(legacy);
    }
    let used: Vec<String> = pods
        .iter()
        .flat_map(|p| p.spec.iter().flat_map(|s| s.volumes.iter().flatten()))
        .filter_map(|v| v.config_map.as_ref().map(|c| c.name.clone()))
        .collect();
    let current = owned::config_map_name(app, config_hash);
    for name in processor_config::stale_config_maps(&existing, &current, &used) {
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => info!(config_map = %name, "deleted a configuration no pod uses"),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(Error::kube(format!("deleting ConfigMap {ns}/{name}"))(e)),
        }
    }
    Ok(())
}

/// The hash of the Secrets the pods read (see [`secrets`]).
async fn secrets_hash(client: &Client, app: &StreamApp) -> Result<Option<String>> {
    let ns = app.namespace().unwrap_or_default();
    let api: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let mut found = Vec::new();
    for name in secrets::referenced(app) {
        let secret = api
            .get_opt(&name)
            .await
            .map_err(Error::kube(format!("reading Secret {ns}/{name}")))?;
        found.push((name, secret));
    }
    Ok(secrets::contents_hash(&found))
}

/// The StreamApp's pods.
async fn list_pods(client: &Client, app: &StreamApp) -> Result<Vec<Pod>> {
    let ns = app.namespace().unwrap_or_default();
    Ok(Api::<Pod>::namespaced(client.clone(), &ns)
        .list(&ListParams::default().labels(&owned::selector_string(app)))
        .await
        .map_err(Error::kube(format!(
            "listing the pods of {ns}/{}",
            app.name_any()
        )))?
        .items)
}

/// Applies the aggregate status (without `pods`, which the agents own) when it changed, and
/// publishes the events its changes are worth.
async fn write_status(ctx: &Context, app: &StreamApp, status: StreamAppStatus) -> Result<()> {
    for notice in status_changes(app.status.as_ref(), &status) {
        publish(ctx, app, notice).await;
    }
    if !needs_update(app, &status) {
        return Ok(());
    }
    let ns = app.namespace().unwrap_or_default();
    let name = app.name_any();
    let patch = serde_json::json!({
        "apiVersion": StreamApp::api_version(&()),
        "kind": StreamApp::kind(&()),
        "status": status,
    });
    Api::<StreamApp>::namespaced(ctx.client.clone(), &ns)
        .patch_status(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await
        .map_err(Error::kube(format!(
            "applying the status of StreamApp {ns}/{name}"
        )))?;
    Ok(())
}

/// Removes the `status.pods` entries of pods that were scaled away (see
/// [`crate::status::stale_pod_reports`]). The entries belong to the agents' field managers, so
/// they are removed with a JSON patch that first tests each entry's name: an agent's write in
/// between makes the patch fail instead of removing the wrong entry, and the next reconcile
/// tries again.
async fn prune_pod_reports(ctx: &Context, app: &StreamApp, pods: &[Pod]) -> Result<()> {
    let existing: Vec<String> = pods.iter().map(|p| p.name_any()).collect();
    let mut stale = crate::status::stale_pod_reports(app, &existing);
    if stale.is_empty() {
        return Ok(());
    }
    // Highest index first, so the earlier indices stay valid.
    stale.sort_by(|a, b| b.0.cmp(&a.0));
    let ops: Vec<serde_json::Value> = stale
        .iter()
        .flat_map(|(i, name)| {
            [
                serde_json::json!({ "op": "test", "path": format!("/status/pods/{i}/name"), "value": name }),
                serde_json::json!({ "op": "remove", "path": format!("/status/pods/{i}") }),
            ]
        })
        .collect();
    let patch: json_patch::Patch =
        serde_json::from_value(serde_json::Value::Array(ops)).expect("a valid JSON patch");
    let ns = app.namespace().unwrap_or_default();
    match Api::<StreamApp>::namespaced(ctx.client.clone(), &ns)
        .patch_status(
            &app.name_any(),
            &PatchParams::default(),
            &Patch::<()>::Json(patch),
        )
        .await
    {
        Ok(_) => {
            let names: Vec<&str> = stale.iter().map(|(_, n)| n.as_str()).collect();
            info!(app = %app.name_any(), pods = ?names, "removed the reports of pods that were scaled away");
            Ok(())
        }
        // The list changed under us (a `test` failed): the next reconcile looks again.
        Err(kube::Error::Api(e)) if e.code == 422 || e.code == 409 => Ok(()),
        Err(e) => Err(Error::kube(format!(
            "removing stale status.pods entries of {ns}/{}",
            app.name_any()
        ))(e)),
    }
}

/// Expands the claims that are smaller than the spec (see [`crate::storage`]).
async fn resize_claims(ctx: &Context, app: &StreamApp, ns: &str) -> Result<StoragePlan> {
    let claims_api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), ns);
    // Claims made from the templates carry the pod selector labels.
    let claims = claims_api
        .list(&ListParams::default().labels(&owned::selector_string(app)))
        .await
        .map_err(Error::kube(format!(
            "listing the volume claims of {ns}/{}",
            app.name_any()
        )))?
        .items;
    if claims.is_empty() {
        return Ok(StoragePlan::default());
    }
    let mut expandable = BTreeMap::new();
    for class in claims
        .iter()
        .filter_map(|c| c.spec.as_ref()?.storage_class_name.clone())
    {
        if expandable.contains_key(&class) {
            continue;
        }
        let allows = Api::<StorageClass>::all(ctx.client.clone())
            .get_opt(&class)
            .await
            .map_err(Error::kube(format!("reading StorageClass {class}")))?
            .and_then(|c| c.allow_volume_expansion)
            .unwrap_or(false);
        expandable.insert(class, allows);
    }
    let plan = plan_storage(app, &claims, |class| {
        expandable.get(class).copied().unwrap_or(false)
    });
    for (claim, size) in &plan.resize {
        let patch =
            serde_json::json!({ "spec": { "resources": { "requests": { "storage": size } } } });
        claims_api
            .patch(claim, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(Error::kube(format!(
                "expanding volume claim {ns}/{claim} to {size}"
            )))?;
        info!(claim = %claim, size = %size, "expanding volume claim");
        publish(
            ctx,
            app,
            Notice {
                warning: false,
                reason: "StorageResizing",
                note: format!("expanding volume claim {claim} to {size}"),
            },
        )
        .await;
    }
    Ok(plan)
}

/// Server-side apply of an owned object under the operator's field manager.
async fn apply<K>(client: &Client, ns: &str, object: &K) -> Result<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Serialize
        + DeserializeOwned
        + Clone
        + std::fmt::Debug,
{
    let name = object.meta().name.clone().unwrap_or_default();
    Api::<K>::namespaced(client.clone(), ns)
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(object),
        )
        .await
        .map_err(Error::kube(format!(
            "applying {} {ns}/{name}",
            K::kind(&())
        )))
}

/// Publishes an event on the StreamApp; a failure is logged, never fails the reconcile.
async fn publish(ctx: &Context, app: &StreamApp, notice: Notice) {
    let event = Event {
        type_: if notice.warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: notice.reason.to_string(),
        note: Some(notice.note),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &app.object_ref(&())).await {
        warn!(app = %app.name_any(), reason = %event.reason, error = %e, "could not publish event");
    }
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
