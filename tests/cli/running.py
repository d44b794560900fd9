"""A running total that reads its own past, for #32: tables made by python `deltalake`, and the
totals it must hold computed here from the rows alone.

    python3 running.py make DIR GRAIN        # project DIR: `daily` and `running`, and the model
    python3 running.py correct DIR PERIOD    # another writer adds 1000 to every amount of PERIOD
    python3 running.py expect DIR            # the totals `running` must hold: [[label, country, total]]
    python3 running.py rows DIR              # the rows `running` holds
    python3 running.py cumulative DIR create # in the demo project DIR: an empty `cum_revenue`
                                             # and its model, each country's revenue so far
    python3 running.py cumulative DIR expect # what it must hold, from `daily_revenue`'s rows
    python3 running.py cumulative DIR rows   # what it holds

GRAIN is `day` or `month`; `daily` has 12 periods x 3 countries from 2024-01-01; `running` holds
each country's total of `daily` up to and including each period (correct when made). The model
`sql/running/v1.sql` computes a period's total from `daily` and its own previous period
(`lookback = 1`); `sql/running/v2.sql` also reads its own next period (`lookahead = 1`).
"""

import datetime
import json
import os
import sys

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

PERIODS = 12
COUNTRIES = ["DE", "FR", "US"]
START = datetime.date(2024, 1, 1)


def period(grain, n):
    if grain == "day":
        return START + datetime.timedelta(days=n)
    return datetime.date(2024 + n // 12, n % 12 + 1, 1)


def label(grain, day):
    return day.isoformat() if grain == "day" else day.strftime("%Y-%m")


def grain_of(directory):
    with open(os.path.join(directory, "grain")) as f:
        return f.read().strip()


def totals(grain, daily):
    """Each country's running total of `daily` ({(date, country): amount}), as sorted rows."""
    out, running = [], {}
    for day, country in sorted(daily):
        running[country] = running.get(country, 0) + daily[(day, country)]
        out.append([label(grain, day), country, running[country]])
    return sorted(out)


def read_daily(directory):
    rows = DeltaTable(os.path.join(directory, "lake", "daily")).to_pyarrow_table().to_pylist()
    return {(r["period"], r["country"]): r["amount"] for r in rows}


def make(directory, grain):
    lake = os.path.join(directory, "lake")
    daily = {}
    for n in range(PERIODS):
        for c, country in enumerate(COUNTRIES):
            daily[(period(grain, n), country)] = 10 * (n + 1) + c
    keys = sorted(daily)
    write_deltalake(
        os.path.join(lake, "daily"),
        pa.table(
            {
                "period": pa.array([k[0] for k in keys], pa.date32()),
                "country": pa.array([k[1] for k in keys], pa.string()),
                "amount": pa.array([daily[k] for k in keys], pa.int64()),
            }
        ),
        partition_by=["period"],
    )
    rows = totals(grain, daily)
    back = {label(grain, period(grain, n)): period(grain, n) for n in range(PERIODS)}
    write_deltalake(
        os.path.join(lake, "running"),
        pa.table(
            {
                "period": pa.array([back[r[0]] for r in rows], pa.date32()),
                "country": pa.array([r[1] for r in rows], pa.string()),
                "total": pa.array([r[2] for r in rows], pa.int64()),
            }
        ),
        partition_by=["period"],
    )
    with open(os.path.join(directory, "grain"), "w") as f:
        f.write(grain)
    with open(os.path.join(directory, "lakefill.toml"), "w") as f:
        f.write('[tables.daily]\nuri = "lake/daily"\n\n[tables.running]\nuri = "lake/running"\n')
    os.makedirs(os.path.join(directory, "sql", "running"))
    step = "1 day" if grain == "day" else "1 month"
    for version, lookahead in [("v1", 0), ("v2", 1)]:
        with open(os.path.join(directory, "sql", "running", f"{version}.sql"), "w") as f:
            f.write(
                f"""/*
target = "running"
partition_by = "period"
grain = "{grain}"
reason = "running totals"

[sources.daily]
window = "period"

[sources.running]
window = "period"
lookback = 1
lookahead = {lookahead}

[validate]
key = ["period", "country"]
*/
SELECT d.period, d.country, d.amount + COALESCE(p.total, 0) AS total
FROM daily d
LEFT JOIN running p ON p.country = d.country AND p.period = CAST(d.period - INTERVAL '{step}' AS DATE)
WHERE d.period BETWEEN $start AND $end
"""
            )


def correct(directory, when):
    table = DeltaTable(os.path.join(directory, "lake", "daily"))
    table.update(predicate=f"period = '{when}'", updates={"amount": "amount + 1000"})


def expect(directory):
    print(json.dumps(totals(grain_of(directory), read_daily(directory))))


def rows(directory):
    grain = grain_of(directory)
    data = DeltaTable(os.path.join(directory, "lake", "running")).to_pyarrow_table().to_pylist()
    print(json.dumps(sorted([label(grain, r["period"]), r["country"], r["total"]] for r in data)))


CUMULATIVE_MODEL = """/*
target = "cum_revenue"
partition_by = "event_date"
reason = "revenue so far"

[sources.daily_revenue]
window = "event_date"

[sources.cum_revenue]
window = "event_date"
lookback = 1

[validate]
key = ["event_date", "country"]
*/
SELECT d.event_date, d.country, d.revenue_cents + COALESCE(p.cum_cents, 0) AS cum_cents
FROM daily_revenue d
LEFT JOIN cum_revenue p
  ON p.country = d.country AND p.event_date = CAST(d.event_date - INTERVAL '1 day' AS DATE)
WHERE d.event_date BETWEEN $start AND $end
"""


def cumulative(directory, what):
    from deltalake import Field, Schema

    lake = os.path.join(directory, "lake")
    if what == "create":
        DeltaTable.create(
            os.path.join(lake, "cum_revenue"),
            schema=Schema([Field("event_date", "date"), Field("country", "string"), Field("cum_cents", "long")]),
            partition_by=["event_date"],
        )
        with open(os.path.join(directory, "lakefill.toml"), "a") as f:
            f.write('\n[tables.cum_revenue]\nuri = "lake/cum_revenue"\n')
        os.makedirs(os.path.join(directory, "sql", "cum_revenue"))
        with open(os.path.join(directory, "sql", "cum_revenue", "v1.sql"), "w") as f:
            f.write(CUMULATIVE_MODEL)
        return
    if what == "expect":
        rows = DeltaTable(os.path.join(lake, "daily_revenue")).to_pyarrow_table().to_pylist()
        daily = {(r["event_date"], r["country"]): r["revenue_cents"] for r in rows}
        print(json.dumps(totals("day", daily)))
        return
    rows = DeltaTable(os.path.join(lake, "cum_revenue")).to_pyarrow_table().to_pylist()
    print(json.dumps(sorted([r["event_date"].isoformat(), r["country"], r["cum_cents"]] for r in rows)))


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "make":
        make(sys.argv[2], sys.argv[3])
    elif command == "correct":
        correct(sys.argv[2], sys.argv[3])
    elif command == "expect":
        expect(sys.argv[2])
    elif command == "rows":
        rows(sys.argv[2])
    elif command == "cumulative":
        cumulative(sys.argv[2], sys.argv[3])
    else:
        raise SystemExit(f"unknown command {command}")
    # python `deltalake` can abort at interpreter exit while its threads wind down.
    sys.stdout.flush()
    os._exit(0)
