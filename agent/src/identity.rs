//! `GET /identity` (`streamapp_api::identity`): whether this pod is the one the API server has
//! under its name. The processor beside it asks after a fence, before it joins its group again:
//! a pod that was replaced (its node was lost and came back) must not take its name back.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client};
use streamapp_api::identity::IdentityAnswer;

/// Where the agent looks: its own pod, by name, on the API server.
pub struct IdentitySource {
    pods: Api<Pod>,
    pod: String,
    uid: Option<String>,
}

impl IdentitySource {
    pub fn new(client: Client, namespace: &str, pod: &str, uid: Option<String>) -> Self {
        IdentitySource {
            pods: Api::namespaced(client, namespace),
            pod: pod.to_string(),
            uid,
        }
    }

    /// The answer, or why there is none.
    pub async fn answer(&self) -> Result<IdentityAnswer, String> {
        let Some(uid) = self.uid.as_deref() else {
            // Without its own UID the agent cannot compare: not worth a request.
            return answer(&self.pod, None, Ok(None));
        };
        let found = self
            .pods
            .get_opt(&self.pod)
            .await
            .map(|pod| pod.and_then(|p| p.metadata.uid))
            .map_err(|e| describe_error(&self.pod, &e));
        answer(&self.pod, Some(uid), found)
    }
}

/// From this pod's UID and what the API server has under its name (the UID of the pod of that
/// name, if any, or why it could not be read) to the answer.
pub fn answer(
    pod: &str,
    uid: Option<&str>,
    found: Result<Option<String>, String>,
) -> Result<IdentityAnswer, String> {
    let Some(uid) = uid else {
        return Err("the agent was started without POD_UID: it cannot tell this pod from another of its name".into());
    };
    Ok(IdentityAnswer {
        pod: pod.to_string(),
        uid: uid.to_string(),
        current_uid: found?,
    })
}

fn describe_error(pod: &str, e: &kube::Error) -> String {
    match e {
        kube::Error::Api(response) if response.code == 403 => format!(
            "reading pod {pod} is forbidden: the agent's ServiceAccount needs get on pods/{pod} \
             (the operator's Role for the agent grants it)"
        ),
        other => format!("reading pod {pod} from the API server: {other}"),
    }
}

/// The endpoint: 200 with the answer, 503 with the reason when the agent cannot tell.
pub async fn page(State(source): State<Arc<IdentitySource>>) -> Response {
    match source.answer().await {
        Ok(answer) => Json(answer).into_response(),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, reason).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_compares_this_pods_uid_with_the_api_servers() {
        let current = answer("orders-1", Some("uid-a"), Ok(Some("uid-a".into()))).unwrap();
        assert!(current.is_current());
        let replaced = answer("orders-1", Some("uid-a"), Ok(Some("uid-b".into()))).unwrap();
        assert!(!replaced.is_current());
        assert_eq!(replaced.current_uid.as_deref(), Some("uid-b"));
        let gone = answer("orders-1", Some("uid-a"), Ok(None)).unwrap();
        assert!(!gone.is_current());
    }

    #[test]
    fn without_its_uid_or_the_api_server_the_agent_cannot_tell_and_says_why() {
        let err = answer("orders-1", None, Ok(Some("uid-a".into()))).unwrap_err();
        assert!(err.contains("POD_UID"), "{err}");
        let err = answer("orders-1", Some("uid-a"), Err("forbidden".into())).unwrap_err();
        assert_eq!(err, "forbidden");
    }
}
