"""Lakes with a shift bug, for the edge checks (#32), and what a fix of part of them must do.

    python3 edges.py make DIR GRAIN SHIFT FROM TO   # the project, and the expectation as JSON
    python3 edges.py rows DIR                       # the rows of `events` now: [[id, label]...]

GRAIN is `day` or `month`. `raw` holds 30 events a period, each with its true time `ts`, and is
partitioned by the period of `ts` (`ingest`). `events` was written by a buggy pipeline with
python `deltalake`: every event in the first third of its period sits SHIFT periods away
(SHIFT < 0: early, > 0: late). The fix, `sql/events/v1.sql`, puts every event in its true period
and reads `raw` |SHIFT| periods around each batch.

The expectation of fixing FROM..=TO is computed here from the rows alone: which keys a fix of
exactly that range would write twice (`duplicated`, by the partition outside the range that
still holds them) or lose (`moved`, by the partition outside the range the fix puts them in),
the smallest range holding it that no key crosses (`clean`), and the table after fixing that
range (`after_clean`).
"""

import datetime
import json
import os
import sys

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

PERIODS = 12
PER_PERIOD = 30
START = datetime.date(2024, 1, 1)


def period(grain, n):
    """The first day of period `n` (0 = START)."""
    if grain == "day":
        return START + datetime.timedelta(days=n)
    months = START.month - 1 + n
    return datetime.date(START.year + months // 12, months % 12 + 1, 1)


def label(grain, day):
    return day.isoformat() if grain == "day" else day.strftime("%Y-%m")


def index(grain, day):
    if grain == "day":
        return (day - START).days
    return (day.year - START.year) * 12 + day.month - START.month


def events(grain, shift):
    """(id, ts, amount, true period index, buggy period index) of every event."""
    out = []
    for n in range(PERIODS):
        first = period(grain, n)
        length = (period(grain, n + 1) - first).days * 86400
        for i in range(PER_PERIOD):
            offset = (i * length) // PER_PERIOD + 37
            ts = datetime.datetime.combine(first, datetime.time()) + datetime.timedelta(seconds=offset)
            event_id = 1000 * n + i
            early = i < PER_PERIOD // 3
            out.append((event_id, ts, 100 + i, n, n + shift if early else n))
    return out


def make(directory, grain, shift, start, end):
    shift = int(shift)
    rows = events(grain, shift)
    lake = os.path.join(directory, "lake")
    column = "event_date" if grain == "day" else "event_month"
    raw = pa.table(
        {
            "event_id": pa.array([r[0] for r in rows], pa.int64()),
            "ts": pa.array([r[1] for r in rows], pa.timestamp("us", tz="UTC")),
            "amount": pa.array([r[2] for r in rows], pa.int64()),
            "ingest": pa.array([period(grain, r[3]) for r in rows], pa.date32()),
        }
    )
    write_deltalake(os.path.join(lake, "raw"), raw, partition_by=["ingest"])
    buggy = pa.table(
        {
            "event_id": pa.array([r[0] for r in rows], pa.int64()),
            "ts": pa.array([r[1] for r in rows], pa.timestamp("us", tz="UTC")),
            "amount": pa.array([r[2] for r in rows], pa.int64()),
            column: pa.array([period(grain, r[4]) for r in rows], pa.date32()),
        }
    )
    write_deltalake(os.path.join(lake, "events"), buggy, partition_by=[column])
    with open(os.path.join(directory, "lakefill.toml"), "w") as f:
        f.write('[tables.raw]\nuri = "lake/raw"\n\n[tables.events]\nuri = "lake/events"\n')
    os.makedirs(os.path.join(directory, "sql", "events"))
    true_period = "CAST(ts AS DATE)" if grain == "day" else "CAST(date_trunc('month', ts) AS DATE)"
    model = f"""/*
target = "events"
partition_by = "{column}"
grain = "{grain}"
reason = "every event in its true {grain}"

[sources.raw]
window = "ingest"
grain = "{grain}"
lookback = {abs(shift)}
lookahead = {abs(shift)}

[validate]
key = ["event_id"]
*/
SELECT event_id, ts, amount, {true_period} AS {column}
FROM raw
WHERE {true_period} BETWEEN $start AND $end
"""
    with open(os.path.join(directory, "sql", "events", "v1.sql"), "w") as f:
        f.write(model)

    lo, hi = index(grain, parse(start)), index(grain, parse(end))
    inside = lambda n: lo <= n <= hi
    duplicated, moved = {}, {}
    for _, _, _, true, old in rows:
        if inside(true) and not inside(old):
            key = label(grain, period(grain, old))
            duplicated[key] = duplicated.get(key, 0) + 1
        if inside(old) and not inside(true):
            key = label(grain, period(grain, true))
            moved[key] = moved.get(key, 0) + 1
    # The closure: widen until every key seen in the range has all its partitions in it.
    clean_lo, clean_hi = lo, hi
    while True:
        touching = [(t, o) for _, _, _, t, o in rows if clean_lo <= t <= clean_hi or clean_lo <= o <= clean_hi]
        new_lo = min([clean_lo] + [min(t, o) for t, o in touching])
        new_hi = max([clean_hi] + [max(t, o) for t, o in touching])
        if (new_lo, new_hi) == (clean_lo, clean_hi):
            break
        clean_lo, clean_hi = new_lo, new_hi
    after = sorted(
        [r[0], label(grain, period(grain, r[3] if clean_lo <= r[3] <= clean_hi else r[4]))]
        for r in rows
        if (clean_lo <= r[3] <= clean_hi) or not (clean_lo <= r[4] <= clean_hi)
    )
    print(
        json.dumps(
            {
                "duplicated": duplicated,
                "moved": moved,
                "clean": [label(grain, period(grain, clean_lo)), label(grain, period(grain, clean_hi))],
                "after_clean": after,
            }
        )
    )


def parse(text):
    return datetime.date.fromisoformat(text if len(text) == 10 else text + "-01")


def table_rows(directory):
    table = DeltaTable(os.path.join(directory, "lake", "events")).to_pyarrow_table()
    column = "event_date" if "event_date" in table.column_names else "event_month"
    grain = "day" if column == "event_date" else "month"
    ids = table.column("event_id").to_pylist()
    days = table.column(column).to_pylist()
    print(json.dumps(sorted([i, label(grain, d)] for i, d in zip(ids, days))))


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "make":
        make(*sys.argv[2:7])
    elif command == "rows":
        table_rows(sys.argv[2])
    else:
        raise SystemExit(f"unknown command {command}")
    # python `deltalake` can abort at interpreter exit while its threads wind down.
    sys.stdout.flush()
    os._exit(0)
