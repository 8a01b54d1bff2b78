//! Harness for the processor's integration tests: real topics on the local broker, real
//! processor processes (the built binary), their state dirs, and readers of what they wrote.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use streamapp_api::state_volume::StateDir;
use testbed::kafka::{self, Isolation};
use testbed::process::{Spawned, free_port};

/// How long [`App::produce`] waits for the broker to take the records.
const PRODUCE_TIMEOUT: Duration = Duration::from_secs(120);

/// The processor binary under test: the one this package builds, or `$STREAMAPP_TEST_PROCESSOR`
/// (to run the suite against another build, such as the previous release, and see which tests
/// catch what it gets wrong).
pub fn bin() -> String {
    std::env::var("STREAMAPP_TEST_PROCESSOR")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_streamapp-processor").to_string())
}

/// The processor tests start several processes each and count on Kafka's timeouts: run them
/// one at a time, whatever the test runner's thread count.
pub async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    LOCK.lock().await
}

/// One application: its topics and configuration file.
pub struct App {
    pub id: String,
    pub input: String,
    pub output: String,
    pub duplicates: String,
    pub dead_letters: String,
    pub partitions: i32,
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    /// The configuration file's content (see [`App::rewrite_config`]).
    pub config_json: serde_json::Value,
}

pub struct AppOptions {
    pub partitions: i32,
    pub retention: &'static str,
    pub commit_interval: &'static str,
    pub max_value_size: &'static str,
    pub dedup_id: serde_json::Value,
    /// Extra lines under `rocksdb:` in the config (YAML, two-space indented).
    pub rocksdb: serde_json::Value,
    /// Merged into `topology` (e.g. `maxSkew`, `maxRecordAttempts`).
    pub topology: serde_json::Value,
    /// Merged into `kafka.properties`.
    pub kafka_properties: serde_json::Value,
    /// Merged into the top level of the configuration (e.g. `livenessTimeout`).
    pub extra: serde_json::Value,
    /// Topics not to create (to test what happens when one is missing).
    pub without_topics: &'static [&'static str],
    /// Topic configs by role (`input`, `output`, ...), e.g. `("output", "max.message.bytes",
    /// "965536")`.
    pub topic_configs: &'static [(&'static str, &'static str, &'static str)],
}

impl Default for AppOptions {
    fn default() -> Self {
        AppOptions {
            partitions: 2,
            retention: "1h",
            commit_interval: "100ms",
            max_value_size: "900k",
            dedup_id: serde_json::json!({ "source": "Key" }),
            rocksdb: serde_json::json!({ "profile": "LowMemory" }),
            topology: serde_json::json!({}),
            kafka_properties: serde_json::json!({}),
            extra: serde_json::json!({}),
            without_topics: &[],
            topic_configs: &[],
        }
    }
}

/// Copies the keys of `extra` (an object) into `target` (an object).
fn merge(target: &mut serde_json::Value, extra: &serde_json::Value) {
    if let (Some(t), Some(e)) = (target.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            t.insert(k.clone(), v.clone());
        }
    }
}

impl App {
    pub async fn create(prefix: &str, opts: AppOptions) -> App {
        let id = testbed::unique_name(prefix);
        let (input, output) = (format!("{id}-in"), format!("{id}-out"));
        let (duplicates, dead_letters) = (format!("{id}-dups"), format!("{id}-dlq"));
        for (role, topic) in [
            ("input", &input),
            ("output", &output),
            ("duplicates", &duplicates),
            ("dead-letters", &dead_letters),
        ] {
            if opts.without_topics.contains(&role) {
                continue;
            }
            let configs: Vec<(&str, &str)> = opts
                .topic_configs
                .iter()
                .filter(|(r, _, _)| *r == role)
                .map(|(_, k, v)| (*k, *v))
                .collect();
            kafka::create_topic_with(topic, opts.partitions, &configs).await;
        }
        let mut config = serde_json::json!({
            "applicationId": id,
            "kafka": {
                "bootstrapServers": kafka::bootstrap(),
                // Fast failure detection: tests kill processes on purpose.
                "properties": {
                    "session.timeout.ms": "6000",
                    "heartbeat.interval.ms": "1000",
                    "transaction.timeout.ms": "10000",
                },
            },
            "topology": {
                "inputTopic": input,
                "outputTopic": output,
                "duplicatesTopic": duplicates,
                "deadLetterTopic": dead_letters,
                "dedupId": opts.dedup_id,
                "retention": opts.retention,
                "commitInterval": opts.commit_interval,
                "maxValueSize": opts.max_value_size,
            },
            "rocksdb": opts.rocksdb,
            "drainTimeout": "30s",
        });
        merge(&mut config["topology"], &opts.topology);
        merge(&mut config["kafka"]["properties"], &opts.kafka_properties);
        merge(&mut config, &opts.extra);
        let dir = tempfile::tempdir().unwrap();
        let config_path = dir.path().join("processor.yaml");
        std::fs::write(&config_path, serde_yaml::to_string(&config).unwrap()).unwrap();
        App {
            id,
            input,
            output,
            duplicates,
            dead_letters,
            partitions: opts.partitions,
            dir,
            config: config_path,
            config_json: config,
        }
    }

    /// An application with `partitions` input partitions and every other option at its
    /// default.
    pub async fn with_partitions(prefix: &str, partitions: i32) -> App {
        App::create(
            prefix,
            AppOptions {
                partitions,
                ..Default::default()
            },
        )
        .await
    }

    pub fn changelog(&self) -> String {
        format!("{}-dedup-changelog", self.id)
    }

    /// Changes the configuration file (for processors started afterwards).
    pub fn rewrite_config(&mut self, change: impl FnOnce(&mut serde_json::Value)) {
        change(&mut self.config_json);
        std::fs::write(
            &self.config,
            serde_yaml::to_string(&self.config_json).unwrap(),
        )
        .unwrap();
    }

    /// Waits until the application's consumer group has committed the end of the input:
    /// everything produced so far is processed and its results are committed with it. Then
    /// reading a topic to its end shows every result (absence is checked this way, never by
    /// sleeping).
    ///
    /// When the app repartitions, the dedup stage reads the repartition topic: it must have
    /// processed everything the route stage committed there too.
    pub fn wait_until_processed(&self, timeout: Duration) {
        kafka::wait_for_group_caught_up(&self.id, &self.input, timeout);
        if self.repartitions() {
            kafka::wait_for_group_read_everything(&self.id, &self.repartition_topic(), timeout);
        }
    }

    /// Whether the configuration makes the processor repartition (`topology.repartition` Auto,
    /// the default, and a dedup id that is not the key).
    pub fn repartitions(&self) -> bool {
        let topology = &self.config_json["topology"];
        let source = topology["dedupId"]["source"].as_str().unwrap_or("Key");
        let never = topology["repartition"].as_str() == Some("Never");
        source != "Key" && !never
    }

    pub fn repartition_topic(&self) -> String {
        format!("{}-dedup-repartition", self.id)
    }

    /// A state directory for a pod of this app.
    pub fn state_dir(&self, pod: &str) -> PathBuf {
        self.dir.path().join(pod)
    }

    /// Starts a processor process for `pod`.
    pub fn start(&self, pod: &str) -> Processor {
        self.start_with(pod, &[])
    }

    pub fn start_with(&self, pod: &str, env: &[(&str, &str)]) -> Processor {
        self.start_in(pod, env, &[])
    }

    /// Starts a processor whose command line is `prefix` followed by the processor's (e.g.
    /// `nsenter --mount=...` to run it in another mount namespace).
    pub fn start_in(&self, pod: &str, env: &[(&str, &str)], prefix: &[String]) -> Processor {
        self.start_at(pod, &self.state_dir(pod), env, prefix)
    }

    /// Starts a processor for `pod` with the state directory `state`.
    pub fn start_at(
        &self,
        pod: &str,
        state: &Path,
        env: &[(&str, &str)],
        prefix: &[String],
    ) -> Processor {
        let port = free_port();
        let state = state.to_path_buf();
        std::fs::create_dir_all(&state).unwrap();
        let log_name = state.file_name().unwrap().to_string_lossy().into_owned();
        let log_path = self.dir.path().join(format!("{log_name}.log"));
        let mut cmd = match prefix.split_first() {
            None => Command::new(bin()),
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(bin());
                c
            }
        };
        cmd.arg("run")
            .env("STREAMAPP_CONFIG", &self.config)
            .env("POD_NAME", pod)
            .env("STREAMAPP_STATE_DIR", &state)
            .env("STREAMAPP_HTTP_PORT", port.to_string())
            .env(
                "RUST_LOG",
                std::env::var("TEST_PROCESSOR_LOG")
                    .unwrap_or_else(|_| "info,librdkafka=warn".into()),
            );
        for (k, v) in env {
            cmd.env(k, v);
        }
        Processor {
            process: Spawned::spawn(cmd, &log_path),
            pod: pod.into(),
            port,
            state,
        }
    }

    /// Produces `records` (key, value, headers) to the input, non-transactionally, with
    /// explicit record times, and waits until the broker has them.
    pub fn produce(&self, records: &[Input]) {
        let before: i64 = kafka::end_offsets(&self.input).iter().sum();
        let producer: BaseProducer = kafka::input_producer_config()
            .set("linger.ms", "5")
            // Room for values around the processor's limits (the broker takes 1,048,588).
            .set("message.max.bytes", "2000000")
            .create()
            .unwrap();
        for r in records {
            let mut headers = OwnedHeaders::new();
            for (k, v) in &r.headers {
                headers = headers.insert(Header {
                    key: k,
                    value: Some(v.as_bytes()),
                });
            }
            let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(&self.input)
                .headers(headers)
                .timestamp(r.time);
            if let Some(k) = &r.key {
                record = record.key(k.as_bytes());
            }
            if let Some(v) = &r.value {
                record = record.payload(v.as_slice());
            }
            if let Some(p) = r.partition {
                record = record.partition(p);
            }
            testbed::kafka::send(&producer, record);
        }
        // Records wait in the producer until the broker takes them: after a broker freeze or
        // restart that took more than 30 s in CI (a broker that had run the whole suite, right
        // after it served every partition again), so the wait is longer than any healthy one.
        producer
            .flush(PRODUCE_TIMEOUT)
            .unwrap_or_else(|e| panic!("producing to {} for {PRODUCE_TIMEOUT:?}: {e}", self.input));
        // The broker may refuse records (a timestamp too far ahead, a size): a test must not
        // go on as if they were there.
        let after: i64 = kafka::end_offsets(&self.input).iter().sum();
        assert!(
            after - before >= records.len() as i64,
            "the broker took {} of {} records produced to {}",
            after - before,
            records.len(),
            self.input
        );
    }

    /// The records of `topic` visible to read_committed consumers: (dedup-id header or key,
    /// headers).
    pub fn read(&self, topic: &str) -> Vec<Output> {
        let mut out = Vec::new();
        kafka::read_all(topic, Isolation::ReadCommitted, |m| {
            let headers: HashMap<String, String> = m
                .headers()
                .map(|h| {
                    h.iter()
                        .map(|x| {
                            (
                                x.key.to_string(),
                                String::from_utf8_lossy(x.value.unwrap_or_default()).into_owned(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            out.push(Output {
                key: m.key().map(|k| String::from_utf8_lossy(k).into_owned()),
                time: m.timestamp().to_millis(),
                value: m.payload().map(<[u8]>::to_vec),
                headers,
            });
        });
        out
    }

    /// Waits until `topic` has at least `n` committed records; returns them.
    pub fn wait_for_records(&self, topic: &str, n: usize, timeout: Duration) -> Vec<Output> {
        let deadline = Instant::now() + timeout;
        loop {
            let records = self.read(topic);
            if records.len() >= n {
                return records;
            }
            assert!(
                Instant::now() < deadline,
                "{topic}: {} committed records after {timeout:?}, expected {n}; logs in {}",
                records.len(),
                self.dir.path().display()
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}

impl Drop for App {
    /// A failing test keeps its directory (configuration, state dirs, processor logs).
    fn drop(&mut self) {
        if std::thread::panicking() {
            let dir = std::mem::replace(&mut self.dir, tempfile::tempdir().unwrap());
            eprintln!("kept the test's files in {}", dir.keep().display());
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct Input {
    pub key: Option<String>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(String, String)>,
    pub time: i64,
    pub partition: Option<i32>,
}

impl Input {
    /// A command with dedup id `id` (the key) at record time `time`.
    pub fn cmd(id: &str, time: i64) -> Input {
        Input {
            key: Some(id.into()),
            value: Some(format!(r#"{{"id":"{id}","payload":"{}"}}"#, "x".repeat(150)).into_bytes()),
            time,
            ..Default::default()
        }
    }

    pub fn header(mut self, k: &str, v: &str) -> Input {
        self.headers.push((k.into(), v.into()));
        self
    }

    pub fn partition(mut self, p: i32) -> Input {
        self.partition = Some(p);
        self
    }
}

#[derive(Clone, Debug)]
pub struct Output {
    pub key: Option<String>,
    /// The record's timestamp.
    pub time: Option<i64>,
    pub value: Option<Vec<u8>>,
    pub headers: HashMap<String, String>,
}

impl Output {
    pub fn id(&self) -> String {
        self.headers
            .get("streamapp.dedup.id")
            .cloned()
            .or_else(|| self.key.clone())
            .unwrap_or_default()
    }
}

/// A running (or exited) processor process.
pub struct Processor {
    process: Spawned,
    pub pod: String,
    pub port: u16,
    pub state: PathBuf,
}

impl Processor {
    fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    pub fn is_ready(&self) -> bool {
        streamapp_api::probe::call(
            self.addr(),
            "GET",
            streamapp_api::probe::READYZ,
            Duration::from_secs(2),
        )
        .is_ok_and(|r| r.status == 200)
    }

    /// Waits for /readyz (all stores restored, processing).
    pub fn wait_ready(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.is_ready() {
            if let Some(status) = self.process.exited() {
                panic!(
                    "processor {} exited with {status} before it was ready:\n{}",
                    self.pod,
                    self.log_tail()
                );
            }
            assert!(
                Instant::now() < deadline,
                "processor {} not ready after {timeout:?}:\n{}",
                self.pod,
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Sends `signal` (`STOP`, `CONT`, ...) to the process.
    pub fn signal(&self, signal: &str) {
        self.process.signal(signal)
    }

    /// GET `path` on the processor's HTTP port: status and body.
    pub fn get(&self, path: &str) -> Option<(u16, String)> {
        streamapp_api::probe::call(self.addr(), "GET", path, Duration::from_secs(2))
            .ok()
            .map(|r| (r.status, r.body))
    }

    /// The processor's health report, live from `/health`.
    pub fn live_health(&self) -> streamapp_api::health::ProcessorHealth {
        let (status, body) = self
            .get(streamapp_api::probe::HEALTH)
            .expect("/health answers");
        assert_eq!(status, 200, "{body}");
        serde_json::from_str(&body).expect("/health is JSON")
    }

    /// The value of a metric line of `/metrics` (`name{labels}` as written there).
    pub fn metric(&self, series: &str) -> Option<f64> {
        let (_, body) = self.get("/metrics")?;
        body.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    /// Waits until `ok` holds for the live health report.
    pub fn wait_health(
        &mut self,
        what: &str,
        timeout: Duration,
        ok: impl Fn(&streamapp_api::health::ProcessorHealth) -> bool,
    ) -> streamapp_api::health::ProcessorHealth {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.process.exited() {
                panic!(
                    "processor {} exited with {status} waiting for {what}:\n{}",
                    self.pod,
                    self.log_tail()
                );
            }
            if let Some((200, body)) = self.get(streamapp_api::probe::HEALTH)
                && let Ok(h) = serde_json::from_str(&body)
                && ok(&h)
            {
                return h;
            }
            assert!(
                Instant::now() < deadline,
                "processor {}: no {what} after {timeout:?}:\n{}",
                self.pod,
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Whether the process still runs.
    pub fn is_running(&mut self) -> bool {
        self.process.is_running()
    }

    /// SIGKILL: no drain, no flush, an open transaction left behind.
    pub fn kill9(&mut self) {
        self.process.kill9()
    }

    /// Runs `streamapp-processor drain` against this processor (as the preStop hook does).
    pub fn drain(&mut self) -> std::process::Output {
        Command::new(bin())
            .args([
                "drain",
                "--port",
                &self.port.to_string(),
                "--timeout",
                "60s",
            ])
            .output()
            .expect("running drain")
    }

    /// Drains the processor (as the preStop hook does) and waits for it to exit cleanly.
    pub fn drain_and_exit(&mut self) {
        let drained = self.drain();
        assert!(
            drained.status.success(),
            "drain of {}: {}",
            self.pod,
            String::from_utf8_lossy(&drained.stderr)
        );
        assert_eq!(
            self.wait_exit(Duration::from_secs(60)),
            Some(0),
            "{} exits after its drain",
            self.pod
        );
    }

    /// Waits for the process to exit; returns its exit code.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        self.process.wait_exit(timeout)
    }

    /// Waits for a start-up refusal: exit code 2 and `expected` in the log.
    pub fn assert_refused_at_start_up(&mut self, expected: &str) {
        assert_eq!(
            self.wait_exit(Duration::from_secs(60)),
            Some(2),
            "a start-up refusal"
        );
        assert!(
            self.log_text().contains(expected),
            "expected {expected:?} in:\n{}",
            self.log_tail()
        );
    }

    pub fn log_text(&self) -> String {
        self.process.log_text()
    }

    pub fn log_tail(&self) -> String {
        self.process.log_tail()
    }

    /// The processor's health file.
    pub fn health(&self) -> streamapp_api::health::ProcessorHealth {
        let bytes =
            std::fs::read(StateDir::new(&self.state, None).health_file()).expect("health file");
        serde_json::from_slice(&bytes).expect("health file parses")
    }
}

/// A private mount namespace holding a small tmpfs at `dir`: a state volume that can be filled
/// up. The namespace (and with it the tmpfs) lives as long as its holder process, which dies
/// with this value and with the test process (PR_SET_PDEATHSIG via setpriv); nothing is
/// mounted on the machine itself.
pub struct SmallVolume {
    holder: Child,
    pub dir: PathBuf,
}

impl SmallVolume {
    pub fn new(dir: &Path, size: &str) -> SmallVolume {
        std::fs::create_dir_all(dir).unwrap();
        let holder = Command::new("setpriv")
            .args(["--pdeathsig", "KILL", "--", "unshare", "--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg(format!(
                "mount -t tmpfs -o size={size} streamapp-test \"$0\" && echo mounted && exec sleep 100000"
            ))
            .arg(dir)
            .stdout(Stdio::piped())
            .spawn()
            .expect("setpriv/unshare (util-linux) to make a private mount namespace");
        let mut volume = SmallVolume {
            holder,
            dir: dir.to_path_buf(),
        };
        let mut line = String::new();
        use std::io::BufRead;
        std::io::BufReader::new(volume.holder.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "mounted", "the tmpfs could not be mounted");
        volume
    }

    /// The command prefix that runs a program inside the namespace.
    pub fn prefix(&self) -> Vec<String> {
        vec![
            "nsenter".into(),
            format!("--mount=/proc/{}/ns/mnt", self.holder.id()),
            "--".into(),
        ]
    }

    /// `path` (under [`SmallVolume::dir`]) as seen from outside the namespace.
    pub fn outside(&self, path: &Path) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root", self.holder.id()))
            .join(path.strip_prefix("/").unwrap())
    }

    /// Writes a file of zeros into the volume until it is full; returns its path (outside).
    pub fn fill(&self) -> PathBuf {
        use std::io::Write;
        let path = self.outside(&self.dir.join("filler"));
        let mut f = std::fs::File::create(&path).unwrap();
        let chunk = vec![0u8; 64 * 1024];
        while f.write_all(&chunk).is_ok() {}
        let _ = f.sync_all();
        path
    }
}

impl Drop for SmallVolume {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

/// Waits until the processor's log contains `text`.
pub fn wait_for_log(p: &Processor, text: &str, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while !p.log_text().contains(text) {
        assert!(
            Instant::now() < deadline,
            "processor {} did not log {text:?} within {timeout:?}:\n{}",
            p.pod,
            p.log_tail()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `streamapp-processor inspect --json <dir>`.
pub fn inspect(state: &Path) -> serde_json::Value {
    let out = Command::new(bin())
        .args(["inspect", "--json"])
        .arg(state)
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(out.status.success(), "inspect failed");
    serde_json::from_slice(&out.stdout).expect("inspect prints JSON")
}

/// Counts of each id in `records`.
pub fn counts(records: &[Output]) -> HashMap<String, usize> {
    let mut out = HashMap::new();
    for r in records {
        *out.entry(r.id()).or_default() += 1;
    }
    out
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}
