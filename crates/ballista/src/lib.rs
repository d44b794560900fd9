//! # lakefill-ballista
//!
//! Staging on an Apache Ballista cluster (`backfill --engine df://HOST:PORT`), and the cluster
//! itself (`lakefill cluster up`). The runner (`lakefill`) chooses it over local staging; it is
//! built only with the `distributed` feature.
//!
//! The client does what it does locally up to the query: it pins every source, and per batch
//! turns each source into a plain Parquet scan of exactly the files of its pinned version
//! (`pinned::pinned_source`; partition values are per-file constants from the log, nothing is
//! listed), plans the model's SELECT with Ballista's session configuration, casts it to the
//! target's columns, adds a hash repartition on the target's partition columns and
//! `writer::StageWriterExec` on top, and submits that physical plan. Each writer task writes
//! whole target partitions into the run's staging directories, as a local batch would, and
//! returns what it wrote. The client gathers those (one result per writer partition: a result
//! of a re-run task is dropped and its files deleted, as are files of attempts that never
//! reported), and journals the batch like a local one. Validation and the one commit stay on the
//! client, with every lifecycle guarantee of a local run (resume, discard, gc).
//!
//! Refused, naming `--engine local`: by-rows targets and unpartitioned ones, adjustments,
//! cascades, reverts, and sources with deletion vectors or column mapping.

pub mod cluster;
mod pinned;
mod submit;
mod writer;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use ballista_core::extension::SessionConfigExt as _;
use deltalake::arrow::array::{Array, AsArray};
use deltalake::arrow::datatypes::SchemaRef;
use deltalake::datafusion::execution::object_store::ObjectStoreUrl;
use deltalake::datafusion::physical_expr::PhysicalExpr;
use deltalake::datafusion::physical_plan::expressions::Column;
use deltalake::datafusion::physical_plan::repartition::RepartitionExec;
use deltalake::datafusion::physical_plan::{ExecutionPlan, Partitioning};
use deltalake::datafusion::prelude::{SessionConfig, SessionContext};
use deltalake::logstore::object_store::ObjectStoreExt as _;
use futures::TryStreamExt;

use lakefill_log::journal::BatchRecord;
use lakefill_log::journal::RunKind;
use lakefill_recompute::plan::query::{model_dataframe, register_source_with, target_schema};
use lakefill_recompute::plan::{BackfillPlan, BatchPlan, Publish};
use lakefill_recompute::stage::{StageOptions, WriteSpec, Written, target_projection};
use lakefill_table::error::{Error, QueryContext, Result};

/// Writer tasks (and scan groups) per batch.
const TASKS: usize = 8;

/// Stages every batch not in `skip` on the cluster whose scheduler is at `engine`
/// (`df://HOST:PORT`), sending each finished batch to `finished`.
pub async fn stage(
    plan: &BackfillPlan,
    options: &StageOptions,
    engine: &str,
    skip: &BTreeSet<usize>,
    finished: tokio::sync::mpsc::Sender<BatchRecord>,
) -> Result<()> {
    check(plan, engine, options.throttle.is_some())?;
    let scheduler = scheduler_url(engine)?;
    let target_schema = Arc::new(target_schema(plan)?);
    lakefill_recompute::stage::each_batch(plan, skip, options.max_parallel, finished, |batch| {
        let schema = Arc::clone(&target_schema);
        let scheduler = scheduler.clone();
        async move { stage_batch(plan, &batch, schema, &scheduler, engine, options.lease).await }
    })
    .await
}

/// Refuses, before a run starts, what it cannot do on the cluster at `engine`: a malformed
/// address, a `--throttle` (it bounds this process's writes, and the executors write), and the
/// shapes a distributed run cannot stage yet.
pub fn check(plan: &BackfillPlan, engine: &str, throttled: bool) -> Result<()> {
    scheduler_url(engine)?;
    if throttled {
        return Err(Error::InvalidOption {
            option: "--throttle".into(),
            value: engine.into(),
            message: "bounds the writes of this process, and with `--engine` the executors write; run without `--throttle`, or with `--engine local`".into(),
        });
    }
    refuse_unsupported(plan, engine)
}

/// What a distributed run cannot do yet, refused by name before anything is staged.
fn refuse_unsupported(plan: &BackfillPlan, engine: &str) -> Result<()> {
    let refuse = |what: &str| {
        Err(Error::InvalidOption {
            option: "--engine".into(),
            value: engine.into(),
            message: format!(
                "{what} cannot be staged on a cluster yet; run it with `--engine local`"
            ),
        })
    };
    let layout = &plan.report.layout;
    if layout.by_rows {
        return refuse("a table whose time column is not a partition column (a by-rows backfill)");
    }
    if plan.report.range.rows.is_some() {
        return refuse(
            "a run scoped by `--where` (its files are rewritten with their other rows carried over)",
        );
    }
    if layout.partition_columns.is_empty() {
        return refuse("an unpartitioned table");
    }
    if layout.is_timeless() {
        return refuse("a table with no time column");
    }
    if plan.report.reads_own_past {
        return refuse(
            "a model that reads its own past (staged one partition at a time, in order)",
        );
    }
    if !matches!(plan.publish(), Publish::Rewrite) {
        return refuse("a run that publishes adjustments");
    }
    match plan.kind {
        RunKind::CascadeNode { .. } => return refuse("a cascade"),
        RunKind::Revert { .. } | RunKind::LogicalRevert { .. } => return refuse("a revert"),
        RunKind::Backfill if plan.sources.iter().any(|s| s.overlay.is_some()) => {
            return refuse("a cascade");
        }
        RunKind::Backfill => {}
    }
    for source in &plan.sources {
        pinned::check_source(&source.name, &source.table, engine)?;
    }
    Ok(())
}

/// The store a table at `url` lives in (scheme and authority: `s3://bucket`, `file://`) and the
/// table's path from that store's root.
fn store_location(url: &url::Url) -> Result<(ObjectStoreUrl, deltalake::Path)> {
    let store = ObjectStoreUrl::parse(format!(
        "{}://{}",
        url.scheme(),
        &url[url::Position::BeforeHost..url::Position::AfterPort]
    ))
    .map_err(|e| Error::Internal(format!("cannot name the store of `{url}`: {e}")))?;
    let root = deltalake::Path::from_url_path(url.path())
        .map_err(|e| Error::Internal(format!("cannot read the path of `{url}`: {e}")))?;
    Ok((store, root))
}

/// `df://HOST:PORT` (port 50050 by default) as the scheduler's gRPC address.
fn scheduler_url(engine: &str) -> Result<String> {
    let bad = |message: &str| Error::InvalidOption {
        option: "--engine".into(),
        value: engine.into(),
        message: message.into(),
    };
    let address = engine
        .strip_prefix("df://")
        .ok_or_else(|| bad("expected `local` or a Ballista scheduler as `df://HOST:PORT`"))?
        .trim_end_matches('/');
    if address.is_empty() || address.contains('/') {
        return Err(bad("expected a Ballista scheduler as `df://HOST:PORT`"));
    }
    if address.contains(':') {
        Ok(format!("http://{address}"))
    } else {
        Ok(format!("http://{address}:50050"))
    }
}

/// Runs one batch as one Ballista job; returns what it staged.
async fn stage_batch(
    plan: &BackfillPlan,
    batch: &BatchPlan,
    target_schema: SchemaRef,
    scheduler: &str,
    engine: &str,
    lease: Option<u64>,
) -> Result<BatchRecord> {
    tracing::debug!(batch = batch.index, start = %batch.start, end = %batch.end, %engine, "staging batch on the cluster");
    let mut config = SessionConfig::new_with_ballista()
        .with_target_partitions(TASKS)
        .with_ballista_physical_extension_codec(Arc::new(writer::LakefillCodec::default()));
    lakefill_table::resources::read_as_spark_wrote(config.options_mut());
    // Filters on a timestamp's date compare the timestamp, as locally (the rewrite yields plain
    // expressions the cluster decodes; the physical one, a function of lakefill's, stays local).
    let state = lakefill_table::fastcast::with_logical_rule(
        deltalake::datafusion::execution::SessionStateBuilder::new()
            .with_config(config.clone())
            .with_default_features()
            .build(),
    );
    let ctx = SessionContext::new_with_state(state);
    for source in &plan.sources {
        let provider = Arc::new(pinned::pinned_source(&source.name, &source.table)?);
        register_source_with(&ctx, plan, source, batch, provider).await?;
    }
    let df = model_dataframe(&ctx, plan, batch).await?;
    let produced = lakefill_recompute::plan::query::produced_columns(&df);
    let df = target_projection(plan, df, &target_schema)?;
    let what = || {
        format!(
            "cannot stage batch {}..{} of `{}` on the cluster at {engine}",
            batch.start,
            batch.end,
            plan.model.name()
        )
    };
    let physical = df.create_physical_plan().await.query_context(what)?;
    let keys: Vec<Arc<dyn PhysicalExpr>> = plan
        .report
        .layout
        .partition_columns
        .iter()
        .map(|c| {
            let index = target_schema.index_of(c).map_err(|_| {
                Error::Internal(format!(
                    "partition column `{c}` is not in the target schema"
                ))
            })?;
            Ok(Arc::new(Column::new(c, index)) as Arc<dyn PhysicalExpr>)
        })
        .collect::<Result<_>>()?;
    let repartitioned =
        RepartitionExec::try_new(physical, Partitioning::Hash(keys, TASKS)).query_context(what)?;
    let spec = WriteSpec::of(plan, batch).assigning_identity(plan, &produced);
    let node: Arc<dyn ExecutionPlan> = Arc::new(writer::StageWriterExec::new(
        Arc::new(repartitioned),
        spec.clone(),
        plan.target.table_url().to_string(),
        lease,
    ));
    let codec = writer::LakefillCodec::default();
    let batches = submit::run_job(scheduler, node, &codec, &config).await?;
    let mut results = Vec::new();
    for rows in &batches {
        let partitions = rows
            .column(0)
            .as_primitive::<deltalake::arrow::datatypes::UInt32Type>();
        let attempts = rows.column(1).as_string::<i32>();
        let writers = rows.column(2).as_string::<i32>();
        let written = rows.column(3).as_string::<i32>();
        for i in 0..rows.num_rows() {
            if partitions.is_null(i) || written.is_null(i) {
                return Err(Error::Internal(
                    "a writer task returned an empty result".into(),
                ));
            }
            let value: Written = serde_json::from_str(written.value(i)).map_err(|e| {
                Error::Internal(format!("a writer task returned an unreadable result: {e}"))
            })?;
            results.push(TaskResult {
                partition: partitions.value(i),
                attempt: attempts.value(i).to_string(),
                writer: writers.value(i).to_string(),
                written: value,
            });
        }
    }
    let (written, strays) = gather(&spec, results, TASKS)?;
    let record = written.into_record(&spec)?;
    delete_strays(plan, &record, &strays).await?;
    Ok(record)
}

/// One writer task's result.
#[derive(Debug)]
struct TaskResult {
    partition: u32,
    attempt: String,
    /// The process that ran the task.
    writer: String,
    written: Written,
}

/// Adds up the results of a batch's writer tasks. A task's partition number is its own (Ballista
/// cuts each task's plan to one partition), so a re-run task is recognised by what it wrote: the
/// hash repartition sends each target partition to one task, so two results that staged the same
/// partition directories are two attempts of one task; the first is kept and the other's files
/// are returned as strays. Results that share only some directories cannot come from one
/// repartition, and fail the batch. Errs when fewer than `tasks` results came back.
fn gather(
    spec: &WriteSpec,
    results: Vec<TaskResult>,
    tasks: usize,
) -> Result<(Written, Vec<String>)> {
    if results.len() < tasks {
        return Err(Error::Internal(format!(
            "the cluster returned {} writer results for batch {}..{}, expected {tasks}",
            results.len(),
            spec.batch.start,
            spec.batch.end
        )));
    }
    let directories = |result: &TaskResult| -> BTreeSet<String> {
        result
            .written
            .record
            .iter()
            .flat_map(|r| r.files.iter())
            .filter_map(|a| a.path.rsplit_once('/').map(|(dir, _)| dir.to_string()))
            .collect()
    };
    let mut kept: Vec<TaskResult> = Vec::new();
    let mut owner: BTreeMap<String, usize> = BTreeMap::new();
    let mut strays = Vec::new();
    for result in results {
        let dirs = directories(&result);
        let owners: BTreeSet<usize> = dirs.iter().filter_map(|d| owner.get(d).copied()).collect();
        match owners.len() {
            0 => {
                for dir in dirs {
                    owner.insert(dir, kept.len());
                }
                kept.push(result);
            }
            1 if owners
                .first()
                .is_some_and(|k| directories(&kept[*k]) == dirs) =>
            {
                let first = &kept[*owners.first().unwrap_or(&0)];
                tracing::warn!(task = result.partition, kept = %first.attempt, dropped = %result.attempt, "a writer task reported twice (a re-run): its second result is dropped");
                strays.extend(
                    result
                        .written
                        .record
                        .iter()
                        .flat_map(|r| r.files.iter().map(|a| a.path.clone())),
                );
            }
            _ => {
                return Err(Error::Internal(format!(
                    "two writer tasks of batch {}..{} staged some of the same partitions ({}); run the same command again",
                    spec.batch.start,
                    spec.batch.end,
                    dirs.iter()
                        .filter(|d| owner.contains_key(*d))
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
        }
    }
    let mut total = spec.batch.empty_record();
    let mut off_grain: BTreeMap<String, u64> = BTreeMap::new();
    for result in kept {
        for (value, count) in result.written.off_grain {
            *off_grain.entry(value).or_default() += count;
        }
        let Some(record) = result.written.record else {
            continue;
        };
        // Every process that ran a writer task, with the files it wrote (none where its hash
        // partition held no rows): which executor gets a task with rows is the scheduler's
        // timing, that both took part is not.
        *total.writers.entry(result.writer).or_default() += record.files.len() as u64;
        total.files.extend(record.files);
        for (label, count) in record.rows {
            *total.rows.entry(label).or_default() += count;
        }
        for (label, count) in record.spill {
            *total.spill.entry(label).or_default() += count;
        }
        for (label, sums) in record.sums {
            let into = total.sums.entry(label).or_default();
            for (measure, sum) in sums {
                *into.entry(measure).or_default() += sum;
            }
        }
        for (label, checksum) in record.checksums {
            total.checksums.entry(label).or_default().merge(&checksum);
        }
    }
    let record = off_grain.is_empty().then_some(total);
    Ok((Written { record, off_grain }, strays))
}

/// Deletes what the batch's writer tasks staged that its record does not list: the files of a
/// re-run task's second result, and of attempts that failed after writing.
async fn delete_strays(plan: &BackfillPlan, record: &BatchRecord, strays: &[String]) -> Result<()> {
    let store = plan.target.object_store();
    let normal = |path: &str| lakefill_table::storage::object_path(path).to_string();
    let listed: BTreeSet<String> = record.files.iter().map(|a| normal(&a.path)).collect();
    // Every staging directory the batch wrote to (a partition's is written by one task).
    let dirs: BTreeSet<String> = record
        .files
        .iter()
        .filter_map(|a| {
            normal(&a.path)
                .rsplit_once('/')
                .map(|(dir, _)| dir.to_string())
        })
        .collect();
    let mut doomed: BTreeSet<String> = strays
        .iter()
        .map(|p| normal(p))
        .filter(|p| !listed.contains(p))
        .collect();
    for dir in dirs {
        let prefix = lakefill_table::storage::object_path(&dir);
        let objects: Vec<_> = store
            .list(Some(&prefix))
            .try_collect()
            .await
            .map_err(|source| Error::Storage {
                path: dir.clone(),
                source,
            })?;
        for object in objects {
            let path = object.location.to_string();
            if !listed.contains(&path) {
                doomed.insert(path);
            }
        }
    }
    for path in doomed {
        tracing::warn!(%path, "deleting a file a writer task staged but the batch does not keep");
        match store
            .delete(&lakefill_table::storage::object_path(&path))
            .await
        {
            Ok(()) | Err(deltalake::ObjectStoreError::NotFound { .. }) => {}
            Err(source) => return Err(Error::Storage { path, source }),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::kernel::Add;
    use lakefill_table::partition::{Layout, PartitionRange};
    use lakefill_table::rowhash::RowChecksum;
    use lakefill_table::run_id::RunId;

    fn spec() -> WriteSpec {
        let layout = Layout::legacy("d", false);
        let (range, _) =
            PartitionRange::parse("2026-01-01", "2026-01-04", &layout.time, false).expect("range");
        WriteSpec {
            target: "events".into(),
            model: "events".into(),
            model_version: "v2".into(),
            layout,
            range,
            run_id: RunId::parse("r1").expect("run id"),
            measures: vec!["amount".into()],
            key: vec!["id".into()],
            batch: BatchPlan {
                index: 0,
                start: "2026-01-01".into(),
                end: "2026-01-04".into(),
                partitions: Vec::new(),
                null: false,
                carry: false,
            },
            mapping: lakefill_table::mapping::ColumnMapping::default(),
            identity: Vec::new(),
            vectors: None,
        }
    }

    /// A task's result: `files` per day (a file of 10 rows each), written by `writer`.
    fn result(task: u32, writer: &str, days: &[(&str, usize)]) -> TaskResult {
        let mut record = spec().batch.empty_record();
        for (day, files) in days {
            for f in 0..*files {
                record.files.push(Add {
                    path: format!("d={day}/lakefill-r1/part-{task}-{writer}-{f}.parquet"),
                    size: 1,
                    ..Default::default()
                });
                *record.rows.entry(day.to_string()).or_default() += 10;
                *record
                    .sums
                    .entry(day.to_string())
                    .or_default()
                    .entry("amount".into())
                    .or_default() += 1.5;
                let mut checksum = RowChecksum::default();
                checksum.add_hashes(&[u64::from(task) + 1; 10]);
                record
                    .checksums
                    .entry(day.to_string())
                    .or_default()
                    .merge(&checksum);
            }
        }
        TaskResult {
            partition: 0,
            attempt: format!("{task}-{writer}"),
            writer: writer.into(),
            written: Written {
                record: Some(record),
                off_grain: BTreeMap::new(),
            },
        }
    }

    #[test]
    fn a_re_run_task_counts_once_and_its_files_are_strays() {
        let results = vec![
            result(1, "a", &[("2026-01-01", 2), ("2026-01-03", 1)]),
            result(2, "b", &[("2026-01-02", 1)]),
            // Task 1 again, on the other executor: the same partitions.
            result(1, "b", &[("2026-01-01", 2), ("2026-01-03", 1)]),
            // A task whose hash partition held no rows, on a third process.
            result(3, "c", &[]),
        ];
        let (written, strays) = gather(&spec(), results, 4).expect("gathered");
        let record = written.record.expect("record");
        assert_eq!(
            record.rows,
            BTreeMap::from([
                ("2026-01-01".to_string(), 20),
                ("2026-01-02".to_string(), 10),
                ("2026-01-03".to_string(), 10)
            ])
        );
        assert_eq!(record.files.len(), 4);
        assert_eq!(record.sums["2026-01-01"]["amount"], 3.0);
        assert_eq!(record.checksums["2026-01-01"].rows, 20);
        assert_eq!(
            record.writers,
            BTreeMap::from([
                ("a".to_string(), 3),
                ("b".to_string(), 1),
                ("c".to_string(), 0)
            ]),
            "the process of the empty task is named, with no files"
        );
        let mut strays = strays;
        strays.sort();
        assert_eq!(
            strays,
            vec![
                "d=2026-01-01/lakefill-r1/part-1-b-0.parquet",
                "d=2026-01-01/lakefill-r1/part-1-b-1.parquet",
                "d=2026-01-03/lakefill-r1/part-1-b-0.parquet",
            ]
        );
    }

    #[test]
    fn results_that_overlap_in_part_or_fall_short_fail_the_batch() {
        let overlapping = vec![
            result(1, "a", &[("2026-01-01", 1), ("2026-01-02", 1)]),
            result(2, "b", &[("2026-01-02", 1), ("2026-01-03", 1)]),
        ];
        let message = gather(&spec(), overlapping, 2)
            .expect_err("overlap")
            .to_string();
        assert!(message.contains("d=2026-01-02/lakefill-r1"), "{message}");
        let short = vec![result(1, "a", &[("2026-01-01", 1)])];
        let message = gather(&spec(), short, 2).expect_err("short").to_string();
        assert!(message.contains("expected 2"), "{message}");
    }

    #[test]
    fn off_grain_rows_of_any_task_fail_the_batch_by_name() {
        let mut odd = result(2, "b", &[]);
        odd.written.off_grain = BTreeMap::from([("2026-01-15".to_string(), 3)]);
        let (written, _) =
            gather(&spec(), vec![result(1, "a", &[("2026-01-01", 1)]), odd], 2).expect("gathered");
        let error = written.into_record(&spec()).expect_err("off grain");
        assert!(matches!(error, Error::OffGrain { .. }), "{error}");
    }

    #[test]
    fn the_engine_is_a_scheduler_address() {
        assert_eq!(
            scheduler_url("df://10.0.0.5:50051").expect("url"),
            "http://10.0.0.5:50051"
        );
        assert_eq!(
            scheduler_url("df://sched").expect("url"),
            "http://sched:50050"
        );
        assert!(scheduler_url("http://sched:50050").is_err());
        assert!(scheduler_url("df://").is_err());
        assert!(scheduler_url("df://a/b").is_err());
    }
}
