//! Which model versions were published into a table, with their fingerprints: a released model
//! file is never edited, and this record is how `plan` knows one was.

use std::sync::Arc;

use deltalake::logstore::object_store::{ObjectStoreExt as _, PutMode, PutOptions, PutPayload};
use deltalake::{ObjectStore, ObjectStoreError};
use serde_json::{Value, json};

use crate::error::{Error, Result};
use crate::journal::Journal;

/// Directory of the published model versions under a table's root.
const MODELS_DIR: &str = "_lakefill/models";

fn model_record_path(model: &str, version: &str) -> deltalake::Path {
    deltalake::Path::from(MODELS_DIR)
        .join(model)
        .join(format!("{version}.json").as_str())
}

/// Records that `model@version` with its fingerprint was published into the table, the first
/// time only (a conditional put). Best effort: a record that cannot be written is written by the
/// next command that reconciles the run.
pub(crate) async fn record_published_model(store: &Arc<dyn ObjectStore>, journal: &Journal) {
    let record = json!({
        "model": journal.model,
        "version": journal.model_version,
        "fingerprint": journal.fingerprint,
        "run_id": journal.run_id,
        "published_version": journal.published_version,
    });
    let path = model_record_path(&journal.model, &journal.model_version);
    match store
        .put_opts(
            &path,
            PutPayload::from(record.to_string().into_bytes()),
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
pub(crate) async fn published_fingerprint(
    store: &Arc<dyn ObjectStore>,
    model: &str,
    version: &str,
) -> Result<Option<String>> {
    let path = model_record_path(model, version);
    let bytes = match store.get(&path).await {
        Ok(result) => result.bytes().await.map_err(|source| Error::Storage {
            path: path.to_string(),
            source,
        })?,
        Err(ObjectStoreError::NotFound { .. }) => return Ok(None),
        Err(source) => {
            return Err(Error::Storage {
                path: path.to_string(),
                source,
            });
        }
    };
    Ok(serde_json::from_slice::<Value>(&bytes)
        .ok()
        .and_then(|record| record["fingerprint"].as_str().map(str::to_string)))
}
