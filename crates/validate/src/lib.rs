//! # lakefill-validate
//!
//! Comparing old and new rows, and the checks that block a publish (DESIGN §2 `[validate]`, §4.3).
//!
//! [`compare`](mod@compare) is the engine shared by backfill validation and `lakefill diff`: per partition row
//! counts and measure sums, and a row-level diff by key (added, removed, changed rows, with a
//! sample). It works on two tables registered in a DataFusion session as `previous` (old rows)
//! and `output` (new rows) and streams every query, so memory stays bounded by the number of
//! partitions and the sample size, not by the rows. [`validate`](fn@validate) adds the checks of a model's
//! `[validate]` section on top of a comparison and decides whether the run may be published.

//! The pieces: [`rules`] parses a model's `[validate]` section; [`compare`](mod@compare) computes the
//! comparison; [`checks`] runs the checks over it and the staged rows; [`report`] is the typed
//! outcome the journal keeps and the commit summarises; [`rows`] holds the streaming helpers.

pub mod checks;
pub mod compare;
pub mod edges;
pub mod feed;
pub mod keymerge;
pub mod multiset;
pub mod net;
pub mod report;
pub mod rowdiff;
pub mod rows;
pub mod rules;
pub mod spec;
pub mod summary;

pub use checks::validate;
pub use compare::{KnownSide, compare};
pub use report::{CheckResult, ValidationReport};
pub use rules::ValidationRules;
pub use spec::{CompareSpec, PartitionKey};
pub use spec::{Comparison, ComparisonTotals, MeasureChange, PartitionComparison, Samples};
