"""Registers tables in moto's Glue Data Catalog the way the writers teams use register them.

    glue.py ENDPOINT register DATABASE TABLE LOCATION KIND

KIND says how the table is registered:
- `athena`: the storage descriptor's location, and the parameter `table_type = DELTA` (Athena,
  Glue crawlers, delta-rs' own writers);
- `spark`: as Spark's Hive catalog keeps a data-source table: a placeholder location
  (`<location>-__PLACEHOLDER__`), the real one in the serde parameter `path`, and
  `spark.sql.sources.provider = delta`;
- `iceberg`: an Iceberg table (`table_type = ICEBERG`) at the location;
- `nolocation`: a Delta table with no location.

Credentials and region are moto's test ones, as in the project files of the tests.
"""

import sys

import boto3

endpoint, command, database, table, location, kind = sys.argv[1:7]
assert command == "register", command
glue = boto3.client(
    "glue",
    endpoint_url=endpoint,
    region_name="us-east-1",
    aws_access_key_id="lakefill-test",
    aws_secret_access_key="unused-by-moto",
)
try:
    glue.create_database(DatabaseInput={"Name": database})
except glue.exceptions.AlreadyExistsException:
    pass

descriptor = {"Location": location, "Columns": []}
parameters = {}
if kind == "athena":
    parameters = {"table_type": "DELTA"}
elif kind == "spark":
    descriptor = {
        "Location": location.rstrip("/") + "-__PLACEHOLDER__",
        "SerdeInfo": {"Parameters": {"path": location, "serialization.format": "1"}},
        "Columns": [],
    }
    parameters = {"spark.sql.sources.provider": "delta", "EXTERNAL": "TRUE"}
elif kind == "iceberg":
    parameters = {"table_type": "ICEBERG"}
elif kind == "nolocation":
    descriptor = {"Columns": []}
    parameters = {"table_type": "DELTA"}
else:
    raise SystemExit(f"unknown kind {kind}")

glue.create_table(
    DatabaseName=database,
    TableInput={
        "Name": table,
        "TableType": "EXTERNAL_TABLE",
        "StorageDescriptor": descriptor,
        "Parameters": parameters,
    },
)
