#!/usr/bin/env python3
"""The comparator of lakefill's benchmark: the same timezone fix done the way a data engineer
would script it with DuckDB, reading the same raw_events Parquet files and writing the fixed
events as Parquet partitioned by day (COPY ... PARTITION_BY). No Delta log.

    bench_duckdb.py LAKE_DIR OUT_DIR FROM TO [--validate]

With `--validate`, DuckDB then does the validation lakefill does, in the same process: per
partition row counts and measure sums of the old rows (the `events` table's live files, listed
by python `deltalake`) and the new, key uniqueness and NOT NULL keys of the new rows, and a full
outer join by key comparing a hash of every column, counting added, removed and changed keys
with five samples of each.

Prints one JSON line: wall seconds, rows written, bytes written, peak RSS of this process.
DuckDB is a comparator installed from PyPI by the benchmark, not a dependency of lakefill.
"""

import datetime
import json
import os
import resource
import sys
import time


def validate(con, lake, out, first, last):
    """lakefill's validation of the fix, done by DuckDB (see the module's docs)."""
    from deltalake import DeltaTable

    old_files = [
        f
        for f in DeltaTable(os.path.join(lake, "events")).file_uris()
        if first <= f.split("event_date=")[1][:10] <= last
    ]
    new_files = os.path.join(out, "*", "*.parquet")
    con.execute(
        f"""CREATE VIEW old AS SELECT * FROM read_parquet({json.dumps(old_files)},
            hive_partitioning = true, hive_types = {{'event_date': 'DATE'}})"""
    )
    con.execute(
        f"""CREATE VIEW new AS SELECT * FROM read_parquet('{new_files}',
            hive_partitioning = true, hive_types = {{'event_date': 'DATE'}})"""
    )
    totals = {}
    for side in ("old", "new"):
        for date, rows, cents in con.execute(
            f"SELECT event_date, COUNT(*), SUM(amount_cents) FROM {side} GROUP BY event_date"
        ).fetchall():
            totals.setdefault(date, {})[side] = (rows, cents)
    duplicates, null_keys = con.execute(
        "SELECT COUNT(*) - COUNT(DISTINCT event_id), COUNT(*) - COUNT(event_id) FROM new"
    ).fetchone()
    columns = ["user_id", "country", "amount_cents", "event_ts", "event_date"]
    row_hash = lambda side: "hash(" + ", ".join(f"{side}.{c}" for c in columns) + ")"
    con.execute(
        f"""CREATE TEMP TABLE differences AS
            SELECT COALESCE(o.event_id, n.event_id) AS event_id,
                   CASE WHEN o.event_id IS NULL THEN 'added'
                        WHEN n.event_id IS NULL THEN 'removed' ELSE 'changed' END AS kind
            FROM old o FULL OUTER JOIN new n ON o.event_id = n.event_id
            WHERE o.event_id IS NULL OR n.event_id IS NULL OR {row_hash('o')} <> {row_hash('n')}"""
    )
    counts = dict(con.execute("SELECT kind, COUNT(*) FROM differences GROUP BY kind").fetchall())
    sampled = [
        key
        for (key,) in con.execute(
            """SELECT event_id FROM (
                   SELECT event_id, ROW_NUMBER() OVER (PARTITION BY kind) AS n FROM differences)
               WHERE n <= 5"""
        ).fetchall()
    ]
    # The sampled keys' old and new rows, as lakefill's report shows them.
    keys = ", ".join(str(k) for k in sampled) or "NULL"
    samples = [
        con.execute(f"SELECT * FROM {side} WHERE event_id IN ({keys})").fetchall()
        for side in ("old", "new")
    ]
    return {
        "partitions": len(totals),
        "duplicate_keys": duplicates,
        "null_keys": null_keys,
        "counts": counts,
        "samples": sum(len(s) for s in samples),
    }


def main() -> None:
    lake, out, first, last = sys.argv[1:5]
    started = time.monotonic()
    import duckdb  # timed: loading the engine is part of the script's cost

    day_after = (datetime.date.fromisoformat(last) + datetime.timedelta(days=1)).isoformat()
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    con.execute(f"SET threads = {os.cpu_count() or 1}")
    # raw_events is append-only: every Parquet file under it is live.
    source = os.path.join(lake, "raw_events", "*", "*.parquet")
    rows = con.execute(
        f"""
        COPY (
            SELECT event_id, user_id, country, amount_cents, event_ts,
                   CAST(event_ts AS DATE) AS event_date
            FROM read_parquet('{source}', hive_partitioning = true)
            WHERE ingest_date BETWEEN DATE '{first}' AND DATE '{day_after}'
              AND CAST(event_ts AS DATE) BETWEEN DATE '{first}' AND DATE '{last}'
        ) TO '{out}' (FORMAT parquet, PARTITION_BY (event_date), OVERWRITE_OR_IGNORE true)
        """
    ).fetchone()[0]
    validation = validate(con, lake, out, first, last) if "--validate" in sys.argv[5:] else None
    wall = time.monotonic() - started
    written = sum(
        os.path.getsize(os.path.join(root, name))
        for root, _, names in os.walk(out)
        for name in names
    )
    print(
        json.dumps(
            {
                "result": {
                    "wall_s": wall,
                    "rows": rows,
                    "bytes_written": written,
                    "validation": validation,
                },
                # ru_maxrss is in KiB on Linux.
                "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            }
        )
    )


if __name__ == "__main__":
    main()
