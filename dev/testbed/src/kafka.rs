//! The local Kafka broker: its address, topics, and small helpers to produce and read.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::ToBytes;
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

/// Default port of dev/kafka.sh.
const DEFAULT_BOOTSTRAP: &str = "127.0.0.1:19092";
const HOW_TO_START: &str = "start it with `make up` (or `dev/kafka.sh start`)";

/// The bootstrap servers of the local broker (`$STREAMAPP_KAFKA_BOOTSTRAP` or
/// 127.0.0.1:19092). The first call in a process panics, naming the service, when no broker
/// answers there. Later calls do not ask again: a test that stops, freezes or restarts the
/// broker is not a broker nobody started, and its own waits say what did not come back.
pub fn bootstrap() -> String {
    static CHECKED: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    CHECKED
        .get_or_init(|| {
            let servers = std::env::var("STREAMAPP_KAFKA_BOOTSTRAP")
                .unwrap_or_else(|_| DEFAULT_BOOTSTRAP.into());
            let probe: BaseConsumer = ClientConfig::new()
                .set("bootstrap.servers", &servers)
                .create()
                .expect("creating a Kafka client");
            if let Err(e) = probe.fetch_metadata(None, Duration::from_secs(10)) {
                panic!("the Kafka broker at {servers} is not reachable ({e}): {HOW_TO_START}");
            }
            servers
        })
        .clone()
}

/// A client configuration pointing at the local broker, with the defaults the processor's own
/// clients get ([`streamapp_api::config::CLIENT_DEFAULTS`]: a client that a thawed or
/// restarted broker left with no broker bootstraps again after 10 s, not 5 min).
pub fn client_config() -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", bootstrap());
    for (key, value) in streamapp_api::config::CLIENT_DEFAULTS {
        config.set(*key, *value);
    }
    config
}

/// A client configuration for a producer of a test's input: idempotent, so that a send the
/// client retries (a timed-out request the broker did write) cannot put a record in twice —
/// an input holding a record the test did not send fails its exactly-once check for nothing.
pub fn input_producer_config() -> ClientConfig {
    let mut config = client_config();
    config.set("enable.idempotence", "true");
    config
}

/// Creates a topic with `partitions` partitions (replication factor 1) and waits until the
/// broker's metadata shows it.
pub async fn create_topic(name: &str, partitions: i32) {
    create_topic_with(name, partitions, &[]).await
}

/// Like [`create_topic`], with topic configs such as `("cleanup.policy", "compact")`.
pub async fn create_topic_with(name: &str, partitions: i32, configs: &[(&str, &str)]) {
    let admin: AdminClient<DefaultClientContext> = client_config()
        .create()
        .expect("creating a Kafka admin client");
    let mut topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
    for (k, v) in configs {
        topic = topic.set(k, v);
    }
    let results = admin
        .create_topics(
            [&topic],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
        )
        .await
        .expect("create_topics request");
    for r in results {
        if let Err((topic, code)) = r {
            panic!("creating topic {topic}: {code}");
        }
    }
}

/// A transactional producer with `transactional.id` = `txn_id`, transactions initialised.
pub fn transactional_producer(txn_id: &str) -> BaseProducer {
    let producer: BaseProducer = client_config()
        .set("transactional.id", txn_id)
        .set("enable.idempotence", "true")
        .create()
        .expect("creating a transactional producer");
    producer
        .init_transactions(Duration::from_secs(30))
        .expect("init_transactions");
    producer
}

/// Sends a record, waiting while the producer's queue is full; any other error panics.
pub fn send<K, P>(producer: &BaseProducer, mut record: BaseRecord<'_, K, P>)
where
    K: ToBytes + ?Sized,
    P: ToBytes + ?Sized,
{
    loop {
        match producer.send(record) {
            Ok(()) => return,
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                record = back;
                producer.poll(Duration::from_millis(5));
            }
            Err((e, _)) => panic!("producing to Kafka: {e}"),
        }
    }
}

/// How a reader treats records of open or aborted transactions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isolation {
    ReadCommitted,
    ReadUncommitted,
}

/// Reads every partition of `topic` from the beginning up to its current end (the last stable
/// offset under read_committed) and hands each record to `f`. Returns the number of records.
pub fn read_all(
    topic: &str,
    isolation: Isolation,
    mut f: impl FnMut(&BorrowedMessage<'_>),
) -> usize {
    let consumer: BaseConsumer = client_config()
        .set("group.id", crate::unique_name("testbed-reader"))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set(
            "isolation.level",
            match isolation {
                Isolation::ReadCommitted => "read_committed",
                Isolation::ReadUncommitted => "read_uncommitted",
            },
        )
        .create()
        .expect("creating a consumer");
    let partitions = topic_metadata(topic).topics()[0].partitions().len();
    assert!(partitions > 0, "topic {topic} does not exist");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p as i32, Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&tpl).expect("assign");
    let mut at_end = vec![false; partitions];
    let mut count = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while at_end.iter().any(|e| !e) {
        assert!(
            std::time::Instant::now() < deadline,
            "reading {topic} did not reach its end in 60 s"
        );
        match consumer.poll(Duration::from_millis(200)) {
            None => {}
            Some(Ok(m)) => {
                at_end[m.partition() as usize] = false;
                count += 1;
                f(&m);
            }
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(p))) => at_end[p as usize] = true,
            Some(Err(e)) => panic!("reading {topic}: {e}"),
        }
    }
    count
}

/// The end offset (high watermark) of every partition of `topic`, in partition order.
pub fn end_offsets(topic: &str) -> Vec<i64> {
    watermarks(topic)
        .into_iter()
        .map(|(_, high)| high)
        .collect()
}

/// How many partitions `topic` has (0 while it does not exist), from the broker's metadata.
pub fn partition_count(topic: &str) -> i32 {
    topic_metadata(topic).topics()[0].partitions().len() as i32
}

/// The broker's metadata of `topic`, asked again for up to 60 s ([`ask_again`]).
fn topic_metadata(topic: &str) -> rdkafka::metadata::Metadata {
    let new_client = || -> BaseConsumer { client_config().create().expect("creating a consumer") };
    ask_again(
        &format!("metadata of topic {topic}"),
        &mut new_client(),
        new_client,
        |c| c.fetch_metadata(Some(topic), Duration::from_secs(10)),
    )
}

/// The (low, high) watermarks of every partition of `topic`, in partition order.
fn watermarks(topic: &str) -> Vec<(i64, i64)> {
    // librdkafka's consumers read committed by default, and a read_committed client's "high"
    // watermark is the last stable offset: below another producer's open transaction, not the
    // end of the log.
    let reader = || -> BaseConsumer {
        client_config()
            .set("isolation.level", "read_uncommitted")
            .create()
            .expect("creating a consumer")
    };
    let mut consumer = reader();
    let partitions = partition_count(topic);
    (0..partitions)
        .map(|p| {
            ask_again(
                &format!("watermarks of {topic}/{p}"),
                &mut consumer,
                reader,
                |c| c.fetch_watermarks(topic, p, Duration::from_secs(10)),
            )
        })
        .collect()
}

/// `ask`s the broker through `client` until it answers, for up to 60 s, replacing `client`
/// with a new one after each failure; panics with `what` and the last error after that.
///
/// A broker just restarted or thawed answers "not leader" for a moment, and a client that
/// asked it then can keep a metadata cache without the partition ("Unknown partition"). It
/// can also still be fenced for a moment after `wait_until_leading` saw it lead (its
/// controller session expires once the process runs again), and a client that asks then is
/// left with no broker to ask ("Broker transport failure"): a CI run's `produce` right after
/// a freeze failed so.
fn ask_again<T>(
    what: &str,
    client: &mut BaseConsumer,
    new_client: impl Fn() -> BaseConsumer,
    ask: impl Fn(&BaseConsumer) -> Result<T, KafkaError>,
) -> T {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        match ask(client) {
            Ok(answer) => return answer,
            Err(e) if std::time::Instant::now() < deadline => {
                tracing::debug!(what, error = %e, "asking the broker again");
                std::thread::sleep(Duration::from_millis(200));
                *client = new_client();
            }
            Err(e) => panic!("{what}: {e}"),
        }
    }
}

/// The offsets consumer group `group` committed on every partition of `topic` (None where it
/// committed nothing), in partition order.
pub fn committed_offsets(group: &str, topic: &str) -> Vec<Option<i64>> {
    try_committed_offsets(group, topic)
        .unwrap_or_else(|e| panic!("committed offsets of group {group}: {e}"))
}

fn try_committed_offsets(group: &str, topic: &str) -> Result<Vec<Option<i64>>, KafkaError> {
    let consumer: BaseConsumer = client_config()
        .set("group.id", group)
        .create()
        .expect("creating a consumer");
    let partitions = partition_count(topic);
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    let committed = consumer.committed_offsets(tpl, Duration::from_secs(10))?;
    Ok((0..partitions)
        .map(
            |p| match committed.find_partition(topic, p).map(|e| e.offset()) {
                Some(Offset::Offset(o)) => Some(o),
                _ => None,
            },
        )
        .collect())
}

/// Whether a read_committed reader starting at the offsets group `group` committed on `topic`
/// finds no record: everything committed to the topic has been processed and committed by the
/// group. Unlike comparing with the end offsets, this holds for topics written in transactions
/// (whose ends are commit markers, not records). False while the group has no offsets yet for
/// a partition that has records.
fn group_has_read_everything(group: &str, topic: &str) -> Result<bool, KafkaError> {
    let committed = try_committed_offsets(group, topic)?;
    let consumer: BaseConsumer = client_config()
        .set("group.id", crate::unique_name("testbed-probe"))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", "read_committed")
        .create()
        .expect("creating a consumer");
    let mut tpl = TopicPartitionList::new();
    for (p, c) in committed.iter().enumerate() {
        let offset = c.map_or(Offset::Beginning, Offset::Offset);
        tpl.add_partition_offset(topic, p as i32, offset).unwrap();
    }
    consumer.assign(&tpl)?;
    let mut at_end = vec![false; committed.len()];
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while at_end.iter().any(|e| !e) && std::time::Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(200)) {
            None => {}
            Some(Ok(_)) => return Ok(false),
            Some(Err(KafkaError::PartitionEOF(p))) => at_end[p as usize] = true,
            Some(Err(e)) => return Err(e),
        }
    }
    Ok(at_end.iter().all(|e| *e))
}

/// Waits until consumer group `group` has processed and committed every record committed to
/// `topic` so far; for topics written in transactions too (see [`group_has_read_everything`]).
/// Panics after `timeout`, with the offsets.
pub fn wait_for_group_read_everything(group: &str, topic: &str, timeout: Duration) {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if group_has_read_everything(group, topic).unwrap_or(false) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "group {group} did not process everything committed to {topic} in {timeout:?}: committed {:?}, ends {:?}",
            try_committed_offsets(group, topic),
            end_offsets(topic)
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The start offset (low watermark) of every partition of `topic`, in partition order: where
/// records before it were deleted (retention, or a delete-records request).
pub fn start_offsets(topic: &str) -> Vec<i64> {
    watermarks(topic).into_iter().map(|(low, _)| low).collect()
}

/// Waits until consumer group `group` has committed the end of every partition of `topic`:
/// everything produced before the call has been processed and its results committed. For
/// topics written without transactions (no markers at their end). Panics after `timeout`, with
/// the offsets. A group coordinator that is not available yet (a broker just restarted) counts
/// as "not yet".
pub fn wait_for_group_caught_up(group: &str, topic: &str, timeout: Duration) {
    let ends = end_offsets(topic);
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let committed = try_committed_offsets(group, topic);
        let done = committed.as_ref().is_ok_and(|committed| {
            committed
                .iter()
                .zip(&ends)
                .all(|(c, end)| *end == 0 || c.is_some_and(|c| c >= *end))
        });
        if done {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "group {group} did not commit the end of {topic} in {timeout:?}: committed {committed:?}, ends {ends:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Members of consumer group `group` as its coordinator lists them (0 when it has none).
pub fn group_members(group: &str) -> usize {
    let consumer: BaseConsumer = client_config().create().expect("creating a consumer");
    let list = consumer
        .fetch_group_list(Some(group), Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("listing group {group}: {e}"));
    list.groups()
        .iter()
        .find(|g| g.name() == group)
        .map_or(0, |g| g.members().len())
}

/// The state of consumer group `group` as its coordinator describes it (`Dead` for a group
/// it does not know).
pub fn group_state(group: &str) -> String {
    let consumer: BaseConsumer = client_config().create().expect("creating a consumer");
    let list = consumer
        .fetch_group_list(Some(group), Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("describing group {group}: {e}"));
    list.groups()
        .iter()
        .find(|g| g.name() == group)
        .map_or_else(|| "Dead".to_string(), |g| g.state().to_string())
}

/// Whether `topic` exists (its metadata lists partitions).
pub fn topic_exists(topic: &str) -> bool {
    topic_metadata(topic)
        .topics()
        .iter()
        .any(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty())
}

/// Kills the local broker with SIGKILL (no clean shutdown: open transactions and unflushed
/// logs left as a crash leaves them), then starts it again with `dev/kafka.sh start` and waits
/// until it answers. For tests of recovery from a broker crash.
///
/// Only ever the broker of the test's own test bed: the pid comes from
/// `$STREAMAPP_RUN/kafka/kafka.pid`, and that process must live in the network namespace this
/// test runs in (tests run inside it, `dev/net.sh exec`), or this panics without touching it.
pub fn kill_and_restart_broker() {
    restart_broker("KILL");
}

/// Stops the local broker with SIGTERM (a clean shutdown: it finishes its writes and closes
/// its logs), then starts it again as [`kill_and_restart_broker`] does.
pub fn restart_broker_cleanly() {
    restart_broker("TERM");
}

/// Stops the local broker cleanly, keeps it away for `away`, then starts it again as
/// [`restart_broker_cleanly`] does: a broker down for longer than a client's request timeouts.
pub fn stop_broker_for(away: Duration) {
    let pid = broker_pid();
    signal_broker(pid, "TERM");
    while std::path::Path::new(&format!("/proc/{pid}")).exists() {
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(away);
    start_broker();
}

/// Freezes the local broker (SIGSTOP) for `away`, then lets it go on (SIGCONT): its
/// connections stay open and what clients send meanwhile waits in its sockets, to be handled
/// when it runs again — a request a client gave up on can still take effect.
pub fn freeze_broker_for(away: Duration) {
    let pid = broker_pid();
    signal_broker(pid, "STOP");
    std::thread::sleep(away);
    signal_broker(pid, "CONT");
    // Thawed after 145 s it has answered UnknownPartition, or listed partitions without a
    // leader, for more than 60 s in some runs (though its log had the leaders back within
    // seconds): wait until it serves every partition again.
    wait_until_leading("the thawed broker");
}

fn signal_broker(pid: u32, signal: &str) {
    let sent = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .expect("running kill");
    assert!(sent.success(), "kill -{signal} {pid} failed");
}

/// The pid of the test bed's broker, checked to be in this test's network namespace.
fn broker_pid() -> u32 {
    let run = crate::run_dir();
    let pidfile = run.join("kafka/kafka.pid");
    let pid: u32 = std::fs::read_to_string(&pidfile)
        .unwrap_or_else(|e| {
            panic!(
                "reading {}: {e}: is dev/kafka.sh running the broker?",
                pidfile.display()
            )
        })
        .trim()
        .parse()
        .expect("a pid in kafka.pid");
    let ns = |p: &str| std::fs::read_link(format!("/proc/{p}/ns/net")).ok();
    let (theirs, ours) = (ns(&pid.to_string()), ns("self"));
    assert!(
        theirs.is_some() && theirs == ours,
        "the broker (pid {pid}) is not in this test's network namespace ({theirs:?} vs {ours:?}): \
         refusing to signal it; run the tests with `dev/net.sh exec`"
    );
    pid
}

fn restart_broker(signal: &str) {
    let pid = broker_pid();
    signal_broker(pid, signal);
    while std::path::Path::new(&format!("/proc/{pid}")).exists() {
        std::thread::sleep(Duration::from_millis(100));
    }
    start_broker();
}

/// Starts the local broker with `dev/kafka.sh start` and waits until it leads every partition.
fn start_broker() {
    let script = crate::dev_dir().join("kafka.sh");
    let out = std::process::Command::new(&script)
        .arg("start")
        .output()
        .expect("running dev/kafka.sh start");
    assert!(
        out.status.success(),
        "dev/kafka.sh start failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    wait_until_leading("the restarted broker");
}

/// What keeps the broker from serving every partition, as `topic[/partition]: why` lines
/// (empty when it serves them all); an error when it does not answer at all.
fn unled_partitions(probe: &BaseConsumer) -> Result<Vec<String>, String> {
    let md = probe
        .fetch_metadata(None, Duration::from_secs(10))
        .map_err(|e| format!("no metadata: {e}"))?;
    let mut unled = Vec::new();
    for t in md.topics() {
        if let Some(e) = t.error() {
            unled.push(format!("{}: {:?}", t.name(), e));
        } else if t.partitions().is_empty() {
            unled.push(format!("{}: no partitions", t.name()));
        }
        for p in t.partitions() {
            if let Some(e) = p.error() {
                unled.push(format!("{}/{}: {:?}", t.name(), p.id(), e));
            } else if p.leader() < 0 {
                unled.push(format!("{}/{}: no leader", t.name(), p.id()));
            }
        }
    }
    Ok(unled)
}

/// How long a restarted or thawed broker may take to serve every partition again.
const LEADING_AGAIN_TIMEOUT: Duration = Duration::from_secs(180);

/// Waits until the broker lists every topic (the internal ones too) with its partitions, each
/// with a leader: serving again after a restart or a freeze.
///
/// Each attempt asks through a client of its own. A broker thawed after its controller session
/// expired is fenced for a moment, and a metadata response then lists no broker at all;
/// librdkafka drops every broker such a response leaves out, the bootstrap one included, and
/// bootstraps again only after `metadata.recovery.rebootstrap.trigger.ms` (5 min): one
/// long-lived probe stayed without a connection ("Broker transport failure") for the whole
/// wait in a CI run, though the broker served again.
fn wait_until_leading(who: &str) {
    let deadline = std::time::Instant::now() + LEADING_AGAIN_TIMEOUT;
    loop {
        let probe: BaseConsumer = client_config().create().expect("creating a consumer");
        let unled = unled_partitions(&probe);
        if unled.as_ref().is_ok_and(Vec::is_empty) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{who} did not lead its partitions within {LEADING_AGAIN_TIMEOUT:?}: {}",
            match unled {
                Ok(unled) => format!(
                    "{} not served, e.g. {}",
                    unled.len(),
                    unled[..unled.len().min(10)].join(", ")
                ),
                Err(e) => e,
            }
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Runs one of Kafka's command-line tools against the local broker (`dev/kafka.sh tool CLASS
/// ARGS...`, the class first in `args`) and returns what it printed; panics with its output when
/// it fails.
pub fn tool(args: &[&str]) -> String {
    let out = std::process::Command::new(crate::dev_dir().join("kafka.sh"))
        .arg("tool")
        .args(args)
        .output()
        .expect("running dev/kafka.sh tool");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "dev/kafka.sh tool {} failed:\n{text}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// Adds an ACL with Kafka's own `kafka-acls.sh`: `principal` (`User:NAME`) may do
/// `operations` on `topic`. The broker's authorizer then refuses the other operations on that
/// topic to every principal but the super user (the plain listeners' `User:ANONYMOUS`).
pub fn allow(principal: &str, operations: &[&str], topic: &str) {
    let mut args = vec![
        "org.apache.kafka.tools.AclCommand",
        "--add",
        "--allow-principal",
        principal,
        "--topic",
        topic,
    ];
    for operation in operations {
        args.extend(["--operation", operation]);
    }
    tool(&args);
}

/// The table Kafka's `kafka-transactions.sh` prints for `args` (`describe --transactional-id
/// ID`, `describe-producers --topic T --partition P`, ...): one map of columns by name per row.
pub fn transactions_tool_table(args: &[&str]) -> Vec<std::collections::BTreeMap<String, String>> {
    let mut all = vec!["org.apache.kafka.tools.TransactionsCommand"];
    all.extend_from_slice(args);
    let text = tool(&all);
    // A header line and a row per line, tab-separated.
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header: Vec<String> = lines
        .next()
        .unwrap_or_default()
        .split('\t')
        .map(|h| h.trim().to_string())
        .collect();
    lines
        .map(|row| {
            header
                .iter()
                .cloned()
                .zip(row.split('\t').map(|v| v.trim().to_string()))
                .collect()
        })
        .collect()
}

/// What the transaction coordinator holds for a transactional id, by Kafka's own
/// `kafka-transactions.sh describe`: its columns (`TransactionState`, `TransactionTimeoutMs`,
/// ...) by name.
pub fn describe_transaction(transactional_id: &str) -> std::collections::BTreeMap<String, String> {
    transactions_tool_table(&["describe", "--transactional-id", transactional_id])
        .into_iter()
        .next()
        .unwrap_or_default()
}

/// The `transaction.timeout.ms` the transaction coordinator holds for a transactional id
/// (what its producer asked for).
pub fn transaction_timeout_ms(transactional_id: &str) -> u64 {
    let described = describe_transaction(transactional_id);
    described
        .get("TransactionTimeoutMs")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no timeout for {transactional_id} in {described:?}"))
}

/// Deletes a topic and waits until the broker's metadata no longer shows it.
pub async fn delete_topic(name: &str) {
    let admin: AdminClient<DefaultClientContext> = client_config()
        .create()
        .expect("creating a Kafka admin client");
    let results = admin
        .delete_topics(
            &[name],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
        )
        .await
        .expect("delete_topics request");
    for r in results {
        if let Err((topic, code)) = r {
            panic!("deleting topic {topic}: {code}");
        }
    }
    let probe: BaseConsumer = client_config().create().expect("creating a consumer");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let md = probe
            .fetch_metadata(Some(name), Duration::from_secs(10))
            .expect("metadata");
        let gone = md
            .topics()
            .first()
            .is_none_or(|t| t.error().is_some() || t.partitions().is_empty());
        if gone {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "topic {name} still there 30 s after its deletion"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The value of config `key` of `topic`, as the broker describes it.
pub async fn topic_config(topic: &str, key: &str) -> Option<String> {
    use rdkafka::admin::ResourceSpecifier;
    let admin: AdminClient<DefaultClientContext> = client_config()
        .create()
        .expect("creating a Kafka admin client");
    let described = admin
        .describe_configs([&ResourceSpecifier::Topic(topic)], &AdminOptions::new())
        .await
        .expect("describe_configs request");
    let resource = described
        .into_iter()
        .next()
        .expect("one answer")
        .unwrap_or_else(|code| panic!("describing {topic}: {code}"));
    resource.get(key).and_then(|e| e.value.clone())
}

/// The broker's SASL_SSL listener (dev/kafka.sh): TLS with the test bed's own CA, SASL PLAIN
/// and SCRAM-SHA-256/512 for one test user.
pub struct SecureListener {
    pub bootstrap: String,
    /// The CA that signed the broker's certificate (PEM).
    pub ca_file: std::path::PathBuf,
    pub username: String,
    pub password: String,
}

impl SecureListener {
    /// librdkafka properties for this listener with `mechanism`.
    pub fn properties(&self, mechanism: &str) -> Vec<(&'static str, String)> {
        vec![
            ("security.protocol", "SASL_SSL".into()),
            ("sasl.mechanism", mechanism.into()),
            ("sasl.username", self.username.clone()),
            ("sasl.password", self.password.clone()),
            ("ssl.ca.location", self.ca_file.display().to_string()),
        ]
    }
}

/// The secure listener (`$STREAMAPP_KAFKA_SECURE_BOOTSTRAP` or 127.0.0.1:19095). Panics,
/// naming the service, when it is not set up or does not answer.
pub fn secure_listener() -> SecureListener {
    let bootstrap = std::env::var("STREAMAPP_KAFKA_SECURE_BOOTSTRAP")
        .unwrap_or_else(|_| "127.0.0.1:19095".into());
    let tls = crate::run_dir().join("kafka").join("tls");
    let user = std::fs::read_to_string(tls.join("user")).unwrap_or_else(|e| {
        panic!(
            "the Kafka broker's SASL_SSL listener is not set up ({}: {e}): {HOW_TO_START}",
            tls.display()
        )
    });
    let mut lines = user.lines();
    let (Some(username), Some(password)) = (lines.next(), lines.next()) else {
        panic!("{} holds no user and password", tls.join("user").display());
    };
    if let Err(e) = std::net::TcpStream::connect_timeout(
        &bootstrap.parse().expect("an IP address and port"),
        Duration::from_secs(5),
    ) {
        panic!(
            "the Kafka broker's SASL_SSL listener at {bootstrap} does not answer ({e}): {HOW_TO_START}"
        );
    }
    SecureListener {
        bootstrap,
        ca_file: tls.join("ca.crt"),
        username: username.to_string(),
        password: password.to_string(),
    }
}
