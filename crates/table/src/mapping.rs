//! Column mapping (the Delta protocol's "Column Mapping" feature): the names and Parquet field ids
//! a column-mapped table's files use for its columns.
//!
//! A table with `delta.columnMapping.mode` `name` or `id` keeps each column's *logical* name (the
//! one SQL sees) in its schema and stores the column in its files under a *physical* name
//! (`delta.columnMapping.physicalName`, usually `col-<uuid>`), tagged with a field id
//! (`delta.columnMapping.id`), nested fields too. Partition values and statistics in the log are
//! keyed by physical name. lakefill works in logical names everywhere (models, validation, the
//! journal's staged `add` actions) and applies the mapping at the two edges: where a staged file
//! is written ([`ColumnMapping::physical_schema`], [`ColumnMapping::to_physical`]) and published
//! ([`ColumnMapping::physical_values`]), and where a file of the target is read
//! ([`ColumnMapping::logical_values`], [`ColumnMapping::physical`]). delta-rs reads mapped tables
//! itself; its writer for them is private to it, which is why this file exists.
//!
//! A column a run adds ([`ColumnMapping::with_added`]) gets the next id after
//! `delta.columnMapping.maxColumnId` and a physical name derived from the table's id, the column
//! and the id, so that the writer, validation and publish, in any process, name it alike.

use std::collections::HashMap;
use std::sync::Arc;

use deltalake::DeltaTable;
use deltalake::arrow::array::{ArrayData, RecordBatch, make_array};
use deltalake::arrow::datatypes::{DataType, Field, Fields, Schema, SchemaRef};
use deltalake::datafusion::common::{DataFusionError, Result as DfResult};
use deltalake::datafusion::logical_expr::{
    ColumnarValue, Expr, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::Digest as _;

use crate::error::{DeltaContext, Error, Result};

/// The Arrow field metadata key Parquet writers turn into a field id.
pub const PARQUET_FIELD_ID: &str = "PARQUET:field_id";
/// The table property naming the mode.
pub const MODE_PROPERTY: &str = "delta.columnMapping.mode";
/// The table property holding the highest id given to a column so far.
pub const MAX_ID_PROPERTY: &str = "delta.columnMapping.maxColumnId";
/// Field metadata: a column's id.
pub const ID_KEY: &str = "delta.columnMapping.id";
/// Field metadata: a column's physical name.
pub const PHYSICAL_KEY: &str = "delta.columnMapping.physicalName";

/// How a table maps its columns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MappingMode {
    /// Files use the logical names.
    #[default]
    None,
    /// Files use the physical names.
    Name,
    /// Files use the physical names, and readers find columns by field id.
    Id,
}

/// One column (or nested field) of a mapped table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MappedField {
    /// The name SQL sees.
    pub logical: String,
    /// The name in the files.
    pub physical: String,
    /// The field id.
    pub id: i64,
    /// The fields of a struct (or of the struct an array or map holds).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<MappedField>,
}

/// The names and ids a table's files use for its columns.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ColumnMapping {
    /// The mode.
    pub mode: MappingMode,
    /// The table's columns, in its order (empty without mapping).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub columns: Vec<MappedField>,
    /// The highest id given to a column so far.
    #[serde(default)]
    pub max_column_id: i64,
    /// The table's id (names the columns a run adds).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub table_id: String,
}

impl ColumnMapping {
    /// The mapping of `table` at the version it is loaded at.
    pub fn of_table(table: &DeltaTable) -> Result<Self> {
        let snapshot = table
            .snapshot()
            .delta_context(|| "cannot read the table's snapshot".into())?;
        Self::of_snapshot(snapshot)
    }

    /// The mapping of the table at `snapshot`.
    pub fn of_snapshot(snapshot: &deltalake::table::state::DeltaTableState) -> Result<Self> {
        let metadata = snapshot.metadata();
        Self::of_metadata(
            metadata.schema_string(),
            metadata.configuration(),
            metadata.id(),
        )
    }

    /// The mapping a table's metadata describes: its schema (Delta JSON), its properties and id.
    pub fn of_metadata(
        schema: &str,
        configuration: &HashMap<String, String>,
        table_id: &str,
    ) -> Result<Self> {
        let mode = match configuration.get(MODE_PROPERTY).map(String::as_str) {
            None | Some("none") => return Ok(Self::default()),
            Some("name") => MappingMode::Name,
            Some("id") => MappingMode::Id,
            Some(other) => {
                return Err(Error::Internal(format!(
                    "the table's column mapping mode `{other}` is not one the Delta protocol defines (none, name, id)"
                )));
            }
        };
        let schema: Value = serde_json::from_str(schema)
            .map_err(|e| Error::Internal(format!("the table's schema is not JSON: {e}")))?;
        let columns = mapped_fields(&schema)?;
        let max_column_id = configuration
            .get(MAX_ID_PROPERTY)
            .and_then(|v| v.parse::<i64>().ok())
            .unwrap_or(0)
            .max(max_id(&columns));
        Ok(Self {
            mode,
            columns,
            max_column_id,
            table_id: table_id.to_string(),
        })
    }

    /// Whether files use the logical names (no mapping).
    pub fn is_none(&self) -> bool {
        self.mode == MappingMode::None
    }

    /// The mapping with the columns of `schema` the table does not have yet (a run's added
    /// columns, flat) given the next ids and fresh physical names.
    #[must_use]
    pub fn with_added(mut self, schema: &Schema) -> Self {
        if self.is_none() {
            return self;
        }
        for field in schema.fields() {
            if self.column(field.name()).is_none() {
                self.max_column_id += 1;
                let id = self.max_column_id;
                self.columns.push(MappedField {
                    logical: field.name().clone(),
                    physical: added_physical_name(&self.table_id, field.name(), id),
                    id,
                    fields: Vec::new(),
                });
            }
        }
        self
    }

    /// The mapped column whose logical name is `logical`.
    pub fn column(&self, logical: &str) -> Option<&MappedField> {
        self.columns.iter().find(|c| c.logical == logical)
    }

    /// The name files and the log use for the column `logical`.
    pub fn physical<'a>(&'a self, logical: &'a str) -> &'a str {
        self.column(logical)
            .map_or(logical, |c| c.physical.as_str())
    }

    /// Partition values (or any map keyed by column) as the log keys them, keyed by logical name.
    pub fn logical_values<V>(&self, values: HashMap<String, V>) -> HashMap<String, V> {
        if self.is_none() {
            return values;
        }
        values
            .into_iter()
            .map(|(key, value)| {
                let logical = self
                    .columns
                    .iter()
                    .find(|c| c.physical == key)
                    .map_or(key, |c| c.logical.clone());
                (logical, value)
            })
            .collect()
    }

    /// A file's statistics (the `add` action's JSON text) with their columns keyed by logical
    /// name, nested fields too.
    pub fn logical_stats(&self, stats: String) -> String {
        if self.is_none() {
            return stats;
        }
        let Ok(mut parsed) = serde_json::from_str::<Value>(&stats) else {
            return stats;
        };
        for part in ["minValues", "maxValues", "nullCount"] {
            if let Some(values) = parsed.get_mut(part) {
                rename_keys(values, &self.columns);
            }
        }
        parsed.to_string()
    }

    /// Partition values keyed by logical name, keyed as the log keys them.
    pub fn physical_values<V>(&self, values: HashMap<String, V>) -> HashMap<String, V> {
        if self.is_none() {
            return values;
        }
        values
            .into_iter()
            .map(|(key, value)| (self.physical(&key).to_string(), value))
            .collect()
    }

    /// `schema` (logical) as the files store it: physical names, and each field's id as
    /// `PARQUET:field_id`, nested fields too.
    pub fn physical_schema(&self, schema: &Schema) -> SchemaRef {
        if self.is_none() {
            return Arc::new(schema.clone());
        }
        Arc::new(Schema::new_with_metadata(
            physical_fields(schema.fields(), &self.columns),
            schema.metadata().clone(),
        ))
    }

    /// `batch` (logical) with the schema `physical` ([`Self::physical_schema`] of its schema):
    /// the same buffers under the physical names.
    pub fn to_physical(&self, batch: &RecordBatch, physical: &SchemaRef) -> Result<RecordBatch> {
        if self.is_none() {
            return Ok(batch.clone());
        }
        let columns = batch
            .columns()
            .iter()
            .zip(physical.fields())
            .map(|(column, field)| {
                if column.data_type() == field.data_type() {
                    Ok(Arc::clone(column))
                } else {
                    retype(column.to_data(), field.data_type()).map(make_array)
                }
            })
            .collect::<Result<Vec<_>>>()?;
        RecordBatch::try_new(Arc::clone(physical), columns)
            .map_err(|e| Error::Internal(format!("cannot name the columns as the files do: {e}")))
    }

    /// The Delta schema field (JSON) of the column `logical` with its mapping metadata, for a
    /// column a run adds.
    pub fn field_metadata(&self, logical: &str) -> serde_json::Map<String, Value> {
        let mut metadata = serde_json::Map::new();
        if let Some(column) = self.column(logical).filter(|_| !self.is_none()) {
            metadata.insert(ID_KEY.into(), Value::from(column.id));
            metadata.insert(PHYSICAL_KEY.into(), Value::from(column.physical.clone()));
        }
        metadata
    }
}

/// `column` (of a nested type as the files name its fields) as `logical`, the same type with the
/// logical field names: the same buffers. DataFusion's CAST matches struct fields by name, so
/// it cannot do this.
pub fn logical_expr(column: Expr, logical: &DataType) -> Expr {
    ScalarUDF::from(RenameUdf {
        name: format!("lakefill_logical_{}", logical_type_digest(logical)),
        signature: Signature::any(1, Volatility::Immutable),
        logical: logical.clone(),
    })
    .call(vec![column])
}

fn logical_type_digest(data_type: &DataType) -> String {
    let digest = sha2::Sha256::digest(data_type.to_string().as_bytes());
    hex::encode(&digest[..8])
}

/// The function of [`logical_expr`].
#[derive(Debug, PartialEq, Eq, Hash)]
struct RenameUdf {
    name: String,
    signature: Signature,
    logical: DataType,
}

impl ScalarUDFImpl for RenameUdf {
    fn name(&self) -> &str {
        &self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> DfResult<DataType> {
        Ok(self.logical.clone())
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let [value] = args.args.as_slice() else {
            return Err(DataFusionError::Internal("one argument expected".into()));
        };
        let array = value.to_array(args.number_rows)?;
        let renamed = retype(array.to_data(), &self.logical)
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        Ok(ColumnarValue::Array(make_array(renamed)))
    }
}

/// The keys of `values` (statistics of a struct's fields) renamed from physical to logical.
fn rename_keys(values: &mut Value, mapped: &[MappedField]) {
    let Value::Object(object) = values else {
        return;
    };
    let renamed = std::mem::take(object)
        .into_iter()
        .map(
            |(key, mut value)| match mapped.iter().find(|m| m.physical == key) {
                Some(m) => {
                    rename_keys(&mut value, &m.fields);
                    (m.logical.clone(), value)
                }
                None => (key, value),
            },
        )
        .collect();
    *object = renamed;
}

/// The mapped fields of a Delta struct type (JSON), nested fields too.
fn mapped_fields(struct_type: &Value) -> Result<Vec<MappedField>> {
    let Some(fields) = struct_type["fields"].as_array() else {
        return Ok(Vec::new());
    };
    fields
        .iter()
        .map(|field| {
            let logical = field["name"]
                .as_str()
                .ok_or_else(|| Error::Internal("a field of the table's schema has no name".into()))?
                .to_string();
            let metadata = &field["metadata"];
            let physical = metadata[PHYSICAL_KEY].as_str().ok_or_else(|| {
                Error::Internal(format!(
                    "column `{logical}` of a column-mapped table has no `{PHYSICAL_KEY}`"
                ))
            })?;
            let id = metadata[ID_KEY].as_i64().ok_or_else(|| {
                Error::Internal(format!(
                    "column `{logical}` of a column-mapped table has no `{ID_KEY}`"
                ))
            })?;
            Ok(MappedField {
                logical,
                physical: physical.to_string(),
                id,
                fields: nested_struct(&field["type"])
                    .map(mapped_fields)
                    .transpose()?
                    .unwrap_or_default(),
            })
        })
        .collect()
}

/// The struct a Delta type is or holds (as array elements or map values), if any.
fn nested_struct(data_type: &Value) -> Option<&Value> {
    match data_type["type"].as_str()? {
        "struct" => Some(data_type),
        "array" => nested_struct(&data_type["elementType"]),
        "map" => nested_struct(&data_type["valueType"]),
        _ => None,
    }
}

fn max_id(fields: &[MappedField]) -> i64 {
    fields
        .iter()
        .map(|f| f.id.max(max_id(&f.fields)))
        .max()
        .unwrap_or(0)
}

/// A physical name for a column a run adds: `col-` and a UUID-shaped digest of the table, the
/// column and its id (Spark writes `col-<random uuid>`; readers only need it unique).
fn added_physical_name(table_id: &str, logical: &str, id: i64) -> String {
    let digest = sha2::Sha256::digest(format!("{table_id}\0{logical}\0{id}").as_bytes());
    let mut bytes = [0_u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    format!("col-{}", uuid::Uuid::from_bytes(bytes))
}

/// `fields` (logical) renamed and tagged as `mapped` says; a field it does not know keeps its name.
fn physical_fields(fields: &Fields, mapped: &[MappedField]) -> Vec<Field> {
    fields
        .iter()
        .map(
            |field| match mapped.iter().find(|m| m.logical == *field.name()) {
                Some(m) => {
                    let mut metadata = field.metadata().clone();
                    metadata.insert(PARQUET_FIELD_ID.to_string(), m.id.to_string());
                    Field::new(
                        m.physical.clone(),
                        physical_type(field.data_type(), &m.fields),
                        field.is_nullable(),
                    )
                    .with_metadata(metadata)
                }
                None => field.as_ref().clone(),
            },
        )
        .collect()
}

/// `data_type` with the fields of the structs it is or holds renamed as `mapped` says.
fn physical_type(data_type: &DataType, mapped: &[MappedField]) -> DataType {
    let element = |field: &Arc<Field>| {
        Arc::new(
            field
                .as_ref()
                .clone()
                .with_data_type(physical_type(field.data_type(), mapped)),
        )
    };
    match data_type {
        DataType::Struct(fields) => DataType::Struct(physical_fields(fields, mapped).into()),
        DataType::List(field) => DataType::List(element(field)),
        DataType::LargeList(field) => DataType::LargeList(element(field)),
        DataType::Map(entries, sorted) => {
            // The entries' value holds the mapped struct; the key keeps its type.
            let DataType::Struct(kv) = entries.data_type() else {
                return data_type.clone();
            };
            let renamed: Vec<Field> = kv
                .iter()
                .enumerate()
                .map(|(i, f)| {
                    let field = f.as_ref().clone();
                    if i == 1 {
                        let data_type = physical_type(f.data_type(), mapped);
                        field.with_data_type(data_type)
                    } else {
                        field
                    }
                })
                .collect();
            DataType::Map(
                Arc::new(
                    entries
                        .as_ref()
                        .clone()
                        .with_data_type(DataType::Struct(renamed.into())),
                ),
                *sorted,
            )
        }
        other => other.clone(),
    }
}

/// `column` with the type `to`, which differs from its own only in the names (and metadata) of
/// nested fields: the same buffers. An old file's nested column read as the table's.
pub fn renamed(
    column: &deltalake::arrow::array::ArrayRef,
    to: &DataType,
) -> Result<deltalake::arrow::array::ArrayRef> {
    retype(column.to_data(), to).map(make_array)
}

/// `data` with the type `to`, which differs only in the names of nested fields: the same buffers.
fn retype(data: ArrayData, to: &DataType) -> Result<ArrayData> {
    if data.data_type() == to {
        return Ok(data);
    }
    let children: Vec<ArrayData> = match to {
        DataType::Struct(fields) => data
            .child_data()
            .iter()
            .zip(fields.iter())
            .map(|(child, field)| retype(child.clone(), field.data_type()))
            .collect::<Result<_>>()?,
        DataType::List(field) | DataType::LargeList(field) | DataType::Map(field, _) => data
            .child_data()
            .iter()
            .map(|child| retype(child.clone(), field.data_type()))
            .collect::<Result<_>>()?,
        _ => data.child_data().to_vec(),
    };
    data.into_builder()
        .data_type(to.clone())
        .child_data(children)
        .build()
        .map_err(|e| Error::Internal(format!("cannot rename nested fields: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::arrow::array::{Array, AsArray, Int64Array, StringArray, StructArray};

    fn mapped() -> ColumnMapping {
        let schema = serde_json::json!({
            "type": "struct",
            "fields": [
                {"name": "id", "type": "long", "nullable": true,
                 "metadata": {ID_KEY: 1, PHYSICAL_KEY: "col-a"}},
                {"name": "point", "type": {"type": "struct", "fields": [
                    {"name": "x", "type": "string", "nullable": true,
                     "metadata": {ID_KEY: 3, PHYSICAL_KEY: "col-x"}}]},
                 "nullable": true, "metadata": {ID_KEY: 2, PHYSICAL_KEY: "col-p"}},
            ]
        });
        let configuration = HashMap::from([
            (MODE_PROPERTY.to_string(), "id".to_string()),
            (MAX_ID_PROPERTY.to_string(), "5".to_string()),
        ]);
        ColumnMapping::of_metadata(&schema.to_string(), &configuration, "t").unwrap()
    }

    #[test]
    fn nested_fields_are_renamed_and_tagged_with_their_ids() {
        let mapping = mapped();
        assert_eq!(mapping.max_column_id, 5);
        let point = DataType::Struct(vec![Field::new("x", DataType::Utf8, true)].into());
        let logical = Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("point", point.clone(), true),
        ]);
        let physical = mapping.physical_schema(&logical);
        assert_eq!(physical.field(0).name(), "col-a");
        assert_eq!(physical.field(0).metadata()[PARQUET_FIELD_ID], "1");
        let DataType::Struct(inner) = physical.field(1).data_type() else {
            panic!("not a struct")
        };
        assert_eq!(inner[0].name(), "col-x");
        assert_eq!(inner[0].metadata()[PARQUET_FIELD_ID], "3");

        let points = StructArray::from(vec![(
            Arc::new(Field::new("x", DataType::Utf8, true)),
            Arc::new(StringArray::from(vec!["a", "b"])) as _,
        )]);
        let batch = RecordBatch::try_new(
            Arc::new(logical),
            vec![Arc::new(Int64Array::from(vec![1, 2])), Arc::new(points)],
        )
        .unwrap();
        let renamed = mapping.to_physical(&batch, &physical).unwrap();
        let inner = renamed.column(1).as_struct();
        assert_eq!(inner.column_names(), vec!["col-x"]);
        assert_eq!(inner.column(0).as_string::<i32>().value(1), "b");
        assert_eq!(renamed.column(0).len(), 2);
    }

    #[test]
    fn an_added_column_gets_the_next_id_and_the_same_name_every_time() {
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("extra", DataType::Int64, true),
        ]);
        let once = mapped().with_added(&schema);
        let again = mapped().with_added(&schema);
        let extra = once.column("extra").unwrap();
        assert_eq!(extra.id, 6);
        assert_eq!(once.max_column_id, 6);
        assert!(extra.physical.starts_with("col-"));
        assert_eq!(once, again);
        let values = HashMap::from([("col-a".to_string(), 1)]);
        assert_eq!(once.logical_values(values.clone())["id"], 1);
        assert_eq!(
            once.physical_values(once.logical_values(values.clone())),
            values
        );
    }
}
