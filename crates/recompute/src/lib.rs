//! # lakefill-recompute
//!
//! Recomputation: the [`plan`] of a run (what it reads at which pinned versions, what it
//! replaces, how it is split into batches, the model as a DataFusion query per batch) and its
//! output [`stage`]d, batch by batch, as Parquet files that are not yet in the Delta log.
//! Validating the staged rows, committing them and sequencing the phases is left to the layers
//! above (`lakefill-validate`, the runner `lakefill`). Staging on a Ballista cluster
//! (`lakefill-ballista`) runs the same plan through the same writers.

pub mod plan;
pub mod stage;
