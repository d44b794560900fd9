"""The change data feed of a fix (#37), read back and checked by other readers than lakefill.

    python3 feed.py make DIR LAYOUT KEYED   # `scope.py make`'s lake, `events` with the change
                                            # data feed on; KEYED `key` or `nokey` (the model
                                            # declares `key = ["event_id"]` or no key)
    python3 feed.py bump DIR DAY            # writes `sql/events/v2.sql`: v1, with `amount + 1`
                                            # for the events of UTC date DAY only
    python3 feed.py reshape DIR             # writes `sql/events/v4.sql`: v1 without the events
                                            # whose id is 3 mod 7, with `amount + 1` for those
                                            # whose id is 0 mod 5, and with a copy of those whose
                                            # id is 4 mod 11 under a new id (+ 10,000,000)
    python3 feed.py rebump DIR DAY          # writes `sql/events/v9.sql`: the rows as written
                                            # (the bug left in), 1 more on each amount of DAY
    python3 feed.py wholes DIR              # writes `sql/events/v5.sql`: v4, with every row of
                                            # three days deleted, moved or changed
    python3 feed.py feed DIR VERSION        # the change feed of VERSION as python `deltalake`'s
                                            # `load_cdf` reads it: sorted rows
                                            # [event_id, country, amount, event_date, change]
    python3 feed.py expect DIR VERSION KEYED  # the same rows from an independent diff: DuckDB
                                            # over the rows of VERSION - 1 and VERSION (read by
                                            # python `deltalake`), by key or as whole rows
    python3 feed.py enable DIR TABLE        # turns the feed on for `lake/TABLE`
    python3 feed.py timeless DIR LAYOUT     # `scope.py timeless`, `accounts` with the feed on
    python3 feed.py downstream DIR          # `scope.py downstream`, `daily` and `totals` with the
                                            # feed on
    python3 feed.py gfeed DIR TABLE VERSION # `feed` of any table: every column as text
    python3 feed.py gexpect DIR TABLE VERSION KEY  # `expect` of any table, by the columns KEY
    python3 feed.py actions DIR VERSION     # the commit's actions: {"add": [[path, dataChange,
                                            # event_date]], "remove": [...], "cdc": [[path, ...]]}
    python3 feed.py copies DIR VERSION      # how many cdc files of VERSION copy the column chunks
                                            # of a file it adds or removes: {"cdc", "added",
                                            # "removed"}
"""

import json
import os
import shutil
import sys

import duckdb
import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scope  # noqa: E402

COLUMNS = "event_id, country, amount, CAST(event_date AS VARCHAR) AS event_date"


def events_path(directory):
    return os.path.join(directory, "lake", "events")


def with_feed(path):
    """The table at `path` written again with the feed on (a new table: on from version 0)."""
    rows = DeltaTable(path).to_pyarrow_table()
    partition_by = DeltaTable(path).metadata().partition_columns
    shutil.rmtree(path)
    write_deltalake(
        path,
        rows,
        partition_by=partition_by,
        configuration={"delta.enableChangeDataFeed": "true"},
    )


def make(directory, layout, keyed):
    scope.make(directory, layout)
    with_feed(events_path(directory))
    if keyed == "nokey":
        model = os.path.join(directory, "sql", "events", "v1.sql")
        text = open(model).read().replace('key = ["event_id"]\n', "")
        open(model, "w").write(text)


def bump(directory, day):
    v1 = open(os.path.join(directory, "sql", "events", "v1.sql")).read()
    v2 = v1.replace(
        "SELECT event_id, country, amount,",
        f"SELECT event_id, country, CASE WHEN CAST(ts AS DATE) = DATE '{day}' THEN amount + 1 ELSE amount END AS amount,",
    )
    assert v2 != v1
    open(os.path.join(directory, "sql", "events", "v2.sql"), "w").write(v2)


def reshape(directory):
    v1 = open(os.path.join(directory, "sql", "events", "v1.sql")).read()
    head, select = v1.split("*/", 1)
    assert "WHERE CAST(ts AS DATE) BETWEEN $start AND $end" in select
    window = "CAST(ts AS DATE) BETWEEN $start AND $end"
    body = f"""
SELECT event_id, country, CASE WHEN event_id % 5 = 0 THEN amount + 1 ELSE amount END AS amount,
       ts, CAST(ts AS DATE) AS event_date
FROM raw
WHERE {window} AND event_id % 7 <> 3
UNION ALL
SELECT event_id + 10000000 AS event_id, country, amount, ts, CAST(ts AS DATE) AS event_date
FROM raw
WHERE {window} AND event_id % 11 = 4
"""
    open(os.path.join(directory, "sql", "events", "v4.sql"), "w").write(head + "*/" + body)


def rebump(directory, day):
    """Writes `sql/events/v9.sql`: the rows as `make` wrote them (dated 8 hours early, the bug
    left in), with 1 more on every amount of the day DAY as they are dated: against the table
    python wrote, every row of one day changes and the others come back the same."""
    v1 = open(os.path.join(directory, "sql", "events", "v1.sql")).read()
    head, _ = v1.split("*/", 1)
    date = "CAST(ts - INTERVAL '8 hours' AS DATE)"
    body = f"""
SELECT event_id, country, CASE WHEN {date} = DATE '{day}' THEN amount + 1 ELSE amount END AS amount,
       ts, {date} AS event_date
FROM raw
WHERE {date} BETWEEN $start AND $end
"""
    open(os.path.join(directory, "sql", "events", "v9.sql"), "w").write(head + "*/" + body)


def wholes(directory):
    """Writes `sql/events/v5.sql`: v4, without the events of 2024-03-04, with those of
    2024-03-05 moved to 2024-03-07, and 7 more on every amount of 2024-03-06: against v4, every
    row of three days is one change (deleted, moved away, updated) and 2024-03-07 holds rows of
    two."""
    v1 = open(os.path.join(directory, "sql", "events", "v1.sql")).read()
    head, _ = v1.split("*/", 1)
    window = "CAST(ts AS DATE) BETWEEN $start AND $end AND CAST(ts AS DATE) <> DATE '2024-03-04'"
    bump = "CASE WHEN CAST(ts AS DATE) = DATE '2024-03-06' THEN 7 ELSE 0 END"
    day = "CASE WHEN CAST(ts AS DATE) = DATE '2024-03-05' THEN DATE '2024-03-07' ELSE CAST(ts AS DATE) END"
    body = f"""
SELECT event_id, country, CASE WHEN event_id % 5 = 0 THEN amount + 1 ELSE amount END + {bump} AS amount,
       ts, {day} AS event_date
FROM raw
WHERE {window} AND event_id % 7 <> 3
UNION ALL
SELECT event_id + 10000000 AS event_id, country, amount + {bump} AS amount, ts, {day} AS event_date
FROM raw
WHERE {window} AND event_id % 11 = 4
"""
    open(os.path.join(directory, "sql", "events", "v5.sql"), "w").write(head + "*/" + body)


def feed(directory, version):
    dt = DeltaTable(events_path(directory))
    changes = pa.table(dt.load_cdf(starting_version=version, ending_version=version).read_all())
    got = duckdb.sql(f"SELECT {COLUMNS}, _change_type FROM changes").fetchall()
    return sorted([list(r) for r in got])


def expect(directory, version, keyed):
    old = DeltaTable(events_path(directory), version=version - 1).to_pyarrow_table()
    new = DeltaTable(events_path(directory), version=version).to_pyarrow_table()
    if keyed == "key":
        got = duckdb.sql(
            f"""
            WITH changed AS (
                SELECT COALESCE(o.event_id, n.event_id) AS event_id,
                       CASE WHEN o.event_id IS NULL THEN 'insert'
                            WHEN n.event_id IS NULL THEN 'delete' ELSE 'update' END AS kind
                FROM old o FULL OUTER JOIN new n ON o.event_id = n.event_id
                WHERE o.event_id IS NULL OR n.event_id IS NULL
                   OR (o.country, o.amount, o.ts, o.event_date)
                      IS DISTINCT FROM (n.country, n.amount, n.ts, n.event_date))
            SELECT {COLUMNS}, CASE kind WHEN 'delete' THEN 'delete' ELSE 'update_preimage' END
            FROM old JOIN changed USING (event_id) WHERE kind <> 'insert'
            UNION ALL
            SELECT {COLUMNS}, CASE kind WHEN 'insert' THEN 'insert' ELSE 'update_postimage' END
            FROM new JOIN changed USING (event_id) WHERE kind <> 'delete'
            """
        ).fetchall()
    else:
        got = duckdb.sql(
            f"""
            SELECT {COLUMNS}, 'delete' FROM (SELECT event_id, country, amount, ts, event_date FROM old
                                             EXCEPT ALL
                                             SELECT event_id, country, amount, ts, event_date FROM new)
            UNION ALL
            SELECT {COLUMNS}, 'insert' FROM (SELECT event_id, country, amount, ts, event_date FROM new
                                             EXCEPT ALL
                                             SELECT event_id, country, amount, ts, event_date FROM old)
            """
        ).fetchall()
    return sorted([list(r) for r in got])


def timeless(directory, layout):
    """`scope.py timeless`, then the feed turned on for `accounts` (a metadata-only commit, so
    that its files stay as they are)."""
    scope.timeless(directory, layout)
    DeltaTable(os.path.join(directory, "lake", "accounts")).alter.set_table_properties(
        {"delta.enableChangeDataFeed": "true"}
    )


def downstream(directory):
    scope.downstream(directory)
    for table in scope.DOWNSTREAM:
        with_feed(os.path.join(directory, "lake", table))


def text_rows(relation_sql, **tables):
    """Every column of the rows `relation_sql` selects over `tables` (the change type last) as
    text, sorted."""
    con = duckdb.connect()
    for name, table in tables.items():
        con.register(name, table)
    return sorted([[None if v is None else str(v) for v in r] for r in con.sql(relation_sql).fetchall()])


def generic_feed(directory, table, version):
    dt = DeltaTable(os.path.join(directory, "lake", table))
    changes = pa.table(dt.load_cdf(starting_version=version, ending_version=version).read_all())
    columns = ", ".join(f'"{c}"' for c in DeltaTable(os.path.join(directory, "lake", table)).schema().to_arrow().names)
    return text_rows(f"SELECT {columns}, _change_type FROM changes", changes=changes)


def generic_expect(directory, table, version, key):
    """The feed of `version` by an independent diff of its rows and the version before's, by the
    columns `key` (comma-separated)."""
    path = os.path.join(directory, "lake", table)
    old = DeltaTable(path, version=version - 1).to_pyarrow_table()
    new = DeltaTable(path, version=version).to_pyarrow_table()
    names = DeltaTable(path).schema().to_arrow().names
    columns = ", ".join(f'"{c}"' for c in names)
    keys = key.split(",")
    on = " AND ".join(f'o."{k}" = n."{k}"' for k in keys)
    whole = lambda a: "(" + ", ".join(f'{a}."{c}"' for c in names) + ")"
    return text_rows(
        f"""
        WITH changed AS (
            SELECT DISTINCT {", ".join(f'COALESCE(o."{k}", n."{k}") AS "{k}"' for k in keys)},
                   CASE WHEN o."{keys[0]}" IS NULL THEN 'insert'
                        WHEN n."{keys[0]}" IS NULL THEN 'delete' ELSE 'update' END AS kind
            FROM old o FULL OUTER JOIN new n ON {on}
            WHERE o."{keys[0]}" IS NULL OR n."{keys[0]}" IS NULL OR {whole("o")} IS DISTINCT FROM {whole("n")})
        SELECT {columns}, CASE kind WHEN 'delete' THEN 'delete' ELSE 'update_preimage' END
        FROM old JOIN changed USING ({", ".join(f'"{k}"' for k in keys)}) WHERE kind <> 'insert'
        UNION ALL
        SELECT {columns}, CASE kind WHEN 'insert' THEN 'insert' ELSE 'update_postimage' END
        FROM new JOIN changed USING ({", ".join(f'"{k}"' for k in keys)}) WHERE kind <> 'delete'
        """,
        old=old,
        new=new,
    )


def actions(directory, version):
    name = os.path.join(events_path(directory), "_delta_log", f"{version:020}.json")
    out = {"add": [], "remove": [], "cdc": []}
    for line in open(name):
        action = json.loads(line)
        for kind in out:
            if kind in action:
                a = action[kind]
                out[kind].append([a["path"], a.get("dataChange"), a.get("partitionValues", {}).get("event_date")])
    for kind in out:
        out[kind].sort()
    return out


def copies(directory, version):
    """How many of the cdc files of VERSION are byte-for-byte copies of the column chunks of a file
    the commit adds or removes (the same row groups, each column chunk of the same size and
    statistics), with `_change_type` added: {"cdc": n, "added": a, "removed": r}."""
    import urllib.parse

    import pyarrow.parquet as pq

    root = events_path(directory)

    def chunks(path, leave_out=()):
        meta = pq.ParquetFile(os.path.join(root, urllib.parse.unquote(path))).metadata
        groups = []
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            columns = []
            for c in range(group.num_columns):
                column = group.column(c)
                if column.path_in_schema in leave_out:
                    continue
                stats = column.statistics
                columns.append(
                    [
                        column.path_in_schema,
                        column.total_compressed_size,
                        str(stats.min) if stats is not None and stats.has_min_max else None,
                        str(stats.max) if stats is not None and stats.has_min_max else None,
                    ]
                )
            groups.append([group.num_rows, columns])
        return groups

    listed = actions(directory, version)
    added = [chunks(a[0]) for a in listed["add"]]
    removed = [chunks(a[0]) for a in listed["remove"]]
    out = {"cdc": len(listed["cdc"]), "added": 0, "removed": 0}
    for cdc in listed["cdc"]:
        got = chunks(cdc[0], leave_out=("_change_type",))
        if got in added:
            out["added"] += 1
        elif got in removed:
            out["removed"] += 1
    return out


def main():
    command, directory = sys.argv[1], sys.argv[2]
    if command == "make":
        make(directory, sys.argv[3], sys.argv[4])
    elif command == "bump":
        bump(directory, sys.argv[3])
    elif command == "reshape":
        reshape(directory)
    elif command == "wholes":
        wholes(directory)
    elif command == "rebump":
        rebump(directory, sys.argv[3])
    elif command == "feed":
        print(json.dumps(feed(directory, int(sys.argv[3]))))
    elif command == "expect":
        print(json.dumps(expect(directory, int(sys.argv[3]), sys.argv[4])))
    elif command == "enable":
        DeltaTable(os.path.join(directory, "lake", sys.argv[3])).alter.set_table_properties(
            {"delta.enableChangeDataFeed": "true"}
        )
    elif command == "timeless":
        timeless(directory, sys.argv[3])
    elif command == "downstream":
        downstream(directory)
    elif command == "gfeed":
        print(json.dumps(generic_feed(directory, sys.argv[3], int(sys.argv[4]))))
    elif command == "gexpect":
        print(json.dumps(generic_expect(directory, sys.argv[3], int(sys.argv[4]), sys.argv[5])))
    elif command == "actions":
        print(json.dumps(actions(directory, int(sys.argv[3]))))
    elif command == "copies":
        print(json.dumps(copies(directory, int(sys.argv[3]))))
    else:
        raise SystemExit(f"unknown command {command}")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
