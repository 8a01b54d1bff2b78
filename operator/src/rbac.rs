//! The agent's identity and permissions: ServiceAccount, Role and RoleBinding `<name>-agent`.
//!
//! The agent may read its own StreamApp and patch only that StreamApp's status, read the app's
//! own pods (all by `resourceNames`), and create events. Nothing else: a compromised pod cannot
//! touch other apps or any other object.

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::ResourceExt;
use streamapp_api::crd::StreamApp;

use crate::owned;

/// The ServiceAccount the pods run as, unless `spec.pod.serviceAccountName` names another.
pub fn desired_service_account(app: &StreamApp) -> ServiceAccount {
    ServiceAccount {
        metadata: owned::metadata(app, owned::agent_name(app)),
        ..Default::default()
    }
}

/// What the agent may do.
pub fn desired_role(app: &StreamApp) -> Role {
    let own = Some(vec![app.name_any()]);
    let pods = (0..app.spec.replicas.max(1))
        .map(|ordinal| format!("{}-{ordinal}", owned::workload_name(app)))
        .collect();
    Role {
        metadata: owned::metadata(app, owned::agent_name(app)),
        rules: Some(vec![
            PolicyRule {
                api_groups: Some(vec!["streamapp.dev".into()]),
                resources: Some(vec!["streamapps".into()]),
                resource_names: own.clone(),
                verbs: vec!["get".into()],
                ..Default::default()
            },
            PolicyRule {
                api_groups: Some(vec!["streamapp.dev".into()]),
                resources: Some(vec!["streamapps/status".into()]),
                resource_names: own,
                verbs: vec!["get".into(), "patch".into()],
                ..Default::default()
            },
            // Its own pod, to tell a processor after a fence whether the pod is still the
            // current one of its name (streamapp_api::identity).
            PolicyRule {
                api_groups: Some(vec!["".into()]),
                resources: Some(vec!["pods".into()]),
                resource_names: Some(pods),
                verbs: vec!["get".into()],
                ..Default::default()
            },
            // Events cannot be limited by name (they are created with generated names).
            // `patch` lets an event recorder update the count of a repeated event.
            PolicyRule {
                api_groups: Some(vec!["".into(), "events.k8s.io".into()]),
                resources: Some(vec!["events".into()]),
                verbs: vec!["create".into(), "patch".into()],
                ..Default::default()
            },
        ]),
    }
}

/// Binds the Role to `<name>-agent` and, when the pods run as another ServiceAccount
/// (`spec.pod.serviceAccountName`), to that one too, so the agent can report either way.
pub fn desired_role_binding(app: &StreamApp) -> RoleBinding {
    let namespace = app.namespace();
    let mut subjects = vec![Subject {
        kind: "ServiceAccount".into(),
        name: owned::agent_name(app),
        namespace: namespace.clone(),
        ..Default::default()
    }];
    if let Some(custom) = app
        .spec
        .pod
        .as_ref()
        .and_then(|p| p.service_account_name.clone())
        && custom != owned::agent_name(app)
    {
        subjects.push(Subject {
            kind: "ServiceAccount".into(),
            name: custom,
            namespace,
            ..Default::default()
        });
    }
    RoleBinding {
        metadata: owned::metadata(app, owned::agent_name(app)),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: owned::agent_name(app),
        },
        subjects: Some(subjects),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::app;

    #[test]
    fn agent_may_patch_only_its_own_streamapps_status() {
        let role = desired_role(&app());
        assert_eq!(role.metadata.name.as_deref(), Some("orders-agent"));
        let rules = role.rules.unwrap();
        let status = rules
            .iter()
            .find(|r| r.resources == Some(vec!["streamapps/status".into()]))
            .unwrap();
        assert_eq!(status.resource_names, Some(vec!["orders".to_string()]));
        assert_eq!(status.verbs, ["get", "patch"]);
        let app_rule = rules
            .iter()
            .find(|r| r.resources == Some(vec!["streamapps".into()]))
            .unwrap();
        assert_eq!(app_rule.resource_names, Some(vec!["orders".to_string()]));
        assert_eq!(app_rule.verbs, ["get"]);
        let pods = rules
            .iter()
            .find(|r| r.resources == Some(vec!["pods".into()]))
            .unwrap();
        assert_eq!(
            pods.resource_names,
            Some(vec![
                "orders-0".to_string(),
                "orders-1".to_string(),
                "orders-2".to_string()
            ]),
            "the app's own pods (3 replicas), no other"
        );
        assert_eq!(pods.verbs, ["get"]);
        assert!(rules.iter().all(|r| {
            !r.verbs
                .iter()
                .any(|v| v == "update" || v == "delete" || v == "*")
        }));
    }

    #[test]
    fn role_binding_binds_the_agent_service_account_and_a_custom_one() {
        let binding = desired_role_binding(&app());
        let names: Vec<_> = binding
            .subjects
            .as_ref()
            .unwrap()
            .iter()
            .map(|s| s.name.as_str())
            .collect();
        assert_eq!(names, ["orders-agent"]);
        assert_eq!(binding.role_ref.name, "orders-agent");

        let mut custom = app();
        custom.spec.pod = Some(streamapp_api::crd::PodOverrides {
            service_account_name: Some("shared".into()),
            ..Default::default()
        });
        let binding = desired_role_binding(&custom);
        let names: Vec<_> = binding
            .subjects
            .unwrap()
            .into_iter()
            .map(|s| s.name)
            .collect();
        assert_eq!(names, ["orders-agent", "shared"]);
    }

    #[test]
    fn service_account_is_owned_by_the_streamapp() {
        let sa = desired_service_account(&app());
        assert_eq!(sa.metadata.name.as_deref(), Some("orders-agent"));
        assert_eq!(
            sa.metadata.owner_references.unwrap()[0].controller,
            Some(true)
        );
    }
}
