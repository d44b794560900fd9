//! Azure specifics, against Azurite on loopback: failures that name their cause (an endpoint
//! that does not answer, a container that does not exist, a key or account Azure refuses), SAS
//! tokens, ADLS Gen2 locations, and the demo. What every object store shares (racing writers,
//! secrets in no output or file) is in `s3`, run on both.

use std::net::TcpListener;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::{
    AZURE_ACCOUNT, AZURE_CONTAINER, AZURE_SECRET, PARTIAL_FIX, Store, TestLake, azure_server,
    json_ok, lakefill_command, stderr, stdout,
};

fn backfill(lake: &TestLake, extra: &[&str]) -> std::process::Output {
    let (from, to) = (lake.day(1), lake.day(2));
    let mut args = vec![
        "backfill",
        "events",
        "--from",
        &from,
        "--to",
        &to,
        "--allow-edge-moves",
        "--reason",
        PARTIAL_FIX,
    ];
    args.extend_from_slice(extra);
    lake.run(&args)
}

/// The project file of `lake` with every `from` replaced by `to`.
fn project_with(lake: &TestLake, from: &str, to: &str) -> String {
    let text = std::fs::read_to_string(lake.path().join("lakefill.toml")).unwrap();
    assert!(text.contains(from), "{from} not in lakefill.toml:\n{text}");
    text.replace(from, to)
}

#[test]
fn failures_name_the_endpoint_container_key_or_account_and_change_nothing() {
    let lake = TestLake::on(Store::Azure);
    let original = std::fs::read_to_string(lake.path().join("lakefill.toml")).unwrap();
    let before = lake.version("events");
    let closed = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let other_key = "b3RoZXIta2V5LXRoYXQtYXp1cml0ZS1kb2VzLW5vdC1rbm93";
    for (name, from, to, hint) in [
        (
            "emulator not reachable",
            azure_server().endpoint.clone(),
            format!("http://127.0.0.1:{closed}/{AZURE_ACCOUNT}"),
            "did not answer",
        ),
        (
            "missing container",
            format!("az://{AZURE_CONTAINER}/"),
            "az://no-such-container/".to_string(),
            "does not exist",
        ),
        (
            "wrong key",
            AZURE_SECRET.to_string(),
            other_key.to_string(),
            "refused the credentials",
        ),
        (
            "wrong account",
            format!("AZURE_STORAGE_ACCOUNT_NAME = \"{AZURE_ACCOUNT}\""),
            "AZURE_STORAGE_ACCOUNT_NAME = \"nosuchaccount\"".to_string(),
            "refused the credentials",
        ),
        (
            "no such account at the endpoint",
            azure_server().endpoint.clone(),
            azure_server()
                .endpoint
                .replace(AZURE_ACCOUNT, "nosuchaccount"),
            "no such account",
        ),
    ] {
        let edited = project_with(&lake, &from, &to);
        std::fs::write(lake.path().join("lakefill.toml"), edited).unwrap();
        let started = Instant::now();
        let out = backfill(&lake, &[]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{name}: {err}");
        assert!(err.contains("cannot open table"), "{name}: {err}");
        let shown = err
            .lines()
            .find(|l| l.starts_with("hint: "))
            .unwrap_or_else(|| panic!("{name}: no hint in {err}"));
        assert!(shown.contains(hint), "{name}: {shown}");
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{name}: bounded retries, not a hang"
        );
        assert!(
            !err.contains(AZURE_SECRET) && !err.contains(other_key),
            "{name}: a key shows: {err}"
        );
        std::fs::write(lake.path().join("lakefill.toml"), &original).unwrap();
    }
    assert_eq!(lake.version("events"), before, "nothing was published");
    assert_eq!(backfill(&lake, &[]).status.code(), Some(0));
    assert_eq!(lake.version("events"), before + 1);
}

/// A SAS token for the test container, made with python's `azure-storage-blob` from the
/// account key: read, add, create, write, delete and list, for a day.
fn container_sas() -> String {
    let script = format!(
        "import datetime\n\
         from azure.storage.blob import generate_container_sas, ContainerSasPermissions\n\
         print(generate_container_sas('{AZURE_ACCOUNT}', '{AZURE_CONTAINER}', \
         account_key='{AZURE_SECRET}', \
         permission=ContainerSasPermissions(read=True, add=True, create=True, write=True, \
         delete=True, list=True), \
         expiry=datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=1)))\n"
    );
    let out = Command::new("python3")
        .args(["-c", &script])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

#[test]
fn a_sas_token_publishes_and_its_signature_never_shows() {
    let lake = TestLake::on(Store::Azure);
    let sas = container_sas();
    let signature = sas
        .split('&')
        .find_map(|p| p.strip_prefix("sig="))
        .expect("a signature")
        .to_string();
    let edited = project_with(
        &lake,
        &format!("AZURE_STORAGE_ACCOUNT_KEY = \"{AZURE_SECRET}\""),
        &format!("AZURE_STORAGE_SAS_KEY = \"{sas}\""),
    );
    std::fs::write(lake.path().join("lakefill.toml"), edited).unwrap();
    let before = lake.version("events");
    let (from, to) = (lake.day(1), lake.day(2));
    let plan = lake.run(&["plan", "events", "--from", &from, "--to", &to, "-vv"]);
    assert_eq!(plan.status.code(), Some(0), "{}", stderr(&plan));
    assert!(
        stdout(&plan).contains("AZURE_STORAGE_SAS_KEY = ****  (project)"),
        "{}",
        stdout(&plan)
    );
    let run = backfill(&lake, &["-vv", "--output-format", "json"]);
    let report = json_ok(&run);
    assert_eq!(
        report["published_version"].as_u64(),
        Some(before + 1),
        "the token reaches the container"
    );
    for text in [stdout(&plan), stderr(&plan), stdout(&run), stderr(&run)] {
        assert!(!text.contains(&signature), "the signature shows: {text}");
        assert!(!text.contains(AZURE_SECRET), "the key shows");
    }
    // The token's own rights bound what it can do: one without `list` cannot open a table.
    let reader_only = sas.replace("sp=racwdl", "sp=r");
    assert_ne!(reader_only, sas, "the permissions are in the token: {sas}");
    let edited = project_with(&lake, &sas, &reader_only);
    std::fs::write(lake.path().join("lakefill.toml"), edited).unwrap();
    let out = backfill(&lake, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(!stderr(&out).contains(&signature));
    assert_eq!(
        lake.version("events"),
        before + 1,
        "unchanged after the refusal"
    );
}

#[test]
fn an_adls_gen2_location_names_its_container_and_account() {
    let lake = TestLake::on(Store::Azure);
    // `az://container/path` and `abfss://container@account.dfs.core.windows.net/path` name the
    // same objects; the endpoint option sends them to Azurite.
    let adls = format!("abfss://{AZURE_CONTAINER}@{AZURE_ACCOUNT}.dfs.core.windows.net/");
    let edited = project_with(&lake, &format!("az://{AZURE_CONTAINER}/"), &adls);
    std::fs::write(lake.path().join("lakefill.toml"), edited).unwrap();
    let before = lake.version("events");
    let (from, to) = (lake.day(1), lake.day(2));
    let plan = lake.run(&["plan", "events", "--from", &from, "--to", &to]);
    assert_eq!(plan.status.code(), Some(0), "{}", stderr(&plan));
    assert!(
        stdout(&plan).contains(&adls),
        "the container is shown, not masked as a user:\n{}",
        stdout(&plan)
    );
    let report = json_ok(&backfill(&lake, &["--output-format", "json"]));
    assert_eq!(report["published_version"].as_u64(), Some(before + 1));
    // The same table through its `az://` name has the commit.
    assert_eq!(lake.version("events"), before + 1);
}

#[test]
fn the_demo_runs_on_azure() {
    let server = azure_server();
    let base = server.new_base();
    let dir = tempfile::tempdir().unwrap();
    let mut command = lakefill_command(dir.path());
    command.envs(server.project_storage());
    let out = command
        .args([
            "demo",
            "--dir",
            "demo",
            "--days",
            "5",
            "--events-per-day",
            "200",
            "--azure",
            &base,
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("history of events"),
        "{}",
        stdout(&out)
    );
    let toml = std::fs::read_to_string(dir.path().join("demo/lakefill.toml")).unwrap();
    assert!(toml.contains(&format!("uri = \"{base}/events\"")), "{toml}");
    assert!(
        toml.contains("AZURE_STORAGE_ACCOUNT_KEY = \"${AZURE_STORAGE_ACCOUNT_KEY}\""),
        "{toml}"
    );
    assert!(
        !toml.contains(AZURE_SECRET),
        "no secret in the project file"
    );
    let mut command = lakefill_command(&dir.path().join("demo"));
    command.envs(server.project_storage());
    let history = command
        .args(["history", "events", "--output-format", "json"])
        .output()
        .unwrap();
    assert_eq!(history.status.code(), Some(0), "{}", stderr(&history));
    // An `s3://` location is not an Azure one.
    let out = lakefill_command(dir.path())
        .args(["demo", "--dir", "other", "--azure", "s3://bucket/demo"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("az://container/prefix"),
        "{}",
        stderr(&out)
    );
}
