//! Integration tests: the real `lakefill` binary against real Delta tables, on local disk and on
//! a real S3-compatible server (moto) that the tests start on loopback.

#![expect(
    clippy::unwrap_used,
    reason = "a test fails loudly on any unexpected error"
)]

/// Runs each named test function, `fn name(store: Store)`, once on local disk and once on S3.
macro_rules! both_stores {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[test]
                fn local() {
                    super::$name(crate::support::Store::Local);
                }
                #[test]
                fn s3() {
                    super::$name(crate::support::Store::S3);
                }
            }
        )*
    };
}

mod adjustments;
mod backfill;
mod cascade;
mod contract;
mod distributed;
mod edges;
mod errors;
mod faults;
mod features;
mod feed;
mod garbage;
mod hints;
mod inspect;
mod lifecycle;
mod logs;
mod notify;
mod protocol;
mod report;
mod resources;
mod revert;
mod running;
mod s3;
mod scope;
mod secrets;
mod shapes;
mod stale;
mod support;
mod types;
mod validation;
mod vectors;
