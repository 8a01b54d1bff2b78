//! `streamapp-processor inspect <state-dir>`: what is on a state volume, for humans and tests.

use std::path::Path;

use serde::Serialize;
use streamapp_api::health::{ProcessorHealth, WalFiles};
use streamapp_api::state_volume::checkpoint::{self, CheckpointEntry};
use streamapp_api::state_volume::{StateDir, wal_files};

use crate::shared::now_ms;

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub state_dir: String,
    pub health: Option<ProcessorHealth>,
    pub tasks: Vec<TaskReport>,
    pub quarantines: Vec<QuarantineReport>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskReport {
    pub partition: i32,
    /// The changelog topic and partition the store is a prefix of.
    pub changelog: Option<(String, i64)>,
    pub changelog_offset: Option<i64>,
    pub input_offset: Option<i64>,
    pub stream_time: Option<i64>,
    /// Ids the store remembers (exact).
    pub ids: u64,
    pub estimated_keys: u64,
    pub sst_bytes: u64,
    /// Entries of the `.checkpoint` file, if there is one.
    pub checkpoint: Option<Vec<(String, i32, i64)>>,
    pub wal: WalFiles,
    /// Set when the store could not be opened read-only.
    pub error: Option<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QuarantineReport {
    pub path: String,
    pub partition: i32,
    pub at_ms: i64,
    pub reason: String,
}

pub fn inspect(root: &Path, wal_root: Option<&Path>) -> Report {
    let state = StateDir::new(root, wal_root.map(Path::to_path_buf));
    let now = now_ms();
    let health = std::fs::read(state.health_file())
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok());
    let tasks = state
        .task_partitions()
        .into_iter()
        .map(|p| {
            let checkpoint = checkpoint::read(&state.checkpoint_file(p))
                .ok()
                .flatten()
                .map(|es| {
                    es.into_iter()
                        .map(
                            |CheckpointEntry {
                                 topic,
                                 partition,
                                 offset,
                             }| (topic, partition, offset),
                        )
                        .collect()
                });
            let wal = wal_files(&state.wal_files_dir(p)).at(now);
            match crate::store::open_read_only(&state.store_dir(p), state.wal_dir(p).as_deref()) {
                Ok(s) => TaskReport {
                    partition: p,
                    changelog: s.changelog,
                    changelog_offset: s.meta.changelog_offset,
                    input_offset: s.meta.input_offset,
                    stream_time: s.meta.stream_time,
                    ids: s.ids,
                    estimated_keys: s.estimated_keys,
                    sst_bytes: s.sst_bytes,
                    checkpoint,
                    wal,
                    error: None,
                },
                Err(e) => TaskReport {
                    partition: p,
                    changelog: None,
                    changelog_offset: None,
                    input_offset: None,
                    stream_time: None,
                    ids: 0,
                    estimated_keys: 0,
                    sst_bytes: 0,
                    checkpoint,
                    wal,
                    error: Some(e.to_string()),
                },
            }
        })
        .collect();
    let quarantines = state
        .quarantines()
        .into_iter()
        .map(|q| QuarantineReport {
            path: q.path.display().to_string(),
            partition: q.partition,
            at_ms: q.at_ms,
            reason: q.reason,
        })
        .collect();
    Report {
        state_dir: root.display().to_string(),
        health,
        tasks,
        quarantines,
    }
}

/// The report as a human reads it.
pub fn render(r: &Report) -> String {
    let mut out = format!("state dir: {}\n", r.state_dir);
    if let Some(h) = &r.health {
        out += &format!(
            "processor: pod {} phase {:?} previous shutdown clean: {}\n",
            h.pod,
            h.phase,
            h.previous_shutdown_clean
                .map_or("unknown".into(), |c| c.to_string())
        );
    }
    out += "tasks:\n  partition  changelog-offset  input-offset  ids       sst-bytes  wal-files  wal-bytes  checkpoint\n";
    for t in &r.tasks {
        let opt = |o: Option<i64>| o.map_or("-".into(), |v| v.to_string());
        let cp = match &t.checkpoint {
            None => "none".to_string(),
            Some(es) => es
                .iter()
                .map(|(t, p, o)| format!("{t}/{p}@{o}"))
                .collect::<Vec<_>>()
                .join(" "),
        };
        out += &format!(
            "  {:<9}  {:<16}  {:<12}  {:<8}  {:<9}  {:<9}  {:<9}  {}\n",
            t.partition,
            opt(t.changelog_offset),
            opt(t.input_offset),
            t.ids,
            t.sst_bytes,
            t.wal.files,
            t.wal.bytes,
            cp
        );
        if let Some(e) = &t.error {
            out += &format!("    cannot open: {e}\n");
        }
    }
    out += &format!("quarantines: {}\n", r.quarantines.len());
    for q in &r.quarantines {
        out += &format!(
            "  partition {} at {} ms: {} ({})\n",
            q.partition, q.at_ms, q.reason, q.path
        );
    }
    out
}
