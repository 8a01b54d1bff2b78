//! `streamapp-processor drain`, the preStop hook: asks the processor on this host to drain
//! (finish the transaction, flush, checkpoint, stop) and waits for its answer.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use streamapp_api::probe;

use crate::EXIT_FAILED;

/// Exit 0 when the processor drained, or when none listens (nothing to drain).
pub fn run(port: u16, timeout: Duration) -> ExitCode {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    match probe::call(addr, "POST", probe::DRAIN, timeout) {
        Ok(r) if r.status == 200 => {
            println!("{}", r.body.trim());
            ExitCode::SUCCESS
        }
        Ok(r) => {
            eprintln!("drain failed (HTTP {}): {}", r.status, r.body.trim());
            ExitCode::from(EXIT_FAILED)
        }
        // Nothing listens: there is no running processor to drain.
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            eprintln!("no processor is listening on {addr}: nothing to drain");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("drain request to {addr} failed: {e}");
            ExitCode::from(EXIT_FAILED)
        }
    }
}
