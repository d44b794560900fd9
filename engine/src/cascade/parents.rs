//! Whether a cascade node may still be published: its parents, where it reads them, are what it
//! was computed from.

use lakefill_log::journal::cascade::CascadeRecord;
use lakefill_log::journal::{Journal, RunState};
use lakefill_table::config::Project;
use lakefill_table::error::{Error, Result};
use lakefill_table::model::Model;
use lakefill_table::run_id::RunId;
use lakefill_table::storage::{loaded_version, open_table};

/// Refuses to publish node `index` of a cascade when one of its parents has changed, since the
/// node read it, where the node reads it: a commit of the parent's table after the version the
/// node read, other than the parent run's own, that added or removed files in the node's window
/// of it (its range widened by the source's lookback and lookahead; anywhere, when the node
/// reads the parent without a window on its partitions). A node already published, or whose
/// journal is gone, is left to `publish` itself.
pub(crate) async fn check_parents(
    project: &Project,
    record: &CascadeRecord,
    index: usize,
) -> Result<()> {
    if index == 0 {
        return Ok(()); // The root has no parent in the cascade.
    }
    let node = &record.nodes[index];
    let config = project.table(&node.table, "the cascade record")?;
    let table = open_table(config, None).await?;
    let Some(journal) = Journal::load(&table.object_store(), &RunId::parse(&node.run_id)?).await?
    else {
        return Ok(());
    };
    if journal.progress.state == RunState::Published {
        return Ok(());
    }
    let model = Model::load(
        project,
        &journal.inputs.model,
        Some(&journal.inputs.model_version),
    )?;
    for parent in &record.nodes[..index] {
        let Some(&read) = journal.inputs.sources.get(&parent.table) else {
            continue;
        };
        let parent_table =
            open_table(project.table(&parent.table, "the cascade record")?, None).await?;
        let parent_run =
            Journal::load(&parent_table.object_store(), &RunId::parse(&parent.run_id)?).await?;
        let own = parent_run
            .as_ref()
            .and_then(|j| j.outcome.published_version);
        let window = parent_run.as_ref().and_then(|parent_run| {
            let spec = model.header().sources.get(&parent.table)?;
            read_window(&journal, spec, &parent_run.inputs.layout)
        });
        let mut moved = Vec::new();
        for version in read + 1..=loaded_version(&parent_table)? {
            if Some(version) == own {
                continue;
            }
            let touched = match lakefill_log::read_commit(&parent_table, version).await? {
                Some(commit) if commit.added + commit.removed == 0 => false,
                Some(commit) => match &window {
                    Some((layout, low, high)) => commit.partitions.iter().any(|values| {
                        // A partition whose time cannot be read may hold anything.
                        match layout.time.period_of(values) {
                            Ok(Some(period)) => period.start() < *high && *low < period.end(),
                            Ok(None) => false,
                            Err(_) => true,
                        }
                    }),
                    None => true,
                },
                // Its commit is no longer in the log: it may have.
                None => true,
            };
            if touched {
                moved.push(version);
            }
        }
        if !moved.is_empty() {
            let (from, to) = match Journal::load(
                &open_table(
                    project.table(&record.nodes[0].table, "the cascade record")?,
                    None,
                )
                .await?
                .object_store(),
                &RunId::parse(&record.nodes[0].run_id)?,
            )
            .await?
            {
                Some(root) => (root.inputs.range.from, root.inputs.range.to),
                None => ("FROM".into(), "TO".into()),
            };
            return Err(Error::CascadeParentMoved(Box::new(
                lakefill_table::error::ParentMoved {
                    cascade: record.cascade_id.clone(),
                    table: node.table.clone(),
                    parent: parent.table.clone(),
                    read,
                    versions: moved,
                    rerun: format!(
                        "lakefill backfill {} --from {from} --to {to} --cascade",
                        record.root
                    ),
                },
            )));
        }
    }
    Ok(())
}

/// What a node read of a parent, as times: its range widened by the source's lookback and
/// lookahead, when the source's window is the parent's partition time column (so that a
/// commit's partitions tell whether it reached into it); `None` when any commit may have.
fn read_window(
    journal: &Journal,
    spec: &lakefill_table::model::SourceSpec,
    parent_layout: &lakefill_table::partition::Layout,
) -> Option<(
    lakefill_table::partition::Layout,
    chrono::NaiveDateTime,
    chrono::NaiveDateTime,
)> {
    let window = spec.window.as_ref()?;
    let columns = parent_layout.time.encoding.columns();
    if parent_layout.by_rows
        || window
            .iter()
            .map(String::as_str)
            .ne(columns.iter().copied())
    {
        return None;
    }
    let grain = parent_layout.time.grain;
    let first = journal.inputs.range.first()?;
    let last = journal.inputs.range.last()?;
    let low = lakefill_table::time::Period::containing(grain, first.start())?
        .offset(-i64::from(spec.lookback))?;
    let high = lakefill_table::time::Period::containing(
        grain,
        last.end() - chrono::TimeDelta::microseconds(1),
    )?
    .offset(i64::from(spec.lookahead))?;
    Some((parent_layout.clone(), low.start(), high.end()))
}
