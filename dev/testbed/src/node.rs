//! The test bed's real nodes (dev/node.sh): kubelets with containerd that run the project's
//! image, built by dev/image.sh and imported into each node (nothing is pulled). Node N is
//! `streamapp-node-N`, labelled `streamapp.dev/node=real` and with a zone; the faults of
//! dev/node.sh (kill, freeze, partition, ...) act on one node by its number.

use std::process::{Command, Output};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::ListParams;
use kube::{Api, Client};

const HOW_TO_START: &str =
    "start them with `make up` (three unless NODE_COUNT says otherwise; or `dev/node.sh start`)";

/// The label every real node carries (the fake kwok node does not).
pub const REAL_NODE_LABEL: (&str, &str) = ("streamapp.dev/node", "real");

/// The number of a real node from its name (`streamapp-node-N`), the one dev/node.sh takes.
pub fn number(node_name: &str) -> Option<u32> {
    node_name
        .strip_prefix("streamapp-node-")?
        .parse()
        .ok()
        .filter(|n| (1..=9).contains(n))
}

/// Whether a pod's node (`spec.nodeName`) is one of the test bed's real nodes.
pub fn is_real(node_name: Option<&str>) -> bool {
    node_name.and_then(number).is_some()
}

/// The project's image as the node has it (dev/lib.sh's APP_IMAGE).
pub fn app_image() -> String {
    std::env::var("APP_IMAGE").unwrap_or_else(|_| "localhost/streamapp/streamapp:dev".into())
}

/// Kafka's bootstrap address as pods reach it (dev/lib.sh's HUB_IP and KAFKA_POD_PORT).
pub fn pod_kafka_bootstrap() -> String {
    std::env::var("STREAMAPP_POD_KAFKA_BOOTSTRAP").unwrap_or_else(|_| "10.213.0.1:19094".into())
}

/// The real nodes registered with the API server, by name, and whether each is Ready.
pub async fn real_nodes(client: &Client) -> Vec<(String, bool)> {
    let selector = format!("{}={}", REAL_NODE_LABEL.0, REAL_NODE_LABEL.1);
    let listed = tokio::time::timeout(
        Duration::from_secs(10),
        Api::<Node>::all(client.clone()).list(&ListParams::default().labels(&selector)),
    )
    .await
    .unwrap_or_else(|_| panic!("listing the nodes timed out"))
    .unwrap_or_else(|e| panic!("listing the nodes: {e}"));
    listed
        .items
        .into_iter()
        .map(|node| {
            (
                node.metadata.name.clone().unwrap_or_default(),
                is_ready(&node),
            )
        })
        .collect()
}

/// Whether a node's Ready condition is True.
pub fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Panics, naming the service, unless at least `count` real nodes are registered and every
/// one is Ready.
pub async fn require_ready_nodes(client: &Client, count: usize) {
    let nodes = real_nodes(client).await;
    assert!(
        nodes.len() >= count,
        "this needs {count} real node(s) of the test bed, {} registered ({nodes:?}): {HOW_TO_START}",
        nodes.len()
    );
    let not_ready: Vec<&str> = nodes
        .iter()
        .filter(|(_, ready)| !ready)
        .map(|(name, _)| name.as_str())
        .collect();
    assert!(
        not_ready.is_empty(),
        "the test bed's node(s) {not_ready:?} are not Ready: {HOW_TO_START}"
    );
}

/// Waits up to `timeout` for at least `count` real nodes, every one Ready (a node a test
/// restarted takes a moment); then [`require_ready_nodes`].
pub async fn wait_for_ready_nodes(client: &Client, count: usize, timeout: Duration) {
    let deadline = tokio::time::Instant::now() + timeout;
    while tokio::time::Instant::now() < deadline {
        let nodes = real_nodes(client).await;
        if nodes.len() >= count && nodes.iter().all(|(_, ready)| *ready) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    require_ready_nodes(client, count).await;
}

/// Panics, naming the service, unless the test bed's real node(s) are registered and Ready.
pub async fn require_ready(client: &Client) {
    require_ready_nodes(client, 1).await;
}

/// `ctr` against node `node`'s containerd (namespace k8s.io), through dev/node.sh.
pub fn ctr(node: u32, args: &[&str]) -> Output {
    Command::new(crate::dev_dir().join("node.sh"))
        .arg("ctr")
        .arg(node.to_string())
        .args(args)
        .output()
        .expect("running dev/node.sh ctr")
}

/// One of dev/node.sh's node faults (`kill`, `freeze`, `thaw`, `partition`, `heal`,
/// `restart`) on node `node`, with its extra arguments; panics with its output if it fails.
pub fn fault(verb: &str, node: u32, extra: &[&str]) {
    let out = Command::new(crate::dev_dir().join("node.sh"))
        .arg(verb)
        .arg(node.to_string())
        .args(extra)
        .output()
        .expect("running dev/node.sh");
    assert!(
        out.status.success(),
        "dev/node.sh {verb} {node} {extra:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A node fault, undone when dropped unless [`NodeFault::undo`] did it: a failing test leaves
/// the node as it found it for the next one.
#[must_use = "dropping the fault undoes it at once"]
pub struct NodeFault {
    node: u32,
    undo: &'static str,
    pending: bool,
}

impl NodeFault {
    /// `dev/node.sh VERB NODE EXTRA...` now; `dev/node.sh UNDO NODE` at [`NodeFault::undo`] or
    /// drop (`kill` → `restart`, `freeze` → `thaw`, `partition` → `heal`).
    pub fn inject(verb: &str, node: u32, extra: &[&str], undo: &'static str) -> NodeFault {
        fault(verb, node, extra);
        NodeFault {
            node,
            undo,
            pending: true,
        }
    }

    pub fn undo(mut self) {
        self.pending = false;
        fault(self.undo, self.node, &[]);
    }
}

impl Drop for NodeFault {
    fn drop(&mut self) {
        if self.pending {
            let _ = Command::new(crate::dev_dir().join("node.sh"))
                .arg(self.undo)
                .arg(self.node.to_string())
                .output();
        }
    }
}

/// The containerd id of a pod's container, from the pod's status.
pub fn container_id(pod: &Pod, container: &str) -> Option<String> {
    let status = pod.status.as_ref()?;
    status
        .container_statuses
        .iter()
        .flatten()
        .chain(status.init_container_statuses.iter().flatten())
        .find(|c| c.name == container)?
        .container_id
        .as_ref()?
        .strip_prefix("containerd://")
        .map(str::to_string)
}

/// Kills a container's processes with SIGKILL, as the kernel or a crash would: the kubelet
/// sees the container exit and restarts it.
pub fn kill_container(pod: &Pod, container: &str) {
    let id = container_id(pod, container)
        .unwrap_or_else(|| panic!("container {container} of the pod has no id yet"));
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .and_then(number)
        .expect("the pod runs on a real node");
    let out = ctr(
        node,
        &["tasks", "kill", "--all", "--signal", "SIGKILL", &id],
    );
    assert!(
        out.status.success(),
        "ctr tasks kill {id}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
