"""The change data feed of a fix (#37), read back and checked by other readers than lakefill.

    python3 feed.py make DIR LAYOUT KEYED   # `scope.py make`'s lake, `events` with the change
                                            # data feed on; KEYED `key` or `nokey` (the model
                                            # declares `key = ["event_id"]` or no key)
    python3 feed.py bump DIR DAY            # writes `sql/events/v2.sql`: v1, with `amount + 1`
                                            # for the events of UTC date DAY only
    python3 feed.py feed DIR VERSION        # the change feed of VERSION as python `deltalake`'s
                                            # `load_cdf` reads it: sorted rows
                                            # [event_id, country, amount, event_date, change]
    python3 feed.py expect DIR VERSION KEYED  # the same rows from an independent diff: DuckDB
                                            # over the rows of VERSION - 1 and VERSION (read by
                                            # python `deltalake`), by key or as whole rows
    python3 feed.py actions DIR VERSION     # the commit's actions: {"add": [[path, dataChange,
                                            # event_date]], "remove": [...], "cdc": [[path, ...]]}
"""

import json
import os
import sys

import duckdb
import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scope  # noqa: E402

COLUMNS = "event_id, country, amount, CAST(event_date AS VARCHAR) AS event_date"


def events_path(directory):
    return os.path.join(directory, "lake", "events")


def make(directory, layout, keyed):
    scope.make(directory, layout)
    # The same rows, written again with the feed on (a new table: the feed is on from version 0).
    path = events_path(directory)
    rows = DeltaTable(path).to_pyarrow_table()
    partition_by = DeltaTable(path).metadata().partition_columns
    import shutil

    shutil.rmtree(path)
    write_deltalake(
        path,
        rows,
        partition_by=partition_by,
        configuration={"delta.enableChangeDataFeed": "true"},
    )
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


def main():
    command, directory = sys.argv[1], sys.argv[2]
    if command == "make":
        make(directory, sys.argv[3], sys.argv[4])
    elif command == "bump":
        bump(directory, sys.argv[3])
    elif command == "feed":
        print(json.dumps(feed(directory, int(sys.argv[3]))))
    elif command == "expect":
        print(json.dumps(expect(directory, int(sys.argv[3]), sys.argv[4])))
    elif command == "actions":
        print(json.dumps(actions(directory, int(sys.argv[3]))))
    else:
        raise SystemExit(f"unknown command {command}")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
