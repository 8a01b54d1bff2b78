//! The processor's probes say the truth: `/healthz` fails when the processing loop is stuck
//! (and only then), `/readyz` holds for a healthy processor that owns no partition.

use crate::common;

use std::time::{Duration, Instant};

use common::{App, AppOptions, Input, counts, now_ms, serial};

const MINUTE: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread")]
async fn liveness_fails_when_the_processing_loop_is_stuck_and_not_while_it_idles() {
    let _serial = serial().await;
    let app = App::create(
        "live",
        AppOptions {
            partitions: 1,
            extra: serde_json::json!({ "livenessTimeout": "3s" }),
            ..Default::default()
        },
    )
    .await;
    let mut p = app.start_with("pod-0", &[("STREAMAPP_FAULTS", "stall-after-put=1")]);
    p.wait_ready(MINUTE);
    // Idle for longer than the limit: waiting for records is progress by choice.
    let idle_until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < idle_until {
        assert_eq!(p.get("/healthz").map(|(s, _)| s), Some(200), "idle is live");
        std::thread::sleep(Duration::from_millis(500));
    }
    // The enrich stage now blocks the loop for ten minutes (the HTTP server keeps answering).
    app.produce(&[Input::cmd("x", now_ms()).header("streamapp.fault", "stall-after-put:600000")]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let body = loop {
        match p.get("/healthz") {
            Some((503, body)) => break body,
            Some((200, _)) => {}
            other => panic!("/healthz answered {other:?}"),
        }
        assert!(
            Instant::now() < deadline,
            "/healthz still answers 200 with the loop stuck:\n{}",
            p.log_tail()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(body.contains("no progress"), "{body}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_processor_that_owns_no_partition_is_ready_and_reports_the_input_partitions() {
    let _serial = serial().await;
    let app = App::with_partitions("idle", 1).await;
    let mut a = app.start("pod-a");
    a.wait_ready(MINUTE);
    let mut b = app.start("pod-b");
    // Two replicas, one partition: one of them owns nothing and is ready all the same.
    b.wait_ready(2 * MINUTE);
    a.wait_ready(2 * MINUTE);
    let (ha, hb) = (a.live_health(), b.live_health());
    let owned: Vec<usize> = vec![ha.tasks.len(), hb.tasks.len()];
    assert_eq!(
        {
            let mut o = owned.clone();
            o.sort();
            o
        },
        [0, 1],
        "one task between the two: {owned:?}"
    );
    assert_eq!(ha.input_partitions, Some(1));
    assert_eq!(hb.input_partitions, Some(1));
    assert_eq!(ha.not_ready_reason, None);
    assert_eq!(hb.not_ready_reason, None);
    app.produce(
        &(0..50)
            .map(|i| Input::cmd(&format!("i-{i}"), now_ms()))
            .collect::<Vec<_>>(),
    );
    app.wait_until_processed(MINUTE);
    let output = app.read(&app.output);
    assert_eq!(output.len(), 50);
    assert!(counts(&output).values().all(|&n| n == 1));
}
