//! Integration tests: the real `lakefill` binary against real Delta tables, on local disk, on a
//! real S3-compatible server (moto) and on Microsoft's Azure Storage emulator (Azurite), which
//! the tests start on loopback.

#![expect(
    clippy::unwrap_used,
    reason = "a test fails loudly on any unexpected error"
)]

/// Runs each named test function, `fn name(store: Store)`, once on local disk, once on S3 (moto)
/// and once on Azure (Azurite): the matrix every store is held to (backfill, stage-only then
/// publish or discard, every stop then publish, discard, gc or rerun (on an object store each
/// follow-up takes a quarter of the stops, so every stop meets every store), crashes around the
/// commit, racing and overlapping writers, revert, publishing by deletion vectors read back by
/// python through the store).
macro_rules! every_store {
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
                #[test]
                fn azure() {
                    super::$name(crate::support::Store::Azure);
                }
            }
        )*
    };
}

/// Runs each named test function, `fn name(store: Store)`, once on local disk and once on S3
/// (moto): what the Azure matrix (`every_store!`) already covers on an object store, where a
/// third run would only repeat S3's paths (the test suite's time is the front door's).
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

/// Runs each named test function, `fn name(store: Store)`, once on S3 (moto) and once on Azure
/// (Azurite): what only object stores have (racing writers, credentials, endpoints).
macro_rules! object_stores {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[test]
                fn s3() {
                    super::$name(crate::support::Store::S3);
                }
                #[test]
                fn azure() {
                    super::$name(crate::support::Store::Azure);
                }
            }
        )*
    };
}

mod adjustments;
mod azure;
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
mod glue;
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
