//! Secrets in storage options never show: not in output, logs, journals or commit metadata.

use std::process::Command;

use crate::support::{TestLake, files_under};

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
    ]);
    run(&["backfill", "events", "--from", &from, "--to", &to]);
    run(&["backfill", "events", "--from", &to, "--to", &from]);
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
