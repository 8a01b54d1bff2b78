//! Programs a test runs itself (a processor, an agent, the operator): a free loopback port for
//! them to listen on, and a child process that cannot outlive the test, with its output in a
//! log file the test's failure messages quote.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

/// A TCP port on the loopback interface that nothing listens on right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("binding a loopback port")
        .local_addr()
        .expect("the bound port")
        .port()
}

/// How many lines of a program's log a failure message quotes.
const LOG_TAIL_LINES: usize = 40;

/// A child process with its standard output and error appended to a log file. It is killed
/// (SIGKILL) and reaped when dropped, so a failing test leaves nothing running.
pub struct Spawned {
    child: Option<Child>,
    pub log: PathBuf,
}

impl Spawned {
    /// Starts `cmd` with its output appended to `log`.
    pub fn spawn(mut cmd: Command, log: &Path) -> Spawned {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap_or_else(|e| panic!("opening {}: {e}", log.display()));
        cmd.stdout(file.try_clone().expect("a second handle of the log file"))
            .stderr(file);
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting {cmd:?}: {e}"));
        Spawned {
            child: Some(child),
            log: log.into(),
        }
    }

    /// The process id; panics once the process was reaped.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("the process is running").id()
    }

    /// Sends `signal` (`TERM`, `STOP`, `CONT`, ...) with kill(1): no unsafe code here.
    pub fn signal(&self, signal: &str) {
        let pid = self.pid().to_string();
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &pid])
            .status()
            .expect("running kill");
        assert!(status.success(), "kill -{signal} {pid} failed");
    }

    /// How the process ended, if it has (without waiting).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().expect("checking the child"))
    }

    /// Whether the process still runs.
    pub fn is_running(&mut self) -> bool {
        self.child.is_some() && self.exited().is_none()
    }

    /// SIGKILL: no drain, no flush, no goodbye.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Waits for the process to exit; returns its exit code (None when a signal ended it).
    /// Panics with the log's tail after `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.exited() {
                self.child = None;
                return status.code();
            }
            assert!(
                Instant::now() < deadline,
                "{} did not exit within {timeout:?}:\n{}",
                self.log.display(),
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Everything the process wrote so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last lines of the log, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = self.log_text();
        let lines: Vec<&str> = text.lines().collect();
        format!(
            "--- {} ---\n{}",
            self.log.display(),
            lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
        )
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        self.kill9();
    }
}
