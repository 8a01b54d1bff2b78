//! `kubectl streamapp status`: app -> conditions, pods -> tasks, as text (a tree) or as data.
//!
//! Everything comes from the StreamApp's status: the operator's aggregate and conditions, and
//! each pod's entry written by its agent. `now` is a parameter so the output of fixed
//! statuses is fixed (the golden tests).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use streamapp_api::crd::{PodStateStatus, StreamApp, TaskStateStatus};
use streamapp_api::status_values::{AppPhase, PodPhase, ResetPhase, StateHealth, TaskState};

/// Whether to colour the text (only on a terminal).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Colour {
    Never,
    Ansi,
}

/// The tree of every app in `apps`, one after the other.
pub fn tree(apps: &[StreamApp], now: Timestamp, colour: Colour) -> String {
    let mut out = String::new();
    for (i, app) in apps.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        app_tree(&mut out, app, now, colour);
    }
    out
}

/// The apps as data for `-o json|yaml`: name, namespace, desired replicas and the status.
pub fn data(apps: &[StreamApp]) -> serde_json::Value {
    serde_json::Value::Array(
        apps.iter()
            .map(|a| {
                serde_json::json!({
                    "namespace": a.namespace(),
                    "name": a.name_any(),
                    "replicas": a.spec.replicas,
                    "paused": streamapp_api::annotations::is_true(
                        a.annotations(), streamapp_api::annotations::PAUSED),
                    "status": a.status,
                })
            })
            .collect(),
    )
}

fn paint(colour: Colour, code: &str, text: &str) -> String {
    match colour {
        Colour::Never => text.to_string(),
        Colour::Ansi => format!("\x1b[{code}m{text}\x1b[0m"),
    }
}

/// Rows under a header, in columns as wide as their widest cell, two spaces apart, no
/// trailing blanks (the tables of `lookup` and `dead-letters`).
pub fn columns<const N: usize>(header: [&str; N], rows: &[[String; N]]) -> String {
    let mut widths = header.map(str::len);
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut out = String::new();
        for (cell, w) in cells.zip(widths) {
            out += &format!("{cell:<w$}  ");
        }
        out.trim_end().to_string() + "\n"
    };
    let mut out = line(&mut header.into_iter());
    for row in rows {
        out += &line(&mut row.iter().map(String::as_str));
    }
    out
}

/// Green for what is fine, yellow for what is under way (or not known yet), red for what is
/// wrong; the rest is not coloured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tone {
    Fine,
    UnderWay,
    Wrong,
    Plain,
}

impl Tone {
    fn paint(self, colour: Colour, text: &str) -> String {
        match self {
            Tone::Fine => paint(colour, "32", text),
            Tone::UnderWay => paint(colour, "33", text),
            Tone::Wrong => paint(colour, "31", text),
            Tone::Plain => text.to_string(),
        }
    }
}

/// A status value, shown in its tone. A value written by another version (`Other`) is shown
/// as it was written, not coloured.
trait Toned: std::fmt::Display {
    fn tone(&self) -> Tone;
}

impl Toned for AppPhase {
    fn tone(&self) -> Tone {
        match self {
            AppPhase::Running => Tone::Fine,
            AppPhase::Pending | AppPhase::Progressing => Tone::UnderWay,
            AppPhase::Degraded => Tone::Wrong,
            AppPhase::Stopped | AppPhase::Other(_) => Tone::Plain,
        }
    }
}

impl Toned for StateHealth {
    fn tone(&self) -> Tone {
        match self {
            StateHealth::Healthy => Tone::Fine,
            StateHealth::Unknown => Tone::UnderWay,
            StateHealth::Degraded => Tone::Wrong,
            StateHealth::Other(_) => Tone::Plain,
        }
    }
}

impl Toned for ResetPhase {
    fn tone(&self) -> Tone {
        match self {
            ResetPhase::Failed => Tone::Wrong,
            ResetPhase::StoppingPods
            | ResetPhase::ResettingOffsets
            | ResetPhase::ClearingState
            | ResetPhase::StartingPods
            | ResetPhase::Done
            | ResetPhase::Other(_) => Tone::Plain,
        }
    }
}

impl Toned for PodPhase {
    fn tone(&self) -> Tone {
        match self {
            PodPhase::Running => Tone::Fine,
            PodPhase::Starting | PodPhase::Restoring | PodPhase::Draining => Tone::UnderWay,
            PodPhase::Failed | PodPhase::Down => Tone::Wrong,
            PodPhase::Drained | PodPhase::Other(_) => Tone::Plain,
        }
    }
}

impl Toned for TaskState {
    fn tone(&self) -> Tone {
        match self {
            TaskState::Active => Tone::Fine,
            TaskState::Opening | TaskState::Restoring | TaskState::Restored => Tone::UnderWay,
            TaskState::BackingOff => Tone::Wrong,
            TaskState::Standby | TaskState::WarmingUp | TaskState::Other(_) => Tone::Plain,
        }
    }
}

/// `value` in its tone; `Unknown` while it is not reported.
fn word<T: Toned>(colour: Colour, value: Option<&T>) -> String {
    match value {
        Some(v) => v.tone().paint(colour, &v.to_string()),
        None => Tone::UnderWay.paint(colour, "Unknown"),
    }
}

fn app_tree(out: &mut String, app: &StreamApp, now: Timestamp, colour: Colour) {
    let status = app.status.clone().unwrap_or_default();
    let ns = app.namespace().unwrap_or_default();
    let mut head = format!(
        "{}  {}",
        paint(colour, "1", &format!("{ns}/{}", app.name_any())),
        word(colour, status.phase.as_ref()),
    );
    head += &format!(
        "  {} ready",
        status
            .ready
            .clone()
            .unwrap_or_else(|| format!("?/{}", app.spec.replicas))
    );
    if let Some(state) = &status.state_health {
        head += &format!("  state {}", word(colour, Some(state)));
    }
    if let Some(lag) = status.lag {
        head += &format!("  lag {lag}");
        if let Some(secs) = status.lag_seconds.filter(|_| lag > 0) {
            head += &format!(" (~{})", duration(secs));
        }
    }
    if let Some(lag) = status.repartition_lag {
        head += &format!("  repartition lag {lag}");
    }
    out.push_str(&head);
    out.push('\n');

    let mut facts = Vec::new();
    if let Some(group) = &status.consumer_group {
        facts.push(format!("group {group}"));
    }
    if let Some(p) = status.input_partitions {
        facts.push(format!(
            "input {} ({p} partitions)",
            app.spec.topology.input_topic
        ));
    }
    if let Some(lag) = status.worst_restore_lag {
        facts.push(format!("worst restore lag {lag}"));
    }
    if let Some(coverage) = &status.standby_coverage {
        facts.push(format!("standbys {coverage} caught up"));
    }
    if let Some(t) = &status.oldest_checkpoint {
        facts.push(format!("oldest checkpoint {} ago", since(t.0, now)));
    }
    if streamapp_api::annotations::is_true(app.annotations(), streamapp_api::annotations::PAUSED) {
        facts.push(paint(colour, "33", "PAUSED"));
    }
    let mut children: Vec<Vec<String>> = Vec::new();
    if !facts.is_empty() {
        children.push(vec![facts.join("  ")]);
    }
    if app.status.is_none() {
        children.push(vec![
            "no status yet: is the operator running? (it writes the status within seconds of a change)"
                .to_string(),
        ]);
    }
    if let Some(reset) = &status.reset {
        let mut line = format!(
            "reset to {}: {}",
            reset.request,
            word(colour, Some(&reset.phase))
        );
        if let Some(m) = &reset.message {
            line += &format!(" ({m})");
        }
        children.push(vec![line]);
    }
    if !status.conditions.is_empty() {
        children.push(conditions(&status.conditions, colour));
    }
    // By ordinal (`x-2` before `x-10`), whatever order the agents' entries were written in.
    let mut pods: Vec<&PodStateStatus> = status.pods.iter().collect();
    pods.sort_by_key(|p| (p.name.len(), p.name.clone()));
    for pod in pods {
        children.push(pod_lines(pod, now, colour));
    }
    push_children(out, "", &children);
}

fn conditions(conditions: &[Condition], colour: Colour) -> Vec<String> {
    let width = conditions.iter().map(|c| c.type_.len()).max().unwrap_or(0);
    let mut lines = vec!["conditions".to_string()];
    for c in conditions {
        let mut line = format!(
            "{:width$}  {:5}  {}",
            c.type_,
            c.status,
            c.reason,
            width = width
        );
        if !c.message.is_empty() {
            line += &format!(": {}", c.message);
        }
        // Most conditions are good when True; these two say something is wrong when True.
        let true_is_bad = c.type_ == "Degraded" || c.type_ == "NodeLoss";
        let bad = (true_is_bad && c.status == "True")
            || (!true_is_bad
                && c.type_ != "ReplicasCapped"
                && c.type_ != "ReconciliationPaused"
                && c.type_ != "Progressing"
                && c.status == "False");
        lines.push(if bad {
            paint(colour, "31", &line)
        } else {
            line
        });
    }
    lines
}

fn pod_lines(pod: &PodStateStatus, now: Timestamp, colour: Colour) -> Vec<String> {
    let mut head = format!(
        "pod {}  {}  {}",
        pod.name,
        word(colour, pod.phase.as_ref()),
        if pod.ready {
            Tone::Fine.paint(colour, "ready")
        } else {
            Tone::Wrong.paint(colour, "not ready")
        },
    );
    match pod.last_shutdown_clean {
        Some(true) => {
            head += "  last shutdown clean";
            if let Some(ms) = pod.drain_duration_ms {
                head += &format!(" (drain {ms} ms)");
            }
        }
        Some(false) => head += &format!("  {}", paint(colour, "33", "last shutdown unclean")),
        None => {}
    }
    if let Some(free) = pod.free_disk_bytes {
        head += &format!("  free {}", bytes(free));
    }
    if pod.quarantines > 0 {
        head += &format!(
            "  {}",
            paint(colour, "31", &format!("quarantines {}", pod.quarantines))
        );
    }
    if pod.dead_letters > 0 {
        head += &format!("  dead letters {}", pod.dead_letters);
    }
    if let Some(at) = pod
        .reported_at
        .as_deref()
        .and_then(|t| t.parse::<Timestamp>().ok())
    {
        head += &format!("  reported {} ago", since(at, now));
    }
    let mut lines = vec![head];
    if let Some(m) = &pod.message {
        lines.push(paint(colour, "33", m));
    }
    if pod.tasks.is_empty() && pod.processor_up {
        lines.push("no partitions".to_string());
    }
    lines.extend(pod.tasks.iter().map(|t| task_line(t, colour)));
    lines
}

fn task_line(t: &TaskStateStatus, colour: Colour) -> String {
    let mut line = format!(
        "partition {:<3} {}",
        t.partition,
        word(colour, t.state.as_ref())
    );
    if let Some(r) = &t.restore {
        line += &format!("  {}", progress(r.restored, r.total));
        if let Some(rate) = r.rate {
            line += &format!("  {rate}/s");
        }
        if let Some(eta) = r.eta_seconds {
            line += &format!("  ETA {}", duration(eta));
        }
        if let Some(at) = r.waiting_for_transaction_at {
            line += &format!(
                "  {}",
                paint(
                    colour,
                    "33",
                    &format!("waiting for an open transaction at offset {at}")
                )
            );
        }
    }
    if let Some(at) = t.input_waiting_for_transaction_at {
        line += &format!(
            "  {}",
            paint(
                colour,
                "33",
                &format!("input waits for an open transaction at offset {at}")
            )
        );
    }
    if let Some(why) = &t.backoff {
        line += &format!("  {}", paint(colour, "31", why));
    }
    if let Some(o) = t.committed_offset {
        line += &format!("  offset {o}");
    }
    if let Some(lag) = t.restore_lag {
        line += &format!("  changelog lag {lag}");
    }
    if let Some(opened) = &t.opened {
        line += &format!("  opened {opened}");
    }
    if let Some(age) = t.checkpoint_age_seconds {
        line += &format!("  checkpoint age {}", duration(age));
    }
    line += &format!(
        "  WAL {} file{} {}",
        t.wal_files,
        if t.wal_files == 1 { "" } else { "s" },
        bytes(t.wal_bytes)
    );
    if t.quarantines > 0 {
        let mut q = format!("quarantines {}", t.quarantines);
        if let Some(reason) = &t.last_quarantine_reason {
            q += &format!(" (last: {reason})");
        }
        line += &format!("  {}", paint(colour, "31", &q));
    }
    line
}

/// `[######----] 60% 600/1000`
pub fn progress(done: i64, total: i64) -> String {
    const WIDTH: i64 = 20;
    let fraction = if total > 0 {
        (done.clamp(0, total) * 100) / total
    } else {
        100
    };
    let filled = (fraction * WIDTH / 100) as usize;
    format!(
        "[{}{}] {fraction:>3}% {done}/{total}",
        "#".repeat(filled),
        "-".repeat(WIDTH as usize - filled)
    )
}

/// `1h2m`, `3m20s`, `45s`.
pub fn duration(secs: i64) -> String {
    let s = secs.max(0);
    match (s / 3600, (s % 3600) / 60, s % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m{s}s"),
        (h, m, _) => format!("{h}h{m}m"),
    }
}

fn since(t: Timestamp, now: Timestamp) -> String {
    duration(now.as_second() - t.as_second())
}

/// `512 B`, `1.2 KiB`, `3.4 GiB`.
pub fn bytes(n: i64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n.max(0) as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < units.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", units[unit])
    }
}

/// Draws `children` under a node with box-drawing branches; each child is its first line and
/// the lines under it.
fn push_children(out: &mut String, indent: &str, children: &[Vec<String>]) {
    for (i, child) in children.iter().enumerate() {
        let last = i + 1 == children.len();
        let (branch, rest) = if last {
            ("└─ ", "   ")
        } else {
            ("├─ ", "│  ")
        };
        let Some((first, below)) = child.split_first() else {
            continue;
        };
        out.push_str(&format!("{indent}{branch}{first}\n"));
        let inner = format!("{indent}{rest}");
        let grandchildren: Vec<Vec<String>> = below.iter().map(|l| vec![l.clone()]).collect();
        push_children(out, &inner, &grandchildren);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_bars_durations_and_sizes() {
        assert_eq!(progress(0, 1000), "[--------------------]   0% 0/1000");
        assert_eq!(progress(600, 1000), "[############--------]  60% 600/1000");
        assert_eq!(progress(5, 0), "[####################] 100% 5/0");
        assert_eq!(duration(45), "45s");
        assert_eq!(duration(200), "3m20s");
        assert_eq!(duration(3720), "1h2m");
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(3 * 1024 * 1024 * 1024), "3.0 GiB");
    }

    #[test]
    fn a_restore_waiting_for_an_open_transaction_says_where() {
        let mut task = TaskStateStatus {
            partition: 2,
            state: Some(TaskState::Restoring),
            restore: Some(streamapp_api::crd::RestoreStatus {
                restored: 600,
                total: 1000,
                waiting_for_transaction_at: Some(1200),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(
            task_line(&task, Colour::Never)
                .contains("60% 600/1000  waiting for an open transaction at offset 1200"),
            "{}",
            task_line(&task, Colour::Never)
        );
        task.restore.as_mut().unwrap().waiting_for_transaction_at = None;
        assert!(!task_line(&task, Colour::Never).contains("waiting"));
    }

    #[test]
    fn an_active_task_whose_input_waits_for_an_open_transaction_says_where() {
        let mut task = TaskStateStatus {
            partition: 1,
            state: Some(TaskState::Active),
            input_waiting_for_transaction_at: Some(77),
            committed_offset: Some(77),
            ..Default::default()
        };
        assert_eq!(
            task_line(&task, Colour::Never),
            "partition 1   Active  input waits for an open transaction at offset 77  offset 77  WAL 0 \
             files 0 B"
        );
        task.input_waiting_for_transaction_at = None;
        assert!(!task_line(&task, Colour::Never).contains("waits"));
    }

    #[test]
    fn each_status_value_keeps_the_colour_its_word_had() {
        // The words and colours from before the values were typed.
        let green = ["Running", "Healthy", "Active"];
        let yellow = [
            "Progressing",
            "Pending",
            "Restoring",
            "Opening",
            "Restored",
            "Unknown",
            "Draining",
            "Starting",
        ];
        let red = ["Degraded", "Failed", "Down", "BackingOff"];
        let expected = |text: &str| {
            if green.contains(&text) {
                Tone::Fine
            } else if yellow.contains(&text) {
                Tone::UnderWay
            } else if red.contains(&text) {
                Tone::Wrong
            } else {
                Tone::Plain
            }
        };
        fn tones<T: Toned>(values: &[T]) -> Vec<(String, Tone)> {
            values.iter().map(|v| (v.to_string(), v.tone())).collect()
        }
        let all = [
            tones(AppPhase::KNOWN),
            tones(StateHealth::KNOWN),
            tones(ResetPhase::KNOWN),
            tones(PodPhase::KNOWN),
            tones(TaskState::KNOWN),
        ];
        for (text, tone) in all.iter().flatten() {
            assert_eq!(*tone, expected(text), "{text}");
        }
        assert_eq!(
            word(Colour::Ansi, None::<&PodPhase>),
            "\x1b[33mUnknown\x1b[0m"
        );
        assert_eq!(
            word(Colour::Ansi, Some(&TaskState::Other("Paused".into()))),
            "Paused",
            "a value of another version as it was written"
        );
    }
}
