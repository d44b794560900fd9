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
//! - `backfill N`: the timezone fix over N partitions (all, 30 and 1) of a wholly buggy range:
//!   stage, validate, publish, with no flag (the built-in memory pool);
//! - `backfill N, no validation`: the same work without the old-versus-new comparison (it puts
//!   the bug back, so the next range starts buggy);
//! - `DataFusion floor N`: the same SELECT over the same source files with plain DataFusion,
//!   writing partitioned Parquet: no Delta commit, no journal, no validation;
//! - `DuckDB COPY N`: the same fix scripted with python's DuckDB (`scripts/bench_duckdb.py`, from
//!   PyPI, installed if missing): `COPY ... PARTITION_BY` of the same Parquet files;
//! - the full range under `--memory-limit` (`LAKEFILL_BENCH_MEMORY_LIMIT`, default 512 MiB);
//! - a fix that changes a tenth of the rows, all in a tenth of the partitions, with and without
//!   validation;
//! - a fix scoped to one country of eight (`--where country = 'DE'`) over the whole range,
//!   against the whole fix;
//! - `plan`: planning on a table with `LAKEFILL_BENCH_COMMITS` commits (default 10,000, checkpointed).
//!
//! It prints one table (wall time, rows/s, stage and validation time, peak RSS, the ratio to
//! DuckDB) and the targets of the performance issue, met or not.

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
    if let Some(position) = args.iter().position(|a| a == "--build-lake") {
        // For profiling: build the lake in DIR with the fix (`vfix`), the bug (`vbug`) and a fix
        // that changes a tenth of the rows (`vtweak`) as models, and stop.
        let project = PathBuf::from(&args[position + 1]);
        let lake = bench_lake();
        runtime().block_on(lake.create(&project)).unwrap();
        for (version, shift, tweak) in [("vfix", 0, false), ("vbug", 8, false), ("vtweak", 0, true)]
        {
            std::fs::write(
                project.join(format!("sql/events/{version}.sql")),
                model(version, shift, tweak, false),
            )
            .unwrap();
        }
        println!(
            "built {} x {} events in {}",
            lake.days,
            lake.events_per_day,
            project.display()
        );
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

/// A model of events that takes the date at `shift` hours from UTC (0 is the fix, 8 the bug),
/// adding a cent to the amounts of every tenth day of the year when `tweak` is set, published
/// as adjustment rows when `adjust` is set.
fn model(version: &str, shift: u32, tweak: bool, adjust: bool) -> String {
    // The fix is the very expression the floor and DuckDB compute. The bug shifts the instant
    // as plain microseconds: the same work as the fix, where `event_ts - INTERVAL` would look up
    // the time zone of every row and make the run without validation look slower than it is.
    let date = if shift == 0 {
        "CAST(event_ts AS DATE)".to_string()
    } else {
        format!(
            "CAST(to_timestamp_micros(arrow_cast(event_ts, 'Int64') - {}) AS DATE)",
            u64::from(shift) * 3_600_000_000
        )
    };
    let amount = if tweak {
        format!(
            "CASE WHEN CAST(date_part('doy', {date}) AS BIGINT) % 10 = 0 \
             THEN amount_cents + 1 ELSE amount_cents END"
        )
    } else {
        "amount_cents".into()
    };
    let publish = if adjust {
        "publish = \"adjustments\"\nschema = \"add-columns\"\n"
    } else {
        ""
    };
    format!(
        "/*\ntarget = \"events\"\npartition_by = \"event_date\"\n{publish}\n[sources.raw_events]\n\
         window = \"ingest_date\"\nlookback = 0\nlookahead = 2\n\n[validate]\n\
         key = [\"event_id\"]\nmeasures = [\"amount_cents\"]\n*/\n\
         SELECT event_id, user_id, country, {amount} AS amount_cents, event_ts, {date} AS event_date\n\
         FROM raw_events\nWHERE {date} BETWEEN $start AND $end\n-- {version}\n"
    )
}

/// One measured scenario.
struct Measured {
    name: String,
    partitions: u32,
    outcome: Value,
}

/// The lake the benchmark measures on (`LAKEFILL_BENCH_DAYS` x `LAKEFILL_BENCH_ROWS`).
fn bench_lake() -> DemoLake {
    DemoLake {
        days: env_number("LAKEFILL_BENCH_DAYS", 365) as u32,
        events_per_day: env_number("LAKEFILL_BENCH_ROWS", 100_000) as u32,
        days_per_commit: 30,
        start: chrono::NaiveDate::from_ymd_opt(2025, 1, 1).unwrap(),
        ..DemoLake::default()
    }
}

fn orchestrate() {
    let days = env_number("LAKEFILL_BENCH_DAYS", 365) as u32;
    let rows = env_number("LAKEFILL_BENCH_ROWS", 100_000) as u32;
    let commits = env_number("LAKEFILL_BENCH_COMMITS", 10_000);
    let limit = env_number("LAKEFILL_BENCH_MEMORY_LIMIT", 512 * 1024 * 1024);
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
    let duckdb = duckdb_available();

    let lake = bench_lake();
    let started = Instant::now();
    runtime().block_on(lake.create(&project)).unwrap();
    println!(
        "built the lake (raw_events + events@v1 over every partition) in {:.1}s\n",
        started.elapsed().as_secs_f64()
    );
    let range = |n: u32| {
        let to = lake.start + chrono::Days::new(u64::from(n - 1));
        (lake.start.to_string(), to.to_string())
    };
    let mut models = 0;
    let mut write_model = |shift: u32, tweak: bool, adjust: bool| {
        models += 1;
        let version = format!("vbench{models:03}");
        std::fs::write(
            project.join(format!("sql/events/{version}.sql")),
            model(&version, shift, tweak, adjust),
        )
        .unwrap();
        version
    };

    let mut results: Vec<Measured> = Vec::new();
    let mut ranges = vec![days, 30.min(days), 1];
    ranges.dedup();
    for n in &ranges {
        let (from, to) = range(*n);
        // Every validated run fixes a range that is wholly buggy; the run without validation
        // puts the bug back (the same work), so the next range starts buggy again.
        let fix = write_model(0, false, false);
        let outcome = child(&project, &["validate", &from, &to, &fix, "default"]);
        results.push(Measured {
            name: "backfill".into(),
            partitions: *n,
            outcome,
        });
        let bug = write_model(8, false, false);
        let outcome = child(&project, &["novalidate", &from, &to, &bug, "default"]);
        results.push(Measured {
            name: "backfill, no validation".into(),
            partitions: *n,
            outcome,
        });
        let outcome = child(&project, &["floor", &from, &to, "", "0"]);
        results.push(Measured {
            name: "DataFusion floor".into(),
            partitions: *n,
            outcome,
        });
        if duckdb {
            let outcome = duckdb_copy(&project, &from, &to, false);
            results.push(Measured {
                name: "DuckDB COPY".into(),
                partitions: *n,
                outcome,
            });
            // The honest peer: the same fix and the same validation, by DuckDB.
            let outcome = duckdb_copy(&project, &from, &to, true);
            results.push(Measured {
                name: DUCKDB_VALIDATED.into(),
                partitions: *n,
                outcome,
            });
        }
    }
    // The whole range under a memory limit (the table is buggy again everywhere).
    let (from, to) = range(days);
    let fix = write_model(0, false, false);
    let outcome = child(
        &project,
        &["validate", &from, &to, &fix, &limit.to_string()],
    );
    results.push(Measured {
        name: format!("backfill, --memory-limit {}MiB", limit / 1048576),
        partitions: days,
        outcome,
    });
    // A fix that changes a tenth of the rows, all in a tenth of the partitions.
    let tweak = write_model(0, true, false);
    let outcome = child(&project, &["validate", &from, &to, &tweak, "default"]);
    results.push(Measured {
        name: "backfill, 10% of partitions change".into(),
        partitions: days,
        outcome,
    });
    let tweak_again = write_model(0, true, false);
    let outcome = child(
        &project,
        &["novalidate", &from, &to, &tweak_again, "default"],
    );
    results.push(Measured {
        name: "same, no validation".into(),
        partitions: days,
        outcome,
    });
    // The same 10% fix with the table's change data feed on: what writing the feed costs. The
    // fix before it is put back first (not measured); the feed is turned off again after.
    let fix_back = write_model(0, false, false);
    child(&project, &["novalidate", &from, &to, &fix_back, "default"]);
    child(
        &project,
        &["property", "delta.enableChangeDataFeed", "true"],
    );
    let tweak_feed = write_model(0, true, false);
    let outcome = child(&project, &["validate", &from, &to, &tweak_feed, "default"]);
    results.push(Measured {
        name: FEED_SCENARIO.into(),
        partitions: days,
        outcome,
    });
    child(
        &project,
        &["property", "delta.enableChangeDataFeed", "false"],
    );
    // A fix for one country of eight (`--where`), over the whole range: the bug is put back
    // everywhere first (not measured).
    let bug = write_model(8, false, false);
    child(&project, &["novalidate", &from, &to, &bug, "default"]);
    let fix = write_model(0, false, false);
    let outcome = child(
        &project,
        &["validate", &from, &to, &fix, "default", WHERE_ONE_COUNTRY],
    );
    results.push(Measured {
        name: format!("backfill, --where {WHERE_ONE_COUNTRY}"),
        partitions: days,
        outcome,
    });
    // A fix that changes 1% of the rows, spread over every partition: rewritten, then (the table
    // put back first, not measured) published by deletion vectors. On a copy of the lake, so that
    // the scenarios after these read a table without the deletion vectors feature, as before.
    let copy = dir.path().join("vectors");
    lakefill_fixtures::copy_dir(&project, &copy).unwrap();
    let fix = write_model(0, false, false);
    std::fs::copy(
        project.join(format!("sql/events/{fix}.sql")),
        copy.join(format!("sql/events/{fix}.sql")),
    )
    .unwrap();
    child(&copy, &["novalidate", &from, &to, &fix, "default"]);
    let sparse = write_sparse_model(&copy, 1);
    let outcome = child(&copy, &["validate", &from, &to, &sparse, "default"]);
    results.push(Measured {
        name: SPARSE_REWRITE.into(),
        partitions: days,
        outcome,
    });
    child(&copy, &["novalidate", &from, &to, &fix, "default"]);
    child(&copy, &["property", "delta.enableDeletionVectors", "true"]);
    let sparse = write_sparse_model(&copy, 2);
    let outcome = child(&copy, &["validate", &from, &to, &sparse, "default"]);
    results.push(Measured {
        name: SPARSE_VECTORS.into(),
        partitions: days,
        outcome,
    });
    // The fix for one country of eight (`--where`) by deletion vectors: the bug put back
    // everywhere first (not measured).
    let bug = write_model(8, false, false);
    std::fs::copy(
        project.join(format!("sql/events/{bug}.sql")),
        copy.join(format!("sql/events/{bug}.sql")),
    )
    .unwrap();
    child(&copy, &["novalidate", &from, &to, &bug, "default"]);
    let outcome = child(
        &copy,
        &["validate", &from, &to, &fix, "default", WHERE_ONE_COUNTRY],
    );
    results.push(Measured {
        name: WHERE_VECTORS.into(),
        partitions: days,
        outcome,
    });
    // The 1% fix by deletion vectors with the change data feed on too (the fix put back first).
    child(&copy, &["novalidate", &from, &to, &fix, "default"]);
    child(&copy, &["property", "delta.enableChangeDataFeed", "true"]);
    let sparse = write_sparse_model(&copy, 3);
    let outcome = child(&copy, &["validate", &from, &to, &sparse, "default"]);
    results.push(Measured {
        name: SPARSE_VECTORS_FEED.into(),
        partitions: days,
        outcome,
    });
    std::fs::remove_dir_all(&copy).unwrap();
    // Publishing as adjustment rows (an append-only ledger) over a month: the bug appended as
    // adjustments to rows that never had any, then the fix netted against them.
    let (from, to) = range(30.min(days));
    for (name, shift) in [(ADJUST_FIRST, 8), (ADJUST_NETTED, 0)] {
        let version = write_model(shift, false, true);
        let outcome = child(&project, &["validate", &from, &to, &version, "default"]);
        results.push(Measured {
            name: name.into(),
            partitions: 30.min(days),
            outcome,
        });
    }
    // Planning on a long log.
    let many = dir.path().join("many");
    let plan = child(&many, &["plan", &commits.to_string(), "", "", "0"]);

    print_table(&results, days, limit);
    println!(
        "plan on {commits} commits: {:.3}s (target < 1s)",
        plan["result"]["plan_s"].as_f64().unwrap_or(f64::NAN)
    );
}

/// The fix (model [`model`] with no shift) with a cent more on every 100th event: 1% of the rows
/// change, in every partition. Written as the next benchmark model version; its name.
fn write_sparse_model(project: &Path, n: u32) -> String {
    let version = format!("vsparse{n}");
    let text = model(&version, 0, false, false).replace(
        "amount_cents AS amount_cents",
        "CASE WHEN event_id % 100 = 0 THEN amount_cents + 1 ELSE amount_cents END AS amount_cents",
    );
    std::fs::write(project.join(format!("sql/events/{version}.sql")), text).unwrap();
    version
}

/// The 1% fix, rewritten.
const SPARSE_REWRITE: &str = "backfill, 1% of rows change (rewrite)";

/// The 1% fix, published by deletion vectors.
const SPARSE_VECTORS: &str = "same, by deletion vectors";

/// The fix of one country of eight, published by deletion vectors.
const WHERE_VECTORS: &str = "same --where, by deletion vectors";

/// The 1% fix by deletion vectors, the change data feed on.
const SPARSE_VECTORS_FEED: &str = "1% by vectors, change data feed on";

/// DuckDB's `COPY` followed by lakefill's validation, done by DuckDB.
const DUCKDB_VALIDATED: &str = "DuckDB COPY + the same validation";

/// The month published as adjustments with none before it.
const ADJUST_FIRST: &str = "adjustments, first (no earlier ones)";

/// The month published as adjustments netted against the first ones.
const ADJUST_NETTED: &str = "adjustments, netted against the first";

/// The scenario of the 10% fix with the change data feed on.
const FEED_SCENARIO: &str = "same fix, change data feed on";

/// The predicate of the scoped scenario: one of the lake's eight countries.
const WHERE_ONE_COUNTRY: &str = "country = 'DE'";

/// Whether python's `duckdb` can be imported, installing it from PyPI if not.
fn duckdb_available() -> bool {
    let import = || {
        Command::new("python3")
            .args(["-c", "import duckdb, deltalake"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if import() {
        return true;
    }
    let _ = Command::new("python3")
        .args(["-m", "pip", "install", "--quiet", "duckdb", "deltalake"])
        .status();
    let available = import();
    if !available {
        println!(
            "(python3 with duckdb and deltalake is not available: the DuckDB comparison is left out)"
        );
    }
    available
}

/// The DuckDB script of the same fix over the same range, in its own process: DuckDB's `COPY` of the fix over `from..=to`; with `validate`, followed by the validation
/// lakefill does (`scripts/bench_duckdb.py --validate`).
fn duckdb_copy(project: &Path, from: &str, to: &str, validate: bool) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/bench_duckdb.py");
    let out = tempfile::tempdir_in(project).unwrap();
    let output = Command::new("python3")
        .arg(script)
        .arg(project.join("lake"))
        .arg(out.path().join("events"))
        .args([from, to])
        .args(validate.then_some("--validate"))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "duckdb failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout.lines().rev().find(|l| l.starts_with('{')).unwrap();
    serde_json::from_str(line).unwrap()
}

fn print_table(results: &[Measured], days: u32, limit: u64) {
    let wall = |r: &Value| r["result"]["wall_s"].as_f64().unwrap_or(f64::NAN);
    let find = |name: &str, n: u32| {
        results
            .iter()
            .find(|m| m.name == name && m.partitions == n)
            .map(|m| &m.outcome)
    };
    println!(
        "| scenario | partitions | rows | wall s | rows/s | stage s | validate s | peak RSS MiB | / DuckDB |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for m in results {
        let r = &m.outcome;
        let rows = r["result"]["rows"].as_f64().unwrap_or(0.0);
        let seconds = |key: &str| {
            r["result"]["timings"][key]
                .as_f64()
                .map_or_else(|| "".to_string(), |ms| format!("{:.2}", ms / 1000.0))
        };
        let versus = find("DuckDB COPY", m.partitions)
            .map_or_else(String::new, |d| format!("{:.2}", wall(r) / wall(d)));
        println!(
            "| {} | {} | {} | {:.2} | {} | {} | {} | {:.0} | {} |",
            m.name,
            m.partitions,
            thousands(rows as u64),
            wall(r),
            thousands((rows / wall(r).max(1e-9)) as u64),
            seconds("stage_ms"),
            seconds("validate_ms"),
            r["peak_rss_bytes"].as_f64().unwrap_or(0.0) / 1048576.0,
            versus
        );
    }
    println!();
    let share = |r: Option<&Value>| {
        r.map_or(f64::NAN, |r| {
            r["result"]["timings"]["validate_ms"]
                .as_f64()
                .unwrap_or(f64::NAN)
                / r["result"]["timings"]["total_ms"]
                    .as_f64()
                    .unwrap_or(f64::NAN)
        })
    };
    let full = find("backfill", days);
    if let (Some(full), Some(duck)) = (full, find("DuckDB COPY", days)) {
        println!(
            "full range with validation / DuckDB COPY = {:.2} (target <= 1.0)",
            wall(full) / wall(duck)
        );
    }
    println!(
        "validation share of the full range: {:.1}% (target <= 20%); with 10% of partitions changing: {:.1}% (target <= 5%)",
        100.0 * share(full),
        100.0 * share(find("backfill, 10% of partitions change", days))
    );
    if let (Some(full), Some(peer)) = (full, find(DUCKDB_VALIDATED, days)) {
        println!(
            "full range with validation / DuckDB COPY + the same validation = {:.2} in time (target <= 0.5), {:.2} in peak RSS (target <= 0.33)",
            wall(full) / wall(peer),
            full["peak_rss_bytes"].as_f64().unwrap_or(f64::NAN)
                / peer["peak_rss_bytes"].as_f64().unwrap_or(f64::NAN)
        );
    }
    if let (Some(plain), Some(fed)) = (
        find("backfill, 10% of partitions change", days),
        find(FEED_SCENARIO, days),
    ) {
        let feed_s = fed["result"]["timings"]["feed_ms"]
            .as_f64()
            .unwrap_or(f64::NAN)
            / 1000.0;
        println!(
            "change data feed of the 10% fix: {feed_s:.2}s, {:.1}% of its run (target <= 10%); the run {:.2}x the same fix without a feed",
            100.0 * feed_s / wall(fed),
            wall(fed) / wall(plain)
        );
    }
    if let (Some(full), Some(scoped)) = (
        full,
        find(&format!("backfill, --where {WHERE_ONE_COUNTRY}"), days),
    ) {
        println!(
            "--where {WHERE_ONE_COUNTRY} (one country of 8) / the whole fix = {:.2} in time, {:.2} in peak RSS, {:.2} in bytes written",
            wall(scoped) / wall(full),
            scoped["peak_rss_bytes"].as_f64().unwrap_or(f64::NAN)
                / full["peak_rss_bytes"].as_f64().unwrap_or(f64::NAN),
            scoped["result"]["bytes_written"]
                .as_f64()
                .unwrap_or(f64::NAN)
                / full["result"]["bytes_written"].as_f64().unwrap_or(f64::NAN)
        );
    }
    if let (Some(rewritten), Some(cut)) = (
        find(&format!("backfill, --where {WHERE_ONE_COUNTRY}"), days),
        find(WHERE_VECTORS, days),
    ) {
        println!(
            "--where {WHERE_ONE_COUNTRY} by deletion vectors / rewritten = {:.2} in time, {:.4} in bytes written",
            wall(cut) / wall(rewritten),
            cut["result"]["bytes_written"].as_f64().unwrap_or(f64::NAN)
                / rewritten["result"]["bytes_written"]
                    .as_f64()
                    .unwrap_or(f64::NAN)
        );
    }
    if let (Some(plain), Some(fed)) = (find(SPARSE_VECTORS, days), find(SPARSE_VECTORS_FEED, days))
    {
        let feed_s = fed["result"]["timings"]["feed_ms"]
            .as_f64()
            .unwrap_or(f64::NAN)
            / 1000.0;
        println!(
            "change data feed of the 1% fix by deletion vectors: {feed_s:.2}s, {:.1}% of its run; the run {:.2}x the same fix without a feed",
            100.0 * feed_s / wall(fed),
            wall(fed) / wall(plain)
        );
    }
    let limited = results
        .iter()
        .find(|m| m.name.starts_with("backfill, --memory-limit"))
        .map(|m| &m.outcome);
    if let (Some(full), Some(limited)) = (full, limited) {
        println!(
            "peak RSS without a flag: {:.0} MiB (target <= 1536); under {} MiB: {:.0} MiB (target <= {}) at {:.2}x the time without a flag (target <= 1.3)",
            full["peak_rss_bytes"].as_f64().unwrap_or(0.0) / 1048576.0,
            limit / 1048576,
            limited["peak_rss_bytes"].as_f64().unwrap_or(0.0) / 1048576.0,
            limit / 1048576 + 200,
            wall(limited) / wall(full)
        );
    }
    let edges = |r: Option<&Value>| {
        r.map_or((f64::NAN, f64::NAN), |r| {
            let t = &r["result"]["timings"];
            let ms = |k: &str| t[k].as_f64().unwrap_or(f64::NAN);
            (
                ms("edges_ms") / 1000.0,
                100.0 * ms("edges_ms") / ms("total_ms"),
            )
        })
    };
    let mut edge_ranges = vec![days, 30.min(days)];
    edge_ranges.dedup();
    for n in edge_ranges {
        let (seconds, share) = edges(find("backfill", n));
        println!(
            "edge check of the {n}-partition fix: {seconds:.2}s, {share:.1}% of the run (target < 5% on the full range)"
        );
    }
    if let (Some(rewrite), Some(vectors)) = (find(SPARSE_REWRITE, days), find(SPARSE_VECTORS, days))
    {
        let bytes = |r: &Value| r["result"]["bytes_written"].as_f64().unwrap_or(f64::NAN);
        println!(
            "1% of rows changed, by deletion vectors / rewritten: {:.3} in bytes written (target <= 0.05), {:.2} in time (target <= 0.6), {:.2} in peak RSS",
            bytes(vectors) / bytes(rewrite),
            wall(vectors) / wall(rewrite),
            vectors["peak_rss_bytes"].as_f64().unwrap_or(f64::NAN)
                / rewrite["peak_rss_bytes"].as_f64().unwrap_or(f64::NAN)
        );
    }
    let month = 30.min(days);
    if let (Some(rewrite), Some(first), Some(netted)) = (
        find("backfill", month),
        find(ADJUST_FIRST, month),
        find(ADJUST_NETTED, month),
    ) {
        println!(
            "a month as adjustments / its rewrite: {:.2} the first time, {:.2} netted against earlier ones (target <= 2 for both)",
            wall(first) / wall(rewrite),
            wall(netted) / wall(rewrite)
        );
    }
    if let (Some(one), Some(full)) = (find("backfill", 1), full) {
        println!(
            "1 partition of {days}: {:.2}s (target <= 1% of the full range + 0.1s = {:.2}s)",
            wall(one),
            0.01 * wall(full) + 0.1
        );
    }
}

fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
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

/// `DIR KIND FROM TO VERSION MEMORY_LIMIT [WHERE]`
async fn run_scenario(args: &[String]) -> Value {
    let dir = PathBuf::from(&args[0]);
    let kind = args[1].as_str();
    match kind {
        "validate" | "novalidate" => {
            let project = lakefill::Project::load(&dir).unwrap();
            // `default`: no flag, the built-in pool; otherwise a size in bytes.
            let memory_limit: Option<u64> = args[5].parse().ok();
            let started = Instant::now();
            // Partial ranges of a table that is buggy everywhere: keys cross their edges, on
            // purpose (the edge check still runs, and its time is reported).
            let plan = lakefill::PlanBuilder::new(&project, "events", &args[2], &args[3])
                .with_model_version(Some(args[4].clone()))
                .with_allow_edge_moves(Some("the benchmark fixes partial ranges".into()))
                .with_where(args.get(6).cloned())
                .await
                .unwrap();
            let bytes_read = source_bytes(&dir, &args[2], &args[3]).await;
            let mut settings = lakefill::RunSettings::built_in();
            if memory_limit.is_some() {
                settings.memory_limit = memory_limit;
            }
            let report = lakefill::BackfillBuilder::new(plan)
                .with_validation(kind == "validate")
                .with_settings(settings)
                .await
                .unwrap();
            assert!(
                matches!(
                    report.outcome,
                    lakefill::Outcome::Published | lakefill::Outcome::UpToDate
                ),
                "{:?} {:?}",
                report.outcome,
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
        "property" => {
            // `DIR property KEY VALUE`: a table property of the target (`delta.enableChangeDataFeed`;
            // `delta.enableDeletionVectors`, whose `true` makes the protocol take the feature).
            let table = deltalake::open_table(
                url::Url::from_directory_path(dir.join("lake/events")).unwrap(),
            )
            .await
            .unwrap();
            table
                .set_tbl_properties()
                .with_properties([(args[2].clone(), args[3].clone())].into())
                .await
                .unwrap();
            json!({})
        }
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
