//! The demo's Kafka side: creates its topics, produces sample commands (with repeats and a few
//! malformed records), and counts what the processors committed.

use std::time::Duration;

use clap::{Parser, Subcommand};
use rand::RngExt;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use testbed::kafka::{self, Isolation};

#[derive(Parser)]
#[command(about = "Sample commands for the StreamApp demo")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Create topics (`name` or `name:partitions`); existing ones are left alone.
    CreateTopics { topics: Vec<String> },
    /// Produce `count` commands, `duplicates` of them repeats of earlier ids, plus `bad`
    /// malformed records (no command id, not JSON).
    Produce {
        #[arg(long)]
        topic: String,
        #[arg(long, default_value_t = 5000)]
        count: usize,
        #[arg(long, default_value_t = 0.3)]
        duplicates: f64,
        #[arg(long, default_value_t = 10)]
        bad: usize,
    },
    /// Print how many records of `topic` read_committed consumers see.
    Count { topic: String },
}

#[tokio::main]
async fn main() {
    match Cli::parse().command {
        Cmd::CreateTopics { topics } => {
            let existing = existing_topics();
            for t in topics {
                let (name, partitions) = t.split_once(':').map_or((t.as_str(), 1), |(n, p)| {
                    (n, p.parse().expect("partitions"))
                });
                if existing.contains(&name.to_string()) {
                    println!("topic {name} exists");
                } else {
                    kafka::create_topic(name, partitions).await;
                    println!("created topic {name} ({partitions} partitions)");
                }
            }
        }
        Cmd::Produce {
            topic,
            count,
            duplicates,
            bad,
        } => {
            let producer: BaseProducer = kafka::client_config()
                .set("linger.ms", "5")
                .create()
                .expect("producer");
            let mut rng = rand::rng();
            let run = format!("{:06x}", rng.random_range(0..0xffffffu32));
            let mut fresh = 0usize;
            let mut repeats = 0usize;
            let send = |key: &str, value: String| {
                let record = BaseRecord::to(&topic).key(key).payload(&value);
                testbed::kafka::send(&producer, record);
            };
            for i in 0..count {
                let id = if fresh > 0 && rng.random_bool(duplicates) {
                    repeats += 1;
                    format!("cmd-{run}-{}", rng.random_range(0..fresh))
                } else {
                    fresh += 1;
                    format!("cmd-{run}-{}", fresh - 1)
                };
                let value = format!(
                    r#"{{"commandId":"{id}","account":"acct-{}","amount":{}}}"#,
                    i % 97,
                    i % 1000
                );
                send(&id, value);
            }
            for i in 0..bad {
                if i % 2 == 0 {
                    send("bad", format!(r#"{{"account":"acct-{i}","amount":1}}"#));
                } else {
                    send("bad", "this is not JSON".into());
                }
            }
            producer.flush(Duration::from_secs(30)).expect("flush");
            println!(
                "produced {} commands: {fresh} distinct ids, {repeats} repeats, {bad} malformed",
                count + bad
            );
        }
        Cmd::Count { topic } => {
            println!(
                "{}",
                kafka::read_all(&topic, Isolation::ReadCommitted, |_| {})
            );
        }
    }
}

fn existing_topics() -> Vec<String> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let c: BaseConsumer = kafka::client_config().create().expect("client");
    let md = c
        .fetch_metadata(None, Duration::from_secs(10))
        .expect("metadata");
    md.topics().iter().map(|t| t.name().to_string()).collect()
}
