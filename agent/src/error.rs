//! The agent's one error type.

use std::path::PathBuf;

/// Everything that can go wrong in the agent, with the context an operator needs to act.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No Kubernetes client could be built (no in-cluster service account, no kubeconfig).
    #[error("no Kubernetes client configuration (in-cluster service account or KUBECONFIG): {0}")]
    KubeConfig(#[source] kube::Error),

    /// The API server refused or failed the status write.
    #[error("writing status.pods[{pod}] of StreamApp {namespace}/{app}: {source}")]
    StatusWrite {
        namespace: String,
        app: String,
        pod: String,
        source: kube::Error,
    },

    /// Reading the StreamApp (at start-up, to learn what was already reported) failed.
    #[error("reading StreamApp {namespace}/{app}: {source}")]
    ReadApp {
        namespace: String,
        app: String,
        source: kube::Error,
    },

    /// Creating a Kubernetes Event failed.
    #[error("creating an Event for StreamApp {namespace}/{app}: {source}")]
    Event {
        namespace: String,
        app: String,
        source: kube::Error,
    },

    /// The metrics endpoint could not listen.
    #[error("listening for /metrics on {addr}: {source}")]
    Listen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },

    /// Installing the SIGTERM handler failed.
    #[error("installing the SIGTERM handler: {0}")]
    Signal(#[source] std::io::Error),

    /// The state directory does not exist (volume not mounted?).
    #[error(
        "state directory {0} does not exist: is the state volume mounted, and STREAMAPP_STATE_DIR right?"
    )]
    NoStateDir(PathBuf),
}

impl Error {
    /// A short, stable label for metrics and logs.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::KubeConfig(_) => "kube_config",
            Error::StatusWrite { .. } => "status_write",
            Error::ReadApp { .. } => "read_app",
            Error::Event { .. } => "event",
            Error::Listen { .. } => "listen",
            Error::Signal(_) => "signal",
            Error::NoStateDir(_) => "no_state_dir",
        }
    }

    /// Whether the API server answered 403 Forbidden (the agent's Role does not allow it).
    pub fn is_forbidden(&self) -> bool {
        matches!(self.kube_error(), Some(kube::Error::Api(s)) if s.code == 403)
    }

    fn kube_error(&self) -> Option<&kube::Error> {
        match self {
            Error::KubeConfig(e) => Some(e),
            Error::StatusWrite { source, .. }
            | Error::ReadApp { source, .. }
            | Error::Event { source, .. } => Some(source),
            _ => None,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
