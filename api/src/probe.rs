//! The processor's local HTTP endpoints, as the `drain` command and the agent call them.
//!
//! A deliberately tiny HTTP/1.1 client over a loopback TCP connection: it only ever talks to
//! the processor beside it in the same pod.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Liveness: 200 while the processing loop makes progress (polls, commits, restore steps,
/// or waits by choice), 503 once it has been stuck longer than `livenessTimeout`.
pub const HEALTHZ: &str = "/healthz";
/// Readiness: 200 once the processor has its assignment and every store it owns is restored
/// and processing (also when it owns no partition at all), 503 with the reason otherwise.
pub const READYZ: &str = "/readyz";
/// The processor's health report as JSON (the health file's content, fresh from memory: it
/// answers also when the state volume is full and the file cannot be rewritten).
pub const HEALTH: &str = "/health";
/// Drain (POST): finish, flush, checkpoint, stop. Waits for the outcome.
pub const DRAIN: &str = "/drain";

/// Status code and body of a response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub body: String,
}

/// Sends `method path` to `addr` and reads the whole response, within `timeout`.
pub fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    timeout: Duration,
) -> std::io::Result<Response> {
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    // One write: `write!` on the bare stream would send each piece of the format as a segment
    // of its own, and a server that reads the request once would see only its start.
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes())?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "malformed HTTP response");
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(bad)?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok(Response { status, body })
}
