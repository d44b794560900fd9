//! Opening the project's Delta tables with their storage options, at a version.
//!
//! Storage options carry secrets: they go to delta-rs and nowhere else. Nothing here formats a
//! `DeltaTable`'s log-store configuration.

use std::collections::HashMap;
use std::sync::Arc;

use deltalake::{DeltaTable, DeltaTableBuilder, DeltaTableError, ObjectStore, Path};
use url::Url;

use crate::config::TableConfig;
use crate::error::{DeltaContext, Error, Result};
use crate::partition::{NULL_PARTITION_DIR, PartitionValues};
use crate::store::Store;

/// Opens `table` at `version`, or at its latest version when `None`.
pub async fn open_table(table: &TableConfig, version: Option<u64>) -> Result<DeltaTable> {
    open_table_at(
        table,
        version.map_or(TableVersion::Latest, TableVersion::Version),
    )
    .await
}

/// Which snapshot of a table to open.
#[derive(Debug, Clone, Copy)]
pub enum TableVersion {
    /// The newest version.
    Latest,
    /// A version number.
    Version(u64),
    /// The version current at a time (by commit file time, as delta-rs resolves it).
    Timestamp(chrono::DateTime<chrono::Utc>),
}

/// Opens `table` at the given snapshot.
pub async fn open_table_at(table: &TableConfig, at: TableVersion) -> Result<DeltaTable> {
    let version = match at {
        TableVersion::Version(v) => Some(v),
        _ => None,
    };
    if !table.is_resolved() {
        return Err(Error::Internal(format!(
            "table `{}` ({}) was opened before its catalog name was resolved",
            table.name(),
            table.uri()
        )));
    }
    Store::register_handlers();
    let options = effective_options(table);
    let not_a_table = |source: DeltaTableError| Error::NotADeltaTable {
        table: table.name().to_string(),
        uri: table.location_text(),
        source: Box::new(source),
    };
    let mut builder = DeltaTableBuilder::from_url(table.url().clone())
        .map_err(not_a_table)?
        .with_storage_options(options);
    match at {
        TableVersion::Latest => {}
        TableVersion::Version(version) => builder = builder.with_version(version),
        TableVersion::Timestamp(time) => builder = builder.with_timestamp(time),
    }
    let loaded = builder.load().await;
    if let (Err(_), Some(version)) = (&loaded, version) {
        // Say which versions exist, not a kernel message about log segments.
        if let Ok(latest) = Box::pin(open_table_at(table, TableVersion::Latest)).await {
            let latest_version = loaded_version(&latest)?;
            if version > latest_version {
                return Err(Error::NoSuchVersion {
                    table: table.name().to_string(),
                    version,
                    latest: latest_version,
                });
            }
            if let Some(earliest) = earliest_readable(&latest, latest_version).await
                && version < earliest
            {
                return Err(Error::VersionCleanedUp {
                    table: table.name().to_string(),
                    version,
                    earliest,
                });
            }
        }
    }
    if let (Ok(opened), TableVersion::Timestamp(time)) = (&loaded, at) {
        // delta-rs answers a time before the first commit with the first version: that table
        // did not exist then.
        let version = loaded_version(opened)?;
        let path = deltalake::Path::from(format!("_delta_log/{version:020}.json"));
        if version == 0
            && let Ok(meta) = deltalake::logstore::object_store::ObjectStoreExt::head(
                opened.object_store().as_ref(),
                &path,
            )
            .await
            && time < meta.last_modified
        {
            return Err(Error::BeforeHistory {
                table: table.name().to_string(),
                at: time.to_rfc3339(),
                first: meta.last_modified.to_rfc3339(),
            });
        }
    }
    loaded.map_err(|source| match source {
        DeltaTableError::NotATable(_) | DeltaTableError::InvalidTableLocation(_) => {
            not_a_table(source)
        }
        DeltaTableError::KernelError(_)
            if source.to_string().contains("Invalid table location")
                || source.to_string().contains("No files in log segment") =>
        {
            not_a_table(source)
        }
        // The log is there but does not parse: a damaged commit or checkpoint, not a location
        // or credentials problem.
        source if is_damaged_log(&source.to_string()) => Error::DamagedLog {
            table: table.name().to_string(),
            source: Box::new(source),
        },
        // A reader feature (or reader version) the Delta kernel does not know: the table is
        // there and reachable, and no credential changes that.
        source if unknown_reader_feature(&source.to_string()).is_some() => {
            let feature = unknown_reader_feature(&source.to_string()).unwrap_or_default();
            Error::UnsupportedFeature {
                table: table.name().to_string(),
                why: format!(
                    "the Delta reader lakefill is built with does not know it ({source}), so no \
                     version that has it can be read"
                ),
                hint: format!(
                    "read a version of `{}` from before the feature was added (`\"{}@N\"`), or \
                     backfill a copy without it",
                    table.name(),
                    table.name()
                ),
                feature,
            }
        }
        DeltaTableError::InvalidVersion(_) => Error::InvalidOption {
            option: "version".into(),
            value: version.map(|v| v.to_string()).unwrap_or_default(),
            message: format!("table `{}` has no such version", table.name()),
        },
        source => Error::OpenTable {
            table: table.name().to_string(),
            uri: table.location_text(),
            source: Box::new(source),
        },
    })
}

/// The feature named by the Delta kernel's refusal of a protocol it does not support
/// (`Unsupported: Feature 'x' is not supported`), or `reader version N` for a reader version
/// past its own.
fn unknown_reader_feature(message: &str) -> Option<String> {
    let (_, after) = message.split_once("Unsupported: ")?;
    if let Some(name) = after
        .strip_prefix("Feature '")
        .and_then(|rest| rest.split_once('\''))
        .map(|(name, _)| name.to_string())
    {
        return Some(name);
    }
    after
        .to_ascii_lowercase()
        .contains("reader version")
        .then(|| after.trim().to_string())
}

/// The oldest version of `table` (whose latest is `latest`) its log can still be read at: the
/// first commit when every commit since is there, else the oldest checkpoint followed by every
/// commit up to the latest. `None` when the log cannot be listed.
async fn earliest_readable(table: &DeltaTable, latest: u64) -> Option<u64> {
    use futures::TryStreamExt as _;
    let listed: Vec<deltalake::ObjectMeta> = table
        .object_store()
        .list(Some(&Path::from("_delta_log")))
        .try_collect()
        .await
        .ok()?;
    let mut commits = std::collections::BTreeSet::new();
    let mut checkpoints = std::collections::BTreeSet::new();
    for meta in &listed {
        let name = meta.location.filename().unwrap_or_default();
        let Some(version) = name.get(..20).and_then(|v| v.parse::<u64>().ok()) else {
            continue;
        };
        if name.ends_with(".json") && name.len() == 25 {
            commits.insert(version);
        } else if name[20..].starts_with(".checkpoint") {
            checkpoints.insert(version);
        }
    }
    // The oldest start from which every commit up to the latest follows.
    let complete_from = |start: u64| (start + 1..=latest).all(|v| commits.contains(&v));
    if commits.contains(&0) && complete_from(0) {
        return Some(0);
    }
    checkpoints.into_iter().find(|c| complete_from(*c))
}

/// Whether an error opening a table says its log was read but does not parse.
fn is_damaged_log(message: &str) -> bool {
    let lower = message.to_ascii_lowercase();
    lower.contains("json error")
        || lower.contains("invalid json")
        || lower.contains("error parsing")
        || lower.contains("invalid checkpoint")
        || (lower.contains("parquet error") && lower.contains("_delta_log"))
}

/// Retry bounds for object stores, unless the project sets its own: a dead endpoint fails in
/// seconds instead of retrying for minutes.
const DEFAULT_RETRIES: [(&str, &str); 2] = [("max_retries", "3"), ("retry_timeout", "30s")];

fn is_object_store(table: &TableConfig) -> bool {
    Store::of(table.url()).is_object_store()
}

/// The options passed to delta-rs: the project's (table over `[storage]`), plus bounded retries
/// for object stores. delta-rs itself fills in the store's variables from the environment
/// (`AWS_*`, `AZURE_*`) for keys that are still unset, so the environment comes last.
pub fn effective_options(table: &TableConfig) -> HashMap<String, String> {
    let mut options: HashMap<String, String> = table
        .storage_options()
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if is_object_store(table) {
        for (key, value) in DEFAULT_RETRIES {
            if !options.keys().any(|k| k.eq_ignore_ascii_case(key)) {
                options.insert(key.to_string(), value.to_string());
            }
        }
    }
    options
}

/// One storage option as `plan` shows it: secret values masked, and where it came from.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StorageOption {
    /// The option key.
    pub key: String,
    /// Its value, or `****` for secrets.
    pub value: String,
    /// `table`, `project`, `environment` or `default`.
    pub from: String,
}

/// The storage options that apply to `table`, in precedence order (table, project `[storage]`,
/// environment), with secret values masked.
pub fn describe_options(table: &TableConfig, project_keys: &[String]) -> Vec<StorageOption> {
    let show = |key: &str, value: &str| {
        if crate::config::is_secret_option(key) {
            "****".to_string()
        } else {
            value.to_string()
        }
    };
    let mut out: Vec<StorageOption> = Vec::new();
    for (key, value) in effective_options(table) {
        let from = if table.storage_options().contains_key(&key) {
            if project_keys.contains(&key) && !table.table_storage_keys().contains(&key) {
                "project"
            } else {
                "table"
            }
        } else {
            "default"
        };
        out.push(StorageOption {
            value: show(&key, &value),
            key,
            from: from.into(),
        });
    }
    let store = Store::of(table.url());
    if store.is_object_store() {
        for (key, value) in std::env::vars() {
            if store.reads_from_env(&key) && !out.iter().any(|o| o.key.eq_ignore_ascii_case(&key)) {
                out.push(StorageOption {
                    value: show(&key, &value),
                    key,
                    from: "environment".into(),
                });
            }
        }
    }
    out.sort_by(|a, b| a.key.cmp(&b.key));
    out
}

/// Refuses object stores that do not honour conditional writes: delta-rs commits with
/// put-if-absent (S3's and Azure's `If-None-Match: *`), and a store that ignores it lets two
/// writers overwrite each other's commit.
pub async fn ensure_conditional_writes(table: &DeltaTable, name: &str) -> Result<()> {
    use deltalake::logstore::object_store::{ObjectStoreExt as _, PutMode, PutOptions, PutPayload};
    if !Store::of(table.table_url()).is_object_store() {
        return Ok(());
    }
    let store = table.object_store();
    let path = deltalake::Path::from(format!("_lakefill/probe/{}", uuid::Uuid::new_v4()));
    let create = || PutOptions::from(PutMode::Create);
    let unsafe_store = |reason: String| Error::UnsafeStore {
        table: name.to_string(),
        reason,
    };
    match store
        .put_opts(&path, PutPayload::from_static(b"1"), create())
        .await
    {
        Ok(_) => {}
        Err(deltalake::ObjectStoreError::NotImplemented { .. }) => {
            return Err(unsafe_store(
                "conditional writes are disabled (`aws_conditional_put`)".into(),
            ));
        }
        Err(source) => {
            return Err(Error::Storage {
                path: path.to_string(),
                source,
            });
        }
    }
    let second = store
        .put_opts(&path, PutPayload::from_static(b"2"), create())
        .await;
    let _ = store.delete(&path).await;
    match second {
        Err(
            deltalake::ObjectStoreError::AlreadyExists { .. }
            | deltalake::ObjectStoreError::Precondition { .. },
        ) => Ok(()),
        Ok(_) => Err(unsafe_store(
            "the store overwrote an existing object despite `If-None-Match: *`".into(),
        )),
        Err(source) => Err(Error::Storage {
            path: path.to_string(),
            source,
        }),
    }
}

/// Returns the loaded version of `table`, which every opened table has.
pub fn loaded_version(table: &DeltaTable) -> Result<u64> {
    table.version().ok_or_else(|| {
        Error::Internal(format!(
            "table `{}` has no loaded version",
            table.table_url()
        ))
    })
}

/// Returns whether `path` (relative to a local table's `root`) is, or passes through, a symbolic
/// link. Object stores have no links; a local table's links may lead into another table, so
/// lakefill never follows them when it deletes.
pub fn is_local_symlink(root: &url::Url, path: &str) -> bool {
    if root.scheme() != "file" {
        return false;
    }
    let mut prefix = String::new();
    for segment in path.split('/').filter(|s| !s.is_empty()) {
        if !prefix.is_empty() {
            prefix.push('/');
        }
        prefix.push_str(segment);
        // Not expressible as a path below the root: treat it as foreign.
        let Some(local) = root.join(&prefix).ok().and_then(|u| u.to_file_path().ok()) else {
            return true;
        };
        if std::fs::symlink_metadata(&local).is_ok_and(|m| m.file_type().is_symlink()) {
            return true;
        }
    }
    false
}

/// The object-store path of a file an `add` action names (relative to the table root). The
/// path is already encoded as the store names objects; encoding it again would name another
/// object.
pub fn object_path(path: &str) -> deltalake::Path {
    deltalake::Path::parse(path).unwrap_or_else(|_| deltalake::Path::from(path))
}
/// The characters a relative URL path cannot hold as they are: a `%` (it would start an
/// escape), a `#` or `?` (a fragment, a query), spaces and controls, and the characters URLs
/// leave out.
const URL_PATH: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'`')
    .add(b'{')
    .add(b'}')
    .add(b'\\')
    .add(b'^')
    .add(b'|');

/// A file of the log, named by its decoded path (what delta-rs' `path()` gives), as delta-rs'
/// file selection expects it: a URL path relative to the table root. The decoded path of a
/// partition directory Delta escaped (`ts=2026-01-01%2000%3A00%3A00`) holds `%`s that would
/// otherwise be decoded a second time and name a file the log does not have (#32).
pub fn selection_path(decoded: &str) -> String {
    percent_encoding::utf8_percent_encode(decoded, URL_PATH).to_string()
}

/// Percent-decodes a path as Delta writes them in the log and in partition directory names; a
/// `%` that does not start an escape stays as it is.
pub fn decode(path: &str) -> String {
    percent_encoding::percent_decode_str(path)
        .decode_utf8_lossy()
        .into_owned()
}

/// Every partition directory of the table (`a=1/b=2/`), with the partition values it names,
/// found by walking the partition columns level by level: never through a symbolic link, never
/// into a directory that holds a table of its own, never into anything but `column=value`
/// directories. An unpartitioned table has one: its root.
pub async fn partition_dirs(
    store: &Arc<dyn ObjectStore>,
    root: &Url,
    partition_columns: &[String],
) -> Result<Vec<(Path, PartitionValues)>> {
    let mut level: Vec<(Path, PartitionValues)> = vec![(Path::default(), PartitionValues::new())];
    for column in partition_columns {
        let marker = format!("{column}=");
        let mut next = Vec::new();
        for (prefix, values) in level {
            let listing = list(store, &prefix).await?;
            if !prefix.as_ref().is_empty() && holds_a_table(&listing) {
                continue;
            }
            for dir in listing.common_prefixes {
                let Some(name) = dir.filename() else { continue };
                let Some(encoded) = name.strip_prefix(&marker) else {
                    continue;
                };
                if is_local_symlink(root, dir.as_ref()) {
                    continue;
                }
                let value = (encoded != NULL_PARTITION_DIR).then(|| decode(encoded));
                let mut values = values.clone();
                values.insert(column.clone(), value);
                next.push((dir, values));
            }
        }
        level = next;
    }
    Ok(level)
}

/// Lists the objects and common prefixes directly under `prefix`.
pub async fn list(
    store: &Arc<dyn ObjectStore>,
    prefix: &Path,
) -> Result<deltalake::logstore::object_store::ListResult> {
    let at = (!prefix.as_ref().is_empty()).then_some(prefix);
    store
        .list_with_delimiter(at)
        .await
        .map_err(|source| Error::Storage {
            path: if prefix.as_ref().is_empty() {
                "/".into()
            } else {
                prefix.to_string()
            },
            source,
        })
}

/// Whether a directory listing shows a Delta table of its own (it has a `_delta_log`).
pub fn holds_a_table(listing: &deltalake::logstore::object_store::ListResult) -> bool {
    listing
        .common_prefixes
        .iter()
        .any(|p| p.filename() == Some("_delta_log"))
}
/// Reloads `table` at its newest version.
pub async fn latest(table: &DeltaTable) -> Result<DeltaTable> {
    let mut latest = table.clone();
    latest
        .update_incremental(None)
        .await
        .delta_context(|| format!("cannot read the log of `{}`", table.table_url()))?;
    Ok(latest)
}
/// The live rows of a file of the log: its record count less the rows its deletion vector
/// removes; `None` when the file has no statistics.
pub fn live_rows(file: &deltalake::kernel::LogicalFileView) -> Option<u64> {
    let deleted = file
        .deletion_vector_descriptor()
        .map_or(0, |dv| u64::try_from(dv.cardinality).unwrap_or(0));
    file.num_records()
        .map(|n| u64::try_from(n).unwrap_or(0).saturating_sub(deleted))
}

/// The bytes of the object at `path`, or `None` when there is none.
pub async fn read_object(
    store: &Arc<dyn ObjectStore>,
    path: &Path,
) -> Result<Option<bytes::Bytes>> {
    use deltalake::logstore::object_store::ObjectStoreExt as _;
    let storage = |source| Error::Storage {
        path: path.to_string(),
        source,
    };
    match store.get(path).await {
        Ok(result) => Ok(Some(result.bytes().await.map_err(storage)?)),
        Err(deltalake::ObjectStoreError::NotFound { .. }) => Ok(None),
        Err(source) => Err(storage(source)),
    }
}

/// Every object under `prefix`.
pub async fn list_objects(
    store: &Arc<dyn ObjectStore>,
    prefix: &Path,
) -> Result<Vec<deltalake::ObjectMeta>> {
    use futures::TryStreamExt as _;
    store
        .list(Some(prefix))
        .try_collect()
        .await
        .map_err(|source| Error::Storage {
            path: prefix.to_string(),
            source,
        })
}
