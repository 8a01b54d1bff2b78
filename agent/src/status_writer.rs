//! Writes this pod's entry of `status.pods` with server-side apply on the `status`
//! subresource, under a field manager of its own (`streamapp-agent/<pod>`).
//!
//! `status.pods` is a list-map keyed by `name`, so the API server merges the entry into the
//! list: other pods' entries (other managers) and the operator's fields are left alone, and a
//! field this agent stops sending (a message that no longer applies) is removed.

use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use streamapp_api::crd::{PodStateStatus, StreamApp};

use crate::error::{Error, Result};

/// The field manager of `pod`'s agent.
pub fn field_manager(pod: &str) -> String {
    format!("streamapp-agent/{pod}")
}

/// The apply body: only what identifies the object, and the one entry.
pub fn apply_body(app: &str, entry: &PodStateStatus) -> Value {
    json!({
        "apiVersion": "streamapp.dev/v1alpha1",
        "kind": "StreamApp",
        "metadata": { "name": app },
        "status": { "pods": [entry] },
    })
}

/// Writes one pod's entry of one StreamApp.
#[derive(Clone)]
pub struct StatusWriter {
    api: Api<StreamApp>,
    namespace: String,
    app: String,
    pod: String,
    /// The pod's UID, written into the entry: the operator ignores and removes an entry whose
    /// UID is not the one of the pod of that name that exists now.
    uid: Option<String>,
    params: PatchParams,
}

impl StatusWriter {
    pub fn new(client: Client, namespace: &str, app: &str, pod: &str) -> Self {
        StatusWriter {
            api: Api::namespaced(client, namespace),
            namespace: namespace.into(),
            app: app.into(),
            pod: pod.into(),
            uid: None,
            // Force: this agent is the only authority on its pod's entry; should another
            // manager have touched it, the agent's view wins instead of a conflict forever.
            params: PatchParams::apply(&field_manager(pod)).force(),
        }
    }

    /// Writes the pod's UID into every entry.
    pub fn with_uid(mut self, uid: Option<String>) -> Self {
        self.uid = uid;
        self
    }

    /// Applies `entry` (whose `name` must be this writer's pod), with this pod's UID.
    pub async fn write(&self, entry: &PodStateStatus) -> Result<()> {
        debug_assert_eq!(entry.name, self.pod);
        let entry = PodStateStatus {
            uid: self.uid.clone().or_else(|| entry.uid.clone()),
            ..entry.clone()
        };
        self.api
            .patch_status(
                &self.app,
                &self.params,
                &Patch::Apply(apply_body(&self.app, &entry)),
            )
            .await
            .map(|_| ())
            .map_err(|source| Error::StatusWrite {
                namespace: self.namespace.clone(),
                app: self.app.clone(),
                pod: self.pod.clone(),
                source,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use streamapp_api::status_values::PodPhase;

    #[test]
    fn the_apply_body_holds_only_the_object_name_and_this_pods_entry() {
        let entry = PodStateStatus {
            name: "orders-1".into(),
            phase: Some(PodPhase::Running),
            processor_up: true,
            ..Default::default()
        };
        assert_eq!(
            apply_body("orders", &entry),
            json!({
                "apiVersion": "streamapp.dev/v1alpha1",
                "kind": "StreamApp",
                "metadata": { "name": "orders" },
                "status": { "pods": [ { "name": "orders-1", "phase": "Running", "processorUp": true, "ready": false, "quarantines": 0, "deadLetters": 0 } ] },
            })
        );
    }

    #[test]
    fn each_pod_has_its_own_field_manager() {
        assert_eq!(field_manager("orders-0"), "streamapp-agent/orders-0");
        assert_ne!(field_manager("orders-0"), field_manager("orders-1"));
    }
}
