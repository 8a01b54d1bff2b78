//! Leader election between operator instances through a real Lease: only the leader
//! reconciles, a follower takes over when the leader stops, and a leader that loses its lease
//! stops.

use crate::support;

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

/// A TCP relay to the API server that can stop passing bytes on: requests through it hang, as
/// in a network partition or with an overloaded API server.
struct FreezableRelay {
    port: u16,
    frozen: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl FreezableRelay {
    async fn start(upstream: String) -> FreezableRelay {
        use std::sync::atomic::{AtomicBool, Ordering};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let frozen = std::sync::Arc::new(AtomicBool::new(false));
        let flag = frozen.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else {
                    continue;
                };
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                for (mut from, mut to) in [(client_read, server_write), (server_read, client_write)]
                {
                    let frozen = flag.clone();
                    tokio::spawn(async move {
                        let mut buf = vec![0u8; 16 * 1024];
                        while let Ok(n) = from.read(&mut buf).await {
                            if n == 0 {
                                break;
                            }
                            while frozen.load(Ordering::SeqCst) {
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                            if to.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    });
                }
            }
        });
        FreezableRelay { port, frozen }
    }

    fn freeze(&self) {
        self.frozen.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A client for the local API server that goes through `relay`.
async fn client_through(relay: &FreezableRelay) -> kube::Client {
    let kubeconfig = kube::config::Kubeconfig::read_from(testbed::kube::kubeconfig_path()).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    config.cluster_url = format!("https://127.0.0.1:{}", relay.port).parse().unwrap();
    kube::Client::try_from(config).unwrap()
}

#[tokio::test]
async fn a_leader_whose_api_requests_hang_stops_leading_before_another_can_take_the_lease() {
    let client = testbed::kube::client().await;
    install_crd(&client).await;
    let ns = TestNamespace::create(&client, "hung").await;
    let upstream = api_server_address();
    let relay = FreezableRelay::start(upstream).await;
    let hung_client = client_through(&relay).await;

    let settings = lease(&ns.name, "hung");
    let mut first = Operator::start_with(&hung_client, &ns.name, Some(settings.clone()));
    wait_for(
        Duration::from_secs(30),
        "the first instance to lead",
        || async { first.is_leader() },
    )
    .await;
    create(&client, &ns.name, streamapp_json("orders", 1)).await;
    wait_for_status(&client, &ns.name, "orders", "the leader's status", |s| {
        s.phase.is_some()
    })
    .await;

    // From now on, every request of the first instance hangs.
    relay.freeze();
    let frozen_at = std::time::Instant::now();
    let second = Operator::start_with(&client, &ns.name, Some(lease(&ns.name, "second")));
    let lost = first.join().await;
    let stopped_after = frozen_at.elapsed();
    match lost {
        Err(Error::LeadershipLost { why, .. }) => {
            assert!(why.contains("did not answer in time"), "{why}")
        }
        other => panic!("expected the hung leader to step down, got {other:?}"),
    }
    assert!(!first.is_leader());
    // It renews every 0.5 s with a 3 s deadline from the last renewal it sent: it stops within
    // the deadline of the freeze, and a follower can only take the lease once it saw it
    // unchanged for the 4 s lease duration.
    assert!(
        stopped_after <= settings.renew_deadline + Duration::from_millis(500),
        "the hung leader stopped only after {stopped_after:?}"
    );
    assert!(
        !second.is_leader(),
        "the follower led while the old leader still did"
    );
    wait_for(
        Duration::from_secs(20),
        "the second instance to take over",
        || async { second.is_leader() },
    )
    .await;
    let taken_after = frozen_at.elapsed();
    assert!(
        taken_after > stopped_after,
        "taken over after {taken_after:?}, old leader stopped after {stopped_after:?}"
    );
    second.stop().await.expect("a clean stop");
    ns.delete().await;
}

/// `host:port` of the admin kubeconfig's API server.
fn api_server_address() -> String {
    let kubeconfig = kube::config::Kubeconfig::read_from(testbed::kube::kubeconfig_path()).unwrap();
    let server = kubeconfig.clusters[0]
        .cluster
        .as_ref()
        .unwrap()
        .server
        .clone()
        .unwrap();
    server
        .trim_start_matches("https://")
        .trim_end_matches('/')
        .to_string()
}
