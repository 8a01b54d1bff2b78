//! StreamApps as users run them, on the test bed's real node: `helm install` the operator,
//! `kubectl apply` the example, and the kubelet runs everything from the project's image. Each
//! test is one thing users do or suffer — a first deployment, a pod deletion, a crash, a
//! configuration change, scaling, too little memory, a missing image — and checks what they
//! would check: each command id exactly once in Kafka, and what `kubectl` shows.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::Api;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use streamapp_api::crd::{PodStateStatus, StreamApp, StreamAppStatus};
use streamapp_api::status_values::{
    AppPhase, DrainRequest, PodPhase, StateHealth, StoreOpen, TaskState,
};
use streamapp_e2e::{APP, READY_TIMEOUT, Scenario, Sent, pod_name};

fn condition<'a>(status: &'a StreamAppStatus, type_: &str) -> Option<(&'a str, &'a str, &'a str)> {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.as_str(), c.reason.as_str(), c.message.as_str()))
}

fn report<'a>(status: &'a StreamAppStatus, pod: &str) -> Option<&'a PodStateStatus> {
    status.pods.iter().find(|p| p.name == pod)
}

fn uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap()
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn processor_restarts(pod: &Pod) -> i32 {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.iter().find(|c| c.name == "processor"))
        .map_or(0, |c| c.restart_count)
}

/// Static membership (group.instance.id = pod name) keeps a restarting pod's partitions
/// assigned to it only within the session timeout; the example's 10 s is short for a pod
/// that is deleted and re-created, so these scenarios give it the time a user would.
fn with_session_timeout(mut app: serde_yaml::Value, ms: u32) -> serde_yaml::Value {
    app["spec"]["kafka"]["properties"]["session.timeout.ms"] = ms.to_string().into();
    app
}

#[tokio::test]
async fn the_example_runs_on_the_real_node_deduplicates_exactly_once_and_kubectl_shows_it() {
    let s = Scenario::start("example", 4).await;
    s.apply(&s.example());
    s.wait_ready(READY_TIMEOUT).await;

    let pods = s.pods().await;
    assert_eq!(pods.len(), 2, "the example has two replicas");
    for pod in &pods {
        let spec = pod.spec.as_ref().unwrap();
        assert!(
            testbed::node::is_real(spec.node_name.as_deref()),
            "runs on a real node: {:?}",
            spec.node_name
        );
        let status = pod.status.as_ref().unwrap();
        let agent = &status.init_container_statuses.as_ref().unwrap()[0];
        assert!(
            agent.name == "agent"
                && agent.started == Some(true)
                && agent.state.as_ref().unwrap().running.is_some(),
            "the agent runs as a native sidecar: {agent:?}"
        );
        let processor = &status.container_statuses.as_ref().unwrap()[0];
        assert!(
            processor.ready,
            "the processor passed its readiness probe: {processor:?}"
        );
    }

    let mut sent = Sent::new();
    sent.produce(&s, 2000, 0.3, 5);
    s.assert_exactly_once(&sent);

    // The dashboard, once the agents have reported the stores.
    s.wait_for_status(
        "2/2 Running with healthy state",
        Duration::from_secs(60),
        |st| {
            st.ready.as_deref() == Some("2/2")
                && st.phase == Some(AppPhase::Running)
                && st.state_health == Some(StateHealth::Healthy)
        },
    )
    .await;
    let status = s.status().await;
    let every_id = status
        .conditions
        .iter()
        .find(|c| c.type_ == "EveryIdDeduplicated")
        .expect("the EveryIdDeduplicated condition");
    assert_eq!(
        (every_id.status.as_str(), every_id.reason.as_str()),
        ("True", "Repartitioned"),
        "the example's ids are in the value: it repartitions"
    );
    // Everything is processed: what the lag still counts are transaction markers after the
    // last record, at most one per partition (4) for each of the two pods' route stages.
    s.wait_for_status(
        "the repartition stage's lag",
        Duration::from_secs(60),
        |st| st.repartition_lag.is_some_and(|l| l <= 4 * 2),
    )
    .await;
    let table = s.kubectl(&["get", "streamapps"]);
    let mut lines = table.lines();
    let header: Vec<_> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME",
            "READY",
            "PHASE",
            "STATE",
            "LAG",
            "CHECKPOINT",
            "AGE"
        ],
        "{table}"
    );
    let row: Vec<_> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(&row[..4], [APP, "2/2", "Running", "Healthy"], "{table}");
    let wide = s.kubectl(&["get", "sapp", APP, "-o", "wide"]);
    assert!(
        wide.contains(&testbed::node::app_image()) && wide.contains("AllPodsReady"),
        "{wide}"
    );
    s.finish().await;
}

#[tokio::test]
async fn deleting_a_pod_runs_the_prestop_drain_and_its_successor_restores_nothing() {
    let s = Scenario::start("drain", 4).await;
    s.apply(&with_session_timeout(s.example(), 45_000));
    s.wait_ready(READY_TIMEOUT).await;
    let mut sent = Sent::new();
    sent.produce(&s, 1000, 0.3, 0);
    s.wait_processed();

    let pod = pod_name(0);
    let before = s.pod(&pod).await;
    let since = s.status_version().await;
    s.kubectl(&["delete", "pod", &pod, "--wait=false"]);
    // The old pod's agent stops after the processor (a native sidecar) and reports its end:
    // drained, asked by the preStop hook over HTTP, not by the kubelet's SIGTERM.
    let last = s.wait_for_final_report(&pod, &since).await;
    assert_eq!(last.last_shutdown_clean, Some(true), "{last:?}");
    assert_eq!(
        last.drain_requested_by,
        Some(DrainRequest::Http),
        "the kubelet ran the preStop hook: {last:?}"
    );
    assert!(last.drain_duration_ms.is_some(), "{last:?}");

    // The StatefulSet re-creates the pod; the kubelet marks it Ready once its stores are open.
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let p = s
            .pods()
            .await
            .into_iter()
            .find(|p| p.metadata.name.as_deref() == Some(pod.as_str()));
        if p.is_some_and(|p| uid(&p) != uid(&before) && is_ready(&p)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the new pod did not become ready:\n{}",
            s.diagnostics().await
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let status = s
        .wait_for_status(
            "the new pod's report of its stores",
            Duration::from_secs(60),
            |st| {
                report(st, &pod).is_some_and(|p| {
                    p.phase == Some(PodPhase::Running)
                        && !p.tasks.is_empty()
                        && p.tasks.iter().all(|t| t.opened.is_some())
                })
            },
        )
        .await;
    let new = report(&status, &pod).unwrap();
    assert_eq!(new.last_shutdown_clean, Some(true), "{new:?}");
    for task in &new.tasks {
        assert_eq!(task.opened, Some(StoreOpen::Clean), "{new:?}");
        assert!(
            task.restore.as_ref().is_none_or(|r| r.restored == 0),
            "nothing restored: {new:?}"
        );
    }

    sent.produce(&s, 1000, 0.3, 0);
    s.assert_exactly_once(&sent);
    s.finish().await;
}

/// With two processing threads: each pod's 2 of the 4 partitions are split between two group
/// members of its one container, both killed together and both back within the session
/// timeout.
#[tokio::test]
async fn killing_a_two_thread_processor_container_restarts_it_and_replays_only_the_tail() {
    let s = Scenario::start("kill", 4).await;
    let mut app = with_session_timeout(s.example(), 45_000);
    app["spec"]["processingThreads"] = 2.into();
    s.apply(&app);
    s.wait_ready(READY_TIMEOUT).await;
    assert_eq!(
        testbed::kafka::group_members(&s.application_id()),
        4,
        "two pods of two processing threads: four group members"
    );
    let mut sent = Sent::new();
    sent.produce(&s, 1000, 0.3, 0);
    s.wait_processed();

    let pod = pod_name(0);
    let before = s.pod(&pod).await;
    assert_eq!(processor_restarts(&before), 0);
    // SIGKILL to the container's processes, as a crash would: no drain, no checkpoint.
    testbed::node::kill_container(&before, "processor");
    let deadline = Instant::now() + Duration::from_secs(120);
    let after = loop {
        let p = s.pod(&pod).await;
        if processor_restarts(&p) >= 1 && is_ready(&p) {
            break p;
        }
        assert!(
            Instant::now() < deadline,
            "the kubelet did not restart the processor:\n{}",
            s.diagnostics().await
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(
        uid(&after),
        uid(&before),
        "the same pod: the kubelet restarted the container"
    );
    let processor = after
        .status
        .as_ref()
        .unwrap()
        .container_statuses
        .as_ref()
        .unwrap()
        .iter()
        .find(|c| c.name == "processor")
        .unwrap()
        .clone();
    let killed = processor
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .expect("the kubelet recorded the kill");
    assert_eq!(killed.exit_code, 137, "{killed:?}");

    let status = s
        .wait_for_status(
            "the restarted processor's report",
            Duration::from_secs(60),
            |st| {
                report(st, &pod).is_some_and(|p| {
                    p.phase == Some(PodPhase::Running)
                        && p.last_shutdown_clean == Some(false)
                        // Both threads' tasks: the pod's two partitions.
                        && p.tasks.len() == 2
                        && p.tasks.iter().all(|t| t.opened.is_some())
                })
            },
        )
        .await;
    let entry = report(&status, &pod).unwrap();
    for task in &entry.tasks {
        // Its own store, reopened: only what the changelog holds beyond the store's offset is
        // replayed, never the whole changelog.
        assert_eq!(task.opened, Some(StoreOpen::ReplayedTail), "{entry:?}");
        let restored = task.restore.as_ref().map_or(0, |r| r.restored);
        assert!(
            restored < 100,
            "partition {}: {restored} records replayed: {entry:?}",
            task.partition
        );
    }

    sent.produce(&s, 1000, 0.3, 0);
    s.assert_exactly_once(&sent);
    s.finish().await;
}

/// One look at the pods during a rollout.
#[derive(Clone, Debug)]
struct PodSnap {
    name: String,
    uid: String,
    ready: bool,
    deleting: bool,
    config_hash: String,
}

#[tokio::test]
async fn a_rocksdb_change_rolls_the_pods_one_at_a_time_each_ready_only_after_restore() {
    let s = Scenario::start("rollout", 4).await;
    s.apply(&s.example());
    s.wait_ready(READY_TIMEOUT).await;
    let mut sent = Sent::new();
    sent.produce(&s, 1000, 0.3, 0);
    s.wait_processed();
    let before = s.status().await.config_hash.expect("a config hash");
    let old_uids: Vec<String> = s.pods().await.iter().map(uid).collect();

    // Watch the pods through the rollout.
    let timeline: Arc<Mutex<Vec<Vec<PodSnap>>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (timeline, stop) = (timeline.clone(), stop.clone());
        let pods: Api<Pod> = Api::namespaced(s.client.clone(), &s.namespace);
        tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                if let Ok(list) = pods.list(&Default::default()).await {
                    let snap = list
                        .items
                        .iter()
                        .map(|p| PodSnap {
                            name: p.metadata.name.clone().unwrap(),
                            uid: uid(p),
                            ready: is_ready(p),
                            deleting: p.metadata.deletion_timestamp.is_some(),
                            config_hash: p
                                .metadata
                                .annotations
                                .as_ref()
                                .and_then(|a| a.get("streamapp.dev/config-hash"))
                                .cloned()
                                .unwrap_or_default(),
                        })
                        .collect();
                    timeline.lock().unwrap().push(snap);
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };

    s.kubectl(&[
        "patch",
        "streamapp",
        APP,
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"rocksdb":{"blockCacheSize":"24Mi"}}}"#,
    ]);
    // Traffic during the rollout.
    sent.produce(&s, 1000, 0.3, 0);
    let status = s
        .wait_for_status("the rollout to complete", Duration::from_secs(300), |st| {
            st.config_hash.as_deref().is_some_and(|h| h != before)
                && condition(st, "Progressing").is_some_and(|c| c.1 == "RolloutComplete")
                && st.ready.as_deref() == Some("2/2")
        })
        .await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    watcher.await.unwrap();
    let new_hash = status.config_hash.unwrap();
    let timeline = timeline.lock().unwrap().clone();

    let first_seen = |name: &str| {
        timeline.iter().position(|snap| {
            snap.iter()
                .any(|p| p.name == name && !old_uids.contains(&p.uid))
        })
    };
    let new1 = first_seen(&pod_name(1)).expect("orders-dedup-1 was replaced");
    let new0 = first_seen(&pod_name(0)).expect("orders-dedup-0 was replaced");
    assert!(new1 < new0, "the highest ordinal goes first");
    // The old orders-dedup-0 was only let go once the new orders-dedup-1 was Ready, which it
    // is only once its processor restored its stores (/readyz is its readiness probe).
    let old0_leaves = timeline
        .iter()
        .position(|snap| {
            !snap
                .iter()
                .any(|p| p.name == pod_name(0) && old_uids.contains(&p.uid) && !p.deleting)
        })
        .expect("the old orders-dedup-0 went away");
    let new1_ready = timeline.iter().position(|snap| {
        snap.iter()
            .any(|p| p.name == pod_name(1) && !old_uids.contains(&p.uid) && p.ready)
    });
    assert!(
        new1_ready.is_some_and(|r| r <= old0_leaves),
        "orders-dedup-0 was deleted before the new orders-dedup-1 was ready"
    );
    let at_most_one_down = timeline
        .iter()
        .all(|snap| snap.iter().filter(|p| !p.ready || p.deleting).count() <= 1 || snap.len() < 2);
    assert!(
        at_most_one_down,
        "more than one pod was down at once during the rollout"
    );
    for pod in s.pods().await {
        let hash = pod.metadata.annotations.unwrap()["streamapp.dev/config-hash"].clone();
        assert_eq!(hash, new_hash, "the config hash rolled every pod");
    }
    assert!(timeline.iter().flatten().any(|p| p.config_hash == before));

    s.assert_exactly_once(&sent);
    s.finish().await;
}

#[tokio::test]
async fn kubectl_scale_moves_partitions_steps_in_one_pod_at_a_time_keeps_exactly_once_and_claims_follow_the_policy()
 {
    let s = Scenario::start("scale", 4).await;
    // A session timeout far longer than a scale-in step: the pods scaled away must leave the
    // group when they are gone (the operator removes their static members), not expire.
    let mut app = with_session_timeout(s.example(), 120_000);
    app["spec"]["storage"]["retentionPolicy"] =
        serde_yaml::from_str("{whenDeleted: Retain, whenScaled: Delete}").unwrap();
    s.apply(&app);
    s.wait_ready(READY_TIMEOUT).await;
    let mut sent = Sent::new();
    sent.produce(&s, 500, 0.3, 0);

    s.kubectl(&["scale", "streamapp", APP, "--replicas=3"]);
    s.wait_for_status("3/3 ready", READY_TIMEOUT, |st| {
        st.ready.as_deref() == Some("3/3")
    })
    .await;
    let scale = s.kubectl(&[
        "get",
        "streamapp",
        APP,
        "--subresource=scale",
        "-o",
        "jsonpath={.spec.replicas} {.status.replicas} {.status.selector}",
    ]);
    assert_eq!(scale, format!("3 3 streamapp.dev/app={APP}"));
    // The new pod took over partitions.
    s.wait_for_status(
        "orders-dedup-2 reporting its tasks",
        Duration::from_secs(60),
        |st| report(st, &pod_name(2)).is_some_and(|p| !p.tasks.is_empty()),
    )
    .await;
    sent.produce(&s, 500, 0.3, 0);
    s.assert_exactly_once(&sent);

    // Scale-in goes one pod at a time, each step once the remaining pods took the leaving
    // pod's partitions over: watch the StatefulSet's replicas and the Progressing reason.
    let watcher = {
        let client = s.client.clone();
        let ns = s.namespace.clone();
        tokio::spawn(async move {
            let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
            let apps: Api<StreamApp> = Api::namespaced(client, &ns);
            let (mut replicas, mut reasons) = (Vec::<i32>::new(), Vec::<String>::new());
            while replicas.last() != Some(&1) {
                let r = sets.get(APP).await.unwrap().spec.unwrap().replicas.unwrap();
                if replicas.last() != Some(&r) {
                    replicas.push(r);
                }
                let status = apps.get(APP).await.unwrap().status.unwrap_or_default();
                if let Some((_, reason, _)) = condition(&status, "Progressing")
                    && reasons.last().map(String::as_str) != Some(reason)
                {
                    reasons.push(reason.to_string());
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            (replicas, reasons)
        })
    };
    s.kubectl(&["scale", "streamapp", APP, "--replicas=1"]);
    s.wait_for_status("1/1 Running", READY_TIMEOUT, |st| {
        st.ready.as_deref() == Some("1/1")
            && st.replicas == Some(1)
            && st.phase == Some(AppPhase::Running)
    })
    .await;
    let (steps, reasons) = watcher.await.unwrap();
    assert_eq!(
        steps,
        [3, 2, 1],
        "the StatefulSet's replicas during the scale-in"
    );
    // The scaled-away pods' static members were removed from the group, not left to expire
    // with the session timeout (two minutes here): the group holds only the remaining pod.
    let group = s.application_id();
    let deadline = Instant::now() + Duration::from_secs(30);
    while testbed::kafka::group_members(&group) != 1 {
        assert!(
            Instant::now() < deadline,
            "consumer group {group} still has {} members 30 s after the scale-in to 1 (the session timeout is 120 s)",
            testbed::kafka::group_members(&group)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let removed = s.kubectl(&[
        "get",
        "events",
        "--field-selector=reason=RemovedGroupMembers",
        "-o",
        "jsonpath={.items[*].message}",
    ]);
    for pod in [pod_name(1), pod_name(2)] {
        assert!(
            removed.contains(&format!("{pod} ")) || removed.contains(&format!("{pod},")),
            "an Event says {pod}'s member was removed from the group: {removed:?}"
        );
    }
    assert!(
        reasons.iter().any(|r| r == "ScalingIn"),
        "the status said the scale-in waited: {reasons:?}"
    );
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(s.client.clone(), &s.namespace);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let names: Vec<String> = claims
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            .map(|c| c.metadata.name.unwrap())
            .collect();
        if names == [format!("state-{}", pod_name(0))] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "whenScaled: Delete keeps only the remaining pod's claim, found {names:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    sent.produce(&s, 500, 0.3, 0);
    s.assert_exactly_once(&sent);
    let status = s
        .wait_for_status(
            "orders-dedup-0 owning every partition",
            Duration::from_secs(60),
            |st| report(st, &pod_name(0)).is_some_and(|p| p.tasks.len() == 4),
        )
        .await;
    assert_eq!(report(&status, &pod_name(0)).unwrap().tasks.len(), 4);
    s.finish().await;
}

#[tokio::test]
async fn too_little_memory_is_refused_and_an_oom_kill_by_the_kernel_shows_in_the_status() {
    let s = Scenario::start("memory", 1).await;
    let mut app = s.example();
    app["spec"]["replicas"] = 1.into();
    // The LowMemory profile needs 16Mi + 32Mi for RocksDB and 192Mi for the process.
    app["spec"]["resources"]["limits"]["memory"] = "128Mi".into();
    app["spec"]["resources"]["requests"]["memory"] = "128Mi".into();
    s.apply(&app);
    let status = s
        .wait_for_status(
            "Degraded (MemoryBudgetExceeded)",
            Duration::from_secs(60),
            |st| condition(st, "Degraded").is_some_and(|c| c.1 == "MemoryBudgetExceeded"),
        )
        .await;
    assert!(
        condition(&status, "Degraded")
            .unwrap()
            .2
            .contains("MiB over"),
        "{status:?}"
    );
    let sts = s.kubectl(&["get", "statefulsets", "-o", "name"]);
    assert_eq!(
        sts.trim(),
        "",
        "nothing is rolled out while the budget is exceeded"
    );

    // Enough by the budget, but the processor will allocate past it on one record.
    app["spec"]["resources"]["limits"]["memory"] = "256Mi".into();
    app["spec"]["resources"]["requests"]["memory"] = "256Mi".into();
    app["spec"]["pod"] =
        serde_yaml::from_str("{env: [{name: STREAMAPP_FAULTS, value: grow-memory-after-put=1}]}")
            .unwrap();
    s.apply(&app);
    s.wait_ready(READY_TIMEOUT).await;
    let producer: BaseProducer = testbed::kafka::input_producer_config().create().unwrap();
    testbed::kafka::send(
        &producer,
        BaseRecord::to(&s.topics.input)
            .key("cmd-oom")
            .payload(r#"{"commandId":"cmd-oom"}"#)
            .headers(OwnedHeaders::new().insert(Header {
                key: "streamapp.fault",
                value: Some("grow-memory-after-put"),
            })),
    );
    producer.flush(Duration::from_secs(10)).unwrap();

    let status = s
        .wait_for_status("Degraded (OOMKilled)", Duration::from_secs(120), |st| {
            condition(st, "Degraded").is_some_and(|c| c.1 == "OOMKilled")
        })
        .await;
    let message = condition(&status, "Degraded").unwrap().2;
    assert!(
        message.contains(&pod_name(0)) && message.contains("container processor"),
        "{message}"
    );
    // The reason is the kubelet's, from the kernel's kill.
    let pod = s.pod(&pod_name(0)).await;
    let processor = pod
        .status
        .unwrap()
        .container_statuses
        .unwrap()
        .into_iter()
        .find(|c| c.name == "processor")
        .unwrap();
    let terminated = processor
        .state
        .as_ref()
        .and_then(|s| s.terminated.clone())
        .or_else(|| {
            processor
                .last_state
                .as_ref()
                .and_then(|s| s.terminated.clone())
        })
        .expect("the processor was terminated");
    assert_eq!(
        terminated.reason.as_deref(),
        Some("OOMKilled"),
        "{terminated:?}"
    );
    assert_eq!(terminated.exit_code, 137, "{terminated:?}");
    s.finish().await;
}

#[tokio::test]
async fn an_image_the_node_does_not_have_shows_pods_not_starting_in_the_status() {
    let s = Scenario::start("no-image", 1).await;
    let mut app = s.example();
    app["spec"]["replicas"] = 1.into();
    app["spec"]["image"] = "localhost/streamapp/streamapp:does-not-exist".into();
    app["spec"]["imagePullPolicy"] = "Never".into();
    s.apply(&app);
    let status = s
        .wait_for_status(
            "Ready=False (PodsNotStarting)",
            Duration::from_secs(90),
            |st| condition(st, "Ready").is_some_and(|c| c.1 == "PodsNotStarting"),
        )
        .await;
    let (_, _, message) = condition(&status, "Ready").unwrap();
    assert!(
        message.contains("ErrImageNeverPull") && message.contains(&pod_name(0)),
        "{message}"
    );
    assert_eq!(
        condition(&status, "Degraded").map(|c| (c.0, c.1)),
        Some(("True", "PodsNotStarting"))
    );
    assert_eq!(
        condition(&status, "Progressing").map(|c| (c.0, c.1)),
        Some(("False", "PodsNotStarting"))
    );
    let wide = s.kubectl(&["get", "streamapp", APP, "-o", "wide"]);
    assert!(wide.contains("PodsNotStarting"), "{wide}");
    s.finish().await;
}

#[tokio::test]
async fn a_bad_image_rolled_out_then_reverted_heals_without_deleting_a_pod_by_hand() {
    let s = Scenario::start("bad-rollout", 4).await;
    let good = s.example();
    s.apply(&good);
    s.wait_ready(READY_TIMEOUT).await;
    let mut sent = Sent::new();
    sent.produce(&s, 500, 0.3, 0);
    s.wait_processed();

    let mut bad = good.clone();
    bad["spec"]["image"] = "localhost/streamapp/streamapp:does-not-exist".into();
    bad["spec"]["imagePullPolicy"] = "Never".into();
    s.apply(&bad);
    // The rollout replaces the highest ordinal first, and its new pod cannot start.
    s.wait_for_status(
        "the bad rollout to be stuck",
        Duration::from_secs(120),
        |st| condition(st, "Ready").is_some_and(|c| c.1 == "PodsNotStarting"),
    )
    .await;

    s.apply(&good);
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let pods = s.pods().await;
        let healed = pods.len() == 2
            && pods.iter().all(|p| {
                is_ready(p)
                    && p.spec.as_ref().unwrap().containers[0].image.as_deref()
                        == Some(testbed::node::app_image().as_str())
            });
        if healed {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the reverted rollout did not heal:\n{}",
            s.diagnostics().await
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    s.wait_for_status("2/2 Running again", Duration::from_secs(60), |st| {
        st.ready.as_deref() == Some("2/2") && st.phase == Some(AppPhase::Running)
    })
    .await;
    sent.produce(&s, 500, 0.3, 0);
    s.assert_exactly_once(&sent);
    s.finish().await;
}

#[tokio::test]
async fn with_a_standby_replica_every_partition_has_a_warm_copy_on_the_other_pod_and_kubectl_shows_it()
 {
    let s = Scenario::start("standbys", 4).await;
    let mut app = s.example();
    app["spec"]["standbyReplicas"] = 1.into();
    // Two threads per pod: four members, and each task's copy still on the other pod.
    app["spec"]["processingThreads"] = 2.into();
    s.apply(&app);
    s.wait_ready(READY_TIMEOUT).await;

    let mut sent = Sent::new();
    sent.produce(&s, 2000, 0.3, 5);
    s.assert_exactly_once(&sent);

    // Each pod processes its share and keeps a caught-up copy of the other's: the agents
    // report the copies, the operator counts the partitions they cover.
    let status = s
        .wait_for_status(
            "every partition covered by a standby",
            Duration::from_secs(90),
            |st| st.standby_coverage.as_deref() == Some("4/4"),
        )
        .await;
    let group = s.application_id();
    assert_eq!(
        testbed::kafka::group_members(&group),
        4,
        "two pods of two processing threads: four group members (group {})",
        testbed::kafka::group_state(&group)
    );
    for pod in &status.pods {
        let states: Vec<_> = pod.tasks.iter().filter_map(|t| t.state.as_ref()).collect();
        assert!(
            states.contains(&&TaskState::Active) && states.contains(&&TaskState::Standby),
            "{}: {states:?}",
            pod.name
        );
        // A pod never keeps a copy of a task one of its own threads runs.
        let in_state = |state: TaskState| -> BTreeSet<i32> {
            pod.tasks
                .iter()
                .filter(|t| t.state.as_ref() == Some(&state))
                .map(|t| t.partition)
                .collect()
        };
        let (active, standby) = (in_state(TaskState::Active), in_state(TaskState::Standby));
        assert!(
            active.is_disjoint(&standby),
            "{}: {:?}",
            pod.name,
            pod.tasks
        );
    }
    // kubectl aligns the columns (an empty one, such as BEHIND at no lag, is blank): the
    // value starts where its header does.
    let wide = s.kubectl(&["get", "sapp", APP, "-o", "wide"]);
    let mut lines = wide.lines();
    let (header, row) = (lines.next().unwrap(), lines.next().unwrap());
    let at = header.find("STANDBYS").expect(&wide);
    let value = row.get(at..).and_then(|r| r.split_whitespace().next());
    assert_eq!(value, Some("4/4"), "{wide}");
    s.finish().await;
}
