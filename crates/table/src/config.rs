//! The project file `lakefill.toml`: tables, storage options and defaults (DESIGN §1).
//!
//! This module finds and parses the file, expands `${ENV}` references and resolves table
//! locations to URLs. Opening the tables is left to [`crate::storage`]; model files to
//! [`crate::model`].

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use url::Url;

use crate::catalog::CatalogName;
use crate::error::{Error, Result};

/// The name of the project file.
pub const PROJECT_FILE: &str = "lakefill.toml";

/// A loaded project: its directory, tables and defaults.
#[derive(Debug, Clone)]
pub struct Project {
    root: PathBuf,
    storage_keys: Vec<String>,
    tables: BTreeMap<String, TableConfig>,
    defaults: Defaults,
    engine: EngineConfig,
}

/// One table of the project's catalog.
#[derive(Clone)]
pub struct TableConfig {
    name: String,
    url: Url,
    uri: String,
    storage_options: BTreeMap<String, String>,
    table_storage_keys: Vec<String>,
    sinks: Vec<crate::sink::Sink>,
    adjustments: Option<String>,
    /// The catalog name the location comes from (`glue://database/table`), if any.
    catalog: Option<CatalogName>,
}

/// Defaults from `[defaults]`, overridable per command.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Defaults {
    /// Batches in flight.
    pub max_parallel: Option<usize>,
    /// DataFusion memory pool size, e.g. `"4GiB"`.
    pub memory_limit: Option<String>,
    /// Partitions per batch.
    pub batch_partitions: Option<usize>,
}

/// `[engine]`: where batches are staged.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct EngineConfig {
    /// The Apache Ballista scheduler that stages batches, `df://HOST:PORT`; absent stages in the
    /// lakefill process.
    pub scheduler: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProject {
    /// Sinks of every table.
    #[serde(default)]
    notify: Vec<crate::sink::RawSink>,
    #[serde(default)]
    storage: BTreeMap<String, String>,
    #[serde(default)]
    tables: BTreeMap<String, RawTable>,
    #[serde(default)]
    defaults: Defaults,
    #[serde(default)]
    engine: EngineConfig,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTable {
    uri: String,
    #[serde(default)]
    storage: BTreeMap<String, String>,
    #[serde(default)]
    notify: Vec<crate::sink::RawSink>,
    /// The project table adjustments of this one go to (created on first use).
    #[serde(default)]
    adjustments: Option<String>,
}

impl Project {
    /// Finds `lakefill.toml` in `start` or the nearest parent directory and loads it.
    pub fn discover(start: &Path) -> Result<Self> {
        let mut dir = Some(start);
        while let Some(current) = dir {
            if current.join(PROJECT_FILE).is_file() {
                return Self::load(current);
            }
            dir = current.parent();
        }
        Err(Error::ProjectNotFound {
            start: start.to_path_buf(),
        })
    }

    /// Loads the project whose `lakefill.toml` is in `root`.
    pub fn load(root: &Path) -> Result<Self> {
        let root = std::path::absolute(root).map_err(|source| Error::ReadFile {
            path: root.to_path_buf(),
            source,
        })?;
        let path = root.join(PROJECT_FILE);
        let text = std::fs::read_to_string(&path).map_err(|source| Error::ReadFile {
            path: path.clone(),
            source,
        })?;
        Self::from_toml(&root, &path, &text)
    }

    fn from_toml(root: &Path, path: &Path, text: &str) -> Result<Self> {
        let raw: RawProject = toml::from_str(text).map_err(|source| {
            // The parser quotes the offending line, which may hold a secret: keep only where.
            let offset = source.span().map_or(0, |span| span.start).min(text.len());
            let before = &text[..offset];
            let line = before.matches('\n').count() + 1;
            let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            Error::ConfigParse {
                path: path.to_path_buf(),
                line,
                column,
                message: source.message().trim().replace('\n', "; "),
            }
        })?;
        if let Some(0) = raw.defaults.batch_partitions {
            return Err(Error::ConfigValue {
                path: path.to_path_buf(),
                field: "defaults.batch_partitions".into(),
                message: "must be at least 1".into(),
            });
        }
        if let Some(0) = raw.defaults.max_parallel {
            return Err(Error::ConfigValue {
                path: path.to_path_buf(),
                field: "defaults.max_parallel".into(),
                message: "must be at least 1".into(),
            });
        }
        let mut tables = BTreeMap::new();
        for (name, table) in raw.tables {
            let field = format!("tables.{name}.uri");
            let catalog = CatalogName::parse(&table.uri)
                .transpose()
                .map_err(|message| Error::ConfigValue {
                    path: path.to_path_buf(),
                    field: field.clone(),
                    message,
                })?;
            // A catalog name stands for its location until `resolve_catalog` asks the catalog.
            let url = match &catalog {
                Some(name) => Url::parse(&format!("{name}/")).map_err(|e| e.to_string()),
                None => resolve_uri(root, &table.uri),
            }
            .map_err(|message| Error::ConfigValue {
                path: path.to_path_buf(),
                field,
                message,
            })?;
            // Precedence: table options over `[storage]`.
            let mut storage_options = BTreeMap::new();
            for (key, value) in &raw.storage {
                let value = expand_env(value, &format!("storage.{key}"))?;
                storage_options.insert(key.clone(), value);
            }
            for (key, value) in &table.storage {
                let value = expand_env(value, &format!("tables.{name}.storage.{key}"))?;
                storage_options.insert(key.clone(), value);
            }
            // Secrets are masked by value wherever they would show (see `secrets`).
            for (key, value) in &storage_options {
                if is_secret_option(key) {
                    crate::secrets::register(value);
                }
                crate::secrets::register_url_credentials(value);
            }
            crate::secrets::register_url_credentials(&table.uri);
            let mut sinks = Vec::new();
            for (i, raw_sink) in raw.notify.iter().chain(&table.notify).enumerate() {
                let field = if i < raw.notify.len() {
                    format!("notify[{i}]")
                } else {
                    format!("tables.{name}.notify[{}]", i - raw.notify.len())
                };
                let sink = crate::sink::Sink::parse(raw_sink, root, |v| expand_env(v, &field))
                    .map_err(|message| Error::ConfigValue {
                        path: path.to_path_buf(),
                        field: field.clone(),
                        message,
                    })?;
                sinks.push(sink);
            }
            tables.insert(
                name.clone(),
                TableConfig {
                    name,
                    url,
                    uri: table.uri,
                    storage_options,
                    table_storage_keys: table.storage.keys().cloned().collect(),
                    sinks,
                    adjustments: table.adjustments,
                    catalog,
                },
            );
        }
        // A companion for adjustments is another declared table, and not itself a table with one.
        for table in tables.values() {
            let Some(companion) = &table.adjustments else {
                continue;
            };
            let problem = match tables.get(companion) {
                None => Some(format!(
                    "`{companion}` is not a table of the project: declare it (`[tables.{companion}]` with its `uri`; the first publish of adjustments creates it)"
                )),
                Some(_) if companion == &table.name => {
                    Some("a table cannot be its own companion: leave `adjustments` out to append to the table itself".into())
                }
                Some(other) if other.adjustments.is_some() => Some(format!(
                    "`{companion}` has a companion of its own; a companion table holds adjustments only"
                )),
                Some(_) => None,
            };
            if let Some(message) = problem {
                return Err(Error::ConfigValue {
                    path: path.to_path_buf(),
                    field: format!("tables.{}.adjustments", table.name),
                    message,
                });
            }
        }
        check_overlaps(path, &tables)?;
        Ok(Self {
            root: root.to_path_buf(),
            storage_keys: raw.storage.keys().cloned().collect(),
            tables,
            defaults: raw.defaults,
            engine: raw.engine,
        })
    }

    /// Asks the catalog where each table named through one is (`glue://database/table`), once,
    /// before any table is opened; then checks again that no two locations overlap. Every
    /// command that opens tables calls it after loading the project.
    pub async fn resolve_catalog(&mut self) -> Result<()> {
        let named: Vec<(String, CatalogName, BTreeMap<String, String>)> = self
            .tables
            .values()
            .filter(|t| !t.is_resolved())
            .filter_map(|t| {
                let name = t.catalog.clone()?;
                Some((t.name.clone(), name, t.storage_options.clone()))
            })
            .collect();
        if named.is_empty() {
            return Ok(());
        }
        let answers = futures::future::join_all(
            named
                .iter()
                .map(|(_, name, options)| async { name.resolve(options).await }),
        )
        .await;
        for ((table, name, _), answer) in named.into_iter().zip(answers) {
            let url = answer.map_err(|(message, hint)| Error::Catalog {
                table: table.clone(),
                name: name.to_string(),
                message,
                hint,
            })?;
            tracing::info!(table = %table, catalog = %name, location = %url, "resolved");
            if let Some(config) = self.tables.get_mut(&table) {
                config.url = with_trailing_slash(url);
            }
        }
        check_overlaps(&self.root.join(PROJECT_FILE), &self.tables)
    }

    /// Returns the project directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Returns the directory holding the model files.
    pub fn sql_dir(&self) -> PathBuf {
        self.root.join("sql")
    }

    /// Returns the keys set in `[storage]`.
    pub fn storage_keys(&self) -> &[String] {
        &self.storage_keys
    }

    /// Returns the `[defaults]` section.
    pub fn defaults(&self) -> &Defaults {
        &self.defaults
    }

    /// Returns the `[engine]` section.
    pub fn engine(&self) -> &EngineConfig {
        &self.engine
    }

    /// Returns the table named `name`, or an error naming `used_by` and the known tables.
    pub fn table(&self, name: &str, used_by: &str) -> Result<&TableConfig> {
        self.tables.get(name).ok_or_else(|| Error::UnknownTable {
            table: name.to_string(),
            used_by: used_by.to_string(),
            known: self.tables.keys().cloned().collect(),
        })
    }

    /// Returns every table of the catalog, by name.
    pub fn tables(&self) -> impl Iterator<Item = &TableConfig> {
        self.tables.values()
    }
}

impl TableConfig {
    /// Returns the table's name in the project.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Returns the resolved location of the table.
    pub fn url(&self) -> &Url {
        &self.url
    }

    /// Returns the location as written in `lakefill.toml`.
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// The catalog name the location comes from (`glue://database/table`), if any.
    pub fn catalog(&self) -> Option<&CatalogName> {
        self.catalog.as_ref()
    }

    /// Whether the location is known: always, unless it is a catalog name not yet resolved
    /// ([`Project::resolve_catalog`]).
    pub fn is_resolved(&self) -> bool {
        self.catalog.is_none() || self.url.scheme() != crate::catalog::GLUE_SCHEME
    }

    /// The location to name in messages: as written, or for a catalog name the location it
    /// resolved to, then the name (`s3://bucket/events/ (glue://sales/events)`).
    pub fn location_text(&self) -> String {
        match &self.catalog {
            Some(name) if self.is_resolved() => format!("{} ({name})", self.url),
            _ => self.uri.clone(),
        }
    }

    /// The table adjustments of this one go to, when it has a companion (`adjustments = "…"`).
    pub fn adjustments(&self) -> Option<&str> {
        self.adjustments.as_deref()
    }

    /// Returns the notification sinks of the table (the project's, then its own).
    pub fn sinks(&self) -> &[crate::sink::Sink] {
        &self.sinks
    }

    /// The table's storage options, as resolved (secrets expanded).
    pub fn storage_options(&self) -> &BTreeMap<String, String> {
        &self.storage_options
    }

    /// The storage option keys set on the table itself (not inherited from `[storage]`).
    pub fn table_storage_keys(&self) -> &[String] {
        &self.table_storage_keys
    }
}

impl fmt::Debug for TableConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Storage options hold secrets: print their keys only.
        f.debug_struct("TableConfig")
            .field("name", &self.name)
            .field("url", &self.url.as_str())
            .field("storage_options", &self.storage_options.keys())
            .field("sinks", &self.sinks)
            .finish()
    }
}

fn resolve_uri(root: &Path, uri: &str) -> std::result::Result<Url, String> {
    if uri.trim().is_empty() {
        return Err("the location is empty".into());
    }
    if let Some((scheme, _)) = uri.split_once("://") {
        let url = Url::parse(uri).map_err(|e| format!("`{uri}` is not a valid URL ({e})"))?;
        return match crate::store::Store::of_scheme(url.scheme()) {
            Some(_) => Ok(with_trailing_slash(url)),
            None => Err(format!(
                "scheme `{scheme}` is not supported; use {}",
                crate::store::SUPPORTED_SCHEMES
            )),
        };
    }
    let path = Path::new(uri);
    let path = if path.is_absolute() {
        path.to_path_buf()
    } else {
        root.join(path)
    };
    let path = normalize(&path);
    Url::from_directory_path(&path)
        .map_err(|()| format!("`{}` is not a usable path", path.display()))
}

/// A table's location must not hold another table: deleting one's staged files could otherwise
/// reach into the other.
fn check_overlaps(path: &Path, tables: &BTreeMap<String, TableConfig>) -> Result<()> {
    let declared: Vec<&TableConfig> = tables.values().collect();
    for (i, a) in declared.iter().enumerate() {
        for b in &declared[i + 1..] {
            if let Some(relation) = overlap(&a.url, &b.url) {
                return Err(Error::ConfigValue {
                    path: path.to_path_buf(),
                    field: format!("tables.{}.uri", b.name),
                    message: format!(
                        "the location of `{}` (`{}`) {relation} the location of `{}` (`{}`); every table needs a location of its own, outside the others",
                        b.name,
                        b.location_text(),
                        a.name,
                        a.location_text()
                    ),
                });
            }
        }
    }
    Ok(())
}

/// How `b`'s location relates to `a`'s, if they overlap: `is the same as`, `is inside` or
/// `contains`. Local paths are compared as written and, where they exist, with links resolved.
fn overlap(a: &Url, b: &Url) -> Option<&'static str> {
    let forms = |url: &Url| -> Vec<String> {
        let mut forms = vec![url.as_str().trim_end_matches('/').to_string() + "/"];
        if url.scheme() == "file"
            && let Ok(path) = url.to_file_path()
            && let Ok(real) = std::fs::canonicalize(&path)
            && let Ok(real) = Url::from_directory_path(real)
        {
            forms.push(real.as_str().to_string());
        }
        forms
    };
    let (a_forms, b_forms) = (forms(a), forms(b));
    for x in &a_forms {
        for y in &b_forms {
            if x == y {
                return Some("is the same as");
            }
            if y.starts_with(x.as_str()) {
                return Some("is inside");
            }
            if x.starts_with(y.as_str()) {
                return Some("contains");
            }
        }
    }
    None
}

fn with_trailing_slash(mut url: Url) -> Url {
    if !url.path().ends_with('/') {
        let path = format!("{}/", url.path());
        url.set_path(&path);
    }
    url
}

/// Removes `.` and `..` components without touching the file system (the table may not exist).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// Replaces every `${NAME}` in `value` with the environment variable `NAME`.
fn expand_env(value: &str, field: &str) -> Result<String> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            out.push_str(&rest[start..]);
            return Ok(out);
        };
        let variable = &after[..end];
        let resolved = std::env::var(variable).map_err(|_| Error::MissingEnv {
            variable: variable.to_string(),
            field: field.to_string(),
        })?;
        out.push_str(&resolved);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Returns whether a storage option key holds a secret whose value must never be shown.
pub fn is_secret_option(key: &str) -> bool {
    let key = key.to_ascii_uppercase();
    [
        "SECRET",
        "TOKEN",
        "PASSWORD",
        // Conservative: any key naming a key is masked (`AWS_ACCESS_KEY_ID` too).
        "KEY",
        "SESSION",
        "CREDENTIAL",
        "SAS",
        "SIGNATURE",
    ]
    .iter()
    .any(|marker| key.contains(marker))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_tables_and_expands_env() {
        // SAFETY of the env mutation: this is the only test touching this variable.
        let text = r#"
            [storage]
            AWS_REGION = "us-east-1"
            [tables.events]
            uri = "lake/events"
            storage = { AWS_ALLOW_HTTP = "true", HOME_DIR = "${HOME}" }
            [defaults]
            batch_partitions = 3
        "#;
        let project = Project::from_toml(Path::new("/p"), Path::new("/p/lakefill.toml"), text)
            .expect("valid project");
        let events = project.table("events", "test").expect("declared");
        assert_eq!(events.url().as_str(), "file:///p/lake/events/");
        assert_eq!(events.storage_options()["AWS_REGION"], "us-east-1");
        assert_eq!(
            events.storage_options()["HOME_DIR"],
            std::env::var("HOME").expect("HOME is set")
        );
        assert_eq!(project.defaults().batch_partitions, Some(3));
    }

    #[test]
    fn missing_env_names_variable_and_field() {
        let text =
            "[tables.t]\nuri = \"x\"\nstorage = { KEY = \"${LAKEFILL_SURELY_UNSET_VAR}\" }\n";
        let err = Project::from_toml(Path::new("/p"), Path::new("/p/lakefill.toml"), text)
            .expect_err("unset variable");
        assert_eq!(
            err.to_string(),
            "environment variable `LAKEFILL_SURELY_UNSET_VAR` used by `tables.t.storage.KEY` is not set"
        );
    }

    #[test]
    fn nested_or_shared_locations_are_refused() {
        for (a, b, relation) in [
            ("lake/events", "lake/events/", "is the same as"),
            ("lake", "lake/events", "is inside"),
            (
                "s3://bucket/lake/events/x",
                "s3://bucket/lake/events",
                "contains",
            ),
        ] {
            let text = format!("[tables.a]\nuri = \"{a}\"\n[tables.b]\nuri = \"{b}\"\n");
            let err = Project::from_toml(Path::new("/p"), Path::new("/p/lakefill.toml"), &text)
                .expect_err("overlap");
            assert_eq!(err.exit_code(), 2);
            let message = err.to_string();
            assert!(
                message.contains(relation) && message.contains("`a`"),
                "{message}"
            );
        }
        let text = "[tables.a]\nuri = \"lake/events\"\n[tables.b]\nuri = \"lake/events_archive\"\n";
        Project::from_toml(Path::new("/p"), Path::new("/p/lakefill.toml"), text)
            .expect("siblings with a common prefix are fine");
    }

    #[test]
    fn unknown_field_is_rejected() {
        let text = "[tables.t]\nuri = \"x\"\nurl = \"y\"\n";
        let err = Project::from_toml(Path::new("/p"), Path::new("/p/lakefill.toml"), text)
            .expect_err("unknown field");
        assert_eq!(err.exit_code(), 2);
    }

    #[test]
    fn secret_keys_are_recognised() {
        assert!(is_secret_option("AWS_SECRET_ACCESS_KEY"));
        assert!(is_secret_option("aws_session_token"));
        assert!(is_secret_option("AZURE_STORAGE_ACCOUNT_KEY"));
        assert!(!is_secret_option("AWS_REGION"));
        assert!(!is_secret_option("AWS_ENDPOINT_URL"));
    }
}
