//! How a command that ran or published something ends: its run report printed (a failed
//! validation then exits 3), and a report written to a file. Shared by `backfill` and by the
//! commands that act on a run after staging.

use crate::printer::{Printer, run_text};

/// Prints a cascade's outcome and each node's run; a failed validation is exit 3.
pub(crate) fn finish_cascade(
    printer: Printer,
    run: &lakefill::CascadeRunReport,
) -> anyhow::Result<()> {
    let mut text = format!("cascade {}: {}\n", run.cascade_id, run.outcome);
    for node in &run.nodes {
        text.push('\n');
        text.push_str(&run_text(node));
    }
    printer.result(&text, run)?;
    match run.validation_error() {
        Some(error) => Err(error.into()),
        None => Ok(()),
    }
}

pub(crate) fn finish(printer: Printer, run: &lakefill::RunReport) -> anyhow::Result<()> {
    printer.result(&run_text(run), run)?;
    match run.validation_error() {
        Some(error) => Err(error.into()),
        None => Ok(()),
    }
}

/// The report of a run, or of a cascade when `id` names one, as `format`.
pub(crate) async fn rendered_report(
    project: &lakefill::Project,
    id: &str,
    format: lakefill::ReportFormat,
) -> anyhow::Result<String> {
    if lakefill::is_cascade_id(id) {
        let report = lakefill::cascade_report(project, id).await?;
        return Ok(lakefill::render_cascade(&report, format)?);
    }
    let report = lakefill::report(project, id).await?;
    Ok(lakefill::render_report(&report, format)?)
}

/// Writes the report of `run_id` to `path`, in `format` or the one its extension names (else
/// HTML).
pub(crate) async fn write_report(
    project: &lakefill::Project,
    run_id: &str,
    format: Option<lakefill::ReportFormat>,
    path: &std::path::Path,
    printer: Printer,
) -> anyhow::Result<()> {
    let format = format
        .or_else(|| lakefill::ReportFormat::from_path(path))
        .unwrap_or(lakefill::ReportFormat::Html);
    let text = rendered_report(project, run_id, format).await?;
    std::fs::write(path, text)
        .map_err(|e| anyhow::anyhow!("cannot write the report to `{}`: {e}", path.display()))?;
    printer.status(&format!("report of {run_id} written to {}", path.display()));
    Ok(())
}
