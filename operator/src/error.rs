//! The operator's one error type.

/// Everything that can go wrong in the operator, with the context a user needs to act.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{action}: {source}")]
    Kube {
        /// What the operator was doing, e.g. "applying StatefulSet shop/orders".
        action: String,
        #[source]
        source: kube::Error,
    },

    #[error("rendering the processor configuration of {app}: {source}")]
    Render {
        app: String,
        #[source]
        source: serde_yaml::Error,
    },

    #[error(
        "the StreamApp CustomResourceDefinition (streamapps.streamapp.dev) is not installed: \
         install it with `kubectl apply -f crds/streamapp.dev_streamapps.yaml` or the Helm chart, then restart the operator"
    )]
    CrdMissing,

    #[error("checking that the StreamApp CRD is installed: {0}")]
    CrdCheck(#[source] kube::Error),

    #[error("lost the leader lease {lease}: {why}")]
    LeadershipLost { lease: String, why: String },

    #[error("serving metrics on port {port}: {source}")]
    MetricsServer {
        port: u16,
        #[source]
        source: std::io::Error,
    },
}

/// `Result` with the operator's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The `error` label of the reconcile error counter: a small, fixed set of values.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube { .. } => "kube_api",
            Error::Render { .. } => "render",
            Error::CrdMissing => "crd_missing",
            Error::CrdCheck(_) => "crd_check",
            Error::LeadershipLost { .. } => "leadership_lost",
            Error::MetricsServer { .. } => "metrics_server",
        }
    }

    /// Wraps a client error with what was being done.
    pub fn kube(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let action = action.into();
        move |source| Error::Kube { action, source }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_crd_error_says_how_to_install_it() {
        let message = Error::CrdMissing.to_string();
        assert!(
            message.contains("kubectl apply -f crds/streamapp.dev_streamapps.yaml"),
            "{message}"
        );
        assert!(message.contains("Helm chart"), "{message}");
        assert_eq!(Error::CrdMissing.metric_label(), "crd_missing");
    }
}
