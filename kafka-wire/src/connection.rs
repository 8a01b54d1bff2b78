//! One connection to a broker, speaking the Kafka wire protocol through the `kafka-protocol`
//! crate's messages: a size-prefixed request with its header, the response read back. Blocking
//! and one request at a time: its callers (a membership thread, the operator's blocking pool) wait.
//!
//! The versions of each API are the highest both sides support, up to the newest this module
//! was written against ([`OURS`]), learnt with ApiVersions when the connection opens. With TLS
//! the connection is a rustls stream; with SASL it authenticates right after ApiVersions
//! (SaslHandshake, then SaslAuthenticate rounds), as Kafka's own clients do
//! ([`crate::security`]).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, FindCoordinatorRequest, RequestHeader,
    ResponseHeader, SaslAuthenticateRequest, SaslHandshakeRequest,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};
use rustls::pki_types::ServerName;

use crate::scram::Scram;
use crate::security::{Sasl, Security};
use streamapp_api::config::SaslMechanism;

/// The versions of each API this module speaks: from the first with what static membership
/// needs (`group.instance.id`, LeaveGroup by instance) to the newest its messages were checked
/// against.
const OURS: [(ApiKey, i16, i16); 5] = [
    (ApiKey::FindCoordinator, 1, 4),
    (ApiKey::JoinGroup, 5, 9),
    (ApiKey::SyncGroup, 3, 5),
    (ApiKey::Heartbeat, 3, 4),
    (ApiKey::LeaveGroup, 3, 5),
];

/// APIs negotiated when the broker speaks them, without which the connection still works:
/// DescribeTransactions (Kafka 3.0, KIP-664) tells a zombie from a transaction the
/// coordinator timed out (the processor's `txn_coordinator`); Metadata from version 10 (Kafka 2.8,
/// KIP-516) gives a topic's id (the processor's `changelog::topic_id`) and partition leaders;
/// DescribeGroups from version 4 (static members' instance ids) finds the members the operator
/// removes after a scale-in; DescribeProducers, ListTransactions (Kafka 3.0, KIP-664) and
/// WriteTxnMarkers find and end hanging transactions ([`crate::transactions`]), ListOffsets
/// from version 2 (an isolation level) tells where read_committed readers stop.
const OPTIONAL: [(ApiKey, i16, i16); 7] = [
    (ApiKey::DescribeTransactions, 0, 0),
    (ApiKey::Metadata, 10, 12),
    (ApiKey::DescribeGroups, 4, 6),
    (ApiKey::DescribeProducers, 0, 0),
    (ApiKey::ListTransactions, 0, 1),
    (ApiKey::WriteTxnMarkers, 1, 1),
    (ApiKey::ListOffsets, 2, 7),
];

/// The SASL APIs, negotiated only when the connection authenticates: SaslHandshake v1 (the
/// tokens then travel in SaslAuthenticate requests) and SaslAuthenticate up to v2.
const SASL: [(ApiKey, i16, i16); 2] = [
    (ApiKey::SaslHandshake, 1, 1),
    (ApiKey::SaslAuthenticate, 0, 2),
];

/// ApiVersions v3 is flexible and every broker this project supports answers it.
const API_VERSIONS_VERSION: i16 = 3;

/// Responses larger than this are refused (a JoinGroup response of a large group is the
/// largest message here).
const MAX_RESPONSE: usize = 64 << 20;

#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("{address}: {what}: {source}")]
    Io {
        address: String,
        what: &'static str,
        source: std::io::Error,
    },
    #[error("{address}: {detail}")]
    Protocol { address: String, detail: String },
    /// TLS or SASL failed: a setting or a credential is wrong, retrying will not help until
    /// it is fixed.
    #[error("{address}: {detail}")]
    Security { address: String, detail: String },
}

/// What FindCoordinator looks up (its `key_type`).
#[derive(Clone, Copy, Debug)]
pub enum CoordinatorKind {
    Group = 0,
    Transaction = 1,
}

/// The first of `bootstrap` (host:port) that opens a connection; the last failure otherwise.
pub fn open_first(
    bootstrap: &[String],
    client_id: &str,
    timeout: Duration,
    security: &Security,
) -> Result<Connection, String> {
    let mut last = String::from("no bootstrap broker configured");
    for broker in bootstrap {
        match Connection::open(broker, client_id, timeout, security) {
            Ok(c) => return Ok(c),
            Err(e) => last = e.to_string(),
        }
    }
    Err(last)
}

/// A connection to the coordinator of `key` (a group, or a transactional id), found through the
/// first of `bootstrap` that answers.
pub fn open_coordinator(
    bootstrap: &[String],
    client_id: &str,
    timeout: Duration,
    security: &Security,
    kind: CoordinatorKind,
    key: &str,
) -> Result<Connection, String> {
    let mut connection = open_first(bootstrap, client_id, timeout, security)?;
    let address = connection
        .find_coordinator(kind, key)
        .map_err(|e| e.to_string())?
        .map_err(|code| format!("finding the coordinator of {key}: error code {code}"))?;
    if address == connection.address() {
        return Ok(connection);
    }
    open_first(&[address], client_id, timeout, security)
}

/// The byte stream under the protocol: TCP, or TLS over it.
enum Transport {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Transport {
    fn tcp(&self) -> &TcpStream {
        match self {
            Transport::Plain(s) => s,
            Transport::Tls(s) => &s.sock,
        }
    }
}

impl Read for Transport {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Transport::Plain(s) => s.read(buf),
            Transport::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Transport {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Transport::Plain(s) => s.write(buf),
            Transport::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Transport::Plain(s) => s.flush(),
            Transport::Tls(s) => s.flush(),
        }
    }
}

pub struct Connection {
    address: String,
    stream: Transport,
    correlation_id: i32,
    versions: BTreeMap<i16, i16>,
    client_id: StrBytes,
}

impl Connection {
    /// Connects to `address` (host:port), secured as `security` says, and learns which
    /// versions to speak.
    pub fn open(
        address: &str,
        client_id: &str,
        timeout: Duration,
        security: &Security,
    ) -> Result<Self, WireError> {
        let io = |what: &'static str| {
            let address = address.to_string();
            move |source| WireError::Io {
                address,
                what,
                source,
            }
        };
        let socket = address
            .to_socket_addrs()
            .map_err(io("resolving"))?
            .next()
            .ok_or_else(|| WireError::Protocol {
                address: address.to_string(),
                detail: "resolves to no address".into(),
            })?;
        let tcp = TcpStream::connect_timeout(&socket, timeout).map_err(io("connecting"))?;
        tcp.set_nodelay(true).map_err(io("setting TCP_NODELAY"))?;
        tcp.set_read_timeout(Some(timeout))
            .and_then(|()| tcp.set_write_timeout(Some(timeout)))
            .map_err(io("setting the socket timeout"))?;
        let stream = match &security.tls {
            None => Transport::Plain(tcp),
            Some(tls) => Transport::Tls(Box::new(handshake(address, tls, tcp)?)),
        };
        let mut connection = Connection {
            address: address.to_string(),
            stream,
            correlation_id: 0,
            versions: BTreeMap::new(),
            client_id: StrBytes::from_string(client_id.to_string()),
        };
        let request = ApiVersionsRequest::default()
            .with_client_software_name(StrBytes::from_static_str("streamapp-processor"))
            .with_client_software_version(StrBytes::from_static_str(env!("CARGO_PKG_VERSION")));
        let response: ApiVersionsResponse = connection.exchange(API_VERSIONS_VERSION, &request)?;
        if response.error_code != 0 {
            return Err(connection.protocol(format!(
                "ApiVersions failed with error code {}",
                response.error_code
            )));
        }
        let needed = OURS
            .iter()
            .chain(security.sasl.as_ref().map_or(&[][..], |_| &SASL[..]));
        for &(key, min, max) in needed {
            let theirs = response.api_keys.iter().find(|k| k.api_key == key as i16);
            match theirs {
                Some(k) if k.min_version <= max && k.max_version >= min => {
                    connection
                        .versions
                        .insert(key as i16, max.min(k.max_version));
                }
                _ => {
                    return Err(connection.protocol(format!(
                        "the broker speaks no version of {key:?} from {min} to {max}"
                    )));
                }
            }
        }
        for &(key, min, max) in &OPTIONAL {
            if let Some(k) = response
                .api_keys
                .iter()
                .find(|k| k.api_key == key as i16 && k.min_version <= max && k.max_version >= min)
            {
                connection
                    .versions
                    .insert(key as i16, max.min(k.max_version));
            }
        }
        if let Some(sasl) = &security.sasl {
            connection.authenticate(sasl)?;
        }
        Ok(connection)
    }

    /// SASL: the mechanism is agreed with SaslHandshake, then its tokens are exchanged in
    /// SaslAuthenticate requests until the broker accepts (or refuses) the credentials.
    fn authenticate(&mut self, sasl: &Sasl) -> Result<(), WireError> {
        let mechanism = sasl.mechanism.name();
        let response = self.send(
            &SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str(mechanism)),
        )?;
        if response.error_code != 0 {
            let offered: Vec<String> = response.mechanisms.iter().map(|m| m.to_string()).collect();
            return Err(self.security(format!(
                "the broker does not accept SASL {mechanism} here (it offers {offered:?})"
            )));
        }
        match sasl.mechanism {
            SaslMechanism::Plain => {
                let token = format!("\0{}\0{}", sasl.username, sasl.password);
                self.sasl_round(mechanism, token.into_bytes())?;
            }
            SaslMechanism::ScramSha256 | SaslMechanism::ScramSha512 => {
                let nonce = Scram::random_nonce().map_err(|e| self.security(e))?;
                let scram = Scram::new(sasl.mechanism, &sasl.username, &sasl.password, nonce);
                let server_first = self.sasl_round(mechanism, scram.client_first().into_bytes())?;
                let (client_final, awaiting) = scram
                    .client_final(&String::from_utf8_lossy(&server_first))
                    .map_err(|e| self.security(format!("SASL {mechanism}: {e}")))?;
                let server_final = self.sasl_round(mechanism, client_final.into_bytes())?;
                awaiting
                    .check(&String::from_utf8_lossy(&server_final))
                    .map_err(|e| self.security(format!("SASL {mechanism}: {e}")))?;
            }
        }
        Ok(())
    }

    /// One SaslAuthenticate round: our token out, the broker's back.
    fn sasl_round(&mut self, mechanism: &str, token: Vec<u8>) -> Result<Bytes, WireError> {
        let response =
            self.send(&SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(token)))?;
        if response.error_code != 0 {
            let message = response
                .error_message
                .map(|m| m.to_string())
                .unwrap_or_default();
            return Err(self.security(format!(
                "SASL {mechanism} authentication failed (error code {}): {message}",
                response.error_code
            )));
        }
        Ok(response.auth_bytes)
    }

    pub fn address(&self) -> &str {
        &self.address
    }

    /// How long a request may take before the connection counts as broken (a JoinGroup waits
    /// for the whole group, up to the rebalance timeout).
    pub fn set_timeout(&mut self, timeout: Duration) -> Result<(), WireError> {
        let address = self.address.clone();
        let tcp = self.stream.tcp();
        tcp.set_read_timeout(Some(timeout))
            .and_then(|()| tcp.set_write_timeout(Some(timeout)))
            .map_err(|source| WireError::Io {
                address,
                what: "setting the socket timeout",
                source,
            })
    }

    /// The coordinator of `key` (a group, or a transactional id): `Ok(Ok(host:port))`, or the
    /// error code the broker answered with.
    pub fn find_coordinator(
        &mut self,
        kind: CoordinatorKind,
        key: &str,
    ) -> Result<Result<String, i16>, WireError> {
        let key = StrBytes::from_string(key.to_string());
        // Version 4 and later ask and answer per key; earlier ones at the top level.
        let batched = self.version(ApiKey::FindCoordinator) >= 4;
        let request = if batched {
            FindCoordinatorRequest::default().with_coordinator_keys(vec![key])
        } else {
            FindCoordinatorRequest::default().with_key(key)
        };
        let response = self.send(&request.with_key_type(kind as i8))?;
        let (code, host, port) = match response.coordinators.first() {
            Some(c) if batched => (c.error_code, c.host.to_string(), c.port),
            _ => (
                response.error_code,
                response.host.to_string(),
                response.port,
            ),
        };
        Ok(if code == 0 {
            Ok(format!("{host}:{port}"))
        } else {
            Err(code)
        })
    }

    /// Whether the broker speaks `key` at a version this module does (an optional API).
    pub fn speaks(&self, key: ApiKey) -> bool {
        self.versions.contains_key(&(key as i16))
    }

    /// The version of `key` this connection speaks.
    pub fn version(&self, key: ApiKey) -> i16 {
        self.versions[&(key as i16)]
    }

    /// Sends `request` at the version this connection speaks for it, and reads its response.
    pub fn send<R: Request>(&mut self, request: &R) -> Result<R::Response, WireError> {
        let version = *self
            .versions
            .get(&R::KEY)
            .ok_or_else(|| self.protocol(format!("API {} was not negotiated", R::KEY)))?;
        self.exchange(version, request)
    }

    /// Sends `request` at `version`, an API or a version this module does not negotiate: for
    /// a caller that speaks an older protocol on purpose (the tests' hanging transaction, made
    /// the way old clients could make one). The broker refuses a version it does not speak.
    pub fn send_at<R: Request>(
        &mut self,
        version: i16,
        request: &R,
    ) -> Result<R::Response, WireError> {
        self.exchange(version, request)
    }

    fn protocol(&self, detail: String) -> WireError {
        WireError::Protocol {
            address: self.address.clone(),
            detail,
        }
    }

    fn security(&self, detail: String) -> WireError {
        WireError::Security {
            address: self.address.clone(),
            detail,
        }
    }

    /// Sends `request` at `version` and reads its response.
    fn exchange<R: Request>(
        &mut self,
        version: i16,
        request: &R,
    ) -> Result<R::Response, WireError> {
        self.correlation_id = self.correlation_id.wrapping_add(1);
        let header = RequestHeader::default()
            .with_request_api_key(R::KEY)
            .with_request_api_version(version)
            .with_correlation_id(self.correlation_id)
            .with_client_id(Some(self.client_id.clone()));
        let mut body = BytesMut::new();
        header
            .encode(&mut body, R::header_version(version))
            .and_then(|()| request.encode(&mut body, version))
            .map_err(|e| self.protocol(format!("encoding request {}: {e}", R::KEY)))?;
        let mut frame = BytesMut::with_capacity(4 + body.len());
        frame.put_i32(body.len() as i32);
        frame.put(body);
        let io = |what: &'static str| {
            let address = self.address.clone();
            move |source| WireError::Io {
                address,
                what,
                source,
            }
        };
        self.stream
            .write_all(&frame)
            .map_err(io("sending a request"))?;
        let mut size = [0u8; 4];
        self.stream
            .read_exact(&mut size)
            .map_err(io("reading a response"))?;
        let size = i32::from_be_bytes(size);
        if size < 0 || size as usize > MAX_RESPONSE {
            return Err(self.protocol(format!("response of {size} bytes")));
        }
        let mut buf = vec![0u8; size as usize];
        self.stream
            .read_exact(&mut buf)
            .map_err(io("reading a response"))?;
        let mut buf = Bytes::from(buf);
        let header = ResponseHeader::decode(&mut buf, R::Response::header_version(version))
            .map_err(|e| self.protocol(format!("decoding a response header: {e}")))?;
        if header.correlation_id != self.correlation_id {
            return Err(self.protocol(format!(
                "response to request {} where {} was expected",
                header.correlation_id, self.correlation_id
            )));
        }
        let response = R::Response::decode(&mut buf, version)
            .map_err(|e| self.protocol(format!("decoding the response to {}: {e}", R::KEY)))?;
        if buf.has_remaining() {
            return Err(self.protocol(format!(
                "{} bytes left after the response to {}",
                buf.remaining(),
                R::KEY
            )));
        }
        Ok(response)
    }
}

/// The TLS handshake with the broker at `address`, whose certificate must name its host (or
/// IP address) unless the configuration says otherwise.
fn handshake(
    address: &str,
    tls: &Arc<rustls::ClientConfig>,
    mut tcp: TcpStream,
) -> Result<rustls::StreamOwned<rustls::ClientConnection, TcpStream>, WireError> {
    let failed = |detail: String| WireError::Security {
        address: address.to_string(),
        detail,
    };
    let host = address
        .rsplit_once(':')
        .map_or(address, |(host, _)| host)
        .trim_start_matches('[')
        .trim_end_matches(']');
    let name = match host.parse::<IpAddr>() {
        Ok(ip) => ServerName::IpAddress(ip.into()),
        Err(_) => ServerName::try_from(host.to_string())
            .map_err(|e| failed(format!("{host} is not a TLS server name: {e}")))?,
    };
    let mut session = rustls::ClientConnection::new(tls.clone(), name)
        .map_err(|e| failed(format!("TLS: {e}")))?;
    while session.is_handshaking() {
        session.complete_io(&mut tcp).map_err(|e| {
            if e.kind() == std::io::ErrorKind::InvalidData {
                // rustls' own verdict: a certificate, a protocol version, a cipher.
                failed(format!("TLS handshake: {e}"))
            } else {
                WireError::Io {
                    address: address.to_string(),
                    what: "in the TLS handshake",
                    source: e,
                }
            }
        })?;
    }
    Ok(rustls::StreamOwned::new(session, tcp))
}
