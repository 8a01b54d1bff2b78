//! How the processor reaches Kafka: the client settings, the properties it keeps for itself,
//! and how the state-aware group membership connects.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How the processor reaches Kafka.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KafkaClient {
    /// Comma-separated `host:port` list.
    #[schemars(length(min = 1))]
    pub bootstrap_servers: String,
    /// Extra librdkafka client properties passed through as they are (for example
    /// `security.protocol`, `sasl.mechanism`, `ssl.ca.location`). Properties the processor
    /// owns for exactly-once and its rebalance handling ([`RESERVED_KAFKA_PROPERTIES`]) are
    /// refused.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub properties: BTreeMap<String, String>,
}

/// A SASL mechanism the state-aware group membership (`standbyReplicas` ≥ 1) speaks on its own
/// connections, beside librdkafka's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SaslMechanism {
    Plain,
    ScramSha256,
    ScramSha512,
}

impl SaslMechanism {
    pub const ALL: [SaslMechanism; 3] = [
        SaslMechanism::Plain,
        SaslMechanism::ScramSha256,
        SaslMechanism::ScramSha512,
    ];

    /// Its name in Kafka's protocol and in librdkafka's `sasl.mechanism`.
    pub fn name(self) -> &'static str {
        match self {
            SaslMechanism::Plain => "PLAIN",
            SaslMechanism::ScramSha256 => "SCRAM-SHA-256",
            SaslMechanism::ScramSha512 => "SCRAM-SHA-512",
        }
    }
}

/// How the state-aware group membership connects, read from the Kafka client settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MembershipConnection {
    pub tls: bool,
    /// `None`: no SASL.
    pub sasl: Option<SaslMechanism>,
}

/// How the state-aware group membership connects, or the first client setting it cannot
/// honour with why (`(property, why)`). It speaks TLS (CA and client certificate as PEM, host
/// names checked) and SASL PLAIN and SCRAM, as librdkafka does; anything that would have it
/// connect differently from the rest of the processor is refused. `get` reads a client
/// property. Checked when the configuration is validated and again by the processor when it
/// connects.
pub fn membership_connection<'a>(
    get: impl Fn(&str) -> Option<&'a str>,
) -> Result<MembershipConnection, (String, String)> {
    let get = |k: &str| get(k).map(str::trim).filter(|v| !v.is_empty());
    let refuse = |key: &str, why: String| Err((key.to_string(), why));
    for (key, why) in [
        (
            "ssl.keystore.location",
            "use PEM files (ssl.certificate.location, ssl.key.location)",
        ),
        ("ssl.key.password", "use an unencrypted PEM key"),
        (
            "ssl.engine.location",
            "OpenSSL engines are librdkafka's only",
        ),
        ("ssl.providers", "OpenSSL providers are librdkafka's only"),
    ] {
        if get(key).is_some() {
            return refuse(key, format!("is not supported with standbys: {why}"));
        }
    }
    let protocol = get("security.protocol").unwrap_or("plaintext");
    let (tls, sasl) = match protocol.to_ascii_lowercase().as_str() {
        "plaintext" => (false, false),
        "ssl" => (true, false),
        "sasl_plaintext" => (false, true),
        "sasl_ssl" => (true, true),
        other => {
            return refuse(
                "security.protocol",
                format!("{other} is not a security protocol"),
            );
        }
    };
    let sasl = if sasl {
        let (key, name) = match (get("sasl.mechanism"), get("sasl.mechanisms")) {
            (Some(m), _) => ("sasl.mechanism", m),
            (None, Some(m)) => ("sasl.mechanisms", m),
            (None, None) => ("sasl.mechanism", "GSSAPI"),
        };
        let Some(mechanism) = SaslMechanism::ALL
            .into_iter()
            .find(|m| m.name().eq_ignore_ascii_case(name))
        else {
            let spoken: Vec<&str> = SaslMechanism::ALL.iter().map(|m| m.name()).collect();
            return refuse(
                key,
                format!(
                    "{name} is not supported with standbys (the group membership speaks {})",
                    spoken.join(", ")
                ),
            );
        };
        Some(mechanism)
    } else {
        None
    };
    if let Some(a) = get("ssl.endpoint.identification.algorithm")
        && !a.eq_ignore_ascii_case("https")
    {
        return refuse(
            "ssl.endpoint.identification.algorithm",
            format!(
                "{a} is not supported with standbys: the group membership checks that the \
                 broker's certificate names the host or IP address it connects to"
            ),
        );
    }
    if get("enable.ssl.certificate.verification").is_some_and(|v| v.eq_ignore_ascii_case("false")) {
        return refuse(
            "enable.ssl.certificate.verification",
            "false is not supported with standbys: give the CA (kafka.tls)".into(),
        );
    }
    Ok(MembershipConnection { tls, sasl })
}

/// Client properties the processor sets itself: overriding them would break exactly-once or
/// the processor's handling of rebalances.
///
/// - read_committed, transactions and idempotence: `isolation.level`, `transactional.id`,
///   `enable.idempotence`, `acks`;
/// - offsets are committed inside transactions only: `enable.auto.commit`,
///   `enable.auto.offset.store`, `auto.offset.reset`;
/// - identity: `group.id`, `group.instance.id`, `bootstrap.servers` (from
///   `kafka.bootstrapServers`);
/// - rebalances are handled eagerly (revoke everything, then assign): `group.protocol`
///   (KIP-848's `consumer` protocol makes them incremental), `group.remote.assignor`,
///   `partition.assignment.strategy` (`cooperative-sticky` is incremental too);
/// - the loop treats partition-end events as errors: `enable.partition.eof`.
pub const RESERVED_KAFKA_PROPERTIES: &[&str] = &[
    "isolation.level",
    "transactional.id",
    "enable.idempotence",
    "acks",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "auto.offset.reset",
    "group.id",
    "group.instance.id",
    "bootstrap.servers",
    "group.protocol",
    "group.remote.assignor",
    "partition.assignment.strategy",
    "enable.partition.eof",
];

/// Client properties every StreamApp client (the processor's, the operator's) gets unless the
/// user's `kafka.properties` set them.
///
/// `metadata.recovery.rebootstrap.trigger.ms`: librdkafka (since 2.10) drops every broker a
/// metadata response leaves out, the bootstrap servers too, and a broker that has just
/// restarted is fenced for a moment and answers with no broker at all; the client then has
/// none to ask and bootstraps again only after this long without metadata — 5 minutes by
/// default, a stream stopped for that long after a one-broker restart.
pub const CLIENT_DEFAULTS: &[(&str, &str)] =
    &[("metadata.recovery.rebootstrap.trigger.ms", "10000")];

/// The consumer group member (`group.instance.id`, static membership) of processing thread
/// `thread` of pod `pod`: the pod name for the first thread, as with one thread, and
/// `<pod>-thread-<n>` for the others. The transactional ids derive from it.
pub fn group_member(pod: &str, thread: usize) -> String {
    match thread {
        0 => pod.to_string(),
        n => format!("{pod}-thread-{n}"),
    }
}

/// The processors' `transaction.timeout.ms` unless the user sets it (librdkafka's default is
/// 60 s; Kafka Streams uses 10 s under exactly-once): how long a dead instance's open
/// transaction can hold back the restore of the tasks it had, and the reads of its outputs.
pub const DEFAULT_TRANSACTION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The `transaction.timeout.ms` the processors use, from the user's Kafka properties.
pub fn transaction_timeout(
    properties: &std::collections::BTreeMap<String, String>,
) -> std::time::Duration {
    properties
        .get("transaction.timeout.ms")
        .and_then(|v| v.parse().ok())
        .map_or(
            DEFAULT_TRANSACTION_TIMEOUT,
            std::time::Duration::from_millis,
        )
}

/// The transactional id of group member `member` ([`group_member`]) of application
/// `application_id`: one producer per processing thread, fenced by the next instance of the
/// same pod thread.
pub fn transactional_id(application_id: &str, member: &str) -> String {
    format!("{application_id}-{member}")
}

/// The pod a group member (by [`group_member`]'s naming) runs in.
pub fn pod_of_group_member(member: &str) -> &str {
    match member.rsplit_once("-thread-") {
        Some((pod, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => pod,
        _ => member,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_member_names_its_pod_and_the_pod_is_found_again() {
        for (pod, thread) in [("orders-0", 0), ("orders-0", 1), ("orders-12", 3)] {
            assert_eq!(pod_of_group_member(&group_member(pod, thread)), pod);
        }
        assert_eq!(group_member("orders-0", 0), "orders-0");
        assert_eq!(group_member("orders-0", 2), "orders-0-thread-2");
        // An app whose own name contains the word is not cut short.
        assert_eq!(pod_of_group_member("my-thread-app-1"), "my-thread-app-1");
        assert_eq!(pod_of_group_member("x-thread-1-0"), "x-thread-1-0");
    }
}
