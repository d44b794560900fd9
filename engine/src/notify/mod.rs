//! Notify (DESIGN §4.5): after a commit, consumers learn that history changed, where and by how
//! much.
//!
//! Delivered at least once, never lost. The event of a version is derived from its commit (see
//! [`event`]), so nothing has to be written before the commit for it to be known. After the
//! commit, the event is written to the table's outbox (`_lakefill/outbox/events/<version>.json`)
//! and delivered to each sink; each sink's state lives beside it
//! (`_lakefill/outbox/sinks/<sink id>/`): `since.json` (every version up to it is settled),
//! `delivered/<version>.json` and `failed/<version>.json`. A crash before delivery, or a sink
//! that was down, is caught up by the next `backfill`, `publish` or `revert` of the table and by
//! `lakefill notify TABLE`. A failing sink never fails the command: it is reported and retried
//! later. Sinks are tried side by side, within [`BUDGET`] per command: a sink that hangs costs
//! each command that long at most, and what it was not told stays pending. A sink added to a project starts with the versions after the one it first saw.

pub(crate) mod event;
pub(crate) mod lineage;
pub(crate) mod sink;

use std::collections::BTreeSet;
use std::sync::Arc;

use deltalake::logstore::object_store::{ObjectStoreExt as _, PutMode, PutOptions, PutPayload};
use deltalake::{DeltaTable, ObjectStore, Path};
use serde::{Deserialize, Serialize};

use lakefill_log::journal::Journal;
use lakefill_log::read_commit;
use lakefill_table::config::{Project, TableConfig};
use lakefill_table::error::{Error, Result};
use lakefill_table::failpoint::{self, CrashPoint};
use lakefill_table::run_id::RunId;
use lakefill_table::storage::{loaded_version, open_table};

pub use event::{EVENT_SCHEMA, Event};
use sink::Deliver as _;
pub use sink::{EVENT_TYPES, Sink};

const OUTBOX: &str = "_lakefill/outbox";

/// What happened to one sink's deliveries.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Delivery {
    /// The sink, as written in the project (secrets masked).
    pub sink: String,
    /// Versions whose event was delivered now.
    pub delivered: Vec<u64>,
    /// Versions the sink's filters skip.
    pub skipped: Vec<u64>,
    /// Versions whose delivery failed now; later commands retry them.
    pub failed: Vec<u64>,
    /// Versions not tried because the command's time for notifications ran out; later commands
    /// deliver them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending: Vec<u64>,
    /// Why the last failure failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Which versions to deliver.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    /// Deliver from this version on, whatever the sinks' cursors say.
    pub since: Option<u64>,
    /// Deliver again what was delivered already.
    pub replay: bool,
}

/// `lakefill notify TABLE`: delivers every pending event of `table` (or, with `window`, those of
/// a range of versions, again if asked).
pub async fn notify(project: &Project, table: &str, window: Window) -> Result<Vec<Delivery>> {
    let config = project.table(table, "the command line")?;
    if config.sinks().is_empty() {
        return Err(Error::InvalidOption {
            option: "TABLE".into(),
            value: table.to_string(),
            message: format!(
                "`{table}` has no sinks: add `notify = [\"file:notifications.jsonl\"]` to [tables.{table}] (or to the top of lakefill.toml for every table)"
            ),
        });
    }
    let latest = open_table(config, None).await?;
    deliver(config, &latest, None, window).await
}

/// After a command committed `version` of `config`'s table (or on any command, to catch up):
/// writes the event and delivers what is pending. Never fails: problems are in the result and
/// in the log.
pub(crate) async fn after_commit(
    config: &TableConfig,
    latest: &DeltaTable,
    committed: Option<u64>,
) -> Vec<Delivery> {
    if config.sinks().is_empty() {
        return Vec::new();
    }
    let latest = match lakefill_table::storage::latest(latest).await {
        Ok(latest) => latest,
        Err(error) => {
            tracing::warn!(table = config.name(), %error, "cannot read the table to notify");
            return Vec::new();
        }
    };
    let window = Window {
        since: None,
        replay: false,
    };
    match deliver(config, &latest, committed, window).await {
        Ok(deliveries) => deliveries,
        Err(error) => {
            tracing::warn!(table = config.name(), %error, "cannot notify");
            config
                .sinks()
                .iter()
                .map(|sink| Delivery {
                    sink: sink.name(),
                    delivered: Vec::new(),
                    skipped: Vec::new(),
                    failed: committed.into_iter().collect(),
                    pending: Vec::new(),
                    error: Some(lakefill_table::secrets::mask(&error.to_string())),
                })
                .collect()
        }
    }
}

/// Before a command that may commit to `table`: a sink seen for the first time starts at the
/// table's current version, so whatever the command commits is delivered to it even if the
/// process dies right after the commit. Best effort: a failure is logged.
pub(crate) async fn prepare(config: &TableConfig, table: &DeltaTable) {
    let Ok(version) = loaded_version(table) else {
        return;
    };
    let store = table.object_store();
    for sink in config.sinks() {
        let dir = format!("{OUTBOX}/sinks/{}", sink.id());
        if let Err(error) = cursor(&store, &dir, version).await {
            tracing::warn!(sink = %sink.name(), %error, "cannot record where the sink starts");
        }
    }
}

/// A sink's cursor: every version up to `since` is settled for it.
#[derive(Debug, Serialize, Deserialize)]
struct Cursor {
    since: u64,
}

/// A sink's record of one version.
#[derive(Debug, Serialize, Deserialize)]
struct Record {
    event_id: String,
    at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    skipped: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// The time one command spends on its sinks, all together: sinks are tried side by side, and
/// what is not delivered by then stays pending for the next command (a sink that hangs costs
/// each command this long, not minutes).
const BUDGET: std::time::Duration = std::time::Duration::from_secs(12);

async fn deliver(
    config: &TableConfig,
    latest: &DeltaTable,
    committed: Option<u64>,
    window: Window,
) -> Result<Vec<Delivery>> {
    let store = latest.object_store();
    let latest_version = loaded_version(latest)?;
    if let Some(version) = committed {
        // The event first, then the deliveries: a crash between them leaves the event in the
        // outbox for the next command.
        event_of(config, latest, &store, version).await?;
        failpoint::reach(CrashPoint::MidNotify).await?;
    }
    // What each sink has pending, then each version's event once, whatever the number of sinks.
    let mut pending = Vec::new();
    let mut events: std::collections::BTreeMap<u64, Option<Event>> = Default::default();
    for sink in config.sinks() {
        let dir = format!("{OUTBOX}/sinks/{}", sink.id());
        // A sink seen for the first time starts after what it has not been told of: the
        // version before this command's commit, or the latest one.
        let first = committed.map_or(latest_version, |v| v.saturating_sub(1));
        let cursor = cursor(&store, &dir, first).await?;
        let from = window.since.unwrap_or(cursor + 1);
        let delivered = if window.replay {
            BTreeSet::new()
        } else {
            settled(&store, &format!("{dir}/delivered")).await?
        };
        let versions: Vec<u64> = (from.max(1)..=latest_version)
            .filter(|v| !delivered.contains(v))
            .collect();
        for &version in &versions {
            if let std::collections::btree_map::Entry::Vacant(slot) = events.entry(version) {
                slot.insert(event_of(config, latest, &store, version).await?);
            }
        }
        pending.push((sink, dir, cursor, versions));
    }
    let deadline = tokio::time::Instant::now() + BUDGET;
    let events = &events;
    let store = &store;
    futures::future::try_join_all(pending.into_iter().map(|(sink, dir, cursor, versions)| {
        deliver_to(
            sink,
            dir,
            cursor,
            versions,
            events,
            store,
            deadline,
            window,
            latest_version,
        )
    }))
    .await
}

/// Delivers `versions` to one sink, in order, until `deadline`; records each outcome beside
/// the sink and moves its cursor past what is settled.
#[allow(clippy::too_many_arguments)]
async fn deliver_to(
    sink: &sink::Sink,
    dir: String,
    cursor: u64,
    versions: Vec<u64>,
    events: &std::collections::BTreeMap<u64, Option<Event>>,
    store: &Arc<dyn ObjectStore>,
    deadline: tokio::time::Instant,
    window: Window,
    latest_version: u64,
) -> Result<Delivery> {
    let mut outcome = Delivery {
        sink: sink.name(),
        delivered: Vec::new(),
        skipped: Vec::new(),
        failed: Vec::new(),
        pending: Vec::new(),
        error: None,
    };
    let mut first_failure = None;
    for version in versions {
        let Some(event) = events.get(&version).and_then(Option::as_ref) else {
            continue;
        };
        let marker = Path::from(format!("{dir}/delivered/{version:020}.json"));
        if !sink.wants(event) {
            put_json(store, &marker, &record(event, Some("filtered"), None)).await?;
            outcome.skipped.push(version);
            continue;
        }
        let body =
            serde_json::to_string(event).map_err(|e| Error::Internal(format!("event: {e}")))?;
        match sink.deliver(event, &body, deadline).await {
            Ok(()) => {
                put_json(store, &marker, &record(event, None, None)).await?;
                outcome.delivered.push(version);
            }
            Err(sink::Undelivered::Failed(error)) => {
                let error = lakefill_table::secrets::mask(&error);
                let failed = Path::from(format!("{dir}/failed/{version:020}.json"));
                put_json(store, &failed, &record(event, None, Some(error.clone()))).await?;
                tracing::warn!(sink = %sink.name(), version, %error, "notification not delivered; it is retried by the next command");
                outcome.failed.push(version);
                outcome.error = Some(error);
                first_failure.get_or_insert(version);
            }
            Err(sink::Undelivered::OutOfTime) => {
                outcome.pending.push(version);
                first_failure.get_or_insert(version);
            }
        }
    }
    if !outcome.pending.is_empty() {
        tracing::warn!(
            sink = %sink.name(),
            versions = ?outcome.pending,
            "the time for notifications ({} s) ran out; the next command delivers the rest",
            BUDGET.as_secs()
        );
    }
    // Every version before the first failure is settled for this sink.
    let settled_up_to = first_failure.map_or(latest_version, |v: u64| v - 1);
    if settled_up_to > cursor && window.since.is_none() {
        put_json(
            store,
            &Path::from(format!("{dir}/since.json")),
            &Cursor {
                since: settled_up_to,
            },
        )
        .await?;
    }
    Ok(outcome)
}

fn record(event: &Event, skipped: Option<&str>, error: Option<String>) -> Record {
    Record {
        event_id: event.event_id.clone(),
        at: lakefill_table::time::now(),
        skipped: skipped.map(str::to_string),
        error,
    }
}

/// The sink's cursor, created at `first` if it has none.
async fn cursor(store: &Arc<dyn ObjectStore>, dir: &str, first: u64) -> Result<u64> {
    let path = Path::from(format!("{dir}/since.json"));
    let body = serde_json::to_vec(&Cursor { since: first })
        .map_err(|e| Error::Internal(format!("cursor: {e}")))?;
    match store
        .put_opts(
            &path,
            PutPayload::from(body),
            PutOptions::from(PutMode::Create),
        )
        .await
    {
        Ok(_) => return Ok(first),
        Err(deltalake::ObjectStoreError::AlreadyExists { .. }) => {}
        Err(source) => {
            return Err(Error::Storage {
                path: path.to_string(),
                source,
            });
        }
    }
    let cursor: Cursor = get_json(store, &path).await?.ok_or_else(|| {
        Error::Internal(format!("the cursor `{path}` vanished while it was read"))
    })?;
    Ok(cursor.since)
}

/// The versions with a record under `dir`.
async fn settled(store: &Arc<dyn ObjectStore>, dir: &str) -> Result<BTreeSet<u64>> {
    let listed = lakefill_table::storage::list_objects(store, &Path::from(dir)).await?;
    Ok(listed
        .iter()
        .filter_map(|meta| {
            meta.location
                .filename()?
                .strip_suffix(".json")?
                .parse()
                .ok()
        })
        .collect())
}

/// The event of `version`, from the outbox, or derived from its commit and written there; `None`
/// when no lakefill run made the commit.
async fn event_of(
    config: &TableConfig,
    latest: &DeltaTable,
    store: &Arc<dyn ObjectStore>,
    version: u64,
) -> Result<Option<Event>> {
    let path = Path::from(format!("{OUTBOX}/events/{version:020}.json"));
    if let Some(event) = get_json::<Event>(store, &path).await? {
        return Ok(Some(event));
    }
    let Some(commit) = read_commit(latest, version).await? else {
        return Ok(None);
    };
    let Some(metadata) = commit.lakefill() else {
        return Ok(None);
    };
    let journal = match RunId::parse(&metadata.run_id) {
        Ok(run_id) => Journal::load(store, &run_id).await.ok().flatten(),
        Err(_) => None,
    };
    let timestamp = commit.info["timestamp"]
        .as_i64()
        .and_then(chrono::DateTime::<chrono::Utc>::from_timestamp_millis)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true));
    let event = Event::of_commit(
        config.name(),
        config.uri(),
        config.url().as_str(),
        version,
        timestamp,
        &metadata,
        journal.as_ref(),
    );
    put_json(store, &path, &event).await?;
    Ok(Some(event))
}

async fn get_json<T: serde::de::DeserializeOwned>(
    store: &Arc<dyn ObjectStore>,
    path: &Path,
) -> Result<Option<T>> {
    let Some(bytes) = lakefill_table::storage::read_object(store, path).await? else {
        return Ok(None);
    };
    // A damaged record is rebuilt rather than trusted.
    Ok(serde_json::from_slice(&bytes).ok())
}

async fn put_json<T: Serialize>(
    store: &Arc<dyn ObjectStore>,
    path: &Path,
    value: &T,
) -> Result<()> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| Error::Internal(format!("cannot write `{path}`: {e}")))?;
    store
        .put(
            path,
            PutPayload::from(lakefill_table::secrets::mask(&text).into_bytes()),
        )
        .await
        .map_err(|source| Error::Storage {
            path: path.to_string(),
            source,
        })?;
    Ok(())
}
