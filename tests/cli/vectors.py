"""A table with deletion vectors, as python `deltalake` writes one, and two independent readers of
it that apply deletion vectors (python `deltalake`'s own engine and polars).

    python3 vectors.py make URI [OPTION,...]  # the table (see `make`); `feed`: with the change
                                              # data feed on too; `flat`: not partitioned;
                                              # `flatbig`: the same, 20,000 rows a write;
                                              # `daily`: by country, a file a day (or two)
    python3 vectors.py rows URI [VERSION]     # its rows by python deltalake's engine, sorted
    python3 vectors.py polars URI             # its rows by polars, sorted
    python3 vectors.py spans URI              # each live file's first and last event_date
    python3 vectors.py sums URI CHILD         # CHILD: the sums of URI by day and country
    python3 vectors.py sumsof URI             # those sums, by DuckDB over URI's rows now
    python3 vectors.py sumsrows CHILD         # CHILD's rows
    python3 vectors.py expected URI VERSION [COUNTRY]
                                              # the rows at VERSION with the tests' fix applied
                                              # (to COUNTRY's rows only: `--where country = ...`)
    python3 vectors.py second URI VERSION     # the rows at VERSION with the second fix applied
    python3 vectors.py feed URI VERSION       # the change feed of VERSION as python `deltalake`'s
                                              # `load_cdf` reads it: sorted rows, change type last
    python3 vectors.py feedof URI VERSION     # the same rows from an independent diff by key
                                              # (DuckDB over the rows of VERSION - 1 and VERSION)

Rows are [event_id, amount_cents, country, event_date]. S3 options come from the environment
(delta_tables.py's `storage_options`).
"""

import datetime
import json
import os
import sys

import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder, write_deltalake

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from delta_tables import storage_options  # noqa: E402  (the S3 options of every helper)

DAYS = [datetime.date(2026, 1, 1) + datetime.timedelta(days=d) for d in range(4)]
PER_WRITE = 1000


def make(uri, feed=False, partitioned=True, per_write=PER_WRITE, daily=False):
    """4 days, each in two files (two writes) of 1,000 rows; event 100005 is loaded twice (in
    both files of 2026-01-01). Deletion vectors on (and with `feed`, the change data feed).
    Not `partitioned`: the same rows in two files, `event_date` a column like the others.
    `daily`: partitioned by `country` instead, each write's days appended one by one (a file
    holds one day of one country), but for its rows of 2026-01-02 and -03, appended at once:
    those files hold both days."""
    configuration = {"delta.enableDeletionVectors": "true"}
    if feed:
        configuration["delta.enableChangeDataFeed"] = "true"
    for write in range(2):
        ids, amounts, countries, dates = [], [], [], []
        for d, day in enumerate(DAYS):
            for i in range(per_write):
                event = 100000 * (d + 1) + write * per_write + i
                if write == 1 and d == 0 and i == 0:
                    event = 100005  # the same row as write 0's event 100005
                ids.append(event)
                amounts.append(1000 + event % 1000)
                countries.append(["DE", "FR", "US"][event % 3])
                dates.append(day)
        table = pa.table(
            {
                "event_id": pa.array(ids, pa.int64()),
                "amount_cents": pa.array(amounts, pa.int64()),
                "country": pa.array(countries, pa.string()),
                "event_date": pa.array(dates, pa.date32()),
            }
        )
        if daily:
            days = [[DAYS[0]], [DAYS[1]], [DAYS[2]], [DAYS[3]]]
            if write == 1:
                days = [[DAYS[0]], [DAYS[1], DAYS[2]], [DAYS[3]]]
            parts = [
                table.filter(pa.array([d in these for d in dates])) for these in days
            ]
        else:
            parts = [table]
        for part in parts:
            write_deltalake(
                uri,
                part,
                mode="append",
                partition_by=["country"] if daily else ["event_date"] if partitioned else None,
                configuration=configuration,
                storage_options=storage_options(),
            )


def spans(uri):
    """Each live file's path (as the log names it) and the first and last `event_date` it holds,
    read by pyarrow from the file itself (its deleted rows too)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    table = DeltaTable(uri, storage_options=storage_options())
    out = {}
    for add in pa.table(table.get_add_actions(flatten=True)).to_pylist():
        days = pq.read_table(os.path.join(uri, add["path"]), columns=["event_date"])["event_date"]
        out[add["path"]] = [pc.min(days).as_py().isoformat(), pc.max(days).as_py().isoformat()]
    return out


SUMS = """SELECT CAST(event_date AS DATE) AS event_date, country,
       CAST(SUM(amount_cents) AS BIGINT) AS cents, CAST(COUNT(*) AS BIGINT) AS n
FROM t GROUP BY ALL ORDER BY ALL"""


def sums_of(uri):
    """The sums of the table's rows by day and country (what the tests' child model computes),
    by DuckDB over python `deltalake`'s read of it: [day, country, cents, rows], sorted."""
    import duckdb

    columns = ["event_id", "amount_cents", "country", "event_date"]
    t = pa.table({c: v for c, v in zip(columns, zip(*read(uri)))})  # noqa: B905, F841
    return [[r[0].isoformat(), r[1], r[2], r[3]] for r in duckdb.sql(SUMS).fetchall()]


def make_sums(uri, child):
    """The child table of the sums of `uri`'s rows, partitioned by `event_date`, with deletion
    vectors on."""
    rows = sums_of(uri)
    table = pa.table(
        {
            "event_date": pa.array([datetime.date.fromisoformat(r[0]) for r in rows], pa.date32()),
            "country": pa.array([r[1] for r in rows], pa.string()),
            "cents": pa.array([r[2] for r in rows], pa.int64()),
            "n": pa.array([r[3] for r in rows], pa.int64()),
        }
    )
    write_deltalake(
        child,
        table,
        partition_by=["event_date"],
        configuration={"delta.enableDeletionVectors": "true"},
        storage_options=storage_options(),
    )


def sums_rows(uri):
    """The child table's rows by python `deltalake`: [day, country, cents, rows], sorted."""
    table = DeltaTable(uri, storage_options=storage_options())
    rows = pa.table(QueryBuilder().register("s", table).execute("SELECT * FROM s").read_all())
    return sorted(
        [[r["event_date"].isoformat(), r["country"], r["cents"], r["n"]] for r in rows.to_pylist()]
    )


def as_rows(rows):
    out = [[r["event_id"], r["amount_cents"], r["country"], r["event_date"].isoformat()] for r in rows]
    out.sort()
    return out


def read(uri, version=None):
    table = DeltaTable(uri, version=version, storage_options=storage_options())
    batches = QueryBuilder().register("t", table).execute("SELECT * FROM t").read_all()
    return as_rows(pa.table(batches).to_pylist())


def polars_rows(uri):
    import polars as pl

    return as_rows(pl.read_delta(uri, storage_options=storage_options()).to_dicts())


def expected(uri, version, only=None):
    """The fix of the tests' model, on 2026-01-01 ..= 2026-01-03: rows whose event_id ends in 3
    (mod 1,000) go, every 100th row (and every row of 2026-01-03) gets a cent more, a copy of each
    row ending in 11 (mod 1,000) is added as event + 5,000,000, and rows loaded twice are kept
    once (SELECT DISTINCT). With `only`, the fix of the rows of that country: the others stay
    as they are (`--where country = 'DE'`)."""
    out = []
    in_range = set()
    for event, amount, country, day in read(uri, version):
        if day > "2026-01-03" or (only is not None and country != only):
            out.append([event, amount, country, day])
            continue
        if event % 1000 == 3:
            continue
        if event % 100 == 7 or day == "2026-01-03":
            amount += 1
        in_range.add((event, amount, country, day))
    for event, amount, country, day in read(uri, version):
        if day <= "2026-01-03" and event % 1000 == 11 and only in (None, country):
            in_range.add((event + 5000000, amount, country, day))
    out.extend([list(r) for r in in_range])
    out.sort()
    return out


def second(uri, version):
    """The tests' second fix, on 2026-01-01 ..= 2026-01-03: every row whose event_id ends in 08
    (mod 100) gets a cent more."""
    out = []
    for event, amount, country, day in read(uri, version):
        if day <= "2026-01-03" and event % 100 == 8:
            amount += 1
        out.append([event, amount, country, day])
    out.sort()
    return out


def feed(uri, version):
    table = DeltaTable(uri, storage_options=storage_options())
    changes = pa.table(table.load_cdf(starting_version=version, ending_version=version).read_all())
    rows = [
        [r["event_id"], r["amount_cents"], r["country"], r["event_date"].isoformat(), r["_change_type"]]
        for r in changes.to_pylist()
    ]
    return sorted(rows)


def feed_of(uri, version):
    """The exact feed of `version` by key (`event_id`): a key whose rows differ between the
    versions gives its old rows as `update_preimage` and its new ones as `update_postimage`; a
    key of one version only, `delete` or `insert`."""
    import duckdb

    columns = ["event_id", "amount_cents", "country", "event_date"]
    old = pa.table({c: v for c, v in zip(columns, zip(*read(uri, version - 1)))})  # noqa: B905
    new = pa.table({c: v for c, v in zip(columns, zip(*read(uri, version)))})  # noqa: B905
    got = duckdb.sql(
        """
        WITH o AS (SELECT event_id, list_sort(list(amount_cents || '/' || country || '/' || event_date)) AS r
                   FROM old GROUP BY event_id),
             n AS (SELECT event_id, list_sort(list(amount_cents || '/' || country || '/' || event_date)) AS r
                   FROM new GROUP BY event_id),
             changed AS (
                SELECT COALESCE(o.event_id, n.event_id) AS event_id,
                       CASE WHEN o.event_id IS NULL THEN 'insert'
                            WHEN n.event_id IS NULL THEN 'delete' ELSE 'update' END AS kind
                FROM o FULL OUTER JOIN n ON o.event_id = n.event_id
                WHERE o.event_id IS NULL OR n.event_id IS NULL OR o.r <> n.r)
        SELECT old.*, CASE kind WHEN 'delete' THEN 'delete' ELSE 'update_preimage' END
        FROM old JOIN changed USING (event_id) WHERE kind <> 'insert'
        UNION ALL
        SELECT new.*, CASE kind WHEN 'insert' THEN 'insert' ELSE 'update_postimage' END
        FROM new JOIN changed USING (event_id) WHERE kind <> 'delete'
        """
    ).fetchall()
    return sorted([list(r) for r in got])


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "make":
        options = sys.argv[3].split(",") if len(sys.argv) > 3 else []
        make(
            sys.argv[2],
            feed="feed" in options,
            partitioned="flat" not in options and "flatbig" not in options,
            per_write=20 * PER_WRITE if "flatbig" in options else PER_WRITE,
            daily="daily" in options,
        )
    elif command == "rows":
        print(json.dumps(read(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else None)))
    elif command == "sums":
        make_sums(sys.argv[2], sys.argv[3])
    elif command == "sumsof":
        print(json.dumps(sums_of(sys.argv[2])))
    elif command == "sumsrows":
        print(json.dumps(sums_rows(sys.argv[2])))
    elif command == "spans":
        print(json.dumps(spans(sys.argv[2])))
    elif command == "polars":
        print(json.dumps(polars_rows(sys.argv[2])))
    elif command == "expected":
        only = sys.argv[4] if len(sys.argv) > 4 else None
        print(json.dumps(expected(sys.argv[2], int(sys.argv[3]), only)))
    elif command == "second":
        print(json.dumps(second(sys.argv[2], int(sys.argv[3]))))
    elif command == "feed":
        print(json.dumps(feed(sys.argv[2], int(sys.argv[3]))))
    elif command == "feedof":
        print(json.dumps(feed_of(sys.argv[2], int(sys.argv[3]))))
    else:
        sys.exit(f"unknown command {command}")
    sys.stdout.flush()
    os._exit(0)
