//! Tables named through the AWS Glue Data Catalog (`uri = "glue://database/table"`), against
//! moto's Glue and S3 on loopback. Glue's entries are written by boto3 the way Athena and Spark
//! register Delta tables (`glue.py`); the tables themselves are read back by their S3 location,
//! not through lakefill.

use std::time::{Duration, Instant};

use crate::support::{
    PARTIAL_FIX, S3_SECRET, Store, TestLake, assert_refused, json_ok, python_script, s3_server,
    stderr, stdout,
};

/// A Glue database for `lake` (one per lake: moto's catalog is shared by the test binary).
fn database(lake: &TestLake) -> String {
    let bucket = lake.table_url("events").host_str().unwrap().to_string();
    bucket.replace('-', "_")
}

/// Registers `table` in Glue's `database` at `location`, as `kind` (see `glue.py`).
fn register(database: &str, table: &str, location: &str, kind: &str) {
    python_script(
        "glue.py",
        &[
            &s3_server().endpoint,
            "register",
            database,
            table,
            location,
            kind,
        ],
    );
}

/// Rewrites `lakefill.toml`: table `name` is at `uri`, and `[storage]` reaches Glue at
/// `glue_endpoint`.
fn name_through_glue(lake: &TestLake, tables: &[(&str, &str)], glue_endpoint: &str) {
    let path = lake.path().join("lakefill.toml");
    let mut text = std::fs::read_to_string(&path).unwrap();
    for (table, uri) in tables {
        let line = format!(
            "uri = \"{}\"",
            lake.table_url(table).as_str().trim_end_matches('/')
        );
        assert!(text.contains(&line), "{line} not in {text}");
        text = text.replacen(&line, &format!("uri = \"{uri}\""), 1);
    }
    let storage = "[storage]\n";
    text = match text.find("AWS_ENDPOINT_URL_GLUE") {
        Some(_) => text,
        None => text.replacen(
            storage,
            &format!("{storage}AWS_ENDPOINT_URL_GLUE = \"{glue_endpoint}\"\n"),
            1,
        ),
    };
    std::fs::write(path, text).unwrap();
}

fn plan(lake: &TestLake) -> std::process::Output {
    lake.run(&[
        "plan",
        "events",
        "--from",
        &lake.day(0),
        "--to",
        &lake.day(3),
    ])
}

#[test]
fn tables_named_through_glue_backfill_at_the_location_glue_keeps() {
    let lake = TestLake::on(Store::S3);
    let db = database(&lake);
    let events = lake.table_url("events").to_string();
    let raw = lake.table_url("raw_events").to_string();
    // The target as Athena registers it; its source as Spark does (placeholder location, the
    // real one in the serde parameter `path`).
    register(&db, "events", &events, "athena");
    register(&db, "raw_events", raw.trim_end_matches('/'), "spark");
    name_through_glue(
        &lake,
        &[
            ("events", &format!("glue://{db}/events")),
            ("raw_events", &format!("glue://{db}/raw_events")),
        ],
        &s3_server().endpoint,
    );

    // `plan` shows the name and where it resolved to, in text and in JSON.
    let out = plan(&lake);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains(&format!("glue://{db}/events at {events}")),
        "{text}"
    );
    assert!(!text.contains(S3_SECRET), "{text}");
    let mut args = vec!["plan", "events", "--output-format", "json"];
    let (from, to) = (lake.day(0), lake.day(3));
    args.extend(["--from", &from, "--to", &to]);
    let document = json_ok(&lake.run(&args));
    assert_eq!(document["target_uri"], format!("glue://{db}/events"));
    assert_eq!(document["resolved_location"], events.as_str());

    // A backfill reads the source and publishes the target where Glue says: one commit in the
    // table at that location, read directly from S3.
    let before = lake.version("events");
    let report = json_ok(&lake.run(&[
        "backfill",
        "events",
        "--from",
        &from,
        "--to",
        &to,
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
        "--output-format",
        "json",
    ]));
    assert_eq!(report["outcome"], "published", "{report}");
    assert_eq!(lake.version("events"), before + 1);
    assert_eq!(report["published_version"], before + 1);
    let history = json_ok(&lake.run(&["history", "events", "--output-format", "json"]));
    assert!(history.to_string().contains(PARTIAL_FIX), "{history}");
}

#[test]
fn glue_failures_name_the_cause_and_change_nothing() {
    let lake = TestLake::on(Store::S3);
    let db = database(&lake);
    let events = lake.table_url("events").to_string();
    let before = lake.version("events");
    register(&db, "as_iceberg", &events, "iceberg");
    register(&db, "no_location", &events, "nolocation");
    register(&db, "events", &events, "athena");
    register(&db, "on_disk", "file:///tmp/lakefill-glue-events", "athena");
    let project = lake.path().join("lakefill.toml");
    let original = std::fs::read_to_string(&project).unwrap();
    // A port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let unreachable = format!("http://127.0.0.1:{closed}");
    let cases: Vec<(String, &str, i32, String)> = vec![
        (
            format!("glue://{db}/missing"),
            s3_server().endpoint.as_str(),
            1,
            format!("Glue has no table `missing` in database `{db}`"),
        ),
        (
            "glue://no_such_database/events".into(),
            s3_server().endpoint.as_str(),
            1,
            "Glue has no table `events` in database `no_such_database`".into(),
        ),
        (
            format!("glue://{db}/as_iceberg"),
            s3_server().endpoint.as_str(),
            1,
            "as an `iceberg` table, not a Delta table".into(),
        ),
        (
            format!("glue://{db}/no_location"),
            s3_server().endpoint.as_str(),
            1,
            "Glue keeps no location".into(),
        ),
        (
            format!("glue://{db}/on_disk"),
            s3_server().endpoint.as_str(),
            1,
            "is not on a store lakefill opens".into(),
        ),
        (
            format!("glue://{db}/events"),
            unreachable.as_str(),
            1,
            "the Glue endpoint did not answer".into(),
        ),
        (
            format!("glue://{db}"),
            s3_server().endpoint.as_str(),
            2,
            "glue://<database>/<table>".into(),
        ),
    ];
    for (uri, endpoint, code, message) in &cases {
        std::fs::write(&project, &original).unwrap();
        name_through_glue(&lake, &[("events", uri)], endpoint);
        let started = Instant::now();
        let out = plan(&lake);
        assert_refused(&out, *code, message);
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{uri}: {:?}",
            started.elapsed()
        );
        let err = stderr(&out);
        assert!(!err.contains(S3_SECRET), "{uri}: {err}");
        if *code == 1 {
            assert!(
                err.contains("tables.events"),
                "{uri}: the hint names the table: {err}"
            );
        }
        assert_eq!(lake.version("events"), before, "{uri}");
    }

    // Two names for one location are refused, as two paths to one location are.
    std::fs::write(&project, &original).unwrap();
    register(&db, "events_again", &events, "athena");
    name_through_glue(
        &lake,
        &[
            ("events", &format!("glue://{db}/events")),
            ("daily_revenue", &format!("glue://{db}/events_again")),
        ],
        &s3_server().endpoint,
    );
    let out = plan(&lake);
    assert_refused(&out, 2, "is the same as the location of");
    assert_eq!(lake.version("events"), before);
}
