//! The `streamapp-operator` and `crdgen` binaries as users run them.

use crate::support;

use std::process::Command;
use std::time::Duration;

use support::*;
use testbed::kube::TestNamespace;
use testbed::process::{Spawned, free_port};

const OPERATOR: &str = env!("CARGO_BIN_EXE_streamapp-operator");

#[test]
fn help_lists_every_flag_with_its_environment_variable() {
    let out = Command::new(OPERATOR).arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for expected in [
        "--metrics-port",
        "STREAMAPP_METRICS_PORT",
        "--leader-election",
        "--lease-namespace",
        "POD_NAMESPACE",
        "--namespace",
    ] {
        assert!(help.contains(expected), "{expected} missing from:\n{help}");
    }
}

#[test]
fn crdgen_prints_the_committed_crd() {
    let out = Command::new(env!("CARGO_BIN_EXE_crdgen")).output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        streamapp_operator::crd_yaml::crd_yaml()
    );
}

async fn get(url: &str) -> Option<String> {
    let out = tokio::process::Command::new("curl")
        .args(["-sf", "--max-time", "2", url])
        .output()
        .await
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

#[tokio::test]
async fn the_binary_reconciles_its_namespace_and_serves_metrics_and_health() {
    let client = testbed::kube::client().await;
    install_crd(&client).await;
    let ns = TestNamespace::create(&client, "binary").await;
    let port = free_port();
    let mut operator = Command::new(OPERATOR);
    operator
        .args([
            "--metrics-port",
            &port.to_string(),
            "--namespace",
            &ns.name,
            "--lease-namespace",
            &ns.name,
        ])
        .env("KUBECONFIG", testbed::kube::kubeconfig_path());
    let log = std::env::temp_dir().join(format!("{}-operator.log", ns.name));
    let _operator = Spawned::spawn(operator, &log);
    create(&client, &ns.name, streamapp_json("orders", 1)).await;
    wait_for_status(&client, &ns.name, "orders", "the binary's status", |s| {
        s.phase.is_some()
    })
    .await;

    let base = format!("http://127.0.0.1:{port}");
    assert_eq!(get(&format!("{base}/healthz")).await.as_deref(), Some("ok"));
    // It leads (no election) and its StreamApp cache is synced: it reconciled one.
    assert_eq!(
        get(&format!("{base}/readyz")).await.as_deref(),
        Some("ready")
    );
    let metrics = eventually(
        Duration::from_secs(10),
        "reconciliations in /metrics",
        || async {
            get(&format!("{base}/metrics")).await.filter(|metrics| {
                metrics.lines().any(|l| {
                    l.starts_with("streamapp_operator_reconciliations_total") && !l.ends_with(" 0")
                })
            })
        },
    )
    .await;
    assert!(
        metrics.contains("streamapp_operator_reconcile_duration_seconds_bucket"),
        "{metrics}"
    );
    assert!(metrics.contains("streamapp_operator_leader 1"), "{metrics}");
    ns.delete().await;
}
