"""Lakes with a timezone slip in five countries, for `--where` (#36), and what fixing one must do.

    python3 scope.py make DIR LAYOUT      # the project; LAYOUT: `date` or `date_country`
    python3 scope.py expect DIR COUNTRY   # the rows of `events` once COUNTRY alone is fixed
    python3 scope.py below DIR ID         # the rows of `events` once the events below ID are
    python3 scope.py rows DIR [VERSION]   # the rows of `events` now (or at VERSION), by DuckDB
    python3 scope.py files DIR            # the live files of `events`, as the log names them
    python3 scope.py crossing DIR         # writes `sql/events/v2.sql`, whose fix also moves
                                          # keys across `country = 'DE'`; prints how many each way
    python3 scope.py downstream DIR       # adds `daily` (per date and country) and `totals` (per
                                          # date) computed from `events`, with their models
    python3 scope.py dexpect DIR COUNTRY  # `daily` and `totals` once COUNTRY alone is fixed
    python3 scope.py drows DIR            # `daily` and `totals` now, by DuckDB
    python3 scope.py timeless DIR LAYOUT  # a project whose `accounts` has no time column;
                                          # LAYOUT: `int` (partitioned by `part INT`) or `flat`
    python3 scope.py texpect DIR WHICH    # the rows of `accounts` once WHICH is fixed: `parts12`
                                          # (part IN (1, 2)), `DE` (country = 'DE') or `all`
    python3 scope.py trows DIR [VERSION]  # the rows of `accounts` now (or at VERSION), by DuckDB
    python3 scope.py tfiles DIR           # the live files of `accounts`
    python3 scope.py others DIR TABLE C   # every row of TABLE whose country is not C (text)

`raw` holds every event with its true time `ts`, partitioned by its UTC date (`ingest_date`).
`events` was written by a buggy pipeline with python `deltalake`: `event_date` is the date of
`ts - 8 hours`, so every event before 08:00 UTC sits in the previous day. `LAYOUT` partitions
`events` by `event_date`, or by `event_date` and `country`. The fix, `sql/events/v1.sql`, dates
each event by `ts` in UTC. Expectations are computed here from the rows alone; rows are read back
by DuckDB over the Parquet files the log lists (python `deltalake` gives the list), never by
lakefill.
"""

import datetime
import json
import os
import sys

import duckdb
import pyarrow as pa
import pyarrow.compute  # noqa: F401 (pa.compute)
from deltalake import DeltaTable, write_deltalake

DAYS = 8
PER_DAY = 15
COUNTRIES = ["BR", "DE", "FR", "JP", "US"]
START = datetime.date(2024, 3, 1)
SHIFT = datetime.timedelta(hours=8)

MODEL = """/*
target = "events"
partition_by = {partition_by}
reason = "fix timezone: event_date is the UTC date of ts"

[sources.raw]
window = "ingest_date"
lookback = 1
lookahead = 1

[validate]
key = ["event_id"]
measures = ["amount"]
*/
SELECT event_id, country, amount, ts, CAST(ts AS DATE) AS event_date
FROM raw
WHERE CAST(ts AS DATE) BETWEEN $start AND $end
"""


def events():
    """(id, country, amount, ts) of every event: spread over each day's 24 hours."""
    out = []
    for d in range(DAYS):
        day = START + datetime.timedelta(days=d)
        for country_index, country in enumerate(COUNTRIES):
            for i in range(PER_DAY):
                seconds = (i * 86400) // PER_DAY + 61 * country_index + 17
                ts = datetime.datetime.combine(day, datetime.time()) + datetime.timedelta(seconds=seconds)
                event_id = 100000 * d + 1000 * country_index + i
                out.append((event_id, country, 100 + (event_id % 997), ts))
    return out


def buggy_date(ts):
    return (ts - SHIFT).date()


def table(rows, dated):
    return pa.table(
        {
            "event_id": pa.array([r[0] for r in rows], pa.int64()),
            "country": pa.array([r[1] for r in rows], pa.string()),
            "amount": pa.array([r[2] for r in rows], pa.int64()),
            "ts": pa.array([r[3] for r in rows], pa.timestamp("us", tz="UTC")),
            dated[0]: pa.array([dated[1](r[3]) for r in rows], pa.date32()),
        }
    )


def make(directory, layout):
    rows = events()
    lake = os.path.join(directory, "lake")
    write_deltalake(
        os.path.join(lake, "raw"),
        table(rows, ("ingest_date", lambda ts: ts.date())),
        partition_by=["ingest_date"],
    )
    partition_by = ["event_date"] if layout == "date" else ["event_date", "country"]
    write_deltalake(
        os.path.join(lake, "events"),
        table(rows, ("event_date", buggy_date)),
        partition_by=partition_by,
    )
    with open(os.path.join(directory, "lakefill.toml"), "w") as f:
        f.write('[tables.raw]\nuri = "lake/raw"\n\n[tables.events]\nuri = "lake/events"\n')
    os.makedirs(os.path.join(directory, "sql", "events"))
    with open(os.path.join(directory, "sql", "events", "v1.sql"), "w") as f:
        f.write(MODEL.format(partition_by=json.dumps(partition_by)))
    first = buggy_date(datetime.datetime.combine(START, datetime.time()))
    last = START + datetime.timedelta(days=DAYS - 1)
    print(json.dumps({"from": first.isoformat(), "to": last.isoformat()}))


def expect(fixed):
    """Every row once the events `fixed(id, country)` selects are fixed: their rows dated by
    `ts`, the others as written."""
    out = []
    for event_id, c, amount, ts in events():
        date = ts.date() if fixed(event_id, c) else buggy_date(ts)
        out.append([event_id, c, amount, date.isoformat()])
    return sorted(out)


CROSSING = (
    "CASE WHEN country = 'DE' AND event_id % 7 = 0 THEN 'AT' "
    "WHEN country = 'FR' AND event_id % 11 = 0 THEN 'DE' ELSE country END AS country"
)


def crossing(directory):
    """v2: the fix, plus DE events whose id is a multiple of 7 become AT (out of `country =
    'DE'`) and FR events whose id is a multiple of 11 become DE (into it)."""
    with open(os.path.join(directory, "sql", "events", "v1.sql")) as f:
        model = f.read()
    with open(os.path.join(directory, "sql", "events", "v2.sql"), "w") as f:
        f.write(model.replace("SELECT event_id, country,", f"SELECT event_id, {CROSSING},"))
    every = events()
    moved_out = sorted(e[0] for e in every if e[1] == "DE" and e[0] % 7 == 0)
    moved_in = sorted(e[0] for e in every if e[1] == "FR" and e[0] % 11 == 0)
    print(json.dumps({"out": moved_out, "in": moved_in}))


DOWNSTREAM_MODEL = """/*
target = "{table}"
partition_by = "event_date"

[sources.events]
window = "event_date"

[validate]
key = {key}
measures = ["amount"]
*/
SELECT {columns}, COUNT(*) AS events, SUM(amount) AS amount
FROM events
WHERE event_date BETWEEN $start AND $end
GROUP BY {columns}
"""

DOWNSTREAM = {"daily": ["event_date", "country"], "totals": ["event_date"]}


def aggregate(rows, columns):
    """`rows` ([id, country, amount, date]) summed per `columns`, as DuckDB computes it."""
    relation = duckdb.sql(
        "SELECT * FROM (VALUES "
        + ", ".join(f"({r[0]}, '{r[1]}', {r[2]}, DATE '{r[3]}')" for r in rows)
        + ") t(event_id, country, amount, event_date)"
    )
    listed = ", ".join(columns)
    return relation.query(
        "t", f"SELECT {listed}, COUNT(*) AS events, CAST(SUM(amount) AS BIGINT) AS amount FROM t GROUP BY {listed}"
    ).arrow().read_all()


# A row of `daily` and of `totals` on the last day the fix writes to, so that the tables span
# the whole range (a cascade recomputes only partitions a table has). `daily`'s is of another
# country and kept; `totals`' is recomputed.
PLACEHOLDER = datetime.date(2024, 3, 8)


def downstream(directory):
    buggy = expect(lambda _, c: False)
    for table, columns in DOWNSTREAM.items():
        data = aggregate(buggy, columns)
        extra = {"event_date": [PLACEHOLDER], "events": [1], "amount": [1]}
        if "country" in columns:
            extra["country"] = ["ZZ"]
        data = pa.concat_tables([data, pa.table(extra).select(data.column_names).cast(data.schema)])
        write_deltalake(os.path.join(directory, "lake", table), data, partition_by=["event_date"])
        with open(os.path.join(directory, "lakefill.toml"), "a") as f:
            f.write(f'\n[tables.{table}]\nuri = "lake/{table}"\n')
        os.makedirs(os.path.join(directory, "sql", table))
        with open(os.path.join(directory, "sql", table, "v1.sql"), "w") as f:
            f.write(DOWNSTREAM_MODEL.format(table=table, key=json.dumps(columns), columns=", ".join(columns)))


def downstream_expect(country):
    fixed = expect(lambda _, c: c == country)
    out = {}
    for table, columns in DOWNSTREAM.items():
        rows = aggregate(fixed, columns).to_pylist()
        if "country" in columns:
            rows.append({"event_date": PLACEHOLDER, "country": "ZZ", "events": 1, "amount": 1})
        out[table] = sorted([str(r["event_date"]), r.get("country"), r["events"], r["amount"]] for r in rows)
    return out


def downstream_rows(directory):
    out = {}
    for table, columns in DOWNSTREAM.items():
        files = DeltaTable(os.path.join(directory, "lake", table)).file_uris()
        country = "country" if "country" in columns else "NULL"
        got = duckdb.sql(
            f"""SELECT CAST(event_date AS VARCHAR), {country}, events, amount
                FROM read_parquet({json.dumps(files)}, hive_partitioning = true,
                                  hive_types = {{'event_date': 'DATE'}})"""
        ).fetchall()
        out[table] = sorted([list(r) for r in got])
    return out


TIMELESS_MODEL = """/*
target = "accounts"
{partition_by}reason = "amounts were written doubled"

[sources.balances]

[validate]
key = ["id"]
measures = ["amount"]
*/
SELECT id, part, country, amount FROM balances
"""

PARTS = 4


def balances():
    """(id, part, country, amount) of every account: each part holds every country."""
    out = []
    for part in range(PARTS):
        for country_index, country in enumerate(COUNTRIES):
            for i in range(10):
                account = 1000 * part + 100 * country_index + i
                out.append((account, part, country, 10 + account % 89))
    return out


def balance_table(rows, factor):
    return pa.table(
        {
            "id": pa.array([r[0] for r in rows], pa.int64()),
            "part": pa.array([r[1] for r in rows], pa.int32()),
            "country": pa.array([r[2] for r in rows], pa.string()),
            "amount": pa.array([r[3] * factor for r in rows], pa.int64()),
        }
    )


def timeless(directory, layout):
    """`balances` holds the true amounts; `accounts`, written doubled, has no time column:
    partitioned by `part INT` (one file per part), or unpartitioned in two files (BR and DE
    first, then FR, JP and US, so that statistics on `country` tell them apart)."""
    rows = balances()
    lake = os.path.join(directory, "lake")
    write_deltalake(os.path.join(lake, "balances"), balance_table(rows, 1))
    accounts = os.path.join(lake, "accounts")
    if layout == "int":
        write_deltalake(accounts, balance_table(rows, 2), partition_by=["part"])
        partition_by = 'partition_by = ["part"]\n'
    else:
        first = sorted((r for r in rows if r[2] in ("BR", "DE")), key=lambda r: r[2])
        rest = sorted((r for r in rows if r[2] not in ("BR", "DE")), key=lambda r: r[2])
        write_deltalake(accounts, balance_table(first, 2))
        write_deltalake(accounts, balance_table(rest, 2), mode="append")
        partition_by = ""
    with open(os.path.join(directory, "lakefill.toml"), "w") as f:
        f.write('[tables.balances]\nuri = "lake/balances"\n\n[tables.accounts]\nuri = "lake/accounts"\n')
    os.makedirs(os.path.join(directory, "sql", "accounts"))
    with open(os.path.join(directory, "sql", "accounts", "v1.sql"), "w") as f:
        f.write(TIMELESS_MODEL.format(partition_by=partition_by))
    print(json.dumps({"rows": len(rows)}))


def timeless_expect(which):
    fixed = {
        "parts12": lambda r: r[1] in (1, 2),
        "DE": lambda r: r[2] == "DE",
        "all": lambda r: True,
    }[which]
    return sorted([r[0], r[1], r[2], r[3] * (1 if fixed(r) else 2)] for r in balances())


def timeless_rows(directory, version=None):
    dt = DeltaTable(os.path.join(directory, "lake", "accounts"), version=version)
    files = dt.file_uris()
    hive = (
        ", hive_partitioning = true, hive_types = {'part': 'INTEGER'}"
        if dt.metadata().partition_columns
        else ""
    )
    got = duckdb.sql(
        f"""SELECT id, CAST(part AS INTEGER), country, amount
            FROM read_parquet({json.dumps(files)}{hive})"""
    ).fetchall()
    return sorted([list(r) for r in got])


def live_files(directory, version=None):
    dt = DeltaTable(os.path.join(directory, "lake", "events"), version=version)
    return dt, dt.file_uris()


def rows(directory, version=None):
    dt, files = live_files(directory, version)
    if not files:
        return []
    partition_columns = dt.metadata().partition_columns
    got = duckdb.sql(
        f"""SELECT event_id, country, amount, CAST(event_date AS VARCHAR)
            FROM read_parquet({json.dumps(files)}, hive_partitioning = true,
                              hive_types = {{'event_date': 'DATE'}})"""
        if partition_columns
        else f"""SELECT event_id, country, amount, CAST(event_date AS VARCHAR)
                 FROM read_parquet({json.dumps(files)})"""
    ).fetchall()
    return sorted([list(r) for r in got])


def others(directory, table, country):
    """Every row of `table` whose country is not `country`, every column as text, sorted."""
    rows = DeltaTable(os.path.join(directory, "lake", table)).to_pyarrow_table()
    kept = rows.filter(pa.compute.not_equal(rows["country"], country)).to_pylist()
    return sorted([[str(v) for v in row.values()] for row in kept])


def main():
    command, directory = sys.argv[1], sys.argv[2]
    if command == "make":
        make(directory, sys.argv[3])
    elif command == "crossing":
        crossing(directory)
    elif command == "expect":
        print(json.dumps(expect(lambda _, c: c == sys.argv[3])))
    elif command == "below":
        print(json.dumps(expect(lambda event_id, _: event_id < int(sys.argv[3]))))
    elif command == "rows":
        version = int(sys.argv[3]) if len(sys.argv) > 3 else None
        print(json.dumps(rows(directory, version)))
    elif command == "downstream":
        downstream(directory)
    elif command == "dexpect":
        print(json.dumps(downstream_expect(sys.argv[3])))
    elif command == "drows":
        print(json.dumps(downstream_rows(directory)))
    elif command == "timeless":
        timeless(directory, sys.argv[3])
    elif command == "texpect":
        print(json.dumps(timeless_expect(sys.argv[3])))
    elif command == "trows":
        version = int(sys.argv[3]) if len(sys.argv) > 3 else None
        print(json.dumps(timeless_rows(directory, version)))
    elif command == "tfiles":
        actions = pa.table(DeltaTable(os.path.join(directory, "lake", "accounts")).get_add_actions(flatten=True))
        print(json.dumps(sorted(actions["path"].to_pylist())))
    elif command == "others":
        print(json.dumps(others(directory, sys.argv[3], sys.argv[4])))
    elif command == "files":
        actions = pa.table(DeltaTable(os.path.join(directory, "lake", "events")).get_add_actions(flatten=True))
        print(json.dumps(sorted(actions["path"].to_pylist())))
    else:
        raise SystemExit(f"unknown command {command}")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
