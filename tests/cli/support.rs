//! A fresh demo lake per test, the binary, and independent readers of the tables.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use deltalake::DeltaTable;
use deltalake::arrow::array::RecordBatch;
use deltalake::arrow::util::display::{ArrayFormatter, FormatOptions};
use lakefill_fixtures::{DemoLake, LakeLocation};
use tempfile::TempDir;
use url::Url;

/// Where a test lake's tables live: local disk, or a real S3-compatible server (moto) or Azure
/// Storage emulator (Azurite) on loopback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Store {
    Local,
    S3,
    Azure,
}

impl Store {
    /// The storage options of a project on this store, as written into `lakefill.toml` (none
    /// for local disk).
    pub(crate) fn project_storage(self) -> Vec<(String, String)> {
        match self {
            Store::Local => Vec::new(),
            Store::S3 => s3_server().project_storage(),
            Store::Azure => azure_server().project_storage(),
        }
    }

    /// A new, empty location for a lake on this store (`None` for local disk).
    pub(crate) fn new_base(self) -> Option<String> {
        match self {
            Store::Local => None,
            Store::S3 => Some(format!("s3://{}/lake", s3_server().new_bucket())),
            Store::Azure => Some(azure_server().new_base()),
        }
    }

    /// The secret of this store's test projects (`None` for local disk).
    pub(crate) fn secret(self) -> Option<&'static str> {
        match self {
            Store::Local => None,
            Store::S3 => Some(S3_SECRET),
            Store::Azure => Some(AZURE_SECRET),
        }
    }
}

/// The reason tests give for a partial fix of the test lake's time zone bug. Its keys cross the
/// range's edges (events of the first day sit in the day before), so such a run publishes only
/// with `--allow-edge-moves`; the edge check itself is tested in `edges`.
pub(crate) const PARTIAL_FIX: &str =
    "a partial fix of the test lake, keys crossing its edges on purpose";

/// The secret key of the S3 test projects.
pub(crate) const S3_SECRET: &str = "s3-secret-value-7c1e";

/// The account of the Azure test projects, which Azurite is started with.
pub(crate) const AZURE_ACCOUNT: &str = "lakefill";

/// The account key of the Azure test projects (base64, as Azure's keys are).
pub(crate) const AZURE_SECRET: &str = "YXp1cmUtc2VjcmV0LXZhbHVlLTVkMmEtbGFrZWZpbGw=";

/// The container every Azure test lake has a prefix of its own in.
pub(crate) const AZURE_CONTAINER: &str = "lakefill";

/// A small demo lake in its own temporary directory (tables there, or in a bucket of its own).
pub(crate) struct TestLake {
    pub(crate) dir: TempDir,
    pub(crate) lake: DemoLake,
    pub(crate) store: Store,
    location: LakeLocation,
}

pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// A moto S3 server on a free loopback port, started once per test binary. It stops when the
/// test process exits (a watcher shell kills it).
pub(crate) struct S3Server {
    pub(crate) endpoint: String,
}

static S3_SERVER: OnceLock<S3Server> = OnceLock::new();

/// Starts `command(port)` (a shell command line) on a free loopback port, watched by a shell
/// that stops it when the test process exits and then runs `cleanup`, and waits until the port
/// answers; the port.
fn serve(what: &str, command: impl Fn(u16) -> String, cleanup: &str) -> u16 {
    let port = TcpListener::bind("127.0.0.1:0")
        .expect("free port")
        .local_addr()
        .expect("addr")
        .port();
    let parent = std::process::id();
    let script = format!(
        "{} & server=$!; \
         while kill -0 {parent} 2>/dev/null && kill -0 $server 2>/dev/null; do sleep 0.5; done; \
         kill $server 2>/dev/null; {cleanup}",
        command(port)
    );
    // The watcher outlives this function on purpose and exits with the test process.
    #[expect(
        clippy::zombie_processes,
        reason = "the watcher exits with the test process"
    )]
    Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("start {what}: {e}"));
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "{what} did not start on port {port}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    port
}

static BUCKETS: AtomicUsize = AtomicUsize::new(0);

pub(crate) fn s3_server() -> &'static S3Server {
    S3_SERVER.get_or_init(|| {
        let probe = Command::new("python3")
            .args(["-c", "import moto.server"])
            .output();
        assert!(
            probe.is_ok_and(|o| o.status.success()),
            "the S3 tests need moto's S3 server: python3 -m pip install -r tests/requirements.txt"
        );
        let port = serve(
            "moto",
            |port| format!("python3 -m moto.server -H 127.0.0.1 -p {port} >/dev/null 2>&1"),
            "true",
        );
        S3Server {
            endpoint: format!("http://127.0.0.1:{port}"),
        }
    })
}

impl S3Server {
    /// Creates a bucket with a plain HTTP request (moto accepts unsigned bucket creation).
    pub(crate) fn create_bucket(&self, name: &str) {
        let host = self.endpoint.trim_start_matches("http://");
        let mut stream = TcpStream::connect(host).expect("connect to moto");
        write!(
            stream,
            "PUT /{name} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
        .expect("send");
        let mut response = String::new();
        stream.read_to_string(&mut response).expect("response");
        assert!(
            response.starts_with("HTTP/1.1 200"),
            "cannot create bucket {name}: {response}"
        );
    }

    /// Storage options reaching this server, as written into `lakefill.toml`.
    pub(crate) fn project_storage(&self) -> Vec<(String, String)> {
        vec![
            ("AWS_ENDPOINT_URL".into(), self.endpoint.clone()),
            ("AWS_ALLOW_HTTP".into(), "true".into()),
            ("AWS_REGION".into(), "us-east-1".into()),
            ("AWS_ACCESS_KEY_ID".into(), "lakefill-test".into()),
            ("AWS_SECRET_ACCESS_KEY".into(), S3_SECRET.into()),
        ]
    }

    /// The same options, resolved.
    pub(crate) fn storage(&self) -> HashMap<String, String> {
        self.project_storage().into_iter().collect()
    }

    /// A new, empty bucket.
    pub(crate) fn new_bucket(&self) -> String {
        let name = format!(
            "lakefill-{}-{}",
            std::process::id(),
            BUCKETS.fetch_add(1, Ordering::SeqCst)
        );
        self.create_bucket(&name);
        name
    }
}

/// Azurite, Microsoft's Azure Storage emulator (npm `azurite`, installed by `scripts/test.sh`,
/// found at `LAKEFILL_AZURITE`), on a free loopback port, started once per test binary with the
/// test account and its container. It stops when the test process exits.
pub(crate) struct AzureServer {
    pub(crate) endpoint: String,
}

static AZURE_SERVER: OnceLock<AzureServer> = OnceLock::new();

pub(crate) fn azure_server() -> &'static AzureServer {
    AZURE_SERVER.get_or_init(|| {
        let azurite = std::env::var("LAKEFILL_AZURITE").unwrap_or_else(|_| {
            let home = std::env::var("HOME").unwrap_or_default();
            format!("{home}/.cache/lakefill-tools/azurite/node_modules/.bin/azurite-blob")
        });
        assert!(
            Path::new(&azurite).exists(),
            "the Azure tests need Azurite at {azurite}: run scripts/test.sh, which installs it with \
             npm, or set LAKEFILL_AZURITE to an azurite-blob binary"
        );
        let data = tempfile::tempdir().expect("tempdir").keep();
        // `--skipApiVersionCheck`: Azurite refuses clients newer than itself without it.
        let port = serve("azurite", |port| {
            format!(
                "AZURITE_ACCOUNTS='{AZURE_ACCOUNT}:{AZURE_SECRET}' '{azurite}' --blobHost 127.0.0.1 \
                 --blobPort {port} --location '{}' --skipApiVersionCheck --disableTelemetry \
                 --silent >/dev/null 2>&1",
                data.display()
            )
        }, &format!("rm -rf '{}'", data.display()));
        let server = AzureServer {
            endpoint: format!("http://127.0.0.1:{port}/{AZURE_ACCOUNT}"),
        };
        server.create_container(AZURE_CONTAINER);
        server
    })
}

impl AzureServer {
    /// Creates a container, with python's `azure-storage-blob` (object_store creates none).
    pub(crate) fn create_container(&self, name: &str) {
        let script = format!(
            "from azure.storage.blob import BlobServiceClient\n\
             BlobServiceClient.from_connection_string('{}').create_container('{name}')\n",
            self.connection_string()
        );
        let out = Command::new("python3")
            .args(["-c", &script])
            .output()
            .expect("python3");
        assert!(
            out.status.success(),
            "cannot create container {name} (python3 -m pip install -r tests/requirements.txt): {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The connection string of the test account, as Azure's SDKs take it.
    pub(crate) fn connection_string(&self) -> String {
        format!(
            "DefaultEndpointsProtocol=http;AccountName={AZURE_ACCOUNT};AccountKey={AZURE_SECRET};BlobEndpoint={};",
            self.endpoint
        )
    }

    /// Storage options reaching this server, as written into `lakefill.toml`.
    pub(crate) fn project_storage(&self) -> Vec<(String, String)> {
        vec![
            ("AZURE_STORAGE_ACCOUNT_NAME".into(), AZURE_ACCOUNT.into()),
            ("AZURE_STORAGE_ACCOUNT_KEY".into(), AZURE_SECRET.into()),
            ("AZURE_STORAGE_ENDPOINT".into(), self.endpoint.clone()),
            ("AZURE_ALLOW_HTTP".into(), "true".into()),
        ]
    }

    /// A new, empty prefix of the test container.
    pub(crate) fn new_base(&self) -> String {
        format!(
            "az://{AZURE_CONTAINER}/lake-{}-{}",
            std::process::id(),
            BUCKETS.fetch_add(1, Ordering::SeqCst)
        )
    }
}

/// Builds `lake` on local disk and uploads its tables to `location` (an object store), its
/// objects side by side, with the project in `dir` naming them there. The tables are those
/// `create_at` would write through the store (lakefill's own runs write the history either way;
/// only the location the first commit's `commitInfo` records differs), in a fraction of the
/// time: each of the lake's commits is a handful of sequential requests, and every object-store
/// test makes at least one lake (the every-stop tests one per stop). What lakefill does on the
/// store is what the tests themselves exercise.
fn upload_lake(lake: &DemoLake, dir: &Path, location: &LakeLocation) {
    use deltalake::logstore::object_store::{ObjectStoreExt as _, PutPayload};
    use futures::{StreamExt as _, TryStreamExt as _};
    let built = tempfile::tempdir().expect("tempdir");
    runtime()
        .block_on(lake.create(built.path()))
        .expect("demo lake");
    // The project's models, then its project file naming the store.
    lakefill_fixtures::copy_dir(&built.path().join("sql"), &dir.join("sql")).expect("models");
    std::fs::write(dir.join("lakefill.toml"), lake.project_file(location)).expect("project");
    let base = location.base_uri.as_deref().expect("an object store");
    lakefill::Store::register_handlers();
    let mut objects = Vec::new();
    for table in std::fs::read_dir(built.path().join("lake"))
        .expect("lake")
        .flatten()
    {
        let name = table.file_name().to_string_lossy().into_owned();
        let url = Url::parse(&format!("{base}/{name}/")).expect("url");
        let store = deltalake::DeltaTableBuilder::from_url(url)
            .expect("url")
            .with_storage_options(location.storage.clone())
            .build()
            .expect("store")
            .object_store();
        for file in files_under(&table.path()) {
            let file = PathBuf::from(file);
            let relative = file
                .strip_prefix(table.path())
                .expect("under the table")
                .to_string_lossy()
                .into_owned();
            objects.push((std::sync::Arc::clone(&store), relative, file));
        }
    }
    runtime()
        .block_on(
            futures::stream::iter(objects)
                .map(|(store, relative, file)| async move {
                    let bytes = std::fs::read(&file).expect("read");
                    store
                        .put(
                            &deltalake::Path::from(relative.as_str()),
                            PutPayload::from(bytes),
                        )
                        .await
                        .map(|_| ())
                })
                .buffer_unordered(16)
                .try_collect::<Vec<()>>(),
        )
        .expect("upload the lake");
}

impl TestLake {
    /// 10 days x 300 events on local disk, history written by v1.
    pub(crate) fn new() -> Self {
        Self::on(Store::Local)
    }

    /// 10 days x 300 events in `store`, history written by v1.
    pub(crate) fn on(store: Store) -> Self {
        Self::with(
            store,
            DemoLake {
                days: 10,
                events_per_day: 300,
                days_per_commit: 5,
                ..DemoLake::default()
            },
        )
    }

    /// `lake` in `store`.
    pub(crate) fn with(store: Store, lake: DemoLake) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let location = match store {
            Store::Local => LakeLocation::local(),
            _ => LakeLocation {
                base_uri: store.new_base(),
                project_storage: store.project_storage(),
                storage: store.project_storage().into_iter().collect(),
            },
        };
        match location.base_uri {
            None => {
                runtime()
                    .block_on(lake.create_at(dir.path(), &location))
                    .expect("demo lake");
            }
            Some(_) => upload_lake(&lake, dir.path(), &location),
        }
        Self {
            dir,
            lake,
            store,
            location,
        }
    }

    /// The location of `table`.
    pub(crate) fn table_url(&self, table: &str) -> Url {
        match &self.location.base_uri {
            Some(base) => Url::parse(&format!("{base}/{table}/")).expect("url"),
            None => Url::from_directory_path(self.table_path(table)).expect("absolute path"),
        }
    }

    /// Every object under `table`, as paths relative to its root.
    pub(crate) fn objects(&self, table: &str) -> Vec<String> {
        let table = self.open(table);
        runtime().block_on(async move {
            use futures::TryStreamExt;
            let mut paths: Vec<String> = table
                .object_store()
                .list(None)
                .map_ok(|o| o.location.to_string())
                .try_collect()
                .await
                .expect("list objects");
            paths.sort();
            paths
        })
    }

    /// The bytes of an object under `table`.
    pub(crate) fn object_bytes(&self, table: &str, path: &str) -> Vec<u8> {
        let table = self.open(table);
        let path = deltalake::Path::from(path);
        runtime().block_on(async move {
            use deltalake::logstore::object_store::ObjectStoreExt as _;
            table
                .object_store()
                .get(&path)
                .await
                .expect("get")
                .bytes()
                .await
                .expect("bytes")
                .to_vec()
        })
    }

    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }

    pub(crate) fn day(&self, offset: u64) -> String {
        (self.lake.start + chrono::Days::new(offset)).to_string()
    }

    /// Stages events@v2 (newest) over days `from..=to` with `--stage-only`; returns the run id.
    pub(crate) fn stage_events(&self, from: u64, to: u64) -> String {
        let report = json_ok(&self.run(&[
            "backfill",
            "events",
            "--from",
            &self.day(from),
            "--to",
            &self.day(to),
            "--stage-only",
            "--allow-edge-moves",
            "--reason",
            PARTIAL_FIX,
            "--output-format",
            "json",
        ]));
        assert_eq!(report["state"], "validated", "{report}");
        report["run_id"].as_str().expect("run id").to_string()
    }

    /// Runs the binary in the project directory.
    pub(crate) fn run(&self, args: &[&str]) -> Output {
        run_in(self.path(), args)
    }

    /// The local directory of `table` (local lakes only).
    pub(crate) fn table_path(&self, table: &str) -> PathBuf {
        assert_eq!(self.store, Store::Local, "table_path is for local lakes");
        self.path().join("lake").join(table)
    }

    pub(crate) fn open(&self, table: &str) -> DeltaTable {
        self.open_at(table, None)
    }

    pub(crate) fn open_version(&self, table: &str, version: u64) -> DeltaTable {
        self.open_at(table, Some(version))
    }

    fn open_at(&self, table: &str, version: Option<u64>) -> DeltaTable {
        // Tests write through delta-rs too (racing writers): on Azure with listings from an
        // offset made exact, as lakefill has them (Azurite ignores List Blobs' `startFrom`).
        lakefill::Store::register_handlers();
        let url = self.table_url(table);
        let storage = self.location.storage.clone();
        runtime().block_on(async move {
            let mut builder = deltalake::DeltaTableBuilder::from_url(url)
                .expect("url")
                .with_storage_options(storage);
            if let Some(version) = version {
                builder = builder.with_version(version);
            }
            builder.load().await.expect("open table")
        })
    }

    pub(crate) fn version(&self, table: &str) -> u64 {
        self.open(table).version().expect("loaded")
    }

    /// Data files of the current version: path -> size, per partition value.
    pub(crate) fn files(&self, table: &str) -> BTreeMap<String, BTreeMap<String, i64>> {
        let table = self.open(table);
        let mut out: BTreeMap<String, BTreeMap<String, i64>> = BTreeMap::new();
        for file in table.snapshot().expect("snapshot").log_data().iter() {
            let partition = file
                .partition_values_map()
                .values()
                .next()
                .cloned()
                .flatten()
                .unwrap_or_default();
            out.entry(partition)
                .or_default()
                .insert(file.path().to_string(), file.size());
        }
        out
    }

    /// Runs SQL over the given tables (name -> opened table) with plain DataFusion.
    pub(crate) fn query(&self, tables: &[(&str, DeltaTable)], sql: &str) -> Vec<Vec<String>> {
        let sql = sql.to_string();
        let tables: Vec<(String, DeltaTable)> = tables
            .iter()
            .map(|(n, t)| (n.to_string(), t.clone()))
            .collect();
        runtime().block_on(async move {
            let ctx = deltalake::datafusion::prelude::SessionContext::new();
            for (name, table) in tables {
                ctx.register_table(
                    name.as_str(),
                    table.table_provider().await.expect("provider"),
                )
                .expect("register");
            }
            let batches = ctx
                .sql(&sql)
                .await
                .expect("plan")
                .collect()
                .await
                .expect("run");
            rows(&batches)
        })
    }
}

pub(crate) fn run_in(dir: &Path, args: &[&str]) -> Output {
    lakefill_command(dir)
        .args(args)
        .output()
        .expect("run lakefill")
}

/// The `LAKEFILL_FAILPOINTS` value that stops a run at `point`: an abort, or an error where the
/// point only fails (see [`lakefill::CrashPoint::error_only`]).
pub(crate) fn armed(point: lakefill::CrashPoint<'_>) -> String {
    if point.error_only() {
        format!("{point}=error")
    } else {
        point.to_string()
    }
}

/// The binary, in `dir`, with the environment the test projects expect.
pub(crate) fn lakefill_command(dir: &Path) -> Command {
    let mut command = Command::new(assert_cmd::cargo::cargo_bin("lakefill"));
    command
        .current_dir(dir)
        .env_remove("LAKEFILL_FAILPOINTS")
        .env_remove("AWS_ENDPOINT_URL");
    command
}

/// Formats every cell as text, row by row.
pub(crate) fn rows(batches: &[RecordBatch]) -> Vec<Vec<String>> {
    let options = FormatOptions::default();
    let mut out = Vec::new();
    for batch in batches {
        let formatters: Vec<ArrayFormatter> = batch
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options).expect("formatter"))
            .collect();
        for row in 0..batch.num_rows() {
            out.push(
                formatters
                    .iter()
                    .map(|f| f.value(row).to_string())
                    .collect(),
            );
        }
    }
    out
}

pub(crate) fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub(crate) fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The rows of `rows` (a JSON array, as the python helpers print them) as text, sorted: to
/// compare two readers' rows whatever order each read them in.
pub(crate) fn sorted_rows(rows: serde_json::Value) -> Vec<String> {
    let mut rows: Vec<String> = rows
        .as_array()
        .expect("rows as a JSON array")
        .iter()
        .map(serde_json::Value::to_string)
        .collect();
    rows.sort();
    rows
}

/// Asserts success and returns stdout parsed as JSON.
pub(crate) fn json_ok(output: &Output) -> serde_json::Value {
    assert_eq!(
        output.status.code(),
        Some(0),
        "stdout:\n{}\nstderr:\n{}",
        stdout(output),
        stderr(output)
    );
    serde_json::from_slice(&output.stdout).expect("stdout is one JSON document")
}

/// The run report a command printed with `--output-format json`, typed: a document that lost a
/// field the report has fails here, and assertions read fields, not keys.
pub(crate) fn run_report(output: &Output) -> lakefill::RunReport {
    serde_json::from_value(json_ok(output)).expect("stdout is a run report")
}

/// The runs `lakefill runs --output-format json` printed, typed.
pub(crate) fn run_list(output: &Output) -> Vec<lakefill::RunSummary> {
    serde_json::from_value(json_ok(output)).expect("stdout is a list of runs")
}

/// Every file below `dir`, as full paths.
pub(crate) fn files_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(files_under(&path));
        } else {
            out.push(path.display().to_string());
        }
    }
    out
}

/// Asserts a refusal: the exit code, `message` on stderr, and a hint.
pub(crate) fn assert_refused(output: &Output, code: i32, message: &str) {
    let err = stderr(output);
    assert_eq!(output.status.code(), Some(code), "{err}");
    assert!(err.contains(message), "expected `{message}` in:\n{err}");
    assert!(err.contains("\nhint: "), "no hint in:\n{err}");
}

/// Percent-decodes a path as Delta writes them in the log.
pub(crate) fn decoded(path: &str) -> String {
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Ok(byte) = u8::from_str_radix(&path[i + 1..i + 3], 16)
        {
            out.push(byte);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Vacuums `table` with plain delta-rs and no retention: every file no version references goes.
pub(crate) fn vacuum_now(lake: &TestLake, table: &str) {
    let table = lake.open(table);
    runtime()
        .block_on(async {
            table
                .vacuum()
                .with_retention_period(chrono::Duration::zero())
                .with_enforce_retention_duration(false)
                .await
        })
        .expect("vacuum");
}

/// Appends one event into `events` with plain delta-rs, as another writer would.
pub(crate) fn append_event(lake: &TestLake, date: &str, event_id: i64) {
    let table = lake.open("events");
    let days = (chrono::NaiveDate::parse_from_str(date, "%Y-%m-%d").unwrap()
        - chrono::NaiveDate::from_ymd_opt(1970, 1, 1).unwrap())
    .num_days() as i32;
    let schema = std::sync::Arc::new(deltalake::arrow::datatypes::Schema::new(vec![
        deltalake::arrow::datatypes::Field::new(
            "event_id",
            deltalake::arrow::datatypes::DataType::Int64,
            true,
        ),
        deltalake::arrow::datatypes::Field::new(
            "user_id",
            deltalake::arrow::datatypes::DataType::Int64,
            true,
        ),
        deltalake::arrow::datatypes::Field::new(
            "country",
            deltalake::arrow::datatypes::DataType::Utf8,
            true,
        ),
        deltalake::arrow::datatypes::Field::new(
            "amount_cents",
            deltalake::arrow::datatypes::DataType::Int64,
            true,
        ),
        deltalake::arrow::datatypes::Field::new(
            "event_ts",
            deltalake::arrow::datatypes::DataType::Timestamp(
                deltalake::arrow::datatypes::TimeUnit::Microsecond,
                Some("UTC".into()),
            ),
            true,
        ),
        deltalake::arrow::datatypes::Field::new(
            "event_date",
            deltalake::arrow::datatypes::DataType::Date32,
            true,
        ),
    ]));
    let batch = RecordBatch::try_new(
        schema,
        vec![
            std::sync::Arc::new(deltalake::arrow::array::Int64Array::from(vec![event_id])),
            std::sync::Arc::new(deltalake::arrow::array::Int64Array::from(vec![1])),
            std::sync::Arc::new(deltalake::arrow::array::StringArray::from(vec!["ZZ"])),
            std::sync::Arc::new(deltalake::arrow::array::Int64Array::from(vec![1])),
            std::sync::Arc::new(
                deltalake::arrow::array::TimestampMicrosecondArray::from(vec![
                    i64::from(days) * 86_400_000_000,
                ])
                .with_timezone("UTC"),
            ),
            std::sync::Arc::new(deltalake::arrow::array::Date32Array::from(vec![days])),
        ],
    )
    .unwrap();
    runtime()
        .block_on(async {
            table
                .write(vec![batch])
                .with_save_mode(deltalake::protocol::SaveMode::Append)
                .await
        })
        .expect("append");
}

/// Runs the python helper `script` (a file of `tests/cli/`) with `args`; returns its stdout, or
/// fails the test with its stderr.
pub(crate) fn python_script(script: &str, args: &[&str]) -> String {
    let helper = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/cli")
        .join(script);
    let out = Command::new("python3")
        .arg(helper)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// [`python_script`]'s output as JSON (`null` when it printed nothing).
pub(crate) fn python_json(script: &str, args: &[&str]) -> serde_json::Value {
    let out = python_script(script, args);
    if out.trim().is_empty() {
        return serde_json::Value::Null;
    }
    serde_json::from_str(&out).unwrap()
}

fn python_helper() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/cli/delta_tables.py")
}

/// A project whose tables python writes, on local disk or in a bucket of moto's server.
pub(crate) struct PythonLake {
    dir: tempfile::TempDir,
    store: Store,
    base: String,
    env: Vec<(String, String)>,
    pub(crate) tables: Vec<String>,
}

impl PythonLake {
    pub(crate) fn new(store: Store) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let base = match store.new_base() {
            Some(base) => base,
            None => dir.path().join("lake").display().to_string(),
        };
        let env = store.project_storage();
        Self {
            dir,
            store,
            base,
            env,
            tables: Vec::new(),
        }
    }

    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }

    pub(crate) fn uri(&self, table: &str) -> String {
        format!("{}/{table}", self.base)
    }

    pub(crate) fn python(&self, args: &[&str]) -> String {
        self.script(&python_helper(), args)
    }

    /// Runs the python helper `script` (a path) with `args` and the lake's storage environment;
    /// its stdout.
    pub(crate) fn script(&self, script: &Path, args: &[&str]) -> String {
        let out = Command::new("python3")
            .arg(script)
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{} {args:?}: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// Has python write table `name` shaped as `shape`, and declares it in the project.
    pub(crate) fn table(&mut self, name: &str, shape: &str) {
        self.python(&["shape", shape, &self.uri(name)]);
        self.declare(name);
    }

    /// Declares table `name` (at [`Self::uri`]) in the project file.
    pub(crate) fn declare(&mut self, name: &str) {
        self.tables.push(name.to_string());
        let mut toml = String::new();
        if self.store != Store::Local {
            toml.push_str("[storage]\n");
            for (key, value) in &self.env {
                toml.push_str(&format!("{key} = \"{value}\"\n"));
            }
        }
        for table in &self.tables {
            let uri = match self.store {
                Store::Local => format!("lake/{table}"),
                Store::S3 | Store::Azure => self.uri(table),
            };
            toml.push_str(&format!("[tables.{table}]\nuri = \"{uri}\"\n"));
        }
        std::fs::write(self.path().join("lakefill.toml"), toml).unwrap();
    }

    pub(crate) fn model(&self, name: &str, header: &str, sql: &str) {
        self.model_version(name, "v1", header, sql);
    }

    /// Writes version `version` of model `name`.
    pub(crate) fn model_version(&self, name: &str, version: &str, header: &str, sql: &str) {
        let dir = self.path().join("sql").join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join(format!("{version}.sql")),
            format!("/*\n{header}\n*/\n{sql}\n"),
        )
        .unwrap();
    }

    pub(crate) fn run(&self, args: &[&str]) -> Output {
        run_in(self.path(), args)
    }

    /// Every row as python reads it, sorted.
    pub(crate) fn rows(&self, table: &str) -> Vec<serde_json::Value> {
        serde_json::from_str::<serde_json::Value>(&self.python(&["all_rows", &self.uri(table)]))
            .unwrap()
            .as_array()
            .unwrap()
            .clone()
    }

    /// `table` at its latest version, opened with delta-rs.
    pub(crate) fn open(&self, table: &str) -> DeltaTable {
        let url = match self.store {
            Store::Local => {
                url::Url::from_directory_path(self.path().join("lake").join(table)).unwrap()
            }
            Store::S3 | Store::Azure => url::Url::parse(&format!("{}/", self.uri(table))).unwrap(),
        };
        let options: std::collections::HashMap<String, String> = self.env.iter().cloned().collect();
        runtime().block_on(async move {
            deltalake::DeltaTableBuilder::from_url(url)
                .unwrap()
                .with_storage_options(options)
                .load()
                .await
                .unwrap()
        })
    }

    /// Live files of `table` (path -> size) with their partition values, read with delta-rs.
    pub(crate) fn files(
        &self,
        table: &str,
    ) -> BTreeMap<String, (i64, BTreeMap<String, Option<String>>)> {
        self.open(table)
            .snapshot()
            .unwrap()
            .log_data()
            .iter()
            .map(|f| {
                (
                    f.path().to_string(),
                    (f.size(), f.partition_values_map().into_iter().collect()),
                )
            })
            .collect()
    }
}

/// The `commitInfo` of the latest commit in the Delta log at `log` (a `_delta_log` directory),
/// read from its JSON.
pub(crate) fn last_commit_info(log: &Path) -> serde_json::Value {
    let mut commits: Vec<_> = std::fs::read_dir(log)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    commits.sort();
    let text = std::fs::read_to_string(commits.last().unwrap()).unwrap();
    text.lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find_map(|v| v.get("commitInfo").cloned())
        .unwrap()
}
