//! A fresh demo lake per test, the binary, and independent readers of the tables.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;

use deltalake::DeltaTable;
use deltalake::arrow::array::RecordBatch;
use deltalake::arrow::util::display::{ArrayFormatter, FormatOptions};
use lakefill_fixtures::DemoLake;
use tempfile::TempDir;
use url::Url;

/// A small demo lake in its own temporary directory.
pub(crate) struct TestLake {
    pub(crate) dir: TempDir,
    pub(crate) lake: DemoLake,
}

pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

impl TestLake {
    /// 10 days x 300 events, history written by v1.
    pub(crate) fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let lake = DemoLake {
            days: 10,
            events_per_day: 300,
            days_per_commit: 5,
            ..DemoLake::default()
        };
        runtime()
            .block_on(lake.create(dir.path()))
            .expect("demo lake");
        Self { dir, lake }
    }

    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }

    pub(crate) fn day(&self, offset: u64) -> String {
        (self.lake.start + chrono::Days::new(offset)).to_string()
    }

    /// Runs the binary in the project directory.
    pub(crate) fn run(&self, args: &[&str]) -> Output {
        run_in(self.path(), args)
    }

    pub(crate) fn table_path(&self, table: &str) -> PathBuf {
        self.path().join("lake").join(table)
    }

    pub(crate) fn open(&self, table: &str) -> DeltaTable {
        open_table(&self.table_path(table), None)
    }

    pub(crate) fn open_version(&self, table: &str, version: u64) -> DeltaTable {
        open_table(&self.table_path(table), Some(version))
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
    assert_cmd::Command::cargo_bin("lakefill")
        .expect("binary")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("run lakefill")
}

pub(crate) fn open_table(path: &Path, version: Option<u64>) -> DeltaTable {
    let url = Url::from_directory_path(path).expect("absolute path");
    runtime().block_on(async move {
        let mut builder = deltalake::DeltaTableBuilder::from_url(url).expect("url");
        if let Some(version) = version {
            builder = builder.with_version(version);
        }
        builder.load().await.expect("open table")
    })
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
