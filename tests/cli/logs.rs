//! Other writers' logs, as lakefill meets them (#32): times `history` printed read back the
//! version it printed them for, a version the log no longer keeps, a damaged commit, a vacuumed
//! data file and a reader feature delta-rs cannot scan each get an error that says what is
//! wrong and a hint that fits, never a Rust backtrace. Tables are written by hand as the Delta
//! protocol says (`spark_tables.py`).

use std::path::Path;
use std::process::Output;

use crate::support::{json_ok, lakefill_command, stderr};

fn spark(args: &[&str]) {
    crate::support::python_script("spark_tables.py", args);
}

/// Runs the binary with `RUST_BACKTRACE=1`, as many users' shells set it.
fn run(dir: &Path, args: &[&str]) -> Output {
    lakefill_command(dir)
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap()
}

/// The error, its causes and its hint; asserts the exit code and that no backtrace leaked.
fn refused(out: &Output, code: i32) -> String {
    let text = stderr(out);
    assert_eq!(out.status.code(), Some(code), "{text}");
    assert!(
        !text.contains("   0: ") && !text.contains("rust_begin_unwind"),
        "a backtrace leaked: {text}"
    );
    text
}

fn project(kind: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    spark(&[kind, dir.path().to_str().unwrap()]);
    dir
}

#[test]
fn issue_32_times_history_prints_read_the_version_it_printed_them_for() {
    // Commit times 2026-01-01T00:0v:00Z in commitInfo; the log files' modification times are
    // today (delta-rs' own time travel goes by those).
    let dir = project("plain");
    let history = json_ok(&run(
        dir.path(),
        &["history", "t", "--output-format", "json"],
    ));
    let history = history.as_array().unwrap();
    assert_eq!(history.len(), 3);
    for entry in history {
        let (version, time) = (&entry["version"], entry["timestamp"].as_str().unwrap());
        let result = json_ok(&run(
            dir.path(),
            &[
                "sql",
                &format!("SELECT 1 FROM \"t@{time}\" LIMIT 0"),
                "--output-format",
                "json",
            ],
        ));
        assert_eq!(
            result["tables"][format!("t@{time}")],
            *version,
            "{time}: {result}"
        );
    }
    let before = refused(
        &run(
            dir.path(),
            &["sql", "SELECT 1 FROM \"t@2025-12-31T00:00:00Z\""],
        ),
        2,
    );
    assert!(before.contains("did not exist at"), "{before}");
}

/// A reader feature lakefill's Delta reader cannot scan (vacuumProtocolCheck), or does not know
/// at all (a feature of tomorrow's writers), is refused by name with the versions that still
/// read; never a location or credentials hint.
#[test]
fn issue_32_a_reader_feature_delta_rs_cannot_scan_is_refused_by_name() {
    for (kind, feature) in [
        ("vacuum_check", "vacuumProtocolCheck"),
        ("unknown_feature", "fancyNewFeature"),
    ] {
        let dir = project(kind);
        // Version 0 is from before the feature: it reads.
        let old = json_ok(&run(
            dir.path(),
            &[
                "sql",
                "SELECT SUM(id) AS s FROM \"t@0\"",
                "--output-format",
                "json",
            ],
        ));
        assert_eq!(old["rows"][0][0], "3", "{feature}: {old}");
        for command in [&["sql", "SELECT SUM(id) FROM t"][..], &["history", "t"]] {
            let out = run(dir.path(), command);
            if command[0] == "history" && out.status.success() {
                // History reads only the log, which a feature that is known to the kernel but
                // not scannable (vacuumProtocolCheck) does not change.
                continue;
            }
            let latest = refused(&out, 2);
            assert!(
                latest.contains(&format!("`{feature}`")) && latest.contains("\"t@N\""),
                "{feature} {command:?}: {latest}"
            );
            for wrong in ["Transaction failed", "credentials", "location"] {
                assert!(!latest.contains(wrong), "{feature} {command:?}: {latest}");
            }
        }
    }
}

#[test]
fn issue_32_a_version_the_log_no_longer_keeps_is_named_so() {
    let dir = project("cleaned");
    let out = refused(
        &run(dir.path(), &["sql", "SELECT COUNT(*) FROM \"t@1\""]),
        2,
    );
    assert!(
        out.contains("version 1 of `t` is no longer in its log")
            && out.contains("oldest version it can be read at is 4"),
        "{out}"
    );
    assert!(!out.contains("not a Delta table"), "{out}");
    let kept = json_ok(&run(
        dir.path(),
        &[
            "sql",
            "SELECT COUNT(*) AS n FROM \"t@4\"",
            "--output-format",
            "json",
        ],
    ));
    assert_eq!(kept["rows"][0][0], "5", "{kept}");
}

#[test]
fn issue_32_a_damaged_commit_and_a_vacuumed_file_get_hints_that_fit() {
    let dir = project("vacuum_check");
    // A data file of version 0 vacuumed away.
    let day = dir.path().join("lake/t/day=2026-01-01");
    for file in std::fs::read_dir(&day).unwrap().flatten() {
        std::fs::remove_file(file.path()).unwrap();
    }
    let gone = refused(&run(dir.path(), &["sql", "SELECT SUM(id) FROM \"t@0\""]), 1);
    assert!(gone.contains("vacuumed?"), "{gone}");
    assert!(!gone.contains("column names"), "{gone}");

    // A commit that does not parse.
    let commit = dir
        .path()
        .join("lake/t/_delta_log/00000000000000000001.json");
    let mut text = std::fs::read_to_string(&commit).unwrap();
    text.push_str("{\"add\": {\"path\": broken\n");
    std::fs::write(&commit, text).unwrap();
    let damaged = refused(&run(dir.path(), &["history", "t"]), 1);
    let sql = refused(&run(dir.path(), &["sql", "SELECT 1 FROM t"]), 1);
    for out in [damaged, sql] {
        assert!(out.contains("the Delta log of `t` is damaged"), "{out}");
        assert!(!out.contains("credentials"), "{out}");
    }
}
