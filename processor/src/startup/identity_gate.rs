//! After a fence, join again only as the current pod of this name (`streamapp_api::identity`).
//!
//! A processor that exits because another process took its identity leaves the fenced marker
//! on its volume. The next start finds it and, before anything joins the group, asks the agent
//! beside it whether this pod is still the one the API server has under its name: a pod that
//! was replaced (its node was lost and came back) waits, unready, until its kubelet stops it,
//! instead of fencing its replacement. A pod that is current goes on at once.

use std::net::SocketAddr;
use std::time::Duration;

use streamapp_api::identity::{self, IdentityAnswer};
use streamapp_api::probe;
use streamapp_api::state_volume::{StateDir, remove_if_present, write_atomically};
use tracing::{info, warn};

use streamapp_processor::shared::Shared;

/// How often the agent is asked while the answer is not "current".
const ASK_EVERY: Duration = Duration::from_secs(1);
const ASK_TIMEOUT: Duration = Duration::from_secs(5);

/// Records that this process was fenced (what fenced it), for the next start.
pub fn record_fence(state: &StateDir, detail: &str) {
    if let Err(e) = write_atomically(&state.fenced_file(), detail.as_bytes()) {
        warn!(error = %e, "could not record the fence on the state volume");
    }
}

/// What the start does about a recorded fence, given the agent's answer.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Join: no fence recorded, or this pod is the current one.
    Join(Option<String>),
    /// Not yet: why (also the readiness reason).
    Wait(String),
}

/// The decision, from what was found: the recorded fence (if any), whether an agent is there
/// to ask, and its answer (or why there is none).
pub fn step(
    fenced: Option<&str>,
    agent: bool,
    answer: Option<Result<IdentityAnswer, String>>,
) -> Step {
    let Some(fenced) = fenced else {
        return Step::Join(None);
    };
    if !agent {
        return Step::Join(Some(format!(
            "fenced before ({fenced}); no agent to confirm this pod's identity: joining"
        )));
    }
    match answer {
        Some(Ok(answer)) if answer.is_current() => Step::Join(Some(format!(
            "fenced before ({fenced}); the agent confirms: {}",
            answer.describe()
        ))),
        Some(Ok(answer)) => Step::Wait(format!(
            "fenced, and not the current pod of its name: {}; waiting to be stopped",
            answer.describe()
        )),
        Some(Err(why)) => Step::Wait(format!(
            "fenced; waiting for the agent to confirm this pod is the current one: {why}"
        )),
        None => Step::Wait(
            "fenced; waiting for the agent to confirm this pod is the current one".into(),
        ),
    }
}

/// Asks the agent on this pod's loopback.
fn ask(port: u16) -> Result<IdentityAnswer, String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let response = probe::call(addr, "GET", identity::PATH, ASK_TIMEOUT)
        .map_err(|e| format!("the agent on port {port} did not answer: {e}"))?;
    if response.status != 200 {
        return Err(format!(
            "the agent answered {}: {}",
            response.status,
            response.body.trim()
        ));
    }
    serde_json::from_str(&response.body)
        .map_err(|e| format!("the agent's answer is not an identity answer: {e}"))
}

/// Before the engines start: waits while [`step`] says so (unready, alive, asking every
/// second). Returns false when a drain was asked for meanwhile (the process stops).
pub fn wait_until_current(state: &StateDir, agent_port: Option<u16>, shared: &Shared) -> bool {
    let marker = state.fenced_file();
    let Ok(fenced) = std::fs::read_to_string(&marker) else {
        return true;
    };
    let mut last_reason = String::new();
    loop {
        shared.beat_all();
        if shared.drain_requested() {
            return false;
        }
        let answer = agent_port.map(ask);
        match step(Some(fenced.trim()), agent_port.is_some(), answer) {
            Step::Join(note) => {
                if let Some(note) = note {
                    info!("{note}");
                }
                if let Err(e) = remove_if_present(&marker) {
                    warn!(error = %e, "could not remove the fenced marker");
                }
                return true;
            }
            Step::Wait(reason) => {
                if reason != last_reason {
                    warn!("{reason}");
                    shared.set_not_ready(&reason);
                    last_reason = reason;
                }
                std::thread::sleep(ASK_EVERY);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(current: Option<&str>) -> IdentityAnswer {
        IdentityAnswer {
            pod: "orders-1".into(),
            uid: "uid-a".into(),
            current_uid: current.map(str::to_string),
        }
    }

    #[test]
    fn without_a_recorded_fence_the_processor_joins_without_asking() {
        assert_eq!(step(None, true, None), Step::Join(None));
    }

    #[test]
    fn after_a_fence_only_the_current_pod_joins() {
        let fence = Some("the group fenced this pod's group.instance.id");
        assert!(matches!(
            step(fence, true, Some(Ok(answer(Some("uid-a"))))),
            Step::Join(Some(note)) if note.contains("confirms")
        ));
        let replaced = step(fence, true, Some(Ok(answer(Some("uid-b")))));
        assert!(
            matches!(&replaced, Step::Wait(why) if why.contains("not the current pod") && why.contains("uid-b")),
            "{replaced:?}"
        );
        assert!(matches!(
            step(fence, true, Some(Ok(answer(None)))),
            Step::Wait(why) if why.contains("no longer exists")
        ));
    }

    #[test]
    fn after_a_fence_an_agent_that_cannot_tell_keeps_the_processor_waiting() {
        let waiting = step(
            Some("fenced"),
            true,
            Some(Err("the agent answered 503: forbidden".into())),
        );
        assert!(
            matches!(&waiting, Step::Wait(why) if why.contains("forbidden")),
            "{waiting:?}"
        );
    }

    #[test]
    fn after_a_fence_without_an_agent_the_processor_joins_and_says_so() {
        assert!(matches!(
            step(Some("fenced"), false, None),
            Step::Join(Some(note)) if note.contains("no agent")
        ));
    }

    /// Answers the identity requests on a loopback port with `answers`, one per connection
    /// (each request read whole, to its blank line). A request that is not `GET /identity`
    /// is answered 400, which keeps the gate waiting (and the test's bound ends it).
    fn agent_answering(answers: Vec<IdentityAnswer>) -> u16 {
        use std::io::{BufRead, BufReader, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for answer in answers {
                let (stream, _) = listener.accept().unwrap();
                let mut reader = BufReader::new(stream);
                let mut request_line = String::new();
                reader.read_line(&mut request_line).unwrap();
                let mut line = String::new();
                while reader.read_line(&mut line).unwrap() > 2 {
                    line.clear();
                }
                let (status, body) = if request_line.starts_with("GET /identity ") {
                    ("200 OK", serde_json::to_string(&answer).unwrap())
                } else {
                    ("400 Bad Request", format!("unexpected {request_line:?}"))
                };
                write!(
                    reader.get_mut(),
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
                .unwrap();
            }
        });
        port
    }

    #[test]
    fn a_replaced_pod_stays_unready_until_the_agent_says_it_is_current() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::new(dir.path(), None);
        record_fence(&state, "the producer was fenced");
        let shared = Shared::new(
            state.clone(),
            streamapp_api::health::ProcessorHealth::new("orders-1", "app", 0),
            1,
        );
        let port = agent_answering(vec![answer(Some("uid-b")), answer(Some("uid-a"))]);
        let started = std::time::Instant::now();
        // The wait has no end of its own (a replaced pod waits for its kubelet): a drain asked
        // for after 30 s ends it, and the test fails instead of hanging.
        let (done, watch) = std::sync::mpsc::channel::<()>();
        let joined = std::thread::scope(|scope| {
            let shared = &shared;
            scope.spawn(move || {
                if watch.recv_timeout(Duration::from_secs(30)).is_err() {
                    shared.request_drain(streamapp_api::health::DrainRequest::Signal);
                }
            });
            let joined = wait_until_current(&state, Some(port), shared);
            let _ = done.send(());
            joined
        });
        let reason = shared.health().not_ready_reason.unwrap_or_default();
        assert!(joined, "still waiting after 30 s: {reason}");
        assert!(
            started.elapsed() >= ASK_EVERY,
            "it waited for the second answer"
        );
        assert!(reason.contains("not the current pod"), "{reason}");
        assert!(!shared.is_ready());
        assert!(!state.fenced_file().exists());
    }

    #[test]
    fn a_recorded_fence_without_an_agent_is_removed_and_the_processor_joins() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::new(dir.path(), None);
        record_fence(&state, "the producer was fenced");
        assert_eq!(
            std::fs::read_to_string(state.fenced_file()).unwrap(),
            "the producer was fenced"
        );
        // No agent: joins, and the marker is gone.
        let shared = Shared::new(
            state.clone(),
            streamapp_api::health::ProcessorHealth::new("orders-1", "app", 0),
            1,
        );
        assert!(wait_until_current(&state, None, &shared));
        assert!(!state.fenced_file().exists());
    }
}
