//! The ceiling reference: a plain transactional copy (consume → produce in transactions, the
//! processor's client settings and commit interval, no store), run as the benchmark program
//! itself re-executed with `copy` so that its CPU and memory are its own.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use testbed::kafka;

use super::{COMMIT_INTERVAL, PARTITIONS, System, system_properties};

/// The command line of the copy child: `<bench program> copy <args>`.
pub fn is_copy_child() -> Option<Vec<String>> {
    // `cargo bench` passes `--bench`; the copy child is started as `<self> copy <args>`.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    (args.first().map(String::as_str) == Some("copy")).then(|| args[1..].to_vec())
}

/// Starts the copy: this program re-executed as `copy <input> <output> <group> <ready file>`.
pub fn start_copy(work: &Path, group: &str, input: &str, output: &str) -> System {
    let dir = work.join(group);
    std::fs::create_dir_all(&dir).unwrap();
    let ready = dir.join("ready");
    let mut command = Command::new(std::env::current_exe().unwrap());
    command.args(["copy", input, output, group]).arg(&ready);
    System::start_peer("copy", command, group, input, ready, dir.join("copy.log"))
}

/// Stops the copy and prints the commit summary it logs on exit.
pub fn stop_and_report(copy: System) {
    let log = copy.log.clone();
    copy.stop();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    if let Some(line) = text.lines().rev().find(|l| l.starts_with("transactions:")) {
        println!("  copy {line}");
    }
}

/// `copy <input> <output> <group> <ready file>`: copies `input` to `output` exactly once,
/// with the processor's client settings and commit interval, until stdin closes.
pub fn run(args: &[String]) {
    let [input, output, group, ready] = args else {
        panic!("usage: dedup_vs_copy copy <input> <output> <group> <ready file>");
    };
    // The processor's consumer and producer settings (engine.rs), so that only the topology
    // differs.
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
    consumer.subscribe(&[input]).expect("subscribe");
    let producer: BaseProducer = client
        .set("transactional.id", format!("{group}-copy"))
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
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
    let mut positions: Vec<Option<i64>> = vec![None; PARTITIONS as usize];
    let mut txn_started: Option<Instant> = None;
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
                let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(output);
                if let Some(k) = m.key() {
                    record = record.key(k);
                }
                if let Some(v) = m.payload() {
                    record = record.payload(v);
                }
                testbed::kafka::send(&producer, record);
                positions[m.partition() as usize] = Some(m.offset() + 1);
            }
            Some(Err(e)) => eprintln!("consumer error: {e}"),
            None => {}
        }
        producer.poll(Duration::ZERO);
        if txn_started.is_some_and(|t| t.elapsed() >= COMMIT_INTERVAL) {
            commits.time(|| commit(&consumer, &producer, input, &mut positions));
            txn_started = None;
        }
    }
    if txn_started.is_some() {
        commits.time(|| commit(&consumer, &producer, input, &mut positions));
    }
    // Read by the driver (stop_and_report) from this process's log.
    eprintln!(
        "transactions: {} committed, mean commit {:.1} ms",
        commits.count,
        commits.mean_ms()
    );
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
fn commit(
    consumer: &BaseConsumer,
    producer: &BaseProducer,
    input: &str,
    positions: &mut [Option<i64>],
) {
    let mut tpl = TopicPartitionList::new();
    for (p, pos) in positions.iter_mut().enumerate() {
        if let Some(o) = pos.take() {
            tpl.add_partition_offset(input, p as i32, Offset::Offset(o))
                .unwrap();
        }
    }
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
