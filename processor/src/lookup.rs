//! The id lookup (`GET /lookup`, defined in [`streamapp_api::lookup`]): what this pod's stores
//! say about some ids. Read-only and bounded: at most [`streamapp_api::lookup::MAX_IDS`] ids,
//! each a point lookup in the store of its partition (with the route stage) or in every store
//! the pod holds (without it, any partition may hold an id), through [`OpenStores`], which
//! never holds a lock across the processing loop and reads committed data only.

use std::sync::Arc;

use streamapp_api::health::TaskHealth;
use streamapp_api::lookup::{Answer, Found, HeldStore, IdAnswer, Source};

use crate::repartition::partition_for;
use crate::store::{OpenStores, StoreError};

/// What the answers need to know of the app, known once its topics are checked.
#[derive(Clone, Debug)]
pub struct Settings {
    pub pod: String,
    pub retention_ms: i64,
    /// The input topic (shared by the sources that name it).
    pub input_topic: Arc<str>,
    /// The repartition topic's partition count, when the route stage partitions by id.
    pub route_partitions: Option<u32>,
}

/// Looks `ids` up in the open stores; `tasks` (the health report's) say each store's state.
pub fn answer(
    ids: &[String],
    settings: &Settings,
    stores: &OpenStores,
    tasks: &[TaskHealth],
) -> Result<Answer, StoreError> {
    let held = stores.partitions();
    let state = |p: i32| {
        tasks
            .iter()
            .find(|t| t.partition == p)
            .and_then(|t| t.state)
    };
    let answers = ids
        .iter()
        .map(|id| {
            let partition = settings
                .route_partitions
                .map(|n| partition_for(id.as_bytes(), n));
            let asked: Vec<i32> = held
                .iter()
                .copied()
                .filter(|p| partition.is_none_or(|own| own == *p))
                .collect();
            let mut found = Vec::new();
            for &p in &asked {
                let Some(h) = stores.look_up(p, id.as_bytes(), Some(&settings.input_topic))? else {
                    continue;
                };
                found.push(Found {
                    partition: p,
                    state: state(p),
                    first_seen: h.sighting.time,
                    expires_at: h.sighting.time.saturating_add(settings.retention_ms),
                    expired: h.expired,
                    source: h.sighting.source.map(|s| Source {
                        topic: s.topic.to_string(),
                        partition: s.partition,
                        offset: s.offset,
                    }),
                });
            }
            Ok(IdAnswer {
                id: id.clone(),
                partition,
                found,
                asked,
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    Ok(Answer {
        pod: settings.pod.clone(),
        retention_ms: settings.retention_ms,
        stores: held
            .iter()
            .map(|&partition| HeldStore {
                partition,
                state: state(partition),
            })
            .collect(),
        ids: answers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tests::{changelog, try_open};
    use crate::store::{Sighting, Staged};
    use streamapp_api::health::TaskState;

    fn settings(route_partitions: Option<u32>) -> Settings {
        Settings {
            pod: "app-0".into(),
            retention_ms: 3_600_000,
            input_topic: "in".into(),
            route_partitions,
        }
    }

    #[test]
    fn ids_are_answered_from_the_store_of_their_partition_with_state_and_source() {
        let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
        let stores = OpenStores::default();
        let n = 2;
        let own = |id: &str| partition_for(id.as_bytes(), n);
        // Two ids of different partitions.
        let a = "cmd-0";
        let b = (1..100)
            .map(|i| format!("cmd-{i}"))
            .find(|id| own(id) != own(a))
            .unwrap();
        let mut open = Vec::new();
        for (p, dir) in dirs.iter().enumerate() {
            let mut store = try_open(dir.path(), &changelog(p as i32)).unwrap();
            stores.register(p as i32, &mut store);
            open.push(store);
        }
        let mut staged = Staged::default();
        staged.put_sighting(
            a.as_bytes(),
            Sighting {
                time: 1_000,
                source: Some(crate::store::Source {
                    topic: "in".into(),
                    partition: 1,
                    offset: 17,
                }),
            },
        );
        open[own(a) as usize].apply(&staged).unwrap();
        let tasks = vec![
            TaskHealth {
                partition: own(a),
                state: Some(TaskState::Active),
                ..Default::default()
            },
            TaskHealth {
                partition: own(&b),
                state: Some(TaskState::Standby),
                ..Default::default()
            },
        ];
        let answered = answer(
            &[a.to_string(), b.clone()],
            &settings(Some(n)),
            &stores,
            &tasks,
        )
        .unwrap();
        assert_eq!(answered.pod, "app-0");
        assert_eq!(answered.stores.len(), 2);
        let [seen, unseen] = &answered.ids[..] else {
            panic!("{answered:?}")
        };
        assert_eq!(seen.partition, Some(own(a)));
        assert_eq!(seen.asked, [own(a)], "only the id's own partition");
        assert_eq!(
            seen.found,
            [Found {
                partition: own(a),
                state: Some(TaskState::Active),
                first_seen: 1_000,
                expires_at: 1_000 + 3_600_000,
                expired: false,
                source: Some(Source {
                    topic: "in".into(),
                    partition: 1,
                    offset: 17
                }),
            }]
        );
        assert_eq!(unseen.asked, [own(&b)]);
        assert!(unseen.found.is_empty());
        // Without the route stage, every store is asked.
        let everywhere = answer(&[a.to_string()], &settings(None), &stores, &tasks).unwrap();
        assert_eq!(everywhere.ids[0].partition, None);
        assert_eq!(everywhere.ids[0].asked, [0, 1]);
        assert_eq!(everywhere.ids[0].found.len(), 1);
    }
}
