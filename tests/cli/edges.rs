//! Keys that cross the edges of a partial fix (#32), as a generated matrix: a shift bug early or
//! late by one or two partitions, of days or months, fixed over a range at the table's start, in
//! its middle and at its end. Each lake and every expectation comes from `edges.py` (python
//! `deltalake` and plain python over the rows), never from lakefill.

use std::path::Path;

use serde_json::Value;

use crate::support::{json_ok, run_in, stderr, stdout};

fn python(args: &[&str]) -> Value {
    crate::support::python_json("edges.py", args)
}

/// The labels of partitions `n` and `m` of the lake (0 = its first).
fn labels(grain: &str, n: i64, m: i64) -> (String, String) {
    let label = |n: i64| {
        let start = chrono::NaiveDate::from_ymd_opt(2024, 1, 1).unwrap();
        if grain == "day" {
            (start + chrono::TimeDelta::days(n)).to_string()
        } else {
            let month = start
                .checked_add_months(chrono::Months::new(u32::try_from(n).unwrap()))
                .unwrap();
            month.format("%Y-%m").to_string()
        }
    };
    (label(n), label(m))
}

/// What the `edges` check reported, per kind: outside partition -> keys.
/// The `edges` check of a run's report.
fn edge_check(report: &Value) -> &Value {
    report["validation"]["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "edges")
        .unwrap_or_else(|| panic!("no edges check: {report}"))
}

fn reported(report: &Value, kind: &str) -> Value {
    let check = edge_check(report);
    let mut out = serde_json::Map::new();
    for failure in check["failures"].as_array().unwrap() {
        if let Some(n) = failure[kind].as_u64() {
            out.insert(failure["outside"].as_str().unwrap().to_string(), n.into());
        }
    }
    Value::Object(out)
}

/// The `commitInfo` of the latest commit of `events`, read from the log's JSON.
fn last_commit_info(dir: &Path) -> Value {
    crate::support::last_commit_info(&dir.join("lake/events/_delta_log"))
}

fn suggested(report: &Value) -> (String, String) {
    let check = edge_check(report);
    let found = check["failures"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f.get("suggested_from").is_some())
        .unwrap_or_else(|| panic!("no suggestion: {check}"));
    assert_eq!(found["complete"], true, "{check}");
    (
        found["suggested_from"].as_str().unwrap().to_string(),
        found["suggested_to"].as_str().unwrap().to_string(),
    )
}

/// One shift: ranges at the table's start, middle and end (partitions 0..=11 hold data).
fn shift_case(grain: &str, shift: i64) {
    for (first, last) in [(0, 3), (4, 7), (8, 11)] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_str().unwrap();
        let (from, to) = labels(grain, first, last);
        let case = format!("{grain} shift {shift}, fix {from}..={to}");
        let expected = python(&["make", path, grain, &shift.to_string(), &from, &to]);
        let before = python(&["rows", path]);
        let output = run_in(
            dir.path(),
            &[
                "backfill",
                "events",
                "--from",
                &from,
                "--to",
                &to,
                "--output-format",
                "json",
            ],
        );
        let clean = (expected["duplicated"].as_object().unwrap().is_empty()
            && expected["moved"].as_object().unwrap().is_empty())
        .then_some(());
        let report: Value = serde_json::from_slice(&output.stdout)
            .unwrap_or_else(|_| panic!("{case}: {}\n{}", stdout(&output), stderr(&output)));
        if clean.is_some() {
            assert_eq!(output.status.code(), Some(0), "{case}: {report}");
            continue;
        }
        // Keys cross: the run fails (exit 3), says which and where, and publishes nothing.
        assert_eq!(output.status.code(), Some(3), "{case}: {report}");
        assert_eq!(
            reported(&report, "duplicated"),
            expected["duplicated"],
            "{case}"
        );
        assert_eq!(reported(&report, "moved"), expected["moved"], "{case}");
        assert_eq!(python(&["rows", path]), before, "{case}: the table changed");
        let (clean_from, clean_to) = suggested(&report);
        assert_eq!(
            [clean_from.as_str(), clean_to.as_str()],
            [
                expected["clean"][0].as_str().unwrap(),
                expected["clean"][1].as_str().unwrap()
            ],
            "{case}"
        );
        assert!(
            stderr(&output).contains(&format!("--from {clean_from} --to {clean_to}")),
            "{case}: {}",
            stderr(&output)
        );
        // The suggested range is clean: it publishes, every event once, in its true partition
        // inside the range and untouched outside.
        let fixed = json_ok(&run_in(
            dir.path(),
            &[
                "backfill",
                "events",
                "--from",
                &clean_from,
                "--to",
                &clean_to,
                "--output-format",
                "json",
            ],
        ));
        assert_eq!(fixed["state"], "published", "{case}: {fixed}");
        assert_eq!(python(&["rows", path]), expected["after_clean"], "{case}");
        // Nothing crossed: the commit records no edge moves, and the header's reason.
        let info = last_commit_info(dir.path());
        assert_eq!(
            info["lakefill"]["reason"],
            format!("every event in its true {grain}")
        );
        assert!(
            info["lakefill"].get("edge_moves").is_none(),
            "{case}: {info}"
        );
    }
}

macro_rules! shifts {
    ($($name:ident: $grain:literal, $shift:literal;)*) => {
        $(
            #[test]
            fn $name() {
                shift_case($grain, $shift);
            }
        )*
    };
}

shifts! {
    issue_32_day_early_by_one: "day", -1;
    issue_32_day_late_by_one: "day", 1;
    issue_32_day_early_by_two: "day", -2;
    issue_32_day_late_by_two: "day", 2;
    issue_32_month_early_by_one: "month", -1;
    issue_32_month_late_by_one: "month", 1;
    issue_32_month_early_by_two: "month", -2;
    issue_32_month_late_by_two: "month", 2;
}

/// `--allow-edge-moves` publishes what the check found, and the commit says so: the duplicates
/// and losses are exactly the ones reported.
#[test]
fn issue_32_allowed_edge_moves_are_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_str().unwrap();
    let expected = python(&["make", path, "day", "1", "2024-01-05", "2024-01-08"]);
    let before = python(&["rows", path]);
    let refused = run_in(
        dir.path(),
        &[
            "backfill",
            "events",
            "--from",
            "2024-01-05",
            "--to",
            "2024-01-08",
            "--allow-edge-moves",
        ],
    );
    assert_eq!(
        refused.status.code(),
        Some(2),
        "--reason is required: {}",
        stderr(&refused)
    );
    let report = json_ok(&run_in(
        dir.path(),
        &[
            "backfill",
            "events",
            "--from",
            "2024-01-05",
            "--to",
            "2024-01-08",
            "--allow-edge-moves",
            "--reason",
            "the days around are fixed by another job",
            "--output-format",
            "json",
        ],
    ));
    assert_eq!(report["state"], "published", "{report}");
    // Late by one: keys of 01-04's first third belong in 01-04 but sit in 01-05 (removed from
    // the range, written outside: lost), and 01-08's sit in 01-09 (written twice).
    let duplicated: u64 = expected["duplicated"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    let moved: u64 = expected["moved"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert!(duplicated > 0 && moved > 0, "{expected}");
    let after = python(&["rows", path]);
    let count = |rows: &Value| rows.as_array().unwrap().len() as u64;
    assert_eq!(count(&after), count(&before) + duplicated - moved);
    let info = last_commit_info(dir.path());
    let moves = &info["lakefill"]["edge_moves"];
    assert_eq!(moves["duplicated"], duplicated, "{info}");
    assert_eq!(moves["moved"], moved, "{info}");
    assert_eq!(moves["reason"], "the days around are fixed by another job");
}

/// The demo shows a week of the fix refused at its edges before it fixes the whole history; the
/// week's run publishes nothing.
#[test]
fn issue_32_the_demo_refuses_a_week_of_the_fix_at_its_edges() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_in(
        dir.path(),
        &[
            "demo",
            "--dir",
            "demo",
            "--days",
            "10",
            "--events-per-day",
            "150",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("refused at its edges")
            && text.contains("FAIL edges")
            && text.contains("--from 2026-01-01 --to 2026-01-10"),
        "{text}"
    );
    let history = json_ok(&run_in(
        &dir.path().join("demo"),
        &["history", "events", "--output-format", "json"],
    ));
    assert_eq!(
        history.as_array().unwrap().len(),
        3,
        "create, v1, v2: {history}"
    );
    let runs = json_ok(&run_in(
        &dir.path().join("demo"),
        &["runs", "events", "--output-format", "json"],
    ));
    assert!(runs.to_string().contains("discarded"), "{runs}");
}
