//! Which model versions were published into a table, with their fingerprints: a released model
//! file is never edited, and this record is how `plan` knows one was.

use std::sync::Arc;

use deltalake::logstore::object_store::{PutMode, PutOptions, PutPayload};
use deltalake::{ObjectStore, ObjectStoreError};
use serde::{Deserialize, Serialize};

use lakefill_table::error::{Error, Result};

/// Directory of the published model versions under a table's root.
const MODELS_DIR: &str = "_lakefill/models";

fn model_record_path(model: &str, version: &str) -> deltalake::Path {
    deltalake::Path::from(MODELS_DIR)
        .join(model)
        .join(format!("{version}.json").as_str())
}

/// The record of a model version's first publish into a table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelRecord {
    /// The model.
    pub model: String,
    /// Its version.
    pub version: String,
    /// SHA-256 of the model file as published.
    pub fingerprint: String,
    /// The run that published it.
    pub run_id: String,
    /// The table version it was published as.
    #[serde(default)]
    pub published_version: Option<u64>,
}

/// Records that `model@version` with its fingerprint was published into the table, the first
/// time only (a conditional put). Best effort: a record that cannot be written is written by the
/// next command that reconciles the run.
pub async fn record_published_model(store: &Arc<dyn ObjectStore>, record: &ModelRecord) {
    let path = model_record_path(&record.model, &record.version);
    let Ok(bytes) = serde_json::to_vec(record) else {
        return;
    };
    match store
        .put_opts(
            &path,
            PutPayload::from(bytes),
            PutOptions::from(PutMode::Create),
        )
        .await
    {
        Ok(_)
        | Err(ObjectStoreError::AlreadyExists { .. } | ObjectStoreError::Precondition { .. }) => {}
        Err(error) => {
            tracing::debug!(path = %path, %error, "cannot record the published model version")
        }
    }
}

/// The fingerprint `model@version` had when it was first published into the table, if it was.
pub async fn published_fingerprint(
    store: &Arc<dyn ObjectStore>,
    model: &str,
    version: &str,
) -> Result<Option<String>> {
    let path = model_record_path(model, version);
    let Some(bytes) = lakefill_table::storage::read_object(store, &path).await? else {
        return Ok(None);
    };
    let record: ModelRecord = serde_json::from_slice(&bytes).map_err(|e| Error::Internal(format!(
        "the record of the published model version at `{path}` is not readable ({e}); restore it from a backup or delete it to accept the current file"
    )))?;
    Ok(Some(record.fingerprint))
}
