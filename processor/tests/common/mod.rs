//! Harness for the processor's integration tests: real topics on the local broker, real
//! processor processes (the built binary), their state dirs, and readers of what they wrote.

#![allow(dead_code)] // each test binary uses a different part of the harness

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use testbed::kafka::{self, Isolation};

pub const BIN: &str = env!("CARGO_BIN_EXE_streamapp-processor");

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
}

pub struct AppOptions {
    pub partitions: i32,
    pub retention: &'static str,
    pub commit_interval: &'static str,
    pub max_value_size: &'static str,
    pub dedup_id: serde_json::Value,
    /// Extra lines under `rocksdb:` in the config (YAML, two-space indented).
    pub rocksdb: serde_json::Value,
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
        }
    }
}

impl App {
    pub async fn create(prefix: &str, opts: AppOptions) -> App {
        let id = testbed::unique_name(prefix);
        let (input, output) = (format!("{id}-in"), format!("{id}-out"));
        let (duplicates, dead_letters) = (format!("{id}-dups"), format!("{id}-dlq"));
        for topic in [&input, &output, &duplicates, &dead_letters] {
            kafka::create_topic(topic, opts.partitions).await;
        }
        let config = serde_json::json!({
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
        }
    }

    pub fn changelog(&self) -> String {
        format!("{}-dedup-changelog", self.id)
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
        let port = free_port();
        let state = self.state_dir(pod);
        std::fs::create_dir_all(&state).unwrap();
        let log_path = self.dir.path().join(format!("{pod}.log"));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .unwrap();
        let mut cmd = Command::new(BIN);
        cmd.arg("run")
            .env("STREAMAPP_CONFIG", &self.config)
            .env("POD_NAME", pod)
            .env("STREAMAPP_STATE_DIR", &state)
            .env("STREAMAPP_HTTP_PORT", port.to_string())
            .env("RUST_LOG", "info,librdkafka=warn")
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("starting streamapp-processor");
        Processor {
            child: Some(child),
            pod: pod.into(),
            port,
            state,
            log: log_path,
        }
    }

    /// Produces `records` (key, value, headers) to the input, non-transactionally, with
    /// explicit record times, and waits until the broker has them.
    pub fn produce(&self, records: &[Input]) {
        let producer: BaseProducer = kafka::client_config()
            .set("linger.ms", "5")
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
        producer.flush(Duration::from_secs(30)).unwrap();
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
                value: m.payload().map(<[u8]>::to_vec),
                headers,
                partition: m.partition(),
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
    pub value: Option<Vec<u8>>,
    pub headers: HashMap<String, String>,
    pub partition: i32,
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
    child: Option<Child>,
    pub pod: String,
    pub port: u16,
    pub state: PathBuf,
    pub log: PathBuf,
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
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().unwrap()) {
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

    /// SIGKILL: no drain, no flush, an open transaction left behind.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Runs `streamapp-processor drain` against this processor (as the preStop hook does).
    pub fn drain(&mut self) -> std::process::Output {
        Command::new(BIN)
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

    /// Waits for the process to exit; returns its exit code.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = Instant::now() + timeout;
        let child = self.child.as_mut().expect("process was started");
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                self.child = None;
                return status.code();
            }
            assert!(
                Instant::now() < deadline,
                "processor {} did not exit within {timeout:?}:\n{}",
                self.pod,
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn log_tail(&self) -> String {
        let text = self.log_text();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// The processor's health file.
    pub fn health(&self) -> streamapp_api::health::ProcessorHealth {
        let bytes = std::fs::read(self.state.join(streamapp_api::health::HEALTH_FILE))
            .expect("health file");
        serde_json::from_slice(&bytes).expect("health file parses")
    }
}

impl Drop for Processor {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// `streamapp-processor inspect --json <dir>`.
pub fn inspect(state: &Path) -> serde_json::Value {
    let out = Command::new(BIN)
        .args(["inspect", "--json"])
        .arg(state)
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(out.status.success(), "inspect failed");
    serde_json::from_slice(&out.stdout).expect("inspect prints JSON")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
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
