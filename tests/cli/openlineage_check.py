"""Checks an OpenLineage RunEvent read from stdin against the official Python client's model.

The OpenLineage JSON Schema itself is not published to any package registry reachable here; the
client's classes (`openlineage-python`) are generated from it, field for field, with its
validators (ISO date-times with a time, UUID run ids, the `RunState` values). The event is
rebuilt from those classes, strictly: every field must be one the spec names and every required
one present. Serialised again by the client, it must give back exactly the event received, so
each `schemaURL`/`_schemaURL` must be the very spec and facet versions the client implements.
Custom facets must carry `_producer` and `_schemaURL` as absolute URIs, as the spec requires,
and be named with a prefix (`lakefill_`), as it recommends; they are compared as they are.

Exits non-zero, naming the first difference, when the event does not conform.
"""

import copy
import json
import sys
from urllib.parse import urlparse

from openlineage.client.event_v2 import InputDataset, Job, OutputDataset, Run, RunEvent, RunState
from openlineage.client.generated.dataset_version_dataset import DatasetVersionDatasetFacet
from openlineage.client.serde import Serde

# Standard dataset facets lakefill emits, by the key the spec gives them.
DATASET_FACETS = {"version": DatasetVersionDatasetFacet}


def fields(where, value, required, optional=()):
    if not isinstance(value, dict):
        sys.exit(f"{where}: expected an object, got {value!r}")
    missing = set(required) - value.keys()
    unknown = value.keys() - set(required) - set(optional)
    if missing or unknown:
        sys.exit(f"{where}: missing {sorted(missing)}, not in the spec {sorted(unknown)}")


def text(where, value):
    if not isinstance(value, str):
        sys.exit(f"{where}: expected a string, got {value!r}")


def absolute_uri(where, value):
    parsed = urlparse(value) if isinstance(value, str) else None
    if not parsed or not parsed.scheme or not parsed.netloc:
        sys.exit(f"{where}: {value!r} is not an absolute URI")


def custom_facet(where, name, facet):
    if not name.startswith("lakefill_"):
        sys.exit(f"{where}: custom facet {name!r} has no prefix")
    if not isinstance(facet, dict):
        sys.exit(f"{where}.{name}: expected an object")
    for key in ("_producer", "_schemaURL"):
        absolute_uri(f"{where}.{name}.{key}", facet.get(key))


def dataset_facets(where, facets):
    out = {}
    for name, facet in (facets or {}).items():
        cls = DATASET_FACETS.get(name)
        if cls is None:
            sys.exit(f"{where}: {name!r} is not a standard dataset facet lakefill emits")
        own = [a.name for a in cls.__attrs_attrs__ if not a.name.startswith("_")]
        fields(f"{where}.{name}", facet, ["_producer", "_schemaURL", *own])
        absolute_uri(f"{where}.{name}._producer", facet["_producer"])
        for attribute in cls.__attrs_attrs__:
            if attribute.name in own and attribute.type in ("str", str):
                text(f"{where}.{name}.{attribute.name}", facet[attribute.name])
        out[name] = cls(producer=facet["_producer"], **{k: facet[k] for k in own})
    return out


def pruned(value):
    if isinstance(value, dict):
        kept = {k: pruned(v) for k, v in value.items()}
        return {k: v for k, v in kept.items() if v != {}}
    if isinstance(value, list):
        return [pruned(v) for v in value]
    return value


def main():
    event = json.load(sys.stdin)
    fields(
        "event",
        event,
        ["eventTime", "producer", "schemaURL", "run", "job"],
        ["eventType", "inputs", "outputs"],
    )
    fields("run", event["run"], ["runId"], ["facets"])
    for name, facet in (event["run"].get("facets") or {}).items():
        custom_facet("run.facets", name, facet)
    fields("job", event["job"], ["namespace", "name"], ["facets"])
    if event["job"].get("facets"):
        sys.exit("job.facets: lakefill emits none")
    inputs = []
    for i, dataset in enumerate(event.get("inputs", [])):
        fields(f"inputs[{i}]", dataset, ["namespace", "name"], ["facets", "inputFacets"])
        if dataset.get("inputFacets"):
            sys.exit(f"inputs[{i}].inputFacets: lakefill emits none")
        inputs.append(
            InputDataset(
                namespace=dataset["namespace"],
                name=dataset["name"],
                facets=dataset_facets(f"inputs[{i}].facets", dataset.get("facets")),
            )
        )
    outputs = []
    for i, dataset in enumerate(event.get("outputs", [])):
        fields(f"outputs[{i}]", dataset, ["namespace", "name"], ["facets", "outputFacets"])
        for name, facet in (dataset.get("outputFacets") or {}).items():
            custom_facet(f"outputs[{i}].outputFacets", name, facet)
        outputs.append(
            OutputDataset(
                namespace=dataset["namespace"],
                name=dataset["name"],
                facets=dataset_facets(f"outputs[{i}].facets", dataset.get("facets")),
            )
        )
    absolute_uri("producer", event["producer"])
    for where, value in [
        ("eventTime", event["eventTime"]),
        ("run.runId", event["run"]["runId"]),
        ("job.namespace", event["job"]["namespace"]),
        ("job.name", event["job"]["name"]),
        *[(f"inputs[{i}].name", d["name"]) for i, d in enumerate(event.get("inputs", []))],
        *[(f"outputs[{i}].name", d["name"]) for i, d in enumerate(event.get("outputs", []))],
    ]:
        text(where, value)
    rebuilt = RunEvent(
        eventType=RunState(event["eventType"]),
        eventTime=event["eventTime"],
        run=Run(runId=event["run"]["runId"]),
        job=Job(namespace=event["job"]["namespace"], name=event["job"]["name"]),
        inputs=inputs,
        outputs=outputs,
        producer=event["producer"],
    )
    again = Serde.to_dict(rebuilt)
    # Custom facets are compared as received (their content is lakefill's own schema).
    if event["run"].get("facets"):
        again["run"]["facets"] = copy.deepcopy(event["run"]["facets"])
    for i, dataset in enumerate(event.get("outputs", [])):
        if dataset.get("outputFacets"):
            again["outputs"][i]["outputFacets"] = copy.deepcopy(dataset["outputFacets"])
    # An empty object and an absent one say the same (the client writes `{}` for no facets).
    expected, again = pruned(event), pruned(again)
    if again != expected:
        sys.exit(
            "the event differs from the client's model of it:\n"
            f"received: {json.dumps(expected, sort_keys=True)}\n"
            f"model:    {json.dumps(again, sort_keys=True)}"
        )


main()
