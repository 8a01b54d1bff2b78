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
//!
//! And it **opens and closes stores** off the processing thread ([`StateUpdater::open`],
//! [`StateUpdater::reopen`], [`StateUpdater::close`]): RocksDB may take seconds to minutes to
//! open or flush a store on a slow disk, longer than `transaction.timeout.ms`, and the
//! processing thread must go on processing and committing meanwhile (a transaction left open
//! that long is aborted by its coordinator, and its producer has to be recreated). Those run on
//! a thread of their own, one after the other in the order they were asked for (so a store's
//! close comes before its next open: RocksDB's LOCK), while restores and standbys go on and a
//! [`StateUpdater::take`] is answered at once. The store comes back as [`Update::Opened`],
//! [`Update::Reopened`] or [`Update::Closed`]; what the task does with it is the lifecycle's
//! rule ([`crate::lifecycle::Lifecycle::on_arrival`]).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;
use streamapp_api::config::ResolvedRocksDb;
use streamapp_api::health::StoreOpen;
use streamapp_api::state_volume::StateDir;
use streamapp_api::state_volume::checkpoint::{self, CheckpointEntry};
use tracing::info;

use crate::faults::{OpenFault, RestoreFault};
use crate::restore::{RestoreError, Restorer, Skipped, Step};
use crate::store::{
    ChangelogIdentity, MemoryRole, OpenStores, SharedMemory, StoreError, TaskStore, Window,
};

/// Changelog records restored per step, over all partitions, before requests are served again.
const STEP_RECORDS: usize = 50_000;
/// The threads' names (in [`Update::Panicked`] too).
const UPDATER_THREAD: &str = "state-updater";
const STORE_THREAD: &str = "state-stores";
/// How long the thread waits for a request when it has nothing to read.
const IDLE_WAIT: Duration = Duration::from_millis(50);

enum Request {
    Restore {
        partition: i32,
        store: Box<TaskStore>,
        fault: RestoreFault,
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

/// Work for the store thread.
enum StoreRequest {
    Open {
        partition: i32,
        role: MemoryRole,
        fault: OpenFault,
    },
    Reopen {
        partition: i32,
        store: Box<TaskStore>,
        role: MemoryRole,
        fault: OpenFault,
    },
    Close {
        partition: i32,
        store: Box<TaskStore>,
        checkpoint: Option<Checkpoint>,
    },
}

/// A checkpoint to write once its store is closed.
pub struct Checkpoint {
    pub file: PathBuf,
    pub entries: Vec<CheckpointEntry>,
}

/// What opening a task's store takes: the engine's configuration of its stores.
#[derive(Clone)]
pub struct StoreOpener {
    pub state: StateDir,
    pub rocksdb: ResolvedRocksDb,
    pub memory: SharedMemory,
    pub window: Window,
    pub changelog_topic: String,
    pub changelog_topic_id: Option<[u8; 16]>,
    /// Where every store opened is registered for lookups.
    pub open_stores: OpenStores,
}

impl StoreOpener {
    /// Opens the store of `partition` for `role`'s memory budget, suffering `fault` first.
    pub fn open(
        &self,
        partition: i32,
        role: MemoryRole,
        fault: OpenFault,
    ) -> Result<TaskStore, StoreError> {
        let path = self.state.store_dir(partition);
        fault.before_open(partition, &path)?;
        let mut store = TaskStore::open(
            &path,
            self.state.wal_dir(partition).as_deref(),
            &self.rocksdb,
            &self.memory,
            role,
            self.window,
            &ChangelogIdentity {
                topic: self.changelog_topic.clone(),
                partition,
                topic_id: self.changelog_topic_id,
            },
        )?;
        self.open_stores.register(partition, &mut store);
        Ok(store)
    }

    /// Opens the store of `partition` from disk, and says how it was found there (before the
    /// task removes its checkpoint).
    fn open_from_disk(
        &self,
        partition: i32,
        role: MemoryRole,
        fault: OpenFault,
    ) -> Result<(TaskStore, StoreOpen), StoreError> {
        let existed = self.state.store_dir(partition).join("CURRENT").exists();
        let clean = checkpoint::read(&self.state.checkpoint_file(partition))
            .ok()
            .flatten()
            .is_some();
        let store = self.open(partition, role, fault)?;
        Ok((store, crate::lifecycle::found(existed, clean)))
    }
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
    /// The restore of the partition began or stopped waiting for a transaction open on the
    /// changelog to end: `Some(offset)`, where it starts (and the store's changelog offset
    /// stands), or `None`. Sent when it changes.
    Waiting {
        partition: i32,
        for_transaction_at: Option<i64>,
    },
    /// Changelog records of the partition the reader skipped (see
    /// [`crate::restore::ChangelogRecord::Undecodable`]).
    Skipped { partition: i32, skipped: Skipped },
    /// The reader itself failed (every restore stopped; their stores come back).
    ReaderFailed {
        error: RestoreError,
        stores: Vec<(i32, TaskStore)>,
    },
    /// The store asked for with [`StateUpdater::open`], and how it was found on disk.
    Opened {
        partition: i32,
        result: Result<(TaskStore, StoreOpen), StoreError>,
    },
    /// The store handed over with [`StateUpdater::reopen`], open again for its new role.
    Reopened {
        partition: i32,
        result: Result<TaskStore, StoreError>,
    },
    /// The store handed over with [`StateUpdater::close`] is closed (and its checkpoint
    /// written): its directory may be opened again.
    Closed {
        partition: i32,
        result: Result<(), StoreError>,
    },
    /// One of the updater's threads panicked: what it was doing will never be reported, and
    /// the stores it held are closed. Sent as it unwinds, after those stores dropped.
    Panicked { thread: &'static str },
}

/// Tells the engine when the thread holding it panics ([`Update::Panicked`]); without it a
/// restore would stay "in progress" for good, the engine waiting for updates that never come.
/// The last field of what a thread owns, so it drops after the stores.
struct PanicNotice {
    thread: &'static str,
    updates: Sender<Update>,
}

impl Drop for PanicNotice {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = self.updates.send(Update::Panicked {
                thread: self.thread,
            });
        }
    }
}

pub struct StateUpdater {
    requests: Option<Sender<Request>>,
    /// The store thread's work.
    store_requests: Option<Sender<StoreRequest>>,
    /// Where the threads send their updates.
    update_tx: Sender<Update>,
    updates: Receiver<Update>,
    /// Updates received while taking a store back, not yet handed to the engine.
    backlog: VecDeque<Update>,
    thread: Option<std::thread::JoinHandle<()>>,
    store_thread: Option<std::thread::JoinHandle<()>>,
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
        let worker_updates = update_tx.clone();
        let thread = std::thread::Builder::new()
            .name(UPDATER_THREAD.into())
            .spawn(move || Worker::new(restorer, follower, worker_updates).run(&request_rx))
            .expect("spawning the state updater");
        Ok(StateUpdater {
            requests: Some(requests),
            store_requests: None,
            update_tx,
            updates,
            backlog: VecDeque::new(),
            thread: Some(thread),
            store_thread: None,
        })
    }

    /// Opens and closes stores too ([`StateUpdater::open`], [`StateUpdater::reopen`],
    /// [`StateUpdater::close`]), with `opener`, on a thread of its own.
    pub fn with_stores(mut self, opener: StoreOpener) -> Self {
        let (store_requests, store_request_rx) = mpsc::channel();
        let notice = PanicNotice {
            thread: STORE_THREAD,
            updates: self.update_tx.clone(),
        };
        let thread = std::thread::Builder::new()
            .name(STORE_THREAD.into())
            .spawn(move || {
                for request in store_request_rx {
                    // The engine is gone when a send fails: the store closes with the update.
                    let _ = notice.updates.send(opener.serve(request));
                }
            })
            .expect("spawning the state updater's store thread");
        self.store_requests = Some(store_requests);
        self.store_thread = Some(thread);
        self
    }

    /// Opens the store of `partition` from disk for `role`, off the processing thread: it
    /// comes as [`Update::Opened`].
    pub fn open(&self, partition: i32, role: MemoryRole, fault: OpenFault) {
        self.send_store(StoreRequest::Open {
            partition,
            role,
            fault,
        });
    }

    /// Closes `store` and opens it again for `role`'s memory budget (RocksDB fixes it at
    /// open): it comes back as [`Update::Reopened`].
    pub fn reopen(&self, partition: i32, store: TaskStore, role: MemoryRole, fault: OpenFault) {
        self.send_store(StoreRequest::Reopen {
            partition,
            store: Box::new(store),
            role,
            fault,
        });
    }

    /// Closes `store` (flushed), then writes `checkpoint` if given: [`Update::Closed`] says
    /// when its directory is free.
    pub fn close(&self, partition: i32, store: TaskStore, checkpoint: Option<Checkpoint>) {
        self.send_store(StoreRequest::Close {
            partition,
            store: Box::new(store),
            checkpoint,
        });
    }

    /// Hands `store` over to be restored from its own changelog offset to the end (`fault`:
    /// what a test makes the restore suffer).
    pub fn restore(&self, partition: i32, store: TaskStore, fault: RestoreFault) {
        self.send(Request::Restore {
            partition,
            store: Box::new(store),
            fault,
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

    /// The next update, waiting up to `timeout` for one.
    pub fn wait_update(&mut self, timeout: Duration) -> Option<Update> {
        self.backlog
            .pop_front()
            .or_else(|| self.updates.recv_timeout(timeout).ok())
    }

    /// Stops both threads, once the store thread has done what it was asked (every store it
    /// opened or was handed is closed afterwards: their directories are free).
    pub fn shutdown(&mut self) {
        self.requests.take();
        self.store_requests.take();
        for t in [self.thread.take(), self.store_thread.take()]
            .into_iter()
            .flatten()
        {
            let _ = t.join();
        }
        // Stores in updates nobody takes any more close here.
        self.backlog.clear();
        while self.updates.try_recv().is_ok() {}
    }

    fn send(&self, request: Request) {
        if let Some(r) = &self.requests {
            // The thread only ends when this handle drops.
            let _ = r.send(request);
        }
    }

    fn send_store(&self, request: StoreRequest) {
        let sender = self.store_requests.as_ref();
        debug_assert!(
            sender.is_some(),
            "started without StateUpdater::with_stores"
        );
        if let Some(r) = sender {
            let _ = r.send(request);
        }
    }
}

impl Drop for StateUpdater {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl StoreOpener {
    /// Carries out one request of the store thread.
    fn serve(&self, request: StoreRequest) -> Update {
        let started = Instant::now();
        match request {
            StoreRequest::Open {
                partition,
                role,
                fault,
            } => {
                let result = self.open_from_disk(partition, role, fault);
                if let Ok((_, how)) = &result {
                    info!(partition, how = ?how, ms = started.elapsed().as_millis() as u64, "store opened");
                }
                Update::Opened { partition, result }
            }
            StoreRequest::Reopen {
                partition,
                store,
                role,
                fault,
            } => {
                let result = store
                    .close()
                    .and_then(|()| self.open(partition, role, fault));
                if result.is_ok() {
                    info!(partition, role = ?role, ms = started.elapsed().as_millis() as u64,
                        "store reopened for its new role's memory budget");
                }
                Update::Reopened { partition, result }
            }
            StoreRequest::Close {
                partition,
                store,
                checkpoint,
            } => {
                let path = store.path().to_path_buf();
                let result = store.close().and_then(|()| match checkpoint {
                    // Closed: nothing writes to it any more, so the checkpoint is the truth.
                    Some(c) => checkpoint::write(&c.file, &c.entries)
                        .map_err(|e| StoreError::from_io(&path, "writing the checkpoint", &e)),
                    None => Ok(()),
                });
                if result.is_ok() {
                    info!(
                        partition,
                        ms = started.elapsed().as_millis() as u64,
                        "store closed"
                    );
                }
                Update::Closed { partition, result }
            }
        }
    }
}

/// One reader and the stores it fills.
struct Reader {
    restorer: Restorer,
    stores: BTreeMap<i32, TaskStore>,
    /// The partitions whose restore waits for an open transaction (as last sent).
    waiting: BTreeSet<i32>,
}

impl Reader {
    fn new(restorer: Restorer) -> Self {
        Reader {
            restorer,
            stores: BTreeMap::new(),
            waiting: BTreeSet::new(),
        }
    }

    fn busy(&self) -> bool {
        self.stores.keys().any(|&p| self.restorer.reading(p))
    }

    fn take(&mut self, partition: i32) -> Option<TaskStore> {
        self.restorer.stop(partition);
        self.waiting.remove(&partition);
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
    /// Last: it drops after the readers and their stores.
    _notice: PanicNotice,
}

impl Worker {
    fn new(restorer: Restorer, follower: Follower, updates: Sender<Update>) -> Self {
        Worker {
            restoring: Reader::new(restorer),
            standbys: None,
            follower,
            _notice: PanicNotice {
                thread: UPDATER_THREAD,
                updates: updates.clone(),
            },
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
            Request::Restore {
                partition,
                store,
                fault,
            } => {
                fault.before_restore(partition);
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
                // A restore begun (again) waits for nothing yet.
                reader.waiting.remove(&partition);
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
                reader.waiting.clear();
                let stores = std::mem::take(&mut reader.stores).into_iter().collect();
                send(Update::ReaderFailed { error, stores });
                return;
            }
        };
        for (partition, result) in results {
            let waits = matches!(result, Ok((_, Step::WaitingForOpenTransaction)));
            if waits != reader.waiting.contains(&partition) {
                let for_transaction_at = if waits {
                    reader.waiting.insert(partition);
                    reader.stores[&partition].meta().changelog_offset
                } else {
                    reader.waiting.remove(&partition);
                    None
                };
                send(Update::Waiting {
                    partition,
                    for_transaction_at,
                });
            }
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
