//! `lakefill init`: a starter project.

use std::fmt::Write as _;

use crate::args::InitArgs;
use crate::printer::Printer;
use crate::settings::display_path;

pub(crate) async fn run(args: &InitArgs, printer: Printer) -> anyhow::Result<()> {
    let dir = match &args.dir {
        Some(dir) => std::path::absolute(dir)?,
        None => std::env::current_dir()?,
    };
    let mut tables = Vec::new();
    for table in &args.tables {
        let (name, uri) = table
            .split_once('=')
            .ok_or_else(|| lakefill::Error::InvalidOption {
                option: "--table".into(),
                value: table.clone(),
                message: "expected NAME=URI, e.g. `events=lake/events`".into(),
            })?;
        tables.push((name.trim().to_string(), uri.trim().to_string()));
    }
    let report = lakefill::init(&dir, &tables).await?;
    let mut text = String::new();
    for file in &report.files {
        let _ = writeln!(text, "wrote {}", display_path(file));
    }
    for note in &report.notes {
        let _ = writeln!(text, "note: {note}");
    }
    let _ = writeln!(
        text,
        "next: `lakefill plan MODEL --from A --to B` in {} shows what a backfill would do",
        display_path(&report.dir)
    );
    printer.result(&text, &report)
}
