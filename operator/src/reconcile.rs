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
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Config as ControllerConfig};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, watcher};
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
use crate::preflight::preflight;
use crate::status::{Findings, compute_status, needs_update};
use crate::storage::{StorageFinding, StoragePlan, plan_storage};
use crate::{disruption_budget, processor_config, rbac, service, statefulset};

/// Requeue after a successful reconcile: a safety net, watches trigger the real work.
pub const REQUEUE: Duration = Duration::from_secs(5 * 60);
/// Requeue while volumes grow (claims are not watched).
pub const REQUEUE_WHILE_RESIZING: Duration = Duration::from_secs(5);

/// What a reconcile needs.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
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
        }
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
    // Owned objects are watched only when they carry our label: the operator does not cache
    // every ConfigMap or Role of the cluster.
    let owned = || watcher::Config::default().labels(&owned::managed_by_selector());
    Controller::new(api::<StreamApp>(&client, ns), watcher::Config::default())
        .owns(api::<StatefulSet>(&client, ns), owned())
        .owns(api::<Service>(&client, ns), owned())
        .owns(api::<ConfigMap>(&client, ns), owned())
        .owns(api::<PodDisruptionBudget>(&client, ns), owned())
        .owns(api::<ServiceAccount>(&client, ns), owned())
        .owns(api::<Role>(&client, ns), owned())
        .owns(api::<RoleBinding>(&client, ns), owned())
        // Pods belong to the StatefulSet, not to the StreamApp: mapped by their app label, so
        // a pod that cannot start (which changes no StatefulSet count) is seen too.
        .watches(api::<Pod>(&client, ns), owned(), |pod: Pod| {
            let app = pod.labels().get(owned::APP_LABEL)?.clone();
            Some(ObjectRef::<StreamApp>::new(&app).within(&pod.namespace()?))
        })
        .with_config(ControllerConfig::default().concurrency(16))
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok((app, _)) => debug!(app = %app, "reconciled"),
                Err(e) => debug!(error = %e, "reconcile failed"),
            }
        })
        .await;
}

/// Backs off after a failure (the controller also backs off repeated triggers).
pub fn error_policy(app: Arc<StreamApp>, error: &Error, ctx: Arc<Context>) -> Action {
    warn!(app = %app.name_any(), namespace = ?app.namespace(), error = %error, "reconcile failed");
    ctx.metrics.reconcile_failed(error);
    Action::requeue(Duration::from_secs(15))
}

/// Brings one StreamApp's objects and status in line with its spec.
pub async fn reconcile(app: Arc<StreamApp>, ctx: Arc<Context>) -> Result<Action> {
    let _timer = ctx.metrics.reconcile_started();
    if app.metadata.deletion_timestamp.is_some() {
        // Owner references let the garbage collector delete everything.
        return Ok(Action::await_change());
    }
    let client = &ctx.client;
    let ns = app.namespace().unwrap_or_default();
    let name = app.name_any();
    let id = format!("{ns}/{name}");

    let rendered = processor_config::render(&app).map_err(|source| Error::Render {
        app: id.clone(),
        source,
    })?;
    let blocker = preflight(&app, &rendered.config).err();
    let paused =
        streamapp_api::annotations::is_true(app.annotations(), streamapp_api::annotations::PAUSED);
    if paused {
        // Only observe and report: nothing the spec asks for is applied.
        let live = Api::<StatefulSet>::namespaced(client.clone(), &ns)
            .get_opt(&name)
            .await
            .map_err(Error::kube(format!("reading StatefulSet {id}")))?;
        let findings = Findings {
            blocker,
            desired_config_hash: Some(rendered.hash.clone()),
            pods: pod_problems(&list_pods(client, &app).await?, Timestamp::now()),
            paused: true,
            ..Default::default()
        };
        write_status(
            &ctx,
            &app,
            compute_status(&app, live.as_ref(), &findings, Timestamp::now()),
        )
        .await?;
        return Ok(Action::requeue(REQUEUE));
    }

    apply(client, &ns, &rbac::desired_service_account(&app)).await?;
    apply(client, &ns, &rbac::desired_role(&app)).await?;
    apply(client, &ns, &rbac::desired_role_binding(&app)).await?;
    apply(client, &ns, &service::desired_service(&app)).await?;
    apply(
        client,
        &ns,
        &disruption_budget::desired_disruption_budget(&app),
    )
    .await?;

    let sts_api: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    let live = sts_api
        .get_opt(&name)
        .await
        .map_err(Error::kube(format!("reading StatefulSet {id}")))?;

    let storage = resize_claims(&ctx, &app, &ns).await?;

    let mut notices = Vec::new();
    let sts = match &blocker {
        // Nothing new rolls out: the pods keep the last configuration that passed the checks.
        Some(b) => {
            info!(app = %id, reason = b.reason, "rollout blocked");
            live.clone()
        }
        None => {
            apply(
                client,
                &ns,
                &processor_config::desired_config_map(&app, &rendered),
            )
            .await?;
            let mut desired = statefulset::desired_statefulset(&app, &rendered.hash);
            if let Some(live) = &live {
                statefulset::keep_claim_template_sizes(&mut desired, live);
            }
            notices.extend(workload_changes(live.as_ref(), &desired));
            Some(apply(client, &ns, &desired).await?)
        }
    };

    let now = Timestamp::now();
    let findings = Findings {
        blocker,
        storage: storage.finding(),
        desired_config_hash: Some(rendered.hash.clone()),
        pods: pod_problems(&list_pods(client, &app).await?, now),
        paused: false,
    };
    let status = compute_status(&app, sts.as_ref(), &findings, now);
    for notice in notices {
        publish(&ctx, &app, notice).await;
    }
    write_status(&ctx, &app, status).await?;

    Ok(match findings.storage {
        StorageFinding::Resizing(_) => Action::requeue(REQUEUE_WHILE_RESIZING),
        _ => Action::requeue(REQUEUE),
    })
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
