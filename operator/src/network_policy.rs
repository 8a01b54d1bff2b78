//! The NetworkPolicy `<name>`: the pods accept connections only on the processor's HTTP port
//! (metrics, probes, the drain endpoint) and the agent's metrics port, from the peers
//! `spec.networkPolicy.from` names (anyone when unset). Nothing else listens in the pod, and
//! outgoing traffic (Kafka, the API server) is left alone: a policy that guessed the brokers'
//! addresses would break more clusters than it protects.

use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use streamapp_api::crd::StreamApp;

use crate::owned;
use crate::processor_config::HTTP_PORT;

/// The agent's HTTP port (`/metrics`, `/identity`), set in the pod template.
pub const AGENT_METRICS_PORT: u16 = 8081;

/// Whether the StreamApp wants its NetworkPolicy (the default).
pub fn wanted(app: &StreamApp) -> bool {
    app.spec.network_policy.as_ref().is_none_or(|p| p.enabled)
}

/// The NetworkPolicy over the StreamApp's pods.
pub fn desired_network_policy(app: &StreamApp) -> NetworkPolicy {
    let from = app
        .spec
        .network_policy
        .as_ref()
        .map(|p| p.from.clone())
        .filter(|from| !from.is_empty());
    let tcp = |port: u16| NetworkPolicyPort {
        protocol: Some("TCP".into()),
        port: Some(IntOrString::Int(i32::from(port))),
        ..Default::default()
    };
    NetworkPolicy {
        metadata: owned::metadata(app, owned::workload_name(app)),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(owned::selector_labels(app)),
                ..Default::default()
            }),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(vec![NetworkPolicyIngressRule {
                from,
                ports: Some(vec![tcp(HTTP_PORT), tcp(AGENT_METRICS_PORT)]),
            }]),
            ..Default::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::app;
    use k8s_openapi::api::networking::v1::NetworkPolicyPeer;
    use std::collections::BTreeMap;
    use streamapp_api::crd::NetworkPolicySpec as Spec;

    #[test]
    fn only_the_two_http_ports_accept_connections_from_anyone_by_default() {
        let app = app();
        assert!(wanted(&app));
        let spec = desired_network_policy(&app).spec.unwrap();
        assert_eq!(
            spec.policy_types.as_deref(),
            Some(&["Ingress".to_string()][..])
        );
        assert_eq!(
            spec.pod_selector.unwrap().match_labels.unwrap()["streamapp.dev/app"],
            "orders"
        );
        let rules = spec.ingress.unwrap();
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].from, None);
        let ports: Vec<_> = rules[0]
            .ports
            .iter()
            .flatten()
            .map(|p| p.port.clone().unwrap())
            .collect();
        assert_eq!(ports, [IntOrString::Int(8080), IntOrString::Int(8081)]);
    }

    #[test]
    fn peers_from_the_spec_and_the_switch_off() {
        let mut app = app();
        let peer = NetworkPolicyPeer {
            namespace_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(
                    "kubernetes.io/metadata.name".to_string(),
                    "monitoring".to_string(),
                )])),
                ..Default::default()
            }),
            ..Default::default()
        };
        app.spec.network_policy = Some(Spec {
            enabled: true,
            from: vec![peer.clone()],
        });
        let rules = desired_network_policy(&app).spec.unwrap().ingress.unwrap();
        assert_eq!(rules[0].from, Some(vec![peer]));

        app.spec.network_policy = Some(Spec {
            enabled: false,
            from: vec![],
        });
        assert!(!wanted(&app));
    }
}
