//! The backfill benchmark: lakefill against the bare scan-and-write floor, in one run.
//!
//! ```text
//! cargo bench -p lakefill-cli --bench backfill
//! LAKEFILL_BENCH_DAYS=30 LAKEFILL_BENCH_ROWS=20000 cargo bench -p lakefill-cli --bench backfill
//! ```
//!
//! It builds an events lake with the fixtures generator (`LAKEFILL_BENCH_DAYS` daily partitions
//! of `LAKEFILL_BENCH_ROWS` events, default 365 x 100,000; the history is written by events@v1,
//! itself a full-range backfill), then measures, each scenario in a fresh child process so that
//! its peak RSS is its own:
//!
//! - `backfill N`: events@v2 over N partitions (1, 30 and all): stage, validate, publish;
//! - `backfill N, no validation`: the same without the old-versus-new comparison;
//! - `floor N`: the same SELECT over the same source files with plain DataFusion, writing
//!   partitioned Parquet: no Delta commit, no journal, no validation;
//! - `memory-limited`: the full range under a memory limit of a tenth of the data;
//! - `plan`: planning on a table with `LAKEFILL_BENCH_COMMITS` commits (default 10,000, checkpointed).
//!
//! It prints wall time, rows/s, MB/s read and written, peak RSS, and the ratios the targets of
//! the performance issue are about.

#![expect(clippy::print_stdout, reason = "a benchmark reports on the terminal")]
#![expect(clippy::unwrap_used, reason = "a benchmark fails loudly")]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use deltalake::datafusion::dataframe::DataFrameWriteOptions;
use lakefill_fixtures::DemoLake;
use serde_json::{Value, json};

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(position) = args.iter().position(|a| a == "--scenario") {
        let scenario = &args[position + 1..];
        let result = runtime().block_on(run_scenario(scenario));
        println!(
            "{}",
            json!({"result": result, "peak_rss_bytes": peak_rss()})
        );
        return;
    }
    if args.iter().any(|a| a == "--list") {
        return;
    }
    orchestrate();
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// The process's peak resident set size, from `/proc/self/status`.
fn peak_rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| {
                    l.split_whitespace()
                        .nth(1)
                        .and_then(|kb| kb.parse::<u64>().ok())
                })
        })
        .map_or(0, |kb| kb * 1024)
}

fn orchestrate() {
    let days = env_number("LAKEFILL_BENCH_DAYS", 365) as u32;
    let rows = env_number("LAKEFILL_BENCH_ROWS", 100_000) as u32;
    let commits = env_number("LAKEFILL_BENCH_COMMITS", 10_000);
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("lake");
    println!(
        "lakefill backfill benchmark: {days} partitions x {rows} events (profile: {})",
        profile()
    );
    println!(
        "machine: {} cores, {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        memory()
    );

    let lake = DemoLake {
        days,
        events_per_day: rows,
        days_per_commit: 30,
        start: chrono::NaiveDate::from_ymd_opt(2025, 1, 1).unwrap(),
        ..DemoLake::default()
    };
    let started = Instant::now();
    runtime().block_on(lake.create(&project)).unwrap();
    println!(
        "built the lake (raw_events + events@v1 over every partition) in {:.1}s\n",
        started.elapsed().as_secs_f64()
    );

    let mut results = Vec::new();
    let mut ranges = vec![1u32, 30.min(days), days];
    ranges.dedup();
    for (i, n) in ranges.iter().enumerate() {
        let from = lake.start;
        let to = from + chrono::Days::new(u64::from(n - 1));
        let (from, to) = (from.to_string(), to.to_string());
        for (kind, extra) in [
            ("backfill", "validate"),
            ("backfill, no validation", "novalidate"),
            ("floor", "floor"),
        ] {
            // A fresh model version per scenario: each backfill is a new run.
            let version = format!("vbench{i}{extra}");
            if kind != "floor" {
                let v2 = std::fs::read_to_string(project.join("sql/events/v2.sql")).unwrap();
                std::fs::write(
                    project.join(format!("sql/events/{version}.sql")),
                    format!("{v2}\n-- {version}\n"),
                )
                .unwrap();
            }
            let outcome = child(&project, &[extra, &from, &to, &version, "0"]);
            results.push((kind.to_string(), *n, outcome));
        }
    }
    // Memory: the whole range under a limit a tenth of the data's in-memory size.
    let data_bytes = u64::from(days) * u64::from(rows) * 90;
    let limit = (data_bytes / 10).max(16 * 1024 * 1024);
    let v2 = std::fs::read_to_string(project.join("sql/events/v2.sql")).unwrap();
    std::fs::write(
        project.join("sql/events/vbenchmem.sql"),
        format!("{v2}\n-- memory\n"),
    )
    .unwrap();
    let from = lake.start.to_string();
    let to = (lake.start + chrono::Days::new(u64::from(days - 1))).to_string();
    let memory = child(
        &project,
        &["validate", &from, &to, "vbenchmem", &limit.to_string()],
    );
    // Planning on a long log.
    let many = dir.path().join("many");
    let plan = child(&many, &["plan", &commits.to_string(), "", "", "0"]);

    println!(
        "{:<26} {:>10} {:>11} {:>9} {:>11} {:>9} {:>9} {:>10}",
        "scenario", "partitions", "rows", "wall s", "rows/s", "MB/s rd", "MB/s wr", "peak MiB"
    );
    let row = |name: &str, n: u32, r: &Value| {
        let wall = r["result"]["wall_s"].as_f64().unwrap_or(0.0);
        let rows = r["result"]["rows"].as_f64().unwrap_or(0.0);
        let read = r["result"]["bytes_read"].as_f64().unwrap_or(0.0);
        let written = r["result"]["bytes_written"].as_f64().unwrap_or(0.0);
        println!(
            "{:<26} {:>10} {:>11} {:>9.2} {:>11.0} {:>9.1} {:>9.1} {:>10.0}",
            name,
            n,
            rows,
            wall,
            rows / wall.max(1e-9),
            read / 1e6 / wall.max(1e-9),
            written / 1e6 / wall.max(1e-9),
            r["peak_rss_bytes"].as_f64().unwrap_or(0.0) / 1048576.0
        );
    };
    for (name, n, r) in &results {
        row(name, *n, r);
    }
    row(
        &format!("memory-limited ({} MiB)", limit / 1048576),
        days,
        &memory,
    );
    println!();
    let wall = |kind: &str, n: u32| {
        results
            .iter()
            .find(|(k, m, _)| k == kind && *m == n)
            .and_then(|(_, _, r)| r["result"]["wall_s"].as_f64())
            .unwrap_or(f64::NAN)
    };
    for n in &ranges {
        println!(
            "{n:>4} partitions: backfill/floor = {:.2} (target <= 1.3 from 30 up); validation overhead = {:.2}x",
            wall("backfill", *n) / wall("floor", *n),
            wall("backfill", *n) / wall("backfill, no validation", *n)
        );
    }
    let one = wall("backfill", 1);
    let all = wall("backfill", days);
    println!(
        "1 partition of {days}: {one:.2}s vs target {:.2}s (2% of the full range + 0.5s)",
        0.02 * all + 0.5
    );
    let peak = memory["peak_rss_bytes"].as_f64().unwrap_or(0.0) / 1048576.0;
    println!(
        "memory: peak {peak:.0} MiB under a {} MiB limit (target <= limit + 200 MiB = {} MiB); data ~{} MiB",
        limit / 1048576,
        limit / 1048576 + 200,
        data_bytes / 1048576
    );
    println!(
        "plan on {commits} commits: {:.3}s (target < 1s)",
        plan["result"]["plan_s"].as_f64().unwrap_or(f64::NAN)
    );
}

fn profile() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}

fn memory() -> String {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .next()
                .map(|l| l.split_whitespace().nth(1).unwrap_or("0").to_string())
        })
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or_else(
            || "? memory".into(),
            |kb| format!("{:.0} GiB memory", kb as f64 / 1048576.0),
        )
}

/// Runs one scenario in a child process of this benchmark and returns its JSON line.
fn child(dir: &Path, args: &[&str]) -> Value {
    let exe = std::env::current_exe().unwrap();
    let mut command = Command::new(exe);
    command.arg("--scenario").arg(dir).args(args);
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "scenario {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().rev().find(|l| l.starts_with('{')).unwrap();
    serde_json::from_str(line).unwrap()
}

/// `DIR KIND FROM TO VERSION MEMORY_LIMIT`
async fn run_scenario(args: &[String]) -> Value {
    let dir = PathBuf::from(&args[0]);
    let kind = args[1].as_str();
    match kind {
        "validate" | "novalidate" => {
            let project = lakefill::Project::load(&dir).unwrap();
            let memory_limit: u64 = args[5].parse().unwrap();
            let started = Instant::now();
            let plan = lakefill::PlanBuilder::new(&project, "events", &args[2], &args[3])
                .with_model_version(Some(args[4].clone()))
                .await
                .unwrap();
            let bytes_read = source_bytes(&dir, &args[2], &args[3]).await;
            let report = lakefill::BackfillBuilder::new(plan)
                .with_validation(kind == "validate")
                .with_memory_limit((memory_limit > 0).then_some(memory_limit))
                .await
                .unwrap();
            assert!(
                report.published_version.is_some(),
                "{:?}",
                report.failed_checks()
            );
            json!({
                "wall_s": started.elapsed().as_secs_f64(),
                "rows": report.rows_written,
                "bytes_read": bytes_read,
                "bytes_written": report.bytes_written,
                "timings": report.timings,
            })
        }
        "floor" => floor(&dir, &args[2], &args[3]).await,
        "plan" => plan_on_long_log(&dir, args[2].parse().unwrap()).await,
        other => panic!("unknown scenario {other}"),
    }
}

/// Bytes of the raw_events files a backfill of `from..=to` reads (its window, from the log).
async fn source_bytes(dir: &Path, from: &str, to: &str) -> u64 {
    let table =
        deltalake::open_table(url::Url::from_directory_path(dir.join("lake/raw_events")).unwrap())
            .await
            .unwrap();
    let to_plus_one = (chrono::NaiveDate::parse_from_str(to, "%Y-%m-%d").unwrap()
        + chrono::Days::new(1))
    .to_string();
    table
        .snapshot()
        .unwrap()
        .log_data()
        .iter()
        .filter(|f| {
            f.partition_values_map()
                .get("ingest_date")
                .cloned()
                .flatten()
                .is_some_and(|d| from <= d.as_str() && d.as_str() <= to_plus_one.as_str())
        })
        .map(|f| f.size() as u64)
        .sum()
}

/// The floor: the same query over the same source with plain DataFusion, writing Parquet.
async fn floor(dir: &Path, from: &str, to: &str) -> Value {
    let started = Instant::now();
    let table =
        deltalake::open_table(url::Url::from_directory_path(dir.join("lake/raw_events")).unwrap())
            .await
            .unwrap();
    let ctx = deltalake::delta_datafusion::create_session().into_inner();
    ctx.register_table("raw_events", table.table_provider().await.unwrap())
        .unwrap();
    let to_plus_one = (chrono::NaiveDate::parse_from_str(to, "%Y-%m-%d").unwrap()
        + chrono::Days::new(1))
    .to_string();
    let sql = format!(
        "SELECT event_id, user_id, country, amount_cents, event_ts, CAST(event_ts AS DATE) AS event_date \
         FROM raw_events WHERE ingest_date BETWEEN DATE '{from}' AND DATE '{to_plus_one}' \
         AND CAST(event_ts AS DATE) BETWEEN DATE '{from}' AND DATE '{to}'"
    );
    let out = tempfile::tempdir_in(dir).unwrap();
    let df = ctx.sql(&sql).await.unwrap();
    let written = df
        .write_parquet(
            out.path().to_str().unwrap(),
            DataFrameWriteOptions::new().with_partition_by(vec!["event_date".into()]),
            None,
        )
        .await
        .unwrap();
    let rows: u64 = written
        .iter()
        .map(|b| {
            b.column(0)
                .as_any()
                .downcast_ref::<deltalake::arrow::array::UInt64Array>()
                .map_or(0, |a| a.value(0))
        })
        .sum();
    let bytes_written: u64 = walk_size(out.path());
    json!({
        "wall_s": started.elapsed().as_secs_f64(),
        "rows": rows,
        "bytes_read": source_bytes(dir, from, to).await,
        "bytes_written": bytes_written,
    })
}

fn walk_size(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| {
            let p = e.path();
            if p.is_dir() {
                walk_size(&p)
            } else {
                p.metadata().map_or(0, |m| m.len())
            }
        })
        .sum()
}

/// Builds a table with `commits` commits of one `add` each (written straight into the log, then
/// checkpointed at the end, as delta-rs does every 100 commits), then times `plan` of a model over
/// one of its partitions. Planning reads only the log, so the data files need not exist.
async fn plan_on_long_log(dir: &Path, commits: u64) -> Value {
    use deltalake::kernel::{DataType, StructField};
    let table_dir = dir.join("lake/many");
    std::fs::create_dir_all(&table_dir).unwrap();
    std::fs::create_dir_all(dir.join("sql/many")).unwrap();
    std::fs::write(
        dir.join("lakefill.toml"),
        "[tables.many]\nuri = \"lake/many\"\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("sql/many/v1.sql"),
        "/*\ntarget = \"many\"\npartition_by = \"day\"\n[sources.many]\nwindow = \"day\"\n*/\nSELECT n, day FROM many",
    )
    .unwrap();
    let url = url::Url::from_directory_path(&table_dir).unwrap();
    let build_started = Instant::now();
    let table = deltalake::DeltaTableBuilder::from_url(url.clone())
        .unwrap()
        .build()
        .unwrap();
    table
        .create()
        .with_table_name("many")
        .with_columns(vec![
            StructField::new("n", DataType::LONG, true),
            StructField::new("day", DataType::DATE, true),
        ])
        .with_partition_columns(["day"])
        .await
        .unwrap();
    let log = table_dir.join("_delta_log");
    for version in 1..=commits {
        let day =
            chrono::NaiveDate::from_ymd_opt(2024, 1, 1).unwrap() + chrono::Days::new(version % 365);
        let commit = format!(
            "{}\n{}\n",
            json!({"commitInfo": {"timestamp": 1_700_000_000_000u64 + version, "operation": "WRITE",
                "operationParameters": {"mode": "Append"}}}),
            json!({"add": {"path": format!("day={day}/part-{version:05}.parquet"),
                "partitionValues": {"day": day.to_string()}, "size": 1000, "modificationTime": 1_700_000_000_000u64,
                "dataChange": true, "stats": "{\"numRecords\":1}"}}),
        );
        std::fs::write(log.join(format!("{version:020}.json")), commit).unwrap();
    }
    let table = deltalake::open_table(url).await.unwrap();
    deltalake::checkpoints::create_checkpoint(&table, None)
        .await
        .unwrap();
    let build_s = build_started.elapsed().as_secs_f64();
    let project = lakefill::Project::load(dir).unwrap();
    let started = Instant::now();
    let plan = lakefill::PlanBuilder::new(&project, "many", "2024-03-01", "2024-03-01")
        .await
        .unwrap();
    let plan_s = started.elapsed().as_secs_f64();
    json!({
        "plan_s": plan_s,
        "build_s": build_s,
        "read_version": plan.report().read_version,
        "files_in_range": plan.report().totals.files,
    })
}
