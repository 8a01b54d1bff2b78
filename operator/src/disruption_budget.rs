//! The PodDisruptionBudget `<name>`: voluntary disruptions (node drains) take one pod at a
//! time, so at most one pod restores its stores while the others keep processing.

use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use streamapp_api::crd::StreamApp;

use crate::owned;

/// `maxUnavailable: 1` over the StreamApp's pods.
pub fn desired_disruption_budget(app: &StreamApp) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: owned::metadata(app, owned::workload_name(app)),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(owned::selector_labels(app)),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::app;

    #[test]
    fn disruption_budget_allows_one_pod_down_at_a_time() {
        let pdb = desired_disruption_budget(&app());
        assert_eq!(pdb.metadata.name.as_deref(), Some("orders"));
        let spec = pdb.spec.unwrap();
        assert_eq!(spec.max_unavailable, Some(IntOrString::Int(1)));
        assert_eq!(
            spec.selector.unwrap().match_labels.unwrap()["streamapp.dev/app"],
            "orders"
        );
    }
}
