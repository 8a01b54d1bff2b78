//! The agent's RBAC, for real: a ServiceAccount token from the TokenRequest API, the Role the
//! operator gives the agent, and the local kube-apiserver deciding.

use crate::common;

use std::time::Duration;

use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use streamapp_agent::status_writer::{StatusWriter, field_manager};
use streamapp_agent::store_events::{QUARANTINE_REASON as REASON, StoreEvents};
use streamapp_api::crd::{PodStateStatus, StreamApp, TaskStateStatus};
use streamapp_api::state_volume::QuarantinedStore;
use streamapp_api::status_values::PodPhase;
use testbed::kube::TestNamespace;

#[tokio::test(flavor = "multi_thread")]
async fn the_agents_service_account_may_report_its_own_pod_and_nothing_else() {
    let admin = testbed::kube::client().await;
    common::install_crd(&admin).await;
    let ns = TestNamespace::create(&admin, "agent-rbac").await;
    common::create_app(&admin, &ns.name, "orders").await;
    common::create_app(&admin, &ns.name, "payments").await;
    let sa = common::create_agent_rbac(&admin, &ns.name, "orders").await;
    let dir = tempfile::tempdir().unwrap();
    let (agent, _) = common::service_account_client(&admin, &ns.name, &sa, dir.path()).await;

    // Its own StreamApp's status: allowed. (The authorizer learns of new RoleBindings within
    // moments; the first write may be refused until it has.)
    let entry = PodStateStatus {
        name: "orders-0".into(),
        phase: Some(PodPhase::Running),
        processor_up: true,
        ready: true,
        tasks: vec![TaskStateStatus {
            partition: 0,
            committed_offset: Some(42),
            ..Default::default()
        }],
        ..Default::default()
    };
    let writer = StatusWriter::new(agent.clone(), &ns.name, "orders", "orders-0");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while let Err(e) = writer.write(&entry).await {
        assert!(
            e.is_forbidden() && tokio::time::Instant::now() < deadline,
            "the agent's own status write failed: {e}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        common::pod_entry(&admin, &ns.name, "orders", "orders-0").await,
        Some(entry.clone())
    );

    // Reading its own StreamApp (done at start-up): allowed.
    let own = Api::<StreamApp>::namespaced(agent.clone(), &ns.name)
        .get("orders")
        .await
        .expect("the agent may get its StreamApp");

    // Another StreamApp's status: 403.
    let other = StatusWriter::new(agent.clone(), &ns.name, "payments", "orders-0");
    let err = other
        .write(&entry)
        .await
        .expect_err("writing another StreamApp's status must be refused");
    assert!(err.is_forbidden(), "expected 403 Forbidden, got: {err}");
    assert_eq!(
        common::pod_entry(&admin, &ns.name, "payments", "orders-0").await,
        None
    );

    // Its own StreamApp's spec: 403.
    let spec_patch = serde_json::json!({
        "apiVersion": "streamapp.dev/v1alpha1", "kind": "StreamApp",
        "metadata": { "name": "orders" },
        "spec": { "replicas": 5 },
    });
    let apps = Api::<StreamApp>::namespaced(agent.clone(), &ns.name);
    match apps
        .patch(
            "orders",
            &PatchParams::apply(&field_manager("orders-0")).force(),
            &Patch::Apply(&spec_patch),
        )
        .await
    {
        Err(kube::Error::Api(s)) => assert_eq!(
            s.code, 403,
            "expected 403 Forbidden for a spec write, got {s:?}"
        ),
        other => panic!("a spec write by the agent must be refused with 403, got {other:?}"),
    }
    match apps
        .patch(
            "orders",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "spec": { "replicas": 5 } })),
        )
        .await
    {
        Err(kube::Error::Api(s)) => assert_eq!(
            s.code, 403,
            "expected 403 Forbidden for a spec merge patch, got {s:?}"
        ),
        other => panic!("a spec merge patch by the agent must be refused with 403, got {other:?}"),
    }
    let spec = Api::<StreamApp>::namespaced(admin.clone(), &ns.name)
        .get("orders")
        .await
        .unwrap()
        .spec;
    assert_eq!(spec.replicas, 1, "the spec is unchanged");

    // Events about its StreamApp: allowed.
    let mut events = StoreEvents::new(agent.clone(), &ns.name, "orders", "orders-0", Some(&own));
    let quarantined = QuarantinedStore {
        path: Default::default(),
        partition: 0,
        at_ms: 1_750_000_000_000,
        reason: "Corruption: block checksum mismatch".into(),
    };
    assert_eq!(
        events
            .announce(std::slice::from_ref(&quarantined))
            .await
            .expect("the agent may create Events"),
        1
    );
    assert_eq!(
        events.announce(&[quarantined]).await.unwrap(),
        0,
        "announced once"
    );
    let published = Api::<Event>::namespaced(admin.clone(), &ns.name)
        .list(&ListParams::default())
        .await
        .unwrap();
    let event = published
        .items
        .iter()
        .find(|e| e.reason.as_deref() == Some(REASON))
        .expect("the StoreQuarantined event");
    assert_eq!(
        event.regarding.as_ref().and_then(|r| r.name.as_deref()),
        Some("orders")
    );
    assert!(
        event
            .note
            .as_deref()
            .unwrap()
            .contains("block checksum mismatch")
    );

    ns.delete().await;
}

/// A pod object that never runs (no node has the label it asks for): only its UID matters.
async fn create_pod(admin: &kube::Client, ns: &str, name: &str) -> String {
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": { "name": name },
        "spec": {
            "nodeSelector": { "streamapp.dev/no-such-node": "true" },
            "containers": [{ "name": "processor", "image": "streamapp:test" }],
        },
    }))
    .unwrap();
    Api::<k8s_openapi::api::core::v1::Pod>::namespaced(admin.clone(), ns)
        .create(&Default::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("creating pod {ns}/{name}: {e}"))
        .metadata
        .uid
        .unwrap()
}

/// What a processor asks after a fence (`/identity`), answered with the agent's own token: its
/// pod is current; once the pod is replaced by another of the same name it is not; another
/// app's pod or an ordinal past the replicas cannot be read at all.
#[tokio::test(flavor = "multi_thread")]
async fn the_agent_tells_its_own_pod_from_a_replacement_of_the_same_name() {
    use streamapp_agent::identity::IdentitySource;

    let admin = testbed::kube::client().await;
    common::install_crd(&admin).await;
    let ns = TestNamespace::create(&admin, "agent-identity").await;
    common::create_app(&admin, &ns.name, "orders").await;
    let sa = common::create_agent_rbac(&admin, &ns.name, "orders").await;
    let dir = tempfile::tempdir().unwrap();
    let (agent, _) = common::service_account_client(&admin, &ns.name, &sa, dir.path()).await;
    let uid = create_pod(&admin, &ns.name, "orders-0").await;
    let own = IdentitySource::new(agent.clone(), &ns.name, "orders-0", Some(uid.clone()));

    // (The authorizer learns of the new RoleBinding within moments.)
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let answer = loop {
        match own.answer().await {
            Ok(answer) => break answer,
            Err(why) => {
                assert!(
                    why.contains("forbidden") && tokio::time::Instant::now() < deadline,
                    "{why}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    assert!(answer.is_current(), "{answer:?}");

    // The pod deleted and made again under the same name (what the StatefulSet does after the
    // operator replaced a lost node's pod): the old pod's agent is told it is not current.
    Api::<k8s_openapi::api::core::v1::Pod>::namespaced(admin.clone(), &ns.name)
        .delete(
            "orders-0",
            &kube::api::DeleteParams::default().grace_period(0),
        )
        .await
        .unwrap();
    let gone = own.answer().await.unwrap();
    assert_eq!(gone.current_uid, None, "{gone:?}");
    let new_uid = create_pod(&admin, &ns.name, "orders-0").await;
    let replaced = own.answer().await.unwrap();
    assert!(!replaced.is_current(), "{replaced:?}");
    assert_eq!(replaced.current_uid.as_deref(), Some(new_uid.as_str()));
    assert!(replaced.describe().contains("was replaced"), "{replaced:?}");

    // Past its replicas (1): refused by RBAC, and the answer says which permission it lacks.
    create_pod(&admin, &ns.name, "orders-1").await;
    let other = IdentitySource::new(agent.clone(), &ns.name, "orders-1", Some(uid));
    let why = other.answer().await.unwrap_err();
    assert!(
        why.contains("forbidden") && why.contains("get on pods/orders-1"),
        "{why}"
    );
    ns.delete().await;
}
