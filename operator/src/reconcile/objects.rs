//! Reading and writing a StreamApp's objects for the reconciler: server-side apply under the
//! operator's field manager, the configuration ConfigMaps, the StatefulSet's replacement and
//! scale, claims, Secrets, the status and its events. Thin: every decision is made elsewhere.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference, PersistentVolumeClaim, Pod, Secret};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType};
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use streamapp_api::crd::{StreamApp, StreamAppStatus};
use tracing::{info, warn};

use super::Context;
use crate::error::{Error, Result};
use crate::events::{Notice, status_changes};
use crate::owned::{self, FIELD_MANAGER};
use crate::status::needs_update;
use crate::storage::{StoragePlan, plan_storage};
use crate::{processor_config, secrets, statefulset};

/// Sets only the replicas of the live StatefulSet (its template stays as it is), through its
/// scale subresource.
pub(super) async fn scale_statefulset(
    ctx: &Context,
    app: &StreamApp,
    live: &StatefulSet,
    replicas: i32,
) -> Result<StatefulSet> {
    let ns = app.namespace().unwrap_or_default();
    let name = app.name_any();
    let api = Api::<StatefulSet>::namespaced(ctx.client.clone(), &ns);
    let patch = serde_json::json!({ "spec": { "replicas": replicas } });
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
                "scaled from {from} to {replicas} replicas (the rest of the spec is not rolled out: see the Degraded condition)"
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
pub(super) async fn replace_statefulset(
    ctx: &Context,
    app: &StreamApp,
    live: &StatefulSet,
) -> Result<()> {
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

pub(super) async fn read_statefulset(
    client: &Client,
    app: &StreamApp,
) -> Result<Option<StatefulSet>> {
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
pub(super) async fn create_config_map(client: &Client, ns: &str, cm: &ConfigMap) -> Result<()> {
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
pub(super) async fn delete_stale_config_maps(
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

/// The Secrets the pods read (see [`secrets`]), by name, with None for those that do not exist.
pub(super) async fn read_secrets(
    client: &Client,
    app: &StreamApp,
) -> Result<Vec<(String, Option<Secret>)>> {
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
    Ok(found)
}

/// The StreamApp's objects of kind `K` that carry its selector labels (its pods; its volume
/// claims, made from the templates); `what` names them in the error.
async fn list_labelled<K>(client: &Client, app: &StreamApp, what: &str) -> Result<Vec<K>>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + DeserializeOwned
        + Clone
        + std::fmt::Debug,
{
    let ns = app.namespace().unwrap_or_default();
    Ok(Api::<K>::namespaced(client.clone(), &ns)
        .list(&ListParams::default().labels(&owned::selector_string(app)))
        .await
        .map_err(Error::kube(format!(
            "listing the {what} of {ns}/{}",
            app.name_any()
        )))?
        .items)
}

/// The StreamApp's volume claims (state and WAL).
pub(super) async fn list_claims(
    client: &Client,
    app: &StreamApp,
) -> Result<Vec<PersistentVolumeClaim>> {
    list_labelled(client, app, "volume claims").await
}

/// The StreamApp's pods.
pub(super) async fn list_pods(client: &Client, app: &StreamApp) -> Result<Vec<Pod>> {
    list_labelled(client, app, "pods").await
}

/// Applies the aggregate status (without `pods`, which the agents own) when it changed, and
/// publishes the events its changes are worth.
pub(super) async fn write_status(
    ctx: &Context,
    app: &StreamApp,
    status: StreamAppStatus,
) -> Result<()> {
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

/// Removes the `status.pods` entries of pods that were scaled away, and those written by an
/// older pod of the same name (see [`crate::status::stale_pod_reports`]). The entries belong
/// to the agents' field managers, so they are removed with a JSON patch that first tests each
/// entry's name and UID: an agent's write in between makes the patch fail instead of removing
/// the wrong entry, and the next reconcile tries again.
pub(super) async fn prune_pod_reports(
    ctx: &Context,
    app: &StreamApp,
    pod_uids: &BTreeMap<String, String>,
) -> Result<()> {
    let mut stale = crate::status::stale_pod_reports(app, pod_uids);
    if stale.is_empty() {
        return Ok(());
    }
    // Highest index first, so the earlier indices stay valid.
    stale.sort_by_key(|s| std::cmp::Reverse(s.0));
    let ops: Vec<serde_json::Value> = stale
        .iter()
        .flat_map(|(i, name, uid)| {
            [
                Some(serde_json::json!({ "op": "test", "path": format!("/status/pods/{i}/name"), "value": name })),
                uid.as_ref().map(|uid| serde_json::json!({ "op": "test", "path": format!("/status/pods/{i}/uid"), "value": uid })),
                Some(serde_json::json!({ "op": "remove", "path": format!("/status/pods/{i}") })),
            ]
            .into_iter()
            .flatten()
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
            let names: Vec<&str> = stale.iter().map(|(_, n, _)| n.as_str()).collect();
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
pub(super) async fn resize_claims(ctx: &Context, app: &StreamApp, ns: &str) -> Result<StoragePlan> {
    let claims_api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), ns);
    let claims = list_claims(&ctx.client, app).await?;
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
pub(super) async fn apply<K>(client: &Client, ns: &str, object: &K) -> Result<K>
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

/// Deletes the owned object `name` if it exists (an optional object the spec turned off).
pub(super) async fn delete_if_present<K>(client: &Client, ns: &str, name: &str) -> Result<()>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + DeserializeOwned
        + Clone
        + std::fmt::Debug,
{
    match Api::<K>::namespaced(client.clone(), ns)
        .delete(name, &DeleteParams::default())
        .await
    {
        Ok(_) => {
            info!(kind = %K::kind(&()), %name, "deleted, the spec no longer asks for it");
            Ok(())
        }
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(Error::kube(format!(
            "deleting {} {ns}/{name}",
            K::kind(&())
        ))(e)),
    }
}

/// Publishes an event on the StreamApp; a failure is logged, never fails the reconcile.
pub(super) async fn publish(ctx: &Context, app: &StreamApp, notice: Notice) {
    publish_related(ctx, app, notice, None).await
}

/// [`publish`] with a second object the event is about (`related`). Events of the same reason
/// are one series per regarding and related object, shown with the first one's message: an
/// event per pod needs the pod as its related object.
pub(super) async fn publish_related(
    ctx: &Context,
    app: &StreamApp,
    notice: Notice,
    related: Option<ObjectReference>,
) {
    let event = Event {
        type_: if notice.warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: notice.reason.to_string(),
        note: Some(notice.note),
        action: "Reconcile".into(),
        secondary: related,
    };
    if let Err(e) = ctx.recorder.publish(&event, &app.object_ref(&())).await {
        warn!(app = %app.name_any(), reason = %event.reason, error = %e, "could not publish event");
    }
}
