"""An independent check of a cascade published by deletion vectors on the test lake: python
`deltalake`'s own engine reads the tables (it applies deletion vectors), DuckDB recomputes each
level from the one above.

    python3 cascade_vectors.py chain RAW EVENTS DAILY ROLLING LAKE_FIRST LAKE_LAST FIRST LAST
        # each level against its recompute: `events` is raw_events by the v1 date (UTC-8) on the
        # lake's days (LAKE_FIRST ..= LAKE_LAST), with a cent more for every DE event whose id is 2 mod 5 dated FIRST ..= LAST;
        # `daily_revenue` the sums of `events` by day and country; `rolling_7d` the 7-day sums of
        # `daily_revenue`. Prints {level: [rows missing, rows extra, rows]}.
    python3 cascade_vectors.py rows URI [VERSION]
        # every row of the table (at VERSION), as sorted text
"""

import json
import os
import sys

import duckdb
import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder


def read(uri, version=None):
    table = DeltaTable(uri, version=version)
    data = pa.table(QueryBuilder().register("t", table).execute("SELECT * FROM t").read_all())
    # Timestamps as UTC wall time (no session time zone in what DuckDB computes from them).
    columns = [
        c.cast(pa.timestamp("us")) if pa.types.is_timestamp(c.type) else c for c in data.columns
    ]
    return pa.table(columns, names=data.column_names)


def differ(con, got, expected):
    missing = con.sql(f"SELECT COUNT(*) FROM (({expected}) EXCEPT ALL ({got}))").fetchone()[0]
    extra = con.sql(f"SELECT COUNT(*) FROM (({got}) EXCEPT ALL ({expected}))").fetchone()[0]
    rows = con.sql(f"SELECT COUNT(*) FROM ({got})").fetchone()[0]
    return [missing, extra, rows]


def chain(raw, events, daily, rolling, lake_first, lake_last, first, last):
    con = duckdb.connect()
    for name, uri in [("raw", raw), ("ev", events), ("daily", daily), ("rolling", rolling)]:
        con.register(name, read(uri))
    v1_date = "CAST(event_ts - INTERVAL 8 HOUR AS DATE)"
    out = {
        "events": differ(
            con,
            "SELECT event_id, user_id, country, amount_cents, event_ts, event_date FROM ev",
            f"""SELECT event_id, user_id, country,
                  amount_cents + CASE WHEN event_id % 5 = 2 AND country = 'DE'
                      AND {v1_date} BETWEEN DATE '{first}' AND DATE '{last}' THEN 1 ELSE 0 END,
                  event_ts, {v1_date}
                FROM raw WHERE {v1_date} BETWEEN DATE '{lake_first}' AND DATE '{lake_last}'""",
        ),
        "daily_revenue": differ(
            con,
            "SELECT event_date, country, revenue_cents, events FROM daily",
            "SELECT event_date, country, SUM(amount_cents), COUNT(*) FROM ev GROUP BY 1, 2",
        ),
        "rolling_7d": differ(
            con,
            "SELECT event_date, revenue_7d FROM rolling",
            """SELECT d.event_date, SUM(p.revenue_cents)
               FROM (SELECT DISTINCT event_date FROM daily) d
               JOIN daily p ON p.event_date BETWEEN d.event_date - INTERVAL 6 DAY AND d.event_date
               GROUP BY 1""",
        ),
    }
    return out


def rows(uri, version=None):
    return sorted(json.dumps(r, default=str, sort_keys=True) for r in read(uri, version).to_pylist())


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "chain":
        print(json.dumps(chain(*sys.argv[2:10])))
    elif command == "rows":
        print(json.dumps(rows(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else None)))
    else:
        sys.exit(f"unknown command {command}")
    sys.stdout.flush()
    os._exit(0)
