//! What a lost node costs, measured (printed into the end-to-end report, never asserted): the
//! time from the node's loss to the first committed output of the partitions its pod was
//! processing, and to full standby coverage again.
//!
//! A steady input of new ids goes in meanwhile, so each partition has something to commit as
//! soon as someone processes it. A first-seen id's changelog record is committed in the same
//! transaction as its output, on the changelog partition of its task: the first record a
//! read_committed reader gets past where that partition stood at the loss is that partition's
//! first committed output.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdkafka::Message;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use streamapp_api::crd::StreamAppStatus;
use streamapp_api::status_values::TaskState;
use streamapp_e2e::{Scenario, Sent};

/// The partitions `pod` processes (its active tasks), from the status.
pub fn active_partitions(status: &StreamAppStatus, pod: &str) -> Vec<i32> {
    status
        .pods
        .iter()
        .filter(|p| p.name == pod)
        .flat_map(|p| &p.tasks)
        .filter(|t| t.state == Some(TaskState::Active))
        .map(|t| t.partition)
        .collect()
}

/// The changelog's last stable offset on each of `partitions`: where each stands now for a
/// read_committed reader.
pub fn committed_ends(s: &Scenario, partitions: &[i32]) -> BTreeMap<i32, i64> {
    let changelog = streamapp_api::config::changelog_topic(&s.application_id());
    let reader: BaseConsumer = testbed::kafka::client_config()
        .set("isolation.level", "read_committed")
        .create()
        .expect("a consumer");
    partitions
        .iter()
        .map(|&p| {
            let (_, stable) = reader
                .fetch_watermarks(&changelog, p, Duration::from_secs(10))
                .expect("the changelog's watermarks");
            (p, stable)
        })
        .collect()
}

/// New ids (each sent once) into the input, 20 every 100 ms, until stopped.
pub struct SteadyInput {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Vec<String>>,
}

impl SteadyInput {
    pub fn start(s: &Scenario) -> SteadyInput {
        let stop = Arc::new(AtomicBool::new(false));
        let (topic, run) = (s.topics.input.clone(), testbed::unique_name("steady"));
        let thread = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let producer: BaseProducer = testbed::kafka::input_producer_config()
                    .set("linger.ms", "5")
                    .create()
                    .expect("a producer");
                let mut ids = Vec::new();
                while !stop.load(Ordering::SeqCst) {
                    for _ in 0..20 {
                        let id = format!("cmd-{run}-{}", ids.len());
                        let value = format!(r#"{{"commandId":"{id}","amount":1}}"#);
                        let key = format!("order-{}", ids.len() % 997);
                        testbed::kafka::send(
                            &producer,
                            BaseRecord::to(&topic).key(&key).payload(&value),
                        );
                        ids.push(id);
                    }
                    producer.poll(Duration::ZERO);
                    std::thread::sleep(Duration::from_millis(100));
                }
                producer
                    .flush(Duration::from_secs(30))
                    .expect("flushing the steady input");
                ids
            })
        };
        SteadyInput { stop, thread }
    }

    /// Stops it; what it sent joins `sent` (each id once, never a repeat).
    pub fn stop(self, sent: &mut Sent) {
        self.stop.store(true, Ordering::SeqCst);
        for id in self.thread.join().expect("the steady input") {
            sent.ids.insert(id, 1);
        }
    }
}

/// How long after `lost_at` each partition in `from` had a committed changelog record past the
/// offset it stood at: the latest of them is when the last of the lost partitions was
/// processed again. Panics after `timeout`.
fn first_committed_output(
    s: &Scenario,
    from: &BTreeMap<i32, i64>,
    lost_at: Instant,
    timeout: Duration,
) -> Duration {
    let changelog = streamapp_api::config::changelog_topic(&s.application_id());
    let reader: BaseConsumer = testbed::kafka::client_config()
        .set("isolation.level", "read_committed")
        .set("group.id", testbed::unique_name("failover-clock"))
        .set("enable.auto.commit", "false")
        .create()
        .expect("a consumer");
    let mut assignment = TopicPartitionList::new();
    for (&p, &offset) in from {
        assignment
            .add_partition_offset(&changelog, p, Offset::Offset(offset))
            .unwrap();
    }
    reader.assign(&assignment).expect("assigning the changelog");
    let mut waiting: Vec<i32> = from.keys().copied().collect();
    let deadline = lost_at + timeout;
    while !waiting.is_empty() {
        assert!(
            Instant::now() < deadline,
            "partitions {waiting:?} had no committed output within {timeout:?} of the loss"
        );
        if let Some(Ok(m)) = reader.poll(Duration::from_millis(100)) {
            waiting.retain(|&p| p != m.partition());
        }
    }
    lost_at.elapsed()
}

/// Starts a [`SteadyInput`], waits for the first committed output of the lost partitions
/// (`from`, [`committed_ends`] at the loss) and reports how long after `lost_at` it came.
/// Returns the input, still running.
pub fn measure_first_output(
    s: &Scenario,
    standbys: u32,
    from: &BTreeMap<i32, i64>,
    lost_at: Instant,
) -> SteadyInput {
    let input = SteadyInput::start(s);
    let took = first_committed_output(s, from, lost_at, Duration::from_secs(120));
    let goal = session_timeout(s) + Duration::from_secs(10);
    report(
        &format!(
            "first committed output of the lost partitions (goal: session.timeout.ms + 10 s = \
             {:.0} s, {}):",
            goal.as_secs_f64(),
            if took <= goal { "met" } else { "missed" }
        ),
        standbys,
        took,
    );
    input
}

/// The app's `session.timeout.ms`, as the example sets it (librdkafka's 45 s when it does not).
fn session_timeout(s: &Scenario) -> Duration {
    let ms = s.example()["spec"]["kafka"]["properties"]["session.timeout.ms"]
        .as_str()
        .map_or(45_000, |v| {
            v.parse().expect("session.timeout.ms is a number")
        });
    Duration::from_millis(ms)
}

/// One line of the end-to-end report about a lost node.
pub fn report(what: &str, standbys: u32, took: Duration) {
    streamapp_e2e::report(&format!(
        "node loss, standbyReplicas {standbys}: {what} {:.1} s after the node was killed",
        took.as_secs_f64()
    ));
}
