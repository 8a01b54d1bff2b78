//! The group membership's own connections (`kafka-wire/`: `connection.rs`, `security.rs`)
//! against the broker's SASL_SSL listener (dev/kafka.sh): TLS checked against the test bed's
//! CA, then each SASL mechanism the membership speaks; wrong passwords and a CA that did not
//! sign the broker's certificate are refused, saying why.

use std::time::Duration;

use kafka_protocol::messages::FindCoordinatorRequest;
use kafka_protocol::protocol::StrBytes;
use rdkafka::config::ClientConfig;
use streamapp_kafka_wire::Security;
use streamapp_kafka_wire::{Connection, WireError};
use testbed::kafka::{self, SecureListener};

// Generous: the first TLS handshake of a freshly started broker JVM is slow.
const TIMEOUT: Duration = Duration::from_secs(30);

fn security(listener: &SecureListener, mechanism: &str, change: &[(&str, String)]) -> Security {
    let mut config = ClientConfig::new();
    for (k, v) in listener
        .properties(mechanism)
        .into_iter()
        .chain(change.iter().cloned())
    {
        config.set(k, v);
    }
    Security::from_client(&config).expect("a configuration the membership supports")
}

#[test]
fn the_membership_connects_over_tls_with_each_sasl_mechanism() {
    let listener = kafka::secure_listener();
    for mechanism in ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] {
        let mut connection = Connection::open(
            &listener.bootstrap,
            "secure-membership-test",
            TIMEOUT,
            &security(&listener, mechanism, &[]),
        )
        .unwrap_or_else(|e| panic!("{mechanism}: {e}"));
        // Authenticated, the broker answers the group requests: it names the coordinator on
        // the listener this connection uses.
        let response = connection
            .send(
                &FindCoordinatorRequest::default()
                    .with_key_type(0)
                    .with_coordinator_keys(vec![StrBytes::from_static_str("secure-group")]),
            )
            .unwrap_or_else(|e| panic!("{mechanism}: {e}"));
        let coordinator = &response.coordinators[0];
        assert_eq!(coordinator.error_code, 0, "{mechanism}: {coordinator:?}");
        assert_eq!(
            format!("{}:{}", coordinator.host.as_str(), coordinator.port),
            listener.bootstrap,
            "{mechanism}"
        );
    }
}

fn refused(listener: &SecureListener, security: &Security) -> String {
    match Connection::open(
        &listener.bootstrap,
        "secure-membership-test",
        TIMEOUT,
        security,
    ) {
        Ok(_) => panic!("connected with {security:?}"),
        Err(WireError::Security { detail, .. }) => detail,
        Err(e) => panic!("refused, but not for its security: {e}"),
    }
}

#[test]
fn a_wrong_password_and_a_foreign_ca_are_refused_saying_why() {
    let listener = kafka::secure_listener();
    for mechanism in ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] {
        let wrong = security(
            &listener,
            mechanism,
            &[("sasl.password", "not-the-password".into())],
        );
        let why = refused(&listener, &wrong);
        assert!(
            why.contains(&format!("SASL {mechanism} authentication failed")),
            "{mechanism}: {why}"
        );
    }
    // The broker's own certificate as the only trust anchor: it is not the CA that signed it.
    let foreign_ca = listener.ca_file.with_file_name("server.crt");
    let why = refused(
        &listener,
        &security(
            &listener,
            "SCRAM-SHA-512",
            &[("ssl.ca.location", foreign_ca.display().to_string())],
        ),
    );
    assert!(
        why.contains("TLS handshake") && why.contains("UnknownIssuer"),
        "{why}"
    );
}

#[test]
fn without_a_ca_setting_the_systems_store_is_used_and_the_test_beds_ca_is_not_in_it() {
    let listener = kafka::secure_listener();
    let mut config = ClientConfig::new();
    for (k, v) in listener.properties("SCRAM-SHA-512") {
        if k != "ssl.ca.location" {
            config.set(k, v);
        }
    }
    let security = Security::from_client(&config)
        .expect("the system's CA store is read (the machine has one: ca-certificates)");
    // Certificates are checked, against the system's CAs: the test bed's own CA is not one.
    let why = refused(&listener, &security);
    assert!(
        why.contains("TLS handshake") && why.contains("UnknownIssuer"),
        "{why}"
    );
}
