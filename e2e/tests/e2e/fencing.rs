//! A pod whose identity another process took: the processor exits as fenced, the kubelet
//! starts it again, and it joins its group again only once its agent has confirmed on the API
//! server that its pod is still the current one of its name (`streamapp_api::identity`).

use std::time::{Duration, Instant};

use streamapp_api::config::{group_member, transactional_id};
use streamapp_e2e::{READY_TIMEOUT, Scenario, Sent, pod_name};

/// The processor container's restart count and its last run's exit code.
async fn last_exit(s: &Scenario, pod: &str) -> (i32, Option<i32>) {
    streamapp_e2e::processor_restarts(&s.pod(pod).await)
}

#[tokio::test]
async fn a_fenced_processor_joins_again_only_once_its_agent_confirms_its_pod_is_current() {
    let s = Scenario::start("fenced", 4).await;
    let mut app = s.example();
    app["spec"]["replicas"] = 1.into();
    s.apply(&app);
    s.wait_ready(READY_TIMEOUT).await;
    let mut sent = Sent::new();
    sent.produce(&s, 300, 0.3, 0);
    s.wait_processed();

    // Another producer takes the pod's transactional id (what a second instance of the pod
    // would do): the processor's next transaction is fenced, and it exits as fenced (3).
    let pod = pod_name(0);
    let txn = transactional_id(&s.application_id(), &group_member(&pod, 0));
    let _usurper = testbed::kafka::transactional_producer(&txn);
    sent.produce(&s, 300, 0.3, 0);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (restarts, exit) = last_exit(&s, &pod).await;
        if restarts >= 1 {
            assert_eq!(exit, Some(3), "the processor exited as fenced");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the processor was not fenced within 120 s"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // Started again by the kubelet: the agent confirms the pod is the current one, and only
    // then does it join; everything is processed exactly once.
    s.wait_ready(READY_TIMEOUT).await;
    let log = s.kubectl(&["logs", &pod, "-c", "processor"]);
    assert!(
        log.contains("the agent confirms") && log.contains("is the current pod of its name"),
        "the restarted processor asked its agent first:\n{log}"
    );
    assert_eq!(
        last_exit(&s, &pod).await.0,
        1,
        "restarted once, no fencing ping-pong"
    );
    s.assert_exactly_once(&sent);
    s.finish().await;
}
