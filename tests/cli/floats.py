"""A table of doubles whose totals a model computes in another order, for #32.

    python3 floats.py make DIR               # project DIR with table `scores` and its models
    python3 floats.py differing DIR FROM TO  # rows of FROM..=TO whose total changes bit for bit
    python3 floats.py rows DIR               # the table's rows as JSON, sorted by id

`scores` (id, day, a, b, c, total = (a + b) + c) is written by python `deltalake`, 4 days x 100
rows. Model `v1` computes `a + (b + c)`: the same number, but for some rows not the same bits;
`v2` is the same SQL with `[validate] decimals = 9`.
"""

import datetime
import json
import os
import sys

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

DAYS = [datetime.date(2026, 1, 1) + datetime.timedelta(days=d) for d in range(4)]


def rows():
    out = []
    for d, day in enumerate(DAYS):
        for i in range(100):
            a, b, c = 0.1 * (i + 1), 0.2 * (d + 1) + 1e-3 * i, 0.3 / (i + 1)
            out.append({"id": 1000 * d + i, "day": day, "a": a, "b": b, "c": c, "total": (a + b) + c})
    return out


def make(directory):
    schema = pa.schema(
        [("id", pa.int64()), ("day", pa.date32()), ("a", pa.float64()), ("b", pa.float64()), ("c", pa.float64()), ("total", pa.float64())]
    )
    write_deltalake(os.path.join(directory, "lake", "scores"), pa.Table.from_pylist(rows(), schema=schema), partition_by=["day"])
    with open(os.path.join(directory, "lakefill.toml"), "w") as f:
        f.write('[tables.scores]\nuri = "lake/scores"\n')
    os.makedirs(os.path.join(directory, "sql", "scores"))
    for version, decimals in [("v1", ""), ("v2", "decimals = 9\n")]:
        with open(os.path.join(directory, "sql", "scores", f"{version}.sql"), "w") as f:
            f.write(
                f"""/*
target = "scores"
partition_by = "day"

[sources.scores]
window = "day"

[validate]
key = ["id"]
{decimals}*/
SELECT id, day, a, b, c, a + (b + c) AS total FROM scores
"""
            )


def differing(start, end):
    start, end = datetime.date.fromisoformat(start), datetime.date.fromisoformat(end)
    inside = [r for r in rows() if start <= r["day"] <= end]
    changed = [r for r in inside if r["a"] + (r["b"] + r["c"]) != r["total"]]
    worst = max(abs(r["a"] + (r["b"] + r["c"]) - r["total"]) / abs(r["total"]) for r in changed)
    print(json.dumps({"changed": len(changed), "worst_relative": worst}))


def table_rows(directory):
    data = DeltaTable(os.path.join(directory, "lake", "scores")).to_pyarrow_table().to_pylist()
    print(json.dumps(sorted(([r["id"], r["day"].isoformat(), r["total"]] for r in data))))


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "make":
        make(sys.argv[2])
    elif command == "differing":
        differing(sys.argv[3], sys.argv[4])
    elif command == "rows":
        table_rows(sys.argv[2])
    else:
        raise SystemExit(f"unknown command {command}")
    # python `deltalake` can abort at interpreter exit while its threads wind down.
    sys.stdout.flush()
    os._exit(0)
