"""Another writer's changes to `daily_revenue` of a demo lake, made with python `deltalake`, for
`lakefill stale` (#37).

    python3 stale.py append DIR DATE   # one more row (a late one) in the partition DATE
    python3 stale.py optimize DIR      # OPTIMIZE: every file rewritten, no data changed
    python3 stale.py delete DIR DATE   # the partition DATE deleted
"""

import datetime
import os
import sys

from deltalake import DeltaTable, write_deltalake


def main():
    command, directory = sys.argv[1], sys.argv[2]
    path = os.path.join(directory, "lake", "daily_revenue")
    table = DeltaTable(path)
    if command == "append":
        date = datetime.date.fromisoformat(sys.argv[3])
        row = table.to_pyarrow_table(filters=[("event_date", "=", date)]).slice(0, 1)
        assert row.num_rows == 1, f"no row on {date}"
        row = row.set_column(row.schema.get_field_index("country"), "country", [["ZZ"]])
        write_deltalake(path, row, mode="append")
    elif command == "optimize":
        # Z-ordering rewrites every file, even one alone in its partition (compaction would
        # skip those): the same rows in new files, `dataChange` false.
        metrics = table.optimize.z_order(["country"])
        assert metrics["numFilesRemoved"] > 0, metrics
    elif command == "delete":
        table.delete(f"event_date = '{sys.argv[3]}'")
    else:
        raise SystemExit(f"unknown command {command}")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
