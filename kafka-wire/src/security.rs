//! How these connections are secured: the same TLS and SASL settings as the program's
//! librdkafka clients (`security.protocol`, `sasl.*`, `ssl.*` in its client configuration), so
//! a user configures the connection once.
//!
//! Supported: `security.protocol` `plaintext`, `ssl`, `sasl_plaintext` and `sasl_ssl`; SASL
//! mechanisms `PLAIN`, `SCRAM-SHA-256` and `SCRAM-SHA-512` (Kafka's SaslHandshake and
//! SaslAuthenticate requests, [`crate::scram`]); TLS through rustls with the CA (or, without
//! one, the system's CA store, as librdkafka) and the client certificate and key from PEM
//! files or inline PEM, the broker's certificate checked against
//! the host name or IP address connected to (librdkafka's default). What it cannot do is
//! refused with the setting named ([`membership_connection`], also checked when the processor's
//! configuration is validated), rather than connecting differently from the rest of the
//! processor.

use std::sync::Arc;

use rdkafka::config::ClientConfig;
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use streamapp_api::config::{SaslMechanism, membership_connection};

#[derive(Clone)]
pub struct Sasl {
    pub mechanism: SaslMechanism,
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Sasl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sasl")
            .field("mechanism", &self.mechanism)
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

/// TLS and SASL of the membership's connections; the default is plaintext.
#[derive(Clone, Default)]
pub struct Security {
    pub tls: Option<Arc<rustls::ClientConfig>>,
    pub sasl: Option<Sasl>,
}

impl std::fmt::Debug for Security {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Security")
            .field("tls", &self.tls.is_some())
            .field("sasl", &self.sasl)
            .finish()
    }
}

impl Security {
    /// Reads the settings from the processor's librdkafka client configuration. Errors name
    /// the setting.
    pub fn from_client(config: &ClientConfig) -> Result<Self, String> {
        let connection = membership_connection(|k| config.get(k))
            .map_err(|(key, why)| format!("{key} {why}"))?;
        let sasl = if let Some(mechanism) = connection.sasl {
            let credential = |key: &str| {
                config
                    .get(key)
                    .map(str::to_string)
                    .ok_or_else(|| format!("{key} is needed for SASL {}", mechanism.name()))
            };
            Some(Sasl {
                mechanism,
                username: credential("sasl.username")?,
                password: credential("sasl.password")?,
            })
        } else {
            None
        };
        let get = |key: &str| config.get(key).map(str::trim).filter(|v| !v.is_empty());
        let tls = if connection.tls {
            Some(Arc::new(tls_config(&get)?))
        } else {
            None
        };
        Ok(Security { tls, sasl })
    }
}

fn tls_config<'a>(get: &impl Fn(&str) -> Option<&'a str>) -> Result<rustls::ClientConfig, String> {
    let mut roots = RootCertStore::empty();
    let cas: Vec<CertificateDer<'static>> = match (get("ssl.ca.location"), get("ssl.ca.pem")) {
        (Some(path), _) => CertificateDer::pem_file_iter(path)
            .and_then(|certs| certs.collect())
            .map_err(|e| format!("ssl.ca.location {path}: {e}"))?,
        (None, Some(pem)) => CertificateDer::pem_slice_iter(pem.as_bytes())
            .collect::<Result<_, _>>()
            .map_err(|e| format!("ssl.ca.pem: {e}"))?,
        // Neither set: the system's CA store, as librdkafka (OpenSSL) uses then.
        (None, None) => {
            let found = rustls_native_certs::load_native_certs();
            if found.certs.is_empty() {
                return Err(format!(
                    "TLS without ssl.ca.location or ssl.ca.pem, and no CA certificates in the \
                     system's store ({:?}): give the CA (kafka.tls)",
                    found.errors
                ));
            }
            found.certs
        }
    };
    for ca in cas {
        roots
            .add(ca)
            .map_err(|e| format!("a CA certificate is not usable: {e}"))?;
    }
    // Host names are checked (membership_connection let no other setting through).
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots);
    let cert = match (get("ssl.certificate.location"), get("ssl.certificate.pem")) {
        (Some(path), _) => Some(
            CertificateDer::pem_file_iter(path)
                .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                .map_err(|e| format!("ssl.certificate.location {path}: {e}"))?,
        ),
        (None, Some(pem)) => Some(
            CertificateDer::pem_slice_iter(pem.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("ssl.certificate.pem: {e}"))?,
        ),
        (None, None) => None,
    };
    let key = match (get("ssl.key.location"), get("ssl.key.pem")) {
        (Some(path), _) => Some(
            PrivateKeyDer::from_pem_file(path)
                .map_err(|e| format!("ssl.key.location {path}: {e}"))?,
        ),
        (None, Some(pem)) => Some(
            PrivateKeyDer::from_pem_slice(pem.as_bytes())
                .map_err(|e| format!("ssl.key.pem: {e}"))?,
        ),
        (None, None) => None,
    };
    match (cert, key) {
        (Some(cert), Some(key)) => builder
            .with_client_auth_cert(cert, key)
            .map_err(|e| format!("the client certificate and key: {e}")),
        (None, None) => Ok(builder.with_no_client_auth()),
        _ => Err(
            "a client certificate needs its key and a key its certificate \
                  (ssl.certificate.location and ssl.key.location)"
                .into(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(pairs: &[(&str, &str)]) -> ClientConfig {
        let mut c = ClientConfig::new();
        for (k, v) in pairs {
            c.set(*k, *v);
        }
        c
    }

    #[test]
    fn plaintext_is_the_default_and_sasl_takes_the_clients_mechanism_and_credentials() {
        let s = Security::from_client(&config(&[])).unwrap();
        assert!(s.tls.is_none() && s.sasl.is_none());
        let s = Security::from_client(&config(&[
            ("security.protocol", "SASL_PLAINTEXT"),
            ("sasl.mechanisms", "scram-sha-512"),
            ("sasl.username", "u"),
            ("sasl.password", "p"),
        ]))
        .unwrap();
        assert!(s.tls.is_none());
        let sasl = s.sasl.unwrap();
        assert_eq!(
            (
                sasl.mechanism,
                sasl.username.as_str(),
                sasl.password.as_str()
            ),
            (SaslMechanism::ScramSha512, "u", "p")
        );
    }

    #[test]
    fn what_the_membership_cannot_do_is_refused_naming_the_setting() {
        let refused = |pairs: &[(&str, &str)]| Security::from_client(&config(pairs)).unwrap_err();
        assert!(
            refused(&[("security.protocol", "SASL_SSL"), ("ssl.ca.pem", "x")])
                .contains("sasl.mechanism GSSAPI")
        );
        assert!(
            refused(&[
                ("security.protocol", "SASL_PLAINTEXT"),
                ("sasl.mechanism", "PLAIN")
            ])
            .contains("sasl.username")
        );
        assert!(
            refused(&[
                ("security.protocol", "SSL"),
                ("ssl.ca.location", "/no/such/ca.crt")
            ])
            .contains("ssl.ca.location /no/such/ca.crt")
        );
        assert!(refused(&[("ssl.keystore.location", "/k.p12")]).contains("ssl.keystore.location"));
        assert!(refused(&[("security.protocol", "tls")]).contains("security.protocol"));
        assert!(
            refused(&[
                ("security.protocol", "SSL"),
                ("ssl.ca.pem", "x"),
                ("ssl.endpoint.identification.algorithm", "none")
            ])
            .contains("ssl.endpoint.identification.algorithm")
        );
    }
}
