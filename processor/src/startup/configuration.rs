//! The configuration the processor runs with: the file, with the flags and environment
//! variables over it, resolved once ([`ProcessorConfig::resolve`]); and the Kafka client
//! properties it implies, with the credentials that come from Secrets.

use anyhow::Context;
use rdkafka::config::ClientConfig;
use streamapp_api::config::{CLIENT_DEFAULTS, ProcessorConfig, ResolvedConfig};

use super::RunArgs;

/// The configuration file with the flags and environment applied, resolved. The errors say
/// which file, or name every field that cannot be used.
pub(super) fn load(args: &RunArgs) -> anyhow::Result<ResolvedConfig> {
    let text = std::fs::read_to_string(&args.config)
        .with_context(|| format!("reading {}", args.config.display()))?;
    let mut config: ProcessorConfig = serde_yaml::from_str(&text)
        .with_context(|| format!("invalid configuration file {}", args.config.display()))?;
    apply_overrides(&mut config, args);
    Ok(config.resolve()?)
}

/// The flags (or their environment variables) that override fields of the file.
fn apply_overrides(config: &mut ProcessorConfig, args: &RunArgs) {
    if let Some(d) = &args.state_dir {
        config.state_dir = d.clone();
    }
    if let Some(d) = &args.wal_dir {
        config.wal_dir = Some(d.clone());
    }
    if let Some(p) = args.http_port {
        config.http_port = p;
    }
    if let Some(b) = &args.bootstrap_servers {
        config.kafka.bootstrap_servers = b.clone();
    }
}

/// The client properties consumers, producers and admin clients share: the bootstrap servers,
/// the user's properties, SASL credentials and the TLS files (a client certificate only when
/// both of its files are there).
pub(super) fn kafka_client(config: &ResolvedConfig, args: &RunArgs) -> ClientConfig {
    let client_certificate = args
        .kafka_tls_dir
        .as_deref()
        .is_some_and(|dir| dir.join("tls.crt").exists() && dir.join("tls.key").exists());
    client_properties(config, args, client_certificate)
}

fn client_properties(
    config: &ResolvedConfig,
    args: &RunArgs,
    client_certificate: bool,
) -> ClientConfig {
    let mut client = ClientConfig::new();
    client.set("bootstrap.servers", &config.kafka.bootstrap_servers);
    for (k, v) in CLIENT_DEFAULTS {
        client.set(*k, *v);
    }
    for (k, v) in &config.kafka.properties {
        client.set(k, v);
    }
    if let Some(u) = &args.sasl_username {
        client.set("sasl.username", u);
    }
    if let Some(p) = &args.sasl_password {
        client.set("sasl.password", p);
    }
    if let Some(dir) = &args.kafka_tls_dir {
        let file = |name: &str| dir.join(name).display().to_string();
        client.set("ssl.ca.location", file("ca.crt"));
        if client_certificate {
            client.set("ssl.certificate.location", file("tls.crt"));
            client.set("ssl.key.location", file("tls.key"));
        }
    }
    client
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    /// No flag given (built, not parsed: the environment of the test may set the variables).
    fn no_flags() -> RunArgs {
        RunArgs {
            config: "/etc/streamapp/processor.yaml".into(),
            pod_name: "app-0".into(),
            state_dir: None,
            wal_dir: None,
            http_port: None,
            bootstrap_servers: None,
            sasl_username: None,
            sasl_password: None,
            kafka_tls_dir: None,
            drain_token: None,
            agent_port: None,
        }
    }

    fn file() -> ProcessorConfig {
        serde_yaml::from_str(
            "applicationId: app\n\
             kafka:\n  bootstrapServers: kafka:9092\n  properties:\n    linger.ms: '5'\n\
             topology:\n  inputTopic: in\n  outputTopic: out\n  deadLetterTopic: dlq\n",
        )
        .unwrap()
    }

    #[test]
    fn flags_override_the_files_state_dir_wal_dir_port_and_bootstrap_servers() {
        let mut config = file();
        apply_overrides(&mut config, &no_flags());
        assert_eq!(config, file(), "no flag, no change");
        let flags = RunArgs {
            state_dir: Some("/data".into()),
            wal_dir: Some("/wal".into()),
            http_port: Some(9000),
            bootstrap_servers: Some("other:9093".into()),
            ..no_flags()
        };
        apply_overrides(&mut config, &flags);
        let r = config.resolve().unwrap();
        assert_eq!(r.state_dir, PathBuf::from("/data"));
        assert_eq!(r.wal_dir, Some(PathBuf::from("/wal")));
        assert_eq!(r.http_port, 9000);
        assert_eq!(r.kafka.bootstrap_servers, "other:9093");
    }

    #[test]
    fn the_client_bootstraps_again_after_10_s_without_metadata_unless_the_user_says_otherwise() {
        let config = file().resolve().unwrap();
        let client = client_properties(&config, &no_flags(), false);
        assert_eq!(
            client.get("metadata.recovery.rebootstrap.trigger.ms"),
            Some("10000")
        );
        let mut own = file();
        own.kafka.properties.insert(
            "metadata.recovery.rebootstrap.trigger.ms".into(),
            "60000".into(),
        );
        let client = client_properties(&own.resolve().unwrap(), &no_flags(), false);
        assert_eq!(
            client.get("metadata.recovery.rebootstrap.trigger.ms"),
            Some("60000")
        );
    }

    #[test]
    fn the_client_gets_the_users_properties_the_credentials_and_the_tls_files() {
        let config = file().resolve().unwrap();
        let plain = client_properties(&config, &no_flags(), false);
        assert_eq!(plain.get("bootstrap.servers"), Some("kafka:9092"));
        assert_eq!(plain.get("linger.ms"), Some("5"));
        assert_eq!(plain.get("sasl.username"), None);
        assert_eq!(plain.get("ssl.ca.location"), None);
        let secure = RunArgs {
            sasl_username: Some("u".into()),
            sasl_password: Some("pw".into()),
            kafka_tls_dir: Some("/tls".into()),
            ..no_flags()
        };
        let client = client_properties(&config, &secure, false);
        assert_eq!(client.get("sasl.username"), Some("u"));
        assert_eq!(client.get("sasl.password"), Some("pw"));
        assert_eq!(client.get("ssl.ca.location"), Some("/tls/ca.crt"));
        assert_eq!(client.get("ssl.certificate.location"), None);
        let client = client_properties(&config, &secure, true);
        assert_eq!(client.get("ssl.certificate.location"), Some("/tls/tls.crt"));
        assert_eq!(client.get("ssl.key.location"), Some("/tls/tls.key"));
    }
}
