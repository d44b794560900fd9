//! # lakefill-table
//!
//! The ground floor of lakefill: what a table is, and the vocabulary every layer above speaks.
//! Nothing here reads a run, plans, stages or publishes; those crates use this one, never the
//! other way round.
//!
//! ```text
//!  config  sink  model  settings          the project file, its sinks, the model files, a run's settings
//!  adjustments                            how a run publishes, and the lineage of adjustment rows
//!  partition  protocol  storage           how a table keeps time, the rules its protocol puts on
//!                                         rows, opening it at a version
//!  store                                  the kinds of store (local, S3, Azure) a location names
//!  scope                                  the rows a `--where` predicate selects, and the files
//!                                         that may hold them
//!  mapping                                the names and ids a column-mapped table's files use
//!  vectors                                deletion vectors: reading, writing, giving one to a file
//!  rowhash  resources  types  fastcast    row checksums, a session's memory and threads, Arrow
//!                                         types as Delta keeps them, fast timestamp casts
//!  error  run_id  secrets  time  sqltext  spill  failpoint   (foundation)
//! ```

pub mod adjustments;
pub mod catalog;
pub mod config;
pub mod error;
pub mod failpoint;
pub mod fastcast;
pub mod mapping;
pub mod model;
pub mod partition;
pub mod protocol;
pub mod resources;
pub mod rowhash;
pub mod run_id;
pub mod scope;
pub mod secrets;
pub mod settings;
pub mod sink;
pub mod spill;
pub mod sqltext;
pub mod staged;
pub mod storage;
pub mod store;
pub mod time;
pub mod types;
pub mod vectors;
