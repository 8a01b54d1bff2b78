//! The ends of the logs an engine reports against — the changelog's ends for the health
//! report, its inputs' last stable offsets and real ends for the stage lag and for a task held
//! at an open transaction — read on a thread of their own. Each is a broker round trip per
//! partition (seconds when a broker is slow), which the processing thread must not wait on: it
//! asks for a read every few seconds and takes the answer in on a later tick.

use std::collections::BTreeMap;
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use tracing::debug;

use crate::open_transactions::watermark_probe;

/// How long one partition's watermarks may take before the read goes on without them.
const ROUND_TRIP_TIMEOUT: Duration = Duration::from_secs(2);

/// The partitions to read, by topic (the topics are the reader's).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Request {
    pub changelog: Vec<i32>,
    pub dedup_input: Vec<i32>,
    pub route_input: Vec<i32>,
}

/// An input partition's ends as a read_committed reader and a read_uncommitted one see them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InputEnds {
    /// The log's start (low watermark).
    pub low: i64,
    /// The last stable offset: where a read_committed reader stops.
    pub stable: i64,
    /// The real end (high watermark); `None` when that read failed.
    pub end: Option<i64>,
}

/// One read's answers. A partition whose round trip failed is missing (asked again next time).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogEnds {
    /// The changelog's real end.
    pub changelog: BTreeMap<i32, i64>,
    pub dedup_input: BTreeMap<i32, InputEnds>,
    pub route_input: BTreeMap<i32, InputEnds>,
}

/// The topics a reader reads.
#[derive(Clone, Debug)]
pub struct Topics {
    pub changelog: String,
    pub dedup_input: String,
    /// The route stage's input, when the topology repartitions.
    pub route_input: Option<String>,
}

/// The reader: its thread ends when this is dropped (the request channel closes).
pub struct LogEndsReader {
    requests: Sender<Request>,
    answers: Receiver<LogEnds>,
    /// A read is asked for and not answered yet: the next request waits for it.
    in_flight: bool,
}

impl LogEndsReader {
    /// Creates the reader's clients (a bad configuration fails here) and starts its thread.
    pub fn start(client: &ClientConfig, topics: Topics) -> Result<Self, KafkaError> {
        let committed = watermark_probe(client, "read_committed")?;
        let uncommitted = watermark_probe(client, "read_uncommitted")?;
        let (requests, asked) = mpsc::channel::<Request>();
        let (answer, answers) = mpsc::channel::<LogEnds>();
        std::thread::Builder::new()
            .name("log-ends".into())
            .spawn(move || {
                // Ends when the engine (the sender) goes.
                while let Ok(request) = asked.recv() {
                    let ends = read(&committed, &uncommitted, &topics, &request);
                    if answer.send(ends).is_err() {
                        return;
                    }
                }
            })
            .expect("starting the log-ends thread");
        Ok(LogEndsReader {
            requests,
            answers,
            in_flight: false,
        })
    }

    /// Asks for a read of `request`'s partitions, unless the last one is still under way.
    pub fn ask(&mut self, request: Request) {
        if !self.in_flight {
            self.in_flight = self.requests.send(request).is_ok();
        }
    }

    /// The answer to the last read, once it came.
    pub fn answer(&mut self) -> Option<LogEnds> {
        match self.answers.try_recv() {
            Ok(ends) => {
                self.in_flight = false;
                Some(ends)
            }
            Err(TryRecvError::Empty) => None,
            Err(TryRecvError::Disconnected) => {
                self.in_flight = false;
                None
            }
        }
    }
}

/// One read: a round trip per partition and isolation level.
fn read(
    committed: &BaseConsumer,
    uncommitted: &BaseConsumer,
    topics: &Topics,
    request: &Request,
) -> LogEnds {
    let watermarks = |probe: &BaseConsumer, topic: &str, p: i32| match probe.fetch_watermarks(
        topic,
        p,
        ROUND_TRIP_TIMEOUT,
    ) {
        Ok(w) => Some(w),
        Err(e) => {
            debug!(topic, partition = p, error = %e, "could not read a partition's ends; asked again next time");
            None
        }
    };
    let input = |topic: &str, p: i32, real_end: bool| -> Option<InputEnds> {
        let (low, stable) = watermarks(committed, topic, p)?;
        let end = real_end
            .then(|| watermarks(uncommitted, topic, p).map(|(_, high)| high))
            .flatten();
        Some(InputEnds { low, stable, end })
    };
    let inputs = |topic: &str, partitions: &[i32], real_end: bool| -> BTreeMap<i32, InputEnds> {
        partitions
            .iter()
            .filter_map(|&p| input(topic, p, real_end).map(|ends| (p, ends)))
            .collect()
    };
    LogEnds {
        changelog: request
            .changelog
            .iter()
            .filter_map(|&p| watermarks(uncommitted, &topics.changelog, p).map(|(_, end)| (p, end)))
            .collect(),
        dedup_input: inputs(&topics.dedup_input, &request.dedup_input, true),
        route_input: topics
            .route_input
            .as_deref()
            .map(|topic| inputs(topic, &request.route_input, false))
            .unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn one_read_at_a_time_and_a_partition_that_cannot_be_read_is_missing_from_the_answer() {
        // Nothing listens on this loopback port: every round trip fails after its timeout.
        let mut client = ClientConfig::new();
        client.set("bootstrap.servers", "127.0.0.1:1");
        let topics = Topics {
            changelog: "app-dedup-changelog".into(),
            dedup_input: "in".into(),
            route_input: None,
        };
        let mut reader = LogEndsReader::start(&client, topics).unwrap();
        assert_eq!(reader.answer(), None, "nothing asked yet");
        reader.ask(Request {
            changelog: vec![0],
            ..Request::default()
        });
        // Asked again while the first read is under way: not queued behind it.
        reader.ask(Request {
            changelog: vec![0],
            ..Request::default()
        });
        let started = Instant::now();
        let answer = loop {
            if let Some(answer) = reader.answer() {
                break answer;
            }
            assert!(started.elapsed() < Duration::from_secs(30), "no answer");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(
            answer,
            LogEnds::default(),
            "the failed partition is left out"
        );
        std::thread::sleep(ROUND_TRIP_TIMEOUT + Duration::from_millis(500));
        assert_eq!(reader.answer(), None, "the second ask was not queued");
        // Answered: the next ask is read.
        reader.ask(Request::default());
        let started = Instant::now();
        while reader.answer().is_none() {
            assert!(started.elapsed() < Duration::from_secs(30), "no answer");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
