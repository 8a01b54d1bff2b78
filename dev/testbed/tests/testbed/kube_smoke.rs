//! Proves the local control plane and the node are real: the controller-manager creates pods and
//! claims for a StatefulSet, claims bind to provisioned volumes, the scheduler binds pods to a
//! node, and deleting the StatefulSet garbage-collects its pods — on the kwok node (where pods
//! are reported Running but nothing runs) and on the real node, where the kubelet runs the
//! project's image as a non-root user with a read-only root filesystem, mounts the local volume
//! writable through the pod's fsGroup, and serves `kubectl exec`.

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
                "spec": {
                    "nodeSelector": { "type": "kwok" },
                    "tolerations": [{ "key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule" }],
                    "containers": [{
                        "name": "web", "image": "example.invalid/web:1",
                        "volumeMounts": [{ "name": "data", "mountPath": "/data" }],
                    }],
                },
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

#[tokio::test]
async fn the_real_node_runs_the_image_non_root_read_only_with_a_writable_local_volume() {
    let client = testbed::kube::client().await;
    testbed::node::require_ready(&client).await;
    let ns = TestNamespace::create(&client, "node-smoke").await;
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let sts: StatefulSet = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "box" },
        "spec": {
            "replicas": 1,
            "serviceName": "box",
            "selector": { "matchLabels": { "app": "box" } },
            "template": {
                "metadata": { "labels": { "app": "box" } },
                "spec": {
                    "terminationGracePeriodSeconds": 5,
                    "securityContext": { "runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532, "fsGroup": 65532 },
                    "containers": [{
                        "name": "box", "image": testbed::node::app_image(), "imagePullPolicy": "Never",
                        "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"],
                        "securityContext": { "readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false, "capabilities": { "drop": ["ALL"] } },
                        "volumeMounts": [{ "name": "data", "mountPath": "/data" }],
                    }],
                },
            },
            "volumeClaimTemplates": [{
                "metadata": { "name": "data" },
                "spec": { "accessModes": ["ReadWriteOnce"], "resources": { "requests": { "storage": "1Gi" } } },
            }],
        },
    }))
    .unwrap();
    sets.create(&PostParams::default(), &sts).await.unwrap();
    wait_for(Duration::from_secs(90), "pod box-0 Ready", || async {
        pods.get_opt("box-0").await.ok().flatten().is_some_and(|p| {
            p.status
                .and_then(|s| s.conditions)
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
    })
    .await;
    let pod = pods.get("box-0").await.unwrap();
    let node = pod.spec.unwrap().node_name;
    assert!(
        testbed::node::is_real(node.as_deref()),
        "runs on a real node: {node:?}"
    );
    let exec = |script: &str| {
        let out = testbed::kube::kubectl(
            &["exec", "-n", &ns.name, "box-0", "--", "sh", "-c", script],
            None,
        );
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
        )
    };
    assert_eq!(exec("id -u"), (true, "65532".into()));
    assert_eq!(
        exec("touch /data/written && echo ok"),
        (true, "ok".into()),
        "the volume is writable through fsGroup"
    );
    assert!(
        !exec("touch /written").0,
        "the root filesystem is read-only"
    );
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns.name);
    let volume = claims
        .get("data-box-0")
        .await
        .unwrap()
        .spec
        .unwrap()
        .volume_name
        .unwrap();
    let pv = Api::<k8s_openapi::api::core::v1::PersistentVolume>::all(client.clone())
        .get(&volume)
        .await
        .unwrap();
    assert!(
        pv.spec.as_ref().unwrap().local.is_some(),
        "a local volume on the node: {pv:?}"
    );

    sets.delete("box", &DeleteParams::background())
        .await
        .unwrap();
    wait_for(Duration::from_secs(60), "pod box-0 to be gone", || async {
        pods.get_opt("box-0").await.ok().flatten().is_none()
    })
    .await;
    ns.delete().await;
}
