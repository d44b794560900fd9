#!/usr/bin/env python3
"""The comparator of lakefill's benchmark: the same timezone fix done the way a data engineer
would script it with DuckDB, reading the same raw_events Parquet files and writing the fixed
events as Parquet partitioned by day (COPY ... PARTITION_BY). No Delta log, no validation.

    bench_duckdb.py LAKE_DIR OUT_DIR FROM TO

Prints one JSON line: wall seconds, rows written, bytes written, peak RSS of this process.
DuckDB is a comparator installed from PyPI by the benchmark, not a dependency of lakefill.
"""

import datetime
import json
import os
import resource
import sys
import time


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
    wall = time.monotonic() - started
    written = sum(
        os.path.getsize(os.path.join(root, name))
        for root, _, names in os.walk(out)
        for name in names
    )
    print(
        json.dumps(
            {
                "result": {"wall_s": wall, "rows": rows, "bytes_written": written},
                # ru_maxrss is in KiB on Linux.
                "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            }
        )
    )


if __name__ == "__main__":
    main()
