//! Proves the local control plane is real: the controller-manager creates pods and claims for a
//! StatefulSet, claims bind to provisioned volumes, the scheduler binds pods to the kwok node,
//! kwok reports them Running, and deleting the StatefulSet garbage-collects its pods.

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use testbed::kube::{TestNamespace, wait_for};

#[tokio::test]
async fn statefulset_pods_run_on_the_fake_node_with_bound_volumes_and_are_garbage_collected() {
    let client = testbed::kube::client().await;
    let ns = TestNamespace::create(&client, "smoke").await;
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns.name);

    let sts: StatefulSet = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "web" },
        "spec": {
            "replicas": 2,
            "serviceName": "web",
            "selector": { "matchLabels": { "app": "web" } },
            "template": {
                "metadata": { "labels": { "app": "web" } },
                "spec": { "containers": [{
                    "name": "web", "image": "example.invalid/web:1",
                    "volumeMounts": [{ "name": "data", "mountPath": "/data" }],
                }] },
            },
            "volumeClaimTemplates": [{
                "metadata": { "name": "data" },
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "resources": { "requests": { "storage": "1Gi" } },
                },
            }],
        },
    }))
    .unwrap();
    sets.create(&PostParams::default(), &sts).await.unwrap();

    let selector = ListParams::default().labels("app=web");
    wait_for(Duration::from_secs(90), "2 pods Running", || async {
        let list = pods.list(&selector).await.unwrap();
        list.items.len() == 2
            && list
                .items
                .iter()
                .all(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
    })
    .await;
    for pod in pods.list(&selector).await.unwrap() {
        let spec = pod.spec.unwrap();
        assert_eq!(
            spec.node_name.as_deref(),
            Some("kwok-node-0"),
            "scheduled on the kwok node"
        );
    }
    let list = claims.list(&ListParams::default()).await.unwrap();
    let mut names: Vec<_> = list
        .items
        .iter()
        .map(|c| c.metadata.name.clone().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["data-web-0", "data-web-1"]);
    for claim in &list.items {
        let status = claim.status.as_ref().unwrap();
        assert_eq!(status.phase.as_deref(), Some("Bound"));
        assert_eq!(status.capacity.as_ref().unwrap()["storage"].0, "1Gi");
    }

    sets.delete("web", &DeleteParams::background())
        .await
        .unwrap();
    wait_for(
        Duration::from_secs(60),
        "the pods to be garbage-collected",
        || async { pods.list(&selector).await.unwrap().items.is_empty() },
    )
    .await;
    ns.delete().await;
}
