//! Secrets in storage options never show: not in output, logs, journals or commit metadata.

use std::process::Command;

use crate::support::{PARTIAL_FIX, TestLake, files_under};

const SECRET: &str = "pl4nted-S3CRET-9f8e7d";

#[test]
fn a_planted_secret_appears_nowhere() {
    let lake = TestLake::new();
    let toml = std::fs::read_to_string(lake.path().join("lakefill.toml")).unwrap();
    std::fs::write(
        lake.path().join("lakefill.toml"),
        format!(
            "[storage]\nAWS_SECRET_ACCESS_KEY = \"${{LAKEFILL_TEST_SECRET}}\"\nAWS_SESSION_TOKEN = \"{SECRET}-token\"\n\n{}",
            toml.replace("uri = \"lake/events\"", "uri = \"lake/events\"\nstorage = { AZURE_STORAGE_ACCOUNT_KEY = \"inline-secret-value-42\" }")
        ),
    )
    .unwrap();
    let (from, to) = (lake.day(1), lake.day(3));
    let mut outputs = String::new();
    let mut run = |args: &[&str]| {
        for verbosity in [None, Some("-vv")] {
            let mut command = Command::new(assert_cmd::cargo::cargo_bin("lakefill"));
            command
                .current_dir(lake.path())
                .env("LAKEFILL_TEST_SECRET", SECRET)
                .args(args);
            if let Some(v) = verbosity {
                command.arg(v);
            }
            let out = command.output().unwrap();
            outputs.push_str(&String::from_utf8_lossy(&out.stdout));
            outputs.push_str(&String::from_utf8_lossy(&out.stderr));
        }
    };
    run(&[
        "plan",
        "events",
        "--from",
        &from,
        "--to",
        &to,
        "--output-format",
        "json",
    ]);
    run(&[
        "backfill",
        "events",
        "--from",
        &from,
        "--to",
        &to,
        "--stage-only",
        "--output-format",
        "json",
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
    ]);
    run(&[
        "backfill",
        "events",
        "--from",
        &from,
        "--to",
        &to,
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
    ]);
    run(&[
        "backfill",
        "events",
        "--from",
        &to,
        "--to",
        &from,
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
    ]);
    run(&["runs"]);
    run(&["history", "events", "--output-format", "json"]);
    run(&["sql", "SELECT COUNT(*) FROM events"]);
    run(&["diff", "events", "--from-version", "0"]);
    run(&["gc", "events", "--dry-run"]);
    assert!(
        outputs.contains("published") && outputs.contains("error:"),
        "the commands ran"
    );
    for secret in [SECRET, "inline-secret-value-42"] {
        assert!(
            !outputs.contains(secret),
            "`{secret}` leaked into output:\n{outputs}"
        );
        // Journals, commit files (metadata) and every other file the runs wrote.
        for file in files_under(lake.path()) {
            if file.ends_with("lakefill.toml") {
                continue;
            }
            let bytes = std::fs::read(&file).unwrap();
            assert!(
                !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
                "`{secret}` leaked into {file}"
            );
        }
    }
}

/// Secrets that are not under a secret-named key still never show: credentials inside an
/// endpoint URL or a table uri, and a secret on a line of `lakefill.toml` that does not parse.
#[test]
fn secrets_in_urls_and_broken_toml_are_masked_by_value() {
    let lake = TestLake::new();
    let toml = std::fs::read_to_string(lake.path().join("lakefill.toml")).unwrap();
    let endpoint_password = "endpoint-pass-7781";
    let uri_password = "uri-pass-3312";
    std::fs::write(
        lake.path().join("lakefill.toml"),
        format!(
            "[storage]\nAWS_ENDPOINT_URL = \"http://endpoint-user:{endpoint_password}@127.0.0.1:1\"\n\n{toml}\n\
             [tables.remote]\nuri = \"s3://uri-user:{uri_password}@no-such-bucket/x\"\n\
             storage = {{ max_retries = \"0\", AWS_ALLOW_HTTP = \"true\" }}\n"
        ),
    )
    .unwrap();
    let (from, to) = (lake.day(1), lake.day(2));
    let mut outputs = String::new();
    let mut run = |dir: &std::path::Path, args: &[&str]| {
        for verbosity in [None, Some("-vv")] {
            let mut command = Command::new(assert_cmd::cargo::cargo_bin("lakefill"));
            command.current_dir(dir).args(args);
            if let Some(v) = verbosity {
                command.arg(v);
            }
            let out = command.output().unwrap();
            outputs.push_str(&String::from_utf8_lossy(&out.stdout));
            outputs.push_str(&String::from_utf8_lossy(&out.stderr));
        }
    };
    run(
        lake.path(),
        &["plan", "events", "--from", &from, "--to", &to],
    );
    run(
        lake.path(),
        &[
            "plan",
            "events",
            "--from",
            &from,
            "--to",
            &to,
            "--output-format",
            "json",
        ],
    );
    run(
        lake.path(),
        &[
            "backfill",
            "events",
            "--from",
            &from,
            "--to",
            &to,
            "--allow-edge-moves",
            "--reason",
            PARTIAL_FIX,
        ],
    );
    run(lake.path(), &["runs", "remote"]);
    run(lake.path(), &["runs", "remote", "--output-format", "json"]);
    run(lake.path(), &["sql", "SELECT COUNT(*) FROM remote"]);
    // A project file that does not parse, with a secret on the offending line.
    let broken = tempfile::tempdir().unwrap();
    std::fs::write(
        broken.path().join("lakefill.toml"),
        "[storage]\nAWS_SECRET_ACCESS_KEY = \"toml-secret-5521\nAWS_REGION = \"x\"\n",
    )
    .unwrap();
    run(
        broken.path(),
        &["plan", "events", "--from", &from, "--to", &to],
    );
    assert!(
        outputs.contains("published") && outputs.contains("line 2"),
        "{outputs}"
    );
    for secret in [
        endpoint_password,
        uri_password,
        "endpoint-user",
        "uri-user",
        "toml-secret-5521",
    ] {
        assert!(
            !outputs.contains(secret),
            "`{secret}` leaked into output:\n{outputs}"
        );
        for file in files_under(lake.path()) {
            if file.ends_with("lakefill.toml") {
                continue;
            }
            let bytes = std::fs::read(&file).unwrap();
            assert!(
                !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
                "`{secret}` leaked into {file}"
            );
        }
    }
}

/// Text another writer (or a user) put in the log is printed safely: an escape sequence in a
/// reason shows escaped in text, and exactly in JSON.
#[test]
fn control_characters_from_the_log_are_shown_escaped() {
    let lake = TestLake::new();
    let reason = "fix \u{1b}[31mred\u{1b}[0m timezone";
    let out = Command::new(assert_cmd::cargo::cargo_bin("lakefill"))
        .current_dir(lake.path())
        .args([
            "backfill",
            "events",
            "--from",
            &lake.day(1),
            "--to",
            &lake.day(2),
            "--reason",
            reason,
            "--allow-edge-moves",
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = Command::new(assert_cmd::cargo::cargo_bin("lakefill"))
        .current_dir(lake.path())
        .args(["history", "events"])
        .output()
        .unwrap();
    assert!(!text.stdout.contains(&0x1b), "no raw escape in text output");
    assert!(String::from_utf8_lossy(&text.stdout).contains("\\u{1b}[31mred"));
    let json = Command::new(assert_cmd::cargo::cargo_bin("lakefill"))
        .current_dir(lake.path())
        .args(["history", "events", "--output-format", "json"])
        .output()
        .unwrap();
    let entries: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(entries[0]["reason"], reason, "JSON keeps the text exact");
}
