//! The end-to-end harness.
//!
//! A [`Scenario`] is what a user has after following the README on a cluster: the operator
//! installed by its Helm chart (here from the image built by dev/image.sh, watching only the
//! scenario's namespace), Kafka topics, and the example StreamApp (examples/streamapp.yaml)
//! applied with `kubectl`, adapted to the scenario (its namespace, its topics, the local image,
//! the broker address pods use). Everything runs on the test bed's real node: the kubelet runs
//! the processor and the agent sidecar from the project's image, plays their probes and runs
//! the preStop drain. The tests check what users see: Kafka's topics read with
//! read_committed, `kubectl get streamapps`, the StreamApp's status and the pods'.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, Client};
use rand::RngExt;
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use serde::Deserialize;
use streamapp_api::crd::{PodStateStatus, StreamApp, StreamAppStatus};
use streamapp_api::status_values::PodPhase;
use testbed::kafka::{self, Isolation};
use testbed::kube::{TestNamespace, kubectl, kubectl_ok};

/// The example's StreamApp name.
pub const APP: &str = "orders-dedup";

/// How long a StreamApp may take to become Ready: pods scheduled, images there, stores restored.
pub const READY_TIMEOUT: Duration = Duration::from_secs(180);

/// The scenario's topics (the example's, made unique).
pub struct Topics {
    pub input: String,
    pub output: String,
    pub duplicates: String,
    pub dead_letters: String,
}

pub struct Scenario {
    pub client: Client,
    pub namespace: String,
    pub release: String,
    pub topics: Topics,
    ns: TestNamespace,
}

/// The repository, found like the test bed's scripts (from the crate under test at run time).
fn repo_root() -> PathBuf {
    testbed::dev_dir().join("..")
}

impl Scenario {
    /// A namespace, topics (input with `partitions` partitions), and the operator installed
    /// into the namespace by `helm install --wait` (its pod is Ready on the real node).
    pub async fn start(prefix: &str, partitions: i32) -> Scenario {
        let client = testbed::kube::client().await;
        testbed::node::require_ready(&client).await;
        // Helm installs a chart's CRD only once and never updates it; the chart's README tells
        // users to apply a new one themselves, and so does a test bed that outlives a change.
        static CRD: std::sync::Once = std::sync::Once::new();
        CRD.call_once(|| {
            let crd = repo_root().join("crds/streamapp.dev_streamapps.yaml");
            kubectl_ok(
                &[
                    "apply",
                    "--server-side",
                    "--force-conflicts",
                    "-f",
                    crd.to_str().unwrap(),
                ],
                None,
            );
        });
        let ns = TestNamespace::create(&client, prefix).await;
        let base = testbed::unique_name(&format!("e2e-{prefix}"));
        let topics = Topics {
            input: format!("{base}.commands"),
            output: format!("{base}.deduped"),
            duplicates: format!("{base}.duplicates"),
            dead_letters: format!("{base}.dlq"),
        };
        kafka::create_topic(&topics.input, partitions).await;
        kafka::create_topic(&topics.output, partitions).await;
        kafka::create_topic(&topics.duplicates, partitions).await;
        kafka::create_topic(&topics.dead_letters, 1).await;

        let release = testbed::unique_name("op");
        let image = testbed::node::app_image();
        let (repository, tag) = image.rsplit_once(':').expect("the image has a tag");
        let chart = repo_root().join("charts/streamapp-operator");
        testbed::helm::helm_ok(&[
            "install",
            &release,
            chart.to_str().unwrap(),
            "--namespace",
            &ns.name,
            "--set",
            &format!("watchNamespace={}", ns.name),
            "--set",
            &format!("image.repository={repository}"),
            "--set",
            &format!("image.tag={tag}"),
            "--set",
            "image.pullPolicy=Never",
            "--wait",
            "--timeout",
            "120s",
        ]);
        Scenario {
            client,
            namespace: ns.name.clone(),
            release,
            topics,
            ns,
        }
    }

    /// The example's StreamApp, adapted to this scenario: namespace, topics, the image built
    /// here, and Kafka's address as pods reach it. Everything else is the example's.
    pub fn example(&self) -> serde_yaml::Value {
        let text = std::fs::read_to_string(repo_root().join("examples/streamapp.yaml"))
            .expect("reading examples/streamapp.yaml");
        let mut app = serde_yaml::Deserializer::from_str(&text)
            .map(|d| serde_yaml::Value::deserialize(d).expect("the example is YAML"))
            .find(|d| d["kind"] == "StreamApp")
            .expect("the example has a StreamApp");
        assert_eq!(app["metadata"]["name"], APP);
        app["metadata"]["namespace"] = self.namespace.clone().into();
        let spec = &mut app["spec"];
        spec["image"] = testbed::node::app_image().into();
        spec["kafka"]["bootstrapServers"] = testbed::node::pod_kafka_bootstrap().into();
        let topology = &mut spec["topology"];
        topology["inputTopic"] = self.topics.input.clone().into();
        topology["outputTopic"] = self.topics.output.clone().into();
        topology["duplicatesTopic"] = self.topics.duplicates.clone().into();
        topology["deadLetterTopic"] = self.topics.dead_letters.clone().into();
        app
    }

    /// `kubectl apply -f -` of a StreamApp.
    pub fn apply(&self, app: &serde_yaml::Value) {
        kubectl_ok(
            &["apply", "-f", "-"],
            Some(&serde_yaml::to_string(app).unwrap()),
        );
    }

    /// kubectl in the scenario's namespace; panics when it fails.
    pub fn kubectl(&self, args: &[&str]) -> String {
        let mut all = vec!["--namespace", &self.namespace];
        all.extend_from_slice(args);
        kubectl_ok(&all, None)
    }

    /// `kubectl wait --for=condition=Ready streamapp/<app>`: every pod restored its stores and
    /// processes. Panics with the status and the pods when it does not happen in `timeout`.
    pub async fn wait_ready(&self, timeout: Duration) {
        let out = kubectl(
            &[
                "--namespace",
                &self.namespace,
                "wait",
                "--for=condition=Ready",
                &format!("streamapp/{APP}"),
                &format!("--timeout={}s", timeout.as_secs()),
            ],
            None,
        );
        if !out.status.success() {
            panic!(
                "the StreamApp did not become Ready in {timeout:?} ({}):\n{}",
                String::from_utf8_lossy(&out.stderr).trim(),
                self.diagnostics().await
            );
        }
    }

    /// What a user would look at when something is wrong: the status, the pods, the logs.
    pub async fn diagnostics(&self) -> String {
        let run = |args: &[&str]| {
            let mut all = vec!["--namespace", self.namespace.as_str()];
            all.extend_from_slice(args);
            let out = kubectl(&all, None);
            format!(
                "$ kubectl {}\n{}{}",
                args.join(" "),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        };
        let mut text = run(&["get", "streamapp", APP, "-o", "yaml"]);
        text += &run(&["get", "pods", "-o", "wide"]);
        for pod in self.pods().await {
            let name = pod.metadata.name.unwrap_or_default();
            for container in ["processor", "agent"] {
                text += &run(&["logs", &name, "-c", container, "--tail", "30"]);
            }
        }
        text
    }

    pub fn application_id(&self) -> String {
        format!("{}.{APP}", self.namespace)
    }

    pub async fn status(&self) -> StreamAppStatus {
        Api::<StreamApp>::namespaced(self.client.clone(), &self.namespace)
            .get(APP)
            .await
            .expect("reading the StreamApp")
            .status
            .unwrap_or_default()
    }

    /// Waits until the status satisfies `check`; returns it.
    pub async fn wait_for_status(
        &self,
        what: &str,
        timeout: Duration,
        check: impl Fn(&StreamAppStatus) -> bool,
    ) -> StreamAppStatus {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let status = self.status().await;
            if check(&status) {
                return status;
            }
            if tokio::time::Instant::now() >= deadline {
                panic!(
                    "timed out after {timeout:?} waiting for {what}:\n{}",
                    self.diagnostics().await
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Waits for an Event of `reason` in the scenario's namespace and returns its note; panics
    /// with the diagnostics when none comes in `timeout`.
    pub async fn wait_for_event(&self, reason: &str, timeout: Duration) -> String {
        let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(
            self.client.clone(),
            &self.namespace,
        );
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let found = events
                .list(&ListParams::default())
                .await
                .expect("listing events")
                .items
                .into_iter()
                .find(|e| e.reason.as_deref() == Some(reason));
            if let Some(event) = found {
                return event.note.unwrap_or_default();
            }
            if tokio::time::Instant::now() >= deadline {
                panic!(
                    "no {reason} event within {timeout:?}:\n{}",
                    self.diagnostics().await
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The StreamApp's `resourceVersion` now: where [`Scenario::wait_for_final_report`] starts
    /// looking from.
    pub async fn status_version(&self) -> String {
        Api::<StreamApp>::namespaced(self.client.clone(), &self.namespace)
            .get(APP)
            .await
            .expect("reading the StreamApp")
            .metadata
            .resource_version
            .expect("a StreamApp has a resourceVersion")
    }

    /// The final report of `pod`'s agent (`phase: Drained`), in any version of the status
    /// since `since` ([`Scenario::status_version`], taken before the pod was stopped). Watched,
    /// not polled: the entry is shown only until the pod's successor exists (then it is a
    /// stale report, and the operator drops it), which can be a moment.
    pub async fn wait_for_final_report(&self, pod: &str, since: &str) -> PodStateStatus {
        use futures::StreamExt;
        use kube::api::{WatchEvent, WatchParams};

        let apps = Api::<StreamApp>::namespaced(self.client.clone(), &self.namespace);
        let params = WatchParams::default()
            .fields(&format!("metadata.name={APP}"))
            .timeout(30);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
        let mut version = since.to_string();
        while tokio::time::Instant::now() < deadline {
            let mut events = apps
                .watch(&params, &version)
                .await
                .unwrap_or_else(|e| panic!("watching the StreamApp from {version}: {e}"))
                .boxed();
            while let Ok(Some(event)) = tokio::time::timeout_at(deadline, events.next()).await {
                let app = match event.expect("a watch event") {
                    WatchEvent::Added(app) | WatchEvent::Modified(app) => app,
                    WatchEvent::Error(e) => panic!("watching the StreamApp from {version}: {e:?}"),
                    _ => continue,
                };
                version = app.metadata.resource_version.clone().unwrap_or(version);
                let report = app
                    .status
                    .into_iter()
                    .flat_map(|s| s.pods)
                    .find(|p| p.name == pod && p.phase == Some(PodPhase::Drained));
                if let Some(report) = report {
                    return report;
                }
            }
        }
        panic!(
            "no final report of {pod} within 90 s:\n{}",
            self.diagnostics().await
        );
    }

    /// The agent's entry for `pod` in `status.pods`.
    pub async fn pod_report(&self, pod: &str) -> Option<PodStateStatus> {
        self.status().await.pods.into_iter().find(|p| p.name == pod)
    }

    /// The StreamApp's pods (not being deleted), by name.
    pub async fn pods(&self) -> Vec<Pod> {
        let mut pods: Vec<Pod> = Api::<Pod>::namespaced(self.client.clone(), &self.namespace)
            .list(&ListParams::default().labels(&format!("streamapp.dev/app={APP}")))
            .await
            .expect("listing pods")
            .items;
        pods.sort_by_key(|p| p.metadata.name.clone());
        pods
    }

    pub async fn pod(&self, name: &str) -> Pod {
        Api::<Pod>::namespaced(self.client.clone(), &self.namespace)
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("reading pod {name}: {e}"))
    }

    /// Waits until every record produced so far has been processed and committed: by the
    /// route stage (the input) and by the dedup stage (the repartition topic; the example's
    /// ids are in the JSON value, so it repartitions).
    pub fn wait_processed(&self) {
        let group = self.application_id();
        kafka::wait_for_group_caught_up(&group, &self.topics.input, Duration::from_secs(120));
        kafka::wait_for_group_read_everything(
            &group,
            &format!("{group}-dedup-repartition"),
            Duration::from_secs(120),
        );
    }

    /// Reads the output, duplicates and dead-letter topics (read_committed, to their end) and
    /// asserts what exactly-once promises for everything `sent`: each id once in the output,
    /// every repeat in the duplicates, every bad record a dead letter, nothing else.
    pub fn assert_exactly_once(&self, sent: &Sent) {
        self.wait_processed();
        let mut output: BTreeMap<String, usize> = BTreeMap::new();
        kafka::read_all(&self.topics.output, Isolation::ReadCommitted, |m| {
            *output.entry(command_id(m)).or_default() += 1;
        });
        let doubled: Vec<_> = output.iter().filter(|(_, n)| **n > 1).collect();
        assert!(doubled.is_empty(), "ids output more than once: {doubled:?}");
        let missing: Vec<_> = sent
            .ids
            .keys()
            .filter(|id| !output.contains_key(*id))
            .collect();
        assert!(missing.is_empty(), "ids never output: {missing:?}");
        assert_eq!(
            output.len(),
            sent.ids.len(),
            "the output holds ids that were never sent"
        );
        let duplicates = kafka::read_all(&self.topics.duplicates, Isolation::ReadCommitted, |_| {});
        assert_eq!(duplicates, sent.repeats(), "every repeat is a duplicate");
        let dead = kafka::read_all(&self.topics.dead_letters, Isolation::ReadCommitted, |_| {});
        assert_eq!(dead, sent.bad, "every malformed record is a dead letter");
    }

    /// Uninstalls the operator and deletes the namespace (a failing test leaves both for a
    /// look).
    pub async fn finish(self) {
        testbed::helm::helm_ok(&[
            "uninstall",
            &self.release,
            "--namespace",
            &self.namespace,
            "--wait",
        ]);
        self.ns.delete().await;
    }
}

fn command_id(m: &rdkafka::message::BorrowedMessage<'_>) -> String {
    let value: serde_json::Value =
        serde_json::from_slice(m.payload().expect("a value")).expect("JSON output");
    value["commandId"]
        .as_str()
        .expect("a commandId")
        .to_string()
}

/// Commands sent to a scenario's input: every id with how often it was sent, and the
/// malformed records.
#[derive(Debug, Default)]
pub struct Sent {
    pub ids: BTreeMap<String, usize>,
    pub bad: usize,
    run: String,
}

impl Sent {
    pub fn new() -> Sent {
        Sent {
            run: format!("{:06x}", rand::rng().random_range(0..0xffffffu32)),
            ..Default::default()
        }
    }

    /// Produces `count` commands, a `repeats` fraction of them repeating an id sent before
    /// (in this batch or an earlier one), then `bad` records without a command id. Commands
    /// are keyed by an order id unrelated to their command id (the example finds the id in the
    /// value), so repeats land on other partitions than their first occurrence.
    pub fn produce(&mut self, scenario: &Scenario, count: usize, repeats: f64, bad: usize) {
        let producer: BaseProducer = kafka::input_producer_config()
            .set("linger.ms", "5")
            .create()
            .expect("a producer");
        let mut rng = rand::rng();
        for _ in 0..count {
            let id = if !self.ids.is_empty() && rng.random_bool(repeats) {
                let i = rng.random_range(0..self.ids.len());
                self.ids.keys().nth(i).unwrap().clone()
            } else {
                format!("cmd-{}-{}", self.run, self.ids.len())
            };
            *self.ids.entry(id.clone()).or_default() += 1;
            let value = format!(
                r#"{{"commandId":"{id}","amount":{}}}"#,
                rng.random_range(1..1000)
            );
            let order = format!("order-{}", rng.random_range(0..997));
            kafka::send(
                &producer,
                BaseRecord::to(&scenario.topics.input)
                    .key(&order)
                    .payload(&value),
            );
        }
        for i in 0..bad {
            let value = format!(r#"{{"amount":{i}}}"#);
            kafka::send(
                &producer,
                BaseRecord::to(&scenario.topics.input)
                    .key("bad")
                    .payload(&value),
            );
        }
        self.bad += bad;
        producer
            .flush(Duration::from_secs(30))
            .expect("flushing the producer");
    }

    /// Records sent again after their first occurrence.
    pub fn repeats(&self) -> usize {
        self.ids.values().map(|n| n - 1).sum()
    }
}

/// A pod's processor container: how often the kubelet restarted it, and its last run's exit
/// code (none before the first restart).
pub fn processor_restarts(pod: &Pod) -> (i32, Option<i32>) {
    let Some(processor) = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|all| all.iter().find(|c| c.name == "processor"))
    else {
        return (0, None);
    };
    let last = processor
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .map(|t| t.exit_code);
    (processor.restart_count, last)
}

/// Pod names of a StreamApp with `replicas` pods.
pub fn pod_name(ordinal: usize) -> String {
    format!("{APP}-{ordinal}")
}

/// The end-to-end report: figures the tests measure but do not assert (how long a failover
/// took, say), one line each, in `$STREAMAPP_RUN/reports/e2e.txt`. `make test` prints it at the
/// end (dev/test-run.sh); a test run alone prints its lines with `--nocapture`.
pub fn report_path() -> PathBuf {
    testbed::run_dir().join("reports").join("e2e.txt")
}

/// Adds `line` to the [end-to-end report](report_path).
pub fn report(line: &str) {
    use std::io::Write;
    println!("{line}");
    let path = report_path();
    std::fs::create_dir_all(path.parent().unwrap()).expect("creating the reports folder");
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("opening {}: {e}", path.display()));
    writeln!(file, "{line}").unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}
