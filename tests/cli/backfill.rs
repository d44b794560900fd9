//! The backbone: plan and backfill on the demo lake, checked on data.

use std::collections::BTreeSet;

use futures::TryStreamExt;
use sha2::{Digest, Sha256};

use crate::support::{PARTIAL_FIX, Store, TestLake, json_ok, runtime, stderr, stdout};

/// (event_id, event_date, amount_cents) as text.
type Row = (String, String, String);

fn to_set(rows: Vec<Vec<String>>) -> BTreeSet<Row> {
    rows.into_iter()
        .map(|r| (r[0].clone(), r[1].clone(), r[2].clone()))
        .collect()
}

fn plan_reads_the_log_and_writes_nothing(store: Store) {
    let lake = TestLake::on(store);
    let (from, to) = (lake.day(2), lake.day(8));
    let before = lake.version("events");
    let plan = json_ok(&lake.run(&[
        "plan",
        "events",
        "--from",
        &from,
        "--to",
        &to,
        "--batch-partitions",
        "3",
        "--output-format",
        "json",
    ]));
    assert_eq!(plan["read_version"], before);
    assert_eq!(plan["model_version"], "v2");
    assert_eq!(plan["partitions"].as_array().unwrap().len(), 7);
    assert_eq!(plan["batches"].as_array().unwrap().len(), 3);
    assert_eq!(
        plan["batches"][2]["partitions"],
        serde_json::json!([lake.day(8)])
    );
    assert_eq!(plan["sources"][0]["table"], "raw_events");
    assert_eq!(plan["sources"][0]["version"], lake.version("raw_events"));
    assert_eq!(plan["downstream"][0]["model"], "daily_revenue");
    let fingerprint = hex::encode(Sha256::digest(
        std::fs::read(lake.path().join("sql/events/v2.sql")).unwrap(),
    ));
    assert_eq!(plan["fingerprint"], fingerprint);

    // Row counts come from the log; they must equal what the data holds.
    let actual = lake.query(
        &[("events", lake.open("events"))],
        &format!(
            "SELECT CAST(event_date AS VARCHAR), COUNT(*) FROM events \
             WHERE event_date BETWEEN DATE '{from}' AND DATE '{to}' GROUP BY 1 ORDER BY 1"
        ),
    );
    let planned: Vec<Vec<String>> = plan["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            vec![
                p["value"].as_str().unwrap().to_string(),
                p["rows"].to_string(),
            ]
        })
        .collect();
    assert_eq!(planned, actual);

    assert_eq!(lake.version("events"), before, "plan must not commit");
    let journal = format!("_lakefill/runs/{}.json", plan["run_id"].as_str().unwrap());
    assert!(
        !lake.objects("events").contains(&journal),
        "plan must not write a journal"
    );
}

fn events_v2_backfill_replaces_exactly_the_range(store: Store) {
    let lake = TestLake::on(store);
    let (from, to) = (lake.day(3), lake.day(6));
    let before_version = lake.version("events");
    let before_files = lake.files("events");
    let range_sql = format!(
        "SELECT CAST(event_id AS VARCHAR), CAST(event_date AS VARCHAR), CAST(amount_cents AS VARCHAR) \
         FROM events WHERE event_date BETWEEN DATE '{from}' AND DATE '{to}'"
    );
    let old_rows = to_set(lake.query(&[("events", lake.open("events"))], &range_sql));

    let report = json_ok(&lake.run(&[
        "backfill",
        "events",
        "--from",
        &from,
        "--to",
        &to,
        "--batch-partitions",
        "2",
        "--output-format",
        "json",
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
    ]));
    assert_eq!(report["state"], "published");
    assert_eq!(report["published_version"], before_version + 1);
    assert_eq!(report["read_version"], before_version);
    assert_eq!(lake.version("events"), before_version + 1);

    // Expectation computed here, from raw_events, without engine code: the UTC date of event_ts.
    let raw = lake.query(
        &[("raw_events", lake.open("raw_events"))],
        "SELECT CAST(event_id AS VARCHAR), CAST(event_ts AS VARCHAR), CAST(amount_cents AS VARCHAR) FROM raw_events",
    );
    let expected: BTreeSet<Row> = raw
        .into_iter()
        .map(|r| (r[0].clone(), r[1][..10].to_string(), r[2].clone()))
        .filter(|(_, date, _)| from.as_str() <= date.as_str() && date.as_str() <= to.as_str())
        .collect();
    let new_rows = to_set(lake.query(&[("events", lake.open("events"))], &range_sql));
    assert!(!expected.is_empty());
    assert_eq!(
        new_rows, expected,
        "backfilled partitions must equal the independent expectation"
    );
    assert_ne!(old_rows, new_rows, "v1 and v2 differ near midnight");

    // Report counts match the data.
    for partition in report["partitions"].as_array().unwrap() {
        let value = partition["value"].as_str().unwrap();
        let n = expected.iter().filter(|(_, d, _)| d == value).count() as u64;
        assert_eq!(partition["new_rows"], n, "{value}");
    }

    // Partitions outside the range keep exactly the same files; inside, none survive.
    let after_files = lake.files("events");
    for (partition, files) in &before_files {
        if from.as_str() <= partition.as_str() && partition.as_str() <= to.as_str() {
            let after = after_files.get(partition).cloned().unwrap_or_default();
            assert!(
                files.keys().all(|p| !after.contains_key(p)),
                "{partition} still has an old file"
            );
            assert!(
                after.keys().all(|p| p.contains("/lakefill-events-v2-")),
                "{partition}: {after:?}"
            );
        } else {
            assert_eq!(
                after_files.get(partition),
                Some(files),
                "{partition} changed"
            );
        }
    }

    // The previous version still reads, by time travel, with the old data.
    let old_again = to_set(lake.query(
        &[("events", lake.open_version("events", before_version))],
        &range_sql,
    ));
    assert_eq!(old_again, old_rows);

    // Commit metadata, read back through delta-rs.
    let table = lake.open("events");
    let history: Vec<_> = runtime()
        .block_on(async { table.history(Some(1)).try_collect::<Vec<_>>().await })
        .expect("history");
    let info = &history[0];
    assert_eq!(info.operation.as_deref(), Some("WRITE"));
    let meta = &info.info["lakefill"];
    assert_eq!(meta["run_id"], report["run_id"]);
    assert_eq!(meta["model"], "events");
    assert_eq!(meta["model_version"], "v2");
    let fingerprint = hex::encode(Sha256::digest(
        std::fs::read(lake.path().join("sql/events/v2.sql")).unwrap(),
    ));
    assert_eq!(meta["fingerprint"], fingerprint);
    assert_eq!(meta["sources"]["raw_events"], lake.version("raw_events"));
    assert_eq!(meta["range"], serde_json::json!([from, to]));
    assert_eq!(meta["read_version"], before_version);
    // A partial fix of the time zone bug: keys crossed the range's edges, allowed and recorded.
    assert_eq!(meta["reason"], PARTIAL_FIX);
    assert_eq!(meta["edge_moves"]["reason"], PARTIAL_FIX);
    let (duplicated, moved) = (
        meta["edge_moves"]["duplicated"].as_u64().unwrap(),
        meta["edge_moves"]["moved"].as_u64().unwrap(),
    );
    assert!(duplicated > 0 && moved > 0, "{meta}");
    assert_eq!(meta["partitions"].as_array().unwrap().len(), 4);
    assert_eq!(
        meta["partitions"][0]["old_rows"],
        report["partitions"][0]["old_rows"]
    );
    assert_eq!(meta["validation"]["passed"], true);
    let user_metadata: serde_json::Value =
        serde_json::from_str(info.user_metadata.as_deref().expect("userMetadata is set")).unwrap();
    assert_eq!(user_metadata["run_id"], report["run_id"]);
    let predicate = info.operation_parameters.as_ref().unwrap()["predicate"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        predicate.contains(&from) && predicate.contains(&to),
        "{predicate}"
    );
    let app_id = format!("lakefill:{}", report["run_id"].as_str().unwrap());
    let txn = runtime().block_on(async {
        table
            .snapshot()
            .unwrap()
            .transaction_version(table.log_store().as_ref(), &app_id)
            .await
    });
    assert_eq!(txn.expect("txn"), Some(1));

    // A second identical run changes nothing.
    let again = lake.run(&[
        "backfill",
        "events",
        "--from",
        &from,
        "--to",
        &to,
        "--batch-partitions",
        "2",
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
    ]);
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
    assert!(
        stdout(&again).contains("already published"),
        "{}",
        stdout(&again)
    );
    assert_eq!(lake.version("events"), before_version + 1);
    assert_eq!(lake.files("events"), after_files);

    // The journal records the published run.
    let journal_path = format!("_lakefill/runs/{}.json", report["run_id"].as_str().unwrap());
    let journal: serde_json::Value =
        serde_json::from_slice(&lake.object_bytes("events", &journal_path)).unwrap();
    assert_eq!(journal["state"], "published");
    assert_eq!(journal["published_version"], before_version + 1);
}

fn downstream_backfill_follows_corrected_events(store: Store) {
    let lake = TestLake::on(store);
    let (from, to) = (lake.day(0), lake.day(9));
    json_ok(&lake.run(&[
        "backfill",
        "events",
        "--from",
        &from,
        "--to",
        &to,
        "--output-format",
        "json",
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
    ]));
    let report = json_ok(&lake.run(&[
        "backfill",
        "daily_revenue",
        "--from",
        &from,
        "--to",
        &to,
        "--output-format",
        "json",
    ]));
    assert_eq!(report["state"], "published");
    let expected = lake.query(
        &[("events", lake.open("events"))],
        "SELECT CAST(event_date AS VARCHAR), country, CAST(SUM(amount_cents) AS VARCHAR), CAST(COUNT(*) AS VARCHAR) \
         FROM events GROUP BY 1, 2 ORDER BY 1, 2",
    );
    let actual = lake.query(
        &[("daily_revenue", lake.open("daily_revenue"))],
        "SELECT CAST(event_date AS VARCHAR), country, CAST(revenue_cents AS VARCHAR), CAST(events AS VARCHAR) \
         FROM daily_revenue ORDER BY 1, 2",
    );
    assert_eq!(actual, expected);
    // Over the whole history, v2 keeps every raw event whose UTC date is in the range.
    let raw_in_range = lake.query(
        &[("raw_events", lake.open("raw_events"))],
        &format!("SELECT COUNT(*) FROM raw_events WHERE CAST(event_ts AS DATE) BETWEEN DATE '{from}' AND DATE '{to}'"),
    );
    let events_total = lake.query(
        &[("events", lake.open("events"))],
        "SELECT COUNT(*) FROM events",
    );
    assert_eq!(events_total, raw_in_range);
}

fn spill_outside_the_range_fails_unless_dropped_on_purpose(store: Store) {
    let lake = TestLake::on(store);
    // A model that forgets to filter its output to the batch: late events of the day before
    // and early-ingested context of the day after land outside the range.
    let model = std::fs::read_to_string(lake.path().join("sql/events/v2.sql"))
        .unwrap()
        .replace("WHERE CAST(event_ts AS DATE) BETWEEN $start AND $end", "");
    std::fs::write(lake.path().join("sql/events/v3.sql"), model).unwrap();
    let (from, to) = (lake.day(3), lake.day(6));
    let before = lake.version("events");

    let failed = lake.run(&[
        "backfill",
        "events",
        "--from",
        &from,
        "--to",
        &to,
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
    ]);
    assert_eq!(failed.status.code(), Some(1), "{}", stderr(&failed));
    let err = stderr(&failed);
    assert!(err.contains("outside the range"), "{err}");
    assert!(
        err.contains(&lake.day(2)),
        "names the partition before the range: {err}"
    );
    assert!(
        err.contains(&format!("--from {}", lake.day(2))),
        "suggests a wider range: {err}"
    );
    assert!(err.contains("hint:"), "{err}");
    assert_eq!(lake.version("events"), before, "nothing published");
    let staged: Vec<_> = lake
        .objects("events")
        .into_iter()
        .filter(|p| p.contains("lakefill-events-v3"))
        .collect();
    assert!(
        staged.is_empty(),
        "staged files of the failed run are removed: {staged:?}"
    );

    let dropped = json_ok(&lake.run(&[
        "backfill",
        "events",
        "--from",
        &from,
        "--to",
        &to,
        "--allow-spill",
        "drop",
        "--output-format",
        "json",
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
    ]));
    assert_eq!(dropped["published_version"], before + 1);
    let spilled = dropped["spill_dropped"].as_u64().unwrap();
    assert!(spilled > 0);
    let spill = dropped["validation"]["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "spill")
        .unwrap();
    let sum: u64 = spill["failures"][0]["partitions"]
        .as_object()
        .unwrap()
        .values()
        .map(|n| n.as_u64().unwrap())
        .sum();
    assert_eq!(sum, spilled);
}

fn partitions_the_model_leaves_empty_end_up_empty(store: Store) {
    let lake = TestLake::on(store);
    let day = lake.day(4);
    let model = std::fs::read_to_string(lake.path().join("sql/events/v2.sql"))
        .unwrap()
        .replace(
            "BETWEEN $start AND $end",
            &format!("BETWEEN $start AND $end AND CAST(event_ts AS DATE) <> DATE '{day}'"),
        );
    std::fs::write(lake.path().join("sql/events/v3.sql"), model).unwrap();
    let out = lake.run(&[
        "backfill",
        "events",
        "--from",
        &lake.day(3),
        "--to",
        &lake.day(5),
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    let line = text
        .lines()
        .find(|l| l.contains(&day))
        .expect("partition line");
    assert!(line.contains("(now empty)"), "{text}");
    assert!(
        !lake.files("events").contains_key(&day),
        "the partition has no files"
    );
    assert!(lake.files("events").contains_key(&lake.day(3)));
}

fn a_model_reading_its_own_target_applies_once(store: Store) {
    let lake = TestLake::on(store);
    std::fs::create_dir_all(lake.path().join("sql/events_cents")).unwrap();
    std::fs::write(
        lake.path().join("sql/events_cents/v1.sql"),
        "/*\ntarget = \"events\"\npartition_by = \"event_date\"\nreason = \"amounts were stored in dollars\"\n\
         [sources.events]\nwindow = \"event_date\"\n*/\n\
         SELECT event_id, user_id, country, amount_cents * 100 AS amount_cents, event_ts, event_date FROM events",
    )
    .unwrap();
    let (from, to) = (lake.day(2), lake.day(4));
    let sums_sql = "SELECT CAST(event_date AS VARCHAR), CAST(SUM(amount_cents) AS VARCHAR) FROM events GROUP BY 1 ORDER BY 1";
    let before = lake.query(&[("events", lake.open("events"))], sums_sql);
    let plan = json_ok(&lake.run(&[
        "plan",
        "events_cents",
        "--from",
        &from,
        "--to",
        &to,
        "--output-format",
        "json",
    ]));
    assert_eq!(plan["sources"][0]["reads_target"], true);
    assert_eq!(plan["sources"][0]["version"], plan["read_version"]);

    json_ok(&lake.run(&[
        "backfill",
        "events_cents",
        "--from",
        &from,
        "--to",
        &to,
        "--batch-partitions",
        "2",
        "--output-format",
        "json",
    ]));
    let again = json_ok(&lake.run(&[
        "backfill",
        "events_cents",
        "--from",
        &from,
        "--to",
        &to,
        "--output-format",
        "json",
    ]));
    assert_eq!(
        again["outcome"], "already_published",
        "the run id ignores the target's own version"
    );

    let after = lake.query(&[("events", lake.open("events"))], sums_sql);
    assert_eq!(before.len(), after.len());
    for (old, new) in before.iter().zip(&after) {
        let (old_sum, new_sum): (i64, i64) = (old[1].parse().unwrap(), new[1].parse().unwrap());
        if from <= old[0] && old[0] <= to {
            assert_eq!(new_sum, old_sum * 100, "{}", old[0]);
        } else {
            assert_eq!(new_sum, old_sum, "{}", old[0]);
        }
    }
}

#[test]
fn sources_are_read_only_inside_the_batch_window() {
    let lake = TestLake::new();
    // Corrupt every raw_events file of the last ingest day: only a scan that reaches it fails.
    let last = lake
        .table_path("raw_events")
        .join(format!("ingest_date={}", lake.day(9)));
    for entry in std::fs::read_dir(&last).unwrap().flatten() {
        std::fs::write(entry.path(), b"not parquet").unwrap();
    }
    // Window of 2..4 with lookahead 1 reads ingest days 2..5.
    let out = lake.run(&[
        "backfill",
        "events",
        "--from",
        &lake.day(2),
        "--to",
        &lake.day(4),
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "pruned scan must not touch day 9: {}",
        stderr(&out)
    );
    // Day 8 reads ingest day 9: the corrupt file is reached and the run fails, publishing nothing.
    let before = lake.version("events");
    let out = lake.run(&[
        "backfill",
        "events",
        "--from",
        &lake.day(7),
        "--to",
        &lake.day(8),
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("error: "), "{}", stderr(&out));
    assert_eq!(lake.version("events"), before);
}

fn a_published_run_reapplies_only_after_its_range_changed(store: Store) {
    let lake = TestLake::on(store);
    let (from, to) = (lake.day(0), lake.day(9));
    let args = |version: &str| -> Vec<String> {
        [
            "backfill",
            "events",
            "--from",
            &from,
            "--to",
            &to,
            "--model-version",
            version,
            "--output-format",
            "json",
            "--allow-edge-moves",
            "--reason",
            PARTIAL_FIX,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let run = |version: &str| {
        let args = args(version);
        json_ok(&lake.run(&args.iter().map(String::as_str).collect::<Vec<_>>()))
    };
    // The lake's history already holds events@v1 over this range: nothing to do.
    let v1 = lake.version("events");
    assert_eq!(run("v1")["outcome"], "already_published");
    assert_eq!(run("v2")["published_version"], v1 + 1);
    // v2 changed v1's range since v1 published, so v1 applies again, as a new commit.
    let again = run("v1");
    assert_eq!(again["outcome"], "published");
    assert_eq!(again["published_version"], v1 + 2);
    assert_eq!(run("v1")["outcome"], "already_published");
    assert_eq!(lake.version("events"), v1 + 2);
}

every_store!(
    plan_reads_the_log_and_writes_nothing,
    events_v2_backfill_replaces_exactly_the_range,
    downstream_backfill_follows_corrected_events,
    spill_outside_the_range_fails_unless_dropped_on_purpose,
    partitions_the_model_leaves_empty_end_up_empty,
    a_model_reading_its_own_target_applies_once,
    a_published_run_reapplies_only_after_its_range_changed,
);
