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
    let out = run_plugin(args, &testbed::kube::kubeconfig_path());
    assert!(
        out.status.success(),
        "kubectl-streamapp {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn run_plugin(args: &[&str], kubeconfig: &std::path::Path) -> Output {
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
    Command::new(&bin)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("PATH", path)
        .output()
        .expect("running kubectl-streamapp")
}

/// `kubectl streamapp lookup -o json` of `ids`: one row per id.
fn lookup(ns: &str, ids: &[&str]) -> Vec<serde_json::Value> {
    let mut args = vec!["lookup", APP, "-n", ns, "-o", "json"];
    args.extend_from_slice(ids);
    serde_json::from_str(&plugin(&args)).expect("lookup -o json is JSON")
}

/// (partition, offset) of each input record → its command id.
fn input_commands(topic: &str) -> std::collections::HashMap<(i64, i64), String> {
    let mut commands = std::collections::HashMap::new();
    testbed::kafka::read_all(topic, testbed::kafka::Isolation::ReadCommitted, |m| {
        use rdkafka::Message;
        let value: serde_json::Value =
            serde_json::from_slice(m.payload().unwrap_or_default()).unwrap_or_default();
        if let Some(id) = value["commandId"].as_str() {
            commands.insert((i64::from(m.partition()), m.offset()), id.to_string());
        }
    });
    commands
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

    // lookup: every id sent is seen, on both pods, its source the input record that carried
    // it first; an id never sent is not seen.
    let sent_ids: Vec<String> = sent.ids.keys().take(99).cloned().collect();
    let sent_ids: Vec<&str> = sent_ids.iter().map(String::as_str).collect();
    let mut asked = sent_ids.clone();
    asked.push("never-sent");
    let rows = lookup(ns, &asked);
    let commands = input_commands(&s.topics.input);
    let mut answered_by = std::collections::BTreeSet::new();
    for (row, id) in rows.iter().zip(&sent_ids) {
        assert_eq!(row["id"], *id);
        assert_eq!(row["verdict"], "seen", "{row}");
        assert_eq!(row["state"], "Active", "{row}");
        let source = &row["source"];
        assert_eq!(source["topic"], s.topics.input.as_str(), "{row}");
        let at = (
            source["partition"].as_i64().unwrap(),
            source["offset"].as_i64().unwrap(),
        );
        assert_eq!(commands.get(&at).map(String::as_str), Some(*id), "{row}");
        answered_by.insert(row["answeredBy"].as_str().unwrap().to_string());
    }
    assert_eq!(
        answered_by,
        [pod_name(0), pod_name(1)].into(),
        "ids of both pods' partitions"
    );
    assert_eq!(rows.last().unwrap()["verdict"], "notSeen", "{rows:?}");
    let table = plugin(&["lookup", APP, "-n", ns, sent_ids[0], "never-sent"]);
    assert!(table.starts_with("ID "), "{table}");
    assert!(table.contains(" not seen "), "{table}");

    // dead-letters: records without a command id, listed with their reason and source.
    sent.produce(&s, 0, 0.0, 3);
    s.wait_processed();
    let listing: serde_json::Value = serde_json::from_str(&plugin(&[
        "dead-letters",
        APP,
        "-n",
        ns,
        "--since",
        "1h",
        "--reason",
        "missing-dedup-id",
        "-o",
        "json",
    ]))
    .expect("dead-letters -o json is JSON");
    let letters = listing["deadLetters"].as_array().expect("a list");
    assert_eq!(letters.len(), 3, "{listing}");
    for letter in letters {
        assert_eq!(letter["reason"], "missing-dedup-id", "{letter}");
        let source = letter["source"].as_str().unwrap();
        assert!(
            source.starts_with(&format!("{}/", s.topics.input)),
            "{letter}"
        );
        assert!(
            letter["valuePrefix"]
                .as_str()
                .unwrap()
                .starts_with("{\"amount\":"),
            "{letter}"
        );
    }
    let none = plugin(&["dead-letters", APP, "-n", ns, "--reason", "invalid-json"]);
    assert!(none.starts_with("no dead letters match\n"), "{none}");

    // A user who may read the app and its pods but not use the pods' proxy is told which
    // verb is missing.
    let user = "lookup-reader";
    s.kubectl(&[
        "create",
        "role",
        user,
        "--verb=get,list",
        "--resource=streamapps,pods",
    ]);
    s.kubectl(&[
        "create",
        "rolebinding",
        user,
        &format!("--role={user}"),
        &format!("--user={user}"),
    ]);
    let kubeconfig = std::fs::read_to_string(testbed::kube::kubeconfig_path()).unwrap();
    let mut config: serde_yaml::Value = serde_yaml::from_str(&kubeconfig).unwrap();
    for u in config["users"].as_sequence_mut().unwrap() {
        u["user"]["as"] = user.into();
    }
    let dir = tempfile::tempdir().unwrap();
    let restricted = dir.path().join("kubeconfig");
    std::fs::write(&restricted, serde_yaml::to_string(&config).unwrap()).unwrap();
    let denied = run_plugin(&["lookup", APP, "-n", ns, sent_ids[0]], &restricted);
    let stderr = String::from_utf8_lossy(&denied.stderr);
    assert!(!denied.status.success(), "{stderr}");
    assert!(
        stderr.contains("not allowed to get pods/proxy/")
            && stderr.contains("granting 'get' on 'pods/proxy'"),
        "{stderr}"
    );

    let pod = pod_name(1);
    let since = s.status_version().await;
    let said = plugin(&["drain", &pod, "-n", ns]);
    assert!(said.starts_with(&format!("draining {ns}/{pod}")), "{said}");
    // While the drained pod's partition moves, no lookup says a processed id was not seen:
    // it is answered by whoever holds the partition as its active, or "unknown".
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let asking = {
        let (stop, ns) = (stop.clone(), ns.to_string());
        let ids: Vec<String> = sent_ids[..20].iter().map(|id| id.to_string()).collect();
        std::thread::spawn(move || {
            let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
            let mut verdicts = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                verdicts.extend(
                    lookup(&ns, &ids)
                        .into_iter()
                        .map(|row| row["verdict"].clone()),
                );
            }
            verdicts
        })
    };
    let last = s.wait_for_final_report(&pod, &since).await;
    assert_eq!(last.last_shutdown_clean, Some(true), "{last:?}");
    assert_eq!(
        last.drain_requested_by,
        Some(DrainRequest::Http),
        "the kubelet ran the preStop drain: {last:?}"
    );
    s.wait_ready(READY_TIMEOUT).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let verdicts = asking.join().expect("the lookups during the drain");
    assert!(!verdicts.is_empty(), "asked while the pod drained");
    assert!(
        verdicts.iter().all(|v| v == "seen" || v == "unknown"),
        "a processed id is never 'not seen': {verdicts:?}"
    );
    // Ready can come before the returning pod's rebalance (a processor with no assignment yet
    // is ready): its partition may still be moving. It is answered "seen" once it has an
    // active again, and never "not seen" meanwhile.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let rows = lookup(ns, &sent_ids);
        assert!(rows.iter().all(|r| r["verdict"] != "notSeen"), "{rows:?}");
        if rows.iter().all(|r| r["verdict"] == "seen") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "after the move, every id is seen again: {rows:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    sent.produce(&s, 300, 0.3, 0);
    s.assert_exactly_once(&sent);
    s.finish().await;
}
