"""Tables with nested columns of every kind, made by python `deltalake`, for #32.

    python3 nested.py make DIR LAYOUT   # project DIR with table `nested`; LAYOUT is
                                        # `partitioned` (by `day`) or `by_rows` (unpartitioned,
                                        # the range selects rows by `day`)
    python3 nested.py rows DIR          # its rows as JSON, sorted by id (bytes as hex)

Columns: a struct of a string, a list of strings and a binary; a list of strings with a NULL;
a map of strings; a list of structs; a binary; a double. Models: `v1` doubles `amount` and
passes every other column through; `v2` passes every column through unchanged.
"""

import datetime
import json
import os
import sys

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

DAYS = [datetime.date(2026, 1, 1) + datetime.timedelta(days=d) for d in range(4)]

SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("day", pa.date32()),
        ("s", pa.struct([("name", pa.string()), ("tags", pa.list_(pa.string())), ("raw", pa.binary())])),
        ("l", pa.list_(pa.string())),
        ("m", pa.map_(pa.string(), pa.string())),
        ("ls", pa.list_(pa.struct([("x", pa.string()), ("y", pa.int64())]))),
        ("b", pa.binary()),
        ("amount", pa.float64()),
    ]
)


def rows():
    out = []
    for d, day in enumerate(DAYS):
        for i in range(5):
            k = 10 * d + i
            out.append(
                {
                    "id": k,
                    "day": day,
                    "s": None if i == 4 else {"name": f"n{k}", "tags": [f"t{k}", "ü"], "raw": bytes([k % 256, 0])},
                    "l": [f"a{k}", None, "b"] if i != 3 else [],
                    "m": [("k1", f"v{k}"), ("k2", None)],
                    "ls": [{"x": f"x{k}", "y": k}, {"x": None, "y": None}],
                    "b": bytes([1, 2, k % 256]),
                    "amount": k * 1.5,
                }
            )
    return out


def make(directory, layout):
    partition_by = ["day"] if layout == "partitioned" else None
    write_deltalake(
        os.path.join(directory, "lake", "nested"),
        pa.Table.from_pylist(rows(), schema=SCHEMA),
        partition_by=partition_by,
    )
    with open(os.path.join(directory, "lakefill.toml"), "w") as f:
        f.write('[tables.nested]\nuri = "lake/nested"\n')
    os.makedirs(os.path.join(directory, "sql", "nested"))
    scope = 'partition_by = "day"' if layout == "partitioned" else 'partition_by = []\nrange_column = "day"'
    for version, amount in [("v1", "amount * 2"), ("v2", "amount")]:
        with open(os.path.join(directory, "sql", "nested", f"{version}.sql"), "w") as f:
            f.write(
                f"""/*
target = "nested"
{scope}

[sources.nested]
window = "day"

[validate]
key = ["id"]
*/
SELECT id, day, s, l, m, ls, b, {amount} AS amount FROM nested WHERE day BETWEEN $start AND $end
"""
            )


def plain(value):
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, (datetime.date, datetime.datetime)):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def table_rows(directory):
    data = DeltaTable(os.path.join(directory, "lake", "nested")).to_pyarrow_table().to_pylist()
    print(json.dumps(sorted((plain(r) for r in data), key=lambda r: r["id"])))


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "make":
        make(sys.argv[2], sys.argv[3])
    elif command == "rows":
        table_rows(sys.argv[2])
    else:
        raise SystemExit(f"unknown command {command}")
    # python `deltalake` can abort at interpreter exit while its threads wind down.
    sys.stdout.flush()
    os._exit(0)
