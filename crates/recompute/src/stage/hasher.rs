//! The hashing of staged rows beside their writing.
//!
//! A batch's rows pass through one writer task, which routes them to partitions and encodes
//! them as Parquet; hashing them there too (each partition's row checksum, and the key and row
//! hashes validation's key merge reads, see [`Capture`], and the whole rows' hashes the
//! adjustments' difference counts, see [`StagedHashes`]) would lengthen that one task's path. A
//! [`Hasher`] does it on a thread of its own, fed by a short queue, so the writer only routes
//! and encodes.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use deltalake::arrow::array::{RecordBatch, UInt32Array};
use deltalake::arrow::compute::take;
use deltalake::arrow::datatypes::SchemaRef;
use deltalake::datafusion::common::ScalarValue;

use lakefill_table::error::{Error, Result};
use lakefill_table::rowhash::{RowChecksum, combine_rows, value_hashes};
use lakefill_validate::keymerge::CaptureWriter;
use lakefill_validate::multiset::StagedHashWriter;

/// The rows of one partition of one record batch.
pub(super) struct Job {
    /// The partition writer the rows went to.
    pub(super) writer: Vec<Option<String>>,
    pub(super) label: String,
    /// The rows, in the staged files' schema.
    pub(super) part: RecordBatch,
    /// The record batch they were taken from (in the target's schema), which rows, and the
    /// first of them (whose partition values are the part's).
    pub(super) batch: RecordBatch,
    pub(super) indices: UInt32Array,
    pub(super) first_row: usize,
    /// The value hashes of the part's columns, when the writer computed them already (to match
    /// the rows against old ones, with deletion vectors).
    pub(super) values: Option<Vec<Vec<u64>>>,
    /// Per row of the part, whether it used up an old row of its partition (with deletion
    /// vectors): the capture flags it as that old row's twin ([`CaptureWriter::add`]).
    pub(super) twins: Option<Vec<bool>>,
}

/// What the hasher computed.
pub(super) struct Hashed {
    /// Per partition label.
    pub(super) checksums: BTreeMap<String, RowChecksum>,
    /// Per partition writer (its file's digest).
    pub(super) by_writer: HashMap<Vec<Option<String>>, RowChecksum>,
    pub(super) capture: Option<CaptureWriter>,
    pub(super) rows: Option<StagedHashWriter>,
}

/// Hashes the jobs it is given on a blocking thread.
pub(super) struct Hasher {
    jobs: Option<tokio::sync::mpsc::Sender<Job>>,
    task: tokio::task::JoinHandle<Result<Hashed>>,
}

impl Hasher {
    pub(super) fn start(
        capture: Option<CaptureWriter>,
        rows: Option<StagedHashWriter>,
        file_schema: SchemaRef,
        target_schema: SchemaRef,
    ) -> Self {
        // A few parts of a record batch each: bounded memory, enough to keep both busy.
        let (jobs, mut queue) = tokio::sync::mpsc::channel::<Job>(16);
        let task = tokio::task::spawn_blocking(move || {
            let mut hashed = Hashed {
                checksums: BTreeMap::new(),
                by_writer: HashMap::new(),
                capture,
                rows,
            };
            while let Some(job) = queue.blocking_recv() {
                hash(&mut hashed, job, &file_schema, &target_schema)?;
            }
            Ok(hashed)
        });
        Self {
            jobs: Some(jobs),
            task,
        }
    }

    /// Queues `job`; the hasher's error if it stopped.
    pub(super) async fn hash(&mut self, job: Job) -> Result<()> {
        let sent = match &self.jobs {
            Some(jobs) => jobs.send(job).await.is_ok(),
            None => false,
        };
        if sent {
            return Ok(());
        }
        self.jobs = None;
        match (&mut self.task).await {
            Ok(Err(e)) => Err(e),
            _ => Err(Error::Internal("the hashing of staged rows stopped".into())),
        }
    }

    /// Waits for every queued job.
    pub(super) async fn finish(mut self) -> Result<Hashed> {
        self.jobs = None;
        self.task
            .await
            .map_err(|e| Error::Internal(format!("the hashing of staged rows failed: {e}")))?
    }
}

fn hash(
    hashed: &mut Hashed,
    job: Job,
    file_schema: &SchemaRef,
    target_schema: &SchemaRef,
) -> Result<()> {
    let part = &job.part;
    // Each column hashed once, for the checksum and for validation's key merge.
    let values = match job.values {
        Some(values) => values,
        None => part
            .columns()
            .iter()
            .map(value_hashes)
            .collect::<Result<Vec<_>>>()?,
    };
    let mut checksum = RowChecksum::default();
    checksum.add_hashes(&combine_rows(
        &values.iter().map(Vec::as_slice).collect::<Vec<_>>(),
        part.num_rows(),
    ));
    hashed
        .checksums
        .entry(job.label)
        .or_default()
        .merge(&checksum);
    hashed
        .by_writer
        .entry(job.writer)
        .or_default()
        .merge(&checksum);
    if hashed.capture.is_none() && hashed.rows.is_none() {
        return Ok(());
    }
    // The other columns are partition columns: one value in the whole part, hashed once.
    let partition_hashes: Vec<(&str, Vec<u64>)> = target_schema
        .fields()
        .iter()
        .enumerate()
        .filter(|(_, f)| file_schema.index_of(f.name()).is_err())
        .map(|(i, f)| {
            let one = value_hashes(&job.batch.column(i).slice(job.first_row, 1))?;
            Ok((f.name().as_str(), vec![one[0]; part.num_rows()]))
        })
        .collect::<Result<_>>()?;
    let cached = |name: &str| match file_schema.index_of(name) {
        Ok(i) => Some(values[i].as_slice()),
        Err(_) => partition_hashes
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, h)| h.as_slice()),
    };
    if let Some(rows) = &mut hashed.rows {
        let columns = rows
            .columns()
            .iter()
            .map(|name| {
                cached(name).ok_or_else(|| {
                    Error::Internal(format!("the staged rows have no column `{name}` to hash"))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        rows.add(&combine_rows(&columns, part.num_rows()));
    }
    if let Some(capture) = &mut hashed.capture {
        let column = |name: &str| match file_schema.index_of(name) {
            Ok(i) => Some(Arc::clone(part.column(i))),
            Err(_) => target_schema
                .index_of(name)
                .ok()
                .and_then(|i| take(job.batch.column(i), &job.indices, None).ok()),
        };
        let partition = |names: &[String]| {
            names
                .iter()
                .map(|n| {
                    let i = target_schema.index_of(n).ok()?;
                    ScalarValue::try_from_array(job.batch.column(i), job.first_row).ok()
                })
                .collect()
        };
        capture.add(
            column,
            cached,
            (part.num_rows(), job.twins.as_deref()),
            partition,
        );
    }
    Ok(())
}
