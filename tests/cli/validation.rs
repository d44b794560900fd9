//! Validation blocks bad publishes; write-audit-publish (stage-only, publish, discard, runs).

use crate::support::{
    PARTIAL_FIX, Store, TestLake, append_event, json_ok, runtime, stderr, stdout,
};

/// Writes `sql/events/v3.sql`: v2's header plus `validate`, and `select` as the query.
fn events_model(lake: &TestLake, validate: &str, select: &str) {
    let text = format!(
        "/*\ntarget = \"events\"\npartition_by = \"event_date\"\n[sources.raw_events]\nwindow = \"ingest_date\"\n\
         lookahead = 1\n[validate]\n{validate}\n*/\n{select}"
    );
    std::fs::write(lake.path().join("sql/events/v3.sql"), text).unwrap();
}

const V2_SELECT: &str = "SELECT event_id, user_id, country, amount_cents, event_ts, CAST(event_ts AS DATE) AS event_date \
     FROM raw_events WHERE CAST(event_ts AS DATE) BETWEEN $start AND $end";

/// Runs the backfill, expects exit 3 with `check` failed, and an unchanged table.
fn assert_blocked(lake: &TestLake, check: &str) -> serde_json::Value {
    let before = lake.version("events");
    let files = lake.files("events");
    let out = lake.run(&[
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
    ]);
    assert_eq!(out.status.code(), Some(3), "{check}: {}", stderr(&out));
    let report: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("the report is printed");
    assert_eq!(report["state"], "failed-validation");
    assert_eq!(report["published_version"], serde_json::Value::Null);
    let failed: Vec<&str> = report["validation"]["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["passed"] == false)
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert!(failed.contains(&check), "{check} not in {failed:?}");
    assert!(
        stderr(&out).contains(check),
        "stderr names the check: {}",
        stderr(&out)
    );
    assert!(stderr(&out).contains("hint: "), "{}", stderr(&out));
    assert_eq!(lake.version("events"), before, "{check}: nothing published");
    assert_eq!(lake.files("events"), files, "{check}: files unchanged");
    report
}

#[test]
fn each_check_blocks_the_bug_it_is_for() {
    let lake = TestLake::new();

    // Duplicate keys.
    events_model(
        &lake,
        "key = [\"event_id\"]",
        &format!("{V2_SELECT} UNION ALL SELECT * FROM ({V2_SELECT}) WHERE event_id % 100 = 0"),
    );
    let report = assert_blocked(&lake, "key_unique");
    let check = report["validation"]["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "key_unique")
        .unwrap();
    let expected_dups: u64 = lake.query(
        &[("raw_events", lake.open("raw_events"))],
        &format!(
            "SELECT COUNT(*) FROM raw_events WHERE event_id % 100 = 0 AND CAST(event_ts AS DATE) BETWEEN DATE '{}' AND DATE '{}'",
            lake.day(2), lake.day(5)
        ),
    )[0][0].parse().unwrap();
    assert_eq!(check["failures"][0]["duplicate_keys"], expected_dups);
    assert!(!check["sample"].as_array().unwrap().is_empty());

    // NULL keys.
    events_model(
        &lake,
        "key = [\"event_id\"]",
        &V2_SELECT.replace(
            "SELECT event_id,",
            "SELECT CASE WHEN event_id % 50 = 0 THEN NULL ELSE event_id END AS event_id,",
        ),
    );
    assert_blocked(&lake, "key_not_null");

    // Dropped rows beyond the threshold, with the partition and the numbers.
    events_model(
        &lake,
        "max_row_change = \"5%\"",
        &format!("SELECT * FROM ({V2_SELECT}) WHERE event_id % 10 <> 0"),
    );
    let report = assert_blocked(&lake, "max_row_change");
    let check = report["validation"]["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "max_row_change")
        .unwrap();
    let failure = &check["failures"][0];
    assert!(
        failure["partition"]
            .as_str()
            .unwrap()
            .starts_with("2026-01-0")
    );
    assert!(failure["new_rows"].as_u64().unwrap() < failure["old_rows"].as_u64().unwrap());
    assert_eq!(failure["limit"], "5%");

    // Totals not conserved.
    events_model(
        &lake,
        "conserve = [\"amount_cents\"]",
        &V2_SELECT.replace("amount_cents,", "amount_cents * 2 AS amount_cents,"),
    );
    let report = assert_blocked(&lake, "conserve(amount_cents)");
    let failure = &report["validation"]["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "conserve(amount_cents)")
        .unwrap()["failures"][0];
    assert!(failure["new_total"].as_f64().unwrap() > failure["old_total"].as_f64().unwrap());

    // A user check that finds rows.
    events_model(
        &lake,
        "[[validate.checks]]\nname = \"amounts are positive\"\nsql = \"SELECT * FROM output WHERE amount_cents <= 0\"",
        &V2_SELECT.replace("amount_cents,", "amount_cents - 10000 AS amount_cents,"),
    );
    let report = assert_blocked(&lake, "check: amounts are positive");
    let check = report["validation"]["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "check: amounts are positive")
        .unwrap();
    assert!(check["failures"][0]["rows"].as_u64().unwrap() > 0);
    assert!(!check["sample"].as_array().unwrap().is_empty());

    // The correct model passes every check: a fix that keeps rows and amounts in place.
    events_model(
        &lake,
        "key = [\"event_id\"]\nmeasures = [\"amount_cents\"]\nmax_row_change = \"0%\"\nmax_measure_change = \"0\"\nconserve = [\"amount_cents\"]\n\
         [[validate.checks]]\nname = \"amounts are positive\"\nsql = \"SELECT * FROM output WHERE amount_cents <= 0\"",
        "SELECT event_id, user_id, LOWER(country) AS country, amount_cents, event_ts, event_date FROM events",
    );
    let text = std::fs::read_to_string(lake.path().join("sql/events/v3.sql"))
        .unwrap()
        .replace(
            "[sources.raw_events]\nwindow = \"ingest_date\"\nlookahead = 1",
            "[sources.events]\nwindow = \"event_date\"",
        );
    std::fs::write(lake.path().join("sql/events/v3.sql"), text).unwrap();
    let before = lake.version("events");
    let report = json_ok(&lake.run(&[
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
    assert_eq!(report["validation"]["passed"], true, "{report}");
    assert_eq!(report["published_version"], before + 1);
    let totals = &report["validation"]["comparison"]["totals"];
    assert_eq!(totals["added"], 0);
    assert_eq!(totals["removed"], 0);
    assert_eq!(
        totals["changed"], totals["old_rows"],
        "every row's country changed case"
    );
}

fn force_publish_records_the_override(store: Store) {
    let lake = TestLake::on(store);
    events_model(
        &lake,
        "max_row_change = \"5%\"",
        &format!("SELECT * FROM ({V2_SELECT}) WHERE event_id % 10 <> 0"),
    );
    let out = lake.run(&[
        "backfill",
        "events",
        "--from",
        &lake.day(2),
        "--to",
        &lake.day(3),
        "--force-publish",
    ]);
    assert_eq!(out.status.code(), Some(2), "--force-publish needs --reason");
    let report = json_ok(&lake.run(&[
        "backfill",
        "events",
        "--from",
        &lake.day(2),
        "--to",
        &lake.day(3),
        "--force-publish",
        "--reason",
        "sampling on purpose",
        "--output-format",
        "json",
        "--allow-edge-moves",
    ]));
    assert_eq!(report["forced"], "sampling on purpose");
    let table = lake.open("events");
    let history: Vec<_> = runtime()
        .block_on(async {
            futures::TryStreamExt::try_collect::<Vec<_>>(table.history(Some(1))).await
        })
        .unwrap();
    let validation = &history[0].info["lakefill"]["validation"];
    assert_eq!(validation["passed"], false);
    assert_eq!(validation["forced"], true);
    assert_eq!(validation["force_reason"], "sampling on purpose");
}

fn stage_only_then_publish_equals_a_direct_backfill(store: Store) {
    let direct = TestLake::on(store);
    let audited = TestLake::on(store);
    let (from, to) = (direct.day(1), direct.day(6));
    let all_rows = "SELECT CAST(event_id AS VARCHAR), CAST(event_date AS VARCHAR), country, CAST(amount_cents AS VARCHAR) FROM events ORDER BY 1, 2";

    let published = json_ok(&direct.run(&[
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

    let before = audited.version("events");
    let before_rows = audited.query(&[("events", audited.open("events"))], all_rows);
    let staged = json_ok(&audited.run(&[
        "backfill",
        "events",
        "--from",
        &from,
        "--to",
        &to,
        "--stage-only",
        "--output-format",
        "json",
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
    ]));
    assert_eq!(staged["state"], "validated");
    assert_eq!(staged["outcome"], "staged");
    assert_eq!(staged["published_version"], serde_json::Value::Null);
    assert_eq!(staged["validation"]["passed"], true);
    assert_eq!(
        audited.version("events"),
        before,
        "staging publishes nothing"
    );
    assert_eq!(
        audited.query(&[("events", audited.open("events"))], all_rows),
        before_rows,
        "readers see the old data"
    );
    let run_id = staged["run_id"].as_str().unwrap().to_string();
    assert_eq!(
        run_id,
        published["run_id"].as_str().unwrap(),
        "the run id derives from the inputs"
    );

    let runs = json_ok(&audited.run(&["runs", "events", "--output-format", "json"]));
    let listed = runs
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["run_id"] == run_id.as_str())
        .expect("listed");
    assert_eq!(listed["state"], "validated");

    let report = json_ok(&audited.run(&["publish", &run_id, "--output-format", "json"]));
    assert_eq!(report["state"], "published");
    assert_eq!(report["published_version"], before + 1);
    let counts = "SELECT CAST(event_date AS VARCHAR), COUNT(*), SUM(amount_cents) FROM events GROUP BY 1 ORDER BY 1";
    assert_eq!(
        audited.query(&[("events", audited.open("events"))], counts),
        direct.query(&[("events", direct.open("events"))], counts)
    );
    let (a, d) = (
        audited.query(&[("events", audited.open("events"))], all_rows),
        direct.query(&[("events", direct.open("events"))], all_rows),
    );
    assert_eq!(a.len(), d.len());
    let first = a.iter().zip(&d).position(|(x, y)| x != y);
    assert!(
        first.is_none(),
        "first difference: {:?} vs {:?}",
        first.map(|i| &a[i]),
        first.map(|i| &d[i])
    );
    let again = json_ok(&audited.run(&["publish", &run_id, "--output-format", "json"]));
    assert_eq!(again["outcome"], "already_published");
    assert_eq!(audited.version("events"), before + 1);
}

fn discard_removes_every_staged_file(store: Store) {
    let lake = TestLake::on(store);
    let run_id = lake.stage_events(1, 8);
    let marker = format!("lakefill-{run_id}");
    assert!(
        !staged_objects(&lake, &marker).is_empty(),
        "staged files exist"
    );
    let out = lake.run(&["discard", &run_id]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("discarded"));
    assert_eq!(staged_objects(&lake, &marker), Vec::<String>::new());
    let runs = json_ok(&lake.run(&["runs", "--output-format", "json"]));
    assert!(
        runs.as_array()
            .unwrap()
            .iter()
            .any(|r| r["run_id"] == run_id.as_str() && r["state"] == "discarded")
    );
    let out = lake.run(&["publish", &run_id]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "a discarded run cannot be published: {}",
        stderr(&out)
    );
}

fn publish_after_a_conflicting_commit_is_refused(store: Store) {
    let lake = TestLake::on(store);
    let run_id = lake.stage_events(2, 4);

    // Another writer appends outside the range: the publish keeps its row.
    append_event(&lake, &lake.day(8), 9_000_001);
    let report = json_ok(&lake.run(&["publish", &run_id, "--output-format", "json"]));
    let version = report["published_version"].as_u64().unwrap();
    let kept = lake.query(
        &[("events", lake.open("events"))],
        "SELECT COUNT(*) FROM events WHERE event_id = 9000001",
    );
    assert_eq!(kept, vec![vec!["1".to_string()]]);

    // Another run staged, then a writer appends inside its range: publish refuses with exit 4.
    let model = std::fs::read_to_string(lake.path().join("sql/events/v2.sql")).unwrap() + "\n";
    std::fs::write(lake.path().join("sql/events/v3.sql"), model).unwrap();
    let run_id = lake.stage_events(5, 6);
    append_event(&lake, &lake.day(6), 9_000_002);
    let after_append = lake.version("events");
    assert_eq!(after_append, version + 1);
    let out = lake.run(&["publish", &run_id]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("changed in the backfill range"),
        "{}",
        stderr(&out)
    );
    assert_eq!(lake.version("events"), after_append, "nothing published");
    let kept = lake.query(
        &[("events", lake.open("events"))],
        "SELECT COUNT(*) FROM events WHERE event_id = 9000002",
    );
    assert_eq!(
        kept,
        vec![vec!["1".to_string()]],
        "the concurrent row survives"
    );
    let runs = json_ok(&lake.run(&["runs", "events", "--output-format", "json"]));
    let run = runs
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["run_id"] == run_id.as_str())
        .unwrap();
    assert_eq!(
        run["state"], "failed",
        "a run whose read version went stale in its range must be staged and validated again"
    );
    // And publishing it again is refused with the way forward, not retried blindly.
    let out = lake.run(&["publish", &run_id]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("lakefill backfill events"),
        "{}",
        stderr(&out)
    );
}

fn staged_objects(lake: &TestLake, marker: &str) -> Vec<String> {
    lake.objects("events")
        .into_iter()
        .filter(|p| p.contains(marker) && !p.starts_with("_lakefill"))
        .collect()
}

every_store!(
    stage_only_then_publish_equals_a_direct_backfill,
    discard_removes_every_staged_file,
);
both_stores!(
    force_publish_records_the_override,
    publish_after_a_conflicting_commit_is_refused,
);

/// Takes lakefill's row checksums out of every `add` action of `table`'s log (JSON commits only:
/// the test lakes have no checkpoint), leaving a table with the same files and rows whose old
/// side can only be compared by reading it.
fn strip_logged_checksums(lake: &TestLake, table: &str) -> usize {
    let log = lake.table_path(table).join("_delta_log");
    let mut stripped = 0;
    for entry in std::fs::read_dir(&log).unwrap().flatten() {
        let path = entry.path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        assert!(!name.contains("checkpoint"), "a checkpoint: {name}");
        if !name.ends_with(".json") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let mut lines = Vec::new();
        for line in text.lines() {
            let mut action: serde_json::Value = serde_json::from_str(line).unwrap();
            if let Some(tags) = action
                .get_mut("add")
                .and_then(|add| add.get_mut("tags"))
                .and_then(|tags| tags.as_object_mut())
                && tags.remove("lakefill.rowChecksum").is_some()
            {
                stripped += 1;
            }
            lines.push(action.to_string());
        }
        std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    }
    stripped
}

/// A fix in place that changes the amounts of one day of eight. The other seven days' old rows
/// are compared by the checksums lakefill wrote into their files' log entries, without reading
/// them, and the comparison is exactly what reading every old row gives (the same table with
/// those checksums taken out of its log) and what plain DataFusion counts and sums here.
#[test]
fn logged_checksums_spare_reading_unchanged_partitions_and_change_no_result() {
    let lake = TestLake::new();
    let twin = TestLake::new();
    assert!(strip_logged_checksums(&twin, "events") > 0, "v1 wrote them");
    assert_eq!(strip_logged_checksums(&twin, "events"), 0);
    let (from, to, fixed) = (lake.day(1), lake.day(8), lake.day(4));
    let model = format!(
        "/*\ntarget = \"events\"\npartition_by = \"event_date\"\n[sources.events]\nwindow = \"event_date\"\n\
         [validate]\nkey = [\"event_id\"]\nmeasures = [\"amount_cents\"]\n*/\n\
         SELECT event_id, user_id, country, \
         CASE WHEN event_date = DATE '{fixed}' THEN amount_cents + 1 ELSE amount_cents END AS amount_cents, \
         event_ts, event_date FROM events"
    );
    let mut reports = Vec::new();
    for l in [&lake, &twin] {
        std::fs::write(l.path().join("sql/events/v3.sql"), &model).unwrap();
        let before = l.version("events");
        let report = json_ok(&l.run(&[
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
        assert_eq!(report["state"], "published", "{report}");
        // Independently: per day, rows and amounts before and after, with plain DataFusion.
        let per_day = |version: u64| {
            l.query(
                &[("events", l.open_version("events", version))],
                &format!(
                    "SELECT CAST(event_date AS VARCHAR), COUNT(*), SUM(amount_cents) FROM events \
                     WHERE event_date BETWEEN DATE '{from}' AND DATE '{to}' GROUP BY 1 ORDER BY 1"
                ),
            )
        };
        let (old, new) = (per_day(before), per_day(before + 1));
        let partitions = report["validation"]["comparison"]["partitions"]
            .as_array()
            .unwrap();
        assert_eq!(partitions.len(), 8);
        for ((p, o), n) in partitions.iter().zip(&old).zip(&new) {
            assert_eq!(p["value"], o[0].as_str());
            assert_eq!(p["old_rows"].to_string(), o[1]);
            assert_eq!(p["new_rows"].to_string(), n[1]);
            assert_eq!(
                p["measures"]["amount_cents"]["old"]
                    .as_f64()
                    .unwrap()
                    .to_string(),
                o[2]
            );
            assert_eq!(
                p["measures"]["amount_cents"]["new"]
                    .as_f64()
                    .unwrap()
                    .to_string(),
                n[2]
            );
            let changed = if p["value"] == fixed.as_str() {
                &o[1]
            } else {
                "0"
            };
            assert_eq!(p["changed"].to_string(), changed, "{p}");
            assert_eq!(
                (p["added"].as_u64(), p["removed"].as_u64()),
                (Some(0), Some(0))
            );
        }
        reports.push(report);
    }
    assert_eq!(
        reports[0]["validation"]["comparison"]["old_unread"], 7,
        "the seven unchanged days were not read"
    );
    assert_eq!(
        reports[1]["validation"]["comparison"]["old_unread"],
        serde_json::Value::Null
    );
    // Apart from that, the same validation.
    let validation = |report: &serde_json::Value| {
        let mut v = report["validation"].clone();
        v["comparison"]
            .as_object_mut()
            .unwrap()
            .remove("old_unread");
        v.as_object_mut().unwrap().remove("elapsed_ms");
        v.as_object_mut().unwrap().remove("edges_ms");
        v
    };
    assert_eq!(validation(&reports[0]), validation(&reports[1]));

    // A model that keeps every row as it is now finds the range up to date, reading no old row.
    let identity = model.replace(
        &format!(
            "CASE WHEN event_date = DATE '{fixed}' THEN amount_cents + 1 ELSE amount_cents END"
        ),
        "amount_cents",
    );
    assert_ne!(identity, model);
    std::fs::write(lake.path().join("sql/events/v4.sql"), identity).unwrap();
    let before = lake.version("events");
    let again = json_ok(&lake.run(&[
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
    assert_eq!(again["state"], "up-to-date", "{again}");
    assert_eq!(
        again["validation"]["comparison"]["old_unread"], 8,
        "{again}"
    );
    assert_eq!(lake.version("events"), before);
}

/// The new side of the key merge hashed while staging (concurrent writers, several batches)
/// gives exactly the comparison that reading the staged files back gives (a run resumed after a
/// crash mid-staging, whose first batch another process staged, reads them), and both give the
/// changes counted here with plain SQL over the old version: for a rewrite, a model that adds a
/// column (which the old side lacks, so the merge compares the others), and adjustments (whose
/// first run adds the lineage columns).
#[test]
fn the_new_rows_hashed_while_staging_compare_exactly_as_read_back() {
    for (header, extra) in [
        ("", ""),
        ("schema = \"add-columns\"\n", ", 7 AS tip_cents"),
        ("schema = \"add-columns\"\npublish = \"adjustments\"\n", ""),
    ] {
        hashed_while_staging_compares_as_read_back(header, extra);
    }
}

/// [`the_new_rows_hashed_while_staging_compare_exactly_as_read_back`] with `header` in the
/// model's header and `extra` selected after its columns.
fn hashed_while_staging_compares_as_read_back(header: &str, extra: &str) {
    let (from, to) = (TestLake::new().day(1), TestLake::new().day(8));
    let model = format!(
        "/*\ntarget = \"events\"\npartition_by = \"event_date\"\n{header}[sources.events]\nwindow = \"event_date\"\n\
         [validate]\nkey = [\"event_id\"]\nmeasures = [\"amount_cents\"]\n*/\n\
         SELECT event_id, user_id, country, \
         CASE WHEN event_id % 7 = 0 THEN amount_cents + 1 ELSE amount_cents END AS amount_cents, \
         event_ts, event_date{extra} FROM events WHERE event_id % 13 <> 0 \
         UNION ALL SELECT event_id + 1000000000, user_id, country, amount_cents, event_ts, event_date{extra} \
         FROM events WHERE event_id % 17 = 0"
    );
    let mut results = Vec::new();
    for resumed in [false, true] {
        let lake = TestLake::new();
        std::fs::write(lake.path().join("sql/events/v3.sql"), &model).unwrap();
        let args = [
            "backfill",
            "events",
            "--from",
            &from,
            "--to",
            &to,
            "--batch-partitions",
            "2",
            "--max-parallel",
            "2",
            "--stage-only",
            "--output-format",
            "json",
            "-v",
            "--allow-edge-moves",
            "--reason",
            PARTIAL_FIX,
        ];
        if resumed {
            let mut crash = crate::support::lakefill_command(lake.path());
            crash.args(args).env("LAKEFILL_FAILPOINTS", "mid-stage");
            assert!(!crash.output().unwrap().status.success());
        }
        let out = crate::support::lakefill_command(lake.path())
            .args(args)
            .env_remove("LAKEFILL_FAILPOINTS")
            .output()
            .unwrap();
        let report = json_ok(&out);
        assert_eq!(report["resumed_batches"], u64::from(resumed), "{report}");
        let captured = format!("captured={}", !resumed);
        assert!(
            stderr(&out).contains(&captured),
            "{header}: expected {captured}: {}",
            stderr(&out)
        );
        // Independently: what the model does to the old rows of the range.
        let expected = lake.query(
            &[("events", lake.open("events"))],
            &format!(
                "SELECT \
                 SUM(CASE WHEN event_id % 17 = 0 THEN 1 ELSE 0 END), \
                 SUM(CASE WHEN event_id % 13 = 0 THEN 1 ELSE 0 END), \
                 SUM(CASE WHEN event_id % 13 <> 0 AND event_id % 7 = 0 AND amount_cents IS NOT NULL THEN 1 ELSE 0 END) \
                 FROM events WHERE event_date BETWEEN DATE '{from}' AND DATE '{to}'"
            ),
        );
        let totals = &report["validation"]["comparison"]["totals"];
        let counted = vec![
            totals["added"].to_string(),
            totals["removed"].to_string(),
            totals["changed"].to_string(),
        ];
        assert_eq!(counted, expected[0], "{header}: {totals}");
        assert!(expected[0].iter().all(|n| n != "0"), "{expected:?}");
        let mut validation = report["validation"].clone();
        validation.as_object_mut().unwrap().remove("elapsed_ms");
        validation.as_object_mut().unwrap().remove("edges_ms");
        results.push(validation);
    }
    assert_eq!(results[0], results[1], "{header}");
}

/// Each check is planned with the plan: one naming a missing table, a missing column or not
/// parsing is refused by `plan` and by `backfill` before anything is staged (exit 2, the check
/// named); one reading another table of the project as a cascade stages it plans.
#[test]
fn issue_33_checks_are_planned_at_plan_time() {
    let lake = TestLake::new();
    for (name, sql, wrong) in [
        (
            "a missing table",
            "SELECT * FROM outptu WHERE amount_cents < 0",
            Some("outptu"),
        ),
        (
            "a missing column",
            "SELECT * FROM output WHERE amount < 0",
            Some("amount"),
        ),
        ("not SQL", "SELEKT nothing", Some("SELEKT")),
        (
            "another node",
            "SELECT * FROM output o JOIN staged.daily_revenue d ON o.event_date = d.event_date WHERE d.revenue_cents < 0",
            None,
        ),
    ] {
        events_model(
            &lake,
            &format!("[[validate.checks]]\nname = \"{name}\"\nsql = \"{sql}\""),
            V2_SELECT,
        );
        let plan = lake.run(&[
            "plan",
            "events",
            "--from",
            &lake.day(2),
            "--to",
            &lake.day(5),
        ]);
        let Some(wrong) = wrong else {
            assert!(plan.status.success(), "{name}: {}", stderr(&plan));
            continue;
        };
        assert_eq!(plan.status.code(), Some(2), "{name}: {}", stderr(&plan));
        let err = stderr(&plan);
        assert!(err.contains(name) && err.contains(wrong), "{name}: {err}");
        let files = lake.files("events");
        let mut disk_before = crate::support::files_under(&lake.table_path("events"));
        disk_before.retain(|f| !f.contains("/_lakefill/"));
        disk_before.sort();
        let out = lake.run(&[
            "backfill",
            "events",
            "--from",
            &lake.day(2),
            "--to",
            &lake.day(5),
            "--allow-edge-moves",
            "--reason",
            PARTIAL_FIX,
        ]);
        assert_eq!(out.status.code(), Some(2), "{name}: {}", stderr(&out));
        assert_eq!(lake.files("events"), files, "{name}: nothing staged");
        let mut on_disk = crate::support::files_under(&lake.table_path("events"));
        on_disk.retain(|f| !f.contains("/_lakefill/"));
        on_disk.sort();
        assert_eq!(on_disk, disk_before, "{name}: no staged file");
    }
}
