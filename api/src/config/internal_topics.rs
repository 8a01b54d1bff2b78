//! The topics a StreamApp's processors create for themselves, named after the application id
//! (`<namespace>.<name>`, see [`ProcessorConfig::application_id`](super::ProcessorConfig)):
//! the processor creates, writes and reads them; the operator checks them, reports the
//! repartition topic's lag and deletes both at a reset or with the StreamApp. The names are
//! built here only, so the two never look for different topics.

/// Ends the changelog's name. The CRD refuses user topics ending in it (a CEL rule of
/// [`crate::crd`]): an output written into a changelog would become a store's state.
const CHANGELOG_SUFFIX: &str = "-dedup-changelog";
/// Ends the repartition topic's name; refused as a user topic like [`CHANGELOG_SUFFIX`].
const REPARTITION_SUFFIX: &str = "-dedup-repartition";

/// The compacted topic the dedup store of `application_id` is backed by.
pub fn changelog_topic(application_id: &str) -> String {
    format!("{application_id}{CHANGELOG_SUFFIX}")
}

/// The topic the first stage of `application_id` writes records keyed by their dedup id to,
/// when the topology repartitions ([`Topology::repartitions`](super::Topology::repartitions)).
/// The name is the application's whether or not it repartitions now: a change of
/// `topology.dedupId` starts it.
pub fn repartition_topic(application_id: &str) -> String {
    format!("{application_id}{REPARTITION_SUFFIX}")
}

/// All of them, changelog first: what a reset or the deletion of the StreamApp removes.
pub fn internal_topics(application_id: &str) -> [String; 2] {
    [
        changelog_topic(application_id),
        repartition_topic(application_id),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;

    #[test]
    fn internal_topics_are_the_application_id_and_a_suffix() {
        assert_eq!(
            internal_topics("shop.orders"),
            [
                "shop.orders-dedup-changelog".to_string(),
                "shop.orders-dedup-repartition".to_string()
            ]
        );
    }

    #[test]
    fn the_crd_refuses_user_topics_named_like_internal_ones() {
        let crd = serde_json::to_string(&crate::crd::StreamApp::crd()).unwrap();
        for suffix in [CHANGELOG_SUFFIX, REPARTITION_SUFFIX] {
            assert!(
                crd.contains(&format!("t.endsWith('{suffix}')")),
                "the CEL rule names {suffix}"
            );
        }
    }
}
