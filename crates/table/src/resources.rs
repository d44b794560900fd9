//! The resources a backfill may use: a DataFusion memory pool shared by every query of the run,
//! and progress reporting.
//!
//! With a memory limit, every session of a run draws on one [`FairSpillPool`]: sorts and
//! aggregations spill to disk beyond it, and joins run as sort-merge joins (which spill) instead
//! of hash joins (which do not). Parquet writers are bounded separately: one row group per open
//! partition writer, at most `batch_partitions` writers per batch in flight.

use std::sync::Arc;

use deltalake::datafusion::execution::memory_pool::FairSpillPool;
use deltalake::datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use deltalake::datafusion::prelude::SessionContext;
use deltalake::delta_datafusion::DeltaSessionContext;
use serde::Serialize;

/// Parses sizes like `512MiB`, `4GiB`, `64MB` or a plain number of bytes; the error says what
/// a size looks like (the caller names the setting).
///
/// Written here rather than taken from a crate: none in the dependency tree parses sizes, and
/// this is the whole of it.
pub fn parse_size(text: &str) -> std::result::Result<u64, String> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let invalid = || "expected a size such as `512MiB`, `4GiB` or `64MB`".to_string();
    let number: f64 = number.parse().map_err(|_| invalid())?;
    let factor: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "kib" => 1024.0,
        "m" | "mb" => 1e6,
        "mib" => 1024.0 * 1024.0,
        "g" | "gb" => 1e9,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        _ => return Err(invalid()),
    };
    if number <= 0.0 {
        return Err(invalid());
    }
    Ok((number * factor) as u64)
}

/// The runtime every query of one run shares.
#[derive(Clone)]
pub struct Resources {
    runtime: Arc<RuntimeEnv>,
    memory_limit: Option<usize>,
}

impl Resources {
    /// Resources bounded by `memory_limit` bytes (the built-in share when `None`).
    pub fn new(memory_limit: Option<u64>) -> Self {
        let memory_limit = memory_limit.map(|l| usize::try_from(l).unwrap_or(usize::MAX));
        let builder = || {
            let builder = RuntimeEnvBuilder::new();
            match memory_limit {
                Some(limit) => builder.with_memory_pool(Arc::new(FairSpillPool::new(limit))),
                None => builder,
            }
        };
        // Spill files in this process's own directory, which the next lakefill process removes
        // if this one is killed ([`crate::spill`]); else where DataFusion puts them.
        let runtime = builder()
            .with_disk_manager_builder(crate::spill::disk_manager())
            .build_arc()
            .or_else(|_| builder().build_arc())
            .unwrap_or_default();
        Self {
            runtime,
            memory_limit,
        }
    }

    /// The memory pool of the shared runtime (what `--memory-limit` bounds).
    pub fn memory_pool(
        &self,
    ) -> Arc<dyn deltalake::datafusion::execution::memory_pool::MemoryPool> {
        Arc::clone(&self.runtime.memory_pool)
    }

    /// The disk manager of the shared runtime (its spill files).
    pub fn disk_manager(&self) -> Arc<deltalake::datafusion::execution::disk_manager::DiskManager> {
        Arc::clone(&self.runtime.disk_manager)
    }

    /// A Delta-aware session on the shared runtime, whose casts of UTC timestamps to dates skip
    /// the time zone, and whose filters on such dates compare the timestamps
    /// ([`crate::fastcast`]).
    pub fn session(&self) -> SessionContext {
        let ctx = DeltaSessionContext::with_runtime_env(Arc::clone(&self.runtime)).into_inner();
        let state = crate::fastcast::with_rules(ctx.state());
        let ctx = SessionContext::new_with_state(state);
        read_as_spark_wrote(ctx.state_ref().write().config_mut().options_mut());
        if let Some(limit) = self.memory_limit {
            let state_ref = ctx.state_ref();
            let mut state = state_ref.write();
            let options = state.config_mut().options_mut();
            // Hash joins cannot spill; sort-merge joins can.
            options.optimizer.prefer_hash_join = false;
            // The default reservation (10 MB per sort) would exhaust small pools by itself.
            options.execution.sort_spill_reservation_bytes = (limit / 8).min(10 * 1024 * 1024);
            // Smaller batches keep the working set of each operator well inside small pools.
            if limit < 256 * 1024 * 1024 {
                let _ = options.set("datafusion.execution.batch_size", "1024");
            }
        }
        ctx
    }
}

/// Reads Parquet the way the writers of Delta tables mean it: Spark writes timestamps as INT96
/// by default, an instant in microseconds' range stored as nanoseconds; read as nanoseconds, the
/// `9999-12-31` "valid to" of a slowly changing dimension overflows into 1816 (#32). Read as
/// microseconds in UTC, as Spark reads them, every Delta timestamp (years 1 to 9999) fits.
pub fn read_as_spark_wrote(options: &mut deltalake::datafusion::config::ConfigOptions) {
    options.execution.parquet.coerce_int96 = Some("us".into());
    options.execution.parquet.coerce_int96_tz = Some("UTC".into());
}

impl std::fmt::Debug for Resources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resources")
            .field("memory_limit", &self.memory_limit)
            .finish()
    }
}

/// Receives progress events of a run, in order. Implementations must be cheap: they are called
/// from the run's own task.
pub trait ProgressSink: Send + Sync {
    /// Handles one event.
    fn event(&self, event: &ProgressEvent);
}

/// What a run reports while it works.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum ProgressEvent {
    /// Staging starts.
    Started {
        /// The run.
        run_id: String,
        /// The target table.
        table: String,
        /// Batches in the run.
        batches_total: usize,
        /// Batches taken over from an interrupted attempt.
        batches_resumed: usize,
    },
    /// A batch is staged and journaled.
    BatchFinished {
        /// The run.
        run_id: String,
        /// The batch.
        index: usize,
        /// Batches finished so far (resumed ones included).
        batches_done: usize,
        /// Batches in the run.
        batches_total: usize,
        /// Rows staged by this batch.
        rows: u64,
        /// Rows staged so far.
        rows_total: u64,
        /// Bytes staged so far.
        bytes_total: u64,
        /// Time since the run started.
        elapsed_ms: u64,
    },
    /// A phase starts: `validating` or `publishing`.
    Phase {
        /// The run.
        run_id: String,
        /// The phase.
        phase: String,
    },
    /// The run ended (published, staged, or failed validation).
    Finished {
        /// The run.
        run_id: String,
        /// Its final state.
        state: String,
        /// Batches staged (resumed ones included).
        batches_done: usize,
        /// Rows staged.
        rows_written: u64,
        /// Files staged.
        files_written: u64,
        /// Bytes staged.
        bytes_written: u64,
        /// Time since the run started.
        elapsed_ms: u64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("512MiB").expect("valid"), 512 * 1024 * 1024);
        assert_eq!(parse_size("4GiB").expect("valid"), 4 * 1024 * 1024 * 1024);
        assert_eq!(parse_size("64MB").expect("valid"), 64_000_000);
        assert_eq!(parse_size("1000").expect("valid"), 1000);
        assert!(parse_size("lots").is_err());
        assert!(parse_size("0").is_err());
    }
}
