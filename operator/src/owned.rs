//! What every object the operator creates for a StreamApp carries: its name, the common
//! labels, and an owner reference to the StreamApp (so deleting the StreamApp
//! garbage-collects it).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Resource, ResourceExt};
use streamapp_api::crd::StreamApp;

/// The one field manager of every server-side apply the operator makes (owned objects and the
/// StreamApp's aggregate status). Agents use their own, so neither removes the other's fields.
pub const FIELD_MANAGER: &str = "streamapp-operator";

/// Label on every object (and pod) of a StreamApp; the StatefulSet selects its pods by it.
pub const APP_LABEL: &str = "streamapp.dev/app";
pub const NAME_LABEL: &str = "app.kubernetes.io/name";
pub const INSTANCE_LABEL: &str = "app.kubernetes.io/instance";
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "streamapp-operator";

/// Selects what the operator manages; its watches on owned objects use it.
pub fn managed_by_selector() -> String {
    format!("{MANAGED_BY_LABEL}={MANAGED_BY}")
}

/// Name of the StatefulSet, the headless Service and the PodDisruptionBudget.
pub fn workload_name(app: &StreamApp) -> String {
    app.name_any()
}

/// Label of the processor configuration ConfigMaps (value [`PROCESSOR_CONFIG`]), which the
/// operator garbage-collects once no pod uses them.
pub const COMPONENT_LABEL: &str = "streamapp.dev/component";
pub const PROCESSOR_CONFIG: &str = "processor-config";

/// Name of the ConfigMap holding the configuration with hash `config_hash`:
/// `<name>-config-<first 10 hex digits>`. Content-named and immutable: a new configuration is a
/// new ConfigMap, so pods that have not rolled yet keep reading the one they started with, and
/// going back to an earlier spec is going back to its ConfigMap.
pub fn config_map_name(app: &StreamApp, config_hash: &str) -> String {
    format!(
        "{}-config-{}",
        app.name_any(),
        &config_hash[..config_hash.len().min(10)]
    )
}

/// The one mutable ConfigMap earlier operator versions wrote (`<name>-config`); deleted once no
/// pod uses it.
pub fn legacy_config_map_name(app: &StreamApp) -> String {
    format!("{}-config", app.name_any())
}

/// Name of the agent's ServiceAccount, Role and RoleBinding.
pub fn agent_name(app: &StreamApp) -> String {
    format!("{}-agent", app.name_any())
}

/// The labels of every owned object and pod.
pub fn labels(app: &StreamApp) -> BTreeMap<String, String> {
    let name = app.name_any();
    BTreeMap::from([
        (NAME_LABEL.to_string(), "streamapp".to_string()),
        (INSTANCE_LABEL.to_string(), name.clone()),
        (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()),
        (APP_LABEL.to_string(), name),
    ])
}

/// The labels that select the StreamApp's pods. Only our own label: `app.kubernetes.io/*`
/// labels are shared with other tools (a Helm release of the same name would match them).
pub fn selector_labels(app: &StreamApp) -> BTreeMap<String, String> {
    BTreeMap::from([(APP_LABEL.to_string(), app.name_any())])
}

/// The ordinal of the StatefulSet pod `pod` of the StreamApp named `app` (`<app>-<ordinal>`),
/// or `None` for a name of another shape.
pub fn pod_ordinal(app: &str, pod: &str) -> Option<i32> {
    pod.strip_prefix(app)?.strip_prefix('-')?.parse().ok()
}

/// [`selector_labels`] as a label selector string (`status.selector`, for the scale
/// subresource and `kubectl get pods -l`).
pub fn selector_string(app: &StreamApp) -> String {
    selector_labels(app)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Metadata of an owned object: name, the StreamApp's namespace, labels, and the StreamApp as
/// controlling owner.
pub fn metadata(app: &StreamApp, name: String) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: app.namespace(),
        labels: Some(labels(app)),
        owner_references: app.controller_owner_ref(&()).map(|r| vec![r]),
        ..ObjectMeta::default()
    }
}
