//! Change data files copied whole: when every row of a partition's side is one change (a fix
//! that changes every row of a day: each old row an `update_preimage`, each new one an
//! `update_postimage`), the side's files hold the feed's rows already, less the `_change_type`
//! column. Each file is then copied into a change data file column chunk by column chunk, byte
//! for byte, with a `_change_type` column chunk added to each row group: nothing is decoded or
//! encoded again. Read, hashed and written row by row, such a partition costs about what staging
//! it cost; copied, what moving its bytes costs.
//!
//! Only files that hold exactly the columns a change data file of the table holds (the same
//! names, Parquet types and field ids, in the same order) and no deletion vector are copied; the
//! caller checks that their rows are the rows the feed would hold ([`WholeSide::rows`]). Written
//! here because no crate assembles a Parquet file from another's column chunks: parquet's
//! `append_column` does the splice, this module the rest.

use std::sync::Arc;

use bytes::Bytes;
use deltalake::arrow::datatypes::{DataType, Field, Schema};
use deltalake::kernel::{Add, AddCDCFile};
use deltalake::logstore::object_store::ObjectStoreExt as _;
use deltalake::parquet::arrow::ArrowSchemaConverter;
use deltalake::parquet::basic::Compression;
use deltalake::parquet::column::writer::ColumnCloseResult;
use deltalake::parquet::data_type::{ByteArray, ByteArrayType};
use deltalake::parquet::file::metadata::ParquetMetaData;
use deltalake::parquet::file::properties::{EnabledStatistics, WriterProperties};
use deltalake::parquet::file::writer::SerializedFileWriter;
use deltalake::parquet::schema::types::{Type, TypePtr};
use sha2::Digest as _;

use lakefill_table::error::{Error, Result};
use lakefill_table::mapping::ColumnMapping;
use lakefill_table::partition::Layout;
use lakefill_table::run_id::RunId;
use lakefill_validate::feed::CHANGE_TYPE;

use super::FeedWritten;

/// Files larger than this are not copied (a copy holds the file and its copy in memory): their
/// partition's feed is computed row by row.
const MAX_FILE_BYTES: i64 = 128 << 20;

/// The memory a run's copies hold at once, in KiB (a file and its copy each): a copy beyond it
/// waits for others to end.
const HELD_KIB: u32 = 256 << 10;

/// Rows of `_change_type` written at once.
const CHANGE_TYPE_CHUNK: usize = 8192;

/// How a run copies files whole into change data files of its table.
pub struct WholeCopy {
    /// The Parquet fields of a change data file of the table, `_change_type` last.
    fields: Vec<TypePtr>,
    table: String,
    layout: Layout,
    run_id: RunId,
    store: Arc<dyn deltalake::ObjectStore>,
    /// The memory copies may hold, in KiB.
    held: Arc<tokio::sync::Semaphore>,
}

/// One side's files of one partition, their footers read: every file could be copied whole.
#[derive(Debug)]
pub struct WholeSide {
    files: Vec<(Add, Arc<ParquetMetaData>)>,
    /// The rows the files hold.
    pub rows: u64,
}

impl WholeCopy {
    /// For the change data files of `table` (`columns`: every column of the feed but
    /// `_change_type`, in the table's order, partition columns included; `layout` and
    /// `mapping` the table's).
    pub fn new(
        columns: &Schema,
        table: &str,
        layout: &Layout,
        mapping: &ColumnMapping,
        run_id: &RunId,
        store: Arc<dyn deltalake::ObjectStore>,
    ) -> Result<Self> {
        let mut fields: Vec<Field> = columns
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        fields.push(Field::new(CHANGE_TYPE, DataType::Utf8, true));
        // The file columns as the row-by-row writer names and types them.
        let split = crate::stage::Columns::split(layout, mapping, &Schema::new(fields))?;
        let descriptor = ArrowSchemaConverter::new()
            .convert(&split.physical_schema)
            .map_err(|e| Error::Internal(format!("cannot name the change feed's columns: {e}")))?;
        Ok(Self {
            fields: descriptor.root_schema().get_fields().to_vec(),
            table: table.to_string(),
            layout: layout.clone(),
            run_id: run_id.clone(),
            store,
            held: Arc::new(tokio::sync::Semaphore::new(HELD_KIB as usize)),
        })
    }

    /// The footers of `files` (with partition values by logical name), when every one can be
    /// copied whole: no deletion vector, at most 128 MiB, exactly the columns of a
    /// change data file of the table but `_change_type`. `None` when one cannot.
    pub async fn side(&self, files: Vec<Add>) -> Result<Option<WholeSide>> {
        let mut side = WholeSide {
            files: Vec::with_capacity(files.len()),
            rows: 0,
        };
        let columns = &self.fields[..self.fields.len() - 1];
        for file in files {
            if file.deletion_vector.is_some() || !(0..=MAX_FILE_BYTES).contains(&file.size) {
                return Ok(None);
            }
            let footer = self.footer(&file).await?;
            let fields = footer
                .file_metadata()
                .schema_descr()
                .root_schema()
                .get_fields();
            if fields.len() != columns.len() || fields.iter().zip(columns).any(|(a, b)| a != b) {
                tracing::debug!(file = %file.path,
                    "a file's columns are not a change data file's: its partition's feed is computed row by row");
                return Ok(None);
            }
            side.rows += u64::try_from(footer.file_metadata().num_rows()).unwrap_or(0);
            side.files.push((file, footer));
        }
        Ok(Some(side))
    }

    /// The footer of `file` (without its page index), read as the old files of a fix by
    /// deletion vectors are.
    #[expect(
        deprecated,
        reason = "parquet's object store reader is what DataFusion 55 reads with too; its successor is \
                  not in parquet 59's API yet"
    )]
    async fn footer(&self, file: &Add) -> Result<Arc<ParquetMetaData>> {
        use deltalake::parquet::arrow::async_reader::{AsyncFileReader as _, ParquetObjectReader};
        let mut reader = ParquetObjectReader::new(
            Arc::clone(&self.store),
            lakefill_table::storage::object_path(&file.path),
        )
        .with_file_size(u64::try_from(file.size).unwrap_or(0));
        reader
            .get_metadata(None)
            .await
            .map_err(|e| Error::Internal(format!("cannot read the footer of `{}`: {e}", file.path)))
    }

    /// Copies every file of `side` into a change data file whose every row is `change_type`.
    pub async fn copy(&self, side: WholeSide, change_type: &str) -> Result<FeedWritten> {
        let mut written = FeedWritten::default();
        for (file, footer) in side.files {
            // The file and its copy (a little larger), within what copies may hold at once.
            let kib = u32::try_from(file.size / 1024 * 2 + 64)
                .unwrap_or(HELD_KIB)
                .min(HELD_KIB);
            let _held = self.held.acquire_many(kib).await.map_err(|e| {
                Error::Internal(format!(
                    "cannot wait for memory to copy `{}`: {e}",
                    file.path
                ))
            })?;
            let source = lakefill_table::storage::object_path(&file.path);
            let bytes = self
                .store
                .get(&source)
                .await
                .map_err(|e| Error::Internal(format!("cannot read `{}`: {e}", file.path)))?
                .bytes()
                .await
                .map_err(|e| Error::Internal(format!("cannot read `{}`: {e}", file.path)))?;
            let copied = self.copied(&bytes, &footer, change_type, &file.path)?;
            let rows = u64::try_from(footer.file_metadata().num_rows()).unwrap_or(0);
            if !written.counts.count(change_type, rows) {
                return Err(Error::Internal(format!(
                    "unknown change type `{change_type}`"
                )));
            }
            let path = self.path_of(&file, change_type);
            let size = copied.len() as i64;
            self.store
                .put(&lakefill_table::storage::object_path(&path), copied.into())
                .await
                .map_err(|source| Error::StagingWrite {
                    table: self.table.clone(),
                    partition: self.layout.hive_path(&file.partition_values),
                    source: Box::new(deltalake::DeltaTableError::ObjectStore { source }),
                })?;
            written.files.push(AddCDCFile {
                path,
                size,
                partition_values: file.partition_values,
                data_change: false,
                tags: None,
            });
        }
        Ok(written)
    }

    /// Where the copy of `file` goes: the run's change data directory, the file's partition,
    /// a name drawn from the file's path.
    fn path_of(&self, file: &Add, change_type: &str) -> String {
        let digest = hex::encode(sha2::Sha256::digest(file.path.as_bytes()));
        let name = format!("copy-{}-{change_type}.snappy.parquet", &digest[..32]);
        if self.layout.partition_columns.is_empty() {
            format!("{}/{name}", self.run_id.change_data_dir())
        } else {
            format!(
                "{}/{}/{name}",
                self.run_id.change_data_dir(),
                self.layout.hive_path(&file.partition_values)
            )
        }
    }

    /// The bytes of a change data file holding the rows of `bytes` (a Parquet file whose footer
    /// is `footer`), each of `change_type`.
    fn copied(
        &self,
        bytes: &Bytes,
        footer: &ParquetMetaData,
        change_type: &str,
        name: &str,
    ) -> Result<Vec<u8>> {
        let failed = |e: deltalake::parquet::errors::ParquetError| {
            Error::Internal(format!("cannot copy `{name}` into the change feed: {e}"))
        };
        let source = footer.file_metadata().schema_descr().root_schema();
        let mut fields: Vec<TypePtr> = source.get_fields().to_vec();
        fields.push(Arc::clone(&self.fields[self.fields.len() - 1]));
        let schema = Type::group_type_builder(source.name())
            .with_fields(fields)
            .build()
            .map_err(failed)?;
        // No page index: the copied chunks come without theirs (a footer read without them),
        // and a file's columns have one each or none.
        let properties = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .set_statistics_enabled(EnabledStatistics::Chunk)
            .set_offset_index_disabled(true)
            .build();
        let mut writer = SerializedFileWriter::new(
            Vec::with_capacity(bytes.len() + 4096),
            Arc::new(schema),
            Arc::new(properties),
        )
        .map_err(failed)?;
        let value = ByteArray::from(change_type);
        for group in footer.row_groups() {
            let mut out = writer.next_row_group().map_err(failed)?;
            let rows = usize::try_from(group.num_rows()).unwrap_or(0);
            for chunk in group.columns() {
                let close = ColumnCloseResult {
                    bytes_written: u64::try_from(chunk.compressed_size()).unwrap_or(0),
                    rows_written: rows as u64,
                    metadata: chunk.clone(),
                    bloom_filter: None,
                    column_index: None,
                    offset_index: None,
                };
                out.append_column(bytes, close).map_err(failed)?;
            }
            let Some(mut column) = out.next_column().map_err(failed)? else {
                return Err(Error::Internal(format!(
                    "the copy of `{name}` has no `{CHANGE_TYPE}` column"
                )));
            };
            let values = vec![value.clone(); rows.min(CHANGE_TYPE_CHUNK)];
            let levels = vec![1i16; values.len()];
            let mut left = rows;
            while left > 0 {
                let n = left.min(CHANGE_TYPE_CHUNK);
                column
                    .typed::<ByteArrayType>()
                    .write_batch(&values[..n], Some(&levels[..n]), None)
                    .map_err(failed)?;
                left -= n;
            }
            column.close().map_err(failed)?;
            out.close().map_err(failed)?;
        }
        // (Writes the footer.)
        writer.into_inner().map_err(failed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::arrow::array::{
        Array, AsArray, Int32Array, Int64Array, RecordBatch, StringArray,
    };
    use deltalake::arrow::datatypes::Int64Type;
    use deltalake::logstore::object_store::memory::InMemory;
    use deltalake::parquet::arrow::ArrowWriter;
    use deltalake::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    fn table() -> Schema {
        Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("name", DataType::Utf8, true),
            Field::new("event_date", DataType::Date32, true),
        ])
    }

    /// A Parquet file of `batch` in row groups of `group` rows.
    fn parquet(batch: &RecordBatch, group: usize) -> Vec<u8> {
        let properties = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .set_max_row_group_row_count(Some(group))
            .build();
        let mut out = Vec::new();
        let mut writer = ArrowWriter::try_new(&mut out, batch.schema(), Some(properties)).unwrap();
        writer.write(batch).unwrap();
        writer.close().unwrap();
        out
    }

    /// `rows` rows of the table's file columns: every id, names of 7 values and a NULL a 13th.
    fn rows(rows: i64) -> RecordBatch {
        let names: StringArray = (0..rows)
            .map(|i| (i % 13 != 0).then(|| format!("name {}", i % 7)))
            .collect();
        RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("id", DataType::Int64, true),
                Field::new("name", DataType::Utf8, true),
            ])),
            vec![
                Arc::new(Int64Array::from_iter_values(0..rows)),
                Arc::new(names),
            ],
        )
        .unwrap()
    }

    async fn put(store: &Arc<dyn deltalake::ObjectStore>, path: &str, bytes: Vec<u8>) -> Add {
        let size = bytes.len() as i64;
        store
            .put(&lakefill_table::storage::object_path(path), bytes.into())
            .await
            .unwrap();
        Add {
            path: path.to_string(),
            size,
            partition_values: [("event_date".to_string(), Some("2024-03-03".to_string()))]
                .into_iter()
                .collect(),
            ..Add::default()
        }
    }

    fn copier(store: &Arc<dyn deltalake::ObjectStore>) -> WholeCopy {
        let schema = table();
        let layout = Layout::detect(
            "t",
            &["event_date".to_string()],
            &schema,
            &Default::default(),
            &["event_date".to_string()],
            None,
            None,
        )
        .unwrap();
        WholeCopy::new(
            &schema,
            "t",
            &layout,
            &ColumnMapping::default(),
            &RunId::parse("lakefill-t-v2-abc").unwrap(),
            Arc::clone(store),
        )
        .unwrap()
    }

    #[tokio::test]
    async fn a_copied_file_holds_every_row_as_it_was_with_its_change_type() {
        let store: Arc<dyn deltalake::ObjectStore> = Arc::new(InMemory::new());
        let copy = copier(&store);
        for (total, group) in [(0i64, 100usize), (1, 100), (20_000, 7_000), (9_000, 20_000)] {
            let batch = rows(total);
            let first = put(
                &store,
                &format!("event_date=2024-03-03/a-{total}.parquet"),
                parquet(&batch, group),
            )
            .await;
            let second = put(
                &store,
                &format!("event_date=2024-03-03/b-{total}.parquet"),
                parquet(&rows(5), 2),
            )
            .await;
            let side = copy
                .side(vec![first, second])
                .await
                .unwrap()
                .expect("copied whole");
            assert_eq!(side.rows, total as u64 + 5);
            let written = copy.copy(side, "update_postimage").await.unwrap();
            assert_eq!(written.counts.update_postimage, total as u64 + 5);
            assert_eq!(written.counts.rows(), total as u64 + 5);
            assert_eq!(written.files.len(), 2);
            let file = &written.files[0];
            assert!(
                file.path.starts_with(
                    "_change_data/lakefill-lakefill-t-v2-abc/event_date=2024-03-03/copy-"
                ),
                "{}",
                file.path
            );
            assert!(!file.data_change);
            assert_eq!(
                file.partition_values["event_date"].as_deref(),
                Some("2024-03-03")
            );
            let bytes = store
                .get(&lakefill_table::storage::object_path(&file.path))
                .await
                .unwrap()
                .bytes()
                .await
                .unwrap();
            assert_eq!(bytes.len() as i64, file.size);
            let reader = ParquetRecordBatchReaderBuilder::try_new(bytes).unwrap();
            let groups = reader.metadata().num_row_groups();
            assert_eq!(groups, (total as usize).div_ceil(group), "{total}");
            let read: Vec<RecordBatch> = reader.build().unwrap().map(Result::unwrap).collect();
            let read = deltalake::arrow::compute::concat_batches(
                &read
                    .first()
                    .map_or_else(|| Arc::new(Schema::empty()), RecordBatch::schema),
                &read,
            )
            .unwrap();
            assert_eq!(read.num_rows() as i64, total);
            if total == 0 {
                continue;
            }
            assert_eq!(read.schema().field(2).name(), CHANGE_TYPE);
            assert_eq!(
                read.column(0).as_primitive::<Int64Type>(),
                batch.column(0).as_primitive::<Int64Type>()
            );
            assert_eq!(
                read.column(1).as_string::<i32>(),
                batch.column(1).as_string::<i32>()
            );
            let types = read.column(2).as_string::<i32>();
            assert_eq!(types.null_count(), 0);
            assert!(types.iter().all(|t| t == Some("update_postimage")));
        }
    }

    #[tokio::test]
    async fn a_file_of_other_columns_or_with_a_deletion_vector_is_not_copied() {
        let store: Arc<dyn deltalake::ObjectStore> = Arc::new(InMemory::new());
        let copy = copier(&store);
        let good = put(
            &store,
            "event_date=2024-03-03/good.parquet",
            parquet(&rows(10), 4),
        )
        .await;
        assert!(copy.side(vec![good.clone()]).await.unwrap().is_some());
        // The id as a 32-bit integer; the columns in another order; one more column; one fewer.
        let narrow = RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("id", DataType::Int32, true),
                Field::new("name", DataType::Utf8, true),
            ])),
            vec![
                Arc::new(Int32Array::from(vec![1, 2])),
                Arc::new(StringArray::from(vec!["a", "b"])),
            ],
        )
        .unwrap();
        let swapped = RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("name", DataType::Utf8, true),
                Field::new("id", DataType::Int64, true),
            ])),
            vec![
                Arc::new(StringArray::from(vec!["a", "b"])),
                Arc::new(Int64Array::from(vec![1, 2])),
            ],
        )
        .unwrap();
        let wider = RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("id", DataType::Int64, true),
                Field::new("name", DataType::Utf8, true),
                Field::new("extra", DataType::Int64, true),
            ])),
            vec![
                Arc::new(Int64Array::from(vec![1, 2])),
                Arc::new(StringArray::from(vec!["a", "b"])),
                Arc::new(Int64Array::from(vec![1, 2])),
            ],
        )
        .unwrap();
        let fewer = rows(2).project(&[0]).unwrap();
        for (name, batch) in [
            ("narrow", narrow),
            ("swapped", swapped),
            ("wider", wider),
            ("fewer", fewer),
        ] {
            let other = put(
                &store,
                &format!("event_date=2024-03-03/{name}.parquet"),
                parquet(&batch, 4),
            )
            .await;
            assert!(
                copy.side(vec![good.clone(), other])
                    .await
                    .unwrap()
                    .is_none(),
                "{name}"
            );
        }
        let mut vectored = good.clone();
        vectored.deletion_vector = Some(deltalake::kernel::DeletionVectorDescriptor {
            storage_type: deltalake::kernel::StorageType::Inline,
            path_or_inline_dv: "wi5b=000010000siXQKl0rr91000f55c8Xg0@@D72lkbi5=-{L".into(),
            offset: None,
            size_in_bytes: 1,
            cardinality: 1,
        });
        assert!(copy.side(vec![vectored]).await.unwrap().is_none());
    }
}
