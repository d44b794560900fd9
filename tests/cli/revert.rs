//! `lakefill revert`: one commit that puts back exactly what a run replaced, in its range only.
//! Every expectation is read back with plain delta-rs and DataFusion (time travel to the version
//! the run read), never from lakefill's own report.

use std::collections::BTreeMap;

use lakefill::{CrashPhase, CrashPoint, Outcome, RunReport, RunState};

use crate::support::{
    PARTIAL_FIX, Store, TestLake, append_event, json_ok, lakefill_command, run_list, run_report,
    runtime, stderr, vacuum_now,
};

/// Every row of `events` at `version` (latest when `None`) whose day is in `days`, sorted.
fn rows_in(lake: &TestLake, version: Option<u64>, from: &str, to: &str) -> Vec<Vec<String>> {
    let table = match version {
        Some(v) => lake.open_version("events", v),
        None => lake.open("events"),
    };
    lake.query(
        &[("events", table)],
        &format!(
            "SELECT CAST(event_id AS VARCHAR), CAST(event_date AS VARCHAR), country, \
             CAST(amount_cents AS VARCHAR), CAST(event_ts AS VARCHAR) FROM events \
             WHERE event_date BETWEEN DATE '{from}' AND DATE '{to}' ORDER BY 1, 2, 5"
        ),
    )
}

/// The data files of `events` at `version` in partitions `from..=to`: path -> size.
fn files_in(lake: &TestLake, version: Option<u64>, from: &str, to: &str) -> BTreeMap<String, i64> {
    let table = match version {
        Some(v) => lake.open_version("events", v),
        None => lake.open("events"),
    };
    table
        .snapshot()
        .expect("snapshot")
        .log_data()
        .iter()
        .filter(|f| {
            f.partition_values_map()
                .get("event_date")
                .cloned()
                .flatten()
                .is_some_and(|d| from <= d.as_str() && d.as_str() <= to)
        })
        .map(|f| (f.path().to_string(), f.size()))
        .collect()
}

/// The lakefill metadata of each commit of `events`, newest first, read from the log directly.
fn commits(lake: &TestLake) -> Vec<serde_json::Value> {
    let table = lake.open("events");
    let latest = table.version().expect("version");
    runtime().block_on(async {
        let mut out = Vec::new();
        for version in (0..=latest).rev() {
            let bytes = table
                .log_store()
                .read_commit_entry(version)
                .await
                .expect("read commit")
                .expect("commit");
            let info = bytes
                .split(|b| *b == b'\n')
                .filter_map(|l| serde_json::from_slice::<serde_json::Value>(l).ok())
                .find_map(|a| a.get("commitInfo").cloned())
                .unwrap_or_default();
            out.push(info["lakefill"].clone());
        }
        out
    })
}

/// Backfills days 2..=5 with events@v2; returns (run id, read version, published version).
fn fix(lake: &TestLake) -> (String, u64, u64) {
    let report = run_report(&lake.run(&[
        "backfill",
        "events",
        "--from",
        &lake.day(2),
        "--to",
        &lake.day(5),
        "--output-format",
        "json",
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
    ]));
    assert_eq!(report.outcome, Outcome::Published, "{report:?}");
    (
        report.run_id,
        report.read_version,
        report.published_version.expect("published"),
    )
}

fn revert(lake: &TestLake, run_id: &str) -> RunReport {
    run_report(&lake.run(&["revert", run_id, "--output-format", "json"]))
}

fn a_revert_puts_back_exactly_what_the_run_replaced(store: Store) {
    let lake = TestLake::on(store);
    let (from, to) = (lake.day(2), lake.day(5));
    let (run_id, read_version, published) = fix(&lake);
    let buggy = rows_in(&lake, Some(read_version), &from, &to);
    let fixed = rows_in(&lake, Some(published), &from, &to);
    assert_ne!(buggy, fixed, "the fix changed the range");
    // Another writer appends a day outside the range afterwards: the revert must keep it.
    append_event(&lake, &lake.day(8), 9_000_001);
    let appended = lake.version("events");
    let outside = |version: Option<u64>| {
        let mut rows = rows_in(&lake, version, &lake.day(0), &lake.day(1));
        rows.extend(rows_in(&lake, version, &lake.day(6), &lake.day(9)));
        rows
    };
    let outside_before = outside(Some(appended));

    let report = revert(&lake, &run_id);
    assert_eq!(report.outcome, Outcome::Reverted, "{report:?}");
    assert_eq!(report.revert_of.as_deref(), Some(run_id.as_str()));
    assert_eq!(lake.version("events"), appended + 1, "one new commit");
    // Its report compares the range now with the range put back: the model's measure per
    // partition, as plain DataFusion sums it at both versions.
    let comparison = &report.validation.as_ref().expect("validated").comparison;
    let reported: BTreeMap<String, (i64, i64)> = comparison
        .partitions
        .iter()
        .map(|p| {
            let sum = &p.measures["amount_cents"];
            (p.value.clone(), (sum.old as i64, sum.new as i64))
        })
        .collect();
    let (now, then) = (
        sums_in(&lake, appended, &from, &to),
        sums_in(&lake, read_version, &from, &to),
    );
    let expected: BTreeMap<String, (i64, i64)> = now
        .iter()
        .map(|(day, sum)| (day.clone(), (*sum, then[day])))
        .collect();
    assert_eq!(reported, expected, "{report:?}");
    assert_ne!(now, then, "the fix changed the sums");
    assert_eq!(
        rows_in(&lake, None, &from, &to),
        buggy,
        "the range is as it was"
    );
    assert_eq!(
        files_in(&lake, None, &from, &to),
        files_in(&lake, Some(read_version), &from, &to),
        "the very files the run replaced, re-added as they were"
    );
    assert_eq!(
        outside(None),
        outside_before,
        "later commits elsewhere survive"
    );
    let newest = &commits(&lake)[0];
    assert_eq!(newest["revert_of"], run_id.as_str(), "{newest}");
    assert_eq!(newest["read_version"], appended, "{newest}");
    let revert_id = report.run_id.clone();
    assert_eq!(newest["run_id"], revert_id.as_str(), "{newest}");

    // Reverting again changes nothing.
    let again = revert(&lake, &run_id);
    assert_eq!(again.outcome, Outcome::AlreadyReverted, "{again:?}");
    assert_eq!(again.run_id, revert_id);
    assert_eq!(lake.version("events"), appended + 1, "no new commit");

    // Reverting the revert puts the fix back.
    let redo = revert(&lake, &revert_id);
    assert_eq!(redo.outcome, Outcome::Reverted, "{redo:?}");
    assert_eq!(rows_in(&lake, None, &from, &to), fixed, "the fix is back");
    assert_eq!(
        outside(None),
        outside_before,
        "and the append is still there"
    );

    // Both show in history and in runs, and blame names the newest.
    let history = json_ok(&lake.run(&["history", "events", "--output-format", "json"]));
    assert_eq!(history[0]["revert_of"], revert_id.as_str(), "{history}");
    assert_eq!(history[1]["revert_of"], run_id.as_str(), "{history}");
    let runs = run_list(&lake.run(&["runs", "--output-format", "json"]));
    let states: BTreeMap<String, RunState> =
        runs.iter().map(|r| (r.run_id.clone(), r.state)).collect();
    assert_eq!(states.get(&revert_id), Some(&RunState::Published));
    let blame = json_ok(&lake.run(&[
        "blame",
        "events",
        "--partition",
        &lake.day(3),
        "--output-format",
        "json",
    ]));
    assert_eq!(
        blame["last_write"]["revert_of"],
        revert_id.as_str(),
        "{blame}"
    );
}

every_store!(a_revert_puts_back_exactly_what_the_run_replaced);

#[test]
fn a_revert_after_a_later_commit_in_its_range_is_refused() {
    let lake = TestLake::new();
    let (run_id, _, _) = fix(&lake);
    append_event(&lake, &lake.day(3), 9_000_002);
    let later = lake.version("events");
    let files = lake.files("events");
    let out = lake.run(&["revert", &run_id]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains(&format!("version {later}")), "{err}");
    assert!(err.contains("hint:"), "{err}");
    assert_eq!(lake.version("events"), later, "nothing committed");
    assert_eq!(lake.files("events"), files, "no file changed");
}

/// A revert must not put back rows that break a rule the table got since the run (#33): a
/// CHECK constraint that only the fixed rows satisfy refuses the revert by files and the logical
/// one (exit 3), naming it; nothing is committed (python `deltalake` checked every row against
/// the constraint when it added it).
#[test]
fn issue_33_a_revert_keeps_a_constraint_added_since() {
    let lake = TestLake::new();
    let report = json_ok(&lake.run(&[
        "backfill",
        "events",
        "--from",
        &lake.day(0),
        "--to",
        &lake.day(9),
        "--output-format",
        "json",
    ]));
    assert_eq!(report["outcome"], "published", "{report}");
    let run_id = report["run_id"].as_str().unwrap().to_string();
    let table = lake.table_path("events");
    crate::support::python_script(
        "delta_tables.py",
        &[
            "add_constraint",
            table.to_str().unwrap(),
            "utc_dates",
            "event_date = CAST(event_ts AS DATE)",
        ],
    );
    let version = lake.version("events");
    let files = lake.files("events");
    for logical in [false, true] {
        let mut args = vec!["revert", run_id.as_str()];
        if logical {
            args.push("--logical");
        }
        let out = lake.run(&args);
        assert_eq!(out.status.code(), Some(3), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("constraint utc_dates")
                || crate::support::stdout(&out).contains("constraint utc_dates"),
            "{args:?}: {}{}",
            crate::support::stdout(&out),
            stderr(&out)
        );
        assert_eq!(lake.version("events"), version, "nothing committed");
        assert_eq!(lake.files("events"), files, "no file changed");
    }
}

/// Either way of reverting needs the files the run replaced: vacuumed, they are named with the
/// retention setting that removed them, and nothing changes.
#[test]
fn a_revert_whose_files_were_vacuumed_is_refused() {
    for logical in [false, true] {
        let lake = TestLake::new();
        let (run_id, _, _) = fix(&lake);
        vacuum_now(&lake, "events");
        let version = lake.version("events");
        let files = lake.files("events");
        let mut args = vec!["revert", run_id.as_str()];
        if logical {
            args.push("--logical");
        }
        let out = lake.run(&args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains("gone"), "{args:?}: {err}");
        assert!(
            err.contains("deletedFileRetentionDuration"),
            "{args:?}: {err}"
        );
        assert_eq!(
            lake.version("events"),
            version,
            "{args:?}: nothing committed"
        );
        assert_eq!(lake.files("events"), files, "{args:?}: no file changed");
    }
}

#[test]
fn only_a_published_run_can_be_reverted() {
    let lake = TestLake::new();
    let run_id = lake.stage_events(2, 4);
    let version = lake.version("events");
    let out = lake.run(&["revert", &run_id]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("only a published run"),
        "{}",
        stderr(&out)
    );
    let out = lake.run(&["revert", "events-v9-000000000000"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let out = lake.run(&["revert", &run_id, "--reason", " "]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(lake.version("events"), version);
}

/// A revert stopped at each point of its commit converges: running it again leaves exactly one
/// revert commit and the range as it was before the run.
fn a_stopped_revert_converges(store: Store) {
    // Every point a revert passes, generated from the engine's own list; on an object store,
    // the points around the commit, where the store's conditional write decides (the others are
    // the same code on every store).
    let points = CrashPoint::ALL
        .into_iter()
        .filter(|p| p.on_revert(false))
        .filter(|p| {
            store == Store::Local || matches!(p.phase(), CrashPhase::Commit | CrashPhase::Committed)
        });
    for point in points {
        let committed = point.phase() == CrashPhase::Committed;
        let point = crate::support::armed(point);
        let point = point.as_str();
        let lake = TestLake::on(store);
        let (from, to) = (lake.day(2), lake.day(5));
        let (run_id, read_version, published) = fix(&lake);
        let out = lakefill_command(lake.path())
            .args(["revert", &run_id])
            .env("LAKEFILL_FAILPOINTS", point)
            .output()
            .unwrap();
        let landed = lake.version("events") > published;
        assert_eq!(
            landed, committed,
            "{point}: in the log exactly when committed"
        );
        if point.ends_with("=error") {
            // The response was lost, but the log has the commit: the revert says so.
            assert!(out.status.success(), "{point}: {}", stderr(&out));
        } else {
            assert!(!out.status.success(), "{point}: the process stopped");
        }
        let report = revert(&lake, &run_id);
        let expected = if landed {
            Outcome::AlreadyReverted
        } else {
            Outcome::Reverted
        };
        assert_eq!(report.outcome, expected, "{point}: {report:?}");
        assert_eq!(
            rows_in(&lake, None, &from, &to),
            rows_in(&lake, Some(read_version), &from, &to),
            "{point}: the range is as before the run"
        );
        let reverts = commits(&lake)
            .iter()
            .filter(|m| m["revert_of"] == run_id.as_str())
            .count();
        assert_eq!(reverts, 1, "{point}: exactly one revert commit");
        let runs = run_list(&lake.run(&["runs", "--output-format", "json"]));
        let revert_run = runs
            .iter()
            .find(|r| r.run_id == report.run_id)
            .unwrap_or_else(|| panic!("{point}: the revert is listed: {runs:?}"));
        assert_eq!(revert_run.state, RunState::Published, "{point}");
    }
}

every_store!(a_stopped_revert_converges);

/// Rows of `events` per day of `from..=to` at `version` (latest when `None`), counted with
/// plain DataFusion: day -> rows.
fn counts_in(lake: &TestLake, version: Option<u64>, from: &str, to: &str) -> BTreeMap<String, u64> {
    let table = match version {
        Some(v) => lake.open_version("events", v),
        None => lake.open("events"),
    };
    lake.query(
        &[("events", table)],
        &format!(
            "SELECT CAST(event_date AS VARCHAR), CAST(COUNT(*) AS VARCHAR) FROM events \
             WHERE event_date BETWEEN DATE '{from}' AND DATE '{to}' GROUP BY 1 ORDER BY 1"
        ),
    )
    .into_iter()
    .map(|row| (row[0].clone(), row[1].parse().unwrap()))
    .collect()
}

/// `SUM(amount_cents)` of `events` per day of `from..=to` at `version`, with plain DataFusion.
fn sums_in(lake: &TestLake, version: u64, from: &str, to: &str) -> BTreeMap<String, i64> {
    lake.query(
        &[("events", lake.open_version("events", version))],
        &format!(
            "SELECT CAST(event_date AS VARCHAR), CAST(SUM(amount_cents) AS VARCHAR) FROM events \
             WHERE event_date BETWEEN DATE '{from}' AND DATE '{to}' GROUP BY 1 ORDER BY 1"
        ),
    )
    .into_iter()
    .map(|row| (row[0].clone(), row[1].parse().unwrap()))
    .collect()
}

/// Compacts `events` with plain delta-rs, as a maintenance job would (only partitions of more
/// than one file change); returns the files it removed.
fn compact(lake: &TestLake) -> u64 {
    let table = lake.open("events");
    let (_, metrics) = runtime()
        .block_on(async { table.optimize().await })
        .expect("optimize");
    metrics.num_files_removed
}

/// After later commits in the run's range (an append, a compaction), a revert by files is
/// refused and `--logical` recomputes the range as it was before the run: staged and validated
/// first, published by `publish`, once; later commits elsewhere survive.
fn a_logical_revert_restores_the_range_despite_later_commits(store: Store) {
    let lake = TestLake::on(store);
    let (from, to) = (lake.day(2), lake.day(5));
    let (run_id, read_version, _) = fix(&lake);
    let buggy = rows_in(&lake, Some(read_version), &from, &to);
    append_event(&lake, &lake.day(3), 9_000_002);
    assert_eq!(
        compact(&lake),
        2,
        "day 3 compacted: the run's file and the append"
    );
    append_event(&lake, &lake.day(8), 9_000_001);
    let before_revert = lake.version("events");
    let outside = |version: Option<u64>| {
        let mut rows = rows_in(&lake, version, &lake.day(0), &lake.day(1));
        rows.extend(rows_in(&lake, version, &lake.day(6), &lake.day(9)));
        rows
    };
    let outside_before = outside(None);
    let counts_now = counts_in(&lake, None, &from, &to);
    let counts_restored = counts_in(&lake, Some(read_version), &from, &to);

    let out = lake.run(&["revert", &run_id]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(stderr(&out).contains("--logical"), "{}", stderr(&out));

    let staged = json_ok(&lake.run(&[
        "revert",
        &run_id,
        "--logical",
        "--stage-only",
        "--output-format",
        "json",
    ]));
    assert_eq!(staged["outcome"], "staged", "{staged}");
    assert_eq!(staged["revert_of"], run_id.as_str(), "{staged}");
    assert_eq!(
        lake.version("events"),
        before_revert,
        "nothing committed yet"
    );
    // Validation compared the range now (old) with the range restored (new), per partition.
    let partitions: BTreeMap<String, (u64, u64)> = staged["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["value"].as_str().unwrap().to_string(),
                (
                    p["old_rows"].as_u64().unwrap(),
                    p["new_rows"].as_u64().unwrap(),
                ),
            )
        })
        .collect();
    let expected: BTreeMap<String, (u64, u64)> = counts_now
        .iter()
        .map(|(day, rows)| (day.clone(), (*rows, counts_restored[day])))
        .collect();
    assert_eq!(partitions, expected, "{staged}");
    assert_eq!(staged["validation"]["passed"], true, "{staged}");

    let revert_id = staged["run_id"].as_str().unwrap().to_string();
    let published = json_ok(&lake.run(&["publish", &revert_id, "--output-format", "json"]));
    assert_eq!(published["outcome"], "published", "{published}");
    assert_eq!(lake.version("events"), before_revert + 1, "one commit");
    assert_eq!(
        rows_in(&lake, None, &from, &to),
        buggy,
        "the range is exactly as the run found it"
    );
    assert_eq!(
        outside(None),
        outside_before,
        "later commits elsewhere survive"
    );
    let newest = &commits(&lake)[0];
    assert_eq!(newest["revert_of"], run_id.as_str(), "{newest}");
    assert_eq!(newest["run_id"], revert_id.as_str(), "{newest}");

    // Once reverted, either way of reverting changes nothing.
    for args in [vec!["--logical"], vec![]] {
        let mut command = vec!["revert", run_id.as_str(), "--output-format", "json"];
        command.extend(args);
        let again = json_ok(&lake.run(&command));
        assert_eq!(again["outcome"], "already_reverted", "{again}");
    }
    assert_eq!(lake.version("events"), before_revert + 1, "no new commit");

    // Reverting the revert puts back the range as it was just before it.
    let redo = revert(&lake, &revert_id);
    assert_eq!(redo.outcome, Outcome::Reverted, "{redo:?}");
    assert_eq!(
        rows_in(&lake, None, &from, &to),
        rows_in(&lake, Some(before_revert), &from, &to)
    );
}

both_stores!(a_logical_revert_restores_the_range_despite_later_commits);

/// A logical revert stopped at each point converges: the same command finishes it with one
/// commit and the range as the run found it.
#[test]
fn a_stopped_logical_revert_converges() {
    for point in CrashPoint::ALL.into_iter().filter(|p| p.on_revert(true)) {
        let committed = point.phase() == CrashPhase::Committed;
        let point = crate::support::armed(point);
        let point = point.as_str();
        let lake = TestLake::new();
        let (from, to) = (lake.day(2), lake.day(5));
        let (run_id, read_version, _) = fix(&lake);
        append_event(&lake, &lake.day(4), 9_000_003);
        let before = lake.version("events");
        let out = lakefill_command(lake.path())
            .args(["revert", &run_id, "--logical"])
            .env("LAKEFILL_FAILPOINTS", point)
            .output()
            .unwrap();
        let landed = lake.version("events") > before;
        assert_eq!(landed, committed, "{point}: {}", stderr(&out));
        let report =
            run_report(&lake.run(&["revert", &run_id, "--logical", "--output-format", "json"]));
        let expected = if landed {
            Outcome::AlreadyReverted
        } else {
            Outcome::Reverted
        };
        assert_eq!(report.outcome, expected, "{point}: {report:?}");
        assert_eq!(
            rows_in(&lake, None, &from, &to),
            rows_in(&lake, Some(read_version), &from, &to),
            "{point}: the range is as the run found it"
        );
        let reverts = commits(&lake)
            .iter()
            .filter(|m| m["revert_of"] == run_id.as_str())
            .count();
        assert_eq!(reverts, 1, "{point}: exactly one revert commit");
        assert_eq!(lake.version("events"), before + 1, "{point}");
    }
}

/// `revert --stage-only` checks everything and commits nothing; `publish` then commits it.
#[test]
fn a_staged_revert_by_files_is_published_later() {
    let lake = TestLake::new();
    let (from, to) = (lake.day(2), lake.day(5));
    let (run_id, read_version, published) = fix(&lake);
    let staged =
        run_report(&lake.run(&["revert", &run_id, "--stage-only", "--output-format", "json"]));
    assert_eq!(staged.outcome, Outcome::Staged, "{staged:?}");
    assert_eq!(lake.version("events"), published, "nothing committed");
    let report = run_report(&lake.run(&["publish", &staged.run_id, "--output-format", "json"]));
    assert_eq!(report.outcome, Outcome::Reverted, "{report:?}");
    assert_eq!(lake.version("events"), published + 1, "one commit");
    assert_eq!(
        rows_in(&lake, None, &from, &to),
        rows_in(&lake, Some(read_version), &from, &to)
    );
}
