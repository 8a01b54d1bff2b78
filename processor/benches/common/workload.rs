//! The benchmarks' input: deterministic JSON records with an id inside, how they are keyed,
//! which earlier id a repeat repeats, the record times they carry, and how they are sent.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use testbed::kafka;

use super::{DUPLICATE_FRACTION, RECORD_BYTES, now_us};

/// A small deterministic PRNG (SplitMix64): every run uses the same data.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// How the records are keyed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keying {
    /// Key = the dedup id: every repeat lands on the partition of its first occurrence.
    Id,
    /// Keys unrelated to the id (an order number, say): repeats are spread across partitions,
    /// so a system must re-key by the id (repartition) before deduplicating.
    Unrelated,
}

/// Distinct unrelated keys: few enough that keys repeat, many enough to spread evenly.
const UNRELATED_KEYS: u64 = 100_003;

/// One generated record.
pub struct Generated {
    pub key: String,
    pub id: String,
    pub value: String,
}

/// Generates the records: with probability `duplicates` a record repeats an id drawn uniformly
/// from the ids issued so far, or from the last `recent` of them (so that every repeat falls
/// within a short retention of its first occurrence); otherwise it carries the next new id,
/// `<prefix>-<n>`.
pub struct Workload {
    rng: Rng,
    keys: Rng,
    duplicates: f64,
    prefix: String,
    keying: Keying,
    recent: Option<u64>,
    pub distinct: u64,
    seq: u64,
}

impl Workload {
    /// The benchmarks' standard input: 30% repeats, ids `cmd-<n>`, keyed by the id.
    pub fn new() -> Self {
        Self::with(DUPLICATE_FRACTION, "cmd")
    }

    pub fn with(duplicates: f64, prefix: &str) -> Self {
        Workload {
            rng: Rng(42),
            keys: Rng(7),
            duplicates,
            prefix: prefix.into(),
            keying: Keying::Id,
            recent: None,
            distinct: 0,
            seq: 0,
        }
    }

    pub fn keyed(mut self, keying: Keying) -> Self {
        self.keying = keying;
        self
    }

    /// Repeats only repeat one of the last `ids` distinct ids.
    pub fn recent(mut self, ids: u64) -> Self {
        self.recent = Some(ids.max(1));
        self
    }

    /// The id of the `n`th new id this workload issues.
    pub fn id(&self, n: u64) -> String {
        format!("{}-{n:010}", self.prefix)
    }

    /// The next record: a 200 B JSON value with the id and the send time in µs (the latency
    /// figures use it; the record timestamp is set by the sender).
    pub fn next(&mut self, sent_us: i64) -> Generated {
        let n = if self.distinct > 0 && self.rng.unit() < self.duplicates {
            let back = self.rng.next() % self.recent.unwrap_or(u64::MAX).min(self.distinct);
            self.distinct - 1 - back
        } else {
            self.distinct += 1;
            self.distinct - 1
        };
        let id = self.id(n);
        let head = format!(
            r#"{{"id":"{id}","seq":{},"sentUs":{sent_us},"payload":""#,
            self.seq
        );
        self.seq += 1;
        let pad = RECORD_BYTES.saturating_sub(head.len() + 2);
        let value = format!("{head}{}\"}}", "x".repeat(pad));
        let key = match self.keying {
            Keying::Id => id.clone(),
            Keying::Unrelated => format!("order-{}", self.keys.next() % UNRELATED_KEYS),
        };
        Generated { key, id, value }
    }
}

/// The send time a value carries (see [`Workload::next`]).
pub fn sent_us(value: &[u8]) -> Option<i64> {
    let digits = field(value, b"\"sentUs\":")?;
    let digits = &digits[..digits.iter().take_while(|b| b.is_ascii_digit()).count()];
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// The dedup id a value carries (its `"id"` field): what every system's output is checked by,
/// whatever key the system gives its output records.
pub fn id_of(value: &[u8]) -> Option<&[u8]> {
    let rest = field(value, b"\"id\":\"")?;
    Some(&rest[..rest.iter().position(|&b| b == b'"')?])
}

fn field<'a>(value: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    let at = value.windows(name.len()).position(|w| w == name)? + name.len();
    Some(&value[at..])
}

/// What was produced: counts, and the distinct ids (to check outputs against).
pub struct Dataset {
    pub records: u64,
    pub distinct: u64,
    pub value_bytes: u64,
    pub ids: HashSet<Vec<u8>>,
}

/// The record times a dataset carries.
#[derive(Clone, Copy)]
pub enum RecordTime {
    /// The time of sending.
    Now,
    /// Record `i` carries `end_ms - span + i * span / records`: record time runs at a fixed
    /// pace per record, whatever the pace of producing, and ends now (a record time ahead of
    /// the clock would be refused or held back). A run then covers `span` of record time,
    /// so that retention expiry can be made to happen in it.
    Spread { span: Duration },
}

/// A producer tuned for bulk loads.
pub fn bulk_producer() -> BaseProducer {
    kafka::input_producer_config()
        .set("linger.ms", "20")
        .set("batch.size", "1000000")
        .set("queue.buffering.max.messages", "500000")
        .create()
        .expect("producer")
}

/// Produces `records` records of `workload` into `topic` as fast as the broker takes them.
pub fn produce_dataset(
    topic: &str,
    records: u64,
    mut workload: Workload,
    time: RecordTime,
) -> Dataset {
    let producer = bulk_producer();
    let mut value_bytes = 0;
    let mut ids = HashSet::new();
    let start_ms = now_us() / 1000;
    for i in 0..records {
        let record = workload.next(now_us());
        value_bytes += record.value.len() as u64;
        let timestamp = match time {
            RecordTime::Now => now_us() / 1000,
            RecordTime::Spread { span } => {
                let span = span.as_millis() as i64;
                start_ms - span + (i as f64 * span as f64 / records as f64) as i64
            }
        };
        send_at(&producer, topic, &record, timestamp);
        ids.insert(record.id.into_bytes());
    }
    producer
        .flush(Duration::from_secs(300))
        .expect("flushing the input");
    Dataset {
        records,
        distinct: workload.distinct,
        value_bytes,
        ids,
    }
}

/// Sends one record, timestamped now.
pub fn send(producer: &BaseProducer, topic: &str, record: &Generated) {
    send_at(producer, topic, record, now_us() / 1000);
}

pub fn send_at(producer: &BaseProducer, topic: &str, record: &Generated, timestamp_ms: i64) {
    kafka::send(
        producer,
        BaseRecord::to(topic)
            .key(record.key.as_bytes())
            .payload(record.value.as_bytes())
            .timestamp(timestamp_ms),
    );
}

/// Sends `workload`'s records to `topic` at `rate` records/s until `keep_going` (called about
/// every millisecond with the time since the start and the count sent) says stop, paced by
/// the clock (every record at its due time, not in bursts per second). Calls `on_send` with
/// each record's id; returns how many were sent. The caller flushes.
pub fn send_paced_while(
    producer: &BaseProducer,
    topic: &str,
    workload: &mut Workload,
    rate: u64,
    mut keep_going: impl FnMut(Duration, u64) -> bool,
    mut on_send: impl FnMut(String),
) -> u64 {
    let start = Instant::now();
    let mut sent: u64 = 0;
    while keep_going(start.elapsed(), sent) {
        let due = (start.elapsed().as_secs_f64() * rate as f64) as u64;
        while sent < due {
            let record = workload.next(now_us());
            send(producer, topic, &record);
            on_send(record.id);
            sent += 1;
        }
        producer.poll(Duration::ZERO);
        std::thread::sleep(Duration::from_millis(1));
    }
    sent
}

/// [`send_paced_while`] for a fixed `duration`.
pub fn send_paced(
    producer: &BaseProducer,
    topic: &str,
    workload: &mut Workload,
    rate: u64,
    duration: Duration,
    on_send: impl FnMut(String),
) -> u64 {
    send_paced_while(
        producer,
        topic,
        workload,
        rate,
        |elapsed, _| elapsed < duration,
        on_send,
    )
}

pub fn describe_dataset(dataset: &Dataset, seconds: f64) {
    let repeats = dataset.records - dataset.distinct;
    println!(
        "input: {} records, {} distinct ids, {repeats} repeats ({:.1}%), {:.0} B values on average, produced in {seconds:.1} s",
        dataset.records,
        dataset.distinct,
        100.0 * repeats as f64 / dataset.records as f64,
        dataset.value_bytes as f64 / dataset.records as f64,
    );
}
