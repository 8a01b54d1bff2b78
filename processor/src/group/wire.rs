//! One connection to a broker, speaking the Kafka wire protocol through the `kafka-protocol`
//! crate's messages: a size-prefixed request with its header, the response read back. Blocking
//! and one request at a time: the membership thread has nothing else to do meanwhile.
//!
//! The versions of each API are the highest both sides support, up to the newest this module
//! was written against ([`OURS`]), learnt with ApiVersions when the connection opens.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, RequestHeader, ResponseHeader,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};

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
}

pub struct Connection {
    address: String,
    stream: TcpStream,
    correlation_id: i32,
    versions: BTreeMap<i16, i16>,
    client_id: StrBytes,
}

impl Connection {
    /// Connects to `address` (host:port) and learns which versions to speak.
    pub fn open(address: &str, client_id: &str, timeout: Duration) -> Result<Self, WireError> {
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
        let stream = TcpStream::connect_timeout(&socket, timeout).map_err(io("connecting"))?;
        stream
            .set_nodelay(true)
            .map_err(io("setting TCP_NODELAY"))?;
        let mut connection = Connection {
            address: address.to_string(),
            stream,
            correlation_id: 0,
            versions: BTreeMap::new(),
            client_id: StrBytes::from_string(client_id.to_string()),
        };
        connection.set_timeout(timeout)?;
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
        for (key, min, max) in OURS {
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
        Ok(connection)
    }

    pub fn address(&self) -> &str {
        &self.address
    }

    /// How long a request may take before the connection counts as broken (a JoinGroup waits
    /// for the whole group, up to the rebalance timeout).
    pub fn set_timeout(&mut self, timeout: Duration) -> Result<(), WireError> {
        let address = self.address.clone();
        self.stream
            .set_read_timeout(Some(timeout))
            .and_then(|()| self.stream.set_write_timeout(Some(timeout)))
            .map_err(|source| WireError::Io {
                address,
                what: "setting the socket timeout",
                source,
            })
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

    fn protocol(&self, detail: String) -> WireError {
        WireError::Protocol {
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
