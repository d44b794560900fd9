//! `lakefill stale` (#37): which published partitions no longer match their inputs. Another
//! writer (python `deltalake`, `stale.py`) changes `daily_revenue`; `revenue_7d` reads it with a
//! lookback of 6, so a change on one day makes that day and the six after it stale, and nothing
//! else.

use lakefill_fixtures::DemoLake;
use serde_json::Value;

use crate::support::{Store, TestLake, stderr};

fn lake() -> TestLake {
    TestLake::with(
        Store::Local,
        DemoLake {
            days: 14,
            events_per_day: 60,
            days_per_commit: 7,
            rolling: true,
            ..DemoLake::default()
        },
    )
}

fn change(lake: &TestLake, args: &[&str]) {
    let dir = lake.path().to_str().unwrap();
    let mut all = vec![args[0], dir];
    all.extend(&args[1..]);
    crate::support::python_script("stale.py", &all);
}

/// `stale revenue_7d` as JSON, with its exit code.
fn stale(lake: &TestLake) -> (Option<i32>, Value) {
    let out = lake.run(&["stale", "revenue_7d", "--output-format", "json"]);
    let code = out.status.code();
    let document: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", stderr(&out)));
    (code, document)
}

fn ranges(document: &Value, kind: &str) -> Vec<(String, String)> {
    document["tables"][0][kind]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["from"].as_str().unwrap().to_string(),
                r["to"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn late_rows_make_exactly_the_days_that_read_them_stale_until_refreshed() {
    let lake = lake();
    // `events` was written by v1 and `sql/events` holds a v2: outdated, with the command
    // that runs the newest (and, since other models read it, cascades).
    let out = lake.run(&["stale", "events", "--output-format", "json"]);
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    let events: Value = serde_json::from_slice(&out.stdout).unwrap();
    let outdated = &events["tables"][0]["outdated"];
    assert_eq!(outdated.as_array().unwrap().len(), 1, "{events:#}");
    assert_eq!(outdated[0]["model_version"], "v1");
    assert_eq!(outdated[0]["newest_version"], "v2");
    assert!(
        outdated[0]["command"]
            .as_str()
            .unwrap()
            .ends_with("--model-version v2 --cascade"),
        "{events:#}"
    );
    // `--cascade` follows the tables computed from `daily_revenue`.
    let out = lake.run(&[
        "stale",
        "daily_revenue",
        "--cascade",
        "--output-format",
        "json",
    ]);
    let followed: Value = serde_json::from_slice(&out.stdout).unwrap();
    let tables: Vec<&str> = followed["tables"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["table"].as_str().unwrap())
        .collect();
    assert_eq!(tables, ["daily_revenue", "revenue_7d"], "{}", stderr(&out));

    let (code, fresh) = stale(&lake);
    assert_eq!(code, Some(0), "{fresh:#}");
    assert_eq!(fresh["stale"], false);
    assert!(ranges(&fresh, "stale").is_empty(), "{fresh:#}");
    assert!(ranges(&fresh, "unknown").is_empty(), "{fresh:#}");

    // A compaction rewrites files without changing data: nothing is stale.
    change(&lake, &["optimize"]);
    let (code, compacted) = stale(&lake);
    assert_eq!(code, Some(0), "{compacted:#}");
    // The compacted files of `daily_revenue` are no longer in lakefill's run directories: its
    // lineage is unknown, which is reported, not counted as stale.
    let out = lake.run(&["stale", "daily_revenue", "--output-format", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let compacted: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        !compacted["tables"][0]["unknown"]
            .as_array()
            .unwrap()
            .is_empty(),
        "{compacted:#}"
    );

    // A late row on day 4 reaches days 4 to 10 through the lookback of 6.
    change(&lake, &["append", &lake.day(4)]);
    let (code, late) = stale(&lake);
    assert_eq!(code, Some(5), "{late:#}");
    assert_eq!(late["stale"], true);
    assert_eq!(
        ranges(&late, "stale"),
        [(lake.day(4), lake.day(10))],
        "{late:#}"
    );
    let range = &late["tables"][0]["stale"][0];
    assert_eq!(range["partitions"], 7);
    let changes = range["changes"].as_array().unwrap();
    assert_eq!(changes.len(), 1, "{range:#}");
    assert_eq!(changes[0]["table"], "daily_revenue");
    assert_eq!(changes[0]["operation"], "WRITE");
    assert_eq!(changes[0]["rows_added"], 1);
    let command = range["command"].as_str().unwrap();
    assert_eq!(
        command,
        format!(
            "lakefill backfill revenue_7d --from {} --to {}",
            lake.day(4),
            lake.day(10)
        )
    );
    let text = crate::support::stdout(&lake.run(&["stale", "revenue_7d"]));
    assert!(text.contains("daily_revenue version"), "{text}");
    assert!(text.contains(command), "{text}");

    // The command it gives refreshes exactly that: nothing is stale after it.
    let args: Vec<&str> = command.split(' ').skip(1).collect();
    let refreshed = lake.run(&args);
    assert!(refreshed.status.success(), "{}", stderr(&refreshed));
    let (code, after) = stale(&lake);
    assert_eq!(code, Some(0), "{after:#}");

    // A delete of day 12 makes days 12 to 13 (the last) stale.
    change(&lake, &["delete", &lake.day(12)]);
    let (code, deleted) = stale(&lake);
    assert_eq!(code, Some(5), "{deleted:#}");
    let last = ranges(&deleted, "stale");
    assert_eq!(last.len(), 1, "{deleted:#}");
    assert_eq!(last[0].0, lake.day(12), "{deleted:#}");
    let removed = &deleted["tables"][0]["stale"][0]["changes"][0];
    assert_eq!(removed["operation"], "DELETE", "{removed:#}");

    // `backfill --stale` runs exactly the stale ranges, one run each; then nothing is stale.
    let out = lake.run(&[
        "backfill",
        "revenue_7d",
        "--stale",
        "--output-format",
        "json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let ran: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        ran["ranges"],
        serde_json::json!([[last[0].0, last[0].1]]),
        "{ran:#}"
    );
    assert_eq!(ran["runs"].as_array().unwrap().len(), 1, "{ran:#}");
    assert_eq!(ran["runs"][0]["state"], "published", "{ran:#}");
    let (code, cleared) = stale(&lake);
    assert_eq!(code, Some(0), "{cleared:#}");
    // With nothing stale, it does nothing.
    let idle = lake.run(&[
        "backfill",
        "revenue_7d",
        "--stale",
        "--output-format",
        "json",
    ]);
    assert!(idle.status.success(), "{}", stderr(&idle));
    let idle: Value = serde_json::from_slice(&idle.stdout).unwrap();
    assert_eq!(idle["runs"], serde_json::json!([]), "{idle:#}");
}
