//! Leader election between operator instances through a real Lease: only the leader
//! reconciles, a follower takes over when the leader stops, and a leader that loses its lease
//! stops.

mod support;

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Api;
use kube::api::{Patch, PatchParams};
use streamapp_operator::Error;
use streamapp_operator::leader::LeaseSettings;
use support::*;
use testbed::kube::{TestNamespace, wait_for};

/// Short timings so the test does not wait for client-go's 15 s lease.
fn lease(ns: &str, identity: &str) -> LeaseSettings {
    LeaseSettings {
        lease_duration: Duration::from_secs(4),
        renew_interval: Duration::from_millis(500),
        renew_deadline: Duration::from_secs(3),
        retry_interval: Duration::from_millis(300),
        ..LeaseSettings::new(ns.to_string(), identity.to_string())
    }
}

async fn holder(api: &Api<Lease>) -> Option<String> {
    api.get_opt("streamapp-operator")
        .await
        .ok()
        .flatten()?
        .spec?
        .holder_identity
}

#[tokio::test]
async fn only_the_leader_reconciles_and_a_follower_takes_over_when_it_stops() {
    let client = testbed::kube::client().await;
    install_crd(&client).await;
    let ns = TestNamespace::create(&client, "leader").await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns.name);

    let first = Operator::start_with(&client, &ns.name, Some(lease(&ns.name, "first")));
    wait_for(
        Duration::from_secs(30),
        "the first instance to lead",
        || async { first.is_leader() },
    )
    .await;
    assert_eq!(holder(&leases).await.as_deref(), Some("first"));
    let second = Operator::start_with(&client, &ns.name, Some(lease(&ns.name, "second")));

    create(&client, &ns.name, streamapp_json("orders", 1)).await;
    wait_for_status(&client, &ns.name, "orders", "the leader's status", |s| {
        s.phase.is_some()
    })
    .await;
    // Give the follower every chance to (wrongly) reconcile.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(first.reconciliations() > 0);
    assert_eq!(
        second.reconciliations(),
        0,
        "the follower must not reconcile"
    );
    assert!(!second.is_leader());
    assert_eq!(holder(&leases).await.as_deref(), Some("first"));

    // The leader stops cleanly and releases the lease: the follower takes over at once and
    // reconciles what changes next.
    first.stop().await.expect("a clean stop");
    wait_for(
        Duration::from_secs(10),
        "the second instance to lead",
        || async { second.is_leader() },
    )
    .await;
    assert_eq!(holder(&leases).await.as_deref(), Some("second"));
    patch_spec(
        &client,
        &ns.name,
        "orders",
        serde_json::json!({ "image": "registry.example/streamapp:2.0" }),
    )
    .await;
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns.name);
    wait_for(
        Duration::from_secs(30),
        "the new leader to roll out the new image",
        || async {
            sets.get("orders").await.is_ok_and(|s| {
                s.spec.unwrap().template.spec.unwrap().containers[0]
                    .image
                    .as_deref()
                    == Some("registry.example/streamapp:2.0")
            })
        },
    )
    .await;
    assert!(second.reconciliations() > 0);
    second.stop().await.expect("a clean stop");
    ns.delete().await;
}

#[tokio::test]
async fn a_leader_that_loses_its_lease_stops_with_an_error() {
    let client = testbed::kube::client().await;
    install_crd(&client).await;
    let ns = TestNamespace::create(&client, "lost").await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns.name);

    let mut leader = Operator::start_with(&client, &ns.name, Some(lease(&ns.name, "leader")));
    wait_for(Duration::from_secs(30), "the instance to lead", || async {
        leader.is_leader()
    })
    .await;

    // Someone else takes the lease over (as after a network partition).
    let stolen = serde_json::json!({ "spec": {
        "holderIdentity": "thief", "leaseDurationSeconds": 60,
        "renewTime": MicroTime(k8s_openapi::jiff::Timestamp::now()),
    } });
    leases
        .patch(
            "streamapp-operator",
            &PatchParams::default(),
            &Patch::Merge(&stolen),
        )
        .await
        .unwrap();

    match leader.join().await {
        Err(Error::LeadershipLost { why, .. }) => {
            assert!(why.contains("another instance"), "{why}")
        }
        other => panic!("expected the leader to step down, got {other:?}"),
    }
    assert!(!leader.is_leader());
    assert_eq!(
        holder(&leases).await.as_deref(),
        Some("thief"),
        "a deposed leader does not write the lease"
    );
    ns.delete().await;
}
