//! The PodDisruptionBudget `<name>`: voluntary disruptions (node drains) take at most
//! `spec.disruptionBudget.maxUnavailable` pods (default one) at a time, so at most that many
//! restore their stores while the others keep processing.

use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use streamapp_api::crd::{StreamApp, default_max_unavailable};

use crate::owned;

/// `maxUnavailable` (default 1) over the StreamApp's pods.
pub fn desired_disruption_budget(app: &StreamApp) -> PodDisruptionBudget {
    let max_unavailable = app
        .spec
        .disruption_budget
        .as_ref()
        .map(|budget| budget.max_unavailable.clone())
        .unwrap_or_else(default_max_unavailable);
    PodDisruptionBudget {
        metadata: owned::metadata(app, owned::workload_name(app)),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(max_unavailable),
            selector: Some(LabelSelector {
                match_labels: Some(owned::selector_labels(app)),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    }
}

/// How many of `replicas` pods the budget lets be unavailable at once (at least one): a
/// percentage rounds up, as the disruption controller's does.
pub fn max_unavailable_pods(app: &StreamApp, replicas: i32) -> usize {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    let replicas = usize::try_from(replicas).unwrap_or(0);
    let max = match desired_disruption_budget(app)
        .spec
        .and_then(|s| s.max_unavailable)
    {
        Some(IntOrString::Int(n)) => usize::try_from(n).unwrap_or(0),
        Some(IntOrString::String(p)) => p
            .trim_end_matches('%')
            .parse::<usize>()
            .map_or(1, |p| (p * replicas).div_ceil(100)),
        None => 1,
    };
    max.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::app;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use streamapp_api::crd::DisruptionBudgetSpec;

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

    #[test]
    fn disruption_budget_follows_the_spec() {
        let mut app = app();
        app.spec.disruption_budget = Some(DisruptionBudgetSpec {
            max_unavailable: IntOrString::String("25%".into()),
        });
        let spec = desired_disruption_budget(&app).spec.unwrap();
        assert_eq!(
            spec.max_unavailable,
            Some(IntOrString::String("25%".into()))
        );
    }

    #[test]
    fn the_budget_in_pods_rounds_a_percentage_up_and_is_never_zero() {
        let mut app = app();
        assert_eq!(max_unavailable_pods(&app, 3), 1);
        app.spec.disruption_budget = Some(DisruptionBudgetSpec {
            max_unavailable: IntOrString::String("25%".into()),
        });
        assert_eq!(max_unavailable_pods(&app, 3), 1);
        assert_eq!(max_unavailable_pods(&app, 5), 2);
        app.spec.disruption_budget = Some(DisruptionBudgetSpec {
            max_unavailable: IntOrString::Int(2),
        });
        assert_eq!(max_unavailable_pods(&app, 3), 2);
    }
}
