//! One module per subcommand: resolve settings, call the engine, hand results to the printer.

pub(crate) mod backfill;
pub(crate) mod cluster;
pub(crate) mod demo;
pub(crate) mod init;
pub(crate) mod inspect;
pub(crate) mod outcome;
pub(crate) mod plan;
pub(crate) mod runs;
