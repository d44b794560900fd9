"""Tables written the way Spark writes them, where python `deltalake` cannot: Parquet files from
pyarrow with Spark's options, and a Delta log written by hand exactly as the protocol says.

    python3 spark_tables.py int96 DIR        # project DIR with table `scd` (INT96 timestamps)
    python3 spark_tables.py timestamps URI   # every row of the table's current files, read by
                                             # pyarrow from the raw Parquet (INT96 as Spark means
                                             # it: microseconds), as JSON sorted by id

`scd` is a slowly changing dimension as Spark writes it by default: `valid_from`/`valid_to`
are INT96 timestamps, with the usual open end `9999-12-31 23:59:59.999999` and a `0001-01-01`
start; it is partitioned by `day`, and its model `sql/scd/v1.sql` fixes `name` only.
"""

import datetime
import json
import os
import sys
import uuid

import pyarrow as pa
import pyarrow.parquet as pq

UTC = datetime.timezone.utc
FIRST = datetime.datetime(1, 1, 1, tzinfo=UTC)
LAST = datetime.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
DAYS = [datetime.date(2026, 1, 1) + datetime.timedelta(days=d) for d in range(3)]

SCHEMA = {
    "type": "struct",
    "fields": [
        {"name": "id", "type": "long", "nullable": True, "metadata": {}},
        {"name": "name", "type": "string", "nullable": True, "metadata": {}},
        {"name": "valid_from", "type": "timestamp", "nullable": True, "metadata": {}},
        {"name": "valid_to", "type": "timestamp", "nullable": True, "metadata": {}},
        {"name": "day", "type": "date", "nullable": True, "metadata": {}},
    ],
}


def rows():
    out = []
    for d, day in enumerate(DAYS):
        for i in range(4):
            ident = 100 * (d + 1) + i
            start = FIRST if i == 0 else datetime.datetime(2020 + i, 1, 1, 12, tzinfo=UTC)
            end = LAST if i % 2 == 0 else datetime.datetime(2030, 6, 1, 0, 0, 0, 123456, tzinfo=UTC)
            out.append({"id": ident, "name": f"name {ident}", "valid_from": start, "valid_to": end, "day": day})
    return out


def int96(directory):
    table_dir = os.path.join(directory, "lake", "scd")
    log = os.path.join(table_dir, "_delta_log")
    os.makedirs(log)
    actions = [
        {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}},
        {
            "metaData": {
                "id": str(uuid.uuid4()),
                "format": {"provider": "parquet", "options": {}},
                "schemaString": json.dumps(SCHEMA),
                "partitionColumns": ["day"],
                "configuration": {},
                "createdTime": 1767225600000,
            }
        },
    ]
    schema = pa.schema(
        [
            ("id", pa.int64()),
            ("name", pa.string()),
            ("valid_from", pa.timestamp("us", tz="UTC")),
            ("valid_to", pa.timestamp("us", tz="UTC")),
        ]
    )
    for day in DAYS:
        part = [r for r in rows() if r["day"] == day]
        data = pa.Table.from_pylist([{k: v for k, v in r.items() if k != "day"} for r in part], schema=schema)
        name = f"part-00000-{uuid.uuid4()}.c000.snappy.parquet"
        relative = f"day={day.isoformat()}/{name}"
        os.makedirs(os.path.join(table_dir, f"day={day.isoformat()}"), exist_ok=True)
        # Spark's defaults: INT96 timestamps, snappy.
        pq.write_table(
            data,
            os.path.join(table_dir, relative),
            use_deprecated_int96_timestamps=True,
            compression="snappy",
            # Spark writes no Arrow schema into the footer (pyarrow would, and arrow-rs would
            # read INT96 by its hint).
            store_schema=False,
        )
        actions.append(
            {
                "add": {
                    "path": relative,
                    "partitionValues": {"day": day.isoformat()},
                    "size": os.path.getsize(os.path.join(table_dir, relative)),
                    "modificationTime": 1767225600000,
                    "dataChange": True,
                    "stats": json.dumps({"numRecords": len(part)}),
                }
            }
        )
    actions.append(
        {"commitInfo": {"timestamp": 1767225600000, "operation": "WRITE", "operationParameters": {"mode": "Append"}, "engineInfo": "Apache-Spark/3.5.1 Delta-Lake/3.2.0"}}
    )
    with open(os.path.join(log, "00000000000000000000.json"), "w") as f:
        for action in actions:
            f.write(json.dumps(action) + "\n")
    with open(os.path.join(directory, "lakefill.toml"), "w") as f:
        f.write('[tables.scd]\nuri = "lake/scd"\n')
    os.makedirs(os.path.join(directory, "sql", "scd"))
    with open(os.path.join(directory, "sql", "scd", "v1.sql"), "w") as f:
        f.write(
            """/*
target = "scd"
partition_by = "day"
reason = "names in capitals"

[sources.scd]
window = "day"

[validate]
key = ["id"]
*/
SELECT id, upper(name) AS name, valid_from, valid_to, day FROM scd
"""
        )


def text(value):
    """An instant as UTC text; a value without a zone is UTC (how INT96 is read)."""
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return value.isoformat(timespec="microseconds")


def timestamps(uri):
    from deltalake import DeltaTable

    table = DeltaTable(uri)
    out = []
    for path in table.file_uris():
        local = path.removeprefix("file://")
        data = pq.read_table(local, coerce_int96_timestamp_unit="us")
        parquet_schema = pq.ParquetFile(local).schema
        physical = parquet_schema.column(parquet_schema.names.index("valid_to")).physical_type
        for row in data.to_pylist():
            out.append(
                {
                    "id": row["id"],
                    "name": row["name"],
                    "valid_from": text(row["valid_from"]),
                    "valid_to": text(row["valid_to"]),
                    "physical": physical,
                }
            )
    out.sort(key=lambda r: r["id"])
    print(json.dumps(out))


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "int96":
        int96(sys.argv[2])
    elif command == "timestamps":
        timestamps(sys.argv[2])
    else:
        raise SystemExit(f"unknown command {command}")
    # python `deltalake` can abort at interpreter exit while its threads wind down.
    sys.stdout.flush()
    os._exit(0)
