"""Tables made by another Delta writer (python `deltalake`), and an independent reader of them.

    python3 delta_tables.py create KIND PATH   # a table with the feature KIND at PATH
    python3 delta_tables.py rows PATH          # its rows as JSON, sorted by event_id
    python3 delta_tables.py protocol PATH      # its protocol as JSON

Every table has event_id (long), amount_cents (long) and event_date (date, the partition column),
3 days x 4 rows; KIND adds what the feature needs.
"""

import datetime
import json
import os
import sys

import pyarrow as pa
from deltalake import DeltaTable, Field, Schema, write_deltalake

DAYS = [datetime.date(2026, 1, 1) + datetime.timedelta(days=d) for d in range(3)]


def rows(with_double=False):
    ids, amounts, dates = [], [], []
    for d, day in enumerate(DAYS):
        for i in range(4):
            ids.append(100 * (d + 1) + i)
            amounts.append(1000 + 10 * d + i)
            dates.append(day)
    data = {"event_id": ids, "amount_cents": amounts, "event_date": dates}
    if with_double:
        data["double_amount"] = [2 * a for a in amounts]
    return data


def create(kind, path):
    fields = [
        Field("event_id", "long", nullable=kind != "not_null"),
        Field("amount_cents", "long"),
        Field("event_date", "date"),
    ]
    configuration = {}
    if kind == "not_null":
        fields[0] = Field("event_id", "long", nullable=False)
    elif kind == "invariants":
        invariant = {"expression": {"expression": "amount_cents < 1000000"}}
        fields[1] = Field("amount_cents", "long", metadata={"delta.invariants": json.dumps(invariant)})
    elif kind == "generated":
        fields.append(
            Field("double_amount", "long", metadata={"delta.generationExpression": "amount_cents * 2"})
        )
    elif kind == "column_mapping":
        configuration["delta.columnMapping.mode"] = "name"
    elif kind == "append_only":
        configuration["delta.appendOnly"] = "true"
    elif kind == "change_data_feed":
        configuration["delta.enableChangeDataFeed"] = "true"
    elif kind not in ("constraints", "plain"):
        raise SystemExit(f"unknown kind {kind}")
    DeltaTable.create(
        path, schema=Schema(fields), partition_by=["event_date"], configuration=configuration or None
    )
    types = {"long": pa.int64(), "date": pa.date32()}
    schema = pa.schema([pa.field(f.name, types[f.type.type], nullable=f.nullable) for f in fields])
    write_deltalake(path, pa.table(rows(kind == "generated"), schema=schema), mode="append")
    if kind == "constraints":
        DeltaTable(path).alter.add_constraint({"amount_positive": "amount_cents > 0"})


def read_rows(path):
    table = DeltaTable(path).to_pyarrow_table().to_pylist()
    out = []
    for row in sorted(table, key=lambda r: (r["event_id"] is None, r["event_id"])):
        out.append({k: (v.isoformat() if isinstance(v, datetime.date) else v) for k, v in row.items()})
    print(json.dumps(out))


def protocol(path):
    p = DeltaTable(path).protocol()
    print(
        json.dumps(
            {
                "min_reader_version": p.min_reader_version,
                "min_writer_version": p.min_writer_version,
                "reader_features": p.reader_features,
                "writer_features": p.writer_features,
            }
        )
    )


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "create":
        create(sys.argv[2], sys.argv[3])
    elif command == "rows":
        read_rows(sys.argv[2])
    elif command == "protocol":
        protocol(sys.argv[2])
    else:
        raise SystemExit(f"unknown command {command}")
    # deltalake's runtime threads can abort the interpreter's shutdown; the work is done.
    sys.stdout.flush()
    os._exit(0)
