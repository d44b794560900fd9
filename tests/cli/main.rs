//! Integration tests: the real `lakefill` binary against real Delta tables on local disk.

#![expect(
    clippy::unwrap_used,
    reason = "a test fails loudly on any unexpected error"
)]

mod backfill;
mod errors;
mod faults;
mod garbage;
mod inspect;
mod secrets;
mod support;
mod validation;
