//! The record of a cascade (`_lakefill/cascades/<cascade id>.json` under the root target): its
//! nodes and, as they land, each table's new version. A summary of the tables' logs, which stay
//! the truth; kept beside the run journals so that every layer above (running, managing,
//! reverting, reading a release) reads it the same way.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use lakefill_table::config::Project;
use lakefill_table::error::{Error, Result};

/// Where cascade records live under the root target's root.
const CASCADES_DIR: &str = "_lakefill/cascades";

/// The record of a cascade: its nodes and, as they land, each table's new version.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CascadeRecord {
    /// The cascade's id (`cascade-…`).
    pub cascade_id: String,
    /// The table whose fix started it.
    pub root: String,
    /// Its nodes, parents before children.
    pub nodes: Vec<RecordNode>,
    /// When it was created (RFC 3339).
    pub created_at: String,
    /// When the record last changed (RFC 3339).
    pub updated_at: String,
}

/// One node of a cascade record.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RecordNode {
    /// The model the node runs.
    pub model: String,
    /// The table it writes.
    pub table: String,
    /// Its run.
    pub run_id: String,
    /// The run's state, as last recorded.
    pub state: String,
    /// The version its commit created, once published.
    pub published_version: Option<u64>,
}

/// The version each table of cascade `id` was published as; refused unless every node is
/// published (a half-published cascade is no release).
pub async fn release(
    project: &Project,
    id: &str,
) -> Result<std::collections::BTreeMap<String, u64>> {
    let (_, record) = load_record(project, id).await?;
    let mut versions = std::collections::BTreeMap::new();
    for node in &record.nodes {
        let version = node.published_version.ok_or_else(|| Error::RunState {
            run_id: id.to_string(),
            state: format!("{} is {}", node.table, node.state),
            action: "read as a release".into(),
            next: format!(
                "publish the cascade first (`lakefill publish {id}`), or read each table at a version with \"table@VERSION\""
            ),
        })?;
        versions.insert(node.table.clone(), version);
    }
    Ok(versions)
}

/// The record of cascade `id` and the store of the table it lives under (the root target).
pub async fn load_record(
    project: &Project,
    id: &str,
) -> Result<(Arc<dyn deltalake::ObjectStore>, CascadeRecord)> {
    let id = lakefill_table::run_id::RunId::parse(id)?;
    let path = deltalake::Path::from(format!("{CASCADES_DIR}/{id}.json"));
    let mut searched = Vec::new();
    for config in project.tables() {
        let Ok(table) = lakefill_table::storage::open_table(config, None).await else {
            continue;
        };
        searched.push(config.name().to_string());
        let store = table.object_store();
        if let Some(bytes) = lakefill_table::storage::read_object(&store, &path).await? {
            let record = serde_json::from_slice(&bytes).map_err(|e| Error::Journal {
                path: path.to_string(),
                message: e.to_string(),
            })?;
            return Ok((store, record));
        }
    }
    Err(CascadeRecord::unknown(id.as_str(), searched))
}

/// Writes the record (best effort: the logs are the truth, the record a summary of them).
pub async fn save(store: &Arc<dyn deltalake::ObjectStore>, record: &mut CascadeRecord) {
    use deltalake::logstore::object_store::{ObjectStoreExt as _, PutPayload};
    record.updated_at = lakefill_table::time::now();
    let path = deltalake::Path::from(format!("{CASCADES_DIR}/{}.json", record.cascade_id));
    let Ok(text) = serde_json::to_string_pretty(record) else {
        return;
    };
    if let Err(error) = store
        .put(
            &path,
            PutPayload::from(lakefill_table::secrets::mask(&text).into_bytes()),
        )
        .await
    {
        tracing::warn!(%error, cascade = %record.cascade_id, "cannot write the cascade record");
    }
}

impl CascadeRecord {
    /// The error of a cascade id that names no record.
    pub fn unknown(id: &str, searched: Vec<String>) -> Error {
        Error::UnknownRun {
            run_id: id.to_string(),
            searched,
        }
    }
}
