//! Writing a run's change data feed: the rows of [`lakefill_validate::feed::change_rows`] into
//! change data files under `_change_data/lakefill-<run_id>/<partition dir>/`, as the Delta
//! protocol's `cdc` actions describe them (partition columns in the path and the action, not in
//! the file; `_change_type` a column of the file). Like staged files, they are invisible until
//! the run's commit names them, and all of a run's are under one directory of its own.

use std::collections::BTreeMap;
use std::sync::Arc;

use delta_kernel::expressions::Scalar;
use delta_kernel::table_properties::DataSkippingNumIndexedCols;
use deltalake::Path;
use deltalake::arrow::array::{Array, AsArray, RecordBatch, UInt32Array};
use deltalake::arrow::compute::take;
use deltalake::arrow::datatypes::SchemaRef;
use deltalake::datafile::writer::{PartitionWriter, PartitionWriterConfig};
use deltalake::datafusion::execution::SendableRecordBatchStream;
use deltalake::kernel::AddCDCFile;
use deltalake::kernel::scalars::ScalarExt as _;
use deltalake::parquet::basic::Compression;
use deltalake::parquet::file::properties::WriterProperties;
use futures::StreamExt;
use indexmap::IndexMap;

use lakefill_table::error::{DeltaContext, Error, QueryContext, Result};
use lakefill_table::mapping::ColumnMapping;
use lakefill_table::partition::{Layout, PartitionValues};
use lakefill_table::run_id::RunId;
use lakefill_validate::feed::{CHANGE_TYPE, FeedCounts};

mod whole;

pub use whole::{WholeCopy, WholeSide};

/// Partition writers open at once; the least recently written is closed beyond it (a partition
/// may then get more than one file), which bounds memory whatever the order of the rows.
const OPEN_WRITERS: usize = 16;

/// What writing a feed produced: its files (partition values keyed by logical name) and the
/// rows of each change type.
#[derive(Debug, Default)]
pub struct FeedWritten {
    /// The change data files.
    pub files: Vec<AddCDCFile>,
    /// Rows of each change type.
    pub counts: FeedCounts,
}

/// [`write_feed`] of each of `streams` (the partitions of one plan's output) at once, each on a
/// task of its own, so that encoding the feed uses every core.
pub async fn write_feed_parallel(
    streams: Vec<SendableRecordBatchStream>,
    table: &str,
    layout: &Layout,
    mapping: &ColumnMapping,
    run_id: &RunId,
    store: Arc<dyn deltalake::ObjectStore>,
) -> Result<FeedWritten> {
    let mut tasks = tokio::task::JoinSet::new();
    for stream in streams {
        let (table, layout, mapping, run_id, store) = (
            table.to_string(),
            layout.clone(),
            mapping.clone(),
            run_id.clone(),
            Arc::clone(&store),
        );
        tasks.spawn(
            async move { write_feed(stream, &table, &layout, &mapping, &run_id, store).await },
        );
    }
    let mut all = FeedWritten::default();
    while let Some(joined) = tasks.join_next().await {
        let written =
            joined.map_err(|e| Error::Internal(format!("a change feed writer stopped: {e}")))??;
        all.files.extend(written.files);
        all.counts.merge(&written.counts);
    }
    all.files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(all)
}

/// Writes `stream` (every column of the table, then [`CHANGE_TYPE`]) into change data files of
/// `table` (`layout` and `mapping` the table's).
pub async fn write_feed(
    mut stream: SendableRecordBatchStream,
    table: &str,
    layout: &Layout,
    mapping: &ColumnMapping,
    run_id: &RunId,
    store: Arc<dyn deltalake::ObjectStore>,
) -> Result<FeedWritten> {
    let schema = stream.schema();
    let change_type = schema
        .index_of(CHANGE_TYPE)
        .map_err(|_| Error::Internal("the change feed has no `_change_type`".into()))?;
    let super::Columns {
        partition,
        file,
        file_schema,
        physical_schema,
        converter,
        ..
    } = super::Columns::split(layout, mapping, &schema)?;
    let mut feed = Feed {
        table,
        layout,
        run_id,
        store,
        physical_schema: Arc::clone(&physical_schema),
        open: BTreeMap::new(),
        tick: 0,
        written: FeedWritten::default(),
    };
    while let Some(batch) = stream.next().await {
        let batch = batch.query_context(|| "cannot compute the change feed".into())?;
        if batch.num_rows() == 0 {
            continue;
        }
        let types = batch.column(change_type);
        let types =
            deltalake::arrow::compute::cast(types, &deltalake::arrow::datatypes::DataType::Utf8)
                .map_err(|e| Error::Internal(format!("cannot read `_change_type`: {e}")))?;
        for row in 0..types.len() {
            let name = types.as_string::<i32>().value(row);
            if !feed.written.counts.count(name, 1) {
                return Err(Error::Internal(format!("unknown change type `{name}`")));
            }
        }
        let arrays: Vec<_> = partition
            .iter()
            .map(|i| Arc::clone(batch.column(*i)))
            .collect();
        // Rows come in runs of one partition (each side is scanned file by file): a row like
        // the one before goes where it went, without building and looking up its key.
        let mut groups: Vec<(Vec<u8>, Vec<u32>)> = Vec::new();
        if arrays.is_empty() {
            groups.push((Vec::new(), (0..batch.num_rows() as u32).collect()));
        } else {
            let rows = converter
                .convert_columns(&arrays)
                .map_err(|e| Error::Internal(format!("cannot compare partition values: {e}")))?;
            let mut group_of: std::collections::HashMap<&[u8], usize> =
                std::collections::HashMap::new();
            let mut current = 0;
            for row in 0..batch.num_rows() {
                if row == 0 || rows.row(row) != rows.row(row - 1) {
                    let key = rows.row(row).data();
                    current = *group_of.entry(key).or_insert_with(|| {
                        groups.push((key.to_vec(), Vec::new()));
                        groups.len() - 1
                    });
                }
                groups[current].1.push(row as u32);
            }
        }
        for (key, indices) in groups {
            let scalars = super::partition_scalars(&arrays, indices[0] as usize)?;
            let indices = UInt32Array::from(indices);
            let columns = file
                .iter()
                .map(|i| take(batch.column(*i).as_ref(), &indices, None))
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| Error::Internal(format!("cannot split the change feed: {e}")))?;
            let part = RecordBatch::try_new(Arc::clone(&file_schema), columns)
                .map_err(|e| Error::Internal(format!("the change feed's rows: {e}")))?;
            let part = mapping.to_physical(&part, &physical_schema)?;
            feed.write(key, &scalars, &part).await?;
        }
    }
    feed.finish().await
}

/// The feed's writers while it is written.
struct Feed<'a> {
    table: &'a str,
    layout: &'a Layout,
    run_id: &'a RunId,
    store: Arc<dyn deltalake::ObjectStore>,
    physical_schema: SchemaRef,
    /// Per partition (its values as Arrow rows): its writer, its values and when it last wrote.
    open: BTreeMap<Vec<u8>, (PartitionWriter, PartitionValues, u64)>,
    tick: u64,
    written: FeedWritten,
}

impl Feed<'_> {
    async fn write(&mut self, key: Vec<u8>, scalars: &[Scalar], part: &RecordBatch) -> Result<()> {
        self.tick += 1;
        if !self.open.contains_key(&key) {
            if self.open.len() >= OPEN_WRITERS {
                let oldest = self
                    .open
                    .iter()
                    .min_by_key(|(_, (_, _, tick))| *tick)
                    .map(|(key, _)| key.clone());
                if let Some(oldest) = oldest {
                    self.close(&oldest).await?;
                }
            }
            let writer = self.writer(scalars, part)?;
            self.open.insert(key.clone(), writer);
        }
        let Some((writer, values, tick)) = self.open.get_mut(&key) else {
            return Err(Error::Internal("a change feed writer went missing".into()));
        };
        *tick = self.tick;
        writer
            .write(part)
            .await
            .map_err(|source| Error::StagingWrite {
                table: self.table.to_string(),
                partition: self.layout.hive_path(values),
                source: Box::new(source),
            })
    }

    /// A writer of the partition whose values are `scalars`, and whose first rows are `first`.
    fn writer(
        &self,
        scalars: &[Scalar],
        first: &RecordBatch,
    ) -> Result<(PartitionWriter, PartitionValues, u64)> {
        let columns = &self.layout.partition_columns;
        let values: PartitionValues = columns
            .iter()
            .zip(scalars)
            .map(|(c, s)| (c.clone(), (!s.is_null()).then(|| s.serialize())))
            .collect();
        let prefix = if columns.is_empty() {
            self.run_id.change_data_dir()
        } else {
            format!(
                "{}/{}",
                self.run_id.change_data_dir(),
                self.layout.hive_path(&values)
            )
        };
        let prefix = Path::parse(&prefix)
            .map_err(|e| Error::Internal(format!("invalid change data path `{prefix}`: {e}")))?;
        // As in staged files: no dictionary of a column whose values are nearly all distinct
        // (a key, a timestamp), which would cost the time to build and save nothing.
        let mut properties = WriterProperties::builder().set_compression(Compression::SNAPPY);
        for column in super::near_unique_columns(first) {
            properties = properties.set_column_dictionary_enabled(
                deltalake::parquet::schema::types::ColumnPath::from(column),
                false,
            );
        }
        let properties = properties.build();
        let partition_values: IndexMap<String, Scalar> = columns
            .iter()
            .cloned()
            .zip(scalars.iter().cloned())
            .collect();
        let config = PartitionWriterConfig::try_new(
            Arc::clone(&self.physical_schema),
            partition_values,
            Some(properties),
            None,
            None,
            None,
            Some(prefix),
        )
        .delta_context(|| "cannot configure the change data writer".into())?;
        let writer = PartitionWriter::try_with_config(
            Arc::clone(&self.store),
            config,
            DataSkippingNumIndexedCols::NumColumns(0),
            None,
        )
        .delta_context(|| "cannot create the change data writer".into())?;
        Ok((writer, values, self.tick))
    }

    async fn close(&mut self, key: &[u8]) -> Result<()> {
        let Some((writer, values, _)) = self.open.remove(key) else {
            return Ok(());
        };
        let adds = writer.close().await.map_err(|source| Error::StagingWrite {
            table: self.table.to_string(),
            partition: self.layout.hive_path(&values),
            source: Box::new(source),
        })?;
        self.written
            .files
            .extend(adds.into_iter().map(|add| AddCDCFile {
                path: add.path,
                size: add.size,
                partition_values: values.clone(),
                data_change: false,
                tags: None,
            }));
        Ok(())
    }

    async fn finish(mut self) -> Result<FeedWritten> {
        let keys: Vec<Vec<u8>> = self.open.keys().cloned().collect();
        for key in keys {
            self.close(&key).await?;
        }
        self.written.files.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(self.written)
    }
}
