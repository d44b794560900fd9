//! `lakefill report` and `--report FILE`: the report a person reads, as HTML (self-contained,
//! rendered by a real headless Chromium), Markdown (snapshot) and JSON (numbers checked against
//! an independent count of the table).

use std::process::Command;

use crate::support::{TestLake, json_ok, stderr};

/// Counts rows per day of `events` at `version` with DataFusion.
fn rows_per_day(lake: &TestLake, version: u64) -> Vec<(String, u64)> {
    lake.query(
        &[("events", lake.open_version("events", version))],
        "SELECT CAST(event_date AS VARCHAR), COUNT(*) FROM events GROUP BY 1 ORDER BY 1",
    )
    .into_iter()
    .map(|r| (r[0].clone(), r[1].parse().unwrap()))
    .collect()
}

/// Debian's Chromium, which the test command installs.
fn chromium() -> String {
    ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|name| {
            Command::new(name)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .expect("Chromium is needed to render the HTML report: scripts/test.sh installs it (apt-get install chromium)")
        .to_string()
}

#[test]
fn the_html_report_is_self_contained_and_renders_in_a_browser() {
    let lake = TestLake::new();
    let report_file = lake.path().join("fix.html");
    let out = lake.run(&[
        "backfill",
        "events",
        "--from",
        &lake.day(1),
        "--to",
        &lake.day(8),
        "--report",
        report_file.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let html = std::fs::read_to_string(&report_file).unwrap();
    for forbidden in [
        "<script", " src=", "href=", "url(", "@import", "<link", "<iframe",
    ] {
        assert!(
            !html.contains(forbidden),
            "the report must need nothing else: {forbidden}"
        );
    }
    assert!(
        html.contains("PASSED") || html.contains(">passed<"),
        "verdict first"
    );
    assert!(html.contains("<svg"), "charts inline");
    assert!(html.contains("lakefill revert "), "how to undo");
    assert!(
        html.contains("v1.sql") && html.contains("v2.sql"),
        "the model diff"
    );

    // A real browser renders it without a console error, and shows the verdict.
    let browser = chromium();
    let url = format!("file://{}", report_file.display());
    let screenshot = lake.path().join("fix.png");
    let shot = Command::new(&browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--enable-logging=stderr",
            "--v=0",
            "--window-size=1100,2400",
            &format!("--screenshot={}", screenshot.display()),
            &url,
        ])
        .output()
        .unwrap();
    assert!(
        shot.status.success(),
        "{}",
        String::from_utf8_lossy(&shot.stderr)
    );
    let png = std::fs::read(&screenshot).expect("a screenshot");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "a real picture"
    );
    let log = String::from_utf8_lossy(&shot.stderr);
    assert!(
        !log.lines()
            .any(|l| l.contains("CONSOLE") || l.contains("Uncaught")),
        "console errors: {log}"
    );
    let dom = Command::new(&browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--dump-dom",
            &url,
        ])
        .output()
        .unwrap();
    let dom = String::from_utf8_lossy(&dom.stdout);
    assert!(dom.contains("id=\"verdict\""), "{dom}");
    assert!(dom.contains("Validation passed"), "{dom}");
}

#[test]
fn the_json_report_holds_the_tables_numbers_and_markdown_keeps_its_shape() {
    let lake = TestLake::new();
    let run_id = lake.stage_events(2, 4);
    let read = lake.version("events");
    let report = json_ok(&lake.run(&["report", &run_id, "--format", "json"]));
    assert_eq!(report["schema"], "lakefill.report/v1");
    assert_eq!(report["verdict"]["status"], "passed");
    let before = rows_per_day(&lake, read);
    for (p, day) in report["partitions"].as_array().unwrap().iter().zip(2..=4) {
        let day = lake.day(day);
        let old = before.iter().find(|(d, _)| *d == day).map_or(0, |r| r.1);
        assert_eq!(p["partition"], day.as_str());
        assert_eq!(p["old_rows"], old, "{p}");
        assert_eq!(p["new_rows"], 300, "the fixture's events per day");
    }
    assert_eq!(
        report["commands"][0]["command"],
        format!("lakefill publish {run_id}")
    );
    let markdown = lake.run(&["report", &run_id, "--format", "md"]);
    assert!(markdown.status.success(), "{}", stderr(&markdown));
    insta::assert_snapshot!(
        "report_markdown",
        String::from_utf8_lossy(&markdown.stdout).replace(&run_id, "[run]")
    );
}

#[test]
fn a_failed_run_still_gets_its_report_and_a_revert_reports_itself() {
    let lake = TestLake::new();
    std::fs::write(
        lake.path().join("sql/events/v3.sql"),
        "/*\ntarget = \"events\"\npartition_by = \"event_date\"\n[sources.raw_events]\nwindow = \"ingest_date\"\n\
         lookahead = 1\n[validate]\nkey = [\"event_id\"]\nmax_row_change = \"1%\"\n*/\n\
         SELECT event_id, user_id, country, amount_cents, event_ts, CAST(event_ts AS DATE) AS event_date \
         FROM raw_events WHERE CAST(event_ts AS DATE) BETWEEN $start AND $end AND event_id % 2 = 0",
    )
    .unwrap();
    let file = lake.path().join("failed.md");
    let out = lake.run(&[
        "backfill",
        "events",
        "--from",
        &lake.day(2),
        "--to",
        &lake.day(3),
        "--report",
        file.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let markdown = std::fs::read_to_string(&file).unwrap();
    assert!(markdown.contains("**FAILED**"), "{markdown}");
    assert!(
        markdown.contains("max_row_change"),
        "the threshold that decided: {markdown}"
    );

    let published = json_ok(&lake.run(&[
        "backfill",
        "events",
        "--model-version",
        "v2",
        "--from",
        &lake.day(5),
        "--to",
        &lake.day(5),
        "--output-format",
        "json",
    ]));
    let run_id = published["run_id"].as_str().unwrap();
    let revert = json_ok(&lake.run(&["revert", run_id, "--output-format", "json"]));
    let report = json_ok(&lake.run(&[
        "report",
        revert["run_id"].as_str().unwrap(),
        "--format",
        "json",
    ]));
    assert_eq!(report["verdict"]["status"], "reverted", "{report}");
    assert_eq!(report["revert_of"], run_id);
}
