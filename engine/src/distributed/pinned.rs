//! A source table at its pinned version as a plain Parquet scan of exactly the files of that
//! version: what a Ballista scheduler can cut into tasks and ship to executors (delta-rs's own
//! scan node cannot be serialized).
//!
//! The files come from the log (path, size, partition values as per-file constants); nothing is
//! listed. A filter on partition columns (the batch window) prunes the files here, on the client,
//! and stays in the plan above the scan for the rows.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion_datasource::TableSchema;
use deltalake::DeltaTable;
use deltalake::arrow::array::{Array, ArrayRef, RecordBatch};
use deltalake::arrow::datatypes::{Field, FieldRef, Schema, SchemaRef};
use deltalake::datafusion::catalog::{Session, TableProvider};
use deltalake::datafusion::common::{DFSchema, ScalarValue};
use deltalake::datafusion::datasource::TableType;
use deltalake::datafusion::datasource::listing::PartitionedFile;
use deltalake::datafusion::datasource::physical_plan::{
    FileGroup, FileScanConfigBuilder, ParquetSource,
};
use deltalake::datafusion::datasource::source::DataSourceExec;
use deltalake::datafusion::execution::object_store::ObjectStoreUrl;
use deltalake::datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use deltalake::datafusion::physical_plan::ExecutionPlan;

use crate::error::{DeltaContext, Error, Result};

/// One file of the pinned version.
#[derive(Debug, Clone)]
struct PinnedFile {
    /// The object path from the store's root (the table's path included).
    path: String,
    size: u64,
    /// Typed, in the order of [`PinnedFiles::partition_fields`].
    partition_values: Vec<ScalarValue>,
}

/// A source at its pinned version as a Parquet scan of its files.
#[derive(Debug)]
pub(crate) struct PinnedFiles {
    /// The table's columns in the table's order.
    schema: SchemaRef,
    /// The columns stored in the files (the table's, without its partition columns).
    file_schema: SchemaRef,
    partition_fields: Vec<FieldRef>,
    store_url: ObjectStoreUrl,
    files: Vec<PinnedFile>,
}

impl PinnedFiles {
    /// The files of `table` at the version it is loaded at. `name` is the source's name (for
    /// errors).
    pub(crate) fn of(name: &str, table: &DeltaTable) -> Result<Self> {
        let snapshot = table
            .snapshot()
            .delta_context(|| format!("cannot read the snapshot of source `{name}`"))?;
        let refuse = |what: &str| Error::InvalidOption {
            option: "--engine".into(),
            value: "df://…".into(),
            message: format!(
                "source `{name}` {what}, which a distributed run cannot read yet; run it with `--engine local`"
            ),
        };
        let mode = snapshot
            .metadata()
            .configuration()
            .get("delta.columnMapping.mode")
            .cloned()
            .unwrap_or_else(|| "none".into());
        if mode != "none" {
            return Err(refuse(&format!("uses column mapping (mode `{mode}`)")));
        }
        let schema = snapshot.snapshot().arrow_schema();
        let partition_columns = snapshot.metadata().partition_columns().to_vec();
        let partition_fields: Vec<FieldRef> = partition_columns
            .iter()
            .map(|c| {
                schema
                    .field_with_name(c)
                    .map(|f| Arc::new(f.clone()))
                    .map_err(|_| {
                        Error::Internal(format!(
                            "partition column `{c}` of source `{name}` is not in its schema"
                        ))
                    })
            })
            .collect::<Result<_>>()?;
        let file_schema = Arc::new(Schema::new(
            schema
                .fields()
                .iter()
                .filter(|f| !partition_columns.contains(f.name()))
                .map(Arc::clone)
                .collect::<Vec<_>>(),
        ));
        let url = table.table_url();
        let store_url = ObjectStoreUrl::parse(format!(
            "{}://{}",
            url.scheme(),
            &url[url::Position::BeforeHost..url::Position::AfterPort]
        ))
        .map_err(|e| Error::Internal(format!("cannot name the store of `{url}`: {e}")))?;
        let root = deltalake::Path::from_url_path(url.path())
            .map_err(|e| Error::Internal(format!("cannot read the path of `{url}`: {e}")))?;
        let mut files = Vec::new();
        for file in snapshot.log_data().iter() {
            if file.deletion_vector_descriptor().is_some() {
                return Err(refuse("has deleted rows (deletion vectors)"));
            }
            let raw = file.partition_values_map();
            let partition_values = partition_fields
                .iter()
                .map(|field| match raw.get(field.name()).cloned().flatten() {
                    None => ScalarValue::try_from(field.data_type()),
                    Some(text) => ScalarValue::try_from_string(text, field.data_type()),
                })
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| {
                    Error::Internal(format!(
                        "cannot read a partition value of `{}` in source `{name}`: {e}",
                        file.path()
                    ))
                })?;
            let relative = file.object_store_path();
            let path = root
                .parts()
                .chain(relative.parts())
                .collect::<deltalake::Path>();
            files.push(PinnedFile {
                path: path.to_string(),
                size: u64::try_from(file.size()).unwrap_or(0),
                partition_values,
            });
        }
        Ok(Self {
            schema,
            file_schema,
            partition_fields,
            store_url,
            files,
        })
    }

    /// The files whose partition values can satisfy every filter that reads only partition
    /// columns.
    fn pruned(&self, state: &dyn Session, filters: &[Expr]) -> Result<Vec<&PinnedFile>> {
        let names: Vec<&str> = self
            .partition_fields
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        let on_partitions: Vec<&Expr> = filters
            .iter()
            .filter(|f| {
                let columns = f.column_refs();
                !columns.is_empty() && columns.iter().all(|c| names.contains(&c.name.as_str()))
            })
            .collect();
        if on_partitions.is_empty() || self.files.is_empty() {
            return Ok(self.files.iter().collect());
        }
        let schema = Arc::new(Schema::new(
            self.partition_fields
                .iter()
                .map(|f| Field::new(f.name(), f.data_type().clone(), true))
                .collect::<Vec<_>>(),
        ));
        let columns: Vec<ArrayRef> = (0..self.partition_fields.len())
            .map(|i| {
                ScalarValue::iter_to_array(self.files.iter().map(|f| f.partition_values[i].clone()))
            })
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| Error::Internal(format!("cannot tabulate partition values: {e}")))?;
        let values = RecordBatch::try_new(Arc::clone(&schema), columns)
            .map_err(|e| Error::Internal(format!("cannot tabulate partition values: {e}")))?;
        let df_schema = DFSchema::try_from(schema.as_ref().clone())
            .map_err(|e| Error::Internal(format!("cannot tabulate partition values: {e}")))?;
        let mut keep = vec![true; self.files.len()];
        for filter in on_partitions {
            let evaluated = state
                .create_physical_expr(filter.clone(), &df_schema)
                .and_then(|e| e.evaluate(&values))
                .and_then(|v| v.into_array(values.num_rows()))
                .map_err(|e| Error::Internal(format!("cannot prune files by `{filter}`: {e}")))?;
            let Some(mask) = evaluated
                .as_any()
                .downcast_ref::<deltalake::arrow::array::BooleanArray>()
            else {
                continue;
            };
            for (i, keep) in keep.iter_mut().enumerate() {
                // NULL is not true: no row of that file passes the filter above the scan.
                *keep &= mask.is_valid(i) && mask.value(i);
            }
        }
        Ok(self
            .files
            .iter()
            .zip(keep)
            .filter_map(|(f, k)| k.then_some(f))
            .collect())
    }
}

#[async_trait]
impl TableProvider for PinnedFiles {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> deltalake::datafusion::common::Result<Vec<TableProviderFilterPushDown>> {
        // Used to prune files; the rows are filtered above the scan all the same.
        Ok(vec![TableProviderFilterPushDown::Inexact; filters.len()])
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> deltalake::datafusion::common::Result<Arc<dyn ExecutionPlan>> {
        let files = self
            .pruned(state, filters)
            .map_err(|e| deltalake::datafusion::error::DataFusionError::External(Box::new(e)))?;
        // Spread the files over the session's partitions (each a task on the cluster), largest
        // first onto the lightest group.
        let groups = state.config().target_partitions().max(1);
        let mut sorted = files;
        sorted.sort_by_key(|f| std::cmp::Reverse(f.size));
        let mut buckets: Vec<(u64, Vec<PartitionedFile>)> = vec![(0, Vec::new()); groups];
        for file in sorted {
            let lightest = buckets
                .iter_mut()
                .min_by_key(|(bytes, _)| *bytes)
                .expect("at least one group");
            lightest.0 += file.size;
            lightest.1.push(
                PartitionedFile::new(file.path.clone(), file.size)
                    .with_partition_values(file.partition_values.clone()),
            );
        }
        let file_groups: Vec<FileGroup> = buckets
            .into_iter()
            .filter(|(_, files)| !files.is_empty())
            .map(|(_, files)| FileGroup::new(files))
            .collect();
        let table_schema = TableSchema::builder(Arc::clone(&self.file_schema))
            .with_table_partition_cols(self.partition_fields.clone())
            .build();
        // The scan's columns are the files' then the partition columns: map the table's order.
        let scan_index = |i: usize| -> usize {
            let name = self.schema.field(i).name();
            match self.file_schema.index_of(name) {
                Ok(index) => index,
                Err(_) => {
                    self.file_schema.fields().len()
                        + self
                            .partition_fields
                            .iter()
                            .position(|f| f.name() == name)
                            .unwrap_or(0)
                }
            }
        };
        let indices: Vec<usize> = match projection {
            Some(projection) => projection.iter().map(|i| scan_index(*i)).collect(),
            None => (0..self.schema.fields().len()).map(scan_index).collect(),
        };
        let source = Arc::new(ParquetSource::new(table_schema));
        let config = FileScanConfigBuilder::new(self.store_url.clone(), source)
            .with_file_groups(file_groups)
            .with_projection_indices(Some(indices))?
            .with_limit(limit)
            .build();
        Ok(DataSourceExec::from_data_source(config))
    }
}
