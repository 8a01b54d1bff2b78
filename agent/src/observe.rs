//! One look at the processor: its health file, its HTTP probes, whether its process is alive,
//! and the state volume (see [`crate::disk`]). Blocking I/O only; the loop runs it off the
//! async runtime.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use streamapp_api::health::ProcessorHealth;
use streamapp_api::probe;
use streamapp_api::state_volume::StateDir;

use crate::disk::{self, DiskReport};

/// How long a probe of the processor may take: it is on loopback, so a slow answer is as
/// telling as none.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// The health file as found.
#[derive(Clone, Debug, PartialEq)]
pub enum HealthFile {
    /// No file: no processor has started on this volume yet.
    Missing,
    /// A file that cannot be read or parsed (the message says why).
    Unreadable(String),
    Present(Box<ProcessorHealth>),
}

impl HealthFile {
    pub fn read(path: &Path) -> HealthFile {
        match std::fs::read(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => HealthFile::Missing,
            Err(e) => HealthFile::Unreadable(format!("{}: {e}", path.display())),
            Ok(bytes) => match serde_json::from_slice(&bytes) {
                Ok(h) => HealthFile::Present(Box::new(h)),
                Err(e) => HealthFile::Unreadable(format!("{}: {e}", path.display())),
            },
        }
    }

    pub fn present(&self) -> Option<&ProcessorHealth> {
        match self {
            HealthFile::Present(h) => Some(h),
            _ => None,
        }
    }
}

/// What the processor's process and HTTP endpoints said.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Probes {
    /// `/healthz` answered 200.
    pub healthz: bool,
    /// `/readyz` answered 200.
    pub readyz: bool,
    /// The health file's pid is a running streamapp-processor, as far as this process can see
    /// (only when the pod shares its process namespace, or in tests; otherwise false).
    pub pid_alive: bool,
}

/// Everything one look found.
#[derive(Clone, Debug, PartialEq)]
pub struct Observation {
    pub health: HealthFile,
    pub disk: DiskReport,
    pub probes: Probes,
}

/// Looks at the processor on `port` and at its state volume.
#[derive(Clone, Debug)]
pub struct Observer {
    pub state: StateDir,
    pub processor: SocketAddr,
}

impl Observer {
    pub fn new(state: StateDir, processor_port: u16) -> Self {
        Observer {
            state,
            processor: SocketAddr::from(([127, 0, 0, 1], processor_port)),
        }
    }

    pub fn observe(&self) -> Observation {
        let answers = |path: &str| {
            probe::call(self.processor, "GET", path, PROBE_TIMEOUT).is_ok_and(|r| r.status == 200)
        };
        let healthz = answers(probe::HEALTHZ);
        // The live report is fresher than the file, and it is there also when a full volume
        // keeps the processor from rewriting the file.
        let live = probe::call(self.processor, "GET", probe::HEALTH, PROBE_TIMEOUT)
            .ok()
            .filter(|r| r.status == 200)
            .and_then(|r| serde_json::from_str(&r.body).ok());
        let health = freshest(live, HealthFile::read(&self.state.health_file()));
        let probes = Probes {
            healthz,
            // Not ready when not alive: saves a second timeout when the processor is gone.
            readyz: healthz && answers(probe::READYZ),
            pid_alive: health.present().is_some_and(|h| is_processor_alive(h.pid)),
        };
        Observation {
            health,
            disk: disk::inspect(&self.state),
            probes,
        }
    }
}

/// The processor's live report when it gave one, else the file.
pub fn freshest(live: Option<ProcessorHealth>, file: HealthFile) -> HealthFile {
    match live {
        Some(h) => HealthFile::Present(Box::new(h)),
        None => file,
    }
}

/// Whether `pid` is a live streamapp-processor. A bare "is there a process with that pid" is
/// not enough: without a shared process namespace the pid means nothing here (often it is
/// this very agent, pid 1 of its own container), and pids are reused. A zombie has an empty
/// command line, so it counts as gone.
pub fn is_processor_alive(pid: u32) -> bool {
    if pid == 0 || pid == std::process::id() {
        return false;
    }
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
        cmdline
            .split(|b| *b == 0)
            .next()
            .is_some_and(|argv0| argv0.ends_with(b"streamapp-processor"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_health_file_and_a_garbled_one_are_told_apart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("health.json");
        assert_eq!(HealthFile::read(&path), HealthFile::Missing);
        std::fs::write(&path, "{ not json").unwrap();
        assert!(
            matches!(HealthFile::read(&path), HealthFile::Unreadable(m) if m.contains("health.json"))
        );
        let health = ProcessorHealth::new("pod-0", "app", 1000);
        std::fs::write(&path, serde_json::to_vec(&health).unwrap()).unwrap();
        assert_eq!(
            HealthFile::read(&path),
            HealthFile::Present(Box::new(health))
        );
    }

    #[test]
    fn the_live_report_wins_over_a_stale_file() {
        let mut live = ProcessorHealth::new("pod-0", "app", 2000);
        live.not_ready_reason = Some("partition 0 backs off".into());
        let file = HealthFile::Present(Box::new(ProcessorHealth::new("pod-0", "app", 1000)));
        assert_eq!(
            freshest(Some(live.clone()), file.clone()),
            HealthFile::Present(Box::new(live))
        );
        assert_eq!(freshest(None, file.clone()), file);
    }

    #[test]
    fn only_a_live_streamapp_processor_counts_as_the_processor() {
        assert!(
            !is_processor_alive(std::process::id()),
            "the agent itself is not the processor"
        );
        assert!(!is_processor_alive(0));
        // A live process that is something else (this test binary's parent, a shell or cargo).
        assert!(!is_processor_alive(std::os::unix::process::parent_id()));
        // A pid that does not exist (above the kernel's pid_max of 2^22).
        assert!(!is_processor_alive(5_000_000));
    }

    #[test]
    fn a_processor_that_does_not_listen_is_neither_up_nor_ready() {
        let dir = tempfile::tempdir().unwrap();
        // A port nothing listens on: bind, learn it, close.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let obs = Observer::new(StateDir::new(dir.path(), None), port).observe();
        assert_eq!(obs.probes, Probes::default());
        assert_eq!(obs.health, HealthFile::Missing);
    }
}
