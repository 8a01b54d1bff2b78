//! Reference systems: programs that do a topology's Kafka work and nothing else, the floor a
//! real system is measured against. Each runs as the benchmark program itself re-executed
//! (`<bench> copy|skeleton <args>`), so that its CPU and memory are its own, with the
//! processor's client settings and commit interval:
//! - [`copy`]: a plain transactional copy, one consume and one produce per record (the old
//!   ceiling, kept as a reference row);
//! - [`skeleton`]: the dedup topology's Kafka work — the same topics, consumes, produces,
//!   headers and transactions as `streamapp-processor` — with an in-memory set where the
//!   processor has its store. What streamapp spends beyond it is the store and the engine.
//!
//! Both stop when the driver closes their stdin, commit what is open and log their commit
//! figures ([`stop_and_report`] prints them). Neither ever aborts: any error ends the run.

pub mod copy;
pub mod skeleton;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::producer::{BaseProducer, Producer};
use rdkafka::{Offset, TopicPartitionList};
use testbed::kafka;

use super::{COMMIT_INTERVAL, System, system_properties};
use streamapp_processor::engine::commit_due;

/// Which reference program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reference {
    Copy,
    Skeleton,
}

impl Reference {
    fn arg(self) -> &'static str {
        match self {
            Reference::Copy => "copy",
            Reference::Skeleton => "skeleton",
        }
    }
}

/// When this process was started as a reference child: which one, and its arguments.
pub fn child() -> Option<(Reference, Vec<String>)> {
    // `cargo bench` passes `--bench`; a child is started as `<self> copy|skeleton <args>`.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let reference = match args.first().map(String::as_str) {
        Some("copy") => Reference::Copy,
        Some("skeleton") => Reference::Skeleton,
        _ => return None,
    };
    Some((reference, args[1..].to_vec()))
}

/// Runs the child this process was started as (see [`child`]).
pub fn run_child(reference: Reference, args: &[String]) {
    match reference {
        Reference::Copy => copy::run(args),
        Reference::Skeleton => skeleton::run(args),
    }
}

/// Starts `reference` for the application `group` reading `input`, its producer lingering
/// `linger_ms`: this program re-executed as `<reference> <input> <linger.ms> <args...> <group>
/// <ready file>`.
pub fn start(
    reference: Reference,
    work: &Path,
    group: &str,
    input: &str,
    linger_ms: u32,
    args: &[&str],
) -> System {
    let dir = work.join(group);
    std::fs::create_dir_all(&dir).unwrap();
    let ready = dir.join("ready");
    let mut command = super::system_command(std::env::current_exe().unwrap());
    command
        .arg(reference.arg())
        .arg(input)
        .arg(linger_ms.to_string())
        .args(args)
        .arg(group)
        .arg(&ready);
    let log = dir.join(format!("{}.log", reference.arg()));
    System::start_peer(reference.arg(), command, group, input, ready, log)
}

/// Stops a reference system and prints the commit summary it logs on exit.
pub fn stop_and_report(system: System) {
    let (log, name) = (system.log.clone(), system.name.clone());
    system.stop();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    if let Some(line) = text.lines().rev().find(|l| l.starts_with("transactions:")) {
        println!("  {name} {line}");
    }
}

/// The consume–produce loop both references share: `topics` read by one consumer of `group`
/// (read_committed, offsets committed in the transactions), one transactional producer, a
/// transaction begun at the first record after a commit and committed every
/// [`COMMIT_INTERVAL`] counted as the engine counts it ([`commit_due`]), the producer lingering
/// `linger_ms`. `handle` sends what one record makes; `ready` is written once the consumer has
/// partitions.
fn run_transactions(
    group: &str,
    topics: &[&str],
    ready: &str,
    linger_ms: &str,
    mut handle: impl FnMut(&BaseProducer, &BorrowedMessage<'_>),
) {
    // The processor's consumer and producer settings, so that only the topology differs.
    let mut client = kafka::client_config();
    for (k, v) in system_properties() {
        client.set(k, v);
    }
    let mut consumer_cfg = client.clone();
    streamapp_processor::engine::bound_consumer_buffer(&mut consumer_cfg);
    let consumer: BaseConsumer = consumer_cfg
        .set("group.id", group)
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("partition.assignment.strategy", "range")
        .create()
        .expect("consumer");
    consumer.subscribe(topics).expect("subscribe");
    let producer: BaseProducer = client
        .set("transactional.id", format!("{group}-reference"))
        .set("enable.idempotence", "true")
        .set("linger.ms", linger_ms)
        .set("queue.buffering.max.kbytes", "65536")
        .create()
        .expect("producer");
    producer
        .init_transactions(Duration::from_secs(30))
        .expect("init_transactions");

    // Stop when the driver closes our stdin.
    let stop = Arc::new(AtomicBool::new(false));
    let stop_flag = stop.clone();
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
        stop_flag.store(true, Ordering::Relaxed);
    });

    let mut announced = false;
    let mut commits = CommitStats::default();
    let mut positions = Positions::new(topics);
    let mut txn_started: Option<Instant> = None;
    let mut last_commit: Option<Instant> = None;
    while !stop.load(Ordering::Relaxed) {
        let polled = consumer.poll(Duration::from_millis(50));
        if !announced && consumer.assignment().is_ok_and(|a| a.count() > 0) {
            std::fs::write(ready, b"").expect("ready file");
            announced = true;
        }
        match polled {
            Some(Ok(m)) => {
                if txn_started.is_none() {
                    producer.begin_transaction().expect("begin_transaction");
                    txn_started = Some(Instant::now());
                }
                handle(&producer, &m);
                positions.consumed(&m);
            }
            Some(Err(e)) => eprintln!("consumer error: {e}"),
            None => {}
        }
        producer.poll(Duration::ZERO);
        let now = Instant::now();
        if commit_due(txn_started, last_commit, now, COMMIT_INTERVAL) {
            last_commit = Some(now);
            commits.time(|| commit(&consumer, &producer, &mut positions));
            txn_started = None;
        }
    }
    if txn_started.is_some() {
        commits.time(|| commit(&consumer, &producer, &mut positions));
    }
    // Read by the driver (stop_and_report) from this process's log.
    eprintln!(
        "transactions: {} committed, mean commit {:.1} ms",
        commits.count,
        commits.mean_ms()
    );
}

/// The next offset of each partition of each topic read in the open transaction.
struct Positions {
    topics: Vec<String>,
    next: Vec<Vec<Option<i64>>>,
}

impl Positions {
    fn new(topics: &[&str]) -> Self {
        Positions {
            topics: topics.iter().map(|t| t.to_string()).collect(),
            next: vec![Vec::new(); topics.len()],
        }
    }

    fn consumed(&mut self, m: &BorrowedMessage<'_>) {
        let t = self
            .topics
            .iter()
            .position(|t| t == m.topic())
            .expect("a subscribed topic");
        let (next, p) = (&mut self.next[t], m.partition() as usize);
        if next.len() <= p {
            next.resize(p + 1, None);
        }
        next[p] = Some(m.offset() + 1);
    }

    /// The positions to commit, forgotten here.
    fn take(&mut self) -> TopicPartitionList {
        let mut tpl = TopicPartitionList::new();
        for (topic, next) in self.topics.iter().zip(&mut self.next) {
            for (p, pos) in next.iter_mut().enumerate() {
                if let Some(o) = pos.take() {
                    tpl.add_partition_offset(topic, p as i32, Offset::Offset(o))
                        .unwrap();
                }
            }
        }
        tpl
    }
}

/// How long commits (send_offsets_to_transaction + commit_transaction) take.
#[derive(Default)]
struct CommitStats {
    count: u64,
    total: Duration,
}

impl CommitStats {
    fn time(&mut self, f: impl FnOnce()) {
        let start = Instant::now();
        f();
        self.count += 1;
        self.total += start.elapsed();
    }

    fn mean_ms(&self) -> f64 {
        self.total.as_secs_f64() * 1000.0 / self.count.max(1) as f64
    }
}

/// Commits the open transaction with the consumed positions (exactly-once: output and
/// offsets together).
fn commit(consumer: &BaseConsumer, producer: &BaseProducer, positions: &mut Positions) {
    let tpl = positions.take();
    let group = consumer.group_metadata().expect("group metadata");
    // As the processor does (see there why).
    streamapp_processor::engine::await_deliveries(producer, Duration::from_secs(10));
    producer
        .send_offsets_to_transaction(&tpl, &group, Duration::from_secs(10))
        .expect("send_offsets_to_transaction");
    producer
        .commit_transaction(Duration::from_secs(10))
        .expect("commit_transaction");
}
