//! A source table at its pinned version as a plain Parquet scan of exactly the files of that
//! version: what a Ballista scheduler can cut into tasks and ship to executors (delta-rs's own
//! scan node cannot be serialized).
//!
//! The files come from the log (path, size, partition values as per-file constants); nothing is
//! listed, so an executor never sees an uncommitted or removed file. A filter on partition
//! columns (the batch window) prunes the files on the client and stays in the plan above the
//! scan for the rows (see [`StagedTable`]).

use std::sync::Arc;

use deltalake::DeltaTable;
use deltalake::arrow::array::{Array, ArrayRef, AsArray};
use deltalake::arrow::datatypes::{DataType, FieldRef, UInt64Type};
use deltalake::datafusion::common::pruning::PruningStatistics;
use deltalake::datafusion::common::stats::Precision;
use deltalake::datafusion::common::{Column, ColumnStatistics, ScalarValue, Statistics};
use deltalake::kernel::LogDataHandler;

use lakefill_table::error::{DeltaContext, Error, Result};
use lakefill_table::staged::{PinnedFile, StagedTable};

/// Refuses a source a plain Parquet scan would read wrongly: deleted rows (deletion vectors) and
/// column mapping (the files' column names are not the table's). `name` is the source's name;
/// `engine` the cluster (both for errors).
pub(crate) fn check_source(name: &str, table: &DeltaTable, engine: &str) -> Result<()> {
    let snapshot = table
        .snapshot()
        .delta_context(|| format!("cannot read the snapshot of source `{name}`"))?;
    let refuse = |what: String| Error::InvalidOption {
        option: "--engine".into(),
        value: engine.into(),
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
        return Err(refuse(format!("uses column mapping (mode `{mode}`)")));
    }
    if snapshot
        .log_data()
        .iter()
        .any(|file| file.deletion_vector_descriptor().is_some())
    {
        return Err(refuse("has deleted rows (deletion vectors)".into()));
    }
    Ok(())
}

/// The files of `table` at the version it is loaded at, as a table the cluster can scan (a
/// source [`check_source`] accepted; `name` is its name, for errors). Each file carries the
/// statistics the log holds for it ([`log_statistics`]), so filters of the model prune files on
/// the client and on the executors before a footer is read.
pub(crate) fn pinned_source(name: &str, table: &DeltaTable) -> Result<StagedTable> {
    let snapshot = table
        .snapshot()
        .delta_context(|| format!("cannot read the snapshot of source `{name}`"))?;
    let (store_url, root) = super::store_location(table.table_url())?;
    let schema = snapshot.snapshot().arrow_schema();
    let partition_columns = snapshot.metadata().partition_columns();
    let log = snapshot.log_data();
    let file_fields: Vec<FieldRef> = schema
        .fields()
        .iter()
        .filter(|f| !partition_columns.contains(f.name()))
        .map(Arc::clone)
        .collect();
    let mut statistics = log_statistics(&log, &file_fields).into_iter();
    let files = log
        .iter()
        .map(|file| {
            let path: deltalake::Path = root
                .parts()
                .chain(file.object_store_path().parts())
                .collect();
            PinnedFile {
                path,
                size: u64::try_from(file.size()).unwrap_or(0),
                partition_values: file.partition_values_map(),
                statistics: statistics.next(),
            }
        })
        .collect();
    StagedTable::over_files(schema, partition_columns, store_url, files)
}

/// Whether the log's minimum and maximum of a column of this type are exact bounds of the
/// file's values, as pruning needs them. Not for strings and binaries (writers truncate them),
/// timestamps (stored in milliseconds, so a maximum can be below the file's largest value) or
/// floats (NaN is left out of the statistics but compares above every number).
fn exact_bounds(data_type: &DataType) -> bool {
    data_type.is_integer()
        || matches!(
            data_type,
            DataType::Date32 | DataType::Boolean | DataType::Decimal128(..)
        )
}

/// Per file of `log` (in its order), the statistics the log holds for the columns `fields`
/// (the table's columns stored in the files): row count, null counts, and minimum and maximum
/// where [`exact_bounds`]. What the log does not hold is left unknown, which keeps the file.
fn log_statistics(log: &LogDataHandler<'_>, fields: &[FieldRef]) -> Vec<Statistics> {
    let count = log.num_containers();
    let as_u64 = |array: Option<ArrayRef>| {
        array
            .and_then(|a| deltalake::arrow::compute::cast(&a, &DataType::UInt64).ok())
            .filter(|a| a.len() == count)
    };
    let exact_count = |array: &Option<ArrayRef>, i: usize| match array {
        Some(a) if a.is_valid(i) => {
            let value = a.as_primitive::<UInt64Type>().value(i);
            usize::try_from(value).map_or(Precision::Absent, Precision::Exact)
        }
        _ => Precision::Absent,
    };
    // Per file: `row_counts` of the log's pruning statistics finds no count in delta-rs 1.1.
    let rows: Vec<Precision<usize>> = log
        .iter()
        .map(|file| {
            file.num_records()
                .map_or(Precision::Absent, Precision::Exact)
        })
        .collect();
    let columns: Vec<_> = fields
        .iter()
        .map(|field| {
            let column = Column::new_unqualified(field.name());
            let bound = |array: Option<ArrayRef>| {
                array.filter(|a| {
                    exact_bounds(field.data_type())
                        && a.len() == count
                        && a.data_type() == field.data_type()
                })
            };
            (
                as_u64(log.null_counts(&column)),
                bound(log.min_values(&column)),
                bound(log.max_values(&column)),
            )
        })
        .collect();
    // A bound the log holds; a file whose values are all NULL has none, which is exact too (a
    // typed NULL, so the pruning sees the column's type).
    let bound = |array: &Option<ArrayRef>, i: usize, all_null: bool| match array {
        Some(a) if a.is_valid(i) => {
            ScalarValue::try_from_array(a, i).map_or(Precision::Absent, Precision::Exact)
        }
        Some(a) if all_null => {
            ScalarValue::try_from(a.data_type()).map_or(Precision::Absent, Precision::Exact)
        }
        _ => Precision::Absent,
    };
    (0..count)
        .map(|i| {
            let num_rows = rows.get(i).cloned().unwrap_or(Precision::Absent);
            Statistics {
                num_rows,
                total_byte_size: Precision::Absent,
                column_statistics: columns
                    .iter()
                    .map(|(nulls, min, max)| {
                        let null_count = exact_count(nulls, i);
                        let all_null = matches!(
                            (null_count, num_rows),
                            (Precision::Exact(n), Precision::Exact(r)) if n == r
                        );
                        ColumnStatistics {
                            null_count,
                            min_value: bound(min, i, all_null),
                            max_value: bound(max, i, all_null),
                            ..ColumnStatistics::new_unknown()
                        }
                    })
                    .collect(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use deltalake::arrow::array::{Float64Array, Int64Array, RecordBatch};
    use deltalake::arrow::datatypes::{Field, Schema};
    use deltalake::datafusion::catalog::TableProvider as _;

    use deltalake::datafusion::datasource::source::DataSourceExec;
    use deltalake::datafusion::logical_expr::{col, lit};
    use deltalake::datafusion::prelude::SessionContext;
    use deltalake::protocol::SaveMode;

    use super::*;

    /// Appends one file of (`id`, `f`) rows.
    async fn append(table: DeltaTable, ids: Vec<Option<i64>>, fs: Vec<f64>) -> DeltaTable {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("f", DataType::Float64, true),
        ]));
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(ids)),
                Arc::new(Float64Array::from(fs)),
            ],
        )
        .expect("batch");
        table
            .write(vec![batch])
            .with_save_mode(SaveMode::Append)
            .await
            .expect("write")
    }

    /// How many files a scan of `source` with `filters` reads.
    async fn files_read(
        source: &StagedTable,
        filters: &[deltalake::datafusion::prelude::Expr],
    ) -> usize {
        let ctx = SessionContext::new();
        let plan = source
            .scan(&ctx.state(), None, filters, None)
            .await
            .expect("scan");
        plan.downcast_ref::<DataSourceExec>()
            .and_then(|exec| exec.downcast_to_file_source::<deltalake::datafusion::datasource::physical_plan::ParquetSource>().map(|(config, _)| config))
            .map_or(0, |config| {
                config.file_groups.iter().map(|g| g.files().len()).sum()
            })
    }

    #[tokio::test]
    async fn the_log_statistics_prune_only_files_a_filter_rules_out() {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = url::Url::from_directory_path(dir.path()).expect("url");
        let table = DeltaTable::try_from_url(url).await.expect("table");
        // Three files: ids 0..10 with a NaN among floats in [1, 3]; ids 100..110; ids all NULL.
        let mut fs: Vec<f64> = (0..10).map(|i| 1.0 + f64::from(i) / 5.0).collect();
        fs[4] = f64::NAN;
        let table = append(table, (0..10).map(Some).collect(), fs).await;
        let table = append(table, (100..110).map(Some).collect(), vec![2.0; 10]).await;
        let table = append(table, vec![None; 4], vec![2.0; 4]).await;
        let source = pinned_source("s", &table).expect("pinned");

        assert_eq!(files_read(&source, &[]).await, 3);
        // Only the second file can hold an id of 100 or more (the third has no id at all).
        assert_eq!(
            files_read(&source, &[col("id").gt_eq(lit(100_i64))]).await,
            1
        );
        assert_eq!(files_read(&source, &[col("id").lt(lit(0_i64))]).await, 0);
        assert_eq!(files_read(&source, &[col("id").is_null()]).await, 1);
        // Float bounds leave NaN out (and NaN compares above every number), so the log's are
        // not used.
        assert_eq!(files_read(&source, &[col("f").gt(lit(5.0_f64))]).await, 3);

        let ctx = SessionContext::new();
        ctx.register_table("s", Arc::new(source)).expect("register");
        for (sql, expected) in [
            ("SELECT count(*) FROM s WHERE id >= 100", 10),
            ("SELECT count(*) FROM s WHERE id BETWEEN 5 AND 104", 10),
            ("SELECT count(*) FROM s WHERE id IS NULL", 4),
        ] {
            let batches = ctx
                .sql(sql)
                .await
                .expect("sql")
                .collect()
                .await
                .expect("collect");
            let count = batches[0]
                .column(0)
                .as_primitive::<deltalake::arrow::datatypes::Int64Type>()
                .value(0);
            assert_eq!(count, expected, "{sql}");
        }
    }
}
