"""Tables written the way Spark writes them, where python `deltalake` cannot: Parquet files from
pyarrow with Spark's options, and a Delta log written by hand exactly as the protocol says.

    python3 spark_tables.py int96 DIR [vectors]
                                             # project DIR with table `scd` (INT96 timestamps;
                                             # `vectors`: deletion vectors on)
    python3 spark_tables.py plain DIR        # project DIR with table `t`: 3 appends by hand
    python3 spark_tables.py vacuum_check DIR # project DIR with table `t` whose version 1 adds the
                                             # reader feature vacuumProtocolCheck
    python3 spark_tables.py cleaned DIR      # project DIR with table `t`: 5 appends, a checkpoint
                                             # at version 4, the commits before 3 cleaned up
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


def int96(directory, vectors=False):
    """With `vectors`, the table takes deletion vectors (`delta.enableDeletionVectors`, as a
    Databricks table created since 2024 does)."""
    table_dir = os.path.join(directory, "lake", "scd")
    log = os.path.join(table_dir, "_delta_log")
    os.makedirs(log)
    protocol = {"minReaderVersion": 1, "minWriterVersion": 2}
    configuration = {}
    if vectors:
        protocol = {
            "minReaderVersion": 3,
            "minWriterVersion": 7,
            "readerFeatures": ["deletionVectors"],
            "writerFeatures": ["deletionVectors"],
        }
        configuration = {"delta.enableDeletionVectors": "true"}
    actions = [
        {"protocol": protocol},
        {
            "metaData": {
                "id": str(uuid.uuid4()),
                "format": {"provider": "parquet", "options": {}},
                "schemaString": json.dumps(SCHEMA),
                "partitionColumns": ["day"],
                "configuration": configuration,
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


def hand_written(directory, commits):
    """Table `t` (id long, day date partition) of `commits`: each a list of (day, ids) files,
    with optional protocol action; written by hand with commit times 2026-01-01 plus the version
    in minutes."""
    root = os.path.join(directory, "lake", "t")
    os.makedirs(os.path.join(root, "_delta_log"))
    schema = {
        "type": "struct",
        "fields": [
            {"name": "id", "type": "long", "nullable": True, "metadata": {}},
            {"name": "day", "type": "date", "nullable": True, "metadata": {}},
        ],
    }
    for version, (protocol, files) in enumerate(commits):
        actions = []
        if protocol:
            actions.append({"protocol": protocol})
        if version == 0:
            actions.append(
                {
                    "metaData": {
                        "id": str(uuid.uuid4()),
                        "format": {"provider": "parquet", "options": {}},
                        "schemaString": json.dumps(schema),
                        "partitionColumns": ["day"],
                        "configuration": {},
                        "createdTime": 1767225600000,
                    }
                }
            )
        for day, ids in files:
            relative = f"day={day}/part-{uuid.uuid4()}.c000.snappy.parquet"
            os.makedirs(os.path.join(root, f"day={day}"), exist_ok=True)
            pq.write_table(pa.table({"id": pa.array(ids, pa.int64())}), os.path.join(root, relative))
            actions.append(
                {
                    "add": {
                        "path": relative,
                        "partitionValues": {"day": day},
                        "size": os.path.getsize(os.path.join(root, relative)),
                        "modificationTime": 1767225600000,
                        "dataChange": True,
                        "stats": json.dumps({"numRecords": len(ids)}),
                    }
                }
            )
        actions.append({"commitInfo": {"timestamp": 1767225600000 + 60000 * version, "operation": "WRITE"}})
        with open(os.path.join(root, "_delta_log", f"{version:020d}.json"), "w") as f:
            f.write("".join(json.dumps(a) + "\n" for a in actions))
    with open(os.path.join(directory, "lakefill.toml"), "w") as f:
        f.write('[tables.t]\nuri = "lake/t"\n')


def plain(directory):
    protocol = {"minReaderVersion": 1, "minWriterVersion": 2}
    hand_written(directory, [(protocol if v == 0 else None, [("2026-01-01", [v])]) for v in range(3)])


def vacuum_check(directory, feature="vacuumProtocolCheck"):
    plain = {"minReaderVersion": 1, "minWriterVersion": 2}
    upgraded = {
        "minReaderVersion": 3,
        "minWriterVersion": 7,
        "readerFeatures": [feature],
        "writerFeatures": [feature],
    }
    hand_written(directory, [(plain, [("2026-01-01", [1, 2])]), (upgraded, [("2026-01-02", [3, 4])])])


def cleaned(directory):
    from deltalake import DeltaTable

    plain = {"minReaderVersion": 1, "minWriterVersion": 2}
    hand_written(directory, [(plain if v == 0 else None, [("2026-01-01", [v])]) for v in range(5)])
    root = os.path.join(directory, "lake", "t")
    DeltaTable(root).create_checkpoint()
    for version in range(3):
        os.remove(os.path.join(root, "_delta_log", f"{version:020d}.json"))


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
        int96(sys.argv[2], vectors=sys.argv[3:] == ["vectors"])
    elif command == "plain":
        plain(sys.argv[2])
    elif command == "vacuum_check":
        vacuum_check(sys.argv[2])
    elif command == "unknown_feature":
        # A reader feature no Delta reader of today knows.
        vacuum_check(sys.argv[2], "fancyNewFeature")
    elif command == "cleaned":
        cleaned(sys.argv[2])
    elif command == "timestamps":
        timestamps(sys.argv[2])
    else:
        raise SystemExit(f"unknown command {command}")
    # python `deltalake` can abort at interpreter exit while its threads wind down.
    sys.stdout.flush()
    os._exit(0)
