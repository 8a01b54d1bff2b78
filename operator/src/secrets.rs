//! The Secrets a StreamApp's pods read — the Kafka SASL credentials and TLS material — and one
//! hash of their contents for the pod template, so that a changed credential rolls the pods
//! as a changed configuration does (env variables and mounted files would not follow it
//! otherwise: env never changes in a running container).

use k8s_openapi::api::core::v1::Secret;
use sha2::{Digest, Sha256};
use streamapp_api::crd::StreamApp;

/// Names of the Secrets the pods read, sorted, without repeats.
pub fn referenced(app: &StreamApp) -> Vec<String> {
    let kafka = &app.spec.kafka;
    let mut names: Vec<String> = kafka
        .sasl
        .iter()
        .map(|s| s.secret_name.clone())
        .chain(kafka.tls.iter().map(|t| t.secret_name.clone()))
        .collect();
    names.sort();
    names.dedup();
    names
}

/// A hash of the Secrets `found` (name, and the object when it exists): it changes when any of
/// their data changes, or when one appears or disappears. None when the pods read no Secret.
pub fn contents_hash(found: &[(String, Option<Secret>)]) -> Option<String> {
    if found.is_empty() {
        return None;
    }
    let mut hasher = Sha256::new();
    for (name, secret) in found {
        hasher.update(name.as_bytes());
        hasher.update([0]);
        match secret {
            None => hasher.update(b"<missing>"),
            Some(secret) => {
                // BTreeMaps: the keys come in order, so equal contents hash equal.
                for (key, value) in secret.data.iter().flatten() {
                    hasher.update(key.as_bytes());
                    hasher.update([0]);
                    hasher.update(&value.0);
                    hasher.update([0]);
                }
                for (key, value) in secret.string_data.iter().flatten() {
                    hasher.update(key.as_bytes());
                    hasher.update([0]);
                    hasher.update(value.as_bytes());
                    hasher.update([0]);
                }
            }
        }
        hasher.update([1]);
    }
    Some(hex::encode(hasher.finalize())[..16].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::app;
    use k8s_openapi::ByteString;
    use streamapp_api::crd::{SaslSecret, TlsSecret};

    fn secret(data: &[(&str, &str)]) -> Secret {
        Secret {
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn the_pods_read_the_sasl_and_tls_secrets_only() {
        let mut app = app();
        assert!(referenced(&app).is_empty());
        app.spec.kafka.sasl = Some(SaslSecret {
            secret_name: "kafka-user".into(),
            username_key: "username".into(),
            password_key: "password".into(),
        });
        app.spec.kafka.tls = Some(TlsSecret {
            secret_name: "kafka-ca".into(),
        });
        assert_eq!(referenced(&app), ["kafka-ca", "kafka-user"]);
    }

    #[test]
    fn the_hash_follows_the_contents_and_nothing_else() {
        let one = contents_hash(&[("s".into(), Some(secret(&[("password", "a")])))]);
        let same = contents_hash(&[("s".into(), Some(secret(&[("password", "a")])))]);
        let changed = contents_hash(&[("s".into(), Some(secret(&[("password", "b")])))]);
        let missing = contents_hash(&[("s".into(), None)]);
        assert_eq!(one, same);
        assert_ne!(one, changed);
        assert_ne!(one, missing);
        assert_eq!(contents_hash(&[]), None);
    }
}
