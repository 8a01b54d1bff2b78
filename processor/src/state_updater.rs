//! The state-updater thread (the role Kafka Streams' KIP-869 state updater plays): it restores
//! the stores of tasks that are not active yet, all of them at once through one read_committed
//! reader ([`Restorer`]), while the processing thread goes on processing and committing the
//! active tasks.
//!
//! A store belongs to exactly one thread at a time: the engine hands it over with
//! [`StateUpdater::restore`] and gets it back when it is restored, when its restore failed, or
//! when the engine asks for it ([`StateUpdater::take`]: a revoke, a drain, a quarantine). The
//! lifecycle stays with the engine; the updater only reads the changelog and applies it.
//!
//! It also keeps **standby** stores warm ([`StateUpdater::follow`]): a restore that never ends,
//! through a reader of its own ([`Restorer::follower`]), applying only committed changelog
//! records and the changelog position in the same batch (invariant 6 of docs/design.md). Nothing
//! else writes a followed store. Promoting a standby is taking it back and restoring it: the
//! ordinary replay of whatever tail it has not applied yet.

use std::collections::{BTreeMap, VecDeque};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;

use crate::restore::{RestoreError, Restorer, Skipped, Step};
use crate::store::TaskStore;

/// Changelog records restored per step, over all partitions, before requests are served again.
const STEP_RECORDS: usize = 50_000;
/// How long the thread waits for a request when it has nothing to read.
const IDLE_WAIT: Duration = Duration::from_millis(50);

enum Request {
    Restore {
        partition: i32,
        store: Box<TaskStore>,
    },
    Follow {
        partition: i32,
        store: Box<TaskStore>,
    },
    Take {
        partition: i32,
        reply: Sender<Option<TaskStore>>,
    },
}

/// What the updater tells the engine.
pub enum Update {
    /// Restore of the partition (or following it, for a standby) began from the store's
    /// changelog offset `from`: this many records to restore at most (to catch up, for a
    /// standby).
    Began {
        partition: i32,
        from: Option<i64>,
        to_restore: u64,
    },
    /// More records applied; the store's changelog offset now.
    Progress {
        partition: i32,
        restored: u64,
        changelog_offset: Option<i64>,
    },
    /// Caught up with the changelog (after `restored` more records): the store comes back.
    Restored {
        partition: i32,
        restored: u64,
        store: TaskStore,
    },
    /// The restore (or following) failed: the store comes back with the reason.
    Failed {
        partition: i32,
        store: TaskStore,
        error: RestoreError,
    },
    /// Changelog records of the partition the reader skipped (see
    /// [`crate::restore::ChangelogRecord::Undecodable`]).
    Skipped { partition: i32, skipped: Skipped },
    /// The reader itself failed (every restore stopped; their stores come back).
    ReaderFailed {
        error: RestoreError,
        stores: Vec<(i32, TaskStore)>,
    },
}

pub struct StateUpdater {
    requests: Option<Sender<Request>>,
    updates: Receiver<Update>,
    /// Updates received while taking a store back, not yet handed to the engine.
    backlog: VecDeque<Update>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl StateUpdater {
    pub fn start(client: &ClientConfig, changelog_topic: &str) -> Result<Self, KafkaError> {
        let restorer = Restorer::new(client, changelog_topic)?;
        let follower = Follower {
            client: client.clone(),
            topic: changelog_topic.to_string(),
        };
        let (requests, request_rx) = mpsc::channel();
        let (update_tx, updates) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("state-updater".into())
            .spawn(move || Worker::new(restorer, follower, update_tx).run(&request_rx))
            .expect("spawning the state updater");
        Ok(StateUpdater {
            requests: Some(requests),
            updates,
            backlog: VecDeque::new(),
            thread: Some(thread),
        })
    }

    /// Hands `store` over to be restored from its own changelog offset to the end.
    pub fn restore(&self, partition: i32, store: TaskStore) {
        self.send(Request::Restore {
            partition,
            store: Box::new(store),
        });
    }

    /// Hands `store` over to be kept warm as a standby: it is caught up and then follows the
    /// changelog until taken back. Progress comes as [`Update::Progress`]; it is never
    /// [`Update::Restored`].
    pub fn follow(&self, partition: i32, store: TaskStore) {
        self.send(Request::Follow {
            partition,
            store: Box::new(store),
        });
    }

    /// Takes the partition's store back (its restore, or its following, stops), if it was
    /// handed over: from the thread, or from an update that carries it and was not handed to
    /// the engine yet. No later update mentions the partition (until it is handed over again).
    pub fn take(&mut self, partition: i32) -> Option<TaskStore> {
        let (reply, back) = mpsc::channel();
        self.send(Request::Take { partition, reply });
        let from_thread = back.recv().ok().flatten();
        // Whatever the thread sent before it answered is in the channel by now.
        self.backlog.extend(self.updates.try_iter());
        let mut from_update = None;
        let mut kept = VecDeque::new();
        for update in self.backlog.drain(..) {
            match update {
                Update::Restored {
                    partition: p,
                    store,
                    ..
                }
                | Update::Failed {
                    partition: p,
                    store,
                    ..
                } if p == partition => {
                    from_update = Some(store);
                }
                Update::Began { partition: p, .. } | Update::Progress { partition: p, .. }
                    if p == partition => {}
                Update::ReaderFailed { error, mut stores } => {
                    if let Some(i) = stores.iter().position(|(p, _)| *p == partition) {
                        from_update = Some(stores.remove(i).1);
                    }
                    kept.push_back(Update::ReaderFailed { error, stores });
                }
                other => kept.push_back(other),
            }
        }
        self.backlog = kept;
        from_thread.or(from_update)
    }

    /// The next update, if any.
    pub fn next_update(&mut self) -> Option<Update> {
        self.backlog
            .pop_front()
            .or_else(|| self.updates.try_recv().ok())
    }

    fn send(&self, request: Request) {
        if let Some(r) = &self.requests {
            // The thread only ends when this handle drops.
            let _ = r.send(request);
        }
    }
}

impl Drop for StateUpdater {
    fn drop(&mut self) {
        self.requests.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One reader and the stores it fills.
struct Reader {
    restorer: Restorer,
    stores: BTreeMap<i32, TaskStore>,
}

impl Reader {
    fn new(restorer: Restorer) -> Self {
        Reader {
            restorer,
            stores: BTreeMap::new(),
        }
    }

    fn busy(&self) -> bool {
        self.stores.keys().any(|&p| self.restorer.reading(p))
    }

    fn take(&mut self, partition: i32) -> Option<TaskStore> {
        self.restorer.stop(partition);
        self.stores.remove(&partition)
    }
}

/// What the standbys' reader is made from: it is created with the first standby (a process
/// without standbys runs no second reader).
struct Follower {
    client: ClientConfig,
    topic: String,
}

struct Worker {
    /// Catches the stores of tasks to be active up, then hands them back.
    restoring: Reader,
    /// Keeps standby stores caught up, once there are any.
    standbys: Option<Reader>,
    follower: Follower,
    updates: Sender<Update>,
}

impl Worker {
    fn new(restorer: Restorer, follower: Follower, updates: Sender<Update>) -> Self {
        Worker {
            restoring: Reader::new(restorer),
            standbys: None,
            follower,
            updates,
        }
    }

    fn run(mut self, requests: &Receiver<Request>) {
        loop {
            // Idle, only waiting for open transactions, or only following standbys (whose
            // steps do not wait for records): wait for a request a little.
            let busy = self.restoring.busy();
            let first = if busy {
                match requests.try_recv() {
                    Ok(r) => Some(r),
                    Err(TryRecvError::Empty) => None,
                    Err(TryRecvError::Disconnected) => return,
                }
            } else {
                match requests.recv_timeout(IDLE_WAIT) {
                    Ok(r) => Some(r),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            };
            let mut next = first;
            while let Some(request) = next.take() {
                self.serve(request);
                next = requests.try_recv().ok();
            }
            if !self.restoring.stores.is_empty() {
                Self::step(&mut self.restoring, &self.updates);
            }
            if let Some(standbys) = self.standbys.as_mut().filter(|r| !r.stores.is_empty()) {
                Self::step(standbys, &self.updates);
            }
        }
    }

    fn serve(&mut self, request: Request) {
        match request {
            Request::Restore { partition, store } => {
                if let Some(standbys) = &mut self.standbys {
                    standbys.take(partition);
                }
                Self::begin(&mut self.restoring, partition, *store, &self.updates);
            }
            Request::Follow { partition, store } => {
                self.restoring.take(partition);
                match Self::standbys(&mut self.standbys, &self.follower) {
                    Ok(standbys) => Self::begin(standbys, partition, *store, &self.updates),
                    Err(source) => {
                        let _ = self.updates.send(Update::Failed {
                            partition,
                            store: *store,
                            error: RestoreError::Kafka {
                                topic: self.follower.topic.clone(),
                                partition,
                                source,
                            },
                        });
                    }
                }
            }
            Request::Take { partition, reply } => {
                let store = self.restoring.take(partition).or_else(|| {
                    self.standbys
                        .as_mut()
                        .and_then(|standbys| standbys.take(partition))
                });
                let _ = reply.send(store);
            }
        }
    }

    /// The standbys' reader, created with the first standby.
    fn standbys<'r>(
        standbys: &'r mut Option<Reader>,
        follower: &Follower,
    ) -> Result<&'r mut Reader, KafkaError> {
        if standbys.is_none() {
            let reader = Restorer::follower(&follower.client, &follower.topic)?;
            *standbys = Some(Reader::new(reader));
        }
        Ok(standbys.as_mut().expect("just created"))
    }

    /// The engine is gone when a send fails: nothing to tell.
    fn begin(reader: &mut Reader, partition: i32, store: TaskStore, updates: &Sender<Update>) {
        // `begin` starts the partition over if it was being read.
        match reader.restorer.begin(partition, &store) {
            Ok(to_restore) => {
                let _ = updates.send(Update::Began {
                    partition,
                    from: store.meta().changelog_offset,
                    to_restore,
                });
                reader.stores.insert(partition, store);
            }
            Err(error) => {
                let _ = updates.send(Update::Failed {
                    partition,
                    store,
                    error,
                });
            }
        }
    }

    fn step(reader: &mut Reader, updates: &Sender<Update>) {
        let send = |update| {
            let _ = updates.send(update);
        };
        let results = {
            let mut stores: BTreeMap<i32, &mut TaskStore> =
                reader.stores.iter_mut().map(|(&p, s)| (p, s)).collect();
            reader.restorer.step(&mut stores, STEP_RECORDS)
        };
        for (partition, skipped) in reader.restorer.take_skipped() {
            send(Update::Skipped { partition, skipped });
        }
        let results = match results {
            Ok(r) => r,
            Err(error) => {
                reader.restorer.stop_all();
                let stores = std::mem::take(&mut reader.stores).into_iter().collect();
                send(Update::ReaderFailed { error, stores });
                return;
            }
        };
        for (partition, result) in results {
            match result {
                Ok((restored, Step::Done)) => {
                    let store = reader.stores.remove(&partition).expect("restoring");
                    send(Update::Restored {
                        partition,
                        restored,
                        store,
                    });
                }
                Ok((n, step)) => {
                    // A follower at the end reports its offset even when it read no record
                    // (it moved past a transaction's marker).
                    if n > 0 || step == Step::Following {
                        let changelog_offset = reader.stores[&partition].meta().changelog_offset;
                        send(Update::Progress {
                            partition,
                            restored: n,
                            changelog_offset,
                        });
                    }
                }
                Err(error) => {
                    let store = reader.stores.remove(&partition).expect("restoring");
                    send(Update::Failed {
                        partition,
                        store,
                        error,
                    });
                }
            }
        }
    }
}
