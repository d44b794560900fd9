//! The change data feed (#37): a table with `delta.enableChangeDataFeed` gets, with each fix, a
//! feed of exactly the rows that changed. It is read back by python `deltalake`'s `load_cdf` and
//! checked row for row against a diff DuckDB computes from the two versions' rows (`feed.py`),
//! never against lakefill's own output.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use crate::support::{json_ok, run_in};

fn python(args: &[&str]) -> Value {
    crate::support::python_json("feed.py", args)
}

/// A lake of `layout` whose `events` records a change feed, its model keyed or not; returns it
/// with the range of every partition.
fn lake(layout: &str, keyed: &str) -> (tempfile::TempDir, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let range = python(&["make", dir.path().to_str().unwrap(), layout, keyed]);
    let (from, to) = (
        range["from"].as_str().unwrap().to_string(),
        range["to"].as_str().unwrap().to_string(),
    );
    (dir, from, to)
}

/// The feed of `version` as `load_cdf` reads it, and as the independent diff says it must be.
fn feed_and_expected(dir: &Path, version: u64, keyed: &str) -> (Vec<Value>, Vec<Value>) {
    let path = dir.to_str().unwrap();
    let version = version.to_string();
    let got = python(&["feed", path, &version]);
    let expected = python(&["expect", path, &version, keyed]);
    (
        got.as_array().unwrap().clone(),
        expected.as_array().unwrap().clone(),
    )
}

/// Rows of each change type in `rows` (the change type last in each).
fn counts(rows: &[Value]) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for row in rows {
        let kind = row.as_array().unwrap().last().unwrap().as_str().unwrap();
        *counts.entry(kind.to_string()).or_default() += 1;
    }
    counts
}

/// The report's `change_feed`, without the types it has no rows of.
fn reported(report: &Value) -> BTreeMap<String, u64> {
    report["change_feed"]
        .as_object()
        .unwrap_or_else(|| panic!("no change_feed in {report}"))
        .iter()
        .map(|(k, v)| (k.clone(), v.as_u64().unwrap()))
        .filter(|(_, n)| *n > 0)
        .collect()
}

fn backfill(dir: &Path, args: &[&str]) -> Value {
    json_ok(&run_in(
        dir,
        &[
            &["backfill", "events"][..],
            args,
            &["--output-format", "json"],
        ]
        .concat(),
    ))
}

#[test]
fn a_fix_feeds_exactly_the_rows_it_changes_and_nothing_for_partitions_it_leaves_alike() {
    for keyed in ["key", "nokey"] {
        let (dir, from, to) = lake("date", keyed);
        let path = dir.path();
        let range = ["--from", from.as_str(), "--to", to.as_str()];
        // The change event carries the feed's counts too.
        let toml = std::fs::read_to_string(path.join("lakefill.toml")).unwrap();
        let toml = toml.replace(
            "[tables.events]\n",
            "[tables.events]\nnotify = [\"file:events.jsonl\"]\n",
        );
        std::fs::write(path.join("lakefill.toml"), toml).unwrap();
        // The timezone fix moves every event before 08:00 UTC to its day.
        let report = backfill(path, &range);
        assert_eq!(report["published_version"], 1, "{keyed}");
        let (got, expected) = feed_and_expected(path, 1, keyed);
        assert!(!got.is_empty(), "{keyed}");
        assert_eq!(
            got, expected,
            "{keyed}: the feed is the diff of versions 0 and 1"
        );
        assert_eq!(
            reported(&report),
            counts(&got),
            "{keyed}: the report counts the feed"
        );
        let events = std::fs::read_to_string(path.join("events.jsonl")).unwrap();
        let event = events.lines().last().unwrap();
        crate::notify::assert_valid_event(event);
        let event: Value = serde_json::from_str(event).unwrap();
        assert_eq!(
            reported(&event),
            counts(&got),
            "{keyed}: the event counts the feed"
        );
        if keyed == "key" {
            // A moved event is an update of its key: its old and its new row.
            assert_eq!(
                counts(&got).keys().collect::<Vec<_>>(),
                ["update_postimage", "update_preimage"]
            );
        } else {
            assert_eq!(
                counts(&got).keys().collect::<Vec<_>>(),
                ["delete", "insert"]
            );
        }

        // v2 changes the amounts of one day only: the feed holds that day's rows, and the
        // other days' files, rewritten with the same rows, do not change data.
        python(&["bump", path.to_str().unwrap(), "2024-03-03"]);
        let report = backfill(path, &[&range[..], &["--model-version", "v2"]].concat());
        assert_eq!(report["published_version"], 2, "{keyed}");
        let (got, expected) = feed_and_expected(path, 2, keyed);
        assert_eq!(
            got, expected,
            "{keyed}: the feed is the diff of versions 1 and 2"
        );
        assert_eq!(reported(&report), counts(&got), "{keyed}");
        assert_eq!(
            got.len(),
            2 * 5 * 15,
            "{keyed}: 75 events of 2024-03-03, old and new"
        );
        // `diff --cdf` shows the same feed: the counts, one partition, a sample of each type.
        let shown = json_ok(&run_in(
            path,
            &[
                "diff",
                "events",
                "--cdf",
                "2",
                "--sample",
                "3",
                "--output-format",
                "json",
            ],
        ));
        assert_eq!(shown["recorded"], true, "{keyed}");
        let shown_counts = serde_json::json!({"change_feed": shown["counts"]});
        assert_eq!(reported(&shown_counts), counts(&got), "{keyed}");
        assert_eq!(
            shown["partitions"].as_array().unwrap().len(),
            1,
            "{keyed}: {shown}"
        );
        assert_eq!(shown["partitions"][0]["partition"], "event_date=2024-03-03");
        assert_eq!(
            shown["rows"].as_array().unwrap().len(),
            3 * counts(&got).len(),
            "{keyed}: {shown}"
        );
        assert!(got.iter().all(|row| row[3] == "2024-03-03"), "{keyed}");
        let actions = python(&["actions", path.to_str().unwrap(), "2"]);
        for kind in ["add", "remove"] {
            for action in actions[kind].as_array().unwrap() {
                let changed = action[2] == "2024-03-03";
                assert_eq!(action[1], changed, "{keyed}: {kind} {action}");
            }
        }
        // Keyed, every row of the day is an update: the day's removed file and added file are
        // copied whole into the feed, column chunk by column chunk, not read and written again.
        let copies = python(&["copies", path.to_str().unwrap(), "2"]);
        let expected_copies = match keyed {
            "key" => serde_json::json!({"cdc": 2, "added": 1, "removed": 1}),
            _ => serde_json::json!({"cdc": copies["cdc"], "added": 0, "removed": 0}),
        };
        assert_eq!(copies, expected_copies, "{keyed}");
        for cdc in actions["cdc"].as_array().unwrap() {
            assert_eq!(cdc[1], false, "{keyed}: a cdc file changes no data itself");
            assert_eq!(cdc[2], "2024-03-03", "{keyed}");
            assert!(
                cdc[0]
                    .as_str()
                    .unwrap()
                    .starts_with("_change_data/lakefill-events-v2-"),
                "{keyed}: {cdc}"
            );
        }

        // The same rows again, from a v3 that only adds a comment, are up to date: nothing is
        // published, no feed is written.
        let models = path.join("sql/events");
        let v2 = std::fs::read_to_string(models.join("v2.sql")).unwrap();
        std::fs::write(models.join("v3.sql"), format!("{v2}\n-- the same rows\n")).unwrap();
        let report = backfill(path, &[&range[..], &["--model-version", "v3"]].concat());
        assert_eq!(report["outcome"], "up_to_date", "{keyed}: {report}");
        assert!(report["published_version"].is_null(), "{keyed}");
        assert!(
            !path
                .join("lake/events/_delta_log/00000000000000000003.json")
                .exists(),
            "{keyed}"
        );

        // v4 removes events, adds others and changes amounts: every kind of change at once.
        python(&["reshape", path.to_str().unwrap()]);
        let report = backfill(path, &[&range[..], &["--model-version", "v4"]].concat());
        assert_eq!(report["published_version"], 3, "{keyed}: {report}");
        let (got, expected) = feed_and_expected(path, 3, keyed);
        assert_eq!(
            got, expected,
            "{keyed}: the feed is the diff of versions 2 and 3"
        );
        assert_eq!(reported(&report), counts(&got), "{keyed}");
        let kinds: Vec<&str> = match keyed {
            "key" => vec!["delete", "insert", "update_postimage", "update_preimage"],
            _ => vec!["delete", "insert"],
        };
        assert_eq!(
            counts(&got).keys().map(String::as_str).collect::<Vec<_>>(),
            kinds,
            "{keyed}"
        );

        // v5 deletes every row of one day, moves every row of another into a third (which
        // keeps its own rows) and changes every row of a fourth. Keyed, the days whose every
        // row is one change are copied whole (the emptied day's rows as deletes, the moved
        // day's as pre-images, the changed day's both sides), the day that holds rows of two
        // is computed row by row; the feed is exact all the same.
        python(&["wholes", path.to_str().unwrap()]);
        let report = backfill(path, &[&range[..], &["--model-version", "v5"]].concat());
        assert_eq!(report["published_version"], 4, "{keyed}: {report}");
        let (got, expected) = feed_and_expected(path, 4, keyed);
        assert_eq!(
            got, expected,
            "{keyed}: the feed is the diff of versions 3 and 4"
        );
        assert_eq!(reported(&report), counts(&got), "{keyed}");
        let copies = python(&["copies", path.to_str().unwrap(), "4"]);
        let (added, removed) = if keyed == "key" { (1, 3) } else { (0, 0) };
        assert_eq!(copies["added"], added, "{keyed}: {copies}");
        assert_eq!(copies["removed"], removed, "{keyed}: {copies}");
    }
}

#[test]
fn a_day_whose_every_row_changed_in_another_writers_files_feeds_exactly_those_rows() {
    let (dir, from, to) = lake("date", "key");
    let path = dir.path();
    // python `deltalake` wrote the table; the fix changes every row of one day, no other.
    python(&["rebump", path.to_str().unwrap(), "2024-03-03"]);
    let report = backfill(
        path,
        &["--from", &from, "--to", &to, "--model-version", "v9"],
    );
    assert_eq!(report["published_version"], 1, "{report}");
    let (got, expected) = feed_and_expected(path, 1, "key");
    assert_eq!(got, expected, "the feed is the diff of versions 0 and 1");
    let kinds = counts(&got);
    assert_eq!(kinds.len(), 2, "{kinds:?}");
    assert!(kinds["update_preimage"] > 50, "{kinds:?}");
    assert_eq!(kinds["update_preimage"], kinds["update_postimage"]);
    assert!(got.iter().all(|row| row[3] == "2024-03-03"));
    assert_eq!(reported(&report), kinds);
    // python's file of the day holds the columns lakefill's feed would (arrow-rs wrote both):
    // it is copied whole, as is the day's new file.
    let copies = python(&["copies", path.to_str().unwrap(), "1"]);
    assert_eq!(
        copies,
        serde_json::json!({"cdc": 2, "added": 1, "removed": 1}),
        "{copies}"
    );
}

#[test]
fn a_fix_of_one_country_feeds_only_that_countrys_rows() {
    let (dir, from, to) = lake("date_country", "key");
    let path = dir.path();
    let report = backfill(
        path,
        &["--from", &from, "--to", &to, "--where", "country = 'DE'"],
    );
    let (got, expected) = feed_and_expected(path, 1, "key");
    assert!(!got.is_empty());
    assert_eq!(got, expected);
    assert!(got.iter().all(|row| row[1] == "DE"), "{got:?}");
    assert_eq!(reported(&report), counts(&got));
}

#[test]
fn a_staged_run_publishes_its_feed_and_a_discarded_one_leaves_none() {
    let (dir, from, to) = lake("date", "key");
    let path = dir.path();
    let range = ["--from", from.as_str(), "--to", to.as_str()];
    let staged = backfill(path, &[&range[..], &["--stage-only"]].concat());
    let run_id = staged["run_id"].as_str().unwrap().to_string();
    let feed_dir = path
        .join("lake/events/_change_data")
        .join(format!("lakefill-{run_id}"));
    assert!(feed_dir.is_dir(), "the staged run's feed is written");
    // Discarded, its feed goes with its staged files.
    json_ok(&run_in(
        path,
        &["discard", &run_id, "--output-format", "json"],
    ));
    assert!(
        !feed_dir.exists() || walk(&feed_dir).is_empty(),
        "discard deletes the feed: {:?}",
        walk(&feed_dir)
    );

    let staged = backfill(path, &[&range[..], &["--stage-only"]].concat());
    let run_id = staged["run_id"].as_str().unwrap().to_string();
    let published = json_ok(&run_in(
        path,
        &["publish", &run_id, "--output-format", "json"],
    ));
    let version = published["published_version"].as_u64().unwrap();
    let (got, expected) = feed_and_expected(path, version, "key");
    assert!(!got.is_empty());
    assert_eq!(got, expected);
    assert_eq!(reported(&published), counts(&got));

    // Reverted, the feed is the fix's the other way round: each pre-image a post-image.
    let reverted = json_ok(&run_in(
        path,
        &["revert", &run_id, "--output-format", "json"],
    ));
    let revert_version = reverted["published_version"].as_u64().unwrap();
    let (back, expected) = feed_and_expected(path, revert_version, "key");
    assert_eq!(back, expected);
    assert_eq!(reported(&reverted), counts(&back));
    let mut inverted: Vec<Value> = got
        .iter()
        .map(|row| {
            let mut row = row.as_array().unwrap().clone();
            let kind = row.pop().unwrap();
            row.push(Value::from(match kind.as_str().unwrap() {
                "update_preimage" => "update_postimage",
                "update_postimage" => "update_preimage",
                "insert" => "delete",
                "delete" => "insert",
                other => panic!("{other}"),
            }));
            Value::Array(row)
        })
        .collect();
    inverted.sort_by_key(|row| row.to_string());
    let mut back = back;
    back.sort_by_key(|row| row.to_string());
    assert_eq!(back, inverted);
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                files.extend(walk(&path));
            } else {
                files.push(path);
            }
        }
    }
    files
}

#[test]
fn the_feed_of_a_table_that_records_none_is_refused_with_what_to_do_instead() {
    let dir = tempfile::tempdir().unwrap();
    crate::support::python_json("scope.py", &["make", dir.path().to_str().unwrap(), "date"]);
    let out = run_in(dir.path(), &["diff", "events", "--cdf", "0"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        crate::support::stderr(&out)
    );
    let message = crate::support::stderr(&out);
    assert!(message.contains("delta.enableChangeDataFeed"), "{message}");
    assert!(message.contains("--from-version"), "{message}");
}

#[test]
fn every_table_of_a_cascade_feeds_its_own_changes() {
    let (dir, from, to) = lake("date", "key");
    let path = dir.path();
    let dir_arg = path.to_str().unwrap();
    python(&["downstream", dir_arg]);
    let cascade = json_ok(&run_in(
        path,
        &[
            "backfill",
            "events",
            "--from",
            &from,
            "--to",
            &to,
            "--cascade",
            "--output-format",
            "json",
        ],
    ));
    let nodes = cascade["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 3, "{cascade}");
    for (table, key) in [
        ("events", "event_id"),
        ("daily", "event_date,country"),
        ("totals", "event_date"),
    ] {
        let node = nodes.iter().find(|n| n["table"] == table).unwrap();
        let version = node["published_version"].as_u64().unwrap().to_string();
        let got = python(&["gfeed", dir_arg, table, &version]);
        let expected = python(&["gexpect", dir_arg, table, &version, key]);
        let got = got.as_array().unwrap();
        assert!(!got.is_empty(), "{table}");
        assert_eq!(got, expected.as_array().unwrap(), "{table}");
        assert_eq!(reported(node), counts(got), "{table}: {node}");
    }
}

#[test]
fn gc_deletes_the_feed_of_an_abandoned_run_and_keeps_a_published_ones() {
    let (dir, from, to) = lake("date", "key");
    let path = dir.path();
    let range = ["--from", from.as_str(), "--to", to.as_str()];
    let published = backfill(path, &range);
    let published_feed = path.join("lake/events/_change_data").join(format!(
        "lakefill-{}",
        published["run_id"].as_str().unwrap()
    ));
    python(&["bump", path.to_str().unwrap(), "2024-03-03"]);
    let staged = backfill(
        path,
        &[&range[..], &["--model-version", "v2", "--stage-only"]].concat(),
    );
    let staged_feed = path
        .join("lake/events/_change_data")
        .join(format!("lakefill-{}", staged["run_id"].as_str().unwrap()));
    assert!(!walk(&staged_feed).is_empty());
    let kept = walk(&published_feed);
    assert!(!kept.is_empty());
    let gc = json_ok(&run_in(
        path,
        &[
            "gc",
            "events",
            "--older-than",
            "0s",
            "--output-format",
            "json",
        ],
    ));
    assert!(walk(&staged_feed).is_empty(), "{gc}");
    assert_eq!(
        walk(&published_feed),
        kept,
        "a published run's feed is referenced: {gc}"
    );
    // The published version's feed still reads.
    let (got, expected) = feed_and_expected(path, 1, "key");
    assert_eq!(got, expected);
}

#[test]
fn a_table_without_time_feeds_the_rows_of_its_predicate_only() {
    for layout in ["flat", "int"] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path();
        let dir_arg = path.to_str().unwrap();
        python(&["timeless", dir_arg, layout]);
        let report = json_ok(&run_in(
            path,
            &[
                "backfill",
                "accounts",
                "--where",
                "country = 'DE'",
                "--output-format",
                "json",
            ],
        ));
        let version = report["published_version"].as_u64().unwrap().to_string();
        let got = python(&["gfeed", dir_arg, "accounts", &version]);
        let expected = python(&["gexpect", dir_arg, "accounts", &version, "id"]);
        let got = got.as_array().unwrap();
        // 4 parts x 10 DE accounts, each an update: its old and its new row.
        assert_eq!(got.len(), 2 * 4 * 10, "{layout}: {got:?}");
        assert_eq!(got, expected.as_array().unwrap(), "{layout}");
        assert!(got.iter().all(|row| row[2] == "DE"), "{layout}: {got:?}");
        assert_eq!(reported(&report), counts(got), "{layout}");
    }
}

#[test]
fn a_logical_revert_feeds_the_rows_it_puts_back() {
    let (dir, from, to) = lake("date", "key");
    let path = dir.path();
    let range = ["--from", from.as_str(), "--to", to.as_str()];
    let first = backfill(path, &range);
    // A later fix of one day blocks a revert by files: the range is recomputed as it was.
    python(&["bump", path.to_str().unwrap(), "2024-03-03"]);
    backfill(path, &[&range[..], &["--model-version", "v2"]].concat());
    let reverted = json_ok(&run_in(
        path,
        &[
            "revert",
            first["run_id"].as_str().unwrap(),
            "--logical",
            "--output-format",
            "json",
        ],
    ));
    let version = reverted["published_version"].as_u64().unwrap();
    assert_eq!(version, 3, "{reverted}");
    let (got, expected) = feed_and_expected(path, version, "key");
    assert!(!got.is_empty());
    assert_eq!(got, expected);
    assert_eq!(reported(&reverted), counts(&got));
}

#[test]
fn a_fix_by_rows_feeds_the_rows_of_its_range_only() {
    // An unpartitioned table replaced by rows (`range_column`): files are rewritten whole, and
    // the rows outside the range they hold are carried over, not fed.
    let mut lake = crate::support::PythonLake::new(crate::support::Store::Local);
    lake.table("flat", "flat");
    let dir_arg = lake.path().to_str().unwrap().to_string();
    python(&["enable", &dir_arg, "flat"]);
    lake.model(
        "fix",
        "target = \"flat\"\nrange_column = \"event_date\"\n[sources.flat]\nwindow = \"event_date\"\n[validate]\nkey = [\"id\"]",
        "SELECT id, amount * 2 AS amount, event_date FROM flat",
    );
    let report = json_ok(&lake.run(&[
        "backfill",
        "fix",
        "--from",
        "2026-01-05",
        "--to",
        "2026-01-09",
        "--output-format",
        "json",
    ]));
    let version = report["published_version"].as_u64().unwrap().to_string();
    let got = python(&["gfeed", &dir_arg, "flat", &version]);
    let expected = python(&["gexpect", &dir_arg, "flat", &version, "id"]);
    let got = got.as_array().unwrap();
    assert!(!got.is_empty());
    assert_eq!(got, expected.as_array().unwrap());
    let names = [
        "2026-01-05",
        "2026-01-06",
        "2026-01-07",
        "2026-01-08",
        "2026-01-09",
    ];
    // Every column as text, in the table's order: `id`, `amount`, `event_date`.
    assert!(
        got.iter()
            .all(|row| names.contains(&row[2].as_str().unwrap_or_default())),
        "only rows of the range: {got:?}"
    );
    assert_eq!(reported(&report), counts(got));
}
