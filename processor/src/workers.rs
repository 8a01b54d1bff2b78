//! The processing threads: one engine ([`crate::engine`]) each, each supervised (a fatal Kafka
//! error restarts that thread's engine from its stores and changelogs, a few times, before it
//! gives up), and the process's end: drained when every thread drained, failed when one failed
//! for good (the others drain first, so their stores close cleanly).
//!
//! Threads share the health report ([`Shared`], each by its index), the metrics and the stores'
//! memory ([`SharedMemory`]: one block cache and memtable budget whatever the number of
//! threads). Each is a group member of its own with its own transactional producer, so
//! exactly-once needs nothing shared between them.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use streamapp_api::health::ProcessorPhase;
use tracing::{error, info_span, warn};

use crate::engine::{Engine, EngineConfig, EngineError};
use crate::faults::Faults;
use crate::metrics::Metrics;
use crate::shared::{DrainOutcome, Shared};
use crate::store::SharedMemory;

/// Records processed between two looks at the engine's timers (at most about a millisecond
/// of processing; the commit interval is 100 ms).
const TICK_EVERY: u32 = 64;
/// How long a poll waits for a record when the last one brought none.
const POLL_WAIT: Duration = Duration::from_millis(50);
/// How often the ends of the changelog and the inputs are read (off this thread) for the
/// health report and the lag.
const LOG_ENDS_EVERY: Duration = Duration::from_secs(5);
/// Restarts of one thread's engine within [`RESTART_WINDOW`] before the process gives up.
const MAX_RESTARTS: usize = 5;
const RESTART_WINDOW: Duration = Duration::from_secs(300);

/// What the threads share.
#[derive(Clone)]
pub struct Process {
    pub shared: Arc<Shared>,
    pub metrics: Metrics,
    pub memory: SharedMemory,
}

/// Runs one engine per processing thread (as many as `process.shared` has slots) until all
/// drained, or one failed for good. Sets the health report's end (drained, or failed with the
/// error) and answers the drain request either way. `faults` (test injections) go to the first
/// thread.
pub fn run(cfg: &EngineConfig, process: &Process, faults: Faults) -> Result<(), EngineError> {
    let threads = process.shared.threads();
    let first_failure: Mutex<Option<EngineError>> = Mutex::new(None);
    let mut faults = Some(faults);
    let drained: Vec<Option<u64>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|thread| {
                let cfg = EngineConfig {
                    thread,
                    ..cfg.clone()
                };
                let faults = faults.take().unwrap_or_default();
                let first_failure = &first_failure;
                std::thread::Builder::new()
                    .name(format!("processing-{thread}"))
                    .spawn_scoped(scope, move || {
                        let _span =
                            (threads > 1).then(|| info_span!("processing", thread).entered());
                        let _on_panic = StopOthersOnPanic(&process.shared);
                        match supervise(cfg, process, faults) {
                            Ok(duration_ms) => Some(duration_ms),
                            Err(e) => {
                                first_failure.lock().unwrap().get_or_insert(e);
                                process.shared.thread_failed();
                                None
                            }
                        }
                    })
                    .expect("starting a processing thread")
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().ok().flatten())
            .collect()
    });
    let shared = &process.shared;
    let failure = first_failure.into_inner().unwrap().or_else(|| {
        drained
            .contains(&None)
            .then(|| EngineError::Fatal("a processing thread panicked".into()))
    });
    match failure {
        None => {
            let duration_ms = drained.into_iter().flatten().max().unwrap_or(0);
            shared.update(true, |h| {
                h.phase = ProcessorPhase::Drained;
                h.drain_duration_ms = Some(duration_ms);
            });
            shared.finish_drain(DrainOutcome::Drained { duration_ms });
            Ok(())
        }
        Some(e) => {
            error!("{e}");
            shared.set_not_ready("failed");
            shared.update(true, |h| {
                h.phase = ProcessorPhase::Failed;
                h.error = Some(e.to_string());
            });
            shared.finish_drain(DrainOutcome::Failed(e.to_string()));
            Err(e)
        }
    }
}

/// A thread that panics makes the others drain, so that the process ends.
struct StopOthersOnPanic<'a>(&'a Shared);

impl Drop for StopOthersOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.thread_failed();
        }
    }
}

/// Runs one thread's engine; a fatal Kafka error (an unusable producer) restarts it, a few
/// times, before giving up. Ok: drained, in that many milliseconds.
fn supervise(mut cfg: EngineConfig, process: &Process, faults: Faults) -> Result<u64, EngineError> {
    let mut restarts: Vec<Instant> = Vec::new();
    let mut faults = Some(faults);
    loop {
        // The stores are checked against the changelog as it is now: it may have been
        // recreated since the last start (a follower's position out of the log says so).
        cfg.changelog_topic_id = match crate::changelog::topic_id(&cfg.client, &cfg.changelog_topic)
        {
            Ok(id) => id,
            Err(e) => {
                warn!(topic = %cfg.changelog_topic, error = %e,
                    "cannot read the changelog's topic id: a changelog recreated since a store was written is detected only when the store is ahead of it");
                None
            }
        };
        let e = match run_engine(cfg.clone(), process, faults.take().unwrap_or_default()) {
            Ok(duration_ms) => return Ok(duration_ms),
            Err(e @ (EngineError::Fenced { .. } | EngineError::TopicUnusable { .. })) => {
                return Err(e);
            }
            Err(e) => e,
        };
        restarts.retain(|t| t.elapsed() < RESTART_WINDOW);
        if restarts.len() >= MAX_RESTARTS || process.shared.should_stop() {
            return Err(e);
        }
        restarts.push(Instant::now());
        warn!(error = %e, "engine failed; restarting it: staged writes are dropped and stores catch up from the changelog");
        std::thread::sleep(Duration::from_secs(1));
        process.shared.beat(cfg.thread);
    }
}

/// One engine lifetime: until drained (Ok, the drain's milliseconds) or failed.
fn run_engine(cfg: EngineConfig, process: &Process, faults: Faults) -> Result<u64, EngineError> {
    let shared = &process.shared;
    let (engine, consumer) = Engine::start(
        cfg,
        shared.clone(),
        process.memory.clone(),
        process.metrics.clone(),
        faults,
    )?;
    let mut last_ends = Instant::now() - Duration::from_secs(60);
    let mut since_tick = 0u32;
    let mut record = false;
    let result = loop {
        if shared.should_stop() {
            break match engine.lock().unwrap().drain(&consumer) {
                DrainOutcome::Drained { duration_ms } => Ok(duration_ms),
                DrainOutcome::Failed(e) => Err(EngineError::Fatal(format!("drain: {e}"))),
            };
        }
        // Rebalance callbacks run inside poll and lock the engine themselves. Right after a
        // record the next one is most likely fetched already: asked for without a wait,
        // librdkafka reads no clock for a deadline. Nothing there: the tick runs, and the
        // next poll waits.
        let wait = if record { Duration::ZERO } else { POLL_WAIT };
        let polled = consumer.poll(wait);
        let mut e = engine.lock().unwrap();
        let step;
        (step, record) = match polled {
            None => (Ok(()), false),
            Some(Ok(m)) => (e.process(&consumer, &m), true),
            Some(Err(err)) => (e.on_consumer_error(&consumer, err), false),
        };
        // The timers (commit interval, restores, back-offs, health) are looked at after every
        // TICK_EVERY records, and whenever a poll brought no record: after every record they
        // cost more clock reads than the record itself.
        since_tick += 1;
        let tick = !record || since_tick >= TICK_EVERY;
        if tick {
            since_tick = 0;
        }
        if let Err(err) = step.and_then(|()| if tick { e.tick(&consumer) } else { Ok(()) }) {
            e.stop();
            break Err(err);
        }
        if tick {
            e.take_log_ends();
            if last_ends.elapsed() > LOG_ENDS_EVERY {
                e.ask_log_ends();
                last_ends = Instant::now();
            }
        }
    };
    // Closing the consumer runs the revoke callback; a stopped engine only lets go.
    engine.lock().unwrap().stop();
    drop(consumer);
    result
}
