//! `stale` (#37): which published partitions of a table no longer match their inputs, from the
//! Delta logs alone.
//!
//! Every file lakefill writes lives in `<partition>/lakefill-<run_id>/`, and every run's journal
//! records the version it read each source at and the model version it ran. So a partition's
//! lineage is read from its live files' paths, and whether its inputs moved since from the
//! sources' logs: a commit after the pinned version that added or removed files with
//! `dataChange` inside the partition's window of the source (its period widened by the source's
//! lookback and lookahead, at the source's grain) makes it stale. A compaction (`dataChange`
//! false) does not; a source read without a window is touched by any change. A partition
//! written by an older version of the model than the newest in `sql/` is reported apart, and one
//! with a file lakefill did not write (or whose run's journal is gone) has unknown lineage. No
//! data file is read.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use chrono::{NaiveDateTime, TimeDelta};
use deltalake::DeltaTable;
use serde::Serialize;

use super::history::table_layout;
use lakefill_log::journal::Journal;
use lakefill_recompute::plan::{SourceWindow, find_downstream, source_window};
use lakefill_table::config::Project;
use lakefill_table::error::{DeltaContext, Error, Result};
use lakefill_table::model::{Model, list_models, list_versions};
use lakefill_table::partition::Layout;
use lakefill_table::run_id::RunId;
use lakefill_table::storage::{loaded_version, open_table};
use lakefill_table::time::Period;

/// What `lakefill stale` says about one table.
#[derive(Debug, Clone, Serialize)]
pub struct StaleReport {
    /// The table.
    pub table: String,
    /// The model that writes it (the newest that names it as its target), if any.
    pub model: Option<String>,
    /// The version of the table the partitions were read at.
    pub version: u64,
    /// Partitions of the table looked at (those with a time).
    pub partitions: usize,
    /// Ranges whose sources changed, where they read them, since they were written.
    pub stale: Vec<StaleRange>,
    /// Ranges written by an older version of the model than the newest in `sql/`.
    pub outdated: Vec<OutdatedRange>,
    /// Ranges holding a file lakefill did not write, or whose run's journal is gone.
    pub unknown: Vec<PartitionSpan>,
}

impl StaleReport {
    /// Whether anything needs refreshing: a stale or an outdated range.
    pub fn needs_refresh(&self) -> bool {
        !self.stale.is_empty() || !self.outdated.is_empty()
    }
}

/// Consecutive partitions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PartitionSpan {
    /// The first partition.
    pub from: String,
    /// The last partition.
    pub to: String,
    /// How many partitions.
    pub partitions: usize,
}

/// Consecutive stale partitions, why, and the command that refreshes them.
#[derive(Debug, Clone, Serialize)]
pub struct StaleRange {
    /// Where.
    #[serde(flatten)]
    pub span: PartitionSpan,
    /// The source commits that changed what these partitions read.
    pub changes: Vec<SourceChange>,
    /// The backfill that recomputes them.
    pub command: String,
}

/// Consecutive partitions written by an older model version.
#[derive(Debug, Clone, Serialize)]
pub struct OutdatedRange {
    /// Where.
    #[serde(flatten)]
    pub span: PartitionSpan,
    /// The model version that wrote them.
    pub model_version: String,
    /// The newest version in `sql/`.
    pub newest_version: String,
    /// The backfill that recomputes them with the newest version.
    pub command: String,
}

/// One commit of a source that changed data a partition read.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct SourceChange {
    /// The source table.
    pub table: String,
    /// The commit's version.
    pub version: u64,
    /// When it was committed (`commitInfo.timestamp`, RFC 3339), if the log says.
    pub timestamp: Option<String>,
    /// Its operation (`WRITE`, `DELETE`, ...), if the log says.
    pub operation: Option<String>,
    /// Rows it added (by the files' statistics).
    pub rows_added: u64,
    /// Rows it removed (by the remove actions' statistics, where they carry them).
    pub rows_removed: u64,
    /// Files it added or removed with `dataChange`.
    pub files: u64,
}

/// Where a source commit changed data: the instants `[start, end)` its files' times cover, or
/// anywhere (no window to tell by, or times it cannot read).
#[derive(Debug, Clone)]
enum Touched {
    Spans(Vec<(NaiveDateTime, NaiveDateTime)>),
    Anywhere,
}

impl Touched {
    fn overlaps(&self, low: NaiveDateTime, high: NaiveDateTime) -> bool {
        match self {
            Touched::Anywhere => true,
            Touched::Spans(spans) => spans.iter().any(|(s, e)| *s < high && low < *e),
        }
    }
}

/// What a run that wrote partitions of the table read.
struct Lineage {
    model: String,
    model_version: String,
    /// Each source read (not the table itself), at its pinned version, with the model's spec.
    sources: Vec<ReadSource>,
    cascade: Option<String>,
}

struct ReadSource {
    table: String,
    pinned: u64,
    lookback: u32,
    lookahead: u32,
    /// How its window selects times; `None`: read whole.
    window: Option<SourceWindow>,
}

/// Reports on each of `tables` (every table a model writes when `tables` is empty) and, with
/// `cascade`, on every table computed from them, downstream.
pub async fn stale(
    project: &Project,
    tables: &[String],
    cascade: bool,
) -> Result<Vec<StaleReport>> {
    let models: Vec<Model> = list_models(&project.sql_dir())
        .into_iter()
        .filter_map(|name| Model::load(project, &name, None).ok())
        .collect();
    let mut tables: Vec<String> = if tables.is_empty() {
        models
            .iter()
            .map(|m| m.header().target.clone())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect()
    } else {
        tables.to_vec()
    };
    if cascade {
        // Breadth first, each table once: a table computed from one of the list joins it.
        let mut next = 0;
        while next < tables.len() {
            let table = tables[next].clone();
            next += 1;
            for model in &models {
                let target = &model.header().target;
                if model.header().sources.contains_key(&table) && !tables.contains(target) {
                    tables.push(target.clone());
                }
            }
        }
    }
    let mut changes = ChangeCache::default();
    let mut reports = Vec::new();
    for table in &tables {
        reports.push(stale_table(project, table, &mut changes).await?);
    }
    Ok(reports)
}

async fn stale_table(
    project: &Project,
    name: &str,
    cache: &mut ChangeCache,
) -> Result<StaleReport> {
    let config = project.table(name, "the command line")?;
    let table = open_table(config, None).await?;
    let version = loaded_version(&table)?;
    let layout = table_layout(project, name, &table)
        .filter(|l| !l.by_rows)
        .ok_or_else(|| Error::Partitioning {
            message: format!(
                "`{name}` is not partitioned by a time lakefill can read, so its partitions cannot be matched with their sources' windows"
            ),
            hint: "`lakefill stale` reads tables partitioned by time (a DATE, a TIMESTAMP, a string of dates or integer parts)".into(),
        })?;
    let model = list_models(&project.sql_dir())
        .into_iter()
        .filter_map(|m| Model::load(project, &m, None).ok())
        .find(|m| m.header().target == name);
    let newest = model
        .as_ref()
        .and_then(|m| list_versions(&project.sql_dir().join(m.name())).pop());

    // Each partition's writers, from its live files' paths (`None`: not lakefill).
    let lineage_of = partition_writers(&table, &layout)?;
    let mut runs: HashMap<String, Option<Lineage>> = HashMap::new();
    for writers in lineage_of.values() {
        for run in writers.iter().flatten() {
            if !runs.contains_key(run) {
                let lineage = lineage(project, &table, name, run).await?;
                runs.insert(run.clone(), lineage);
            }
        }
    }

    let mut stale: BTreeMap<Period, BTreeSet<SourceChange>> = BTreeMap::new();
    let mut outdated: BTreeMap<Period, String> = BTreeMap::new();
    let mut unknown: BTreeSet<Period> = BTreeSet::new();
    for (period, writers) in &lineage_of {
        for writer in writers {
            let Some(lineage) = writer.as_ref().and_then(|run| runs[run].as_ref()) else {
                unknown.insert(*period);
                continue;
            };
            if let (Some(model), Some(newest)) = (&model, &newest)
                && lineage.model == model.name()
                && &lineage.model_version != newest
            {
                outdated.insert(*period, lineage.model_version.clone());
            }
            for source in &lineage.sources {
                let (low, high) = window_of(*period, source);
                for change in cache.changes(project, source).await? {
                    if change.cascade.is_some() && change.cascade == lineage.cascade {
                        // The parent's publish of the cascade this partition was computed in.
                        continue;
                    }
                    if change.touched.overlaps(low, high) {
                        stale
                            .entry(*period)
                            .or_default()
                            .insert(change.change.clone());
                    }
                }
            }
        }
    }

    let model_name = model.as_ref().map(|m| m.name().to_string());
    let cascade = model_name
        .as_deref()
        .is_some_and(|m| !find_downstream(project, m, name).is_empty());
    let command = |span: &PartitionSpan, version: Option<&str>| {
        let mut command = format!(
            "lakefill backfill {} --from {} --to {}",
            model_name.as_deref().unwrap_or("<model>"),
            span.from,
            span.to
        );
        if let Some(version) = version {
            command.push_str(&format!(" --model-version {version}"));
        }
        if cascade {
            command.push_str(" --cascade");
        }
        command
    };
    let stale = spans(stale.keys().copied())
        .into_iter()
        .map(|span| {
            let changes = stale
                .iter()
                .filter(|(p, _)| in_span(p, &span))
                .flat_map(|(_, c)| c.iter().cloned())
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            StaleRange {
                command: command(&span, None),
                span,
                changes,
            }
        })
        .collect();
    let mut by_version: BTreeMap<String, Vec<Period>> = BTreeMap::new();
    for (period, version) in outdated {
        by_version.entry(version).or_default().push(period);
    }
    let outdated = by_version
        .into_iter()
        .flat_map(|(version, periods)| {
            spans(periods)
                .into_iter()
                .map(move |span| (version.clone(), span))
        })
        .map(|(version, span)| OutdatedRange {
            command: command(&span, newest.as_deref()),
            span,
            model_version: version,
            newest_version: newest.clone().unwrap_or_default(),
        })
        .collect();
    Ok(StaleReport {
        table: name.to_string(),
        model: model_name,
        version,
        partitions: lineage_of.len(),
        stale,
        outdated,
        unknown: spans(unknown),
    })
}

/// Each partition of `table` with the runs that wrote its live files (`None` for a file outside
/// any run's directory).
fn partition_writers(
    table: &DeltaTable,
    layout: &Layout,
) -> Result<BTreeMap<Period, BTreeSet<Option<String>>>> {
    let snapshot = table
        .snapshot()
        .delta_context(|| "cannot read the snapshot".into())?;
    let mapping = lakefill_table::mapping::ColumnMapping::of_snapshot(snapshot)?;
    let mut out: BTreeMap<Period, BTreeSet<Option<String>>> = BTreeMap::new();
    for file in snapshot.log_data().iter() {
        let values = mapping.logical_values(file.partition_values_map());
        // The NULL partition and values off the grain have no window to match.
        let Ok(Some(period)) = layout.time.period_of(&values) else {
            continue;
        };
        let path = file.path().to_string();
        let run = path
            .split('/')
            .find_map(RunId::from_staging_dir)
            .map(|id| id.to_string());
        out.entry(period).or_default().insert(run);
    }
    Ok(out)
}

/// What run `run_id` read, from its journal; `None` when the journal is gone.
async fn lineage(
    project: &Project,
    table: &DeltaTable,
    name: &str,
    run_id: &str,
) -> Result<Option<Lineage>> {
    let Ok(id) = RunId::parse(run_id) else {
        return Ok(None);
    };
    let Some(journal) = Journal::load(&table.object_store(), &id).await? else {
        return Ok(None);
    };
    let inputs = &journal.inputs;
    let model = Model::load(project, &inputs.model, Some(&inputs.model_version)).ok();
    let mut sources = Vec::new();
    for (source, pinned) in &inputs.sources {
        if source == name || inputs.self_sources.contains(source) {
            continue;
        }
        let spec = model
            .as_ref()
            .and_then(|m| m.header().sources.get(source).cloned());
        let window = match (&model, &spec) {
            (Some(model), Some(spec)) if spec.window.is_some() => {
                let config = project.table(source, &format!("run `{run_id}`"))?;
                let opened = open_table(config, None).await?;
                source_window(model, source, spec, &opened)?
            }
            _ => None,
        };
        sources.push(ReadSource {
            table: source.clone(),
            pinned: *pinned,
            lookback: spec.as_ref().map_or(0, |s| s.lookback),
            lookahead: spec.as_ref().map_or(0, |s| s.lookahead),
            window,
        });
    }
    Ok(Some(Lineage {
        model: inputs.model.clone(),
        model_version: inputs.model_version.clone(),
        sources,
        cascade: inputs.kind.cascade().map(str::to_string),
    }))
}

/// The instants of `source` a partition of `period` reads: its period at the source's grain,
/// widened by the lookback and lookahead; everything when the source is read whole.
fn window_of(period: Period, source: &ReadSource) -> (NaiveDateTime, NaiveDateTime) {
    let Some(window) = &source.window else {
        return (NaiveDateTime::MIN, NaiveDateTime::MAX);
    };
    let grain = window.time.grain;
    let low = Period::containing(grain, period.start())
        .and_then(|p| p.offset(-i64::from(source.lookback)))
        .map_or(NaiveDateTime::MIN, |p| p.start());
    let high = Period::containing(grain, period.end() - TimeDelta::microseconds(1))
        .and_then(|p| p.offset(i64::from(source.lookahead)))
        .map_or(NaiveDateTime::MAX, |p| p.end());
    (low, high)
}

/// A source commit and where it changed data.
#[derive(Clone)]
struct TouchingChange {
    change: SourceChange,
    touched: Touched,
    /// The cascade whose node published it, if one did.
    cascade: Option<String>,
}

/// Each source's data-changing commits after a version, read once per (source, version).
#[derive(Default)]
struct ChangeCache {
    read: HashMap<(String, u64), Vec<TouchingChange>>,
}

impl ChangeCache {
    async fn changes(
        &mut self,
        project: &Project,
        source: &ReadSource,
    ) -> Result<&[TouchingChange]> {
        let key = (source.table.clone(), source.pinned);
        if !self.read.contains_key(&key) {
            let changes = read_changes(project, source).await?;
            self.read.insert(key.clone(), changes);
        }
        Ok(&self.read[&key])
    }
}

/// The commits of `source` after its pinned version that added or removed data.
async fn read_changes(project: &Project, source: &ReadSource) -> Result<Vec<TouchingChange>> {
    let config = project.table(&source.table, "a run's sources")?;
    let table = open_table(config, None).await?;
    let latest = loaded_version(&table)?;
    let mut out = Vec::new();
    for version in source.pinned + 1..=latest {
        let Some(commit) = lakefill_log::read_commit(&table, version).await? else {
            // Cleaned up from the log: it may have changed anything.
            out.push(TouchingChange {
                change: SourceChange {
                    table: source.table.clone(),
                    version,
                    timestamp: None,
                    operation: None,
                    rows_added: 0,
                    rows_removed: 0,
                    files: 0,
                },
                touched: Touched::Anywhere,
                cascade: None,
            });
            continue;
        };
        if commit.data_changes == 0 {
            continue;
        }
        let touched = match &source.window {
            None => Touched::Anywhere,
            Some(window) => touched(window, &commit),
        };
        // Remove actions seldom carry statistics; a lakefill commit counts the rows it replaced.
        let rows_removed = match commit.lakefill() {
            Some(meta) if commit.rows_removed == 0 => {
                meta.partitions.iter().filter_map(|p| p.old_rows).sum()
            }
            _ => commit.rows_removed,
        };
        out.push(TouchingChange {
            change: SourceChange {
                table: source.table.clone(),
                version,
                timestamp: commit.info["timestamp"].as_i64().and_then(|ms| {
                    chrono::DateTime::from_timestamp_millis(ms)
                        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
                }),
                operation: commit.info["operation"].as_str().map(str::to_string),
                rows_added: commit.rows_added,
                rows_removed,
                files: commit.data_changes,
            },
            touched,
            cascade: commit.info["lakefill"]["cascade"]
                .as_str()
                .map(str::to_string),
        });
    }
    Ok(out)
}

/// Where a commit's data-changing files lie in time: by their partition values when the window
/// is a partition column, else by their statistics' minimum and maximum of it.
fn touched(window: &SourceWindow, commit: &lakefill_log::Commit) -> Touched {
    let mut spans = Vec::new();
    for (values, stats) in commit.changed_values.iter().zip(&commit.changed_stats) {
        let span = if window.partition_column {
            match window.time.period_of(values) {
                Ok(Some(period)) => Some((period.start(), period.end())),
                // Rows with no time are read by no window.
                Ok(None) => continue,
                Err(_) => None,
            }
        } else {
            stats_span(window, stats.as_deref())
        };
        match span {
            Some(span) => spans.push(span),
            None => return Touched::Anywhere,
        }
    }
    Touched::Spans(spans)
}

/// The instants a file's statistics say its window column covers.
fn stats_span(
    window: &SourceWindow,
    stats: Option<&str>,
) -> Option<(NaiveDateTime, NaiveDateTime)> {
    let stats: serde_json::Value = serde_json::from_str(stats?).ok()?;
    let column = *window.time.encoding.columns().first()?;
    let instant = |bound: &str| window.time.instant_of(stats[bound][column].as_str()?);
    let min = Period::containing(window.time.grain, instant("minValues")?)?;
    let max = Period::containing(window.time.grain, instant("maxValues")?)?;
    Some((min.start(), max.end()))
}

/// Consecutive periods grouped into spans.
fn spans(periods: impl IntoIterator<Item = Period>) -> Vec<PartitionSpan> {
    let mut sorted: Vec<Period> = periods.into_iter().collect();
    sorted.sort();
    sorted.dedup();
    let mut out: Vec<(Period, Period, usize)> = Vec::new();
    for period in sorted {
        match out.last_mut() {
            Some((_, last, count)) if last.next() == Some(period) => {
                *last = period;
                *count += 1;
            }
            _ => out.push((period, period, 1)),
        }
    }
    out.into_iter()
        .map(|(from, to, partitions)| PartitionSpan {
            from: from.label(),
            to: to.label(),
            partitions,
        })
        .collect()
}

fn in_span(period: &Period, span: &PartitionSpan) -> bool {
    Period::from_label(period.grain(), &span.from).is_some_and(|from| from <= *period)
        && Period::from_label(period.grain(), &span.to).is_some_and(|to| *period <= to)
}
