//! A DataFusion table over a given list of Parquet files: a run's staged files (the rows a
//! publish would add), or a source's files at its pinned version for a cluster.
//!
//! Staged files are not in the Delta log, so the Delta provider cannot see them. This provider
//! scans exactly the given `add` actions with DataFusion's Parquet source, appending the partition
//! value each `add` carries, through the target table's own object store (so it works the same on
//! local disk and S3). Validation and `diff --run` read staged output through it. A distributed
//! run reads its sources through it too ([`StagedTable::over_files`]): a plain Parquet scan is
//! what a Ballista scheduler can cut into tasks, where delta-rs's scan cannot be shipped.

use std::sync::Arc;

use async_trait::async_trait;
use deltalake::arrow::array::{Array, BooleanArray, RecordBatch};
use deltalake::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use deltalake::datafusion::catalog::Session;
use deltalake::datafusion::catalog::TableProvider;
use deltalake::datafusion::common::Column;
use deltalake::datafusion::common::pruning::PrunableStatistics;
use deltalake::datafusion::common::{DFSchema, Result as DfResult, ScalarValue, Statistics};
use deltalake::datafusion::datasource::TableType;
use deltalake::datafusion::datasource::listing::PartitionedFile;
use deltalake::datafusion::datasource::physical_plan::{
    FileGroup, FileScanConfigBuilder, ParquetSource,
};
use deltalake::datafusion::datasource::source::DataSourceExec;
use deltalake::datafusion::datasource::table_schema::TableSchema;
use deltalake::datafusion::execution::object_store::ObjectStoreUrl;
use deltalake::datafusion::logical_expr::Expr;
use deltalake::datafusion::logical_expr::TableProviderFilterPushDown;
use deltalake::datafusion::physical_optimizer::pruning::PruningPredicateBuilder;
use deltalake::datafusion::physical_plan::ExecutionPlan;
use deltalake::datafusion::physical_plan::empty::EmptyExec;
use deltalake::datafusion::prelude::SessionContext;
use deltalake::kernel::Add;
use deltalake::logstore::object_store::ObjectMeta;
use deltalake::{DeltaTable, ObjectStore};

use crate::error::{Error, Result};
use crate::mapping::ColumnMapping;

/// Scans a set of Parquet files as one table.
#[derive(Debug)]
pub struct StagedTable {
    /// The table's columns, in the table's order.
    schema: SchemaRef,
    /// The columns stored in the files (the table's, without its partition columns).
    file_schema: SchemaRef,
    partition_fields: Vec<Arc<Field>>,
    store_url: ObjectStoreUrl,
    files: Vec<PartitionedFile>,
    /// File groups (tasks) a scan spreads the files over; `None`: the session's partitions.
    groups: Option<usize>,
    /// Where files with a deletion vector have it (the table's store and root), if any has.
    vectors: Option<(Arc<dyn ObjectStore>, url::Url)>,
}

/// A file's deletion vector, attached to it until a scan reads it (the rows it deletes are
/// skipped by a row selection): a file the table keeps, cut by a run.
#[derive(Debug, Clone)]
struct Cut {
    descriptor: deltalake::kernel::DeletionVectorDescriptor,
    /// The file's rows (all of them, deleted or not).
    rows: u64,
    /// With [`StagedTable::register_deleted_as`]: the vector the file had before the cut (`None`:
    /// none); the scan then reads the rows `descriptor` deletes and this one did not, instead of
    /// those it keeps.
    before: Option<Option<deltalake::kernel::DeletionVectorDescriptor>>,
}

impl StagedTable {
    /// [`Self::register_store`], and registers the table itself in `ctx` as `name`.
    pub fn register_as(
        ctx: &SessionContext,
        name: &str,
        target: &DeltaTable,
        table_schema: &Schema,
        partition_columns: &[String],
        adds: &[Add],
        key: &str,
    ) -> Result<()> {
        let table = Self::register_store(ctx, target, table_schema, partition_columns, adds, key)?;
        ctx.register_table(name, table)
            .map_err(|source| Error::Query {
                context: format!("cannot register the staged files as `{name}`"),
                source: Box::new(source),
            })?;
        Ok(())
    }

    /// Registers in `ctx` as `name` the rows a cut deletes: each of `cuts` is a file with its new
    /// deletion vector (as the table keeps it once a run by vectors is published) and the vector
    /// it had before (`None`: none); the table holds the rows the new vector deletes that the old
    /// one did not, read by a row selection (the rest of the file is not decoded into rows). The
    /// change data feed of a run by vectors reads its old side so.
    pub fn register_deleted_as(
        ctx: &SessionContext,
        name: &str,
        target: &DeltaTable,
        (table_schema, partition_columns): (&Schema, &[String]),
        cuts: &[(Add, Option<deltalake::kernel::DeletionVectorDescriptor>)],
        key: &str,
    ) -> Result<()> {
        if let Some((add, _)) = cuts.iter().find(|(add, _)| add.deletion_vector.is_none()) {
            return Err(Error::Internal(format!(
                "`{}` has no deletion vector: it deletes no rows",
                add.path
            )));
        }
        let (adds, before): (Vec<Add>, Vec<_>) = cuts.iter().cloned().unzip();
        let table = Self::register_reading(
            ctx,
            target,
            (table_schema, partition_columns),
            &adds,
            key,
            Some(&before),
        )?;
        ctx.register_table(name, table)
            .map_err(|source| Error::Query {
                context: format!("cannot register the rows the cut files delete as `{name}`"),
                source: Box::new(source),
            })?;
        Ok(())
    }

    /// Builds the table over `adds` of `target` (with the schema `table_schema`, partitioned by
    /// `partition_columns`) and registers the store it reads from in `ctx`.
    ///
    /// `key` names the staged set (a run id); it must be unique within `ctx`.
    ///
    /// Staged files of a column-mapped target name their columns as the target's files do; the
    /// table is then a view that gives them their logical names (and `adds`' partition values
    /// are keyed by logical name, as the journal keeps them).
    pub fn register_store(
        ctx: &SessionContext,
        target: &DeltaTable,
        table_schema: &Schema,
        partition_columns: &[String],
        adds: &[Add],
        key: &str,
    ) -> Result<Arc<dyn TableProvider>> {
        Self::register_reading(
            ctx,
            target,
            (table_schema, partition_columns),
            adds,
            key,
            None,
        )
    }

    /// [`Self::register_store`]; with `before` (the vector each of `adds` had before a cut), the
    /// rows each file's vector deletes that its vector before did not, instead of those it keeps.
    fn register_reading(
        ctx: &SessionContext,
        target: &DeltaTable,
        (table_schema, partition_columns): (&Schema, &[String]),
        adds: &[Add],
        key: &str,
        before: Option<&[Option<deltalake::kernel::DeletionVectorDescriptor>]>,
    ) -> Result<Arc<dyn TableProvider>> {
        let mapping = ColumnMapping::of_table(target)?.with_added(table_schema);
        let table = Self::over_staged(
            ctx,
            target,
            (table_schema, partition_columns),
            (adds, before),
            key,
            &mapping,
        )?;
        if mapping.is_none() {
            return Ok(Arc::new(table));
        }
        let physical = Arc::clone(&table.schema);
        let logical: Vec<Expr> = physical
            .fields()
            .iter()
            .map(|field| {
                let logical = if partition_columns.contains(field.name()) {
                    field.as_ref().clone()
                } else {
                    let name = mapping
                        .columns
                        .iter()
                        .find(|c| c.physical == *field.name())
                        .map_or(field.name().as_str(), |c| c.logical.as_str());
                    table_schema
                        .field_with_name(name)
                        .map_err(|_| {
                            Error::Internal(format!("staged column `{name}` is not in the schema"))
                        })?
                        .clone()
                };
                let column = Expr::Column(Column::new_unqualified(field.name()));
                let value = if logical.data_type() == field.data_type() {
                    column
                } else {
                    crate::mapping::logical_expr(column, logical.data_type())
                };
                Ok(value.alias(logical.name()))
            })
            .collect::<Result<_>>()?;
        let view = ctx
            .read_table(Arc::new(table))
            .and_then(|df| df.select(logical))
            .map_err(|source| Error::Query {
                context: "cannot name the staged files' columns as the table does".into(),
                source: Box::new(source),
            })?;
        Ok(view.into_view())
    }

    /// The table over `adds` (see [`Self::register_store`]), its file columns named as `mapping`
    /// says the files name them.
    fn over_staged(
        ctx: &SessionContext,
        target: &DeltaTable,
        (table_schema, partition_columns): (&Schema, &[String]),
        (adds, before): (
            &[Add],
            Option<&[Option<deltalake::kernel::DeletionVectorDescriptor>]>,
        ),
        key: &str,
        mapping: &ColumnMapping,
    ) -> Result<Self> {
        // Nullable, as staging writes them: validation finds NULLs in NOT NULL columns.
        let nullable = |f: &Field| Arc::new(f.clone().with_nullable(true));
        let partition_fields: Vec<Arc<Field>> = partition_columns
            .iter()
            .map(|column| {
                table_schema
                    .field_with_name(column)
                    .map(nullable)
                    .map_err(|_| {
                        Error::Internal(format!("partition column `{column}` is not in the schema"))
                    })
            })
            .collect::<Result<_>>()?;
        let logical_file_fields: Vec<Arc<Field>> = table_schema
            .fields()
            .iter()
            .filter(|f| !partition_columns.contains(f.name()))
            .map(|f| nullable(f))
            .collect();
        let file_fields: Vec<Arc<Field>> = mapping
            .physical_schema(&Schema::new(logical_file_fields))
            .fields()
            .iter()
            .map(Arc::clone)
            .collect();
        let file_schema = Arc::new(Schema::new(file_fields.clone()));
        let mut all_fields = file_fields;
        all_fields.extend(partition_fields.iter().map(Arc::clone));
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
        ctx.register_object_store(store_url.as_ref(), Arc::clone(&store));

        let mut files = Vec::with_capacity(adds.len());
        for (at, add) in adds.iter().enumerate() {
            let values = partition_fields
                .iter()
                .map(|field| {
                    let raw = add.partition_values.get(field.name()).cloned().flatten();
                    partition_scalar(field.data_type(), raw.as_deref())
                })
                .collect::<Result<Vec<_>>>()?;
            // The path as the object store names it: already encoded, never encoded again.
            let meta = ObjectMeta {
                location: crate::storage::object_path(&add.path),
                last_modified: chrono::DateTime::<chrono::Utc>::from_timestamp_millis(
                    add.modification_time,
                )
                .unwrap_or_default(),
                size: u64::try_from(add.size).unwrap_or(0),
                e_tag: None,
                version: None,
            };
            let file = PartitionedFile::new_from_meta(meta).with_partition_values(values);
            files.push(match &add.deletion_vector {
                None => file,
                Some(descriptor) => {
                    let rows = add
                        .get_stats()
                        .ok()
                        .flatten()
                        .and_then(|stats| u64::try_from(stats.num_records).ok())
                        .ok_or_else(|| {
                            Error::Internal(format!(
                                "`{}` has a deletion vector but no row count in its statistics",
                                add.path
                            ))
                        })?;
                    file.with_extension(Cut {
                        descriptor: descriptor.clone(),
                        rows,
                        before: before.map(|before| before.get(at).cloned().flatten()),
                    })
                }
            });
        }
        let vectors = adds
            .iter()
            .any(|a| a.deletion_vector.is_some())
            .then(|| (Arc::clone(&store), target.table_url().clone()));
        Ok(Self {
            schema,
            file_schema,
            partition_fields,
            store_url,
            files,
            // Two groups let two cores decode at once; order does not matter to any reader.
            groups: Some(2),
            vectors,
        })
    }

    /// The table `schema` (partitioned by `partition_columns`) over `files`, whose paths are
    /// from the root of the store at `store_url` and whose partition values are raw (as the log
    /// writes them); a scan spreads them over the session's partitions.
    pub fn over_files(
        schema: SchemaRef,
        partition_columns: &[String],
        store_url: ObjectStoreUrl,
        files: Vec<PinnedFile>,
    ) -> Result<Self> {
        let partition_fields: Vec<Arc<Field>> = partition_columns
            .iter()
            .map(|column| {
                schema
                    .field_with_name(column)
                    .map(|f| Arc::new(f.clone()))
                    .map_err(|_| {
                        Error::Internal(format!("partition column `{column}` is not in the schema"))
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
        let files = files
            .into_iter()
            .map(|file| {
                let values = partition_fields
                    .iter()
                    .map(|f| {
                        partition_scalar(
                            f.data_type(),
                            file.partition_values
                                .get(f.name())
                                .cloned()
                                .flatten()
                                .as_deref(),
                        )
                    })
                    .collect::<Result<Vec<_>>>()?;
                // The path as the object store names it: already encoded, never encoded again
                // (`PartitionedFile::new` would encode the `%` of an escaped partition value).
                let meta = ObjectMeta {
                    location: file.path,
                    last_modified: chrono::DateTime::<chrono::Utc>::default(),
                    size: file.size,
                    e_tag: None,
                    version: None,
                };
                let pinned = PartitionedFile::new_from_meta(meta).with_partition_values(values);
                // Partition columns' statistics are added from the values (so after them).
                Ok(match file.statistics {
                    Some(statistics) => pinned.with_statistics(Arc::new(statistics)),
                    None => pinned,
                })
            })
            .collect::<Result<_>>()?;
        Ok(Self {
            schema,
            file_schema,
            partition_fields,
            store_url,
            files,
            groups: None,
            vectors: None,
        })
    }

    /// `file` reading only the rows its deletion vector keeps, if it has one (with
    /// [`Cut::before`], only the rows it deletes that the vector before did not).
    async fn without_deleted(&self, file: PartitionedFile) -> DfResult<PartitionedFile> {
        use deltalake::parquet::arrow::arrow_reader::{RowSelection, RowSelector};
        let (Some(cut), Some((store, root))) = (file.extension::<Cut>(), &self.vectors) else {
            return Ok(file);
        };
        let failed = |e: Error| deltalake::datafusion::error::DataFusionError::External(e.into());
        let mut deleted = crate::vectors::deleted_rows(store.as_ref(), root, Some(&cut.descriptor))
            .await
            .map_err(failed)?;
        // Rows kept are selected and rows deleted skipped, or (the rows a cut deletes) the
        // other way round.
        let read_deleted = match &cut.before {
            None => false,
            Some(before) => {
                deleted -= crate::vectors::deleted_rows(store.as_ref(), root, before.as_ref())
                    .await
                    .map_err(failed)?;
                true
            }
        };
        let rows = |deleted: bool, row_count: u64| RowSelector {
            row_count: row_count as usize,
            skip: deleted != read_deleted,
        };
        let mut selectors: Vec<RowSelector> = Vec::new();
        let mut next = 0u64;
        for row in deleted.iter().filter(|row| *row < cut.rows) {
            if row > next {
                selectors.push(rows(false, row - next));
            }
            match selectors.last_mut() {
                // A run of deleted rows is one selector.
                Some(last) if row == next && last.skip != read_deleted => last.row_count += 1,
                _ => selectors.push(rows(true, 1)),
            }
            next = row + 1;
        }
        if cut.rows > next {
            selectors.push(rows(false, cut.rows - next));
        }
        let selection = RowSelection::from(selectors);
        Ok(file.with_extension(
            deltalake::datafusion::datasource::physical_plan::parquet::ParquetRowSelection::new(
                selection,
            ),
        ))
    }
}

/// One file of a table at a pinned version, as the log describes it.

#[derive(Debug)]
pub struct PinnedFile {
    /// The file's path in the store, as the store names it (already encoded).
    pub path: deltalake::Path,
    /// Its size in bytes.
    pub size: u64,
    /// Partition values as the log writes them (text, `None` for NULL).
    pub partition_values: std::collections::HashMap<String, Option<String>>,
    /// The file's statistics for the columns stored in it (in the file schema's order).
    pub statistics: Option<Statistics>,
}

/// A partition value as the log writes it, as a scalar of the column's type.
pub fn partition_scalar(data_type: &DataType, value: Option<&str>) -> Result<ScalarValue> {
    let null = || {
        ScalarValue::try_from(data_type)
            .map_err(|e| Error::Internal(format!("no NULL of type {data_type}: {e}")))
    };
    match value {
        None => null(),
        Some(text) => ScalarValue::Utf8(Some(text.to_string()))
            .cast_to(data_type)
            .map_err(|e| {
                Error::Internal(format!(
                    "partition value `{text}` is not a {data_type}: {e}"
                ))
            }),
    }
}

impl StagedTable {
    /// Whether `filter` reads partition columns only (so it can be decided per file).
    fn on_partitions(&self, filter: &Expr) -> bool {
        let columns = filter.column_refs();
        !columns.is_empty()
            && columns.iter().all(|column| {
                self.partition_fields
                    .iter()
                    .any(|field| field.name() == &column.name)
            })
    }

    /// The files that may hold a row satisfying every filter among `filters`: those whose
    /// partition values satisfy the partition filters ([`Self::by_partition_values`]) and
    /// whose statistics do not rule the other filters out ([`Self::by_statistics`]).
    fn pruned(&self, state: &dyn Session, filters: &[Expr]) -> DfResult<Vec<PartitionedFile>> {
        let (partition, other): (Vec<&Expr>, Vec<&Expr>) =
            filters.iter().partition(|f| self.on_partitions(f));
        let files = self.by_partition_values(state, &partition)?;
        self.by_statistics(state, files, &other)
    }

    /// Of `files`, those whose statistics may satisfy all of `filters` (files without
    /// statistics are kept): DataFusion's pruning predicate over each file's row count, null
    /// counts and exact minimum and maximum, with its partition values as constants.
    fn by_statistics(
        &self,
        state: &dyn Session,
        files: Vec<PartitionedFile>,
        filters: &[&Expr],
    ) -> DfResult<Vec<PartitionedFile>> {
        let Some(predicate) = filters
            .iter()
            .filter(|f| !f.is_volatile())
            .map(|f| (**f).clone())
            .reduce(Expr::and)
        else {
            return Ok(files);
        };
        if files.iter().all(|f| f.statistics.is_none()) {
            return Ok(files);
        }
        // Statistics cover the files' columns, then the partition columns.
        let schema = Arc::new(Schema::new(
            self.file_schema
                .fields()
                .iter()
                .chain(self.partition_fields.iter())
                .map(Arc::clone)
                .collect::<Vec<_>>(),
        ));
        let df_schema = DFSchema::try_from(schema.as_ref().clone())?;
        let predicate = state.create_physical_expr(predicate, &df_schema)?;
        let Some(pruning) = PruningPredicateBuilder::new()
            .with_file_schema(Arc::clone(&schema))
            .build(predicate)
        else {
            // A predicate the pruning cannot express (or always true) keeps every file.
            return Ok(files);
        };
        let statistics = PrunableStatistics::new(
            files
                .iter()
                .map(|f| {
                    f.statistics
                        .clone()
                        .unwrap_or_else(|| Arc::new(Statistics::new_unknown(&schema)))
                })
                .collect(),
            Arc::clone(&schema),
        );
        let keep = pruning.prune(&statistics)?;
        Ok(files
            .into_iter()
            .zip(keep)
            .filter(|(_, kept)| *kept)
            .map(|(file, _)| file)
            .collect())
    }

    /// The files whose partition values may satisfy every filter of `filters` (all on
    /// partition columns): each filter is evaluated once per file, over its partition values; a
    /// file for which one is false or NULL holds no row the query keeps.
    fn by_partition_values(
        &self,
        state: &dyn Session,
        filters: &[&Expr],
    ) -> DfResult<Vec<PartitionedFile>> {
        if filters.is_empty() || self.files.is_empty() {
            return Ok(self.files.clone());
        }
        let schema = Arc::new(Schema::new(self.partition_fields.clone()));
        let columns = (0..self.partition_fields.len())
            .map(|i| {
                ScalarValue::iter_to_array(
                    self.files
                        .iter()
                        .map(|file| file.partition_values[i].clone()),
                )
            })
            .collect::<DfResult<Vec<_>>>()?;
        let values = RecordBatch::try_new(Arc::clone(&schema), columns)?;
        let df_schema = DFSchema::try_from(schema.as_ref().clone())?;
        let mut keep = vec![true; self.files.len()];
        for filter in filters {
            let decided = state
                .create_physical_expr((*filter).clone(), &df_schema)?
                .evaluate(&values)?
                .into_array(self.files.len())?;
            let Some(decided) = decided.as_any().downcast_ref::<BooleanArray>() else {
                continue;
            };
            for (i, kept) in keep.iter_mut().enumerate() {
                *kept &= decided.is_valid(i) && decided.value(i);
            }
        }
        Ok(self
            .files
            .iter()
            .zip(keep)
            .filter(|(_, kept)| *kept)
            .map(|(file, _)| file.clone())
            .collect())
    }
}

#[async_trait]
impl TableProvider for StagedTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> DfResult<Vec<TableProviderFilterPushDown>> {
        // Filters on partition columns prune files by their values, others by the files'
        // statistics where they have some; the rows are filtered again above.
        let statistics = self.files.iter().any(|f| f.statistics.is_some());
        Ok(filters
            .iter()
            .map(|filter| {
                if !filter.is_volatile() && (statistics || self.on_partitions(filter)) {
                    TableProviderFilterPushDown::Inexact
                } else {
                    TableProviderFilterPushDown::Unsupported
                }
            })
            .collect())
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let mut files = self.pruned(state, filters)?;
        if self.vectors.is_some() {
            let mut cut = Vec::with_capacity(files.len());
            for file in files {
                cut.push(self.without_deleted(file).await?);
            }
            files = cut;
        }
        if files.is_empty() {
            let schema = match projection {
                Some(indices) => Arc::new(self.schema.project(indices)?),
                None => Arc::clone(&self.schema),
            };
            return Ok(Arc::new(EmptyExec::new(schema)));
        }
        let table_schema = TableSchema::builder(Arc::clone(&self.file_schema))
            .with_table_partition_cols(self.partition_fields.clone())
            .build();
        // The session's Parquet settings (INT96 read as Spark means it, see
        // `crate::resources::read_as_spark_wrote`): pinned source files may be other writers'.
        let source = Arc::new(ParquetSource::new(table_schema).with_table_parquet_options(
            deltalake::datafusion::config::TableParquetOptions {
                global: state.config().options().execution.parquet.clone(),
                ..Default::default()
            },
        ));
        let count = self
            .groups
            .unwrap_or_else(|| state.config().target_partitions())
            .max(1);
        let mut groups = vec![Vec::new(); count];
        for (i, file) in files.into_iter().enumerate() {
            groups[i % count].push(file);
        }
        let groups: Vec<FileGroup> = groups
            .into_iter()
            .filter(|g| !g.is_empty())
            .map(FileGroup::new)
            .collect();
        // The scan's columns are the files' then the partition columns, whatever the table's
        // order.
        let scan_index = |i: usize| {
            let name = self.schema.field(i).name();
            self.file_schema.index_of(name).unwrap_or_else(|_| {
                self.file_schema.fields().len()
                    + self
                        .partition_fields
                        .iter()
                        .position(|f| f.name() == name)
                        .unwrap_or(0)
            })
        };
        let indices: Vec<usize> = match projection {
            Some(projection) => projection.iter().map(|i| scan_index(*i)).collect(),
            None => (0..self.schema.fields().len()).map(scan_index).collect(),
        };
        let config = FileScanConfigBuilder::new(self.store_url.clone(), source)
            .with_file_groups(groups)
            .with_projection_indices(Some(indices))?
            .with_limit(limit)
            .build();
        Ok(DataSourceExec::from_data_source(config))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pinned_file_keeps_its_encoded_path_and_typed_partition_value() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("tag", DataType::Utf8, true),
        ]));
        // `tag=50%25` is the directory of the value `50%`, as Delta writes it.
        let path = deltalake::Path::parse("lake/t/tag=50%25/part-0.parquet").expect("path");
        let table = StagedTable::over_files(
            schema,
            &["tag".to_string()],
            ObjectStoreUrl::parse("s3://bucket").expect("url"),
            vec![PinnedFile {
                path: path.clone(),
                size: 7,
                partition_values: [("tag".to_string(), Some("50%".to_string()))].into(),
                statistics: None,
            }],
        )
        .expect("table");
        assert_eq!(table.files[0].object_meta.location, path);
        assert_eq!(
            table.files[0].partition_values,
            vec![ScalarValue::Utf8(Some("50%".into()))]
        );
    }
}
