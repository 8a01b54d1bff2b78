//! The HorizontalPodAutoscaler example (examples/autoscaling/hpa.yaml) against the real API
//! server and kube-controller-manager's HPA controller: it reads the StreamApp through the
//! scale subresource, and what it writes there reaches the StatefulSet. (The test bed has no
//! metrics API, so the HPA cannot compute a CPU recommendation; the scale path is what the
//! StreamApp has to provide.)

use crate::support;

use std::time::Duration;

use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use kube::Api;
use support::*;
use testbed::kube::{kubectl, wait_for};

fn example() -> String {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/autoscaling/hpa.yaml"
    );
    std::fs::read_to_string(path).expect("reading examples/autoscaling/hpa.yaml")
}

#[tokio::test]
async fn the_hpa_example_scales_the_streamapp_through_its_scale_subresource() {
    with_operator("hpa", |client, ns| async move {
        create(&client, &ns, streamapp_json("orders-dedup", 2)).await;
        let out = kubectl(&["apply", "-n", &ns, "-f", "-"], Some(&example()));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );

        let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(client.clone(), &ns);
        wait_for(
            Duration::from_secs(90),
            "the HPA's AbleToScale condition (it read the StreamApp's scale subresource)",
            || async {
                hpas.get("orders-dedup")
                    .await
                    .ok()
                    .and_then(|h| h.status?.conditions)
                    .is_some_and(|cs| {
                        cs.iter().any(|c| {
                            c.type_ == "AbleToScale"
                                && c.status == "True"
                                && c.reason.as_deref() == Some("SucceededGetScale")
                        })
                    })
            },
        )
        .await;
        let hpa = hpas.get("orders-dedup").await.unwrap();
        assert_eq!(
            hpa.status.unwrap().current_replicas,
            Some(2),
            "the HPA sees the StreamApp's replicas"
        );

        // Lowering maxReplicas below the current count makes the HPA scale the StreamApp
        // down without any metric: the write goes through the scale subresource to
        // spec.replicas, and from there the operator scales the StatefulSet.
        let out = kubectl(
            &[
                "patch",
                "hpa",
                "orders-dedup",
                "-n",
                &ns,
                "--type=merge",
                "-p",
                r#"{"spec":{"maxReplicas":1}}"#,
            ],
            None,
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        wait_for(
            Duration::from_secs(90),
            "spec.replicas 1, set by the HPA",
            || async {
                Api::<streamapp_api::crd::StreamApp>::namespaced(client.clone(), &ns)
                    .get("orders-dedup")
                    .await
                    .is_ok_and(|a| a.spec.replicas == 1)
            },
        )
        .await;
        wait_for(
            Duration::from_secs(60),
            "the StatefulSet at 1 replica",
            || async {
                Api::<k8s_openapi::api::apps::v1::StatefulSet>::namespaced(client.clone(), &ns)
                    .get("orders-dedup")
                    .await
                    .is_ok_and(|s| s.spec.and_then(|s| s.replicas) == Some(1))
            },
        )
        .await;
    })
    .await;
}
