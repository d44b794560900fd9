//! Explaining history: `history`, `blame`, `sql` with time travel, `diff` (DESIGN §3, §5), and
//! `gc`, which removes what no history needs.
//!
//! `history` and `blame` ([`history`]) read commit files of the Delta log (the run metadata
//! lakefill writes into each commit), never data. `sql` runs read-only queries over the project's
//! tables at any version. `diff` compares two versions, or a version and a staged run, with the
//! engine of `lakefill-validate`, scanning only the partitions whose files differ.

pub(crate) mod diff;
pub(crate) mod feed;
pub(crate) mod gc;
pub(crate) mod history;
pub(crate) mod sql;
pub(crate) mod stale;

pub use diff::{DiffReport, DiffTarget, diff};
pub use feed::{FeedPartition, FeedReport, change_feed};
pub use history::{BlameReport, HistoryEntry, blame, history};
pub use sql::{QueryResult, sql};
pub use stale::{OutdatedRange, PartitionSpan, SourceChange, StaleRange, StaleReport, stale};
