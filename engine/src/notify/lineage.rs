//! An event as OpenLineage sees it: a `RunEvent` of type `COMPLETE` (spec 2-0-2) whose job is the
//! model, whose inputs are the sources at the versions the run read, and whose output is the
//! target at the version the commit made, with the change per partition as a custom facet.
//!
//! Datasets are named in the `lakefill` namespace by their name in the project; versions go in
//! the standard `version` dataset facet. The run id is the event id as a UUID, so a repeated
//! delivery names the same run.

use serde_json::{Value, json};

use super::event::Event;

/// The producer every facet and event names.
const PRODUCER: &str = "https://github.com/lakefill/lakefill";
/// The namespace of jobs and datasets.
const NAMESPACE: &str = "lakefill";

/// The OpenLineage `RunEvent` of `event`.
pub(crate) fn run_event(event: &Event) -> Value {
    let version = |v: u64| {
        json!({
            "_producer": PRODUCER,
            "_schemaURL": "https://openlineage.io/spec/facets/1-0-1/DatasetVersionDatasetFacet.json#/$defs/DatasetVersionDatasetFacet",
            "datasetVersion": v.to_string(),
        })
    };
    let inputs: Vec<Value> = event
        .sources
        .iter()
        .map(|(name, v)| {
            json!({"namespace": NAMESPACE, "name": name, "facets": {"version": version(*v)}})
        })
        .collect();
    let change = json!({
        "_producer": PRODUCER,
        "_schemaURL": format!("{PRODUCER}/blob/main/schemas/event-v1.schema.json"),
        "type": event.kind,
        "version_before": event.version_before,
        "range": event.range,
        "totals": event.totals,
        "key_diff": event.key_diff,
        "partitions": event.partitions,
        "validation": event.validation,
        "reason": event.reason,
        "revert_of": event.revert_of,
        "cascade": event.cascade,
        "commands": event.commands,
    });
    let mut run_facets = serde_json::Map::new();
    run_facets.insert(
        "lakefill_run".into(),
        json!({
            "_producer": PRODUCER,
            "_schemaURL": format!("{PRODUCER}/blob/main/schemas/event-v1.schema.json"),
            "run_id": event.run_id,
            "model_version": event.model.version,
            "fingerprint": event.model.fingerprint,
        }),
    );
    json!({
        "eventType": "COMPLETE",
        "eventTime": event.occurred_at.clone().unwrap_or_else(lakefill_table::time::now),
        "run": {"runId": uuid_of(&event.event_id), "facets": run_facets},
        "job": {"namespace": NAMESPACE, "name": event.model.name, "facets": {}},
        "inputs": inputs,
        "outputs": [{
            "namespace": NAMESPACE,
            "name": event.table.name,
            "facets": {"version": version(event.version_after)},
            "outputFacets": {"lakefill_change": change},
        }],
        "producer": PRODUCER,
        "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent",
    })
}

/// The event id (32 hex digits) written as a UUID (8-4-4-4-12).
fn uuid_of(event_id: &str) -> String {
    let hex: String = event_id
        .chars()
        .filter(char::is_ascii_hexdigit)
        .chain(std::iter::repeat('0'))
        .take(32)
        .collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}
