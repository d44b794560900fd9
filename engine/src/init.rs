//! `lakefill init`: a starter project, and an identity model for each existing table named.
//!
//! The project file is written with comments that explain each section. For every
//! `--table NAME=URI` the table is opened, and its schema and partitioning give a model
//! `sql/<NAME>/identity.sql` that rewrites the table as it is: a backfill with it is up to date,
//! and a copy of it (`v1.sql`) is where a fix starts. Nothing is written when the directory already holds a
//! project.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;

use lakefill_table::config::{PROJECT_FILE, Project};
use lakefill_table::error::{DeltaContext, Error, Result};
use lakefill_table::partition::{Layout, TimeEncoding};
use lakefill_table::storage::open_table;

/// What `init` wrote.
#[derive(Debug, Clone, Serialize)]
pub struct InitReport {
    /// The project directory.
    pub dir: PathBuf,
    /// Every file written.
    pub files: Vec<PathBuf>,
    /// Notes about the models (e.g. a grain to declare).
    pub notes: Vec<String>,
}

/// Writes a starter project in `dir` with an identity model for each `(name, uri)` table.
pub async fn init(dir: &Path, tables: &[(String, String)]) -> Result<InitReport> {
    let project_file = dir.join(PROJECT_FILE);
    if project_file.exists() {
        return Err(Error::ProjectExists { path: project_file });
    }
    for (name, _) in tables {
        // Nothing is written when any file init would write exists: a model is the user's work.
        let model_file = identity_path(dir, name);
        if model_file.exists() {
            return Err(Error::ProjectExists { path: model_file });
        }
        if !lakefill_table::model::is_model_name(name) {
            return Err(Error::InvalidOption {
                option: "--table".into(),
                value: name.clone(),
                message: "a table name is a plain identifier (letters, digits, `_` and `-`)".into(),
            });
        }
    }
    std::fs::create_dir_all(dir.join("sql")).map_err(|source| Error::ReadFile {
        path: dir.join("sql"),
        source,
    })?;
    let toml = starter_toml(tables);
    std::fs::write(&project_file, &toml).map_err(|source| Error::ReadFile {
        path: project_file.clone(),
        source,
    })?;
    let mut files = vec![project_file.clone()];
    let mut notes = Vec::new();
    // Read back through the loader: the tables resolve exactly as every command will see them.
    let loaded = async {
        let mut project = Project::load(dir)?;
        project.resolve_catalog().await?;
        Ok::<_, Error>(project)
    };
    let project = match loaded.await {
        Ok(project) => project,
        Err(error) => {
            let _ = std::fs::remove_file(&project_file);
            return Err(error);
        }
    };
    // Every model is built before any is written: a table that cannot be opened leaves no
    // project behind.
    let mut models = Vec::new();
    for (name, _) in tables {
        let built = async {
            let config = project.table(name, "--table")?;
            let table = open_table(config, None).await?;
            identity_model(name, &table, &mut notes)
        }
        .await;
        match built {
            Ok(model) => models.push((identity_path(dir, name), model)),
            Err(error) => {
                let _ = std::fs::remove_file(&project_file);
                return Err(error);
            }
        }
    }
    for (path, model) in models {
        if let Some(model_dir) = path.parent() {
            std::fs::create_dir_all(model_dir).map_err(|source| Error::ReadFile {
                path: model_dir.to_path_buf(),
                source,
            })?;
        }
        std::fs::write(&path, model).map_err(|source| Error::ReadFile {
            path: path.clone(),
            source,
        })?;
        files.push(path);
    }
    Ok(InitReport {
        dir: dir.to_path_buf(),
        files,
        notes,
    })
}

/// Where init writes a table's identity model: `identity` sorts before `v1`, so the user's
/// first fix is the newest version.
fn identity_path(dir: &Path, name: &str) -> PathBuf {
    dir.join("sql").join(name).join("identity.sql")
}

fn starter_toml(tables: &[(String, String)]) -> String {
    let mut out = String::from(
        "# lakefill project: the tables lakefill may read and backfill, and how to reach them.\n\
         # Model files live in sql/<model>/<version>.sql; a released version is never edited.\n\n\
         # Options for every table (object_store / delta-rs keys). Values may be \"${ENV_VAR}\";\n\
         # secrets are never printed.\n\
         [storage]\n\
         # AWS_REGION = \"us-east-1\"\n\
         # AWS_ENDPOINT_URL = \"${AWS_ENDPOINT_URL}\"\n\
         # AWS_ACCESS_KEY_ID = \"${AWS_ACCESS_KEY_ID}\"\n\
         # AWS_SECRET_ACCESS_KEY = \"${AWS_SECRET_ACCESS_KEY}\"\n\n",
    );
    if tables.is_empty() {
        out.push_str(
            "# One section per table: a path relative to this file, file://..., or s3://bucket/prefix.\n\
             # [tables.events]\n\
             # uri = \"lake/events\"\n\
             # storage = { AWS_ALLOW_HTTP = \"true\" }   # per-table options win over [storage]\n\n",
        );
    }
    for (name, uri) in tables {
        let _ = write!(
            out,
            "[tables.{name}]\nuri = {}\n\n",
            toml::Value::String(uri.clone())
        );
    }
    out.push_str(
        "# Defaults for every backfill (each has a command-line flag too).\n\
         [defaults]\n\
         # batch_partitions = 7       # partitions per batch\n\
         # max_parallel = 2           # batches in flight\n\
         # memory_limit = \"4GiB\"      # the queries' memory; beyond it they spill to disk\n",
    );
    out
}

/// A model that selects every column of `table` as it is.
fn identity_model(
    name: &str,
    table: &deltalake::DeltaTable,
    notes: &mut Vec<String>,
) -> Result<String> {
    let snapshot = table
        .snapshot()
        .delta_context(|| format!("cannot read the snapshot of `{name}`"))?;
    let schema = snapshot.snapshot().arrow_schema();
    let partition_columns = snapshot.metadata().partition_columns().to_vec();
    let mut values: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
        std::collections::BTreeMap::new();
    let mapping = lakefill_table::mapping::ColumnMapping::of_snapshot(snapshot)?;
    for file in snapshot.log_data().iter() {
        for (column, value) in mapping.logical_values(file.partition_values_map()) {
            if let Some(value) = value {
                values.entry(column).or_default().insert(value);
            }
        }
    }
    let values = values
        .into_iter()
        .map(|(c, v)| (c, v.into_iter().collect()))
        .collect();
    let quote = |s: &str| toml::Value::String(s.to_string()).to_string();
    let list = |columns: &[String]| {
        format!(
            "[{}]",
            columns
                .iter()
                .map(|c| quote(c))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    let mut header = format!(
        "# The identity model of `{name}`: it writes the rows as they are, so a backfill with it is\n\
         # up to date. Copy it to v1.sql and change the SELECT to fix history.\n\
         target = {}\n",
        quote(name)
    );
    let mut window: Option<Vec<String>> = None;
    if partition_columns.is_empty() {
        // Replace by rows: the first date or timestamp column selects them.
        let time = schema.fields().iter().find(|f| {
            matches!(
                f.data_type(),
                deltalake::arrow::datatypes::DataType::Date32
                    | deltalake::arrow::datatypes::DataType::Timestamp(_, _)
            )
        });
        match time {
            Some(field) => {
                let _ = writeln!(header, "range_column = {}", quote(field.name()));
                window = Some(vec![field.name().clone()]);
            }
            None => {
                header.push_str("# no time column: runs replace the rows `--where` selects (or the whole table);\n# range_column = \"<a column holding times>\"   # if one does\n");
                notes.push(format!(
                    "`{name}` is not partitioned and has no DATE or TIMESTAMP column: back it up with `lakefill backfill {name} --where \"...\"`, or set `range_column` in sql/{name}/identity.sql if a column holds times"
                ));
            }
        }
    } else {
        let _ = writeln!(header, "partition_by = {}", list(&partition_columns));
        match Layout::detect(
            name,
            &partition_columns,
            &schema,
            &values,
            &partition_columns,
            None,
            None,
        ) {
            Ok(layout) if layout.is_timeless() => {
                let _ = writeln!(
                    header,
                    "# no time column ({}): runs replace the rows `--where` selects, or the whole table",
                    layout.time.grain_reason
                );
                notes.push(format!(
                    "`{name}` has no time column: backfill it with `lakefill backfill {name} --where \"...\"`"
                ));
            }
            Ok(layout) => {
                let _ = writeln!(
                    header,
                    "# grain: {} ({})",
                    layout.time.grain, layout.time.grain_reason
                );
                if let TimeEncoding::Text { format, .. } = &layout.time.encoding {
                    let _ = writeln!(header, "format = {}", quote(format));
                }
                window = Some(
                    layout
                        .time
                        .encoding
                        .columns()
                        .into_iter()
                        .map(str::to_string)
                        .collect(),
                );
            }
            Err(message) => {
                let _ = writeln!(header, "# grain = \"day\"   # declare it: {message}");
                notes.push(format!(
                    "`{name}`: {message}; declare `grain` in sql/{name}/identity.sql"
                ));
            }
        }
    }
    let _ = writeln!(header, "\n[sources.{name}]");
    match &window {
        Some(columns) if columns.len() == 1 => {
            let _ = writeln!(header, "window = {}", quote(&columns[0]));
        }
        Some(columns) => {
            let _ = writeln!(header, "window = {}", list(columns));
        }
        None if notes.iter().any(|n| n.contains("no time column")) => {}
        None => header
            .push_str("# window = \"<its time column>\"   # read only each batch's partitions\n"),
    }
    let columns = schema
        .fields()
        .iter()
        .map(|f| lakefill_table::sqltext::ident(f.name()))
        .collect::<Vec<_>>()
        .join(", ");
    Ok(format!(
        "/*\n{header}*/\nSELECT {columns}\nFROM {}\n",
        lakefill_table::sqltext::ident(name)
    ))
}
