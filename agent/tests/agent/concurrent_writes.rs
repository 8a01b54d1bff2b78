//! Several writers of one StreamApp's status at once, as in a real cluster: one agent per pod
//! and the operator. Server-side apply with a list-map keyed by pod name keeps them apart.

use crate::common;

use kube::Api;
use kube::api::{Patch, PatchParams};
use streamapp_agent::status_writer::StatusWriter;
use streamapp_api::crd::{PodStateStatus, StreamApp, StreamAppStatus, TaskStateStatus};
use streamapp_api::status_values::{AppPhase, PodPhase, StateHealth};
use testbed::kube::TestNamespace;

fn entry(pod: &str, round: i64) -> PodStateStatus {
    PodStateStatus {
        name: pod.into(),
        phase: Some(PodPhase::Running),
        processor_up: true,
        ready: true,
        // A message only in odd rounds: a field an agent stops sending must disappear.
        message: (round % 2 == 1).then(|| format!("{pod} round {round}")),
        tasks: vec![TaskStateStatus {
            partition: 0,
            committed_offset: Some(round * 100),
            ..Default::default()
        }],
        ..Default::default()
    }
}

async fn status(client: &kube::Client, ns: &str) -> StreamAppStatus {
    Api::<StreamApp>::namespaced(client.clone(), ns)
        .get("orders")
        .await
        .unwrap()
        .status
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn two_agents_and_the_operator_write_one_status_concurrently_without_clobbering_each_other() {
    let admin = testbed::kube::client().await;
    common::install_crd(&admin).await;
    let ns = TestNamespace::create(&admin, "agent-concurrent").await;
    common::create_app(&admin, &ns.name, "orders").await;
    let sa = common::create_agent_rbac(&admin, &ns.name, "orders").await;
    let dir = tempfile::tempdir().unwrap();
    // Both pods of a StatefulSet run as the same ServiceAccount.
    let (agent, _) = common::service_account_client(&admin, &ns.name, &sa, dir.path()).await;
    let a = StatusWriter::new(agent.clone(), &ns.name, "orders", "orders-0");
    let b = StatusWriter::new(agent.clone(), &ns.name, "orders", "orders-1");
    // Wait until the authorizer knows the RoleBinding.
    testbed::kube::wait_for(
        std::time::Duration::from_secs(15),
        "the agent's Role to take effect",
        || async { a.write(&entry("orders-0", 0)).await.is_ok() },
    )
    .await;

    let apps = Api::<StreamApp>::namespaced(admin.clone(), &ns.name);
    let operator = PatchParams::apply("streamapp-operator").force();
    for round in 1..=8 {
        let operator_body = serde_json::json!({
            "apiVersion": "streamapp.dev/v1alpha1", "kind": "StreamApp",
            "metadata": { "name": "orders" },
            "status": { "phase": "Running", "replicas": 2, "ready": format!("{}/2", round % 3), "stateHealth": "Healthy" },
        });
        let (entry_a, entry_b) = (entry("orders-0", round), entry("orders-1", round));
        let (ra, rb, ro) = tokio::join!(
            a.write(&entry_a),
            b.write(&entry_b),
            // The operator joins from the third round on.
            async {
                if round >= 3 {
                    apps.patch_status("orders", &operator, &Patch::Apply(&operator_body))
                        .await
                        .map(|_| ())
                } else {
                    Ok(())
                }
            },
        );
        ra.unwrap_or_else(|e| panic!("round {round}: agent of orders-0: {e}"));
        rb.unwrap_or_else(|e| panic!("round {round}: agent of orders-1: {e}"));
        ro.unwrap_or_else(|e| panic!("round {round}: the operator: {e}"));

        let s = status(&admin, &ns.name).await;
        let mut pods = s.pods.clone();
        pods.sort_by(|x, y| x.name.cmp(&y.name));
        assert_eq!(
            pods,
            vec![entry("orders-0", round), entry("orders-1", round)],
            "round {round}: both entries, as last written"
        );
        if round >= 3 {
            assert_eq!(
                s.phase,
                Some(AppPhase::Running),
                "round {round}: the operator's fields stay"
            );
            assert_eq!(s.ready, Some(format!("{}/2", round % 3)));
            assert_eq!(s.state_health, Some(StateHealth::Healthy));
        }
    }

    // One agent reporting alone changes only its own entry.
    a.write(&entry("orders-0", 20)).await.unwrap();
    let s = status(&admin, &ns.name).await;
    assert_eq!(
        s.pods.iter().find(|p| p.name == "orders-1"),
        Some(&entry("orders-1", 8))
    );
    assert_eq!(
        s.pods.iter().find(|p| p.name == "orders-0"),
        Some(&entry("orders-0", 20))
    );
    assert_eq!(s.replicas, Some(2));

    // Each writer owns what it wrote, under its own manager.
    let app = apps.get("orders").await.unwrap();
    let managers: Vec<String> = app
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter(|m| m.subresource.as_deref() == Some("status"))
        .filter_map(|m| m.manager)
        .collect();
    for m in [
        "streamapp-agent/orders-0",
        "streamapp-agent/orders-1",
        "streamapp-operator",
    ] {
        assert!(
            managers.iter().any(|x| x == m),
            "{m} manages status fields: {managers:?}"
        );
    }

    ns.delete().await;
}
