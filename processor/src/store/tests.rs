use super::*;
use streamapp_api::config::RocksDbProfile;

const HOUR: Duration = Duration::from_secs(3600);
const WINDOW: Window = Window {
    retention: HOUR,
    max_skew: Duration::from_secs(300),
};

pub(crate) fn changelog(partition: i32) -> ChangelogIdentity {
    ChangelogIdentity {
        topic: "app-dedup-changelog".into(),
        partition,
        topic_id: None,
    }
}

pub(crate) fn try_open(dir: &Path, changelog: &ChangelogIdentity) -> Result<TaskStore> {
    let tuning = ResolvedRocksDb::profile(RocksDbProfile::LowMemory);
    TaskStore::open(
        dir,
        None,
        &tuning,
        &SharedMemory::new(&tuning, false),
        MemoryRole::Active,
        WINDOW,
        changelog,
    )
}

fn open(dir: &Path) -> TaskStore {
    try_open(dir, &changelog(0)).unwrap()
}

#[test]
fn staged_writes_are_invisible_until_applied() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(dir.path());
    let mut staged = Staged::default();
    staged.put(b"cmd-1", 1_000);
    assert_eq!(
        store.first_seen(b"cmd-1").unwrap(),
        None,
        "staged, not applied"
    );
    staged.changelog_offset = Some(7);
    store.apply(&staged).unwrap();
    assert_eq!(store.first_seen(b"cmd-1").unwrap(), Some(1_000));
    assert_eq!(store.meta().changelog_offset, Some(7));
}

#[test]
fn a_standby_stores_memtables_count_against_the_standby_budget_only() {
    let tuning = ResolvedRocksDb::profile(RocksDbProfile::LowMemory);
    let memory = SharedMemory::new(&tuning, true);
    let (active_budget, standby_budget) = tuning.memtable_budgets(true);
    assert_eq!(memory.memtable_budget(MemoryRole::Active), active_budget);
    assert_eq!(memory.memtable_budget(MemoryRole::Standby), standby_budget);
    assert!(standby_budget > 0 && active_budget + standby_budget == tuning.memtable_budget_bytes);
    let open_as = |dir: &Path, partition, role| {
        TaskStore::open(
            dir,
            None,
            &tuning,
            &memory,
            role,
            WINDOW,
            &changelog(partition),
        )
        .unwrap()
    };
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let _active = open_as(a.path(), 0, MemoryRole::Active);
    let mut standby = open_as(b.path(), 1, MemoryRole::Standby);
    assert_eq!(standby.memory_role(), MemoryRole::Standby);
    let active_before = memory.memtable_bytes(MemoryRole::Active);
    let standby_before = memory.memtable_bytes(MemoryRole::Standby);
    // A standby catching up: a few MiB of ids in its memtables.
    for batch in 0..8 {
        let mut staged = Staged::default();
        for i in 0..2_000 {
            staged.put(format!("id-{batch}-{i:0>64}").as_bytes(), 1_000);
        }
        standby.apply(&staged).unwrap();
    }
    let standby_after = memory.memtable_bytes(MemoryRole::Standby);
    assert!(
        standby_after >= standby_before + (1 << 20),
        "the standby's writes are counted against its budget: {standby_before} -> {standby_after}"
    );
    assert_eq!(
        memory.memtable_bytes(MemoryRole::Active),
        active_before,
        "and not at all against the active stores'"
    );
    // Reopened as active (a promotion): its memtables move to the active budget.
    standby.close().unwrap();
    let mut promoted = open_as(b.path(), 1, MemoryRole::Active);
    assert_eq!(
        promoted
            .first_seen(format!("id-7-{:0>64}", 1999).as_bytes())
            .unwrap(),
        Some(1_000)
    );
    let mut staged = Staged::default();
    for i in 0..2_000 {
        staged.put(format!("new-{i:0>64}").as_bytes(), 2_000);
    }
    promoted.apply(&staged).unwrap();
    assert!(memory.memtable_bytes(MemoryRole::Active) > active_before);
    assert!(memory.memtable_bytes(MemoryRole::Standby) < standby_after);
}

#[test]
fn the_offset_a_store_holds_is_read_without_opening_it_even_from_its_wal_only() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(dir.path());
    let mut staged = Staged::default();
    staged.put(b"a", 5);
    staged.changelog_offset = Some(42);
    store.apply(&staged).unwrap();
    // Still open (as a store is when its process is killed): the offset is in the WAL and
    // the memtable only, and the store's lock is held.
    assert_eq!(
        changelog_offset_on_disk(dir.path(), None, &changelog(0)).unwrap(),
        Some(42)
    );
    assert_eq!(
        changelog_offset_on_disk(dir.path(), None, &changelog(1)).unwrap(),
        None,
        "a store of another changelog partition vouches for nothing here"
    );
    assert_eq!(
        store.meta().changelog_offset,
        Some(42),
        "and it is untouched"
    );
}

#[test]
fn offsets_survive_reopen_with_the_data() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut store = open(dir.path());
        let mut staged = Staged::default();
        staged.put(b"a", 5);
        staged.changelog_offset = Some(3);
        staged.input_offset = Some(10);
        store.apply(&staged).unwrap();
    }
    let store = open(dir.path());
    assert_eq!(
        store.meta(),
        &StoreMeta {
            changelog_offset: Some(3),
            input_offset: Some(10),
            stream_time: Some(5),
        }
    );
    assert_eq!(store.first_seen(b"a").unwrap(), Some(5));
}

#[test]
fn ids_older_than_the_retention_expire_as_stream_time_moves() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(dir.path());
    let hour = HOUR.as_millis() as i64;
    for i in 0..100i64 {
        let mut staged = Staged::default();
        staged.put(format!("id-{i}").as_bytes(), i * hour / 10);
        store.apply(&staged).unwrap();
    }
    // Stream time is 9.9 h: ids first seen before 8.9 h are gone.
    assert_eq!(store.first_seen(b"id-0").unwrap(), None);
    assert_eq!(store.first_seen(b"id-88").unwrap(), None);
    assert_eq!(store.first_seen(b"id-90").unwrap(), Some(9 * hour));
    assert_eq!(store.id_count().unwrap(), 11, "ids 89..=99 remain");
    assert_eq!(
        store.held_ids().unwrap(),
        100,
        "expiry wrote nothing: the old ids are only past the cutoff"
    );
    store.compact().unwrap();
    assert_eq!(
        store.held_ids().unwrap(),
        11,
        "compaction dropped the expired ids"
    );
    assert_eq!(store.first_seen(b"id-89").unwrap(), Some(89 * hour / 10));
}

#[test]
fn an_id_seen_again_later_is_not_expired_by_its_old_entry() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(dir.path());
    let hour = HOUR.as_millis() as i64;
    let mut staged = Staged::default();
    staged.put(b"x", 0);
    store.apply(&staged).unwrap();
    let mut staged = Staged::default();
    staged.put(b"x", 2 * hour); // seen again after its window: a new first-seen time
    store.apply(&staged).unwrap();
    assert_eq!(store.first_seen(b"x").unwrap(), Some(2 * hour));
}

#[test]
fn the_store_does_not_depend_on_how_writes_were_batched() {
    let hour = HOUR.as_millis() as i64;
    // id, time: late records, repeats with older times, a jump in stream time.
    let writes: Vec<(String, i64)> = (0..300)
        .map(|i| {
            (
                format!("id-{}", i % 97),
                (i * 7919 % 300) as i64 * hour / 50,
            )
        })
        .collect();
    let mut results = Vec::new();
    for chunk in [1, 7, 300] {
        let dir = tempfile::tempdir().unwrap();
        let mut store = open(dir.path());
        for part in writes.chunks(chunk) {
            let mut staged = Staged::default();
            for (id, t) in part {
                staged.put(id.as_bytes(), *t);
            }
            store.apply(&staged).unwrap();
        }
        let state: Vec<_> = (0..97)
            .map(|i| store.first_seen(format!("id-{i}").as_bytes()).unwrap())
            .collect();
        results.push((state, store.id_count().unwrap()));
    }
    assert_eq!(results[0], results[1]);
    assert_eq!(results[1], results[2]);
}

#[test]
fn a_batch_written_in_the_background_is_seen_at_once_and_survives_a_close() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut store = open(dir.path());
        let mut staged = Staged::default();
        staged.put(b"cmd-1", 1_000);
        staged.changelog_offset = Some(7);
        staged.input_offset = Some(3);
        store.apply_decided(staged).unwrap();
        // Not waited for: the lookup answers from the batch being written.
        assert_eq!(store.first_seen(b"cmd-1").unwrap(), Some(1_000));
        assert_eq!(store.meta().changelog_offset, Some(7));
        // Dropped without waiting: the drop lets the write finish.
    }
    let mut store = open(dir.path());
    assert_eq!(store.first_seen(b"cmd-1").unwrap(), Some(1_000));
    assert_eq!(store.meta().changelog_offset, Some(7));
    assert_eq!(store.meta().input_offset, Some(3));
    store.settle().unwrap();
}

#[test]
fn lookups_during_a_background_apply_see_what_the_store_holds_after_it() {
    let hour = HOUR.as_millis() as i64;
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(dir.path());
    let mut first = Staged::default();
    first.put(b"kept", hour + hour / 2);
    first.put(b"seen-again", hour + 20);
    store.apply(&first).unwrap();
    // Decided against the store: each put newer than what it holds.
    let mut second = Staged::default();
    second.put(b"new", 2 * hour + 30);
    second.put(b"seen-again", 2 * hour + 40);
    second.put(b"late", 50); // before the window once stream time is 2 h: not written
    let ids: [&[u8]; 5] = [b"kept", b"seen-again", b"new", b"late", b"never"];
    store.apply_decided(second).unwrap();
    let during: Vec<_> = ids.iter().map(|id| store.first_seen(id).unwrap()).collect();
    store.settle().unwrap();
    let after: Vec<_> = ids.iter().map(|id| store.first_seen(id).unwrap()).collect();
    assert_eq!(during, after);
    assert_eq!(
        after,
        [
            Some(hour + hour / 2),
            Some(2 * hour + 40),
            Some(2 * hour + 30),
            None,
            None
        ]
    );
}

#[test]
fn a_store_opened_for_another_changelog_partition_is_damaged_for_this_task() {
    let dir = tempfile::tempdir().unwrap();
    drop(open(dir.path()));
    let e = try_open(dir.path(), &changelog(1)).err().expect("refused");
    assert_eq!(e.fault(), Fault::Damaged);
    assert!(
        e.reason()
            .contains("belongs to changelog app-dedup-changelog partition 0"),
        "{e}"
    );
    let other_topic = ChangelogIdentity {
        topic: "other-dedup-changelog".into(),
        partition: 0,
        topic_id: None,
    };
    assert_eq!(
        try_open(dir.path(), &other_topic).err().unwrap().fault(),
        Fault::Damaged
    );
    // Its own changelog opens it.
    drop(open(dir.path()));
}

#[test]
fn a_store_of_a_changelog_since_recreated_under_the_same_name_is_damaged_for_this_task() {
    let dir = tempfile::tempdir().unwrap();
    let first = ChangelogIdentity {
        topic_id: Some([1; 16]),
        ..changelog(0)
    };
    drop(try_open(dir.path(), &changelog(0)).unwrap()); // created before the id was known
    drop(try_open(dir.path(), &first).unwrap()); // adopts it
    drop(try_open(dir.path(), &changelog(0)).unwrap()); // an unknown id checks nothing
    let recreated = ChangelogIdentity {
        topic_id: Some([2; 16]),
        ..changelog(0)
    };
    let e = try_open(dir.path(), &recreated).err().expect("refused");
    assert_eq!(e.fault(), Fault::Damaged);
    assert!(e.reason().contains("the changelog was recreated"), "{e}");
    let (path, wal) = (dir.path(), None);
    assert_eq!(
        changelog_offset_on_disk(path, wal, &recreated).unwrap(),
        None,
        "not reported to the group as a copy of the new changelog"
    );
    drop(try_open(dir.path(), &first).unwrap());
}

#[test]
fn a_store_whose_lock_is_held_is_unavailable_not_damaged() {
    let dir = tempfile::tempdir().unwrap();
    let _first = open(dir.path());
    let e = try_open(dir.path(), &changelog(0)).err().expect("locked");
    assert_eq!(
        e.fault(),
        Fault::Unavailable(streamapp_api::health::StoreUnavailable::Locked),
        "{e}"
    );
}

#[test]
fn a_store_missing_an_sst_file_is_damaged() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut store = open(dir.path());
        let mut staged = Staged::default();
        staged.put(b"a", 1);
        store.apply(&staged).unwrap();
        store.close().unwrap();
    }
    let sst = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "sst"))
        .expect("an SST file after the flush");
    std::fs::remove_file(sst).unwrap();
    let e = try_open(dir.path(), &changelog(0)).err().expect("damaged");
    assert_eq!(e.fault(), Fault::Damaged, "{e}");
}

#[test]
fn an_id_past_the_cutoff_is_not_answered_before_compaction_drops_it_nor_after_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let hour = HOUR.as_millis() as i64;
    let now = 100 * hour;
    {
        let mut store = open(dir.path());
        let mut staged = Staged::default();
        staged.put(b"old", now - 2 * hour);
        staged.put(b"recent", now - hour / 2);
        store
            .apply_at(&staged, now - 2 * hour, Existing::Check)
            .unwrap();
        assert_eq!(store.first_seen(b"old").unwrap(), Some(now - 2 * hour));
        let mut staged = Staged::default();
        staged.observe_time(now);
        store.apply_at(&staged, now, Existing::Check).unwrap();
        assert_eq!(store.first_seen(b"old").unwrap(), None, "past the cutoff");
        assert_eq!(store.sighting(b"old", None).unwrap(), None);
        assert_eq!(store.held_ids().unwrap(), 2, "still on disk");
    }
    let mut store = open(dir.path());
    assert_eq!(
        store.first_seen(b"old").unwrap(),
        None,
        "after a reopen too"
    );
    store.compact().unwrap();
    assert_eq!(store.held_ids().unwrap(), 1, "gone once compacted");
    assert_eq!(store.first_seen(b"recent").unwrap(), Some(now - hour / 2));
}

#[test]
fn a_sightings_source_is_kept_through_a_background_apply_and_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let input: std::sync::Arc<str> = "orders".into();
    let sighting = Sighting {
        time: 1_000,
        source: Some(Source {
            topic: input.clone(),
            partition: 3,
            offset: 77,
        }),
    };
    {
        let mut store = open(dir.path());
        let mut staged = Staged::default();
        staged.put_sighting(b"cmd-1", sighting.clone());
        store.apply_decided(staged).unwrap();
        assert_eq!(
            store.sighting(b"cmd-1", Some(&input)).unwrap(),
            Some(sighting.clone()),
            "while it is being written"
        );
        store.settle().unwrap();
        assert_eq!(
            store.sighting(b"cmd-1", Some(&input)).unwrap(),
            Some(sighting.clone())
        );
    }
    let store = open(dir.path());
    let read = store.sighting(b"cmd-1", Some(&input)).unwrap().unwrap();
    assert_eq!(read, sighting);
    assert!(std::sync::Arc::ptr_eq(&read.source.unwrap().topic, &input));
}

#[test]
fn a_later_sighting_wins_in_a_batch_and_the_first_of_two_at_the_same_time() {
    let at = |offset| Sighting {
        time: 5,
        source: Some(Source {
            topic: "in".into(),
            partition: 0,
            offset,
        }),
    };
    let mut staged = Staged::default();
    staged.put_sighting(b"x", at(1));
    staged.put_sighting(b"x", at(2));
    assert_eq!(staged.puts[&b"x"[..]], at(1), "same time: the first stays");
    staged.put_sighting(b"x", Sighting { time: 6, ..at(3) });
    assert_eq!(staged.puts[&b"x"[..]].time, 6);
    staged.put_sighting(b"x", at(4));
    assert_eq!(
        staged.puts[&b"x"[..]].time,
        6,
        "an older one does not replace it"
    );
}

/// Writes a store as format 1 did: sightings of 8 bytes, an expiry index, and how far expiry
/// got, beside the metadata both formats share.
fn write_format_1_store(dir: &Path, ids: &[(&[u8], i64)]) {
    let mut opts = Options::default();
    opts.create_if_missing(true);
    let db = DB::open(&opts, dir).unwrap();
    let ident = changelog(0);
    db.put(META_FORMAT, b"1").unwrap();
    db.put(META_CHANGELOG_TOPIC, ident.topic.as_bytes())
        .unwrap();
    db.put(META_CHANGELOG_PARTITION, 0i64.to_be_bytes())
        .unwrap();
    db.put(META_CHANGELOG_OFFSET, 40i64.to_be_bytes()).unwrap();
    db.put(META_STREAM_TIME, 9_000i64.to_be_bytes()).unwrap();
    db.put(FORMAT_1_EXPIRED_THROUGH, 0i64.to_be_bytes())
        .unwrap();
    for &(id, time) in ids {
        db.put([ID_PREFIX, id].concat(), time.to_be_bytes())
            .unwrap();
        let sortable = ((time as u64) ^ (1 << 63)).to_be_bytes();
        db.put([FORMAT_1_INDEX.0, &sortable, id].concat(), [])
            .unwrap();
    }
}

#[test]
fn a_format_1_store_is_migrated_on_open_keeping_its_ids_and_offsets() {
    let dir = tempfile::tempdir().unwrap();
    write_format_1_store(dir.path(), &[(b"a", 5_000), (b"b", 8_000)]);
    {
        let store = open(dir.path());
        assert_eq!(store.meta().changelog_offset, Some(40));
        assert_eq!(store.meta().stream_time, Some(9_000));
        assert_eq!(store.first_seen(b"a").unwrap(), Some(5_000));
        assert_eq!(
            store.sighting(b"b", None).unwrap(),
            Some(Sighting::at(8_000)),
            "a migrated id's source is unknown"
        );
        assert_eq!(store.id_count().unwrap(), 2);
    }
    let db = DB::open_for_read_only(&Options::default(), dir.path(), false).unwrap();
    assert_eq!(
        db.get(META_FORMAT).unwrap().as_deref(),
        Some(FORMAT_VERSION)
    );
    assert_eq!(db.get(FORMAT_1_EXPIRED_THROUGH).unwrap(), None);
    let index: Vec<_> = db
        .prefix_iterator(FORMAT_1_INDEX.0)
        .map(|item| item.unwrap().0)
        .take_while(|key| key.starts_with(FORMAT_1_INDEX.0))
        .collect();
    assert!(index.is_empty(), "the expiry index is gone: {index:?}");
    drop(db);
    // Opened again: nothing left to migrate, nothing lost.
    assert_eq!(open(dir.path()).first_seen(b"a").unwrap(), Some(5_000));
}

#[test]
fn a_store_of_an_unknown_format_is_damaged_not_migrated() {
    let dir = tempfile::tempdir().unwrap();
    write_format_1_store(dir.path(), &[(b"a", 5_000)]);
    {
        let db = DB::open(&Options::default(), dir.path()).unwrap();
        db.put(META_FORMAT, b"3").unwrap();
    }
    let e = try_open(dir.path(), &changelog(0)).err().expect("damaged");
    assert_eq!(e.fault(), Fault::Damaged, "{e}");
    assert!(e.to_string().contains("unknown store format"), "{e}");
}

#[test]
fn the_compaction_filter_drops_only_ids_older_than_its_cutoff() {
    let at = |t: i64| t.to_be_bytes();
    assert!(expired(b"i/x", &at(4), 5));
    assert!(!expired(b"i/x", &at(5), 5));
    assert!(!expired(b"m/stream_time", &at(4), 5), "metadata stays");
    assert!(!expired(b"i/x", b"?", 5), "what it cannot read stays");
}

#[test]
fn a_record_time_far_in_the_future_moves_stream_time_only_to_the_clock_plus_the_skew() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(dir.path());
    let now = 100 * HOUR.as_millis() as i64;
    let mut staged = Staged::default();
    staged.put(b"recent", now - 1000);
    store.apply_at(&staged, now, Existing::Check).unwrap();
    let hundred_years = 100 * 365 * 24 * HOUR.as_millis() as i64;
    let mut staged = Staged::default();
    staged.observe_time(now + hundred_years);
    store.apply_at(&staged, now, Existing::Check).unwrap();
    assert_eq!(
        store.meta().stream_time,
        Some(now + WINDOW.max_skew.as_millis() as i64)
    );
    assert_eq!(
        store.first_seen(b"recent").unwrap(),
        Some(now - 1000),
        "an id from a second ago is still remembered"
    );
}

/// A stored id's key and value, as written.
type RawId = (Box<[u8]>, Box<[u8]>);

/// Every id the store answers for, with its value as written: what two ways of writing the
/// same records must agree on. (Expired ids are left out: compaction drops them whenever it
/// runs, and ingested files are compacted sooner than a memtable is flushed.)
fn raw_ids(store: &TaskStore) -> Vec<RawId> {
    let cutoff = WINDOW.cutoff(store.meta().stream_time).unwrap_or(i64::MIN);
    store
        .database
        .db
        .prefix_iterator(ID_PREFIX)
        .map(Result::unwrap)
        .take_while(|(key, _)| key.starts_with(ID_PREFIX))
        .filter(|(key, value)| !expired(key, value, cutoff))
        .collect()
}

/// Changelog records for the bulk load's tests: ids put again with earlier and later times
/// (across runs, whichever way runs are cut), forgets (some of ids put again after), records
/// outside the window on arrival, and a move of stream time that expires early ids. The last
/// few are the cases a run must get right whatever its size: an id put again with an earlier
/// time long after its later one, and an id forgotten and put again outside the window in
/// one run (records 394 and 395: chunks of 7, 64 and 400 keep them together).
fn changelog_records() -> Vec<(String, Option<i64>)> {
    let hour = HOUR.as_millis() as i64;
    let mut records: Vec<(String, Option<i64>)> = (0..390)
        .map(|i| {
            let id = format!("id-{}", i * 31 % 113);
            // The first half within 45 minutes, the second half 30 minutes on.
            let time = (i * 7919 % 300) as i64 * hour / 400 + (i / 195) as i64 * hour / 2;
            let time = if i > 300 && i % 23 == 0 { 0 } else { time };
            (id, (i % 17 != 5).then_some(time))
        })
        .collect();
    records.insert(3, ("later-first".into(), Some(hour)));
    records.insert(7, ("forgotten-late".into(), Some(hour)));
    records.extend([
        ("later-first".into(), Some(hour / 2)),
        ("filler".into(), Some(hour)),
        ("forgotten-late".into(), None),
        ("forgotten-late".into(), Some(0)),
        ("filler".into(), Some(hour)),
    ]);
    records
}

fn stage(records: &[(String, Option<i64>)], offset: i64) -> Staged {
    let mut staged = Staged::default();
    for (id, time) in records {
        match time {
            Some(t) => staged.put(id.as_bytes(), *t),
            None => staged.forget(id.as_bytes()),
        }
    }
    staged.changelog_offset = Some(offset);
    staged
}

fn stage_run(records: &[(String, Option<i64>)], offset: i64) -> Run {
    let mut run = Run::default();
    for (id, time) in records {
        match time {
            Some(t) => run.put_sighting(id.as_bytes(), Sighting::at(*t)),
            None => run.forget(id.as_bytes()),
        }
    }
    run.changelog_offset = Some(offset);
    run
}

/// The store `apply` makes of the records, in chunks of `chunk`.
fn applied(records: &[(String, Option<i64>)], chunk: usize) -> (Vec<RawId>, StoreMeta) {
    let dir = tempfile::tempdir().unwrap();
    let mut store = open(dir.path());
    for (i, part) in records.chunks(chunk).enumerate() {
        store.apply(&stage(part, ((i + 1) * chunk) as i64)).unwrap();
    }
    (raw_ids(&store), store.meta().clone())
}

#[test]
fn a_bulk_load_gives_the_store_apply_gives_however_the_runs_are_cut() {
    let records = changelog_records();
    for chunk in [1, 7, 64, 400] {
        let (expected, expected_meta) = applied(&records, chunk);
        let dir = tempfile::tempdir().unwrap();
        let mut store = open(dir.path());
        let mut load = store
            .bulk_load()
            .unwrap()
            .expect("an empty store loads in bulk");
        for (i, part) in records.chunks(chunk).enumerate() {
            store
                .apply_run(&stage_run(part, ((i + 1) * chunk) as i64), &mut load)
                .unwrap();
        }
        assert_eq!(raw_ids(&store), expected, "runs of {chunk}");
        assert_eq!(store.meta(), &expected_meta, "runs of {chunk}");
        assert!(
            !dir.path().join("restore-run.sst").exists(),
            "each run's file is moved into the store"
        );
        drop(store);
        let store = open(dir.path());
        assert_eq!(raw_ids(&store), expected, "runs of {chunk}, reopened");
        assert!(
            store.bulk_load().unwrap().is_none(),
            "a store that holds ids is not bulk loaded"
        );
    }
}

/// A crash after a run's file was ingested and before its offsets were written: the store
/// holds the run's data at the offsets before it. The next start restores the rest the usual
/// way, from there, and ends where a restore without the crash ends.
#[test]
fn a_crash_between_a_runs_ingest_and_its_offsets_is_repaired_by_the_replay() {
    let records = changelog_records();
    let chunk = 64;
    let (expected, expected_meta) = applied(&records, chunk);
    let runs: Vec<_> = records.chunks(chunk).collect();
    for crashed in [0, 3, runs.len() - 1] {
        let dir = tempfile::tempdir().unwrap();
        let mut store = open(dir.path());
        let mut load = store.bulk_load().unwrap().unwrap();
        let mut before = store.meta().clone();
        for (i, part) in runs.iter().enumerate().take(crashed + 1) {
            before = store.meta().clone();
            store
                .apply_run(&stage_run(part, ((i + 1) * chunk) as i64), &mut load)
                .unwrap();
        }
        // The crash: the offsets and clocks of the run before.
        let mut batch = WriteBatch::default();
        for key in [META_CHANGELOG_OFFSET, META_INPUT_OFFSET, META_STREAM_TIME] {
            batch.delete(key);
        }
        super::apply::put_meta(&mut batch, &before);
        store.database.write(batch).unwrap();
        drop(store);
        let mut store = open(dir.path());
        assert_eq!(store.meta(), &before, "crashed in run {crashed}");
        assert!(
            store.bulk_load().unwrap().is_none(),
            "crashed in run {crashed}"
        );
        for (i, part) in runs.iter().enumerate().skip(crashed) {
            store.apply(&stage(part, ((i + 1) * chunk) as i64)).unwrap();
        }
        assert_eq!(raw_ids(&store), expected, "crashed in run {crashed}");
        assert_eq!(store.meta(), &expected_meta, "crashed in run {crashed}");
    }
}

#[test]
fn a_runs_file_a_crash_left_behind_is_removed_when_the_store_opens() {
    let dir = tempfile::tempdir().unwrap();
    drop(open(dir.path()));
    let left = dir.path().join("restore-run.sst");
    std::fs::write(&left, b"half a run").unwrap();
    let store = open(dir.path());
    assert!(!left.exists());
    assert!(
        store.bulk_load().unwrap().is_some(),
        "the store is still empty"
    );
}

/// The runs of bulk loads are held out of the memtable budget: with the low-memory profile
/// (4 MiB memtables, a 32 MiB budget, one memtable's worth always left to the memtables)
/// seven empty stores load in bulk at once, the eighth is restored the usual way, and a load
/// that ends gives its part back.
#[test]
fn bulk_loads_hold_their_runs_within_the_memtable_budget() {
    let tuning = ResolvedRocksDb::profile(RocksDbProfile::LowMemory);
    let memory = SharedMemory::new(&tuning, false);
    let dirs: Vec<_> = (0..8).map(|_| tempfile::tempdir().unwrap()).collect();
    let stores: Vec<TaskStore> = dirs
        .iter()
        .enumerate()
        .map(|(i, dir)| {
            TaskStore::open(
                dir.path(),
                None,
                &tuning,
                &memory,
                MemoryRole::Active,
                WINDOW,
                &changelog(i as i32),
            )
            .unwrap()
        })
        .collect();
    let mut loads: Vec<BulkLoad> = stores[..7]
        .iter()
        .map(|s| s.bulk_load().unwrap().expect("room in the budget"))
        .collect();
    let memtable = tuning.write_buffer_bytes as usize;
    assert!(
        loads
            .iter()
            .all(|l| l.run_records() == memtable / ingest::RUN_BYTES_PER_RECORD)
    );
    assert!(
        stores[7].bulk_load().unwrap().is_none(),
        "the budget is held"
    );
    loads.pop();
    assert!(stores[7].bulk_load().unwrap().is_some(), "given back");
}
