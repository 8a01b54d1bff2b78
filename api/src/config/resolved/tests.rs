use std::path::PathBuf;
use std::time::Duration;

use super::super::tests::processor_config;
use crate::config::*;

#[test]
fn a_valid_configuration_resolves_to_typed_values() {
    let mut c = processor_config(&[("session.timeout.ms", "6000"), ("linger.ms", "5")]);
    c.wal_dir = Some("/var/lib/streamapp-wal".into());
    c.http_port = 9090;
    c.drain_timeout = "2m".into();
    c.liveness_timeout = "45s".into();
    c.group.standby_replicas = 1;
    c.topology.dedup_id = DedupId {
        source: DedupIdSource::Header,
        header: Some("id".into()),
        json_pointer: None,
    };
    let r = c.resolve().unwrap();
    assert_eq!(
        r,
        ResolvedConfig {
            application_id: "app".into(),
            kafka: c.kafka.clone(),
            topology: ResolvedTopology {
                input_topic: "in".into(),
                output_topic: "out".into(),
                duplicates_topic: Some("dups".into()),
                dead_letter_topic: "dlq".into(),
                dedup_id: c.topology.dedup_id.clone(),
                check_keying: false,
                retention: Duration::from_secs(3600),
                commit_interval: Duration::from_millis(100),
                max_value_bytes: 900_000,
                max_skew: Duration::from_secs(300),
                max_record_attempts: 3,
            },
            changelog_topic: "app-dedup-changelog".into(),
            repartition_topic: Some("app-dedup-repartition".into()),
            rocksdb: ResolvedRocksDb::profile(RocksDbProfile::Balanced),
            state_dir: PathBuf::from("/var/lib/streamapp"),
            wal_dir: Some(PathBuf::from("/var/lib/streamapp-wal")),
            http_port: 9090,
            drain_timeout: Duration::from_secs(120),
            liveness_timeout: Duration::from_secs(45),
            group: ResolvedGroup {
                standby_replicas: 1,
                acceptable_recovery_lag: 10_000,
                timing: GroupTiming {
                    session_timeout: Duration::from_secs(6),
                    heartbeat_interval: Duration::from_secs(3),
                    rebalance_timeout: Duration::from_secs(300),
                    probing_rebalance_interval: Duration::from_secs(600),
                },
            },
            processing_threads: 1,
        }
    );
    assert_eq!(c.validate(), Ok(()));

    c.topology.repartition = Repartition::Never;
    let r = c.resolve().unwrap();
    assert_eq!(r.repartition_topic, None);
    assert!(
        r.topology.check_keying,
        "records not keyed by their id are counted"
    );
}

#[test]
fn several_bad_fields_give_an_error_each_naming_its_field() {
    let mut c = processor_config(&[("acks", "1"), ("heartbeat.interval.ms", "3s")]);
    c.application_id = "my app".into();
    c.topology.commit_interval = "0s".into();
    c.rocksdb.compaction_style = Some(CompactionStyle::Fifo);
    c.state_dir = String::new();
    c.drain_timeout = "soon".into();
    c.processing_threads = 17;
    let errors = c.resolve().unwrap_err();
    assert_eq!(
        errors.fields(),
        [
            "applicationId",
            "kafka.properties.acks",
            "kafka.properties.heartbeat.interval.ms",
            "topology.commitInterval",
            "rocksdb.compactionStyle",
            "stateDir",
            "drainTimeout",
            "processingThreads",
        ]
    );
    let text = errors.to_string();
    assert!(
        text.starts_with("invalid configuration (8 errors):\n* applicationId: must be non-empty"),
        "{text}"
    );
    assert!(
        text.contains("\n* drainTimeout: \"soon\" is not a duration"),
        "{text}"
    );
    assert_eq!(c.validate(), Err(errors), "validate() has the same rules");
}

#[test]
fn a_value_that_does_not_parse_is_reported_once_not_again_by_the_checks_that_need_it() {
    let mut c = processor_config(&[("message.max.bytes", "lots")]);
    c.topology.retention = "forever".into();
    c.rocksdb.memtable_budget = Some("plenty".into());
    c.rocksdb.write_buffer_size = Some("200Mi".into());
    assert_eq!(
        c.resolve().unwrap_err().fields(),
        [
            "kafka.properties.message.max.bytes",
            "topology.retention",
            "rocksdb.memtableBudget",
        ],
        "no maxValueSize against message.max.bytes, maxSkew against retention, or \
         memtableBudget against writeBufferSize"
    );
}

#[test]
fn a_topic_that_is_the_applications_own_internal_topic_is_refused_naming_the_field() {
    for (internal, role) in [
        ("app-dedup-changelog", "changelog"),
        ("app-dedup-repartition", "repartition topic"),
    ] {
        let mut c = processor_config(&[]);
        c.topology.output_topic = internal.into();
        c.topology.duplicates_topic = Some(internal.into());
        let errors = c.validate().unwrap_err();
        assert_eq!(
            errors.fields(),
            [
                "topology.duplicatesTopic",
                "topology.outputTopic",
                "topology.duplicatesTopic"
            ],
            "the same topic twice, and the application's own {role} in either field"
        );
        assert!(
            errors.iter().last().unwrap().message.contains(role),
            "{errors}"
        );
    }
    let mut c = processor_config(&[]);
    c.topology.output_topic = "other-app-dedup-changelog".into();
    c.validate()
        .expect("another application's internal topic is refused at admission (a CEL rule of the CRD), not here");
}

#[test]
fn standbys_take_their_timing_from_the_client_properties_and_refuse_what_the_membership_cannot_speak()
 {
    let mut c = processor_config(&[]);
    let mut with = |pairs: &[(&str, &str)]| {
        c.kafka.properties = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        c.group.standby_replicas = 1;
        let standbys = c.validate().map_err(|e| e.fields().join(","));
        c.group.standby_replicas = 0;
        assert!(
            c.validate().is_ok(),
            "librdkafka's membership takes {pairs:?}"
        );
        standbys
    };
    assert_eq!(
        with(&[
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanism", "SCRAM-SHA-512")
        ]),
        Ok(())
    );
    assert_eq!(with(&[("security.protocol", "SSL")]), Ok(()));
    assert_eq!(
        with(&[("security.protocol", "SASL_SSL")]),
        Err("kafka.properties.sasl.mechanism".into()),
        "librdkafka's default mechanism is GSSAPI"
    );
    assert_eq!(
        with(&[
            ("security.protocol", "SASL_PLAINTEXT"),
            ("sasl.mechanisms", "OAUTHBEARER")
        ]),
        Err("kafka.properties.sasl.mechanisms".into())
    );
    assert_eq!(
        with(&[
            ("security.protocol", "SSL"),
            ("ssl.endpoint.identification.algorithm", "none")
        ]),
        Err("kafka.properties.ssl.endpoint.identification.algorithm".into())
    );
    assert_eq!(
        with(&[("ssl.keystore.location", "/k.p12")]),
        Err("kafka.properties.ssl.keystore.location".into())
    );
    let mut c = processor_config(&[("max.poll.interval.ms", "600000")]);
    c.group.standby_replicas = 1;
    c.group.probing_rebalance_interval = "0s".into();
    assert_eq!(
        c.validate().unwrap_err().fields(),
        ["group.probingRebalanceInterval"]
    );
    c.group.probing_rebalance_interval = "1m".into();
    let timing = c.resolve().unwrap().group.timing;
    assert_eq!(timing.rebalance_timeout, Duration::from_secs(600));
    assert_eq!(timing.probing_rebalance_interval, Duration::from_secs(60));
}

#[test]
fn processing_threads_are_one_to_sixteen_with_or_without_standbys() {
    let mut c = processor_config(&[]);
    for standby_replicas in [0, 1] {
        c.group.standby_replicas = standby_replicas;
        for (threads, ok) in [(0, false), (1, true), (4, true), (16, true), (17, false)] {
            c.processing_threads = threads;
            assert_eq!(
                c.validate().is_ok(),
                ok,
                "{threads} threads, {standby_replicas} standbys"
            );
        }
    }
}

#[test]
fn the_default_topology_fits_librdkafkas_default_message_size() {
    let r = processor_config(&[]).resolve().unwrap().topology;
    assert!(
        r.max_value_bytes + RECORD_OVERHEAD_BYTES <= DEFAULT_PRODUCER_MESSAGE_MAX_BYTES,
        "a record of the default maximum size, with its key and headers, fits librdkafka's message.max.bytes"
    );
}

#[test]
fn a_max_value_size_the_producer_cannot_send_is_refused_naming_the_field() {
    let mut config = processor_config(&[]);
    config.topology.max_value_size = "1Mi".into();
    let errors = config.validate().unwrap_err();
    assert_eq!(errors.fields(), ["topology.maxValueSize"]);
    assert!(
        errors.to_string().contains("message.max.bytes (1000000)"),
        "{errors}"
    );
    // Raising the producer's limit makes room for it.
    let mut config = processor_config(&[("message.max.bytes", "2000000")]);
    config.topology.max_value_size = "1Mi".into();
    config.validate().unwrap();
    let config = processor_config(&[("message.max.bytes", "lots")]);
    assert_eq!(
        config.validate().unwrap_err().fields(),
        ["kafka.properties.message.max.bytes"]
    );
}

#[test]
fn reserved_kafka_properties_such_as_the_kip_848_group_protocol_are_refused() {
    for (key, value) in [
        ("isolation.level", "read_uncommitted"),
        ("group.protocol", "consumer"),
        ("group.remote.assignor", "uniform"),
        ("partition.assignment.strategy", "cooperative-sticky"),
        ("auto.offset.reset", "latest"),
        ("acks", "1"),
    ] {
        let errors = processor_config(&[(key, value)]).validate().unwrap_err();
        assert_eq!(errors.fields(), [format!("kafka.properties.{key}")]);
    }
}
