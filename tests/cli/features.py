"""Tables with the Delta features Databricks and recent Spark turn on (issue #35), made the way
those writers make them, and independent readers of them.

    python3 features.py make KIND DIR     # project DIR with table `t` (lake/t) of KIND
    python3 features.py rows TABLE [VERSION]  # rows by python deltalake's own engine (QueryBuilder)
    python3 features.py raw TABLE         # rows read from the raw files by pyarrow and the log
    python3 features.py polars TABLE      # rows by polars (no column mapping: polars refuses it)
    python3 features.py append TABLE DAY  # another writer appends event 900 on DAY
    python3 features.py files TABLE       # each live file's Parquet columns: names and field ids
    python3 features.py meta TABLE        # protocol, configuration, schema and domains, by the log

KIND: `name` (python deltalake's column mapping, mode name, then a rename and a drop written
into the log as Spark's ALTER TABLE writes them) or `id` (mode id, written by hand: pyarrow files
with `PARQUET:field_id`, a log exactly as the protocol says); `@flat` makes it unpartitioned.

Every table: event_id long, amount_cents long, point struct<x long, tag string>, event_date date;
3 days x 4 rows. `pyarrow.dataset` readers (and polars 2.1) do not apply column mapping, so rows
are read by python deltalake's Rust engine, and independently by `raw`, which maps the files'
columns to the schema by physical name (mode name) or field id (mode id) itself.
"""

import datetime
import json
import os
import struct
import sys
import uuid
import zlib

import pyarrow as pa
import pyarrow.parquet as pq

DAYS = [datetime.date(2026, 1, 1) + datetime.timedelta(days=d) for d in range(3)]
CREATED = 1767225600000


def base_rows():
    # FEATURES_ROWS_PER_DAY makes a larger table of the same shape (for timing, not the tests).
    per_day = int(os.environ.get("FEATURES_ROWS_PER_DAY", "4"))
    out = []
    for d, day in enumerate(DAYS):
        for i in range(per_day):
            event = 100 * (d + 1) + i if per_day <= 4 else (d + 1) * 10**7 + i
            out.append(
                {
                    "event_id": event,
                    "amount_cents": 1000 + 10 * d + i,
                    "point": {"x": event * 2, "tag": f"p{event}"},
                    "event_date": day,
                }
            )
    return out


def log_dir(root):
    return os.path.join(root, "_delta_log")


def write_commit(root, version, actions):
    os.makedirs(log_dir(root), exist_ok=True)
    with open(os.path.join(log_dir(root), f"{version:020d}.json"), "x") as f:
        f.write("".join(json.dumps(a) + "\n" for a in actions))


def commit_info(version, operation="WRITE", ict=False):
    info = {"timestamp": CREATED + 60000 * version, "operation": operation}
    if ict:
        info["inCommitTimestamp"] = CREATED + 60000 * version
    return {"commitInfo": info}


def read_log(root):
    """(protocol, metaData, live adds, domain metadata) at the latest version: the newest
    (classic) checkpoint, then the JSON commits after it."""
    checkpoints = sorted(n for n in os.listdir(log_dir(root)) if n.endswith(".checkpoint.parquet"))
    start, actions = -1, []
    if checkpoints:
        start = int(checkpoints[-1][:20])
        table = pq.read_table(os.path.join(log_dir(root), checkpoints[-1]))
        for row in table.to_pylist():
            for key, value in row.items():
                if value is not None:
                    actions.append({key: checkpoint_action(key, value)})
    names = sorted(n for n in os.listdir(log_dir(root)) if n.endswith(".json") and n[:20].isdigit() and int(n[:20]) > start)
    for name in names:
        with open(os.path.join(log_dir(root), name)) as f:
            actions.extend(json.loads(line) for line in f)
    return replay(actions)


def checkpoint_action(key, value):
    """A checkpoint's row as the JSON action it stands for (maps as dicts, no NULL fields)."""
    value = {k: v for k, v in value.items() if v is not None}
    for field in ("partitionValues", "configuration", "tags"):
        if isinstance(value.get(field), list):
            value[field] = dict(value[field])
    if key == "metaData" and isinstance(value.get("format"), dict):
        value["format"] = {k: v for k, v in value["format"].items() if v is not None}
    return value


def replay(actions):
    """The table's state after `actions`, as the protocol reconciles them."""
    protocol, metadata, adds, domains = None, None, {}, {}
    for action in actions:
        if "protocol" in action:
            protocol = action["protocol"]
        if "metaData" in action:
            metadata = action["metaData"]
        if "add" in action:
            adds[action["add"]["path"]] = action["add"]
        if "remove" in action:
            adds.pop(action["remove"]["path"], None)
        if "domainMetadata" in action:
            d = action["domainMetadata"]
            if d.get("removed"):
                domains.pop(d["domain"], None)
            else:
                domains[d["domain"]] = json.loads(d["configuration"])
    return protocol, metadata, adds, domains


# --- making tables ----------------------------------------------------------------------------


def mapped_schema(fields_spec, ids):
    """A Delta schema (JSON) of (name, type) pairs with mapping metadata; struct types nested."""

    def field(name, data_type):
        ids[0] += 1
        my_id = ids[0]
        if isinstance(data_type, list):
            data_type = {"type": "struct", "fields": [field(n, t) for n, t in data_type]}
        return {
            "name": name,
            "type": data_type,
            "nullable": True,
            "metadata": {
                "delta.columnMapping.id": my_id,
                "delta.columnMapping.physicalName": f"col-{uuid.uuid4()}",
            },
        }

    return {"type": "struct", "fields": [field(n, t) for n, t in fields_spec]}


FIELDS = [
    ("event_id", "long"),
    ("amount", "long"),
    ("note", "string"),
    ("point", [("x", "long"), ("tag", "string")]),
    ("event_date", "date"),
]


def arrow_type(delta_type, schema_field=None, physical=False):
    if isinstance(delta_type, dict):
        return pa.struct([arrow_field(f, physical) for f in delta_type["fields"]])
    return {
        "long": pa.int64(),
        "string": pa.string(),
        "date": pa.date32(),
        "timestamp_ntz": pa.timestamp("us"),
    }[delta_type]


def arrow_field(field, physical):
    meta = field["metadata"]
    name = physical_name(field) if physical else field["name"]
    mapped_id = meta.get("delta.columnMapping.id")
    ids = {b"PARQUET:field_id": str(mapped_id).encode()} if mapped_id is not None else None
    return pa.field(name, arrow_type(field["type"], physical=physical), metadata=ids)


def file_rows(rows, renamed):
    """Rows keyed by the version 1 column names: with column mapping `amount` and `note` (renamed
    and dropped at version 2), else the final ones."""
    rows = [
        dict(
            r,
            row_id=i + 1,
            seen_at=datetime.datetime(2026, 1, 1, 12, 0, 0) + datetime.timedelta(minutes=i),
            status="ok",
        )
        for i, r in enumerate(rows)
    ]
    if not renamed:
        return rows
    out = []
    for r in rows:
        out.append(
            {
                "event_id": r["event_id"],
                "amount": r["amount_cents"],
                "note": f"n{r['event_id']}",
                "point": r["point"],
                "event_date": r["event_date"],
                "row_id": r["row_id"],
                "seen_at": r["seen_at"],
                "status": r["status"],
            }
        )
    return out


Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
DV_MAGIC = 1681511377


def inline_vector(positions):
    """An inline deletion vector of `positions` (an even number of them, all below 2^16):
    the magic, then a portable 64-bit RoaringTreemap of one bucket holding one array container,
    Z85-encoded, as the protocol's "Deletion Vector Format" says."""
    positions = sorted(positions)
    assert len(positions) % 2 == 0 and positions[-1] < 65536
    bitmap = struct.pack("<IIHHI", 12346, 1, 0, len(positions) - 1, 16)
    bitmap += b"".join(struct.pack("<H", p) for p in positions)
    data = struct.pack("<I", DV_MAGIC) + struct.pack("<Q", 1) + struct.pack("<I", 0) + bitmap
    assert len(data) % 4 == 0
    text = ""
    for i in range(0, len(data), 4):
        (value,) = struct.unpack(">I", data[i : i + 4])
        chars = []
        for _ in range(5):
            chars.append(Z85[value % 85])
            value //= 85
        text += "".join(reversed(chars))
    return {"storageType": "i", "pathOrInlineDv": text, "sizeInBytes": len(data), "cardinality": len(positions)}


def z85_decode(text):
    data = b""
    for i in range(0, len(text), 5):
        value = 0
        for c in text[i : i + 5]:
            value = value * 85 + Z85.index(c)
        data += struct.pack(">I", value)
    return data


def vector_bytes(root, vector):
    """The bytes of a deletion vector (the magic, then the bitmap), inline or from its file as the
    protocol's "Deletion Vector File Storage Format" says: a random prefix and a Z85-encoded UUID
    name `<prefix>/deletion_vector_<uuid>.bin`, where at `offset` come the data's size (4 bytes,
    big-endian), the data, and its CRC-32."""
    if vector["storageType"] == "i":
        return z85_decode(vector["pathOrInlineDv"])[: vector["sizeInBytes"]]
    assert vector["storageType"] == "u", vector
    encoded = vector["pathOrInlineDv"]
    prefix, token = encoded[:-20], encoded[-20:]
    name = f"deletion_vector_{uuid.UUID(bytes=z85_decode(token))}.bin"
    with open(os.path.join(root, prefix, name), "rb") as f:
        blob = f.read()
    assert blob[0] == 1, "format version 1"
    offset = vector.get("offset") or 1
    (size,) = struct.unpack(">I", blob[offset : offset + 4])
    assert size == vector["sizeInBytes"], vector
    data = blob[offset + 4 : offset + 4 + size]
    (crc,) = struct.unpack(">I", blob[offset + 4 + size : offset + 8 + size])
    assert crc == zlib.crc32(data), "the vector's checksum"
    return data


def deleted_positions(root, vector):
    """The positions a deletion vector deletes (array containers only, as small vectors are)."""
    data = vector_bytes(root, vector)
    (magic,) = struct.unpack("<I", data[:4])
    assert magic == DV_MAGIC, magic
    (buckets,) = struct.unpack("<Q", data[4:12])
    offset, out = 12, set()
    for _ in range(buckets):
        (high,) = struct.unpack("<I", data[offset : offset + 4])
        cookie, containers = struct.unpack("<II", data[offset + 4 : offset + 12])
        assert cookie == 12346, "only array containers without runs"
        headers = [struct.unpack("<HH", data[offset + 12 + 4 * c : offset + 16 + 4 * c]) for c in range(containers)]
        body = offset + 12 + 8 * containers
        for key, cardinality in headers:
            for j in range(cardinality + 1):
                (low,) = struct.unpack("<H", data[body + 2 * j : body + 2 * j + 2])
                out.add((high << 32) | (key << 16) | low)
            body += 2 * (cardinality + 1)
        offset = body
    return out


def make(kind, directory):
    """KIND: the column mapping mode (`none`, `name`, `id`), then `+`-separated features: `flat`
    (unpartitioned), `cluster` (liquid clustering by event_date: flat), `rt` (row tracking),
    `ict` (in-commit timestamps), `dv` (a deletion vector on a file), `identity`."""
    mode, *flags = kind.replace("@", "+").split("+")
    flags = set(flags)
    flat = "flat" in flags or "cluster" in flags
    root = os.path.join(directory, "lake", "t")
    os.makedirs(root)
    ids = [0]
    mapped = mode != "none"
    fields_spec = FIELDS if mapped else [(n, t) for n, t in FIELDS if n != "note"]
    if not mapped:
        fields_spec = [("amount_cents" if n == "amount" else n, t) for n, t in fields_spec]
    if "identity" in flags or "identity_default" in flags:
        fields_spec = fields_spec + [("row_id", "long")]
    if "ntz" in flags:
        fields_spec = fields_spec + [("seen_at", "timestamp_ntz")]
    if "defaults" in flags:
        fields_spec = fields_spec + [("status", "string")]
    schema = mapped_schema(fields_spec, ids)
    if not mapped:
        strip_mapping(schema["fields"])
    for field in schema["fields"]:
        if field["name"] == "status":
            field["metadata"]["CURRENT_DEFAULT"] = "'new'"
        if field["name"] == "row_id":
            # GENERATED ALWAYS (or BY DEFAULT) AS IDENTITY (START WITH 1 INCREMENT BY 1), after
            # the 12 rows of version 1.
            field["metadata"].update(
                {
                    "delta.identity.start": 1,
                    "delta.identity.step": 1,
                    "delta.identity.highWaterMark": 12,
                    "delta.identity.allowExplicitInsert": "identity_default" in flags,
                }
            )
    partition_columns = [] if flat else ["event_date"]
    reader, writer = set(), set()
    configuration = {}
    if mode == "name" and not (flags - {"flat"}):
        protocol = {"minReaderVersion": 2, "minWriterVersion": 5}
    else:
        if mapped:
            reader.add("columnMapping")
            writer.add("columnMapping")
        if "dv" in flags:
            reader.add("deletionVectors")
            writer.add("deletionVectors")
            configuration["delta.enableDeletionVectors"] = "true"
        if "rt" in flags:
            writer.update(["rowTracking", "domainMetadata"])
            configuration["delta.enableRowTracking"] = "true"
            configuration["delta.rowTracking.materializedRowIdColumnName"] = f"_row-id-col-{uuid.uuid4()}"
            configuration["delta.rowTracking.materializedRowCommitVersionColumnName"] = f"_row-commit-version-col-{uuid.uuid4()}"
        if "ict" in flags:
            writer.add("inCommitTimestamp")
            configuration["delta.enableInCommitTimestamps"] = "true"
        if "cluster" in flags:
            writer.update(["clustering", "domainMetadata"])
        if "identity" in flags or "identity_default" in flags:
            writer.add("identityColumns")
        if "ntz" in flags:
            reader.add("timestampNtz")
            writer.add("timestampNtz")
        if "defaults" in flags:
            writer.add("allowColumnDefaults")
        if "cpp" in flags:
            writer.add("checkpointProtection")
            configuration["delta.requireCheckpointProtectionBeforeVersion"] = "2"
        if "v2cp" in flags:
            reader.add("v2Checkpoint")
            writer.add("v2Checkpoint")
            configuration["delta.checkpointPolicy"] = "v2"
        writer.update(["appendOnly", "invariants"])
        protocol = {
            "minReaderVersion": 3 if reader else 1,
            "minWriterVersion": 7,
            "writerFeatures": sorted(writer),
        }
        if reader:
            protocol["readerFeatures"] = sorted(reader)
    if mapped:
        configuration["delta.columnMapping.mode"] = mode
        configuration["delta.columnMapping.maxColumnId"] = str(ids[0])
    metadata = {
        "id": str(uuid.uuid4()),
        "format": {"provider": "parquet", "options": {}},
        "schemaString": json.dumps(schema),
        "partitionColumns": partition_columns,
        "configuration": configuration,
        "createdTime": CREATED,
    }
    ict = "ict" in flags
    by_name = {f["name"]: f for f in schema["fields"]}
    date_field = by_name["event_date"]
    create = [commit_info(0, "CREATE TABLE", ict), {"protocol": protocol}, {"metaData": metadata}]
    if "cluster" in flags:
        create.append(domain("delta.clustering", {"clusteringColumns": [physical_name(date_field)]}))
    write_commit(root, 0, create)

    # Version 1: a file per day (flat: the first day's, then one holding the next two days),
    # columns under their physical names with their field ids.
    file_fields = [f for f in schema["fields"] if f["name"] not in partition_columns]
    physical_schema = pa.schema([arrow_field(f, True) for f in file_fields])
    rows = file_rows(base_rows(), mapped)
    groups = [[DAYS[0]], DAYS[1:]] if flat else [[day] for day in DAYS]
    adds, next_row_id = [], 0
    for days in groups:
        day_rows = [r for r in rows if r["event_date"] in days]
        columns = {}
        for f in file_fields:
            values = [r[f["name"]] for r in day_rows]
            if f["name"] == "point":
                x, tag = f["type"]["fields"]
                values = [{physical_name(x): v["x"], physical_name(tag): v["tag"]} for v in values]
            columns[physical_name(f)] = values
        table = pa.table(columns, schema=physical_schema)
        # Spark writes column-mapped tables' files under random prefixes, others' under
        # partition directories.
        if mapped:
            directory_name = uuid.uuid4().hex[:2]
        else:
            directory_name = "" if flat else f"event_date={days[0].isoformat()}"
        relative = os.path.join(directory_name, f"part-00000-{uuid.uuid4()}.c000.snappy.parquet")
        os.makedirs(os.path.dirname(os.path.join(root, relative)), exist_ok=True)
        pq.write_table(table, os.path.join(root, relative))
        values = {} if flat else {physical_name(date_field): days[0].isoformat()}
        event_physical = physical_name(by_name["event_id"])
        stats = {
            "numRecords": len(day_rows),
            "minValues": {event_physical: min(r["event_id"] for r in day_rows)},
            "maxValues": {event_physical: max(r["event_id"] for r in day_rows)},
            "nullCount": {event_physical: 0},
        }
        if flat:
            date_physical = physical_name(date_field)
            stats["minValues"][date_physical] = days[0].isoformat()
            stats["maxValues"][date_physical] = days[-1].isoformat()
            stats["nullCount"][date_physical] = 0
        add = {
            "path": relative,
            "partitionValues": values,
            "size": os.path.getsize(os.path.join(root, relative)),
            "modificationTime": CREATED,
            "dataChange": True,
            "stats": json.dumps(stats),
        }
        if "rt" in flags:
            add["baseRowId"] = next_row_id
            add["defaultRowCommitVersion"] = 1
            next_row_id += len(day_rows)
        adds.append({"add": add})
    commit = [commit_info(1, "WRITE", ict)] + adds
    if "rt" in flags:
        commit.append(domain("delta.rowTracking", {"rowIdHighWaterMark": next_row_id - 1}))
    write_commit(root, 1, commit)

    # Version 2: ALTER TABLE RENAME COLUMN amount TO amount_cents; DROP COLUMN note. The
    # physical names and ids stay; the dropped column stays in the files. Without column
    # mapping, a property change instead.
    renamed = json.loads(json.dumps(schema))
    renamed["fields"] = [f for f in renamed["fields"] if f["name"] != "note"]
    for f in renamed["fields"]:
        if f["name"] == "amount":
            f["name"] = "amount_cents"
    changed = dict(metadata, schemaString=json.dumps(renamed))
    if not mapped:
        changed["configuration"] = dict(configuration, **{"delta.logRetentionDuration": "interval 30 days"})
    write_commit(root, 2, [commit_info(2, "RENAME COLUMN" if mapped else "SET TBLPROPERTIES", ict), {"metaData": changed}])

    if "dv" in flags:
        # Version 3: DELETE of one row of each day of the last file, by a deletion vector.
        last = dict(adds[-1]["add"])
        with_dv = dict(last, deletionVector=inline_vector([1, 5] if flat else [1, 2]))
        remove = {k: last[k] for k in ("path", "partitionValues", "size") if k in last}
        remove.update(deletionTimestamp=CREATED + 180000, dataChange=True, extendedFileMetadata=True)
        for key in ("baseRowId", "defaultRowCommitVersion"):
            if key in last:
                remove[key] = last[key]
        write_commit(root, 3, [commit_info(3, "DELETE", ict), {"remove": remove}, {"add": with_dv}])
    if "v2cp" in flags or "checkpoint" in flags:
        # A checkpoint of the latest version (python deltalake writes it, with the domains and
        # row ids), then the commits it covers cleaned up, as log retention does.
        from deltalake import DeltaTable

        DeltaTable(root).create_checkpoint()
        latest = max(int(n[:20]) for n in os.listdir(log_dir(root)) if n.endswith(".json") and n[:20].isdigit())
        for version in range(latest):
            os.remove(os.path.join(log_dir(root), f"{version:020d}.json"))
    with open(os.path.join(directory, "lakefill.toml"), "w") as f:
        f.write('[tables.t]\nuri = "lake/t"\n')


def append(root, day):
    """Another writer appends event 900 on `day` (an ISO date), as its features ask: physical
    names, the next row ids and high-water mark, an in-commit timestamp a minute after the last."""
    protocol, metadata, _, domains = read_log(root)
    versions = sorted(int(n[:20]) for n in os.listdir(log_dir(root)) if n.endswith(".json"))
    version = versions[-1] + 1
    with open(os.path.join(log_dir(root), f"{versions[-1]:020d}.json")) as f:
        last = json.loads(f.readline()).get("commitInfo", {})
    schema = json.loads(metadata["schemaString"])
    partition_columns = metadata["partitionColumns"]
    date = datetime.date.fromisoformat(day)
    row = {"event_id": 900, "amount_cents": 9000, "point": {"x": 1800, "tag": "p900"}, "event_date": date}
    columns, fields = {}, []
    for field in schema["fields"]:
        if field["name"] in partition_columns:
            continue
        value = row[field["name"]]
        if field["name"] == "point":
            value = {physical_name(f): value[f["name"]] for f in field["type"]["fields"]}
        columns[physical_name(field)] = [value]
        fields.append(arrow_field(field, True))
    relative = f"appended/part-00000-{uuid.uuid4()}.c000.snappy.parquet"
    os.makedirs(os.path.join(root, "appended"), exist_ok=True)
    pq.write_table(pa.table(columns, schema=pa.schema(fields)), os.path.join(root, relative))
    by_name = {f["name"]: f for f in schema["fields"]}
    values = {physical_name(by_name[c]): day for c in partition_columns}
    stats = {"numRecords": 1}
    if not partition_columns:
        date = physical_name(by_name["event_date"])
        stats.update(minValues={date: day}, maxValues={date: day}, nullCount={date: 0})
    add = {
        "path": relative,
        "partitionValues": values,
        "size": os.path.getsize(os.path.join(root, relative)),
        "modificationTime": CREATED,
        "dataChange": True,
        "stats": json.dumps(stats),
    }
    info = {"timestamp": CREATED + 60000 * version, "operation": "WRITE"}
    if "inCommitTimestamp" in last:
        info["inCommitTimestamp"] = last["inCommitTimestamp"] + 60000
    actions = [{"commitInfo": info}, {"add": add}]
    if "rowTracking" in protocol.get("writerFeatures", []):
        mark = domains.get("delta.rowTracking", {}).get("rowIdHighWaterMark", -1)
        add["baseRowId"] = mark + 1
        add["defaultRowCommitVersion"] = version
        actions.append(domain("delta.rowTracking", {"rowIdHighWaterMark": mark + 1}))
    write_commit(root, version, actions)


def strip_mapping(fields):
    for f in fields:
        f["metadata"] = {}
        if isinstance(f["type"], dict):
            strip_mapping(f["type"]["fields"])


def domain(name, configuration):
    return {"domainMetadata": {"domain": name, "configuration": json.dumps(configuration), "removed": False}}


# --- reading tables ---------------------------------------------------------------------------


def text(value):
    if isinstance(value, (datetime.date, datetime.datetime)):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: text(v) for k, v in value.items()}
    return value


def sorted_rows(rows):
    rows = [{k: text(v) for k, v in r.items()} for r in rows]
    return sorted(rows, key=lambda r: (r.get("event_id") is None, r.get("event_id")))


def rows(root, version=None):
    from deltalake import DeltaTable, QueryBuilder

    table = DeltaTable(root, version=version)
    batches = QueryBuilder().register("t", table).execute("SELECT * FROM t").read_all()
    print(json.dumps(sorted_rows(pa.table(batches).to_pylist())))


def polars_rows(root):
    import polars as pl

    print(json.dumps(sorted_rows(pl.read_delta(root).to_dicts())))


def logical(value, field):
    """A file's value of `field` (physical layout) with logical names."""
    if value is None or not isinstance(field["type"], dict):
        return value
    return {f["name"]: logical(value.get(physical_name(f)), f) for f in field["type"]["fields"]}


def physical_name(field):
    return field["metadata"].get("delta.columnMapping.physicalName", field["name"])


def raw(root):
    _, metadata, adds, _ = read_log(root)
    schema = json.loads(metadata["schemaString"])
    mode = metadata["configuration"].get("delta.columnMapping.mode", "none")
    partition_columns = metadata["partitionColumns"]
    out = []
    for add in adds.values():
        table = pq.read_table(os.path.join(root, add["path"]))
        by_id = {}
        for i, f in enumerate(table.schema):
            if f.metadata and b"PARQUET:field_id" in f.metadata:
                by_id[int(f.metadata[b"PARQUET:field_id"])] = table.column(i)
        vector = add.get("deletionVector")
        deleted = deleted_positions(root, vector) if vector else set()
        for index in range(table.num_rows):
            if index in deleted:
                continue
            row = {}
            for field in schema["fields"]:
                meta = field["metadata"]
                physical = physical_name(field)
                if field["name"] in partition_columns:
                    value = add["partitionValues"][physical]
                elif mode == "id":
                    column = by_id.get(meta["delta.columnMapping.id"])
                    value = None if column is None else column[index].as_py()
                elif physical in table.column_names:
                    value = table.column(physical)[index].as_py()
                else:
                    value = None  # a column added after the file was written
                row[field["name"]] = logical(value, field)
            out.append(row)
    print(json.dumps(sorted_rows(out)))


def files(root):
    _, _, adds, _ = read_log(root)

    def describe(field):
        entry = {
            "name": field.name,
            "id": int(field.metadata[b"PARQUET:field_id"]) if field.metadata and b"PARQUET:field_id" in field.metadata else None,
        }
        if pa.types.is_struct(field.type):
            entry["fields"] = [describe(field.type.field(i)) for i in range(field.type.num_fields)]
        return entry

    out = {}
    for path in sorted(adds):
        schema = pq.read_schema(os.path.join(root, path))
        out[path] = [describe(f) for f in schema]
    print(json.dumps(out))


def meta(root):
    protocol, metadata, adds, domains = read_log(root)
    print(
        json.dumps(
            {
                "adds": adds,
                "protocol": protocol,
                "configuration": metadata["configuration"],
                "schema": json.loads(metadata["schemaString"]),
                "partitionColumns": metadata["partitionColumns"],
                "domains": domains,
            }
        )
    )


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "make":
        make(sys.argv[2], sys.argv[3])
    elif command == "rows":
        rows(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else None)
    elif command == "raw":
        raw(sys.argv[2])
    elif command == "append":
        append(sys.argv[2], sys.argv[3])
    elif command == "polars":
        polars_rows(sys.argv[2])
    elif command == "files":
        files(sys.argv[2])
    elif command == "meta":
        meta(sys.argv[2])
    else:
        raise SystemExit(f"unknown command {command}")
    # deltalake's runtime threads can abort the interpreter's shutdown; the work is done.
    sys.stdout.flush()
    os._exit(0)
