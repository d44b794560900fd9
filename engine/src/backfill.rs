//! Running a plan: stage, check, publish, and the report of what happened (DESIGN §4).
//!
//! This module sequences the phases and keeps the journal current; the phases themselves live in
//! [`crate::execute`] and [`crate::publish`].

use std::collections::BTreeMap;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::time::Instant;

use deltalake::logstore::object_store::ObjectStoreExt as _;
use serde::Serialize;
use serde_json::json;

use crate::error::{Error, Result};
use crate::execute::{StageOptions, stage};
use crate::journal::{JOURNAL_FORMAT, Journal, RunState, now};
use crate::partition::PartitionRange;
use crate::plan::BackfillPlan;
use crate::publish::commit;

/// Runs a [`BackfillPlan`]: stage, check, publish.
#[must_use = "a BackfillBuilder does nothing until it is awaited"]
pub struct BackfillBuilder {
    plan: BackfillPlan,
    max_parallel: Option<usize>,
}

impl BackfillBuilder {
    /// Prepares to run `plan`.
    pub fn new(plan: BackfillPlan) -> Self {
        Self {
            plan,
            max_parallel: None,
        }
    }

    /// Sets the number of batches in flight.
    ///
    /// By default, the number of cores.
    pub fn with_max_parallel(mut self, max_parallel: Option<usize>) -> Self {
        self.max_parallel = max_parallel;
        self
    }

    #[tracing::instrument(skip_all, fields(table = %self.plan.report.target, model = %self.plan.report.model, version = %self.plan.report.model_version))]
    async fn run(self) -> Result<RunReport> {
        let plan = self.plan;
        let report = &plan.report;
        let store = plan.target.object_store();
        let started = Instant::now();

        if report.already_published {
            let journal = Journal::load(&store, &report.run_id).await?;
            tracing::info!(run_id = %report.run_id, "run already published");
            return Ok(RunReport::already_published(&plan, journal.as_ref()));
        }

        let mut journal = Journal {
            format: JOURNAL_FORMAT,
            run_id: report.run_id.clone(),
            state: RunState::Staging,
            model: report.model.clone(),
            model_version: report.model_version.clone(),
            fingerprint: report.fingerprint.clone(),
            target: report.target.clone(),
            read_version: report.read_version,
            range: report.range.clone(),
            sources: report
                .sources
                .iter()
                .map(|s| (s.table.clone(), s.version))
                .collect(),
            reason: report.reason.clone(),
            batches: Vec::new(),
            published_version: None,
            error: None,
            created_at: now(),
            updated_at: now(),
        };
        journal.save(&store).await?;

        let max_parallel = self
            .max_parallel
            .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
            .unwrap_or(1);
        let options = StageOptions { max_parallel };
        let staged = {
            let journal_ref = &mut journal;
            let store_ref = &store;
            let mut records = Vec::new();
            let result = stage(&plan, &options, |record| {
                records.push(record.clone());
                journal_ref.batches.push(record);
                async move { Ok(()) }
            })
            .await;
            // Journal what finished, whatever happened.
            journal_ref.batches.sort_by_key(|b| b.index);
            if let Err(error) = result {
                fail(journal_ref, store_ref, &plan, &error, true).await;
                return Err(error);
            }
            records
        };
        let stage_time = started.elapsed();

        let spill: BTreeMap<String, u64> = staged.iter().flat_map(|b| b.spill.clone()).fold(
            BTreeMap::new(),
            |mut acc, (partition, rows)| {
                *acc.entry(partition).or_default() += rows;
                acc
            },
        );
        let spilled: u64 = spill.values().sum();
        if spilled > 0 && report.allow_spill.is_none() {
            let first = spill.keys().next().cloned().unwrap_or_default();
            let last = spill.keys().last().cloned().unwrap_or_default();
            let error = Error::Spill {
                model: report.model.clone(),
                range: format!("{}..={}", report.range.from, report.range.to),
                partitions: spill.clone().into_iter().collect(),
                total: spilled,
                suggested: Box::new((
                    first.min(report.range.from.clone()),
                    last.max(report.range.to.clone()),
                )),
            };
            fail(&mut journal, &store, &plan, &error, true).await;
            return Err(error);
        }
        journal.state = RunState::Staged;
        journal.save(&store).await?;

        let mut new_rows: BTreeMap<String, u64> = BTreeMap::new();
        let mut new_files: BTreeMap<String, u64> = BTreeMap::new();
        let mut adds = Vec::new();
        let mut bytes_written = 0u64;
        for record in &staged {
            for (partition, rows) in &record.rows {
                *new_rows.entry(partition.clone()).or_default() += rows;
            }
            for add in &record.files {
                let partition = add
                    .partition_values
                    .get(&report.partition_column)
                    .cloned()
                    .flatten()
                    .unwrap_or_default();
                *new_files.entry(partition).or_default() += 1;
                bytes_written += u64::try_from(add.size).unwrap_or(0);
                adds.push(add.clone());
            }
        }
        // Partitions of the plan, plus new string partitions the model produced.
        let mut partitions: Vec<PartitionChange> = report
            .partitions
            .iter()
            .map(|p| PartitionChange {
                value: p.value.clone(),
                old_rows: p.rows,
                new_rows: new_rows.get(&p.value).copied().unwrap_or(0),
                old_files: p.files,
                new_files: new_files.get(&p.value).copied().unwrap_or(0),
            })
            .collect();
        for (value, rows) in &new_rows {
            if !partitions.iter().any(|p| &p.value == value) {
                partitions.push(PartitionChange {
                    value: value.clone(),
                    old_rows: Some(0),
                    new_rows: *rows,
                    old_files: 0,
                    new_files: new_files.get(value).copied().unwrap_or(0),
                });
            }
        }
        partitions.sort_by(|a, b| a.value.cmp(&b.value));

        let validation = json!({
            "passed": true,
            "checks": [
                {"name": "schema", "passed": true},
                {"name": "spill", "passed": true, "rows_outside_range": spilled, "dropped": spilled},
            ],
        });
        let metadata = json!({
            "run_id": report.run_id,
            "model": report.model,
            "model_version": report.model_version,
            "fingerprint": report.fingerprint,
            "sources": report.sources.iter().map(|s| (s.table.clone(), s.version)).collect::<BTreeMap<_, _>>(),
            "range": [report.range.from, report.range.to],
            "read_version": report.read_version,
            "reason": report.reason,
            "partitions": partitions.iter().map(|p| json!({"value": p.value, "old_rows": p.old_rows, "new_rows": p.new_rows})).collect::<Vec<_>>(),
            "spill_dropped": spilled,
            "validation": validation,
        });
        let publish_started = Instant::now();
        let published_version = match commit(&plan, adds, metadata).await {
            Ok(version) => version,
            Err(error) => {
                // The staged files stay: the run can be re-validated or discarded.
                let keep_state = matches!(error, Error::Conflict { .. });
                fail(&mut journal, &store, &plan, &error, !keep_state).await;
                return Err(error);
            }
        };
        journal.state = RunState::Published;
        journal.published_version = Some(published_version);
        journal.save(&store).await?;
        tracing::info!(run_id = %report.run_id, version = published_version, "published");

        Ok(RunReport {
            run_id: report.run_id.clone(),
            state: RunState::Published,
            outcome: Outcome::Published,
            table: report.target.clone(),
            model: report.model.clone(),
            model_version: report.model_version.clone(),
            fingerprint: report.fingerprint.clone(),
            read_version: report.read_version,
            published_version: Some(published_version),
            range: report.range.clone(),
            partitions,
            rows_written: new_rows.values().sum(),
            files_written: new_files.values().sum(),
            bytes_written,
            spill_dropped: spilled,
            spill: spill.into_iter().collect(),
            validation,
            timings: Timings {
                stage_ms: stage_time.as_millis() as u64,
                publish_ms: publish_started.elapsed().as_millis() as u64,
                total_ms: started.elapsed().as_millis() as u64,
            },
        })
    }
}

impl IntoFuture for BackfillBuilder {
    type Output = Result<RunReport>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.run())
    }
}

/// Records a failure in the journal and, when `delete_staged`, removes the run's staged files.
/// Best effort: the original error is what the caller reports.
async fn fail(
    journal: &mut Journal,
    store: &std::sync::Arc<dyn deltalake::ObjectStore>,
    plan: &BackfillPlan,
    error: &Error,
    delete_staged: bool,
) {
    journal.error = Some(error.to_string());
    if delete_staged {
        journal.state = RunState::Failed;
        for add in journal.staged_files() {
            let path = deltalake::Path::from(add.path.as_str());
            if let Err(e) = store.delete(&path).await {
                tracing::warn!(path = %path, error = %e, "cannot delete a staged file of a failed run; `lakefill gc` will");
            }
        }
    } else {
        journal.state = RunState::Staged;
    }
    if let Err(e) = journal.save(store).await {
        tracing::warn!(run_id = %plan.report.run_id, error = %e, "cannot record the failure in the run journal");
    }
}

/// What a backfill did (DESIGN §3 JSON contract).
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    /// The run id.
    pub run_id: String,
    /// State of the run at the end.
    pub state: RunState,
    /// What this invocation did.
    pub outcome: Outcome,
    /// Target table.
    pub table: String,
    /// Model name.
    pub model: String,
    /// Model version.
    pub model_version: String,
    /// Model fingerprint.
    pub fingerprint: String,
    /// Version the run read.
    pub read_version: u64,
    /// Version the run's commit created; `null` when nothing was published.
    pub published_version: Option<u64>,
    /// The range.
    pub range: PartitionRange,
    /// Per partition: old and new row counts.
    pub partitions: Vec<PartitionChange>,
    /// Rows staged.
    pub rows_written: u64,
    /// Files staged.
    pub files_written: u64,
    /// Bytes staged.
    pub bytes_written: u64,
    /// Rows for partitions outside the range that were dropped (`--allow-spill drop`).
    pub spill_dropped: u64,
    /// Those rows per partition.
    pub spill: Vec<(String, u64)>,
    /// The checks that ran and their results.
    pub validation: serde_json::Value,
    /// Wall time per phase.
    pub timings: Timings,
}

/// What one invocation of a backfill did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// A new version was committed.
    Published,
    /// The run had been published before; nothing changed.
    AlreadyPublished,
}

/// Per-partition change.
#[derive(Debug, Clone, Serialize)]
pub struct PartitionChange {
    /// Partition value.
    pub value: String,
    /// Rows before (from the log), when known.
    pub old_rows: Option<u64>,
    /// Rows after.
    pub new_rows: u64,
    /// Files before.
    pub old_files: u64,
    /// Files after.
    pub new_files: u64,
}

/// Wall time per phase, in milliseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Timings {
    /// Running the model and writing staged files.
    pub stage_ms: u64,
    /// The commit.
    pub publish_ms: u64,
    /// The whole run.
    pub total_ms: u64,
}

impl RunReport {
    fn already_published(plan: &BackfillPlan, journal: Option<&Journal>) -> Self {
        let report = &plan.report;
        Self {
            run_id: report.run_id.clone(),
            state: RunState::Published,
            outcome: Outcome::AlreadyPublished,
            table: report.target.clone(),
            model: report.model.clone(),
            model_version: report.model_version.clone(),
            fingerprint: report.fingerprint.clone(),
            read_version: journal.map_or(report.read_version, |j| j.read_version),
            published_version: journal.and_then(|j| j.published_version),
            range: report.range.clone(),
            partitions: report
                .partitions
                .iter()
                .map(|p| PartitionChange {
                    value: p.value.clone(),
                    old_rows: p.rows,
                    new_rows: p.rows.unwrap_or(0),
                    old_files: p.files,
                    new_files: p.files,
                })
                .collect(),
            rows_written: 0,
            files_written: 0,
            bytes_written: 0,
            spill_dropped: 0,
            spill: Vec::new(),
            validation: json!({"passed": true, "checks": []}),
            timings: Timings {
                stage_ms: 0,
                publish_ms: 0,
                total_ms: 0,
            },
        }
    }
}
