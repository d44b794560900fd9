//! `lakefill report` and `--report FILE`: the report a person reads, as HTML (self-contained,
//! rendered by a real headless Chromium), Markdown (snapshot) and JSON (numbers checked against
//! an independent count of the table).

use std::process::Command;

use crate::support::{PARTIAL_FIX, TestLake, json_ok, stderr};

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
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
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
    // The HTML keeps its shape too (the browser test above renders it).
    let html = lake.run(&["report", &run_id, "--format", "html"]);
    assert!(html.status.success(), "{}", stderr(&html));
    insta::assert_snapshot!(
        "report_html",
        String::from_utf8_lossy(&html.stdout).replace(&run_id, "[run]")
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
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
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
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
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

/// `report CASCADE_ID`: one document for every table of a cascade, in the order they publish;
/// each table's rows as plain DataFusion counts them at the version the cascade published, the
/// verdict over all of them first, and the HTML as self-contained as a run's and rendered by a
/// browser.
#[test]
fn a_cascade_gets_one_report_of_every_table() {
    let lake = TestLake::new();
    let run = json_ok(&lake.run(&[
        "backfill",
        "events",
        "--from",
        &lake.day(2),
        "--to",
        &lake.day(4),
        "--cascade",
        "--output-format",
        "json",
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
    ]));
    let cascade = run["cascade_id"].as_str().unwrap().to_string();
    let report = json_ok(&lake.run(&["report", &cascade, "--format", "json"]));
    assert_eq!(report["schema"], "lakefill.cascade-report/v1", "{report}");
    assert_eq!(report["verdict"]["status"], "passed", "{report}");
    let nodes = report["nodes"].as_array().unwrap();
    let runs = run["nodes"].as_array().unwrap();
    assert!(
        nodes.len() >= 2,
        "a fix and what is computed from it: {report}"
    );
    assert_eq!(nodes.len(), runs.len());
    for ((node, ran), full) in nodes
        .iter()
        .zip(runs)
        .zip(report["reports"].as_array().unwrap())
    {
        assert_eq!(node["run_id"], ran["run_id"], "in publishing order");
        assert_eq!(full["run_id"], ran["run_id"]);
        let table = node["table"].as_str().unwrap();
        let version = node["published_version"].as_u64().unwrap();
        assert_eq!(
            lake.version(table),
            version,
            "{table}: nothing wrote it since"
        );
        let (from, to) = (
            full["range"][0].as_str().unwrap(),
            full["range"][1].as_str().unwrap(),
        );
        let counted = lake.query(
            &[(table, lake.open_version(table, version))],
            &format!(
                "SELECT CAST(COUNT(*) AS VARCHAR) FROM {table} \
                 WHERE event_date BETWEEN DATE '{from}' AND DATE '{to}'"
            ),
        );
        assert_eq!(
            node["new_rows"].as_u64().unwrap().to_string(),
            counted[0][0],
            "{table}: rows of {from}..={to}"
        );
    }
    let commands: Vec<&str> = report["commands"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["command"].as_str().unwrap())
        .collect();
    assert!(
        commands.contains(&format!("lakefill revert {cascade}").as_str()),
        "{commands:?}"
    );

    let markdown = lake.run(&["report", &cascade, "--format", "md"]);
    assert!(markdown.status.success(), "{}", stderr(&markdown));
    let markdown = String::from_utf8_lossy(&markdown.stdout);
    assert!(
        markdown.starts_with(&format!("# Cascade `{cascade}`: **PASSED**")),
        "{markdown}"
    );
    for node in nodes {
        let heading = format!("## {}: ", node["table"].as_str().unwrap());
        assert!(markdown.contains(&heading), "{heading}: {markdown}");
    }

    let file = lake.path().join("cascade.html");
    let out = lake.run(&["report", &cascade, "--out", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let html = std::fs::read_to_string(&file).unwrap();
    for forbidden in [
        "<script", " src=", "href=", "url(", "@import", "<link", "<iframe",
    ] {
        assert!(!html.contains(forbidden), "self-contained: {forbidden}");
    }
    let dom = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--dump-dom",
            &format!("file://{}", file.display()),
        ])
        .output()
        .unwrap();
    let dom = String::from_utf8_lossy(&dom.stdout);
    assert!(dom.contains("id=\"verdict\""), "{dom}");
    for node in nodes {
        let table = node["table"].as_str().unwrap();
        assert!(dom.contains(&format!("id=\"table-{table}\"")), "{table}");
        assert!(dom.contains(&format!("id=\"verdict-{table}\"")), "{table}");
    }
}

/// A reason is the user's text, shown and never acted on: in the Markdown report (printed on
/// stdout and written by `--report`) its terminal escapes, line breaks, raw HTML and links are
/// escaped. An independent CommonMark renderer (markdown-it-py, tables on) finds no tag, link or
/// extra table row of the reason in it.
#[test]
fn issue_33_the_markdown_report_escapes_a_hostile_reason() {
    let lake = TestLake::new();
    let reason = "fix \u{1b}[31mred\u{1b}[0m tz\n# Heading\n| a | b |\n<a href=\"javascript:alert(1)\">x</a> \
                  [click](javascript:alert(2)) <script>alert(3)</script> **bold** `tick`";
    let file = lake.path().join("hostile.md");
    let run = json_ok(&lake.run(&[
        "backfill",
        "events",
        "--from",
        &lake.day(2),
        "--to",
        &lake.day(3),
        "--stage-only",
        "--allow-edge-moves",
        "--reason",
        reason,
        "--report",
        file.to_str().unwrap(),
        "--output-format",
        "json",
    ]));
    let run_id = run["run_id"].as_str().unwrap();
    let printed = lake.run(&["report", run_id, "--format", "md"]);
    assert!(printed.status.success(), "{}", stderr(&printed));
    for markdown in [
        String::from_utf8_lossy(&printed.stdout).to_string(),
        std::fs::read_to_string(&file).unwrap(),
    ] {
        assert!(!markdown.contains('\u{1b}'), "no raw escape: {markdown}");
        assert!(markdown.contains("\\u{1b}\\[31mred"), "{markdown}");
        let reason_line = markdown
            .lines()
            .find(|l| l.starts_with("| reason |"))
            .unwrap_or_else(|| panic!("one line holds the reason: {markdown}"));
        assert!(reason_line.contains("Heading"), "{reason_line}");
        let rendered = Command::new("python3")
            .args([
                "-c",
                "import sys\nfrom markdown_it import MarkdownIt\n\
                 print(MarkdownIt('commonmark').enable('table').render(sys.stdin.read()))",
            ])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut child| {
                use std::io::Write as _;
                child.stdin.take().unwrap().write_all(markdown.as_bytes())?;
                child.wait_with_output()
            })
            .unwrap();
        assert!(rendered.status.success(), "{}", stderr(&rendered));
        let html = String::from_utf8(rendered.stdout).unwrap();
        for forbidden in [
            "<a ",
            "<script",
            "javascript:alert(1)\">",
            "<h1>Heading",
            "<strong>bold",
            "<code>tick",
        ] {
            assert!(!html.contains(forbidden), "{forbidden} in {html}");
        }
        assert!(
            html.contains("&lt;script&gt;alert(3)"),
            "shown as text: {html}"
        );
        // The reason stays in its one table cell: the run's table keeps its rows.
        let rows = html.matches("<tr>").count();
        let cells_of_reason = html
            .split("<tr>")
            .find(|row| row.contains("reason"))
            .map(|row| row.matches("<td>").count());
        assert_eq!(cells_of_reason, Some(2), "{html}");
        assert!(rows >= 5, "{html}");
    }
}
