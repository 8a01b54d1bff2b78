//! The agent beside a real processor, against the real broker and API server: what the pod's
//! entry in `status.pods` shows through a processor's life — processing, kill -9, restart
//! after a crash, a clean drain, a damaged store quarantined and rebuilt, the final drain and
//! the agent's own SIGTERM.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::events::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::ListParams;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use streamapp_api::crd::{PodStateStatus, StreamApp};
use streamapp_api::status_values::{PodPhase, StoreOpen};
use streamapp_operator::status::{
    Findings, REBUILDING, STATE_HEALTHY, STORES_HEALTHY, compute_status, condition_of,
};
use testbed::kafka;
use testbed::kube::TestNamespace;
use testbed::process::{Spawned, free_port};
use testbed::store_damage::{self, Damage};

const MINUTE: Duration = Duration::from_secs(60);
const APP: &str = "dedup";
const POD: &str = "dedup-0";
/// Records in partition 0's store when it is damaged, rebuilt from the changelog. The rebuild
/// alone is over in about a second (600,000 records took 1.2 s), sooner than the agent writes
/// (at most every 2 s), so the test holds it open until the status has shown it (see
/// [`Pipeline::hold_changelog`]).
const REBUILD_RECORDS: usize = 20_000;

/// The processor's side: topics, configuration file, state dir, a fixed HTTP port (the agent
/// is configured with it once, as in the pod).
struct Pipeline {
    input: String,
    changelog: String,
    dir: tempfile::TempDir,
    config: PathBuf,
    state: PathBuf,
    port: u16,
    starts: u32,
}

impl Pipeline {
    async fn create() -> Pipeline {
        let id = testbed::unique_name("agent-e2e");
        let input = format!("{id}-in");
        for topic in [
            &input,
            &format!("{id}-out"),
            &format!("{id}-dups"),
            &format!("{id}-dlq"),
        ] {
            kafka::create_topic(topic, 2).await;
        }
        let config = serde_json::json!({
            "applicationId": id,
            "kafka": {
                "bootstrapServers": kafka::bootstrap(),
                // Fast failure detection: the test kills the processor on purpose.
                "properties": { "session.timeout.ms": "6000", "heartbeat.interval.ms": "1000", "transaction.timeout.ms": "10000" },
            },
            "topology": {
                "inputTopic": input,
                "outputTopic": format!("{id}-out"),
                "duplicatesTopic": format!("{id}-dups"),
                "deadLetterTopic": format!("{id}-dlq"),
                "dedupId": { "source": "Key" },
                "retention": "1h",
                "commitInterval": "100ms",
                "maxValueSize": "900k",
            },
            // AbsoluteConsistency: a damaged WAL fails the open, and the store is quarantined.
            "rocksdb": { "profile": "LowMemory", "wal": { "recoveryMode": "AbsoluteConsistency" } },
            "drainTimeout": "30s",
        });
        // The state volume is a tmpfs (/dev/shm), as roomy on every machine: the agent reports
        // a volume under 10% free as a problem, so on the host disk how full the test machine
        // happens to be would decide whether this pod is healthy.
        let dir = tempfile::tempdir_in("/dev/shm").expect("a directory on the /dev/shm tmpfs");
        let path = dir.path().join("processor.yaml");
        std::fs::write(&path, serde_yaml::to_string(&config).unwrap()).unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir_all(&state).unwrap();
        Pipeline {
            input,
            changelog: streamapp_api::config::changelog_topic(&id),
            config: path,
            state,
            port: free_port(),
            dir,
            starts: 0,
        }
    }

    fn start_processor(&mut self) -> Spawned {
        self.starts += 1;
        let mut cmd = Command::new(common::processor_bin());
        cmd.arg("run")
            .env("STREAMAPP_CONFIG", &self.config)
            .env("POD_NAME", POD)
            .env("STREAMAPP_STATE_DIR", &self.state)
            .env("STREAMAPP_HTTP_PORT", self.port.to_string())
            .env("RUST_LOG", "info,librdkafka=warn");
        Spawned::spawn(
            cmd,
            &self
                .dir
                .path()
                .join(format!("processor-{}.log", self.starts)),
        )
    }

    fn start_agent(&self, ns: &str, kubeconfig: &Path, metrics_port: u16) -> Spawned {
        let mut cmd = Command::new(common::AGENT_BIN);
        cmd.arg("run")
            .env("POD_NAME", POD)
            .env("POD_NAMESPACE", ns)
            .env("STREAMAPP_NAME", APP)
            .env("STREAMAPP_STATE_DIR", &self.state)
            .env("STREAMAPP_PROCESSOR_PORT", self.port.to_string())
            .env("STREAMAPP_HEARTBEAT", "2s")
            // Look often, so short phases (a rebuild of a few seconds) are seen; writes stay
            // at most one per 2 s.
            .env("STREAMAPP_AGENT_POLL_INTERVAL", "250ms")
            .env("STREAMAPP_AGENT_METRICS_PORT", metrics_port.to_string())
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info,streamapp_agent=debug");
        Spawned::spawn(cmd, &self.dir.path().join("agent.log"))
    }

    /// Produces `n` records with fresh keys to `partition` and waits until the broker has them.
    fn produce(&self, partition: i32, prefix: &str, n: usize) {
        let producer: BaseProducer = kafka::client_config()
            .set("linger.ms", "5")
            .create()
            .unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        for i in 0..n {
            let key = format!("{prefix}-{partition}-{i}");
            let value = format!(r#"{{"id":"{key}"}}"#);
            let record = BaseRecord::to(&self.input)
                .key(&key)
                .payload(&value)
                .partition(partition)
                .timestamp(now);
            testbed::kafka::send(&producer, record);
        }
        producer.flush(Duration::from_secs(30)).unwrap();
    }

    fn drain(&self) {
        let out = Command::new(common::processor_bin())
            .args([
                "drain",
                "--port",
                &self.port.to_string(),
                "--timeout",
                "60s",
            ])
            .output()
            .expect("running streamapp-processor drain");
        assert!(
            out.status.success(),
            "drain failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn logs(&self) -> String {
        logs(self.dir.path())
    }

    /// Opens a transaction of another producer on changelog partition 0 and leaves it open:
    /// a restore of that partition reads up to it and waits until it ends (read_committed
    /// readers stop where it starts), so a rebuild lasts until the returned producer aborts it.
    fn hold_changelog(&self) -> BaseProducer {
        let holder = kafka::transactional_producer(&format!("{}-holder", self.changelog));
        holder.begin_transaction().unwrap();
        let time = 0i64.to_be_bytes();
        let record = BaseRecord::to(&self.changelog)
            .partition(0)
            .key("held")
            .payload(&time[..]);
        testbed::kafka::send(&holder, record);
        holder.flush(Duration::from_secs(10)).unwrap();
        holder
    }

    /// Damages the stopped processor's store of partition 0: its newest SST file deleted and
    /// its newest WAL file cut in half.
    fn damage_store(&self) {
        let store = self.state.join("tasks/0/store");
        store_damage::damage(&store, Damage::DeleteSst);
        store_damage::damage(&store, Damage::TruncateWal);
    }
}

/// The last lines of every log in `dir` (processors and agent), for failure messages.
fn logs(dir: &Path) -> String {
    let mut out = String::new();
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    files.sort();
    for f in files
        .iter()
        .filter(|f| f.extension().is_some_and(|e| e == "log"))
    {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        out.push_str(&format!(
            "--- {} ---\n{}\n",
            f.display(),
            lines[lines.len().saturating_sub(30)..].join("\n")
        ));
    }
    out
}

fn task(entry: &PodStateStatus, partition: i32) -> Option<&streamapp_api::crd::TaskStateStatus> {
    entry.tasks.iter().find(|t| t.partition == partition)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_pods_entry_follows_the_processor_through_crash_restart_quarantine_and_drain() {
    let admin = testbed::kube::client().await;
    common::install_crd(&admin).await;
    let ns = TestNamespace::create(&admin, "agent-e2e").await;
    common::create_app(&admin, &ns.name, APP).await;
    let sa = common::create_agent_rbac(&admin, &ns.name, APP).await;
    let mut p = Pipeline::create().await;
    // The agent runs as its ServiceAccount, with a token from the TokenRequest API.
    let (_, kubeconfig) = common::service_account_client(&admin, &ns.name, &sa, p.dir.path()).await;
    let metrics_port = free_port();

    let mut agent = p.start_agent(&ns.name, &kubeconfig, metrics_port);
    let mut processor = p.start_processor();
    let entry = common::PodEntry {
        client: admin.clone(),
        ns: ns.name.clone(),
        app: APP.into(),
        pod: POD.into(),
    };
    let log_dir = p.dir.path().to_path_buf();
    let wait = |what: &'static str, timeout: Duration, check: fn(&PodStateStatus) -> bool| {
        let (entry, dir) = (&entry, log_dir.clone());
        async move {
            entry
                .wait_for(timeout, what, check, move || logs(&dir))
                .await
        }
    };

    // 1. Running, and the committed offsets of what was produced.
    wait("Running, up and ready", 2 * MINUTE, |e| {
        e.phase == Some(PodPhase::Running) && e.processor_up && e.ready && e.tasks.len() == 2
    })
    .await;
    p.produce(0, "a", 30);
    p.produce(1, "a", 20);
    // The processor looks up changelog ends on a slow timer: wait for one past the records.
    let e = wait(
        "committed offsets 30 and 20, and the changelog end after them",
        MINUTE,
        |e| {
            task(e, 0).and_then(|t| t.committed_offset) == Some(30)
                && task(e, 1).and_then(|t| t.committed_offset) == Some(20)
                && task(e, 0).and_then(|t| t.changelog_end) >= Some(30)
        },
    )
    .await;
    let t0 = task(&e, 0).unwrap();
    assert!(
        t0.restore_lag.is_some(),
        "the restore lag is reported: {t0:?}"
    );
    // Everything is applied: what is left between the store's offset and the changelog end is
    // at most the last transaction's commit marker (the processor stores the offset after the
    // last record, the end is after the marker).
    assert!(t0.restore_lag <= Some(1), "{t0:?}");
    assert!(
        t0.checkpoint_age_seconds.is_some(),
        "a durable commit has an age: {t0:?}"
    );
    assert!(
        t0.wal_files >= 1 && t0.wal_bytes > 0,
        "the WAL files on disk are counted: {t0:?}"
    );
    assert!(e.free_disk_bytes.is_some_and(|b| b > 0));
    assert_eq!(e.message, None, "a healthy pod has no message: {e:?}");
    let healthz = streamapp_api::probe::call(
        ([127, 0, 0, 1], metrics_port).into(),
        "GET",
        "/healthz",
        Duration::from_secs(2),
    )
    .unwrap();
    assert_eq!(healthz.status, 200);
    let metrics = streamapp_api::probe::call(
        ([127, 0, 0, 1], metrics_port).into(),
        "GET",
        "/metrics",
        Duration::from_secs(2),
    )
    .unwrap();
    assert!(
        metrics
            .body
            .contains("streamapp_agent_reports_written_total"),
        "{}",
        metrics.body
    );
    assert!(
        !metrics
            .body
            .contains("streamapp_agent_reports_written_total 0\n"),
        "{}",
        metrics.body
    );

    // 2. kill -9: Down, with an unclean shutdown and the last known offsets.
    processor.kill9();
    let e = wait("Down after kill -9", MINUTE, |e| {
        e.phase == Some(PodPhase::Down) && !e.processor_up && !e.ready
    })
    .await;
    assert_eq!(e.last_shutdown_clean, Some(false));
    assert_eq!(
        task(&e, 0).and_then(|t| t.committed_offset),
        Some(30),
        "the last known state is kept"
    );
    assert!(
        e.message
            .as_deref()
            .unwrap_or("")
            .contains("without a drain"),
        "{e:?}"
    );

    // 3. Restart: the unclean shutdown is visible, the tail replayed, then Running.
    let mut processor = p.start_processor();
    let e = wait("Running again after the crash", 2 * MINUTE, |e| {
        e.phase == Some(PodPhase::Running) && e.ready && e.tasks.len() == 2
    })
    .await;
    assert_eq!(
        e.last_shutdown_clean,
        Some(false),
        "the crash is visible after the restart: {e:?}"
    );
    assert_eq!(
        task(&e, 0).and_then(|t| t.opened.as_ref()),
        Some(&StoreOpen::ReplayedTail)
    );

    // 4. A clean drain: Drained, clean, with its duration.
    p.drain();
    processor.wait_exit(MINUTE);
    let e = wait("Drained, the processor gone", MINUTE, |e| {
        e.phase == Some(PodPhase::Drained) && !e.processor_up
    })
    .await;
    assert_eq!(e.last_shutdown_clean, Some(true));
    assert!(e.drain_duration_ms.is_some(), "{e:?}");

    // 5. Restart after the drain (stores flushed to SST files), more data only in the WAL,
    // kill -9, damage the store: the processor quarantines it and rebuilds it.
    let mut processor = p.start_processor();
    let e = wait("Running after the drain", 2 * MINUTE, |e| {
        e.phase == Some(PodPhase::Running) && e.ready && e.tasks.len() == 2
    })
    .await;
    assert_eq!(e.last_shutdown_clean, Some(true), "{e:?}");
    assert_eq!(
        task(&e, 0).and_then(|t| t.opened.as_ref()),
        Some(&StoreOpen::Clean)
    );
    // Records for the rebuild to restore.
    p.produce(0, "b", REBUILD_RECORDS);
    let expected = 30 + REBUILD_RECORDS as i64;
    wait("all records committed", 3 * MINUTE, |e| {
        task(e, 0).and_then(|t| t.committed_offset) == Some(30 + REBUILD_RECORDS as i64)
    })
    .await;
    processor.kill9();
    wait("Down before the damage", MINUTE, |e| {
        e.phase == Some(PodPhase::Down)
    })
    .await;
    p.damage_store();
    // The rebuild waits for this transaction, aborted once the status has shown the rebuild.
    let mut holder = Some(p.hold_changelog());
    let mut processor = p.start_processor();
    // The StateHealthy condition, as the operator computes it from the StreamApp (with the
    // agents' entries), through the rebuild: False/Rebuilding, then True.
    let apps = Api::<StreamApp>::namespaced(admin.clone(), &ns.name);
    let mut seen: Vec<(String, String)> = Vec::new();
    let deadline = tokio::time::Instant::now() + 3 * MINUTE;
    let e = loop {
        let app = apps.get(APP).await.unwrap();
        let computed = compute_status(&app, None, &Findings::default(), Timestamp::now());
        let c = condition_of(&computed, STATE_HEALTHY).expect("a StateHealthy condition");
        let now = (c.status.clone(), c.reason.clone());
        if seen.last() != Some(&now) {
            seen.push(now);
        }
        if c.status == "False"
            && c.reason == REBUILDING
            && let Some(holder) = holder.take()
        {
            holder.abort_transaction(Duration::from_secs(30)).unwrap();
        }
        let entry = app
            .status
            .unwrap_or_default()
            .pods
            .into_iter()
            .find(|p| p.name == POD);
        if let Some(e) = entry.filter(|e| {
            e.phase == Some(PodPhase::Running)
                && e.ready
                && task(e, 0).is_some_and(|t| t.quarantines >= 1)
        }) && c.status == "True"
        {
            break e;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no quarantine and recovery after 3 min; StateHealthy went {seen:?}\n{}",
            p.logs()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let rebuilding = seen
        .iter()
        .position(|(s, r)| s == "False" && r == REBUILDING);
    assert!(
        rebuilding.is_some_and(|i| i + 1 < seen.len()),
        "StateHealthy goes False/Rebuilding, then True: {seen:?}\n{}",
        p.logs()
    );
    assert_eq!(
        seen.last().map(|(s, r)| (s.as_str(), r.as_str())),
        Some(("True", STORES_HEALTHY))
    );
    let t0 = task(&e, 0).unwrap();
    assert_eq!(t0.opened, Some(StoreOpen::Rebuilt), "{t0:?}");
    assert!(
        t0.last_quarantine_reason
            .as_deref()
            .is_some_and(|r| !r.is_empty()),
        "{t0:?}"
    );
    assert!(t0.last_quarantine_at.is_some(), "{t0:?}");
    assert_eq!(
        t0.committed_offset,
        Some(expected),
        "the rebuilt store continues where the input was committed"
    );
    assert!(
        e.message.as_deref().unwrap_or("").contains("quarantined"),
        "the quarantine is news: {e:?}"
    );
    // …and a Kubernetes Event said so.
    let events = Api::<Event>::namespaced(admin.clone(), &ns.name)
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(
        events
            .items
            .iter()
            .any(|ev| ev.reason.as_deref() == Some("StoreQuarantined")),
        "a StoreQuarantined event was published:\n{}",
        p.logs()
    );

    // 6. The pod goes away. The agent's SIGTERM may come while the processor still runs (the
    // kubelet stops a native sidecar last, but nothing else orders them): it waits for the
    // drain the preStop hook runs, reports it, and exits 0.
    agent.signal("TERM");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        agent.is_running(),
        "the agent waits for the processor to finish:\n{}",
        p.logs()
    );
    p.drain();
    processor.wait_exit(MINUTE);
    assert_eq!(
        agent.wait_exit(Duration::from_secs(30)),
        Some(0),
        "the agent exits 0 after its final report:\n{}",
        p.logs()
    );
    let e = common::pod_entry(&admin, &ns.name, APP, POD).await.unwrap();
    assert_eq!(e.phase, Some(PodPhase::Drained), "{e:?}");
    assert_eq!(e.last_shutdown_clean, Some(true));
    assert!(e.drain_duration_ms.is_some(), "{e:?}");

    ns.delete().await;
}
