//! `kubectl streamapp` against a StreamApp running on the real node: `status` shows the pods
//! and tasks the agents reported, `inspect` runs the processor's inspect inside a pod, and
//! `drain` makes the kubelet run the preStop drain.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Duration;

use streamapp_api::status_values::DrainRequest;
use streamapp_e2e::{APP, READY_TIMEOUT, Scenario, Sent, pod_name};

/// Runs the workspace's `kubectl-streamapp` (built next to this test) with the test bed's
/// kubeconfig and its kubectl first on PATH (`inspect` runs `kubectl exec`).
fn plugin(args: &[&str]) -> String {
    let exe = std::env::current_exe().expect("the test's path");
    let bin: PathBuf = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps")
        .join("kubectl-streamapp");
    assert!(
        bin.exists(),
        "{} is missing: build the workspace (make build) first",
        bin.display()
    );
    let kubectl_dir = testbed::kube::kubectl_program()
        .parent()
        .map(PathBuf::from)
        .unwrap_or_default();
    let path = format!(
        "{}:{}",
        kubectl_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out: Output = Command::new(&bin)
        .args(args)
        .env("KUBECONFIG", testbed::kube::kubeconfig_path())
        .env("PATH", path)
        .output()
        .expect("running kubectl-streamapp");
    assert!(
        out.status.success(),
        "kubectl-streamapp {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test]
async fn the_plugin_shows_inspects_and_drains_a_running_streamapp() {
    let s = Scenario::start("plugin", 2).await;
    s.apply(&s.example());
    s.wait_ready(READY_TIMEOUT).await;
    let mut sent = Sent::new();
    sent.produce(&s, 300, 0.3, 0);
    s.wait_processed();
    s.wait_for_status(
        "both pods reporting a task",
        Duration::from_secs(60),
        |st| st.pods.len() == 2 && st.pods.iter().all(|p| !p.tasks.is_empty()),
    )
    .await;

    let ns = s.namespace.as_str();
    let tree = plugin(&["status", APP, "-n", ns]);
    assert!(
        tree.starts_with(&format!("{ns}/{APP}  Running  2/2 ready  state Healthy")),
        "{tree}"
    );
    for pod in [pod_name(0), pod_name(1)] {
        assert!(
            tree.contains(&format!("pod {pod}  Running  ready")),
            "{tree}"
        );
    }
    assert!(tree.contains("partition 0   Active"), "{tree}");
    assert!(tree.contains("partition 1   Active"), "{tree}");

    let inspected = plugin(&["inspect", &pod_name(0), "-n", ns]);
    assert!(
        inspected.starts_with("state dir: /var/lib/streamapp/state\n"),
        "{inspected}"
    );
    assert!(inspected.contains("tasks:"), "{inspected}");

    let pod = pod_name(1);
    let said = plugin(&["drain", &pod, "-n", ns]);
    assert!(said.starts_with(&format!("draining {ns}/{pod}")), "{said}");
    let last = s.wait_for_final_report(&pod).await;
    assert_eq!(last.last_shutdown_clean, Some(true), "{last:?}");
    assert_eq!(
        last.drain_requested_by,
        Some(DrainRequest::Http),
        "the kubelet ran the preStop drain: {last:?}"
    );
    s.wait_ready(READY_TIMEOUT).await;
    sent.produce(&s, 300, 0.3, 0);
    s.assert_exactly_once(&sent);
    s.finish().await;
}
