//! The state-updater thread (the role Kafka Streams' KIP-869 state updater plays): it restores
//! the stores of tasks that are not active yet, all of them at once through one read_committed
//! reader ([`Restorer`]), while the processing thread goes on processing and committing the
//! active tasks.
//!
//! A store belongs to exactly one thread at a time: the engine hands it over with
//! [`StateUpdater::restore`] and gets it back when it is restored, when its restore failed, or
//! when the engine asks for it ([`StateUpdater::take`]: a revoke, a drain, a quarantine). The
//! lifecycle stays with the engine; the updater only reads the changelog and applies it.

use std::collections::{BTreeMap, VecDeque};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;

use crate::restore::{RestoreError, Restorer, Step};
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
    Take {
        partition: i32,
        reply: Sender<Option<TaskStore>>,
    },
}

/// What the updater tells the engine.
pub enum Update {
    /// Restore of the partition began from the store's changelog offset `from`: this many
    /// records to restore at most.
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
    /// The restore failed: the store comes back with the reason.
    Failed {
        partition: i32,
        store: TaskStore,
        error: RestoreError,
    },
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
        let (requests, request_rx) = mpsc::channel();
        let (update_tx, updates) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("state-updater".into())
            .spawn(move || Worker::new(restorer, update_tx).run(&request_rx))
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

    /// Takes the partition's store back (its restore stops), if it was handed over: from the
    /// thread, or from an update that carries it and was not handed to the engine yet. No
    /// later update mentions the partition (until it is handed over again).
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

struct Worker {
    restorer: Restorer,
    updates: Sender<Update>,
    stores: BTreeMap<i32, TaskStore>,
}

impl Worker {
    fn new(restorer: Restorer, updates: Sender<Update>) -> Self {
        Worker {
            restorer,
            updates,
            stores: BTreeMap::new(),
        }
    }

    fn run(mut self, requests: &Receiver<Request>) {
        loop {
            // Idle (or only waiting for open transactions): wait for a request a little.
            let busy = self.stores.keys().any(|&p| self.restorer.reading(p));
            let first = if busy {
                requests.try_recv().ok()
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
            if !self.stores.is_empty() {
                self.step();
            }
        }
    }

    fn send(&self, update: Update) {
        let _ = self.updates.send(update); // the engine is gone: nothing to tell
    }

    fn serve(&mut self, request: Request) {
        match request {
            Request::Restore { partition, store } => {
                let store = *store;
                // `begin` starts the partition over if it was being restored.
                match self.restorer.begin(partition, &store) {
                    Ok(to_restore) => {
                        self.send(Update::Began {
                            partition,
                            from: store.meta().changelog_offset,
                            to_restore,
                        });
                        self.stores.insert(partition, store);
                    }
                    Err(error) => self.send(Update::Failed {
                        partition,
                        store,
                        error,
                    }),
                }
            }
            Request::Take { partition, reply } => {
                self.restorer.stop(partition);
                let _ = reply.send(self.stores.remove(&partition));
            }
        }
    }

    fn step(&mut self) {
        let results = {
            let mut stores: BTreeMap<i32, &mut TaskStore> =
                self.stores.iter_mut().map(|(&p, s)| (p, s)).collect();
            self.restorer.step(&mut stores, STEP_RECORDS)
        };
        let results = match results {
            Ok(r) => r,
            Err(error) => {
                self.restorer.stop_all();
                let stores = std::mem::take(&mut self.stores).into_iter().collect();
                self.send(Update::ReaderFailed { error, stores });
                return;
            }
        };
        for (partition, result) in results {
            match result {
                Ok((restored, Step::Done)) => {
                    let store = self.stores.remove(&partition).expect("restoring");
                    self.send(Update::Restored {
                        partition,
                        restored,
                        store,
                    });
                }
                Ok((n, _)) => {
                    if n > 0 {
                        let changelog_offset = self.stores[&partition].meta().changelog_offset;
                        self.send(Update::Progress {
                            partition,
                            restored: n,
                            changelog_offset,
                        });
                    }
                }
                Err(error) => {
                    let store = self.stores.remove(&partition).expect("restoring");
                    self.send(Update::Failed {
                        partition,
                        store,
                        error,
                    });
                }
            }
        }
    }
}
