//! Bad input: each case exits with its code, names what is wrong, hints, and changes nothing.

use crate::support::{TestLake, run_in, stderr};

struct Case {
    name: &'static str,
    /// A model file `sql/events/v3.sql` to write, if any.
    model: Option<&'static str>,
    /// Replaces `lakefill.toml`, if given.
    project: Option<&'static str>,
    /// Arguments; `FROM`/`TO` are replaced with the range.
    args: &'static [&'static str],
    code: i32,
    message: &'static str,
}

const HEADER: &str = "target = \"events\"\npartition_by = \"event_date\"\n[sources.raw_events]\nwindow = \"ingest_date\"\n";

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let lake = TestLake::new();
    let original_toml = std::fs::read_to_string(lake.path().join("lakefill.toml")).unwrap();
    let not_delta = lake.path().join("lake/not_delta");
    std::fs::create_dir_all(&not_delta).unwrap();
    let v2 = std::fs::read_to_string(lake.path().join("sql/events/v2.sql")).unwrap();
    let v2_body = v2.split("*/").nth(1).unwrap().to_string();
    let leaked = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };

    let cases = vec![
        Case {
            name: "bad toml",
            model: None,
            project: Some("[tables.events\nuri = "),
            args: &["backfill", "events", "--from", "FROM", "--to", "TO"],
            code: 2,
            message: "invalid project file",
        },
        Case {
            name: "unknown table",
            model: Some(leaked(
                "/*\ntarget = \"nope\"\npartition_by = \"event_date\"\n*/\nSELECT 1".to_string(),
            )),
            project: None,
            args: &["backfill", "events", "--from", "FROM", "--to", "TO"],
            code: 2,
            message: "unknown table `nope`",
        },
        Case {
            name: "missing partition_by",
            model: Some(leaked(format!(
                "/*\ntarget = \"events\"\n[sources.raw_events]\n*/{v2_body}"
            ))),
            project: None,
            args: &["backfill", "events", "--from", "FROM", "--to", "TO"],
            code: 2,
            message: "the header sets no `partition_by`",
        },
        Case {
            name: "sql does not parse",
            model: Some(leaked(format!(
                "/*\n{HEADER}*/\nSELEC event_id FROM raw_events"
            ))),
            project: None,
            args: &["backfill", "events", "--from", "FROM", "--to", "TO"],
            code: 2,
            message: "does not parse",
        },
        Case {
            name: "ddl",
            model: Some(leaked(format!("/*\n{HEADER}*/\nDROP TABLE raw_events"))),
            project: None,
            args: &["backfill", "events", "--from", "FROM", "--to", "TO"],
            code: 2,
            message: "DROP TABLE statements are not allowed",
        },
        Case {
            name: "dml",
            model: Some(leaked(format!(
                "/*\n{HEADER}*/\nINSERT INTO raw_events SELECT * FROM raw_events"
            ))),
            project: None,
            args: &["backfill", "events", "--from", "FROM", "--to", "TO"],
            code: 2,
            message: "not allowed",
        },
        Case {
            name: "copy",
            model: Some(leaked(format!(
                "/*\n{HEADER}*/\nCOPY raw_events TO '/tmp/lakefill-copy.parquet'"
            ))),
            project: None,
            args: &["backfill", "events", "--from", "FROM", "--to", "TO"],
            code: 2,
            message: "COPY statements are not allowed",
        },
        Case {
            name: "undeclared source",
            model: Some(leaked(format!(
                "/*\n{HEADER}*/\nSELECT e.* FROM raw_events e JOIN daily_revenue d ON e.country = d.country"
            ))),
            project: None,
            args: &["backfill", "events", "--from", "FROM", "--to", "TO"],
            code: 2,
            message: "reads `daily_revenue`, which the header does not declare",
        },
        Case {
            name: "a path instead of a table",
            model: Some(leaked(format!(
                "/*\n{HEADER}*/\nSELECT * FROM '/etc/passwd'"
            ))),
            project: None,
            args: &["backfill", "events", "--from", "FROM", "--to", "TO"],
            code: 2,
            message: "which the header does not declare",
        },
        Case {
            name: "missing column",
            model: Some(leaked(format!(
                "/*\n{HEADER}*/\nSELECT no_such_column FROM raw_events"
            ))),
            project: None,
            args: &["backfill", "events", "--from", "FROM", "--to", "TO"],
            code: 2,
            message: "cannot be planned",
        },
        Case {
            name: "from after to",
            model: None,
            project: None,
            args: &["backfill", "events", "--from", "TO", "--to", "FROM"],
            code: 2,
            message: "is after",
        },
        Case {
            name: "range is not dates",
            model: None,
            project: None,
            args: &["plan", "events", "--from", "last-monday", "--to", "TO"],
            code: 2,
            message: "`--from last-monday` is not a date",
        },
        Case {
            name: "unknown model",
            model: None,
            project: None,
            args: &["backfill", "evnts", "--from", "FROM", "--to", "TO"],
            code: 2,
            message: "unknown model `evnts`",
        },
        Case {
            name: "unknown model version",
            model: None,
            project: None,
            args: &[
                "backfill",
                "events",
                "--from",
                "FROM",
                "--to",
                "TO",
                "--model-version",
                "v9",
            ],
            code: 2,
            message: "no version `v9`",
        },
        Case {
            name: "target is not a delta table",
            model: None,
            project: Some(
                "[tables.raw_events]\nuri = \"lake/raw_events\"\n[tables.events]\nuri = \"lake/not_delta\"\n[tables.daily_revenue]\nuri = \"lake/daily_revenue\"\n",
            ),
            args: &["backfill", "events", "--from", "FROM", "--to", "TO"],
            code: 1,
            message: "is not a Delta table",
        },
        Case {
            name: "schema mismatch",
            model: Some(leaked(format!(
                "/*\n{HEADER}*/\nSELECT event_id, CAST(user_id AS VARCHAR) AS user_id, country, event_ts, \
                 CAST(event_ts AS DATE) AS event_date, 1 AS extra FROM raw_events"
            ))),
            project: None,
            args: &["backfill", "events", "--from", "FROM", "--to", "TO"],
            code: 2,
            message: "missing column `amount_cents`",
        },
    ];

    let (from, to) = (lake.day(2), lake.day(4));
    let version = lake.version("events");
    let files = lake.files("events");
    for case in cases {
        if let Some(model) = case.model {
            std::fs::write(lake.path().join("sql/events/v3.sql"), model).unwrap();
        }
        if let Some(project) = case.project {
            std::fs::write(lake.path().join("lakefill.toml"), project).unwrap();
        }
        let args: Vec<&str> = case
            .args
            .iter()
            .map(|a| match *a {
                "FROM" => from.as_str(),
                "TO" => to.as_str(),
                other => other,
            })
            .collect();
        let out = run_in(lake.path(), &args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(case.code), "{}: {err}", case.name);
        assert!(
            err.contains(case.message),
            "{}: expected `{}` in:\n{err}",
            case.name,
            case.message
        );
        assert!(err.contains("error: "), "{}: {err}", case.name);
        assert!(
            err.contains("\nhint: "),
            "{}: no hint in:\n{err}",
            case.name
        );
        assert!(
            out.stdout.is_empty(),
            "{}: results on stdout for a failure",
            case.name
        );
        assert_eq!(
            lake.version("events"),
            version,
            "{}: the table moved",
            case.name
        );
        assert_eq!(lake.files("events"), files, "{}: files changed", case.name);

        let _ = std::fs::remove_file(lake.path().join("sql/events/v3.sql"));
        std::fs::write(lake.path().join("lakefill.toml"), &original_toml).unwrap();
    }
    assert!(
        !walk_contains(&lake.table_path("events"), "lakefill-events-v3"),
        "no staged file of a refused model"
    );
}

#[test]
fn schema_mismatch_names_each_column() {
    let lake = TestLake::new();
    std::fs::write(
        lake.path().join("sql/events/v3.sql"),
        format!(
            "/*\n{HEADER}*/\nSELECT event_id, CAST(user_id AS VARCHAR) AS user_id, country, event_ts, \
             CAST(event_ts AS DATE) AS event_date, 1 AS extra FROM raw_events"
        ),
    )
    .unwrap();
    let out = lake.run(&[
        "backfill",
        "events",
        "--from",
        &lake.day(1),
        "--to",
        &lake.day(2),
    ]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("column `user_id`: the model produces Utf8"),
        "{err}"
    );
    assert!(err.contains("missing column `amount_cents`"), "{err}");
    assert!(err.contains("extra column `extra`"), "{err}");
    // Nothing reached the log, and no journal entry says otherwise.
    let table = lake.open("events");
    let history = crate::support::runtime()
        .block_on(async {
            use futures::TryStreamExt;
            table.history(None).try_collect::<Vec<_>>().await
        })
        .unwrap();
    assert!(history.iter().all(|c| {
        c.info
            .get("lakefill")
            .is_none_or(|m| m["model_version"] != "v3")
    }));
}

fn walk_contains(dir: &std::path::Path, needle: &str) -> bool {
    std::fs::read_dir(dir).unwrap().flatten().any(|entry| {
        let path = entry.path();
        path.display().to_string().contains(needle)
            || (path.is_dir() && walk_contains(&path, needle))
    })
}

/// A bad input prepared on a fresh lake: returns the command to run.
type Setup = fn(&TestLake) -> Vec<String>;

fn backfill(lake: &TestLake, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "backfill",
        "events",
        "--from",
        &lake.day(2),
        "--to",
        &lake.day(4),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

fn run_id(lake: &TestLake) -> String {
    let plan = crate::support::json_ok(&lake.run(&[
        "plan",
        "events",
        "--from",
        &lake.day(2),
        "--to",
        &lake.day(4),
        "--output-format",
        "json",
    ]));
    plan["run_id"].as_str().unwrap().to_string()
}

#[test]
fn faulty_inputs_are_refused_and_change_nothing() {
    let cases: Vec<(&str, Setup, i32, &str)> = vec![
        (
            "corrupted parquet in a source partition",
            |lake| {
                let partition = lake
                    .table_path("raw_events")
                    .join(format!("ingest_date={}", lake.day(3)));
                for file in std::fs::read_dir(partition).unwrap().flatten() {
                    std::fs::write(file.path(), b"PAR1 garbage").unwrap();
                }
                backfill(lake, &[])
            },
            1,
            "Parquet error",
        ),
        (
            "a source version whose files were vacuumed",
            |lake| {
                // daily_revenue reads events; pin events at version 1, then vacuum it away.
                json_ok_quiet(
                    lake,
                    &[
                        "backfill",
                        "events",
                        "--from",
                        &lake.day(0),
                        "--to",
                        &lake.day(9),
                    ],
                );
                crate::support::vacuum_now(lake, "events");
                [
                    "backfill",
                    "daily_revenue",
                    "--from",
                    &lake.day(2),
                    "--to",
                    &lake.day(4),
                    "--source-version",
                    "events=1",
                ]
                .iter()
                .map(|s| s.to_string())
                .collect()
            },
            1,
            "vacuumed",
        ),
        (
            "a target that does not exist",
            |lake| {
                let toml = std::fs::read_to_string(lake.path().join("lakefill.toml")).unwrap();
                std::fs::write(
                    lake.path().join("lakefill.toml"),
                    toml.replace("lake/events", "lake/nowhere"),
                )
                .unwrap();
                backfill(lake, &[])
            },
            1,
            "is not a Delta table",
        ),
        (
            "a source whose schema changed",
            |lake| {
                let toml = std::fs::read_to_string(lake.path().join("lakefill.toml")).unwrap();
                // raw_events now points at a table without `amount_cents` (a copy: two tables
                // never share a location).
                lakefill_fixtures::copy_dir(
                    &lake.path().join("lake/daily_revenue"),
                    &lake.path().join("lake/revenue_copy"),
                )
                .unwrap();
                std::fs::write(
                    lake.path().join("lakefill.toml"),
                    toml.replace("lake/raw_events", "lake/revenue_copy"),
                )
                .unwrap();
                backfill(lake, &[])
            },
            2,
            "source `raw_events` has no column `ingest_date`",
        ),
        (
            "an empty range",
            |lake| {
                let _ = lake;
                ["plan", "events", "--from", "", "--to", "2026-01-02"]
                    .iter()
                    .map(|s| s.to_string())
                    .collect()
            },
            2,
            "is not a date",
        ),
        (
            "a write error while staging",
            |lake| {
                // A file where the run's staging directory must go.
                let blocker = lake
                    .table_path("events")
                    .join(format!("event_date={}", lake.day(3)))
                    .join(format!("lakefill-{}", run_id(lake)));
                std::fs::write(blocker, b"in the way").unwrap();
                backfill(lake, &[])
            },
            1,
            "cannot write staged files for partition",
        ),
        (
            "a truncated journal",
            |lake| {
                let journal = lake
                    .table_path("events")
                    .join("_lakefill/runs")
                    .join(format!("{}.json", run_id(lake)));
                std::fs::write(journal, b"{\"format\": 1, \"run_id\": \"ev").unwrap();
                backfill(lake, &[])
            },
            1,
            "is unreadable",
        ),
        (
            "a journal written by a newer lakefill",
            |lake| {
                let id = run_id(lake);
                let out = lake.run(&[
                    "backfill",
                    "events",
                    "--from",
                    &lake.day(2),
                    "--to",
                    &lake.day(4),
                    "--stage-only",
                    "--allow-edge-moves",
                    "--reason",
                    crate::support::PARTIAL_FIX,
                ]);
                assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
                let path = lake
                    .table_path("events")
                    .join("_lakefill/runs")
                    .join(format!("{id}.json"));
                let mut journal: serde_json::Value =
                    serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
                journal["format"] = 99.into();
                std::fs::write(path, serde_json::to_vec(&journal).unwrap()).unwrap();
                vec!["publish".into(), id]
            },
            1,
            "written by a newer lakefill",
        ),
    ];
    for (name, setup, code, message) in cases {
        let lake = TestLake::new();
        let args = setup(&lake);
        let version = lake.version("events");
        let files = lake.files("events");
        let revenue = lake.version("daily_revenue");
        let out = lake.run(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(code), "{name}: {err}");
        assert!(
            err.contains(message),
            "{name}: expected `{message}` in:\n{err}"
        );
        assert!(err.contains("\nhint: "), "{name}: no hint in:\n{err}");
        assert_eq!(lake.version("events"), version, "{name}: events moved");
        assert_eq!(lake.files("events"), files, "{name}: events files changed");
        assert_eq!(
            lake.version("daily_revenue"),
            revenue,
            "{name}: daily_revenue moved"
        );
    }
}

fn json_ok_quiet(lake: &TestLake, args: &[&str]) {
    let out = lake.run(args);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}
