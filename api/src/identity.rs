//! Whether a pod is the current holder of its name: the agent's `GET /identity`, which a
//! processor asks after it was fenced, before it joins its group again.
//!
//! A StatefulSet pod's name is its identity in Kafka (`group.instance.id`, `transactional.id`).
//! When a node is lost, the operator replaces its pod: the old pod object is deleted and a new
//! one of the same name (a new UID) starts elsewhere, and takes the identity over, fencing the
//! old process. If the lost node comes back before its kubelet learns that its pod is gone, the
//! kubelet may restart the fenced processor, which would join with the same identity and fence
//! the new pod in turn — two pods taking one identity from each other. So a processor that was
//! fenced waits, unready, until its agent has seen on the API server that the pod of its name
//! is its own pod (the same UID). See docs/design.md, "Zombies are fenced".

use serde::{Deserialize, Serialize};

/// The agent's endpoint (on its metrics port, reached over the pod's loopback).
pub const PATH: &str = "/identity";

/// The agent's answer, 200 when it could look (503 with a plain-text reason otherwise).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IdentityAnswer {
    /// The pod's name.
    pub pod: String,
    /// This pod's UID (the agent's downward API).
    pub uid: String,
    /// The UID of the pod of that name on the API server; `None` when there is none.
    pub current_uid: Option<String>,
}

impl IdentityAnswer {
    /// Whether this pod is the one the API server has under its name.
    pub fn is_current(&self) -> bool {
        self.current_uid.as_deref() == Some(self.uid.as_str())
    }

    /// One line for a log or a status message.
    pub fn describe(&self) -> String {
        match &self.current_uid {
            Some(current) if *current == self.uid => {
                format!(
                    "pod {} ({}) is the current pod of its name",
                    self.pod, self.uid
                )
            }
            Some(current) => format!(
                "pod {} ({}) was replaced: the current pod of that name is {current}",
                self.pod, self.uid
            ),
            None => format!(
                "pod {} ({}) no longer exists on the API server",
                self.pod, self.uid
            ),
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
    fn only_the_same_uid_is_current() {
        assert!(answer(Some("uid-a")).is_current());
        assert!(!answer(Some("uid-b")).is_current());
        assert!(!answer(None).is_current());
        assert!(answer(Some("uid-b")).describe().contains("replaced"));
        assert!(answer(None).describe().contains("no longer exists"));
    }

    #[test]
    fn the_answer_is_camel_case_json() {
        let json = serde_json::to_value(answer(Some("uid-b"))).unwrap();
        assert_eq!(
            json,
            serde_json::json!({ "pod": "orders-1", "uid": "uid-a", "currentUid": "uid-b" })
        );
    }
}
