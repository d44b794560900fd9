"""Tables made by another Delta writer (python `deltalake`), and an independent reader of them.

    python3 delta_tables.py create KIND PATH   # a table with the feature KIND at PATH
    python3 delta_tables.py rows PATH          # its rows as JSON, sorted by event_id
    python3 delta_tables.py protocol PATH      # its protocol as JSON
    python3 delta_tables.py shape SHAPE URI    # a table partitioned as SHAPE (see `shapes`)
    python3 delta_tables.py all_rows URI       # every row as JSON, any schema, sorted
    python3 delta_tables.py ledger KIND URI    # a ledger (`append_only`) or its source (`plain`)
    python3 delta_tables.py added URI VERSION  # the rows of only the files VERSION added
    python3 delta_tables.py append_ledger URI  # another writer appends event 777 on 2026-01-01
    python3 delta_tables.py add_constraint URI NAME EXPR  # adds CHECK constraint NAME

Every table has event_id (long), amount_cents (long) and event_date (date, the partition column),
3 days x 4 rows; KIND adds what the feature needs.
"""

import datetime
import decimal
import json
import os
import sys

import pyarrow as pa
from deltalake import DeltaTable, Field, Schema, write_deltalake

DAYS = [datetime.date(2026, 1, 1) + datetime.timedelta(days=d) for d in range(3)]


def rows(with_double=False):
    ids, amounts, dates = [], [], []
    for d, day in enumerate(DAYS):
        for i in range(4):
            ids.append(100 * (d + 1) + i)
            amounts.append(1000 + 10 * d + i)
            dates.append(day)
    data = {"event_id": ids, "amount_cents": amounts, "event_date": dates}
    if with_double:
        data["double_amount"] = [2 * a for a in amounts]
    return data


def create(kind, path):
    # `KIND@flat`: the same table unpartitioned (a backfill replaces its range by rows).
    kind, _, layout = kind.partition("@")
    fields = [
        Field("event_id", "long", nullable=kind != "not_null"),
        Field("amount_cents", "long"),
        Field("event_date", "date"),
    ]
    configuration = {}
    if kind == "not_null":
        fields[0] = Field("event_id", "long", nullable=False)
    elif kind == "invariants":
        invariant = {"expression": {"expression": "amount_cents < 1000000"}}
        fields[1] = Field("amount_cents", "long", metadata={"delta.invariants": json.dumps(invariant)})
    elif kind == "generated":
        fields.append(
            Field("double_amount", "long", metadata={"delta.generationExpression": "amount_cents * 2"})
        )
    elif kind == "column_mapping":
        configuration["delta.columnMapping.mode"] = "name"
    elif kind == "append_only":
        configuration["delta.appendOnly"] = "true"
    elif kind == "change_data_feed":
        configuration["delta.enableChangeDataFeed"] = "true"
    elif kind not in ("constraints", "plain"):
        raise SystemExit(f"unknown kind {kind}")
    partition_by = None if layout == "flat" else ["event_date"]
    DeltaTable.create(
        path, schema=Schema(fields), partition_by=partition_by, configuration=configuration or None
    )
    types = {"long": pa.int64(), "date": pa.date32()}
    schema = pa.schema([pa.field(f.name, types[f.type.type], nullable=f.nullable) for f in fields])
    write_deltalake(path, pa.table(rows(kind == "generated"), schema=schema), mode="append")
    if kind == "constraints":
        DeltaTable(path).alter.add_constraint({"amount_positive": "amount_cents > 0"})


def storage_options():
    """The options of the test lake's store, from the environment the tests pass: moto's S3 or
    Azurite's Azure, or none for local disk."""
    keys = ["AWS_ENDPOINT_URL", "AWS_ALLOW_HTTP", "AWS_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
            "AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_ENDPOINT", "AZURE_ALLOW_HTTP"]
    options = {k: os.environ[k] for k in keys if k in os.environ}
    if "AWS_ENDPOINT_URL" in options:
        options["conditional_put"] = "etag"
    return options or None


TAGS = ["x/y", "o'k", "50%", "k=v", "Côte", "a#b?c\\d", "plain"]


def shape_rows(shape):
    """Rows (id, amount, ts) spread over the shape's partitions, and the partition columns."""
    utc = datetime.timezone.utc
    base = datetime.datetime(2026, 1, 1, tzinfo=utc)
    rows = []
    if shape == "month":
        for m in range(8):
            start = datetime.date(2025, 6 + m, 1) if m < 7 else datetime.date(2026, 1, 1)
            for i in range(3 + m):
                rows.append({"id": 1000 * m + i, "amount": 10 * m + i, "event_month": start})
        return rows, ["event_month"], {"event_month": pa.date32()}
    if shape == "hour":
        for h in range(30):
            hour = base + datetime.timedelta(hours=h)
            for i in range(3):
                rows.append({"id": 100 * h + i, "amount": h + i, "event_hour": hour})
        return rows, ["event_hour"], {"event_hour": pa.timestamp("us", tz="UTC")}
    if shape in ("ds", "ds_compact", "ds_hour"):
        fmt = {"ds": "%Y-%m-%d", "ds_compact": "%Y%m%d", "ds_hour": "%Y-%m-%d-%H"}[shape]
        step = datetime.timedelta(hours=1) if shape == "ds_hour" else datetime.timedelta(days=1)
        for n in range(12):
            t = base + n * step
            for i in range(2 + n % 3):
                rows.append({"id": 100 * n + i, "amount": n + i, "ds": t.strftime(fmt)})
        return rows, ["ds"], {"ds": pa.string()}
    if shape in ("two", "two_reversed", "escaped"):
        tags = TAGS if shape == "escaped" else ["DE", "FR", "US"]
        column = "tag" if shape == "escaped" else "country"
        for d in range(6):
            day = datetime.date(2026, 1, 1) + datetime.timedelta(days=d)
            for t, tag in enumerate(tags):
                for i in range(1 + (d + t) % 3):
                    rows.append({"id": 1000 * d + 10 * t + i, "amount": d + t + i, "event_date": day, column: tag})
        columns = [column, "event_date"] if shape == "two_reversed" else ["event_date", column]
        return rows, columns, {"event_date": pa.date32(), column: pa.string()}
    if shape == "parts":
        n = 0
        for year, month in [(2025, 10), (2025, 11), (2025, 12), (2026, 1), (2026, 2), (2026, 3)]:
            for i in range(2 + month % 3):
                rows.append({"id": 100 * n + i, "amount": month + i, "year": year, "month": month})
            n += 1
        return rows, ["year", "month"], {"year": pa.int32(), "month": pa.int32()}
    if shape == "nulls":
        for d in range(6):
            day = datetime.date(2026, 1, 1) + datetime.timedelta(days=d)
            for i in range(3):
                rows.append({"id": 100 * d + i, "amount": d + i, "event_date": day})
        for i in range(4):
            rows.append({"id": 9000 + i, "amount": 50 + i, "event_date": None})
        return rows, ["event_date"], {"event_date": pa.date32()}
    if shape in ("totals_day", "totals_month", "ma_day", "ma_month"):
        column = "day" if shape.endswith("day") else "month"
        for i in range(20 if column == "day" else 12):
            if column == "day":
                period = datetime.date(2026, 1, 1) + datetime.timedelta(days=i)
            else:
                period = datetime.date(2025, 1 + i, 1)
            if shape.startswith("totals"):
                rows.append({column: period, "total": (i * 37) % 11 + i})
            else:
                rows.append({column: period, "ma": 0.0})
        value = ("total", pa.int64()) if shape.startswith("totals") else ("ma", pa.float64())
        return rows, [column], {column: pa.date32(), value[0]: value[1]}
    raise SystemExit(f"unknown shape {shape}")


def rows_table(name, uri):
    """Tables a backfill replaces by rows: written in several appends, so files hold different
    spans of time and only some overlap a range."""
    options = storage_options()
    if name in ("flat", "coarse"):
        days = [datetime.date(2025, 12, 20) + datetime.timedelta(days=d) for d in range(40)]
        spans = [days[i : i + 8] for i in range(0, 40, 8)]
        schema = pa.schema(
            [("id", pa.int64()), ("amount", pa.int64()), ("event_date", pa.date32())]
            + ([("event_month", pa.date32())] if name == "coarse" else [])
        )
        for n, span in enumerate(spans):
            rows = []
            for d, day in enumerate(span):
                for i in range(3):
                    row = {"id": 10000 * n + 100 * d + i, "amount": d + i + n, "event_date": day}
                    if name == "coarse":
                        row["event_month"] = day.replace(day=1)
                    rows.append(row)
            write_deltalake(
                uri,
                pa.Table.from_pylist(rows, schema=schema),
                mode="append",
                partition_by=["event_month"] if name == "coarse" else None,
                storage_options=options,
            )
        return
    if name in ("flat_ts", "coarse_ts"):
        # coarse_ts: partitioned by the day as a TIMESTAMP, whose directory names Delta escapes
        # (`event_day=2026-01-01%2000%3A00%3A00.000000`).
        utc = datetime.timezone.utc
        fields = [("id", pa.int64()), ("amount", pa.int64()), ("event_ts", pa.timestamp("us", tz="UTC"))]
        if name == "coarse_ts":
            fields.append(("event_day", pa.timestamp("us", tz="UTC")))
        schema = pa.schema(fields)
        for n in range(4):
            rows = []
            for m in range(20):
                t = datetime.datetime(2026, 1, 1, tzinfo=utc) + datetime.timedelta(minutes=37 * (20 * n + m))
                row = {"id": 100 * n + m, "amount": m, "event_ts": t}
                if name == "coarse_ts":
                    row["event_day"] = t.replace(hour=0, minute=0, second=0, microsecond=0)
                rows.append(row)
            write_deltalake(
                uri,
                pa.Table.from_pylist(rows, schema=schema),
                mode="append",
                partition_by=["event_day"] if name == "coarse_ts" else None,
                storage_options=options,
            )
        return
    raise SystemExit(f"unknown table {name}")


def shape(name, uri):
    if name in ("flat", "coarse", "flat_ts", "coarse_ts"):
        return rows_table(name, uri)
    rows, partition_by, types = shape_rows(name)
    fields = [] if name.startswith(("totals", "ma_")) else [pa.field("id", pa.int64()), pa.field("amount", pa.int64())]
    fields += [pa.field(c, t) for c, t in types.items()]
    schema = pa.schema(fields)
    table = pa.Table.from_pylist(rows, schema=schema)
    write_deltalake(uri, table, partition_by=partition_by, storage_options=storage_options())


def ledger(kind, uri):
    """event_id, country, amount_cents by event_date (3 days x 4 rows); `append_only` sets
    `delta.appendOnly`."""
    countries = ["FR", "US", "DE", "JP"]
    data = rows()
    data["country"] = [countries[i % 4] for i in range(len(data["event_id"]))]
    schema = pa.schema(
        [
            pa.field("event_id", pa.int64()),
            pa.field("country", pa.string()),
            pa.field("amount_cents", pa.int64()),
            pa.field("event_date", pa.date32()),
        ]
    )
    configuration = {"delta.appendOnly": "true"} if kind == "append_only" else None
    write_deltalake(
        uri,
        pa.table({f.name: data[f.name] for f in schema}, schema=schema),
        partition_by=["event_date"],
        configuration=configuration,
        storage_options=storage_options(),
    )


def ledger_measures(kind, uri):
    """`ledger`'s rows with a double measure `amount` (thirds and tenths, which no double holds
    exactly) and a decimal(18, 4) measure `fee` for `amount_cents`."""
    countries = ["FR", "US", "DE", "JP"]
    data = rows()
    count = len(data["event_id"])
    schema = pa.schema(
        [
            pa.field("event_id", pa.int64()),
            pa.field("country", pa.string()),
            pa.field("amount", pa.float64()),
            pa.field("fee", pa.decimal128(18, 4)),
            pa.field("event_date", pa.date32()),
        ]
    )
    table = {
        "event_id": data["event_id"],
        "country": [countries[i % 4] for i in range(count)],
        "amount": [0.1 * (i + 1) + i / 3 for i in range(count)],
        "fee": [decimal.Decimal(i * 37 + 1) / decimal.Decimal(10000) for i in range(count)],
        "event_date": data["event_date"],
    }
    configuration = {"delta.appendOnly": "true"} if kind == "append_only" else None
    write_deltalake(
        uri,
        pa.table(table, schema=schema),
        partition_by=["event_date"],
        configuration=configuration,
        storage_options=storage_options(),
    )


def add_constraint(uri, name, expression):
    DeltaTable(uri, storage_options=storage_options()).alter.add_constraint({name: expression})


def append_ledger(uri):
    schema = DeltaTable(uri, storage_options=storage_options()).schema().to_arrow()
    row = {"event_id": 777, "country": "FR", "amount_cents": 5, "event_date": DAYS[0]}
    table = pa.Table.from_pylist([{f.name: row.get(f.name) for f in schema}], schema=pa.schema(schema))
    write_deltalake(uri, table, mode="append", storage_options=storage_options())


def orphan_reversal(uri, event_id, amount_cents):
    """Appends, as another writer would, a reversal of a row the ledger never held (EVENT_ID on the
    first day, measure AMOUNT_CENTS): its stored rows no longer sum to its net rows."""
    schema = DeltaTable(uri, storage_options=storage_options()).schema().to_arrow()
    row = {
        "event_id": int(event_id),
        "country": "FR",
        "amount_cents": int(amount_cents),
        "event_date": DAYS[0],
        "_lakefill_run_id": "written-by-hand",
        "_lakefill_kind": "reversal",
    }
    table = pa.Table.from_pylist([{f.name: row.get(f.name) for f in schema}], schema=pa.schema(schema))
    write_deltalake(uri, table, mode="append", storage_options=storage_options())


def double_row(uri, event_id):
    """Appends a second copy of the row of EVENT_ID: a row loaded twice."""
    table = DeltaTable(uri, storage_options=storage_options()).to_pyarrow_table()
    import pyarrow.compute as pc

    copy = table.filter(pc.equal(table["event_id"], int(event_id)))
    assert copy.num_rows == 1, copy
    write_deltalake(uri, copy, mode="append", storage_options=storage_options())


def added(uri, version):
    """Reads only the files that commit VERSION added (as a reader following appends would)."""
    import pyarrow.dataset as ds

    version = int(version)
    before = set(DeltaTable(uri, version=version - 1, storage_options=storage_options()).file_uris())
    table = DeltaTable(uri, version=version, storage_options=storage_options())
    dataset = table.to_pyarrow_dataset()
    fragments = [f for f in dataset.get_fragments() if not any(u.endswith(f.path) for u in before)]
    new = ds.FileSystemDataset(fragments, dataset.schema, dataset.format, dataset.filesystem)
    out = []
    for row in new.to_table().to_pylist():
        out.append({k: (v.isoformat() if isinstance(v, datetime.date) else v) for k, v in row.items()})
    out.sort(key=lambda r: json.dumps(r, sort_keys=True))
    print(json.dumps({"files": len(fragments), "rows": out}))


def all_rows(uri):
    table = DeltaTable(uri, storage_options=storage_options()).to_pyarrow_table().to_pylist()
    def text(v):
        if isinstance(v, datetime.datetime):
            return v.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
        if isinstance(v, datetime.date):
            return v.isoformat()
        if isinstance(v, decimal.Decimal):
            return str(v)
        return v
    out = [{k: text(v) for k, v in row.items()} for row in table]
    out.sort(key=lambda r: json.dumps(r, sort_keys=True))
    print(json.dumps(out, sort_keys=True))


def read_rows(path):
    table = DeltaTable(path).to_pyarrow_table().to_pylist()
    out = []
    for row in sorted(table, key=lambda r: (r["event_id"] is None, r["event_id"])):
        out.append({k: (v.isoformat() if isinstance(v, datetime.date) else v) for k, v in row.items()})
    print(json.dumps(out))


def protocol(path):
    p = DeltaTable(path).protocol()
    print(
        json.dumps(
            {
                "min_reader_version": p.min_reader_version,
                "min_writer_version": p.min_writer_version,
                "reader_features": p.reader_features,
                "writer_features": p.writer_features,
            }
        )
    )


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "create":
        create(sys.argv[2], sys.argv[3])
    elif command == "ledger":
        ledger(sys.argv[2], sys.argv[3])
    elif command == "ledger_measures":
        ledger_measures(sys.argv[2], sys.argv[3])
    elif command == "add_constraint":
        add_constraint(sys.argv[2], sys.argv[3], sys.argv[4])
    elif command == "append_ledger":
        append_ledger(sys.argv[2])
    elif command == "orphan_reversal":
        orphan_reversal(sys.argv[2], sys.argv[3], sys.argv[4])
    elif command == "double_row":
        double_row(sys.argv[2], sys.argv[3])
    elif command == "added":
        added(sys.argv[2], sys.argv[3])
    elif command == "rows":
        read_rows(sys.argv[2])
    elif command == "protocol":
        protocol(sys.argv[2])
    elif command == "shape":
        shape(sys.argv[2], sys.argv[3])
    elif command == "all_rows":
        all_rows(sys.argv[2])
    else:
        raise SystemExit(f"unknown command {command}")
    # deltalake's runtime threads can abort the interpreter's shutdown; the work is done.
    sys.stdout.flush()
    os._exit(0)
