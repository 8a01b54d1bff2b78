//! StreamApps on three real nodes (`make up`, three by default; `make test` or `make test-nodes`): where pods and
//! standbys go, and what a lost node costs. A node is lost the way a machine is: dev/node.sh
//! kills every process of it at once and takes its link down; nothing is emulated, the control
//! plane and Kafka find out on their own. The tests take turns ([`scenario`]): each breaks a
//! node the others would run on.

mod failover;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use streamapp_api::crd::StreamAppStatus;
use streamapp_api::status_values::{DrainRequest, TaskState};
use streamapp_e2e::{READY_TIMEOUT, Scenario, Sent};
use testbed::node::NodeFault;

const NODES: usize = 3;

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// This test's turn (held until it ends), once every node is Ready again after the last one's
/// fault, and its scenario with an input of six partitions.
async fn scenario(prefix: &str) -> (tokio::sync::MutexGuard<'static, ()>, Scenario) {
    let turn = SERIAL.lock().await;
    let client = testbed::kube::client().await;
    testbed::node::wait_for_ready_nodes(&client, NODES, Duration::from_secs(180)).await;
    (turn, Scenario::start(prefix, 6).await)
}

/// An app of three pods with one standby copy of each of its six partitions.
fn three_pods_with_standbys(s: &Scenario) -> serde_yaml::Value {
    let mut app = s.example();
    app["spec"]["replicas"] = 3.into();
    app["spec"]["standbyReplicas"] = 1.into();
    app
}

/// The node each pod of the scenario runs on.
async fn nodes_of_pods(s: &Scenario) -> BTreeMap<String, String> {
    s.pods()
        .await
        .into_iter()
        .map(|p| {
            let name = p.metadata.name.clone().unwrap();
            let node = p.spec.and_then(|s| s.node_name).unwrap_or_default();
            (name, node)
        })
        .collect()
}

/// For each partition, the pods that report it active and the pods that report a standby.
fn holders(status: &StreamAppStatus) -> BTreeMap<i32, (Vec<String>, Vec<String>)> {
    let mut out: BTreeMap<i32, (Vec<String>, Vec<String>)> = BTreeMap::new();
    for pod in &status.pods {
        for task in &pod.tasks {
            let entry = out.entry(task.partition).or_default();
            match task.state {
                Some(TaskState::Active) => entry.0.push(pod.name.clone()),
                Some(TaskState::Standby) => entry.1.push(pod.name.clone()),
                _ => {}
            }
        }
    }
    out
}

#[tokio::test]
async fn three_pods_go_to_three_nodes_and_each_standby_to_another_node_than_its_active() {
    let (_turn, s) = scenario("spread").await;
    s.apply(&three_pods_with_standbys(&s));
    s.wait_ready(READY_TIMEOUT).await;

    let nodes = nodes_of_pods(&s).await;
    let distinct: BTreeSet<&String> = nodes.values().collect();
    assert_eq!(distinct.len(), NODES, "one pod per node: {nodes:?}");
    assert!(
        nodes.values().all(|n| testbed::node::is_real(Some(n))),
        "{nodes:?}"
    );

    let zones = zones_of(&nodes).await;
    let distinct: BTreeSet<&String> = zones.values().collect();
    assert_eq!(distinct.len(), NODES, "one pod per zone: {zones:?}");

    each_standby_off_its_actives_node_and_every_id_once(s, &nodes).await;
}

/// With more pods than nodes, two pods share a node: a partition active on one of them must
/// still get its standby on another node, not on the pod next door.
#[tokio::test]
async fn four_pods_on_three_nodes_keep_no_partitions_standby_on_its_actives_node() {
    let (_turn, s) = scenario("four").await;
    let mut app = three_pods_with_standbys(&s);
    app["spec"]["replicas"] = 4.into();
    s.apply(&app);
    s.wait_ready(READY_TIMEOUT).await;

    let nodes = nodes_of_pods(&s).await;
    assert_eq!(nodes.len(), 4, "{nodes:?}");
    let distinct: BTreeSet<&String> = nodes.values().collect();
    assert_eq!(
        distinct.len(),
        NODES,
        "four pods over every node: {nodes:?}"
    );

    each_standby_off_its_actives_node_and_every_id_once(s, &nodes).await;
}

/// Once every partition has its standby: each on another node than its active, then a batch
/// with repeats and bad records, every id output once. Ends the scenario.
async fn each_standby_off_its_actives_node_and_every_id_once(
    s: Scenario,
    nodes: &BTreeMap<String, String>,
) {
    let status = wait_for_every_standby(&s).await;
    assert_each_standby_off_its_actives_node(&status, nodes);
    let mut sent = Sent::new();
    sent.produce(&s, 2000, 0.3, 3);
    s.assert_exactly_once(&sent);
    s.finish().await;
}

/// Every one of the six partitions has one active and one standby, on different nodes.
fn assert_each_standby_off_its_actives_node(
    status: &StreamAppStatus,
    nodes: &BTreeMap<String, String>,
) {
    let holders = holders(status);
    assert_eq!(holders.len(), 6, "{holders:?}");
    for (partition, (active, standbys)) in &holders {
        assert_eq!(active.len(), 1, "partition {partition}: {holders:?}");
        assert_eq!(standbys.len(), 1, "partition {partition}: {holders:?}");
        assert_ne!(
            nodes[&active[0]], nodes[&standbys[0]],
            "partition {partition}'s standby is on its active's node: {holders:?} {nodes:?}"
        );
    }
}

/// The zone (`topology.kubernetes.io/zone`) of each pod's node.
async fn zones_of(nodes: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let api: kube::Api<k8s_openapi::api::core::v1::Node> =
        kube::Api::all(testbed::kube::client().await);
    let mut zones = BTreeMap::new();
    for (pod, node) in nodes {
        let labels = api.get(node).await.expect("the pod's node").metadata.labels;
        let zone = labels
            .and_then(|l| l.get("topology.kubernetes.io/zone").cloned())
            .unwrap_or_else(|| panic!("node {node} has no zone label"));
        zones.insert(pod.clone(), zone);
    }
    zones
}

/// Waits until each of the six partitions has a caught-up standby.
async fn wait_for_every_standby(s: &Scenario) -> StreamAppStatus {
    s.wait_for_status(
        "every partition with a standby",
        Duration::from_secs(120),
        |st| st.standby_coverage.as_deref() == Some("6/6"),
    )
    .await
}

/// Waits until the `NodeLoss` condition says a pod is held; returns its message.
async fn wait_until_held(s: &Scenario, what: &str) -> String {
    let status = s
        .wait_for_status(what, Duration::from_secs(180), |st| {
            node_loss(st).is_some_and(|(status, reason, _)| status == "True" && reason == "Held")
        })
        .await;
    node_loss(&status).unwrap().2
}

/// The condition the operator keeps about pods of lost nodes: status, reason, message.
fn node_loss(status: &StreamAppStatus) -> Option<(String, String, String)> {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == "NodeLoss")
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// The pod's UID and node.
async fn uid_and_node(s: &Scenario, pod: &str) -> (String, String) {
    let p = s.pod(pod).await;
    (
        p.metadata.uid.clone().unwrap(),
        p.spec.and_then(|s| s.node_name).unwrap_or_default(),
    )
}

/// A pod of the app whose node does not run the operator (a fault on the operator's node would
/// stop the operator too, until Kubernetes evicts it after 300 s), with its UID, its node and
/// that node's number.
async fn pod_away_from_the_operator(s: &Scenario) -> (String, String, String, u32) {
    let pods = s.pods().await;
    let nodes = nodes_of_pods(s).await;
    let operator = operator_node(s).await;
    let (pod, node) = nodes
        .into_iter()
        .find(|(_, node)| *node != operator)
        .expect("an app pod on another node than the operator's");
    let uid = pods
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some(pod.as_str()))
        .and_then(|p| p.metadata.uid.clone())
        .unwrap();
    let number = testbed::node::number(&node).expect("a real node");
    (pod, uid, node, number)
}

/// The PersistentVolume bound to a pod's state claim (the StatefulSet's `state-<pod>`).
async fn state_volume(s: &Scenario, pod: &str) -> String {
    kube::Api::<PersistentVolumeClaim>::namespaced(s.client.clone(), &s.namespace)
        .get(&format!("state-{pod}"))
        .await
        .unwrap()
        .spec
        .and_then(|spec| spec.volume_name)
        .expect("a bound state claim")
}

/// A volume's phase and its local directory, while it exists.
async fn volume_phase_and_dir(s: &Scenario, pv: &str) -> Option<(String, PathBuf)> {
    let pv = kube::Api::<PersistentVolume>::all(s.client.clone())
        .get_opt(pv)
        .await
        .unwrap()?;
    let phase = pv.status.and_then(|st| st.phase).unwrap_or_default();
    let dir = pv
        .spec
        .and_then(|spec| spec.local)
        .expect("a local volume")
        .path;
    Some((phase, PathBuf::from(dir)))
}

/// The node the operator's pod runs on.
async fn operator_node(s: &Scenario) -> String {
    kube::Api::<k8s_openapi::api::core::v1::Pod>::namespaced(s.client.clone(), &s.namespace)
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|p| {
            p.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with(&s.release))
        })
        .and_then(|p| p.spec?.node_name)
        .expect("the operator's pod is scheduled")
}

/// A node killed under an app's pod ([`lose_a_node`]).
struct Loss {
    sent: Sent,
    pod: String,
    uid: String,
    node: String,
    /// Its state volume (a local PV on the lost node).
    volume: String,
    /// Restart the node to undo.
    fault: NodeFault,
    at: Instant,
    /// The lost pod's active partitions, with where each stood on the changelog for a
    /// read_committed reader right after the loss.
    partitions: BTreeMap<i32, i64>,
}

/// Starts the app (three pods, `standbys` standby copies, `spec.nodeLoss` as given), processes a
/// first batch and kills the node of one pod (not the operator's).
async fn lose_a_node(s: &Scenario, standbys: u32, node_loss: serde_yaml::Value) -> Loss {
    let mut app = three_pods_with_standbys(s);
    app["spec"]["standbyReplicas"] = standbys.into();
    app["spec"]["nodeLoss"] = node_loss;
    s.apply(&app);
    s.wait_ready(READY_TIMEOUT).await;
    if standbys > 0 {
        wait_for_every_standby(s).await;
    }
    let mut sent = Sent::new();
    sent.produce(s, 2000, 0.3, 0);
    s.wait_processed();
    let (pod, uid, node, number) = pod_away_from_the_operator(s).await;
    let volume = state_volume(s, &pod).await;
    let active = failover::active_partitions(&s.status().await, &pod);
    assert!(!active.is_empty(), "{pod} processes some partitions");
    let at = Instant::now();
    let fault = NodeFault::inject("kill", number, &[], "restart");
    Loss {
        sent,
        partitions: failover::committed_ends(s, &active),
        pod,
        uid,
        node,
        volume,
        fault,
        at,
    }
}

#[tokio::test]
async fn a_node_lost_under_load_fails_over_to_standbys_and_its_pod_is_replaced_on_another_node() {
    let (_turn, s) = scenario("nodeloss").await;
    let Loss {
        mut sent,
        pod: lost_pod,
        uid,
        node: lost_node,
        volume: lost_volume,
        fault,
        at: lost_at,
        partitions,
    } = lose_a_node(&s, 1, serde_yaml::from_str("after: 10s").unwrap()).await;

    // Records keep coming. The lost pod's group membership times out and its partitions go to
    // their standbys on the other nodes; its open transaction is ended.
    let input = failover::measure_first_output(&s, 1, &partitions, lost_at);
    wait_for_every_standby(&s).await;
    failover::report(
        "every partition with a caught-up standby again",
        1,
        lost_at.elapsed(),
    );
    input.stop(&mut sent);
    sent.produce(&s, 2000, 0.3, 0);
    s.wait_processed();
    s.assert_exactly_once(&sent);

    // Once the node is NotReady for `after`, the operator force-deletes the pod and, its local
    // volume being on that node only, its claim: the StatefulSet makes the pod again elsewhere.
    let note = s
        .wait_for_event("ReplacedPodOfLostNode", Duration::from_secs(180))
        .await;
    assert!(note.contains(&lost_pod) && note.contains(&uid), "{note}");
    let claim_note = s
        .wait_for_event("RecreatedVolumeOfLostNode", Duration::from_secs(30))
        .await;
    assert!(claim_note.contains(&lost_pod), "{claim_note}");
    s.wait_ready(READY_TIMEOUT).await;
    let (new_uid, new_node) = uid_and_node(&s, &lost_pod).await;
    assert_ne!(new_uid, uid, "a new pod");
    assert_ne!(new_node, lost_node, "on another node");
    assert_ne!(
        state_volume(&s, &lost_pod).await,
        lost_volume,
        "a new volume"
    );
    // The old volume is on the dead node's disk: released, but nothing can wipe it yet.
    let (phase, lost_dir) = volume_phase_and_dir(&s, &lost_volume)
        .await
        .expect("the lost node's volume stays while the node is down");
    assert_eq!(phase, "Released");
    assert!(lost_dir.is_dir(), "{}", lost_dir.display());
    failover::report(
        &format!("{lost_pod} replaced and Ready on another node"),
        1,
        lost_at.elapsed(),
    );
    let status = s
        .wait_for_status("NodeLoss false again", Duration::from_secs(60), |st| {
            node_loss(st).is_some_and(|(status, _, _)| status == "False")
        })
        .await;
    assert_eq!(status.ready.as_deref(), Some("3/3"), "{status:?}");
    sent.produce(&s, 1000, 0.3, 0);
    s.assert_exactly_once(&sent);

    // The node boots again: it finds its pod gone and runs nothing of the app, and its old
    // volume is deleted, directory and all.
    fault.undo();
    s.wait_ready(READY_TIMEOUT).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while let Some((phase, _)) = volume_phase_and_dir(&s, &lost_volume).await {
        assert!(
            Instant::now() < deadline,
            "{lost_volume} still there ({phase}) a minute after its node came back"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(!lost_dir.exists(), "{}", lost_dir.display());
    let nodes = nodes_of_pods(&s).await;
    assert_eq!(
        nodes[&lost_pod], new_node,
        "the replacement stays where it is"
    );
    sent.produce(&s, 1000, 0.3, 0);
    s.assert_exactly_once(&sent);
    // The status has no entry of the lost pod left: the one under its name is the replacement's.
    let status = s.status().await;
    let (replacement_uid, _) = uid_and_node(&s, &lost_pod).await;
    let entry = status.pods.iter().find(|p| p.name == lost_pod).unwrap();
    assert_eq!(
        entry.uid.as_deref(),
        Some(replacement_uid.as_str()),
        "{entry:?}"
    );
    s.finish().await;
}

/// The same loss without standbys: the lost partitions go to the other pods, which restore
/// their stores from the changelog first. The time it takes is the report's figure; the node
/// comes back before the operator would replace its pod.
#[tokio::test]
async fn a_node_lost_without_standbys_has_its_partitions_restored_elsewhere_from_the_changelog() {
    let (_turn, s) = scenario("nodeloss0").await;
    let Loss {
        mut sent,
        fault,
        at: lost_at,
        partitions,
        ..
    } = lose_a_node(&s, 0, serde_yaml::from_str("after: 10m").unwrap()).await;
    let input = failover::measure_first_output(&s, 0, &partitions, lost_at);
    streamapp_e2e::report(
        "node loss, Kafka Streams at its defaults (not measured here: no Kafka Streams image on \
         the test bed): its group notices after session.timeout.ms = 45 s, the lost tasks restore \
         their whole changelogs first (num.standby.replicas = 0), and Kubernetes replaces the pod \
         only after an administrator's force-delete, no sooner than the 300 s eviction",
    );
    input.stop(&mut sent);
    s.assert_exactly_once(&sent);
    fault.undo();
    s.wait_ready(READY_TIMEOUT).await;
    sent.produce(&s, 1000, 0.3, 0);
    s.assert_exactly_once(&sent);
    s.finish().await;
}

#[tokio::test]
async fn with_wait_the_pod_of_a_lost_node_is_left_to_an_administrator_and_comes_back_with_the_node()
{
    let (_turn, s) = scenario("nodewait").await;
    let Loss {
        mut sent,
        pod: lost_pod,
        uid,
        node: lost_node,
        fault,
        ..
    } = lose_a_node(
        &s,
        1,
        serde_yaml::from_str("{action: Wait, after: 10s}").unwrap(),
    )
    .await;
    sent.produce(&s, 1000, 0.3, 0);
    s.assert_exactly_once(&sent);

    let message = wait_until_held(&s, "NodeLoss: the pod is held").await;
    assert!(
        message.contains("spec.nodeLoss.action is Wait") && message.contains(&lost_pod),
        "{message}"
    );
    assert_eq!(
        uid_and_node(&s, &lost_pod).await,
        (uid.clone(), lost_node.clone())
    );

    // The node comes back: the same pod runs again on it, on its own volume.
    fault.undo();
    s.wait_ready(READY_TIMEOUT).await;
    assert_eq!(uid_and_node(&s, &lost_pod).await, (uid, lost_node));
    s.wait_for_status("NodeLoss false again", Duration::from_secs(60), |st| {
        node_loss(st).is_some_and(|(status, _, _)| status == "False")
    })
    .await;
    sent.produce(&s, 1000, 0.3, 0);
    s.assert_exactly_once(&sent);
    s.finish().await;
}

#[tokio::test]
async fn a_node_that_lost_only_the_api_server_keeps_its_pod_because_its_output_flows() {
    let (_turn, s) = scenario("nodepartition").await;
    let mut app = three_pods_with_standbys(&s);
    app["spec"]["nodeLoss"] = serde_yaml::from_str("after: 10s").unwrap();
    s.apply(&app);
    s.wait_ready(READY_TIMEOUT).await;
    let (lost_pod, uid, node, number) = pod_away_from_the_operator(&s).await;

    let fault = NodeFault::inject("partition", number, &[], "heal");
    let message = wait_until_held(&s, "NodeLoss: the pod is held as a live group member").await;
    assert!(
        message.contains(&lost_pod) && message.contains("live member of its consumer group"),
        "{message}"
    );
    // Its output flows meanwhile: records are processed exactly once by all three pods.
    let mut sent = Sent::new();
    sent.produce(&s, 2000, 0.3, 0);
    s.assert_exactly_once(&sent);
    assert_eq!(
        uid_and_node(&s, &lost_pod).await,
        (uid.clone(), node.clone())
    );

    fault.undo();
    s.wait_for_status("NodeLoss false again", Duration::from_secs(120), |st| {
        node_loss(st).is_some_and(|(status, _, _)| status == "False")
    })
    .await;
    assert_eq!(uid_and_node(&s, &lost_pod).await, (uid, node));
    s.finish().await;
}

#[tokio::test]
async fn a_node_frozen_past_the_session_timeout_is_fenced_when_it_thaws_and_nothing_is_doubled() {
    let (_turn, s) = scenario("nodefreeze").await;
    s.apply(&three_pods_with_standbys(&s));
    s.wait_ready(READY_TIMEOUT).await;
    wait_for_every_standby(&s).await;
    let mut sent = Sent::new();
    sent.produce(&s, 2000, 0.3, 0);
    s.wait_processed();
    let (frozen_pod, uid, node, number) = pod_away_from_the_operator(&s).await;

    // Every process of the node stops mid-stream, for longer than the session timeout (10 s)
    // and the transaction timeout (10 s), and less than it takes the node to turn NotReady:
    // the others take its partitions over while it cannot know.
    let fault = NodeFault::inject("freeze", number, &[], "thaw");
    sent.produce(&s, 2000, 0.3, 0);
    s.wait_processed();
    tokio::time::sleep(Duration::from_secs(5)).await;
    fault.undo();

    // The zombie wakes with a stale generation and an aborted transaction: Kafka refuses what
    // it would commit, it rejoins, and the app settles with the same three pods.
    sent.produce(&s, 2000, 0.3, 0);
    s.assert_exactly_once(&sent);
    s.wait_ready(READY_TIMEOUT).await;
    assert_eq!(uid_and_node(&s, &frozen_pod).await, (uid.clone(), node));
    let status = s
        .wait_for_status("a report from every pod", Duration::from_secs(60), |st| {
            st.pods.len() == 3 && st.ready.as_deref() == Some("3/3")
        })
        .await;
    let report = status.pods.iter().find(|p| p.name == frozen_pod).unwrap();
    assert_eq!(report.uid.as_deref(), Some(uid.as_str()), "{report:?}");
    // Settled: one more batch goes through without a further move.
    sent.produce(&s, 1000, 0.3, 0);
    s.assert_exactly_once(&sent);
    s.finish().await;
}

/// Nodes cordoned by a test, uncordoned when it ends, passed or failed.
struct Cordoned(Vec<String>);

impl Drop for Cordoned {
    fn drop(&mut self) {
        for node in &self.0 {
            let _ = testbed::kube::kubectl(&["uncordon", node], None);
        }
    }
}

/// `kubectl drain` of `node` (DaemonSets ignored, as an administrator runs it), giving up after
/// `timeout`: whether it drained, and what it printed.
fn drain(node: &str, timeout: Duration) -> (bool, String) {
    let out = testbed::kube::kubectl(
        &[
            "drain",
            node,
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            &format!("--timeout={}s", timeout.as_secs()),
        ],
        None,
    );
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Nodes drained one after the other, as an upgrade does. The first drain evicts its pod, whose
/// preStop hook drains it; its volume is a local disk of that node, so the new pod waits for
/// the node to come back. Meanwhile a second drain is refused by the PodDisruptionBudget: never
/// two pods down. Once the first node is back and its pod Ready, the second drain goes through.
#[tokio::test]
async fn kubectl_drain_is_held_by_the_disruption_budget_and_each_evicted_pod_drains_first() {
    let (_turn, s) = scenario("drain").await;
    s.apply(&three_pods_with_standbys(&s));
    s.wait_ready(READY_TIMEOUT).await;
    wait_for_every_standby(&s).await;
    let mut sent = Sent::new();
    sent.produce(&s, 2000, 0.3, 0);
    s.wait_processed();

    // Two app pods away from the operator's node (draining that one moves the operator too).
    let operator = operator_node(&s).await;
    let away: Vec<(String, String)> = nodes_of_pods(&s)
        .await
        .into_iter()
        .filter(|(_, node)| *node != operator)
        .collect();
    assert_eq!(away.len(), 2, "one app pod per node: {away:?}");
    let [(first_pod, first_node), (second_pod, second_node)] = &away[..] else {
        unreachable!()
    };
    let since = s.status_version().await;
    let mut cordoned = Cordoned(vec![first_node.clone()]);
    let (drained, output) = drain(first_node, Duration::from_secs(180));
    assert!(drained, "draining {first_node}:\n{output}");
    let last = s.wait_for_final_report(first_pod, &since).await;
    assert_eq!(last.last_shutdown_clean, Some(true), "{last:?}");
    assert_eq!(
        last.drain_requested_by,
        Some(DrainRequest::Http),
        "the preStop hook drained it: {last:?}"
    );

    // One pod down: the budget refuses the next eviction, whatever kubectl waits.
    sent.produce(&s, 1000, 0.3, 0);
    cordoned.0.push(second_node.clone());
    let (drained, output) = drain(second_node, Duration::from_secs(30));
    assert!(
        !drained,
        "draining {second_node} with a pod down went through:\n{output}"
    );
    assert!(
        output.contains("disruption budget"),
        "refused by the PodDisruptionBudget:\n{output}"
    );
    let second = s.pod(second_pod).await;
    assert!(
        second.metadata.deletion_timestamp.is_none(),
        "{second_pod} was not evicted: {:?}",
        second.metadata
    );
    s.assert_exactly_once(&sent);

    // The first node back: its pod returns to its volume there, and the second drain proceeds.
    testbed::kube::kubectl_ok(&["uncordon", first_node], None);
    s.wait_ready(READY_TIMEOUT).await;
    assert_eq!(&uid_and_node(&s, first_pod).await.1, first_node);
    let (drained, output) = drain(second_node, Duration::from_secs(180));
    assert!(
        drained,
        "draining {second_node} once every pod was back:\n{output}"
    );
    testbed::kube::kubectl_ok(&["uncordon", second_node], None);
    drop(cordoned);
    s.wait_ready(READY_TIMEOUT).await;
    sent.produce(&s, 1000, 0.3, 0);
    s.assert_exactly_once(&sent);
    s.finish().await;
}

/// The incident behind the product, across nodes: an id's put is staged on node A and the
/// process dies before the commit; the task moves to its standby on node B, which stages the
/// put and dies too; the task moves back to A. Neither store may ever hold the aborted put: the
/// id is then output exactly once and never reported as a duplicate (a store that kept an
/// aborted put would take the id's next occurrence for a repeat).
///
/// Each processor aborts at the put of the record that asks for it (`streamapp.fault:
/// crash-after-put`, once per process start), so the kubelet restarts it and the record keeps
/// crashing whoever owns its partition until the fault is taken out of the spec.
#[tokio::test]
async fn the_incident_across_nodes_an_aborted_put_reaches_no_store_and_the_id_is_output_once() {
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

    let (_turn, s) = scenario("incident").await;
    let mut app = s.example();
    app["spec"]["replicas"] = 2.into();
    app["spec"]["standbyReplicas"] = 1.into();
    app["spec"]["pod"] =
        serde_yaml::from_str("{env: [{name: STREAMAPP_FAULTS, value: crash-after-put=1}]}")
            .unwrap();
    s.apply(&app);
    s.wait_ready(READY_TIMEOUT).await;
    wait_for_every_standby(&s).await;
    let nodes = nodes_of_pods(&s).await;
    let on: BTreeSet<&String> = nodes.values().collect();
    assert_eq!(on.len(), 2, "the two pods on two nodes: {nodes:?}");
    let mut sent = Sent::new();
    sent.produce(&s, 500, 0.3, 0);
    s.wait_processed();

    let id = format!("cmd-incident-{}", testbed::unique_name("x"));
    let producer: BaseProducer = testbed::kafka::input_producer_config().create().unwrap();
    testbed::kafka::send(
        &producer,
        BaseRecord::to(&s.topics.input)
            .key("order-incident")
            .payload(&format!(r#"{{"commandId":"{id}","amount":1}}"#))
            .headers(OwnedHeaders::new().insert(Header {
                key: "streamapp.fault",
                value: Some("crash-after-put"),
            })),
    );
    producer.flush(Duration::from_secs(10)).unwrap();
    sent.ids.insert(id.clone(), 1);

    // Watch the processors' crashes: A, then B (the standby's holder, on the other node), then
    // A again. Each one the fault's (its log line), none other.
    let mut seen: BTreeMap<String, i32> = nodes.keys().map(|p| (p.clone(), 0)).collect();
    let mut order: Vec<String> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(300);
    // (A may crash more than once before its partition moves: a restarted processor that
    // rejoins within the session timeout keeps its tasks.)
    let back_on_a = |order: &[String]| {
        let Some(a) = order.first() else { return false };
        order
            .iter()
            .position(|p| p != a)
            .is_some_and(|b| order[b + 1..].contains(a))
    };
    while !back_on_a(&order) {
        assert!(
            Instant::now() < deadline,
            "no crash on A, then B, then A again within 300 s; crashes so far: {order:?}"
        );
        for pod in s.pods().await {
            let name = pod.metadata.name.clone().unwrap();
            let (restarts, last) = streamapp_e2e::processor_restarts(&pod);
            let before = seen.insert(name.clone(), restarts).unwrap_or(0);
            if restarts > before {
                assert_eq!(
                    restarts,
                    before + 1,
                    "{name} crashed twice between two looks"
                );
                let exit_code = last.expect("a crashed container has a last state");
                assert_ne!(exit_code, 0, "{name}'s processor did not exit cleanly");
                let log = s.kubectl(&["logs", &name, "-c", "processor", "--previous"]);
                assert!(
                    log.contains("fault injection: crashing after a store put"),
                    "{name} crashed at the put:\n{log}"
                );
                order.push(name);
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!(
        "incident: crashes in order {order:?} on nodes {:?}",
        order.iter().map(|p| &nodes[p]).collect::<Vec<_>>()
    );
    let output = testbed::kafka::read_all(
        &s.topics.output,
        testbed::kafka::Isolation::ReadCommitted,
        |_| {},
    );
    assert_eq!(output, sent.ids.len() - 1, "nothing of {id} was committed");

    // The fault taken out of the spec: the pods roll, the id goes through once, as a first
    // occurrence, and every other record stays exactly once.
    app["spec"]["pod"] = serde_yaml::Value::Null;
    s.apply(&app);
    s.wait_ready(READY_TIMEOUT).await;
    s.assert_exactly_once(&sent);
    s.finish().await;
}
