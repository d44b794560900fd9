//! A DataFusion table over a run's staged files: the rows a publish would add.
//!
//! Staged files are not in the Delta log, so the Delta provider cannot see them. This provider
//! scans exactly the given `add` actions with DataFusion's Parquet source, appending the partition
//! value each `add` carries, through the target table's own object store (so it works the same on
//! local disk and S3). Validation and `diff --run` read staged output through it.

use std::sync::Arc;

use async_trait::async_trait;
use deltalake::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use deltalake::datafusion::catalog::Session;
use deltalake::datafusion::catalog::TableProvider;
use deltalake::datafusion::common::{Result as DfResult, ScalarValue};
use deltalake::datafusion::datasource::TableType;
use deltalake::datafusion::datasource::listing::PartitionedFile;
use deltalake::datafusion::datasource::physical_plan::{
    FileGroup, FileScanConfigBuilder, ParquetSource,
};
use deltalake::datafusion::datasource::source::DataSourceExec;
use deltalake::datafusion::datasource::table_schema::TableSchema;
use deltalake::datafusion::execution::object_store::ObjectStoreUrl;
use deltalake::datafusion::logical_expr::Expr;
use deltalake::datafusion::physical_plan::ExecutionPlan;
use deltalake::datafusion::physical_plan::empty::EmptyExec;
use deltalake::datafusion::prelude::SessionContext;
use deltalake::kernel::Add;
use deltalake::{DeltaTable, ObjectStore};

use crate::error::{Error, Result};
use crate::partition::{date_to_days, parse_partition_date};

/// Scans a set of staged files as one table with the target's schema.
#[derive(Debug)]
pub(crate) struct StagedTable {
    schema: SchemaRef,
    file_schema: SchemaRef,
    partition_field: Arc<Field>,
    store_url: ObjectStoreUrl,
    files: Vec<PartitionedFile>,
}

impl StagedTable {
    /// Builds the table over `adds` of `target` and registers the store it reads from in `ctx`.
    ///
    /// `key` names the staged set (a run id); it must be unique within `ctx`.
    pub(crate) fn register_store(
        ctx: &SessionContext,
        target: &DeltaTable,
        partition_column: &str,
        adds: &[Add],
        key: &str,
    ) -> Result<Self> {
        let snapshot = target.snapshot().map_err(|source| Error::Delta {
            context: "cannot read the target's snapshot".into(),
            source: Box::new(source),
        })?;
        let table_schema = snapshot.snapshot().arrow_schema();
        let partition_field = table_schema
            .field_with_name(partition_column)
            .map(|f| Arc::new(f.clone()))
            .map_err(|_| {
                Error::Internal(format!(
                    "partition column `{partition_column}` is not in the schema"
                ))
            })?;
        // Nullable, as staging writes them: validation finds NULLs in NOT NULL columns.
        let file_fields: Vec<Arc<Field>> = table_schema
            .fields()
            .iter()
            .filter(|f| f.name() != partition_column)
            .map(|f| Arc::new(f.as_ref().clone().with_nullable(true)))
            .collect();
        let file_schema = Arc::new(Schema::new(file_fields.clone()));
        let mut all_fields = file_fields;
        all_fields.push(Arc::clone(&partition_field));
        let schema = Arc::new(Schema::new(all_fields));

        // A store per staged set, rooted at the table: `add` paths are relative to the root.
        let host: String = key
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '-'
                }
            })
            .collect();
        let url = format!("lakefill-staged://{host}/");
        let store_url = ObjectStoreUrl::parse(&url)
            .map_err(|e| Error::Internal(format!("store url `{url}`: {e}")))?;
        let store: Arc<dyn ObjectStore> = target.object_store();
        ctx.register_object_store(store_url.as_ref(), store);

        let mut files = Vec::with_capacity(adds.len());
        for add in adds {
            let raw = add
                .partition_values
                .get(partition_column)
                .cloned()
                .flatten();
            let value = partition_scalar(partition_field.data_type(), raw.as_deref())?;
            let size = u64::try_from(add.size).unwrap_or(0);
            files.push(
                PartitionedFile::new(add.path.clone(), size).with_partition_values(vec![value]),
            );
        }
        Ok(Self {
            schema,
            file_schema,
            partition_field,
            store_url,
            files,
        })
    }
}

fn partition_scalar(data_type: &DataType, value: Option<&str>) -> Result<ScalarValue> {
    Ok(match (data_type, value) {
        (DataType::Date32, Some(text)) => ScalarValue::Date32(Some(date_to_days(
            parse_partition_date(text)
                .ok_or_else(|| Error::Internal(format!("`{text}` is not a date")))?,
        ))),
        (DataType::Date32, None) => ScalarValue::Date32(None),
        (_, value) => ScalarValue::Utf8(value.map(str::to_string)),
    })
}

#[async_trait]
impl TableProvider for StagedTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        if self.files.is_empty() {
            let schema = match projection {
                Some(indices) => Arc::new(self.schema.project(indices)?),
                None => Arc::clone(&self.schema),
            };
            return Ok(Arc::new(EmptyExec::new(schema)));
        }
        let table_schema = TableSchema::builder(Arc::clone(&self.file_schema))
            .with_table_partition_cols(vec![Arc::clone(&self.partition_field)])
            .build();
        let source = Arc::new(ParquetSource::new(table_schema));
        // Two groups let two cores decode at once; order does not matter to any reader.
        let mut groups = vec![Vec::new(), Vec::new()];
        for (i, file) in self.files.iter().enumerate() {
            groups[i % 2].push(file.clone());
        }
        let groups: Vec<FileGroup> = groups
            .into_iter()
            .filter(|g| !g.is_empty())
            .map(FileGroup::new)
            .collect();
        let config = FileScanConfigBuilder::new(self.store_url.clone(), source)
            .with_file_groups(groups)
            .with_projection_indices(projection.cloned())?
            .with_limit(limit)
            .build();
        Ok(DataSourceExec::from_data_source(config))
    }
}
