//! `kubectl streamapp` as users run it (the built binary, a kubeconfig) against the real local
//! API server: `status` of a fixed status, `--watch` seeing a restore advance, each operating
//! command changing what it says, and the errors. No operator runs here: the status is
//! written by the test, as the operator and the agents would.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use streamapp_api::crd::StreamApp;
use testbed::kube::{TestNamespace, kubectl_ok};

fn plugin(args: &[&str], kubeconfig: Option<&std::path::Path>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kubectl-streamapp"));
    cmd.args(args).env(
        "KUBECONFIG",
        kubeconfig.map_or_else(testbed::kube::kubeconfig_path, |p| p.to_path_buf()),
    );
    cmd.output().expect("running kubectl-streamapp")
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "kubectl-streamapp failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr_of_failure(out: &Output) -> String {
    assert!(
        !out.status.success(),
        "expected a failure, got: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

async fn setup(prefix: &str) -> (Client, TestNamespace) {
    let crd = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../crds/streamapp.dev_streamapps.yaml"
    );
    kubectl_ok(
        &["apply", "--server-side", "--force-conflicts", "-f", crd],
        None,
    );
    let client = testbed::kube::client().await;
    testbed::kube::wait_for_streamapp_crd(&client).await;
    let ns = TestNamespace::create(&client, prefix).await;
    (client, ns)
}

async fn create_app(
    client: &Client,
    ns: &str,
    name: &str,
    restored: Option<i64>,
) -> Api<StreamApp> {
    let api: Api<StreamApp> = Api::namespaced(client.clone(), ns);
    let app: StreamApp = serde_json::from_value(common::spec(name)).unwrap();
    api.create(&PostParams::default(), &app)
        .await
        .expect("creating the StreamApp");
    if let Some(restored) = restored {
        write_status(&api, name, restored).await;
    }
    api
}

async fn write_status(api: &Api<StreamApp>, name: &str, restored: i64) {
    let patch = serde_json::json!({ "status": common::status(name, restored, false) });
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("writing the status");
}

#[tokio::test]
async fn status_prints_the_tree_and_json_of_what_the_api_server_holds() {
    let (client, ns) = setup("plugin-status").await;
    create_app(&client, &ns.name, "orders", Some(6000)).await;
    let text = stdout(&plugin(&["status", "orders", "-n", &ns.name], None));
    let expected = "\
NS/orders  Progressing  1/2 ready  state Healthy  lag 1500 (~12s)
├─ group prod.orders  input orders (3 partitions)  worst restore lag 4000  standbys 2/3 caught up
├─ conditions
│  ├─ Ready         False  PodsNotReady: 1/2 pods ready; a pod is ready once its stores are restored
│  ├─ Progressing   True   PodsStarting: waiting for 1 pods to restore their stores and become ready
│  ├─ StateHealthy  True   StoresHealthy
│  └─ Degraded      False  AsExpected
├─ pod orders-0  Running  ready  last shutdown clean (drain 420 ms)  free 5.0 GiB  dead letters 3
│  ├─ partition 0   Active  offset 120400  changelog lag 0  opened Clean  checkpoint age 2s  WAL 1 file 1.4 KiB
│  └─ partition 1   Active  offset 118000  changelog lag 1  opened ReplayedTail  checkpoint age 1s  WAL 2 files 878.9 KiB
└─ pod orders-1  Restoring  not ready  last shutdown unclean  free 4.7 GiB  quarantines 1
   └─ partition 2   Restoring  [############--------]  60% 6000/10000  2500/s  ETA 1s  changelog lag 4000  opened Rebuilt  WAL 1 file 0 B  quarantines 1 (last: Corruption: block checksum mismatch)
";
    assert_eq!(text.replace(&ns.name, "NS"), expected);

    let json: serde_json::Value = serde_json::from_str(&stdout(&plugin(
        &["status", "-n", &ns.name, "-o", "json"],
        None,
    )))
    .unwrap();
    assert_eq!(json[0]["name"], "orders");
    assert_eq!(
        json[0]["status"]["pods"][1]["tasks"][0]["restore"]["restored"],
        6000
    );
    let yaml = stdout(&plugin(&["status", "-n", &ns.name, "-o", "yaml"], None));
    assert!(
        yaml.starts_with(&format!("- name: orders\n  namespace: {}\n", ns.name)),
        "{yaml}"
    );
    ns.delete().await;
}

#[tokio::test]
async fn status_watch_redraws_as_a_restore_advances() {
    let (client, ns) = setup("plugin-watch").await;
    let api = create_app(&client, &ns.name, "orders", Some(1000)).await;
    let mut child = Command::new(env!("CARGO_BIN_EXE_kubectl-streamapp"))
        .args(["status", "orders", "-n", &ns.name, "--watch"])
        .env("KUBECONFIG", testbed::kube::kubeconfig_path())
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting kubectl-streamapp status --watch");
    let reader = BufReader::new(child.stdout.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in reader.lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let wait_for_line = |needle: &str| {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return,
                Ok(_) => {}
                Err(_) => panic!("status --watch never printed {needle:?}"),
            }
        }
    };
    wait_for_line("10% 1000/10000");
    for restored in [4000, 9000] {
        write_status(&api, "orders", restored).await;
        wait_for_line(&format!("{}% {restored}/10000", restored / 100));
    }
    child.kill().unwrap();
    let _ = child.wait();
    ns.delete().await;
}

#[tokio::test]
async fn each_operating_command_changes_what_it_says() {
    let (client, ns) = setup("plugin-ops").await;
    let api = create_app(&client, &ns.name, "orders", None).await;
    let annotation = |app: &StreamApp, key: &str| app.annotations().get(key).cloned();
    let n = ns.name.as_str();

    let out = stdout(&plugin(&["pause", "orders", "-n", n], None));
    assert!(out.starts_with(&format!("paused {n}/orders")), "{out}");
    assert!(
        out.contains("watch: kubectl streamapp status orders"),
        "{out}"
    );
    assert_eq!(
        annotation(&api.get("orders").await.unwrap(), "streamapp.dev/paused").as_deref(),
        Some("true")
    );
    let shown = stdout(&plugin(&["status", "orders", "-n", n], None));
    assert!(shown.contains("PAUSED"), "{shown}");

    stdout(&plugin(&["resume", "orders", "-n", n], None));
    assert_eq!(
        annotation(&api.get("orders").await.unwrap(), "streamapp.dev/paused"),
        None
    );

    stdout(&plugin(&["restart", "orders", "-n", n], None));
    let first = annotation(&api.get("orders").await.unwrap(), "streamapp.dev/restart")
        .expect("a restart request");
    first
        .parse::<k8s_openapi::jiff::Timestamp>()
        .expect("the request time, RFC 3339");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    stdout(&plugin(&["restart", "orders", "-n", n], None));
    let second = annotation(&api.get("orders").await.unwrap(), "streamapp.dev/restart").unwrap();
    assert_ne!(first, second, "each restart is a new request");

    // A reset deletes state: without --yes it only says what it would do.
    let refused = stderr_of_failure(&plugin(
        &["reset", "orders", "-n", n, "--to-earliest"],
        None,
    ));
    assert!(refused.contains("This deletes the state of"), "{refused}");
    assert_eq!(
        annotation(&api.get("orders").await.unwrap(), "streamapp.dev/reset"),
        None
    );
    let bad = stderr_of_failure(&plugin(
        &[
            "reset",
            "orders",
            "-n",
            n,
            "--to-datetime",
            "yesterday",
            "--yes",
        ],
        None,
    ));
    assert!(bad.contains("is not an RFC 3339 time"), "{bad}");
    stdout(&plugin(
        &[
            "reset",
            "orders",
            "-n",
            n,
            "--to-datetime",
            "2026-12-01T09:00:00Z",
            "--yes",
        ],
        None,
    ));
    assert_eq!(
        annotation(&api.get("orders").await.unwrap(), "streamapp.dev/reset").as_deref(),
        Some("2026-12-01T09:00:00Z")
    );
    ns.delete().await;
}

#[tokio::test]
async fn errors_say_what_is_missing_or_not_allowed() {
    let (client, ns) = setup("plugin-errors").await;
    let n = ns.name.as_str();
    let missing = stderr_of_failure(&plugin(&["pause", "nothere", "-n", n], None));
    assert!(
        missing.contains(&format!("no StreamApp nothere in namespace {n}")),
        "{missing}"
    );

    // An app nobody reconciles: the status says the operator is not there.
    create_app(&client, n, "orphan", None).await;
    let shown = stdout(&plugin(&["status", "orphan", "-n", n], None));
    assert!(
        shown.contains("no status yet: is the operator running?"),
        "{shown}"
    );

    // Bad ids are refused before anything is asked, saying why.
    let long = "x".repeat(5000);
    let many: Vec<String> = (0..10_000).map(|i| format!("c{i}")).collect();
    let mut ten_thousand = vec!["lookup", "orphan", "-n", n];
    ten_thousand.extend(many.iter().map(String::as_str));
    for (args, says) in [
        (
            vec!["lookup", "orphan", "-n", n, "a", ""],
            "an empty id (id number 2)",
        ),
        (
            vec!["lookup", "orphan", "-n", n, long.as_str()],
            "is 5000 bytes; the longest an id may be is 4096",
        ),
        (ten_thousand, "10000 ids in one request; at most 100"),
        (
            vec!["dead-letters", "orphan", "-n", n, "--since", "a while"],
            "--since \"a while\"",
        ),
        (
            vec!["dead-letters", "orphan", "-n", n, "--limit", "5000"],
            "at most 1000 dead letters",
        ),
    ] {
        let refused = stderr_of_failure(&plugin(&args, None));
        assert!(refused.contains(says), "{refused}");
    }
    let not_utf8 = {
        use std::os::unix::ffi::OsStrExt;
        Command::new(env!("CARGO_BIN_EXE_kubectl-streamapp"))
            .args(["lookup", "orphan", "-n", n])
            .arg(std::ffi::OsStr::from_bytes(b"cmd-\xff"))
            .env("KUBECONFIG", testbed::kube::kubeconfig_path())
            .output()
            .unwrap()
    };
    let refused = stderr_of_failure(&not_utf8);
    assert!(refused.contains("invalid UTF-8"), "{refused}");
    // An app without running pods: nobody to ask.
    let nobody = stderr_of_failure(&plugin(&["lookup", "orphan", "-n", n, "cmd-1"], None));
    assert!(
        nobody.contains(&format!("no running pod of {n}/orphan to ask")),
        "{nobody}"
    );

    // A user with no rights at all (impersonated by the test bed's admin).
    let kubeconfig = std::fs::read_to_string(testbed::kube::kubeconfig_path()).unwrap();
    let mut config: serde_yaml::Value = serde_yaml::from_str(&kubeconfig).unwrap();
    for user in config["users"].as_sequence_mut().unwrap() {
        user["user"]["as"] = "jane".into();
    }
    let dir = tempfile::tempdir().unwrap();
    let restricted = dir.path().join("kubeconfig");
    std::fs::write(&restricted, serde_yaml::to_string(&config).unwrap()).unwrap();
    let denied = stderr_of_failure(&plugin(&["pause", "orphan", "-n", n], Some(&restricted)));
    assert!(
        denied.contains(&format!(
            "not allowed to patch streamapps/orphan in namespace {n}"
        )),
        "{denied}"
    );
    let denied = stderr_of_failure(&plugin(&["status", "-n", n], Some(&restricted)));
    assert!(
        denied.contains(&format!("not allowed to list streamapps in namespace {n}")),
        "{denied}"
    );
    ns.delete().await;
}

#[tokio::test]
async fn kubectl_completion_offers_subcommands_and_the_namespaces_apps() {
    let (client, ns) = setup("plugin-complete").await;
    create_app(&client, &ns.name, "orders", None).await;
    create_app(&client, &ns.name, "billing", None).await;
    // What kubectl runs for `kubectl streamapp -n NS pause o<TAB>`: the shipped script, which
    // runs the binary found on PATH.
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/kubectl_complete-streamapp");
    let bin_dir = std::path::Path::new(env!("CARGO_BIN_EXE_kubectl-streamapp"))
        .parent()
        .unwrap()
        .to_path_buf();
    let complete = |words: &[&str]| {
        let out = Command::new(script)
            .args(words)
            .env("KUBECONFIG", testbed::kube::kubeconfig_path())
            .env(
                "PATH",
                format!(
                    "{}:{}",
                    bin_dir.display(),
                    std::env::var("PATH").unwrap_or_default()
                ),
            )
            .output()
            .expect("running kubectl_complete-streamapp");
        stdout(&out)
    };
    assert_eq!(complete(&["res"]), "resume\nrestart\nreset\n:4\n");
    assert_eq!(complete(&["-n", &ns.name, "pause", "o"]), "orders\n:4\n");
    assert_eq!(
        complete(&["status", "-n", &ns.name, ""]),
        "billing\norders\n:4\n"
    );
    ns.delete().await;
}
