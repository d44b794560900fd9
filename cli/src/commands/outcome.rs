//! How a command that ran or published something ends: its result printed (a failed validation
//! then exits 3), and a report written to a file. Shared by `backfill` and by the commands that
//! act on a run after staging.

use crate::printer::Printer;

/// Prints what a run or cascade did; a failed validation becomes exit code 3 after the result
/// is out.
pub(crate) fn finish(printer: Printer, acted: &lakefill::Acted) -> anyhow::Result<()> {
    let text = match acted {
        lakefill::Acted::Run(run) => crate::render::run::text(run),
        lakefill::Acted::Cascade(cascade) => crate::render::cascade::outcome(cascade),
    };
    printer.result(&text, acted)?;
    match acted.validation_error() {
        Some(error) => Err(error.into()),
        None => Ok(()),
    }
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
    let text = lakefill::rendered_report(project, run_id, format).await?;
    std::fs::write(path, text)
        .map_err(|e| anyhow::anyhow!("cannot write the report to `{}`: {e}", path.display()))?;
    printer.status(&format!("report of {run_id} written to {}", path.display()));
    Ok(())
}
