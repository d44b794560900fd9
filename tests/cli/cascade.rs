//! `plan --cascade`: the model graph from the model files, ranges through each edge's window
//! (lookback, lookahead, a coarser child grain, clipping to the child's partitions, the hull of
//! several parents), cycles and over-wide ranges refused. Expected ranges are computed by hand
//! from day offsets.

use deltalake::kernel::{DataType, StructField};

use crate::support::{PARTIAL_FIX, TestLake, json_ok, runtime, stderr};

/// Declares table `name` in the project, creates it empty (partitioned by `partition`), writes
/// `sql/<name>/v1.sql` with `header` and `select`, and fills its history with that model over
/// every day of the lake.
fn add_model(
    lake: &TestLake,
    name: &str,
    columns: Vec<StructField>,
    partition: &str,
    header: &str,
    select: &str,
) {
    let project = lake.path().join("lakefill.toml");
    let toml = std::fs::read_to_string(&project).unwrap();
    let toml = toml.replacen(
        "[defaults]",
        &format!("[tables.{name}]\nuri = \"lake/{name}\"\n\n[defaults]"),
        1,
    );
    std::fs::write(&project, toml).unwrap();
    let dir = lake.path().join("lake").join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let url = url::Url::from_directory_path(&dir).unwrap();
    runtime()
        .block_on(async {
            deltalake::DeltaTableBuilder::from_url(url)
                .unwrap()
                .build()
                .unwrap()
                .create()
                .with_table_name(name)
                .with_columns(columns)
                .with_partition_columns([partition])
                .await
        })
        .expect("create table");
    let sql = lake.path().join("sql").join(name);
    std::fs::create_dir_all(&sql).unwrap();
    std::fs::write(
        sql.join("v1.sql"),
        format!("/*\ntarget = \"{name}\"\npartition_by = \"{partition}\"\n{header}\n*/\n{select}"),
    )
    .unwrap();
    let out = lake.run(&[
        "backfill",
        name,
        "--from",
        &lake.day(0),
        "--to",
        &lake.day(9),
    ]);
    assert!(out.status.success(), "history of {name}: {}", stderr(&out));
}

fn day_columns(value: &str) -> Vec<StructField> {
    vec![
        StructField::new("event_date", DataType::DATE, true),
        StructField::new(value, DataType::LONG, true),
    ]
}

/// A 7-day rolling sum over `daily_revenue` (lookback 6).
fn add_rolling(lake: &TestLake) {
    add_model(
        lake,
        "rolling_7d",
        day_columns("revenue_7d"),
        "event_date",
        "[sources.daily_revenue]\nwindow = \"event_date\"\nlookback = 6",
        "SELECT d.event_date, SUM(p.revenue_cents) AS revenue_7d \
         FROM (SELECT DISTINCT event_date FROM daily_revenue WHERE event_date BETWEEN $start AND $end) d \
         JOIN daily_revenue p ON p.event_date BETWEEN d.event_date - INTERVAL '6 days' AND d.event_date \
         GROUP BY d.event_date",
    );
}

fn plan(lake: &TestLake, from: u64, to: u64, extra: &[&str]) -> serde_json::Value {
    let (from, to) = (lake.day(from), lake.day(to));
    let mut args = vec![
        "plan",
        "events",
        "--from",
        &from,
        "--to",
        &to,
        "--cascade",
        "--output-format",
        "json",
    ];
    args.extend_from_slice(extra);
    json_ok(&lake.run(&args))
}

/// Each node's model and range, in the order planned.
fn ranges(cascade: &serde_json::Value) -> Vec<(String, String, String)> {
    cascade["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["model"].as_str().unwrap().to_string(),
                n["range"]["from"].as_str().unwrap().to_string(),
                n["range"]["to"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// `next_day` (tomorrow's events per day, lookahead 1 on `events`) and `combo`, a diamond over
/// `daily_revenue` (lookback 2) and `next_day`.
fn add_diamond(lake: &TestLake) {
    // Tomorrow's events per day: a row for d reads d ..= d + 1 (lookahead 1).
    add_model(
        lake,
        "next_day",
        day_columns("events_next_day"),
        "event_date",
        "[sources.events]\nwindow = \"event_date\"\nlookahead = 1",
        "SELECT e.event_date - INTERVAL '1 day' AS event_date, COUNT(*) AS events_next_day \
         FROM events e WHERE e.event_date - INTERVAL '1 day' BETWEEN $start AND $end GROUP BY 1",
    );
    // A diamond: reads daily_revenue (lookback 2) and next_day (no lookback).
    add_model(
        lake,
        "combo",
        day_columns("value"),
        "event_date",
        "[sources.daily_revenue]\nwindow = \"event_date\"\nlookback = 2\n[sources.next_day]\nwindow = \"event_date\"",
        "SELECT n.event_date, MAX(n.events_next_day) + COUNT(d.country) AS value FROM next_day n \
         LEFT JOIN daily_revenue d ON d.event_date BETWEEN n.event_date - INTERVAL '2 days' AND n.event_date \
         WHERE n.event_date BETWEEN $start AND $end GROUP BY n.event_date",
    );
}

#[test]
fn a_diamond_is_computed_from_both_fixed_parents() {
    let lake = TestLake::new();
    add_rolling(&lake);
    add_diamond(&lake);
    let report = json_ok(&cascade(&lake, 3, 4, &["--output-format", "json"]));
    assert_eq!(report["outcome"], "published", "{report:#}");
    assert_eq!(report["nodes"].as_array().unwrap().len(), 5, "{report:#}");
    assert_chain_consistent(&lake, 3, 4);
    // Every row of next_day and combo equals a recompute from their published parents (so the
    // ranges reached every row the fix changed).
    let (first, last) = (lake.day(0), lake.day(8));
    let next_day = rows(
        &lake,
        &["next_day"],
        &format!(
            "SELECT CAST(event_date AS VARCHAR), CAST(events_next_day AS VARCHAR) FROM next_day \
             WHERE event_date BETWEEN DATE '{first}' AND DATE '{last}' ORDER BY 1"
        ),
    );
    let expected_next_day = rows(
        &lake,
        &["events"],
        &format!(
            "SELECT CAST(d AS VARCHAR), CAST(n AS VARCHAR) FROM (SELECT CAST(event_date - INTERVAL '1 day' AS DATE) AS d, \
             COUNT(*) AS n FROM events GROUP BY 1) WHERE d BETWEEN DATE '{first}' AND DATE '{last}' ORDER BY 1"
        ),
    );
    assert_eq!(
        next_day, expected_next_day,
        "next_day counts tomorrow's events"
    );
    let combo = rows(
        &lake,
        &["combo"],
        &format!(
            "SELECT CAST(event_date AS VARCHAR), CAST(value AS VARCHAR) FROM combo \
             WHERE event_date BETWEEN DATE '{first}' AND DATE '{last}' ORDER BY 1"
        ),
    );
    let expected_combo = rows(
        &lake,
        &["next_day", "daily_revenue"],
        &format!(
            "SELECT CAST(day AS VARCHAR), CAST(v AS VARCHAR) FROM ( \
               SELECT n.event_date AS day, MAX(n.events_next_day) + COUNT(d.country) AS v \
               FROM next_day n LEFT JOIN daily_revenue d \
                 ON d.event_date BETWEEN n.event_date - INTERVAL '2 days' AND n.event_date \
               WHERE n.event_date BETWEEN DATE '{first}' AND DATE '{last}' GROUP BY n.event_date) \
             ORDER BY 1"
        ),
    );
    assert_eq!(combo, expected_combo, "combo reads both fixed parents");
}

#[test]
fn ranges_follow_lookbacks_lookaheads_grains_and_the_childs_partitions() {
    let lake = TestLake::new();
    add_rolling(&lake);
    add_diamond(&lake);
    // Monthly revenue: a coarser grain.
    add_model(
        &lake,
        "monthly_revenue",
        vec![
            StructField::new("month", DataType::DATE, true),
            StructField::new("revenue_cents", DataType::LONG, true),
        ],
        "month",
        "grain = \"month\"\n[sources.daily_revenue]\nwindow = \"event_date\"",
        "SELECT CAST(date_trunc('month', event_date) AS DATE) AS month, SUM(revenue_cents) AS revenue_cents \
         FROM daily_revenue WHERE event_date BETWEEN $start AND $end GROUP BY 1",
    );
    let cascade = plan(&lake, 3, 4, &[]);
    let d = |n: u64| lake.day(n);
    let month = lake.day(0)[..7].to_string();
    assert_eq!(
        ranges(&cascade),
        vec![
            ("events".into(), d(3), d(4)),
            // Lookback 0: the same days.
            ("daily_revenue".into(), d(3), d(4)),
            // Daily days rounded to the child's month.
            ("monthly_revenue".into(), month.clone(), month),
            // Lookahead 1: a row for d reads d + 1, so d = 2 sees the change of day 3.
            ("next_day".into(), d(2), d(4)),
            // The hull of daily_revenue 3..=4 + lookback 2 (3..=6) and next_day 2..=4.
            ("combo".into(), d(2), d(6)),
            // Lookback 6: days 3..=10, clipped to the days the table has (0..=9).
            ("rolling_7d".into(), d(3), d(9)),
        ],
        "{cascade:#}"
    );
    let edges = cascade["edges"].as_array().unwrap();
    assert_eq!(edges.len(), 6, "{cascade:#}");
    let rolling = edges.iter().find(|e| e["child"] == "rolling_7d").unwrap();
    assert_eq!(rolling["lookback"], 6);
    assert_eq!(rolling["reaches"], serde_json::json!([d(3), d(9)]));
    assert!(
        rolling["explanation"].as_str().unwrap().contains("6 day"),
        "{rolling}"
    );
    // The text names each node and edge.
    let text = lake.run(&[
        "plan",
        "events",
        "--from",
        &d(3),
        "--to",
        &d(4),
        "--cascade",
    ]);
    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    for model in [
        "daily_revenue",
        "next_day",
        "combo",
        "monthly_revenue",
        "rolling_7d",
    ] {
        assert!(text.contains(&format!("{model}@v1")), "{text}");
    }
}

#[test]
fn a_range_that_would_widen_too_far_and_a_cycle_are_refused() {
    let lake = TestLake::new();
    add_rolling(&lake);
    // One day at the root reaches 7 days of rolling_7d: 7x, beyond the default 4x.
    let d = |n: u64| lake.day(n);
    let out = lake.run(&[
        "plan",
        "events",
        "--from",
        &d(2),
        "--to",
        &d(2),
        "--cascade",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("rolling_7d") && err.contains("7.0 times"),
        "{err}"
    );
    assert!(err.contains("--max-expansion 7"), "{err}");
    let wide = plan(&lake, 2, 2, &["--max-expansion", "7"]);
    assert_eq!(ranges(&wide)[2], ("rolling_7d".into(), d(2), d(8)));

    // A cycle downstream of the root: loop_a reads events and loop_b's table, loop_b reads
    // loop_a's.
    let project = lake.path().join("lakefill.toml");
    let toml = std::fs::read_to_string(&project).unwrap().replacen(
        "[defaults]",
        "[tables.loop_a]\nuri = \"lake/loop_a\"\n\n[tables.loop_b]\nuri = \"lake/loop_b\"\n\n[defaults]",
        1,
    );
    std::fs::write(&project, toml).unwrap();
    for (name, sources) in [
        ("loop_a", "[sources.events]\n[sources.loop_b]"),
        ("loop_b", "[sources.loop_a]"),
    ] {
        let dir = lake.path().join("sql").join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("v1.sql"),
            format!("/*\ntarget = \"{name}\"\npartition_by = \"event_date\"\n{sources}\n*/\nSELECT 1 AS x"),
        )
        .unwrap();
    }
    let out = lake.run(&[
        "plan",
        "events",
        "--from",
        &d(2),
        "--to",
        &d(4),
        "--cascade",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("loop_a -> loop_b -> loop_a"),
        "{}",
        stderr(&out)
    );
    // Pins of other models need --cascade.
    let out = lake.run(&[
        "plan",
        "events",
        "--from",
        &d(2),
        "--to",
        &d(4),
        "--model-version",
        "daily_revenue=v1",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("only with `--cascade`"),
        "{}",
        stderr(&out)
    );
}

/// Rows of `sql` over the tables at their latest versions.
fn rows(lake: &TestLake, tables: &[&str], sql: &str) -> Vec<Vec<String>> {
    let opened: Vec<(&str, deltalake::DeltaTable)> =
        tables.iter().map(|t| (*t, lake.open(t))).collect();
    lake.query(&opened, sql)
}

/// Each table of the chain equals a recompute from its (published) parent, on the cascade's
/// ranges: events from raw_events, daily_revenue from events, rolling_7d from daily_revenue.
fn assert_chain_consistent(lake: &TestLake, from: u64, to: u64) {
    let (d0, d1) = (lake.day(from), lake.day(to));
    let events = rows(
        lake,
        &["events"],
        &format!(
            "SELECT CAST(event_id AS VARCHAR), CAST(event_date AS VARCHAR) FROM events \
             WHERE event_date BETWEEN DATE '{d0}' AND DATE '{d1}' ORDER BY 1"
        ),
    );
    let expected_events = rows(
        lake,
        &["raw_events"],
        &format!(
            "SELECT CAST(event_id AS VARCHAR), CAST(CAST(event_ts AS DATE) AS VARCHAR) FROM raw_events \
             WHERE CAST(event_ts AS DATE) BETWEEN DATE '{d0}' AND DATE '{d1}' ORDER BY 1"
        ),
    );
    assert_eq!(events, expected_events, "events is the fix of raw_events");
    let revenue = rows(
        lake,
        &["daily_revenue"],
        "SELECT CAST(event_date AS VARCHAR), country, CAST(revenue_cents AS VARCHAR), \
         CAST(events AS VARCHAR) FROM daily_revenue ORDER BY 1, 2",
    );
    let expected_revenue = rows(
        lake,
        &["events"],
        "SELECT CAST(event_date AS VARCHAR), country, CAST(r AS VARCHAR), CAST(n AS VARCHAR) \
         FROM (SELECT event_date, country, SUM(amount_cents) AS r, COUNT(*) AS n FROM events \
               GROUP BY event_date, country) ORDER BY 1, 2",
    );
    assert_eq!(
        revenue, expected_revenue,
        "daily_revenue is the sum of events"
    );
    let last = lake.day(9);
    let rolling = rows(
        lake,
        &["rolling_7d"],
        &format!(
            "SELECT CAST(event_date AS VARCHAR), CAST(revenue_7d AS VARCHAR) FROM rolling_7d \
             WHERE event_date BETWEEN DATE '{d0}' AND DATE '{last}' ORDER BY 1"
        ),
    );
    let expected_rolling = rows(
        lake,
        &["daily_revenue"],
        &format!(
            "SELECT CAST(day AS VARCHAR), CAST(total AS VARCHAR) FROM ( \
               SELECT d.event_date AS day, SUM(p.revenue_cents) AS total \
               FROM (SELECT DISTINCT event_date FROM daily_revenue \
                     WHERE event_date BETWEEN DATE '{d0}' AND DATE '{last}') d \
               JOIN daily_revenue p ON p.event_date BETWEEN d.event_date - INTERVAL '6 days' AND d.event_date \
               GROUP BY d.event_date) ORDER BY 1"
        ),
    );
    assert_eq!(
        rolling, expected_rolling,
        "rolling_7d is the 7-day sum of daily_revenue"
    );
}

fn cascade(lake: &TestLake, from: u64, to: u64, extra: &[&str]) -> std::process::Output {
    let (from, to) = (lake.day(from), lake.day(to));
    let mut args = vec![
        "backfill",
        "events",
        "--from",
        &from,
        "--to",
        &to,
        "--cascade",
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
    ];
    args.extend_from_slice(extra);
    lake.run(&args)
}

fn versions(lake: &TestLake) -> Vec<u64> {
    ["events", "daily_revenue", "rolling_7d"]
        .iter()
        .map(|t| lake.version(t))
        .collect()
}

#[test]
fn a_cascade_fixes_every_level_staged_against_its_parents_and_publishes_once() {
    let lake = TestLake::new();
    add_rolling(&lake);
    // Every table tells a file sink (project-wide).
    let config = lake.path().join("lakefill.toml");
    let toml = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        format!("notify = [\"file:notifications.jsonl\"]\n{toml}"),
    )
    .unwrap();
    let before = versions(&lake);
    let report = json_ok(&cascade(&lake, 3, 4, &["--output-format", "json"]));
    assert_eq!(report["outcome"], "published", "{report:#}");
    let nodes = report["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 3);
    for node in nodes {
        assert_eq!(node["outcome"], "published", "{node}");
    }
    // Each node's version is announced as a cascade event naming the cascade, valid against
    // the schema, one per table at the version the cascade made.
    let lines = std::fs::read_to_string(lake.path().join("notifications.jsonl")).unwrap();
    let events: Vec<serde_json::Value> = lines
        .lines()
        .map(|l| {
            crate::notify::assert_valid_event(l);
            serde_json::from_str(l).unwrap()
        })
        .collect();
    let mut announced: Vec<(String, u64)> = events
        .iter()
        .map(|e| {
            assert_eq!(e["type"], "cascade.published", "{e:#}");
            assert_eq!(e["cascade"], report["cascade_id"], "{e:#}");
            (
                e["table"]["name"].as_str().unwrap().to_string(),
                e["version_after"].as_u64().unwrap(),
            )
        })
        .collect();
    announced.sort();
    let mut expected: Vec<(String, u64)> = ["events", "daily_revenue", "rolling_7d"]
        .iter()
        .map(|t| (t.to_string(), lake.version(t)))
        .collect();
    expected.sort();
    assert_eq!(announced, expected);
    assert_eq!(
        versions(&lake),
        before.iter().map(|v| v + 1).collect::<Vec<_>>(),
        "one new version per table"
    );
    assert_chain_consistent(&lake, 3, 4);
    let id = report["cascade_id"].as_str().unwrap().to_string();

    // `runs` groups the nodes under their cascade.
    let runs = lake.run(&["runs"]);
    let text = String::from_utf8_lossy(&runs.stdout).into_owned();
    assert!(text.contains(&format!("{id}: ")), "{text}");

    // The release: after another writer appends to events, `sql --cascade` still reads every
    // table at the version the cascade published it as.
    crate::support::append_event(&lake, &lake.day(8), 9_000_001);
    let release = json_ok(&lake.run(&[
        "sql",
        "--cascade",
        &id,
        "SELECT (SELECT COUNT(*) FROM events) AS e, (SELECT COUNT(*) FROM daily_revenue) AS d",
        "--output-format",
        "json",
    ]));
    assert_eq!(release["tables"]["events"], before[0] + 1, "{release:#}");
    assert_eq!(
        release["tables"]["daily_revenue"],
        before[1] + 1,
        "{release:#}"
    );
    let published_events = lake
        .query(
            &[("events", lake.open_version("events", before[0] + 1))],
            "SELECT CAST(COUNT(*) AS VARCHAR) FROM events",
        )
        .remove(0)
        .remove(0);
    assert_eq!(
        release["rows"][0][0],
        published_events.as_str(),
        "{release:#}"
    );
    let latest = json_ok(&lake.run(&[
        "sql",
        "SELECT COUNT(*) AS e FROM events",
        "--output-format",
        "json",
    ]));
    assert_ne!(
        latest["rows"][0][0], release["rows"][0][0],
        "the append is after the release"
    );

    // The same command again changes nothing.
    let current = versions(&lake);
    let again = json_ok(&cascade(&lake, 3, 4, &["--output-format", "json"]));
    assert_eq!(versions(&lake), current, "{again:#}");
    assert_eq!(again["outcome"], "already-published", "{again:#}");
}

/// A `daily_revenue` v2 whose check reads the fixed events through `staged.events`.
fn add_cross_model_check(lake: &TestLake, name: &str, condition: &str) {
    let dir = lake.path().join("sql/daily_revenue");
    let v1 = std::fs::read_to_string(dir.join("v1.sql")).unwrap();
    let check = format!(
        "checks = [{{ name = \"{name}\", sql = \"SELECT o.event_date FROM output o JOIN \
         (SELECT event_date, country, SUM(amount_cents) AS s FROM staged.events GROUP BY 1, 2) e \
         ON o.event_date = e.event_date AND o.country = e.country WHERE {condition}\" }}]"
    );
    std::fs::write(
        dir.join("v2.sql"),
        v1.replacen(
            "measures = [\"revenue_cents\", \"events\"]",
            &format!("measures = [\"revenue_cents\", \"events\"]\n{check}"),
            1,
        ),
    )
    .unwrap();
}

#[test]
fn a_check_reads_another_nodes_staged_output() {
    // Revenue equals the fixed events' sums: the check sees the staged events, not the old.
    let lake = TestLake::new();
    add_rolling(&lake);
    add_cross_model_check(&lake, "revenue_matches_events", "o.revenue_cents <> e.s");
    let before = versions(&lake);
    let report = json_ok(&cascade(&lake, 3, 4, &["--output-format", "json"]));
    assert_eq!(report["outcome"], "published", "{report:#}");
    assert_eq!(
        versions(&lake),
        before.iter().map(|v| v + 1).collect::<Vec<_>>()
    );

    // The opposite condition finds every row: it fails, names the node's check, publishes
    // nothing.
    let lake = TestLake::new();
    add_rolling(&lake);
    add_cross_model_check(&lake, "revenue_differs", "o.revenue_cents = e.s");
    let before = versions(&lake);
    let out = cascade(&lake, 3, 4, &[]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("revenue_differs"), "{}", stderr(&out));
    assert_eq!(versions(&lake), before, "nothing published anywhere");
}

/// A `daily_revenue` v2 with `conserve_with = { MEASURE = "OTHER" }`.
fn add_conserve_with(lake: &TestLake, measure: &str, other: &str) {
    let dir = lake.path().join("sql/daily_revenue");
    let v1 = std::fs::read_to_string(dir.join("v1.sql")).unwrap();
    std::fs::write(
        dir.join("v2.sql"),
        v1.replacen(
            "measures = [\"revenue_cents\", \"events\"]",
            &format!(
                "measures = [\"revenue_cents\", \"events\"]\nconserve_with = {{ {measure} = \"{other}\" }}"
            ),
            1,
        ),
    )
    .unwrap();
}

#[test]
fn conservation_holds_across_the_models_of_a_cascade() {
    // Revenue over the range equals the fixed events' amounts over it.
    let lake = TestLake::new();
    add_conserve_with(&lake, "revenue_cents", "events.amount_cents");
    let report = json_ok(&cascade(&lake, 3, 4, &["--output-format", "json"]));
    assert_eq!(report["outcome"], "published", "{report:#}");
    // Alone, the model compares with its source as read.
    let alone = json_ok(&lake.run(&[
        "backfill",
        "daily_revenue",
        "--from",
        &lake.day(5),
        "--to",
        &lake.day(6),
        "--output-format",
        "json",
    ]));
    let check = alone["validation"]["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "conserve_with(revenue_cents = events.amount_cents)")
        .cloned()
        .unwrap_or_else(|| panic!("{alone:#}"));
    assert_eq!(check["passed"], true, "{check:#}");

    // Events counted against amounts: not conserved, nothing published, the check named.
    let lake = TestLake::new();
    add_rolling(&lake);
    add_conserve_with(&lake, "events", "events.amount_cents");
    let before = versions(&lake);
    let out = cascade(&lake, 3, 4, &[]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("conserve_with(events = events.amount_cents)"),
        "{}",
        stderr(&out)
    );
    assert_eq!(versions(&lake), before);

    // A table that is neither upstream in the cascade nor a source is refused, with a hint.
    let lake = TestLake::new();
    add_conserve_with(&lake, "revenue_cents", "raw_events.amount_cents");
    let out = cascade(&lake, 3, 4, &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("neither a table of the cascade"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_failing_check_in_the_last_node_publishes_nothing() {
    let lake = TestLake::new();
    add_rolling(&lake);
    let dir = lake.path().join("sql/rolling_7d");
    let v1 = std::fs::read_to_string(dir.join("v1.sql")).unwrap();
    std::fs::write(
        dir.join("v2.sql"),
        v1.replacen(
            "lookback = 6",
            "lookback = 6\n[validate]\nchecks = [{ name = \"no_revenue\", sql = \"SELECT * FROM output WHERE revenue_7d > 0\" }]",
            1,
        ),
    )
    .unwrap();
    let before = versions(&lake);
    let out = cascade(&lake, 3, 4, &[]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("no_revenue"), "{}", stderr(&out));
    assert_eq!(versions(&lake), before, "nothing published anywhere");
}

#[test]
fn ctrl_c_stops_a_cascade_cleanly_and_the_same_command_finishes_it() {
    let lake = TestLake::new();
    add_rolling(&lake);
    let before = versions(&lake);
    let (from, to) = (lake.day(3), lake.day(4));
    // One partition a batch: the root stages two batches and pauses in the second.
    let args = [
        "backfill",
        "events",
        "--from",
        &from,
        "--to",
        &to,
        "--cascade",
        "--batch-partitions",
        "1",
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
    ];
    let log = lake.path().join("interrupted.log");
    let mut child = crate::support::lakefill_command(lake.path())
        .args(args)
        .env("LAKEFILL_FAILPOINTS", "stage-batch-2=pause")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("failpoint hit: pausing")
    {
        assert!(child.try_wait().unwrap().is_none(), "ended before pausing");
        assert!(std::time::Instant::now() < deadline, "never paused");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let killed = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = child.wait().unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(status.code(), Some(130), "{text}");
    assert!(text.contains("interrupted"), "{text}");
    assert!(text.contains("run the same command again"), "{text}");
    assert_eq!(versions(&lake), before, "nothing published anywhere");

    // The same command goes on from the journaled batch and publishes every level.
    let mut again = args.to_vec();
    again.extend(["--output-format", "json"]);
    let report = json_ok(&lake.run(&again));
    assert_eq!(report["outcome"], "published", "{report:#}");
    assert_eq!(
        versions(&lake),
        before.iter().map(|v| v + 1).collect::<Vec<_>>()
    );
    assert_chain_consistent(&lake, 3, 4);
}

#[test]
fn a_cascade_stopped_between_publishes_is_finished_by_running_it_again() {
    let lake = TestLake::new();
    add_rolling(&lake);
    let before = versions(&lake);
    let (from, to) = (lake.day(3), lake.day(4));
    let out = crate::support::lakefill_command(lake.path())
        .args([
            "backfill",
            "events",
            "--from",
            &from,
            "--to",
            &to,
            "--cascade",
            "--allow-edge-moves",
            "--reason",
            PARTIAL_FIX,
        ])
        .env("LAKEFILL_FAILPOINTS", "cascade-between-publishes")
        .output()
        .unwrap();
    assert!(!out.status.success(), "{}", stderr(&out));
    let stopped = versions(&lake);
    assert_eq!(stopped[0], before[0] + 1, "the root landed");
    assert_eq!(stopped[1..], before[1..], "the children did not");
    let report = json_ok(&cascade(&lake, 3, 4, &["--output-format", "json"]));
    assert_eq!(
        report["nodes"][0]["outcome"], "already_published",
        "{report:#}"
    );
    assert_eq!(
        versions(&lake),
        before.iter().map(|v| v + 1).collect::<Vec<_>>(),
        "each table exactly once"
    );
    assert_chain_consistent(&lake, 3, 4);
}

/// Every row of each table of the chain at `versions` (latest when `None`).
fn snapshot(lake: &TestLake, versions: Option<&[u64]>) -> Vec<Vec<Vec<String>>> {
    [
        ("events", "SELECT CAST(event_id AS VARCHAR), CAST(event_date AS VARCHAR), CAST(amount_cents AS VARCHAR) FROM t ORDER BY 1, 2"),
        ("daily_revenue", "SELECT CAST(event_date AS VARCHAR), country, CAST(revenue_cents AS VARCHAR), CAST(events AS VARCHAR) FROM t ORDER BY 1, 2"),
        ("rolling_7d", "SELECT CAST(event_date AS VARCHAR), CAST(revenue_7d AS VARCHAR) FROM t ORDER BY 1"),
    ]
    .iter()
    .enumerate()
    .map(|(i, (table, sql))| {
        let opened = match versions {
            Some(v) => lake.open_version(table, v[i]),
            None => lake.open(table),
        };
        lake.query(&[("t", opened)], sql)
    })
    .collect()
}

/// A later commit in the root's range stops a cascade's revert by files at the root, after its
/// children are reverted; `revert CASCADE_ID --logical` finishes it: every table is as before
/// the cascade (the later row in the root's range is replaced too), each node reverted once.
#[test]
fn a_blocked_cascade_revert_is_finished_logically() {
    let lake = TestLake::new();
    add_rolling(&lake);
    let before = versions(&lake);
    let published = json_ok(&cascade(&lake, 3, 4, &["--output-format", "json"]));
    let id = published["cascade_id"].as_str().unwrap().to_string();
    crate::support::append_event(&lake, &lake.day(3), 9_000_003);
    let blocked = lake.run(&["revert", &id]);
    assert_eq!(blocked.status.code(), Some(4), "{}", stderr(&blocked));
    assert!(
        stderr(&blocked).contains("--logical"),
        "{}",
        stderr(&blocked)
    );

    let reverted = json_ok(&lake.run(&["revert", &id, "--logical", "--output-format", "json"]));
    let outcomes: Vec<(&str, &str)> = reverted["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["table"].as_str().unwrap(), n["outcome"].as_str().unwrap()))
        .collect();
    assert_eq!(
        outcomes,
        vec![
            ("rolling_7d", "already_reverted"),
            ("daily_revenue", "already_reverted"),
            ("events", "reverted"),
        ],
        "{reverted:#}"
    );
    assert_eq!(
        snapshot(&lake, None),
        snapshot(&lake, Some(&before)),
        "every table as before the cascade"
    );
}

#[test]
fn a_staged_cascade_is_published_and_reverted_by_its_id() {
    let lake = TestLake::new();
    add_rolling(&lake);
    let before = versions(&lake);
    let staged = json_ok(&cascade(
        &lake,
        3,
        4,
        &["--stage-only", "--output-format", "json"],
    ));
    assert_eq!(staged["outcome"], "staged", "{staged:#}");
    assert_eq!(versions(&lake), before, "nothing published yet");
    let id = staged["cascade_id"].as_str().unwrap().to_string();
    let published = json_ok(&lake.run(&["publish", &id, "--output-format", "json"]));
    assert_eq!(published["outcome"], "published", "{published:#}");
    let after = before.iter().map(|v| v + 1).collect::<Vec<_>>();
    assert_eq!(versions(&lake), after);
    assert_chain_consistent(&lake, 3, 4);
    let fixed = snapshot(&lake, None);

    // Reverting the cascade puts every table back, children first.
    let reverted = json_ok(&lake.run(&["revert", &id, "--output-format", "json"]));
    let order: Vec<&str> = reverted["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["table"].as_str().unwrap())
        .collect();
    assert_eq!(
        order,
        vec!["rolling_7d", "daily_revenue", "events"],
        "{reverted:#}"
    );
    assert_eq!(
        snapshot(&lake, None),
        snapshot(&lake, Some(&before)),
        "as before the cascade"
    );
    assert_ne!(snapshot(&lake, None), fixed);

    // A staged cascade discarded by its id publishes nothing and keeps nothing staged.
    let again = json_ok(&cascade(
        &lake,
        5,
        6,
        &["--stage-only", "--output-format", "json"],
    ));
    let id = again["cascade_id"].as_str().unwrap().to_string();
    let versions_now = versions(&lake);
    let discarded = json_ok(&lake.run(&["discard", &id, "--output-format", "json"]));
    assert_eq!(discarded["outcome"], "discarded", "{discarded:#}");
    assert_eq!(versions(&lake), versions_now);
    let runs = json_ok(&lake.run(&["runs", "--output-format", "json"]));
    for node in again["nodes"].as_array().unwrap() {
        let state = runs
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["run_id"] == node["run_id"])
            .map(|r| r["state"].clone());
        assert_eq!(state, Some(serde_json::json!("discarded")), "{node}");
    }
}

/// Appends one row to `daily_revenue` with plain delta-rs, as another writer would.
fn append_revenue(lake: &TestLake, date: &str) {
    use deltalake::arrow::array::{Date32Array, Int64Array, RecordBatch, StringArray};
    use deltalake::arrow::datatypes::{DataType as Arrow, Field, Schema};
    let days = (chrono::NaiveDate::parse_from_str(date, "%Y-%m-%d").unwrap()
        - chrono::NaiveDate::from_ymd_opt(1970, 1, 1).unwrap())
    .num_days() as i32;
    let schema = std::sync::Arc::new(Schema::new(vec![
        Field::new("event_date", Arrow::Date32, true),
        Field::new("country", Arrow::Utf8, true),
        Field::new("revenue_cents", Arrow::Int64, true),
        Field::new("events", Arrow::Int64, true),
    ]));
    let batch = RecordBatch::try_new(
        schema,
        vec![
            std::sync::Arc::new(Date32Array::from(vec![days])),
            std::sync::Arc::new(StringArray::from(vec!["ZZ"])),
            std::sync::Arc::new(Int64Array::from(vec![1])),
            std::sync::Arc::new(Int64Array::from(vec![1])),
        ],
    )
    .unwrap();
    let table = lake.open("daily_revenue");
    runtime()
        .block_on(async {
            table
                .write(vec![batch])
                .with_save_mode(deltalake::protocol::SaveMode::Append)
                .await
        })
        .expect("append");
}

#[test]
fn a_conflict_on_a_middle_node_leaves_a_truthful_record_and_a_rerun_completes() {
    let lake = TestLake::new();
    add_rolling(&lake);
    let before = versions(&lake);
    let staged = json_ok(&cascade(
        &lake,
        3,
        4,
        &["--stage-only", "--output-format", "json"],
    ));
    let id = staged["cascade_id"].as_str().unwrap().to_string();
    // Another writer appends into daily_revenue's range after the cascade read it.
    append_revenue(&lake, &lake.day(3));
    let out = lake.run(&["publish", &id]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let now = versions(&lake);
    assert_eq!(
        now[0],
        before[0] + 1,
        "events, first in order, is published"
    );
    assert_eq!(
        now[1],
        before[1] + 1,
        "daily_revenue has only the other writer's append"
    );
    assert_eq!(now[2], before[2], "revenue_7d waits");
    // The record says so.
    let record_path = lake
        .path()
        .join("lake/events/_lakefill/cascades")
        .join(format!("{id}.json"));
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(record_path).unwrap()).unwrap();
    let states: Vec<&str> = record["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["state"].as_str().unwrap())
        .collect();
    assert_eq!(states[0], "published", "{record:#}");
    assert!(states[1].starts_with("failed: "), "{record:#}");
    assert!(
        record["nodes"][0]["published_version"].is_u64(),
        "{record:#}"
    );
    // Running the cascade again recomputes what is left against the new versions.
    let report = json_ok(&cascade(&lake, 3, 4, &["--output-format", "json"]));
    assert_eq!(report["outcome"], "published", "{report:#}");
    assert_eq!(
        versions(&lake)[0],
        before[0] + 1,
        "events is not published twice"
    );
    assert_chain_consistent(&lake, 3, 4);
}

/// Another writer's copy of one row of `events` on `date` (python `deltalake`, an append).
fn append_event_copy(lake: &TestLake, date: &str) {
    let script = r#"
import os, sys
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake
path, date = sys.argv[1], sys.argv[2]
rows = DeltaTable(path).to_pyarrow_table()
rows = rows.filter(pc.equal(pc.cast(rows["event_date"], "string"), date)).slice(0, 1)
assert rows.num_rows == 1, date
write_deltalake(path, rows, mode="append")
sys.stdout.flush()
os._exit(0)
"#;
    let out = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(lake.table_path("events"))
        .arg(date)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
}

/// A staged cascade whose root was published alone (what a crash between nodes leaves), then
/// changed again by another writer where a child reads it: publishing the cascade refuses the
/// child (exit 4, naming the parent and its version) instead of publishing a child computed from
/// replaced rows. A change of the parent outside what the child reads does not stop it, and
/// running the cascade again leaves every table consistent with its parent.
#[test]
fn issue_33_publish_cascade_checks_each_childs_parents() {
    for (inside, day) in [(true, 3), (false, 8)] {
        let lake = TestLake::new();
        add_rolling(&lake);
        let before = versions(&lake);
        let staged = json_ok(&cascade(
            &lake,
            3,
            4,
            &["--stage-only", "--output-format", "json"],
        ));
        let id = staged["cascade_id"].as_str().unwrap().to_string();
        let root_run = staged["nodes"][0]["run_id"].as_str().unwrap().to_string();
        json_ok(&lake.run(&["publish", &root_run, "--output-format", "json"]));
        append_event_copy(&lake, &lake.day(day));
        let events_now = lake.version("events");
        let out = lake.run(&["publish", &id, "--output-format", "json"]);
        if inside {
            assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
            let err = stderr(&out);
            assert!(
                err.contains("`daily_revenue` of cascade")
                    && err.contains(&format!("(version {events_now})"))
                    && err.contains("--cascade`"),
                "{err}"
            );
            assert_eq!(
                versions(&lake)[1..],
                before[1..],
                "no child published from replaced rows"
            );
            // Running the cascade again recomputes the children from events as it is now.
            let report = json_ok(&cascade(&lake, 3, 4, &["--output-format", "json"]));
            assert_eq!(report["outcome"], "published", "{report:#}");
        } else {
            let published = json_ok(&out);
            assert_eq!(published["outcome"], "published", "{published:#}");
            assert_eq!(
                versions(&lake)[1..],
                before[1..].iter().map(|v| v + 1).collect::<Vec<_>>()
            );
        }
        // Every table equals a recompute from its parent where the cascade wrote it.
        let (d0, d1) = (lake.day(3), lake.day(4));
        let revenue = rows(
            &lake,
            &["daily_revenue"],
            &format!(
                "SELECT CAST(event_date AS VARCHAR), country, CAST(revenue_cents AS VARCHAR) \
                 FROM daily_revenue WHERE event_date BETWEEN DATE '{d0}' AND DATE '{d1}' ORDER BY 1, 2"
            ),
        );
        let expected = rows(
            &lake,
            &["events"],
            &format!(
                "SELECT CAST(event_date AS VARCHAR), country, CAST(r AS VARCHAR) FROM ( \
                   SELECT event_date, country, SUM(amount_cents) AS r FROM events \
                   WHERE event_date BETWEEN DATE '{d0}' AND DATE '{d1}' \
                   GROUP BY event_date, country) ORDER BY 1, 2"
            ),
        );
        assert_eq!(revenue, expected, "inside: {inside}");
    }
}

/// A published cascade cannot be discarded (it says to revert it instead), and reverting one of
/// its runs alone names the tables that still hold what the cascade computed from it.
#[test]
fn issue_33_discard_and_revert_of_part_of_a_published_cascade_say_what_they_leave() {
    let lake = TestLake::new();
    add_rolling(&lake);
    let report = json_ok(&cascade(&lake, 3, 4, &["--output-format", "json"]));
    assert_eq!(report["outcome"], "published", "{report:#}");
    let id = report["cascade_id"].as_str().unwrap().to_string();
    let published = versions(&lake);
    let out = lake.run(&["discard", &id]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!("lakefill revert {id}")),
        "{}",
        stderr(&out)
    );
    assert_eq!(versions(&lake), published, "nothing changed");
    let root = report["nodes"][0]["run_id"].as_str().unwrap().to_string();
    let reverted = json_ok(&lake.run(&[
        "revert",
        &root,
        "--reason",
        "undo the events fix only",
        "--output-format",
        "json",
    ]));
    let note = reverted["notes"][0].as_str().unwrap_or_default();
    assert!(
        note.contains("`daily_revenue`, `rolling_7d`")
            && note.contains(&format!("lakefill revert {id}")),
        "{reverted:#}"
    );
    let text = lake.run(&["revert", &id, "--reason", "undo the rest"]);
    assert!(text.status.success(), "{}", stderr(&text));
    assert_eq!(
        snapshot(&lake, None),
        snapshot(
            &lake,
            Some(&published.iter().map(|v| v - 1).collect::<Vec<_>>())
        ),
        "every table as before the cascade"
    );
}

/// The rules of a cascade node's table hold for the rows the cascade computes for it: a CHECK
/// constraint of `daily_revenue` that only the fixed sums break fails the cascade's validation
/// (exit 3) by name, and no table of the cascade is published (python `deltalake` checked every
/// existing row against the constraint when it added it).
#[test]
fn issue_33_a_cascade_node_keeps_its_tables_rules() {
    let lake = TestLake::new();
    add_rolling(&lake);
    let day = lake.day(3);
    // A sum the fix produces that the table does not hold yet.
    let fixed = rows(
        &lake,
        &["raw_events"],
        &format!(
            "SELECT CAST(r AS VARCHAR) FROM (SELECT country, SUM(amount_cents) AS r FROM raw_events \
             WHERE CAST(event_ts AS DATE) = DATE '{day}' GROUP BY country) ORDER BY 1"
        ),
    );
    let held: std::collections::BTreeSet<String> = rows(
        &lake,
        &["daily_revenue"],
        "SELECT CAST(revenue_cents AS VARCHAR) FROM daily_revenue",
    )
    .into_iter()
    .map(|r| r[0].clone())
    .collect();
    let value = fixed
        .iter()
        .map(|r| r[0].clone())
        .find(|v| !held.contains(v))
        .expect("the fix changes a sum");
    crate::support::python_script(
        "delta_tables.py",
        &[
            "add_constraint",
            lake.table_path("daily_revenue").to_str().unwrap(),
            "not_the_fixed_sum",
            &format!("revenue_cents <> {value}"),
        ],
    );
    let before = versions(&lake);
    let out = cascade(&lake, 3, 4, &["--output-format", "json"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("constraint not_the_fixed_sum"),
        "{}",
        stderr(&out)
    );
    assert_eq!(versions(&lake), before, "no table of the cascade published");
    // A cascade is never forced.
    let forced = cascade(&lake, 3, 4, &["--force-publish"]);
    assert_eq!(forced.status.code(), Some(2), "{}", stderr(&forced));
    assert_eq!(versions(&lake), before);
}

/// Turns `delta.enableDeletionVectors` on for `table` (the protocol takes the feature), as a team
/// does with `ALTER TABLE … SET TBLPROPERTIES`.
fn enable_deletion_vectors(lake: &TestLake, table: &str) {
    runtime()
        .block_on(
            lake.open(table)
                .set_tbl_properties()
                .with_properties(
                    [(
                        "delta.enableDeletionVectors".to_string(),
                        "true".to_string(),
                    )]
                    .into(),
                )
                .into_future(),
        )
        .expect("deletion vectors on");
}

/// What `rows` of `tests/cli/cascade_vectors.py` reads of `table` (at `version`): every row, by
/// python `deltalake`'s own engine, which applies deletion vectors.
fn python_rows(lake: &TestLake, table: &str, version: Option<u64>) -> serde_json::Value {
    let path = lake.table_path(table).display().to_string();
    let version = version.map(|v| v.to_string());
    let mut args = vec!["rows", path.as_str()];
    args.extend(version.as_deref());
    crate::support::python_json("cascade_vectors.py", &args)
}

/// A cascade whose tables take deletion vectors publishes each node by them where its fix changes
/// little of a partition, and a child reads a parent published so as the commit will leave it (the
/// parent's kept rows through their new vectors, and its written rows): each level read by python
/// `deltalake` equals DuckDB's recompute of it from the level above. Reverting the cascade puts
/// every table's rows back.
#[test]
fn a_cascade_publishes_by_deletion_vectors_where_its_tables_take_them() {
    let lake = TestLake::new();
    add_rolling(&lake);
    for table in ["events", "daily_revenue", "rolling_7d"] {
        enable_deletion_vectors(&lake, table);
    }
    // v1's dates with a cent more on DE events whose id is 2 mod 5: about 2.5% of an events
    // partition, one row of about 8 of a daily_revenue partition, every rolling_7d row.
    let v1 = std::fs::read_to_string(lake.path().join("sql/events/v1.sql")).unwrap();
    let v3 = v1
        .replacen(
            "  amount_cents,\n",
            "  amount_cents + CASE WHEN country = 'DE' AND event_id % 5 = 2 THEN 1 ELSE 0 END AS amount_cents,\n",
            1,
        )
        .replacen("*/", "[validate]\nkey = [\"event_id\"]\n*/", 1);
    assert_ne!(v3.matches("% 5 = 2").count(), 0);
    std::fs::write(lake.path().join("sql/events/v3.sql"), v3).unwrap();
    let before = versions(&lake);
    let tables = ["events", "daily_revenue", "rolling_7d"];
    let old_rows: Vec<_> = tables.iter().map(|t| python_rows(&lake, t, None)).collect();

    let report = json_ok(&cascade(&lake, 3, 4, &["--output-format", "json"]));
    assert_eq!(report["outcome"], "published", "{report:#}");
    assert_eq!(
        versions(&lake),
        before.iter().map(|v| v + 1).collect::<Vec<_>>()
    );
    let node = |table: &str| {
        report["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["table"] == table)
            .unwrap_or_else(|| panic!("no node of {table}: {report:#}"))
            .clone()
    };
    let (d3, d4) = (lake.day(3), lake.day(4));
    let cut = |table: &str| -> Vec<String> {
        node(table)["deletion_vectors"]["partitions"]
            .as_object()
            .unwrap_or_else(|| panic!("{table} not by vectors: {:#}", node(table)))
            .keys()
            .cloned()
            .collect()
    };
    assert_eq!(cut("events"), [d3.clone(), d4.clone()]);
    assert_eq!(
        cut("daily_revenue"),
        [d3, d4],
        "one country's row of each day"
    );
    let rolling = node("rolling_7d");
    assert!(
        rolling["deletion_vectors"]["partitions"]
            .as_object()
            .is_none_or(|p| p.is_empty()),
        "every rolling_7d row changes: rewritten, {rolling:#}"
    );

    // Each level, read by python `deltalake`, is DuckDB's recompute of it from the level above.
    let path = |t: &str| lake.table_path(t).display().to_string();
    let chain = crate::support::python_json(
        "cascade_vectors.py",
        &[
            "chain",
            &path("raw_events"),
            &path("events"),
            &path("daily_revenue"),
            &path("rolling_7d"),
            &lake.day(0),
            &lake.day(9),
            &lake.day(3),
            &lake.day(4),
        ],
    );
    for table in tables {
        let [missing, extra, rows] = [0, 1, 2].map(|i| chain[table][i].as_u64().unwrap());
        assert_eq!((missing, extra), (0, 0), "{table}: {chain}");
        assert!(rows > 0, "{table}: {chain}");
    }

    // Reverted, every table reads as before the cascade.
    let id = report["cascade_id"].as_str().unwrap();
    let reverted = json_ok(&lake.run(&["revert", id, "--output-format", "json"]));
    for node in reverted["nodes"].as_array().unwrap() {
        assert_eq!(node["outcome"], "reverted", "{reverted:#}");
    }
    for (table, old) in tables.iter().zip(&old_rows) {
        assert_eq!(&python_rows(&lake, table, None), old, "{table} reverted");
    }
}
