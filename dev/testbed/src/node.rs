//! The test bed's real node (dev/node.sh): a kubelet with containerd that runs the project's
//! image, built by dev/image.sh and imported into the node (nothing is pulled).

use std::process::{Command, Output};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{Api, Client};

const HOW_TO_START: &str = "start it with `make up` (or `dev/node.sh start`)";

/// The node's name (dev/lib.sh's NODE_NAME).
pub fn name() -> String {
    std::env::var("NODE_NAME").unwrap_or_else(|_| "streamapp-node".into())
}

/// The project's image as the node has it (dev/lib.sh's APP_IMAGE).
pub fn app_image() -> String {
    std::env::var("APP_IMAGE").unwrap_or_else(|_| "localhost/streamapp/streamapp:dev".into())
}

/// Kafka's bootstrap address as pods reach it (dev/lib.sh's NODE_IP and KAFKA_POD_PORT).
pub fn pod_kafka_bootstrap() -> String {
    std::env::var("STREAMAPP_POD_KAFKA_BOOTSTRAP").unwrap_or_else(|_| "10.213.0.1:19094".into())
}

/// Panics, naming the service, unless the real node is registered and Ready.
pub async fn require_ready(client: &Client) {
    let node = name();
    let found = tokio::time::timeout(
        Duration::from_secs(10),
        Api::<Node>::all(client.clone()).get_opt(&node),
    )
    .await
    .unwrap_or_else(|_| panic!("reading node {node} timed out"))
    .unwrap_or_else(|e| panic!("reading node {node}: {e}"));
    let Some(found) = found else {
        panic!("the test bed's node {node} is not registered (no kubelet runs): {HOW_TO_START}");
    };
    let ready = found
        .status
        .and_then(|s| s.conditions)
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    assert!(
        ready,
        "the test bed's node {node} is not Ready: {HOW_TO_START}"
    );
}

/// `ctr` against the node's containerd (namespace k8s.io), through dev/node.sh.
pub fn ctr(args: &[&str]) -> Output {
    Command::new(crate::dev_dir().join("node.sh"))
        .arg("ctr")
        .args(args)
        .output()
        .expect("running dev/node.sh ctr")
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
    let out = ctr(&["tasks", "kill", "--all", "--signal", "SIGKILL", &id]);
    assert!(
        out.status.success(),
        "ctr tasks kill {id}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
