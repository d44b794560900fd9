//! Output a user can trust (issue #19): every error names what went wrong and a next step that
//! fits its cause, limits are refused up front, and `init` and `completions` work.

use std::process::Output;

use crate::support::{TestLake, json_ok, run_in, stderr};

/// A scenario: a name, a command (after its setup), and the exit code it must give.
type Scenario = (&'static str, fn(&TestLake) -> Vec<String>, i32);

fn args(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn write_model(lake: &TestLake, name: &str, text: &str) {
    let dir = lake.path().join("sql").join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("v1.sql"), text).unwrap();
}

const EVENTS_HEADER: &str = "/*\ntarget = \"events\"\npartition_by = \"event_date\"\n[sources.raw_events]\nwindow = \"ingest_date\"\n*/\n";

fn scenarios() -> Vec<Scenario> {
    vec![
        (
            "unknown model",
            |l| args(&["plan", "nope", "--from", &l.day(1), "--to", &l.day(2)]),
            2,
        ),
        (
            "unknown model version",
            |l| {
                args(&[
                    "plan",
                    "events",
                    "--from",
                    &l.day(1),
                    "--to",
                    &l.day(2),
                    "--model-version",
                    "v9",
                ])
            },
            2,
        ),
        (
            "unknown table in sql",
            |_| args(&["sql", "SELECT * FROM nope"]),
            2,
        ),
        (
            "unknown column in sql",
            |_| args(&["sql", "SELECT nope FROM events"]),
            2,
        ),
        (
            "a version that does not exist",
            |_| args(&["sql", "SELECT COUNT(*) FROM \"events@99\""]),
            2,
        ),
        (
            "a time before the first commit",
            |_| {
                args(&[
                    "sql",
                    "SELECT COUNT(*) FROM \"events@1999-01-01T00:00:00Z\"",
                ])
            },
            2,
        ),
        (
            "write statement in sql",
            |_| args(&["sql", "DELETE FROM events"]),
            2,
        ),
        (
            "reversed range",
            |l| args(&["plan", "events", "--from", &l.day(5), "--to", &l.day(1)]),
            2,
        ),
        (
            "not a date",
            |l| args(&["plan", "events", "--from", "soon", "--to", &l.day(1)]),
            2,
        ),
        (
            "too many partitions",
            |_| {
                args(&[
                    "plan",
                    "events",
                    "--from",
                    "2000-01-01",
                    "--to",
                    "2030-12-31",
                ])
            },
            2,
        ),
        (
            "a range past any calendar",
            |_| {
                args(&[
                    "plan",
                    "events",
                    "--from",
                    "0001-01-01",
                    "--to",
                    "9999-12-31",
                    "--max-partitions",
                    "99999999",
                ])
            },
            2,
        ),
        (
            "bad source pin",
            |l| {
                args(&[
                    "plan",
                    "events",
                    "--from",
                    &l.day(1),
                    "--to",
                    &l.day(2),
                    "--source-version",
                    "raw_events",
                ])
            },
            2,
        ),
        (
            "unknown run",
            |_| args(&["publish", "events-v2-000000000000"]),
            2,
        ),
        (
            "check naming a missing column",
            |l| {
                write_model(
                l,
                "checked",
                &(EVENTS_HEADER.replace(
                    "*/\n",
                    "[[validate.checks]]\nname = \"positive\"\nsql = \"SELECT * FROM output WHERE no_such_column < 0\"\n*/\n",
                ) + "SELECT event_id, user_id, country, amount_cents, event_ts, CAST(event_ts AS DATE) AS event_date FROM raw_events WHERE CAST(event_ts AS DATE) BETWEEN $start AND $end\n"),
            );
                args(&[
                    "backfill",
                    "checked",
                    "--from",
                    &l.day(1),
                    "--to",
                    &l.day(2),
                ])
            },
            2,
        ),
        (
            "a model missing a column",
            |l| {
                write_model(
                    l,
                    "narrow",
                    &format!(
                        "{EVENTS_HEADER}SELECT event_id, CAST(event_ts AS DATE) AS event_date FROM raw_events\n"
                    ),
                );
                args(&["plan", "narrow", "--from", &l.day(1), "--to", &l.day(2)])
            },
            2,
        ),
        (
            "a window on a column without times",
            |l| {
                write_model(
                    l,
                    "by_country",
                    "/*\ntarget = \"events\"\npartition_by = \"event_date\"\n[sources.raw_events]\nwindow = \"country\"\n*/\nSELECT event_id, user_id, country, amount_cents, event_ts, CAST(event_ts AS DATE) AS event_date FROM raw_events\n",
                );
                args(&["plan", "by_country", "--from", &l.day(1), "--to", &l.day(2)])
            },
            2,
        ),
        (
            "spill outside the range",
            |l| {
                write_model(
                    l,
                    "spilly",
                    &format!(
                        "{EVENTS_HEADER}SELECT event_id, user_id, country, amount_cents, event_ts, CAST(event_ts AS DATE) AS event_date FROM raw_events\n"
                    ),
                );
                args(&["backfill", "spilly", "--from", &l.day(3), "--to", &l.day(3)])
            },
            1,
        ),
        ("an empty query", |_| args(&["sql", ""]), 2),
    ]
}

/// Replaces what changes from run to run (temporary paths, run ids, hashes, times).
fn normalized(lake: &TestLake, text: &str) -> String {
    let mut out = text.replace(&lake.path().display().to_string(), "[PROJECT]");
    for (pattern, replacement) in [
        (r"[0-9a-f]{64}", "[SHA256]"),
        (r"-[0-9a-f]{12}\b", "-[RUN]"),
        (
            r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(\+00:00|Z)",
            "[TIME]",
        ),
        (
            r"(?m)^caused by: .*(Valid fields are|Schema error).*$",
            "caused by: [DATAFUSION]",
        ),
    ] {
        out = regex_lite::Regex::new(pattern)
            .unwrap()
            .replace_all(&out, replacement)
            .into_owned();
    }
    out
}

#[test]
fn every_error_names_its_cause_and_a_next_step_that_fits_it() {
    let mut report = String::new();
    for (name, setup, code) in scenarios() {
        let lake = TestLake::new();
        let command = setup(&lake);
        let version = lake.version("events");
        let out: Output = lake.run(&command.iter().map(String::as_str).collect::<Vec<_>>());
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(code), "{name}: {err}");
        assert!(
            err.starts_with("error: ") || err.contains("\nerror: "),
            "{name}: {err}"
        );
        assert!(err.contains("\nhint: "), "{name}: no hint:\n{err}");
        let hint = err.split("\nhint: ").nth(1).unwrap_or_default();
        // Hints fit their cause: no vacuum advice, and `sql` never sends users to backfill flags.
        assert!(!hint.contains("vacuum"), "{name}: {err}");
        if command[0] == "sql" {
            assert!(!hint.contains("--"), "{name}: {err}");
        }
        assert!(err.len() < 2_000, "{name}: the message is short:\n{err}");
        assert_eq!(lake.version("events"), version, "{name}: nothing changed");
        report.push_str(&format!(
            "== {name}: lakefill {}\nexit {code}\n{}\n",
            command.join(" "),
            normalized(&lake, &err)
        ));
    }
    insta::assert_snapshot!("errors_and_hints", report);
}

#[test]
fn limits_are_refused_up_front_and_never_crash() {
    let lake = TestLake::new();
    // A 20,000-item IN list plans and runs on a stack large enough for it.
    let list: Vec<String> = (0..20_000).map(|i| i.to_string()).collect();
    let query = format!(
        "SELECT COUNT(*) FROM events WHERE event_id IN ({})",
        list.join(",")
    );
    let out = lake.run(&["sql", &query]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // Deep nesting is refused by the parser, quoting only the start of the query.
    let deep = format!("SELECT {}1{}", "(".repeat(3_000), ")".repeat(3_000));
    let out = lake.run(&["sql", &deep]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).len() < 2_000, "{}", stderr(&out));
    // Zero counts are usage errors.
    for flag in ["--max-partitions", "--batch-partitions"] {
        let out = lake.run(&[
            "plan",
            "events",
            "--from",
            &lake.day(1),
            "--to",
            &lake.day(2),
            flag,
            "0",
        ]);
        assert_eq!(out.status.code(), Some(2), "{flag}: {}", stderr(&out));
    }
    // A long range is fine once asked for.
    let plan = json_ok(&lake.run(&[
        "plan",
        "events",
        "--from",
        "2000-01-01",
        "--to",
        "2030-12-31",
        "--max-partitions",
        "20000",
        "--output-format",
        "json",
    ]));
    assert_eq!(plan["partitions"].as_array().unwrap().len(), 11_323);
}

#[test]
fn init_writes_a_project_whose_identity_backfills_are_up_to_date() {
    let lake = TestLake::new();
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("shop");
    let table = |name: &str| format!("{name}={}", lake.table_path(name).display());
    let out = run_in(
        dir.path(),
        &[
            "init",
            "shop",
            "--table",
            &table("events"),
            "--table",
            &table("raw_events"),
            "--table",
            &table("daily_revenue"),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    for file in [
        "lakefill.toml",
        "sql/events/identity.sql",
        "sql/raw_events/identity.sql",
    ] {
        assert!(project.join(file).is_file(), "{file}");
    }
    for model in ["events", "raw_events", "daily_revenue"] {
        let before = lake.version(model);
        let report = json_ok(&run_in(
            &project,
            &[
                "backfill",
                model,
                "--from",
                &lake.day(1),
                "--to",
                &lake.day(3),
                "--output-format",
                "json",
            ],
        ));
        assert_eq!(report["outcome"], "up_to_date", "{model}: {report}");
        assert_eq!(lake.version(model), before, "{model}: nothing published");
    }
    let again = run_in(dir.path(), &["init", "shop"]);
    assert_eq!(again.status.code(), Some(2), "{}", stderr(&again));
    assert!(
        stderr(&again).contains("already exists"),
        "{}",
        stderr(&again)
    );
    for shell in ["bash", "zsh", "fish"] {
        let out = run_in(dir.path(), &["completions", shell]);
        assert_eq!(out.status.code(), Some(0), "{shell}");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("backfill"),
            "{shell}"
        );
    }
}

#[test]
fn issue_33_init_never_overwrites_a_model() {
    let lake = TestLake::new();
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("shop");
    let model = project.join("sql/events/identity.sql");
    std::fs::create_dir_all(model.parent().unwrap()).unwrap();
    std::fs::write(&model, "-- the user's own work\nSELECT 1\n").unwrap();
    let table = |name: &str| format!("{name}={}", lake.table_path(name).display());
    // A table that exists next to one whose model is already there: init writes nothing at all.
    let out = run_in(
        dir.path(),
        &[
            "init",
            "shop",
            "--table",
            &table("raw_events"),
            "--table",
            &table("events"),
        ],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("sql/events/identity.sql") && stderr(&out).contains("move"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        std::fs::read_to_string(&model).unwrap(),
        "-- the user's own work\nSELECT 1\n"
    );
    assert!(!project.join("lakefill.toml").exists());
    assert!(!project.join("sql/raw_events").exists());
    // A table that cannot be opened leaves no project behind either.
    let missing = dir.path().join("nowhere");
    let out = run_in(
        dir.path(),
        &[
            "init",
            "shop",
            "--table",
            &format!("ghost={}", missing.display()),
        ],
    );
    assert_ne!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!project.join("lakefill.toml").exists());
    assert!(!project.join("sql/ghost").exists());
}

/// A header's enumerated values (`schema`, `grain`, `publish`) are checked when the model is
/// loaded: a typo is named with the values that exist, never read as the default.
#[test]
fn header_values_are_checked_when_the_model_is_loaded() {
    let lake = TestLake::new();
    for (line, named) in [
        (
            "schema = \"add-column\"",
            "`schema = \"add-column\"` is not a schema mode",
        ),
        ("grain = \"days\"", "`grain = \"days\"` is not a grain"),
        (
            "publish = \"adjustment\"",
            "`adjustment` is not a way to publish",
        ),
    ] {
        write_model(
            &lake,
            "typo",
            &(EVENTS_HEADER.replace("partition_by", &format!("{line}\npartition_by"))
                + "SELECT event_id, user_id, country, amount_cents, event_ts, CAST(event_ts AS DATE) AS event_date FROM raw_events\n"),
        );
        let out = lake.run(&["plan", "typo", "--from", &lake.day(1), "--to", &lake.day(2)]);
        assert_eq!(out.status.code(), Some(2), "{line}: {}", stderr(&out));
        assert!(stderr(&out).contains(named), "{line}: {}", stderr(&out));
        assert!(stderr(&out).contains("hint: "), "{line}: {}", stderr(&out));
    }
}
