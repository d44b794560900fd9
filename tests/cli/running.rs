//! Models that read their own past (#32): a running total recomputed after another writer
//! corrected one period of its input must carry the change into every later period, each period
//! reading the one before as the run computed it. Over day and month grains; tables and
//! expectations from `running.py` (python `deltalake` and plain python), never from lakefill.

use serde_json::Value;

use crate::support::{json_ok, run_in, stderr, stdout};

fn python(args: &[&str]) -> String {
    crate::support::python_script("running.py", args)
}

fn rows(path: &str, what: &str) -> Value {
    serde_json::from_str(&python(&[what, path])).unwrap()
}

/// `(first, corrected, short, last)` partition labels of the grain.
fn labels(grain: &str) -> [&'static str; 4] {
    match grain {
        "day" => ["2024-01-01", "2024-01-05", "2024-01-08", "2024-01-12"],
        _ => ["2024-01", "2024-05", "2024-08", "2024-12"],
    }
}

fn running_total(grain: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_str().unwrap();
    python(&["make", path, grain]);
    let [_, corrected, short, last] = labels(grain);
    // Another writer corrects one period of the input.
    let day = if grain == "day" {
        corrected.to_string()
    } else {
        format!("{corrected}-01")
    };
    python(&["correct", path, &day]);
    let stale = rows(path, "rows");
    let expected = rows(path, "expect");
    assert_ne!(stale, expected, "the correction makes the totals stale");

    // A range short of the table's end is refused by name, with the range to run.
    let out = run_in(
        dir.path(),
        &[
            "backfill",
            "running",
            "--from",
            corrected,
            "--to",
            short,
            "--model-version",
            "v1",
        ],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!(
            "lakefill backfill running --from {corrected} --to {last}"
        )),
        "{}",
        stderr(&out)
    );
    assert_eq!(rows(path, "rows"), stale, "a refused run changes nothing");

    // `plan` says how the run is staged.
    let plan = run_in(
        dir.path(),
        &[
            "plan",
            "running",
            "--from",
            corrected,
            "--to",
            last,
            "--model-version",
            "v1",
        ],
    );
    assert!(
        stdout(&plan).contains("reads its own past"),
        "{}",
        stdout(&plan)
    );

    let fix_rest = || {
        json_ok(&run_in(
            dir.path(),
            &[
                "backfill",
                "running",
                "--from",
                corrected,
                "--to",
                last,
                "--model-version",
                "v1",
                "--output-format",
                "json",
            ],
        ))
    };
    // Killed while staging the fifth period: the same command resumes from the periods staged,
    // which the later ones read as the run left them.
    let killed = crate::support::lakefill_command(dir.path())
        .args([
            "backfill",
            "running",
            "--from",
            corrected,
            "--to",
            last,
            "--model-version",
            "v1",
        ])
        .env("LAKEFILL_FAILPOINTS", "stage-batch-4=abort")
        .output()
        .unwrap();
    assert_ne!(killed.status.code(), Some(0), "{}", stderr(&killed));
    assert_eq!(rows(path, "rows"), stale, "a killed run changes nothing");
    let report = fix_rest();
    assert_eq!(report["state"], "published", "{report}");
    // (The fourth may not be journaled yet when the fifth starts.)
    let resumed = report["resumed_batches"].as_u64().unwrap();
    assert!((3..=4).contains(&resumed), "{report}");
    // Every total from the corrected period on changed: 8 periods x 3 countries.
    assert_eq!(
        report["validation"]["comparison"]["totals"]["changed"], 24,
        "{report}"
    );
    assert_eq!(rows(path, "rows"), expected);

    // Running it again finds it up to date (each period reads the published one before it).
    let again = fix_rest();
    assert!(
        matches!(
            again["outcome"].as_str(),
            Some("up_to_date" | "already_published")
        ),
        "{again}"
    );

    // A model that reads its own future cannot be ordered: refused by name.
    let out = run_in(
        dir.path(),
        &[
            "plan",
            "running",
            "--from",
            corrected,
            "--to",
            last,
            "--model-version",
            "v2",
        ],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("reads its own future"),
        "{}",
        stderr(&out)
    );
}

/// In a cascade, a node that reads its own past is recomputed from the parents' first changed
/// partition through its last: events fixed on two days reach every later day of a running
/// total of daily revenue.
#[test]
fn issue_32_a_cascade_carries_a_fix_through_a_running_total_to_its_end() {
    let lake = crate::support::TestLake::new();
    let path = lake.path().to_str().unwrap();
    python(&["cumulative", path, "create"]);
    let (first, last) = (lake.day(0), lake.day(9));
    json_ok(&lake.run(&[
        "backfill",
        "cum_revenue",
        "--from",
        &first,
        "--to",
        &last,
        "--output-format",
        "json",
    ]));
    let cumulative = |what: &str| -> Value {
        serde_json::from_str(&python(&["cumulative", path, what])).unwrap()
    };
    assert_eq!(cumulative("rows"), cumulative("expect"));

    let report = json_ok(&lake.run(&[
        "backfill",
        "events",
        "--from",
        &lake.day(2),
        "--to",
        &lake.day(3),
        "--cascade",
        "--allow-edge-moves",
        "--reason",
        crate::support::PARTIAL_FIX,
        "--output-format",
        "json",
    ]));
    assert_eq!(report["outcome"], "published", "{report}");
    let node = report["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["model"] == "cum_revenue")
        .unwrap_or_else(|| panic!("no cum_revenue node: {report}"));
    assert_eq!(node["range"]["from"], lake.day(2), "{node}");
    assert_eq!(node["range"]["to"], last, "{node}");
    assert_eq!(cumulative("rows"), cumulative("expect"));
}

#[test]
fn issue_32_a_running_total_over_days_carries_a_correction_forward() {
    running_total("day");
}

#[test]
fn issue_32_a_running_total_over_months_carries_a_correction_forward() {
    running_total("month");
}
