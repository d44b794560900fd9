//! Rows kept in a spill file of the run's disk manager as Arrow IPC (which costs no encoding),
//! to be read again as a registered table.

use std::sync::Arc;

use deltalake::arrow::array::RecordBatch;
use deltalake::arrow::datatypes::{DataType, Schema};
use deltalake::arrow::ipc::writer::FileWriter;
use deltalake::datafusion::error::{DataFusionError, Result as DfResult};
use deltalake::datafusion::execution::disk_manager::DiskManager;
use deltalake::datafusion::execution::spill_file::{SpillFile, SpillWriter};

/// An IPC file being written into a spill file.
pub(super) struct IpcSpill {
    file: Arc<dyn SpillFile>,
    writer: FileWriter<std::io::BufWriter<Box<dyn SpillWriter>>>,
    /// What the rows are, for errors.
    what: &'static str,
}

impl IpcSpill {
    /// A new spill file of `disk` for rows of `schema` (`what` they are); `None` when the disk
    /// manager's files are not local files (they are read back by path), or when a column holds
    /// dictionaries (an IPC file takes one dictionary per column, and batches may each bring
    /// theirs).
    pub(super) fn create(
        disk: &Arc<DiskManager>,
        schema: &Schema,
        what: &'static str,
    ) -> DfResult<Option<Self>> {
        if schema
            .fields()
            .iter()
            .any(|field| holds_dictionaries(field.data_type()))
        {
            return Ok(None);
        }
        let file = disk.create_tmp_file(what)?;
        if file.path().is_none() {
            return Ok(None);
        }
        let writer = FileWriter::try_new(std::io::BufWriter::new(file.open_writer()?), schema)
            .map_err(|e| written(what, &file, e))?;
        Ok(Some(Self { file, writer, what }))
    }

    /// Appends `batch`.
    pub(super) fn write(&mut self, batch: &RecordBatch) -> DfResult<()> {
        self.writer
            .write(batch)
            .map_err(|e| written(self.what, &self.file, e))
    }

    /// Ends the file; it is then read by its path.
    pub(super) fn finish(mut self) -> DfResult<Arc<dyn SpillFile>> {
        let (what, file) = (self.what, Arc::clone(&self.file));
        self.writer.finish().map_err(|e| written(what, &file, e))?;
        self.writer
            .into_inner()
            .map_err(|e| written(what, &file, e))?
            .into_inner()
            .map_err(|e| written(what, &file, e.into_error().into()))?
            .finish()?;
        Ok(file)
    }
}

/// The error of a failed write of `what` to `file`.
fn written(
    what: &str,
    file: &Arc<dyn SpillFile>,
    error: deltalake::arrow::error::ArrowError,
) -> DataFusionError {
    DataFusionError::Execution(format!(
        "cannot write the {what} to the spill file {}: {error}",
        file.path()
            .map(|p| p.display().to_string())
            .unwrap_or_default()
    ))
}

/// Whether values of `data_type` are, or hold, dictionaries.
pub(super) fn holds_dictionaries(data_type: &DataType) -> bool {
    match data_type {
        DataType::Dictionary(_, _) => true,
        DataType::List(field)
        | DataType::LargeList(field)
        | DataType::ListView(field)
        | DataType::LargeListView(field)
        | DataType::FixedSizeList(field, _)
        | DataType::Map(field, _) => holds_dictionaries(field.data_type()),
        DataType::Struct(fields) => fields.iter().any(|f| holds_dictionaries(f.data_type())),
        DataType::Union(fields, _) => fields
            .iter()
            .any(|(_, f)| holds_dictionaries(f.data_type())),
        DataType::RunEndEncoded(_, values) => holds_dictionaries(values.data_type()),
        _ => false,
    }
}
