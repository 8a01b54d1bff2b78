//! Recovery after kill -9: a system loads a number of ids into its store, is killed under live
//! traffic, restarted on the same state directory, and timed until it produces again. Then
//! its output is checked: every id exactly once across the crash.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use rdkafka::producer::{BaseProducer, Producer};
use testbed::kafka;

use crate::Settings;
use crate::common::*;
use crate::restore::Restore;
use crate::systems::App;

/// New records sent right after a crash.
const PROBES: u64 = 1_000;
/// Live traffic before the kill.
const LIVE_RATE: u64 = 1_000;
const LIVE_FOR: Duration = Duration::from_secs(3);

/// The input around a crash: live records before the kill, new ones after it, and every id
/// the system has been sent.
pub struct CrashTraffic {
    producer: BaseProducer,
    input: String,
    keying: Keying,
    ids: HashSet<Vec<u8>>,
    /// Records sent in all, the loaded ones included.
    pub records: u64,
}

impl CrashTraffic {
    pub fn new(input: &str, loaded: &Dataset, keying: Keying) -> Self {
        CrashTraffic {
            producer: kafka::input_producer_config()
                .set("linger.ms", "1")
                .create()
                .expect("producer"),
            input: input.into(),
            keying,
            ids: loaded.ids.clone(),
            records: loaded.records,
        }
    }

    /// New ids at a steady rate for a few seconds, so that a kill right after lands in the
    /// middle of a transaction. Returns how many.
    pub fn live(&mut self) -> u64 {
        let mut live = Workload::with(0.0, "live").keyed(self.keying);
        let ids = &mut self.ids;
        let sent = send_paced(
            &self.producer,
            &self.input,
            &mut live,
            LIVE_RATE,
            LIVE_FOR,
            |id| {
                ids.insert(id.into_bytes());
            },
        );
        self.records += sent;
        sent
    }

    /// New ids sent after the kill, everything flushed.
    pub fn after(&mut self) {
        let mut after = Workload::with(0.0, "after").keyed(self.keying);
        for _ in 0..PROBES {
            let record = after.next(now_us());
            send(&self.producer, &self.input, &record);
            self.ids.insert(record.id.into_bytes());
        }
        self.producer.flush(Duration::from_secs(30)).expect("flush");
        self.records += PROBES;
    }

    /// What the system was sent: every id once.
    pub fn sent(self) -> Dataset {
        Dataset {
            records: self.records,
            distinct: self.records,
            value_bytes: 0,
            ids: self.ids,
        }
    }
}

/// How long a start may take when it has to restore `ids` from scratch: 1 s more per 20,000.
pub fn restore_limit(ids: u64) -> Duration {
    STALL_TIMEOUT + Duration::from_secs(ids / 20_000)
}

/// What a recovery after kill -9 cost one system.
#[derive(Clone, Copy, Default)]
pub struct Recovery {
    pub load_s: f64,
    pub first_output_s: f64,
    pub caught_up_s: f64,
    pub restored: u64,
    /// The full restore that followed, for the systems in [`Peer::RESTORED`](crate::systems::Peer::RESTORED).
    pub full_restore: Option<Restore>,
}

/// Loads `loaded` into a fresh `app`, crashes it under live traffic, restarts it and measures
/// how long it takes to produce again. Returns the figures and the check of its output across
/// the crash (with the warnings of its log when wrong).
pub fn recover(
    settings: &Settings,
    app: &App,
    loaded: &Dataset,
    keying: Keying,
) -> (Recovery, OutputCheck) {
    let name = app.peer.name();
    let mut system = app.start(settings);
    let watcher = system.offsets_watcher();
    system.wait_ready();
    let started = Instant::now();
    system.wait_done(&watcher, loaded.records);
    let load_s = started.elapsed().as_secs_f64();
    println!("  {name}: {} keys loaded in {load_s:.1} s", loaded.records);

    // Live traffic, so that the kill lands mid-transaction with uncommitted store writes.
    let mut traffic = CrashTraffic::new(&app.input, loaded, keying);
    let sent = traffic.live();
    system.kill9();
    // While it is down, new records arrive; output from here on is new output.
    traffic.after();
    let receiver = Receiver::start(&app.output, Some(&kafka::end_offsets(&app.output)));

    let restarted = Instant::now();
    let mut system = app.start(settings);
    system.wait_for(
        "producing again",
        restarted,
        restore_limit(loaded.records),
        Duration::from_millis(5),
        |_| (receiver.received() > 0).then_some(()),
    );
    let first_output_s = restarted.elapsed().as_secs_f64();
    system.wait_done(&watcher, traffic.records);
    let recovery = Recovery {
        load_s,
        first_output_s,
        caught_up_s: restarted.elapsed().as_secs_f64(),
        restored: app.restored(&system),
        full_restore: None,
    };
    receiver.stop();
    let log = system.log.clone();
    system.stop();
    println!(
        "  {name}: after kill -9 ({sent} live records in flight): first new committed output {:.2} s after the restart, caught up after {:.2} s, {} changelog records restored",
        recovery.first_output_s, recovery.caught_up_s, recovery.restored
    );
    let mut check = app.check(&format!("  {name} (across the crash)"), &traffic.sent());
    app.explain(&mut check, &watcher, &[log]);
    (recovery, check)
}
