//! The JSON documents of `--output-format json` are a stable contract (DESIGN §3): each one is
//! pinned by a snapshot, with only what differs between runs (times, durations, sizes of files
//! the Parquet writer compresses, file names with random parts, the lake's directory) redacted.
//! A change to a document's shape fails here and is reviewed with `cargo insta review`.

use serde_json::Value;

use crate::support::{PARTIAL_FIX, TestLake, json_ok, run_in};

/// Keys whose values change from run to run.
const VOLATILE: &[&str] = &[
    "timestamp",
    "created_at",
    "updated_at",
    "since",
    "stage_ms",
    "validate_ms",
    "publish_ms",
    "total_ms",
    "elapsed_ms",
    "edges_ms",
    "bytes",
    "total_bytes",
    "bytes_written",
    "size",
    "holder",
    "event_id",
    "occurred_at",
    // The built-in pool is a share of the machine's memory.
    "memory_limit",
];

/// The document with volatile values replaced and the lake's directory written `[lake]`.
fn normalized(value: &Value, lake: &str) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(key, value)| {
                    let value = if VOLATILE.contains(&key.as_str()) && !value.is_null() {
                        Value::String("[redacted]".into())
                    } else if key == "samples" {
                        samples(value)
                    } else {
                        normalized(value, lake)
                    };
                    (key.clone(), value)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(|v| normalized(v, lake)).collect()),
        Value::String(text) => Value::String(file_names(&text.replace(lake, "[lake]"))),
        other => other.clone(),
    }
}

/// Which rows a comparison samples depends on the order its partitions stream in; how many it
/// samples of each kind does not.
fn samples(value: &Value) -> Value {
    match value {
        Value::Object(kinds) => Value::Object(
            kinds
                .iter()
                .map(|(kind, rows)| {
                    let count = rows.as_array().map_or(0, Vec::len);
                    (kind.clone(), Value::from(vec!["[row]"; count]))
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Parquet file names carry a random part: `part-00000-<uuid>-c000.snappy.parquet` becomes
/// `part-[file].parquet`.
fn file_names(text: &str) -> String {
    let re = regex_lite::Regex::new(r"part-[0-9A-Za-z_.\-]+\.parquet").expect("regex");
    re.replace_all(text, "part-[file].parquet").into_owned()
}

/// Gives `events` a sink that appends its events to `notifications.jsonl`.
fn add_file_sink(lake: &TestLake) {
    let project_file = lake.path().join("lakefill.toml");
    let toml = std::fs::read_to_string(&project_file).expect("project");
    std::fs::write(
        &project_file,
        toml.replacen(
            "[tables.events]\n",
            "[tables.events]\nnotify = [\"file:notifications.jsonl\"]\n",
            1,
        ),
    )
    .expect("project");
}

#[test]
fn every_json_document_keeps_its_shape() {
    let lake = TestLake::new();
    let dir = lake.path().to_string_lossy().into_owned();
    let (from, to) = (lake.day(1), lake.day(3));
    let json = |args: &[&str]| {
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["--output-format", "json"]);
        normalized(&json_ok(&lake.run(&all)), &dir)
    };
    let document = |args: &[&str]| {
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["--output-format", "json"]);
        let output = lake.run(&all);
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        let value: Value = serde_json::from_str(&text).unwrap_or_else(|e| {
            panic!(
                "{args:?}: stdout is not one JSON document ({e}):\n{text}\n{}",
                String::from_utf8_lossy(&output.stderr)
            )
        });
        (output.status.code(), normalized(&value, &dir))
    };

    insta::assert_json_snapshot!(
        "plan",
        json(&["plan", "events", "--from", &from, "--to", &to])
    );
    insta::assert_json_snapshot!(
        "plan_cascade",
        json(&["plan", "events", "--from", &from, "--to", &to, "--cascade"])
    );
    let staged = json(&[
        "backfill",
        "events",
        "--from",
        &from,
        "--to",
        &to,
        "--stage-only",
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
    ]);
    let run_id = staged["run_id"].as_str().expect("run id").to_string();
    insta::assert_json_snapshot!("backfill_stage_only", staged);
    insta::assert_json_snapshot!("runs", json(&["runs"]));
    let read_version = lake.version("events").to_string();
    insta::assert_json_snapshot!(
        "diff_staged_run",
        json(&[
            "diff",
            "events",
            "--from-version",
            &read_version,
            "--run",
            &run_id
        ])
    );
    // A sink, so that publishing and reverting report their notifications.
    add_file_sink(&lake);
    insta::assert_json_snapshot!("publish", json(&["publish", &run_id]));
    insta::assert_json_snapshot!("history", json(&["history", "events", "--limit", "2"]));
    insta::assert_json_snapshot!("blame", json(&["blame", "events", "--partition", &from]));
    insta::assert_json_snapshot!(
        "sql",
        json(&[
            "sql",
            "SELECT event_date, count(*) AS n FROM events GROUP BY event_date ORDER BY event_date LIMIT 2",
        ])
    );
    let version = lake.version("events");
    insta::assert_json_snapshot!(
        "diff_versions",
        json(&[
            "diff",
            "events",
            "--from-version",
            &(version - 1).to_string(),
            "--to-version",
            &version.to_string(),
        ])
    );
    let other = lake.stage_events(4, 4);
    insta::assert_json_snapshot!("discard", json(&["discard", &other]));
    insta::assert_json_snapshot!("gc_dry_run", json(&["gc", "events", "--dry-run"]));
    insta::assert_json_snapshot!("revert", json(&["revert", &run_id]));
    insta::assert_json_snapshot!("notify", json(&["notify", "events"]));
    let events = std::fs::read_to_string(lake.path().join("notifications.jsonl")).expect("events");
    let events: Vec<Value> = events
        .lines()
        .map(|l| normalized(&serde_json::from_str(l).expect("event"), &dir))
        .collect();
    insta::assert_json_snapshot!("events", events);
    // `daily_revenue` read `events` before the fix and its revert changed days 1 to 3: stale
    // there (exit 5, after the document).
    let (code, stale) = document(&["stale", "daily_revenue"]);
    insta::assert_json_snapshot!("stale", (code, stale));

    // The main failure kinds: the error document on stdout, with its exit code.
    let (code, unknown_model) = document(&["plan", "nope", "--from", &from, "--to", &to]);
    insta::assert_json_snapshot!("error_unknown_model", (code, unknown_model));
    let (code, bad_range) = document(&["plan", "events", "--from", &to, "--to", &from]);
    insta::assert_json_snapshot!("error_reversed_range", (code, bad_range));
    let (code, unknown_run) = document(&["publish", "events-v9-000000000000"]);
    insta::assert_json_snapshot!("error_unknown_run", (code, unknown_run));
    let (code, discarded) = document(&["publish", &other]);
    insta::assert_json_snapshot!("error_publish_discarded", (code, discarded));

    let fresh = tempfile::tempdir().expect("tempdir");
    let init = json_ok(&run_in(fresh.path(), &["init", "--output-format", "json"]));
    insta::assert_json_snapshot!("init", normalized(&init, &fresh.path().to_string_lossy()));
}

/// The CLI reference in `docs/cli.md` is the binary's own help, command by command: a flag added,
/// renamed or described anew changes the docs in the same commit. With `LAKEFILL_UPDATE_DOCS=1`
/// the test writes the file instead of comparing.
#[test]
fn the_cli_reference_is_the_binarys_help() {
    let help = |args: &[&str]| -> String {
        let out = crate::support::lakefill_command(std::path::Path::new("."))
            .args(args)
            .arg("--help")
            .env("COLUMNS", "100")
            .env_remove("LAKEFILL_PROJECT")
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    // The commands a help lists under `Commands:` (but `help`).
    let commands = |text: &str| -> Vec<String> {
        text.lines()
            .skip_while(|l| !l.starts_with("Commands:"))
            .skip(1)
            .take_while(|l| !l.trim().is_empty())
            .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
            .filter_map(|l| l.split_whitespace().next().map(str::to_string))
            .filter(|c| c != "help")
            .collect()
    };
    let mut doc = String::from(
        "# CLI reference\n\nEvery command's help, as `lakefill COMMAND --help` prints it (the test \
         `the_cli_reference_is_the_binarys_help` keeps this file equal to it; \
         `LAKEFILL_UPDATE_DOCS=1 cargo test --workspace --test cli -- cli_reference` rewrites it). \
         What the commands do together is in the [guide](guide.md), the formats they read and \
         write in the [reference](reference.md).\n",
    );
    let top = help(&[]);
    let mut sections = vec![(String::from("lakefill"), top.clone())];
    for command in commands(&top) {
        let text = help(&[&command]);
        let nested = commands(&text);
        sections.push((format!("lakefill {command}"), text));
        for sub in nested {
            let text = help(&[&command, &sub]);
            sections.push((format!("lakefill {command} {sub}"), text));
        }
    }
    for (title, text) in sections {
        doc.push_str(&format!(
            "\n## `{title}`\n\n```text\n{}\n```\n",
            text.trim_end()
        ));
    }
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/cli.md");
    if std::env::var_os("LAKEFILL_UPDATE_DOCS").is_some() {
        std::fs::write(&path, &doc).unwrap();
    }
    let written = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        written == doc,
        "docs/cli.md is not the binary's help: run `LAKEFILL_UPDATE_DOCS=1 cargo test --workspace \
         --test cli -- cli_reference` and commit the file"
    );
}

/// What each command prints for people is pinned too, beside its JSON document: a change to a
/// command's text (a column, a word, a line) fails here and is reviewed with `cargo insta
/// review`. Only what differs between runs is redacted: times, durations, sizes, the lake's
/// directory, random file names and which rows are sampled.
#[test]
fn every_text_output_keeps_its_shape() {
    let lake = TestLake::new();
    let dir = lake.path().to_string_lossy().into_owned();
    let (from, to) = (lake.day(1), lake.day(3));
    let text = |args: &[&str]| -> String {
        let output = lake.run(args);
        assert!(
            output.status.success(),
            "{args:?}: {}",
            crate::support::stderr(&output)
        );
        String::from_utf8_lossy(&output.stdout).replace(&dir, "[lake]")
    };
    let mut settings = insta::Settings::clone_current();
    for (pattern, replacement) in [
        (
            r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(\.\d+)?( ?UTC|Z|[+-]\d{2}:?\d{2})?",
            "[time]",
        ),
        (r"\b\d+(\.\d+)? ?(B|KiB|MiB|GiB|TiB)\b", "[size]"),
        (r"\b\d+(\.\d+)? ?(ms|s)\b", "[duration]"),
        (r"part-[0-9A-Za-z_.\-]+\.parquet", "part-[file].parquet"),
        // Which rows a comparison samples depends on the order its partitions stream in; how
        // many of each kind it shows does not.
        (r"(?m)^    (added|removed|changed) +\{.*\}$", "    $1 [row]"),
    ] {
        settings.add_filter(pattern, replacement);
    }
    settings.bind(|| {
        insta::assert_snapshot!(
            "text_plan",
            text(&["plan", "events", "--from", &from, "--to", &to])
        );
        insta::assert_snapshot!(
            "text_plan_cascade",
            text(&["plan", "events", "--from", &from, "--to", &to, "--cascade"])
        );
        let staged = json_ok(&lake.run(&[
            "backfill",
            "events",
            "--from",
            &from,
            "--to",
            &to,
            "--stage-only",
            "--allow-edge-moves",
            "--reason",
            PARTIAL_FIX,
            "--output-format",
            "json",
        ]));
        let run_id = staged["run_id"].as_str().expect("run id").to_string();
        insta::assert_snapshot!("text_runs", text(&["runs"]));
        let read_version = lake.version("events").to_string();
        insta::assert_snapshot!(
            "text_diff_staged_run",
            text(&[
                "diff",
                "events",
                "--from-version",
                &read_version,
                "--run",
                &run_id
            ])
        );
        // A sink, so that publishing and reverting show their notifications.
        add_file_sink(&lake);
        insta::assert_snapshot!("text_publish", text(&["publish", &run_id]));
        insta::assert_snapshot!(
            "text_history",
            text(&["history", "events", "--limit", "2"])
        );
        insta::assert_snapshot!(
            "text_blame",
            text(&["blame", "events", "--partition", &from])
        );
        insta::assert_snapshot!(
            "text_sql",
            text(&[
                "sql",
                "SELECT event_date, count(*) AS n FROM events GROUP BY event_date ORDER BY event_date LIMIT 2",
            ])
        );
        let other = lake.stage_events(4, 4);
        insta::assert_snapshot!("text_discard", text(&["discard", &other]));
        insta::assert_snapshot!("text_gc_dry_run", text(&["gc", "events", "--dry-run"]));
        insta::assert_snapshot!("text_revert", text(&["revert", &run_id]));
        insta::assert_snapshot!("text_notify", text(&["notify", "events"]));
    });
}
