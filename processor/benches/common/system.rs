//! Running systems: a child process consuming the benchmark's input as a consumer group, how
//! far it got (its group's committed offsets, through both stages when it repartitions), what
//! tasks it runs, and how it is stopped or killed.

use super::*;

pub enum Kind {
    /// streamapp-processor: ready when /readyz answers 200; stops by POST /drain.
    Processor { port: u16 },
    /// A peer program that touches `ready` when it consumes, and stops cleanly (commits,
    /// exits) when its stdin closes.
    Peer { ready: PathBuf },
}

/// A running system: a child process consuming `input` under consumer group `group`, and
/// `repartition` too when it re-keys the input through that topic first.
pub struct System {
    pub name: String,
    pub child: Child,
    pub group: String,
    pub input: String,
    pub repartition: Option<String>,
    pub kind: Kind,
    pub log: PathBuf,
    /// The length of `log` when this process started: what it wrote itself comes after.
    pub log_start: u64,
    /// Where a Kafka Streams peer reports its tasks (see [`System::tasks`]).
    pub tasks_file: Option<PathBuf>,
}

/// An instance's stateful tasks: those it runs, the standby copies of their stores it keeps,
/// and how many changelog records those copies are behind in all.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Tasks {
    pub active: u64,
    pub standby_copies: u64,
    pub standby_lag: u64,
}

impl System {
    /// Starts a peer program (`command`, stdin piped) that consumes `input` as group `group`
    /// and touches `ready`; its output goes to `log` (appended).
    pub fn start_peer(
        name: &str,
        mut command: Command,
        group: &str,
        input: &str,
        ready: PathBuf,
        log: PathBuf,
    ) -> System {
        let _ = std::fs::remove_file(&ready);
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let log_start = log_file.metadata().map_or(0, |m| m.len());
        let child = command
            .stdin(Stdio::piped())
            .stdout(log_file.try_clone().unwrap())
            .stderr(log_file)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name}: {e}"));
        System {
            name: name.into(),
            child,
            group: group.into(),
            input: input.into(),
            repartition: None,
            kind: Kind::Peer { ready },
            log,
            log_start,
            tasks_file: None,
        }
    }

    /// What this process wrote to its log so far (an earlier start's lines left out).
    pub fn own_log(&self) -> String {
        let log = std::fs::read(&self.log).unwrap_or_default();
        let start = (self.log_start as usize).min(log.len());
        String::from_utf8_lossy(&log[start..]).into_owned()
    }

    /// Fails the run, with the child's log, when the child exited.
    pub fn check_alive(&mut self) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!(
                "{} exited with {status}; its log:\n{}",
                self.name,
                log_tail(&self.log)
            );
        }
    }

    /// Whether it consumes: the processor is ready (partitions assigned, stores restored), a
    /// peer has announced it.
    pub fn is_ready(&self) -> bool {
        match &self.kind {
            Kind::Processor { port } => {
                http(*port, "GET", streamapp_api::probe::READYZ).is_some_and(|(s, _)| s == 200)
            }
            Kind::Peer { ready } => ready.exists(),
        }
    }

    /// Waits until it consumes.
    pub fn wait_ready(&mut self) {
        self.wait_for(
            "ready",
            Instant::now(),
            STALL_TIMEOUT,
            Duration::from_millis(50),
            |s| s.is_ready().then_some(()),
        );
    }

    /// Asks `f` every `every` until it answers; fails the run, with the child's log, when the
    /// child exits or when `limit` has passed since `since` (`what`: what was waited for).
    pub fn wait_for<T>(
        &mut self,
        what: &str,
        since: Instant,
        limit: Duration,
        every: Duration,
        mut f: impl FnMut(&Self) -> Option<T>,
    ) -> T {
        loop {
            self.check_alive();
            if let Some(answer) = f(self) {
                return answer;
            }
            assert!(
                since.elapsed() < limit,
                "{}: not {what} {:?} after the start:\n{}",
                self.name,
                since.elapsed(),
                log_tail(&self.log)
            );
            std::thread::sleep(every);
        }
    }

    /// A client that reads the group's committed offsets (OffsetFetch) without joining it.
    pub fn offsets_watcher(&self) -> BaseConsumer {
        kafka::client_config()
            .set("group.id", &self.group)
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .create()
            .expect("offsets watcher")
    }

    /// How far the group got: see [`Progress`].
    pub fn progress(&self, watcher: &BaseConsumer) -> Progress {
        let input = committed(watcher, &self.input).iter().sum();
        let Some(repartition) = &self.repartition else {
            return Progress {
                input,
                repartition_backlog: 0,
            };
        };
        let ends = kafka::end_offsets(repartition);
        let done = committed(watcher, repartition);
        Progress {
            input,
            // An entry per partition is not a record: the marker the last transaction ended with.
            repartition_backlog: ends
                .iter()
                .zip(&done)
                .map(|(&end, &done)| (end as u64).saturating_sub(done + 1))
                .sum(),
        }
    }

    /// Waits until the group has committed all `total` input records — in both stages when it
    /// repartitions — failing when it stalls. Exact: once the first stage has committed the
    /// whole input, the repartition topic is complete, and the second stage is done when its
    /// committed offset of each partition is past that partition's last committed record (the
    /// commit markers after it — one per instance that wrote to it last — are not records).
    pub fn wait_done(&mut self, watcher: &BaseConsumer, total: u64) {
        self.wait_until(watcher, total, |s, w| s.progress(w).input);
        let Some(repartition) = self.repartition.clone() else {
            return;
        };
        let needed = past_last_records(&repartition);
        self.wait_until(watcher, needed.iter().sum(), |_, w| {
            committed(w, &repartition)
                .iter()
                .zip(&needed)
                .map(|(&done, &needed)| done.min(needed))
                .sum()
        });
    }

    /// Waits until `count` reaches `total`, failing when it stops moving for
    /// [`STALL_TIMEOUT`] or the child exits.
    fn wait_until(
        &mut self,
        watcher: &BaseConsumer,
        total: u64,
        count: impl Fn(&Self, &BaseConsumer) -> u64,
    ) {
        let mut last_progress = (Instant::now(), 0);
        loop {
            self.check_alive();
            let done = count(self, watcher);
            if done >= total {
                return;
            }
            if done > last_progress.1 {
                last_progress = (Instant::now(), done);
            }
            assert!(
                last_progress.0.elapsed() < STALL_TIMEOUT,
                "{} made no progress for {STALL_TIMEOUT:?} at {done}/{total}:\n{}",
                self.name,
                log_tail(&self.log)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The processor's metrics from /metrics, by sample name without the prefix.
    pub fn processor_metrics(&self) -> impl Fn(&str) -> f64 + use<> {
        let Kind::Processor { port } = self.kind else {
            unreachable!("only the processor has metrics")
        };
        let text = http(port, "GET", "/metrics")
            .map(|(_, body)| body)
            .unwrap_or_default();
        move |name: &str| {
            let prefix = format!("streamapp_processor_{name} ");
            text.lines()
                .find_map(|l| l.strip_prefix(&prefix))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(f64::NAN)
        }
    }

    /// Its stateful tasks now: the processor's health report (active tasks) and
    /// `standby_lag` series (standby copies), a Kafka Streams peer's own report; `None` before
    /// the first report.
    pub fn tasks(&self) -> Option<Tasks> {
        match &self.kind {
            Kind::Processor { port } => {
                let (_, health) = http(*port, "GET", streamapp_api::probe::HEALTH)?;
                let health: serde_json::Value = serde_json::from_str(&health).ok()?;
                let active = health["tasks"]
                    .as_array()?
                    .iter()
                    .filter(|t| t["state"] == "Active")
                    .count() as u64;
                let (_, metrics) = http(*port, "GET", "/metrics")?;
                let lags: Vec<f64> = metrics
                    .lines()
                    .filter_map(|l| {
                        let sample = l.strip_prefix("streamapp_processor_standby_lag{")?;
                        sample.rsplit(' ').next()?.trim().parse().ok()
                    })
                    .collect();
                Some(Tasks {
                    active,
                    standby_copies: lags.len() as u64,
                    standby_lag: lags.iter().sum::<f64>() as u64,
                })
            }
            Kind::Peer { .. } => {
                let report = std::fs::read_to_string(self.tasks_file.as_ref()?).ok()?;
                let field = |name: &str| -> Option<u64> {
                    report
                        .split_whitespace()
                        .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))?
                        .parse()
                        .ok()
                };
                Some(Tasks {
                    active: field("active")?,
                    standby_copies: field("standby-copies")?,
                    standby_lag: field("standby-lag")?,
                })
            }
        }
    }

    /// kill -9: no drain, no close, no flush.
    pub fn kill9(mut self) {
        self.child.kill().expect("kill -9");
        self.child.wait().expect("reaping the killed child");
    }

    /// Stops it the way it stops in production: the processor drains, a peer closes
    /// cleanly; both exit.
    pub fn stop(mut self) {
        match &self.kind {
            Kind::Processor { port } => {
                let _ = http(*port, "POST", streamapp_api::probe::DRAIN);
            }
            Kind::Peer { .. } => drop(self.child.stdin.take()),
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                eprintln!("{} did not stop within 60 s; killing it", self.name);
                let _ = self.child.kill();
                let _ = self.child.wait();
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Where a system is: input records whose offsets it committed, and records of those still in
/// its repartition topic, not yet committed by its second stage (0 without one; counted from
/// the high watermarks, so records of an open transaction count too, and the figure is exact
/// only between transactions). `done()` estimates the records through both stages.
#[derive(Clone, Copy, Debug, Default)]
pub struct Progress {
    pub input: u64,
    pub repartition_backlog: u64,
}

impl Progress {
    pub fn done(&self) -> u64 {
        self.input.saturating_sub(self.repartition_backlog)
    }
}

/// Per partition, the ends of a system's input and repartition topic next to what its group
/// (`watcher`'s) committed on them: what the summary of a wrong output shows.
pub fn offsets_report(watcher: &BaseConsumer, input: &str, repartition: Option<&str>) -> String {
    let mut lines = vec![format!(
        "input {input}: ends {:?}, committed {:?}",
        kafka::end_offsets(input),
        committed(watcher, input)
    )];
    if let Some(r) = repartition {
        lines.push(format!(
            "repartition {r}: ends {:?}, committed {:?}",
            kafka::end_offsets(r),
            committed(watcher, r)
        ));
    }
    lines.join("\n    ")
}

/// The offsets a group committed on a topic's partitions (0 where none).
pub fn committed(watcher: &BaseConsumer, topic: &str) -> Vec<u64> {
    let partitions = partitions_of(topic);
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    match watcher.committed_offsets(tpl, Duration::from_secs(5)) {
        Ok(c) => c
            .elements()
            .iter()
            .map(|e| match e.offset() {
                Offset::Offset(o) => o as u64,
                _ => 0,
            })
            .collect(),
        // Not known yet (e.g. an offset commit in flight): asked again on the next tick.
        Err(_) => vec![0; partitions as usize],
    }
}

/// Per partition of `topic`, the offset just past its last committed record: what a consumer
/// that has read everything commits. Waits until no transaction below the current end is open
/// (a killed instance's is aborted when its transaction times out), then reads each partition's
/// tail — at most [`TAIL_WINDOW`] offsets back, which holds an aborted transaction's records
/// and the commit markers.
fn past_last_records(topic: &str) -> Vec<u64> {
    const TAIL_WINDOW: i64 = 100_000;
    let ends = kafka::end_offsets(topic);
    let deadline = Instant::now() + STALL_TIMEOUT;
    let before_deadline = |what: &str| {
        assert!(
            Instant::now() < deadline,
            "{topic}: {what} within {STALL_TIMEOUT:?}"
        )
    };
    // The last stable offsets, from the statistics of a read_committed consumer at the end.
    let reader = || {
        let mut config = kafka::client_config();
        config
            .set("group.id", "bench-tail-reader")
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed");
        config
    };
    let stable: BaseConsumer<StableOffsets> = reader()
        .set("statistics.interval.ms", "100")
        .create_with_context(StableOffsets::default())
        .expect("last stable offset reader");
    let mut list = TopicPartitionList::new();
    for p in 0..ends.len() {
        list.add_partition_offset(topic, p as i32, Offset::End)
            .expect("end offset");
    }
    stable.assign(&list).expect("assign the ends");
    while (0..ends.len()).any(|p| {
        let lso = stable.context().0.lock().unwrap().get(&(p as i32)).copied();
        lso.is_none_or(|lso| lso < ends[p])
    }) {
        before_deadline("no transaction left open below the end");
        let _ = stable.poll(Duration::from_millis(100));
    }
    // Every record below the end is now committed or aborted: read up to the end, from the
    // window's start or the log's, whichever is later (a system may have deleted the records
    // it consumed, as both do with their repartition topics).
    let tail: BaseConsumer = reader()
        .set("enable.partition.eof", "true")
        // Deleted meanwhile: from the log's new start.
        .set("auto.offset.reset", "earliest")
        .create()
        .expect("tail reader");
    let mut past_last = Vec::new();
    let mut list = TopicPartitionList::new();
    for (p, &end) in ends.iter().enumerate() {
        let (log_start, _) = tail
            .fetch_watermarks(topic, p as i32, Duration::from_secs(10))
            .expect("fetch_watermarks");
        let from = (end - TAIL_WINDOW).max(log_start);
        list.add_partition_offset(topic, p as i32, Offset::Offset(from))
            .expect("tail offset");
        // Nothing left to read: the records before `from` were consumed.
        past_last.push(from as u64);
    }
    tail.assign(&list).expect("assign the tail");
    let mut at_end = vec![false; ends.len()];
    while at_end.iter().any(|done| !done) {
        before_deadline("the tail read");
        match tail.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                let p = m.partition() as usize;
                past_last[p] = past_last[p].max(m.offset() as u64 + 1);
            }
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(p))) => at_end[p as usize] = true,
            Some(Err(e)) => panic!("reading the tail of {topic}: {e}"),
            None => {}
        }
    }
    past_last
}

/// The last stable offset of each partition a consumer fetches, from its statistics.
#[derive(Default)]
struct StableOffsets(std::sync::Mutex<std::collections::HashMap<i32, i64>>);

impl rdkafka::ClientContext for StableOffsets {
    fn stats(&self, statistics: rdkafka::Statistics) {
        let mut offsets = self.0.lock().unwrap();
        for topic in statistics.topics.values() {
            for (&p, partition) in &topic.partitions {
                if p >= 0 && partition.ls_offset >= 0 {
                    offsets.insert(p, partition.ls_offset);
                }
            }
        }
    }
}

impl rdkafka::consumer::ConsumerContext for StableOffsets {}
