//! Azure's store as delta-rs builds it, with listings from an offset that hold only what comes
//! after the offset.
//!
//! Why this is written by hand: object_store asks Azure to list from an offset with List Blobs'
//! `startFrom` parameter (service version 2026-02-06) and trusts the answer. A store that does
//! not know the parameter ignores it and lists from the start: Azurite 3.37, Microsoft's
//! emulator and the only Azure test server there is, does, and so may Azure Stack and other
//! Azure-compatible stores. The Delta kernel lists `_delta_log/` from the version it has
//! (`LogSegment::for_table_changes`); handed commit 0 first, it refuses, and every commit after
//! a table's first version failed with "Invalid table version". So listings from an offset are
//! filtered once more here: a no-op where the store honours the offset, the right answer where
//! it does not. Nothing else changes; every other call goes to delta-rs' Azure store.

use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Once};

use async_trait::async_trait;
use bytes::Bytes;
use deltalake::logstore::object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions, Result,
};
use deltalake::logstore::{ObjectStoreFactory, StorageConfig, object_store_factories};
use deltalake::{DeltaResult, Path};
use futures::stream::{BoxStream, StreamExt as _};
use url::Url;

/// The schemes delta-rs' Azure store answers (`deltalake-azure`'s `register_handlers`).
const SCHEMES: [&str; 5] = ["az", "adl", "azure", "abfs", "abfss"];

/// Puts [`OffsetListing`] between delta-rs and every Azure store it builds in this process.
/// Idempotent; called before any table is opened (delta-rs registers its own factories when the
/// process starts, so this runs after them).
pub(super) fn register() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let factory: Arc<dyn ObjectStoreFactory> = Arc::new(Factory);
        for scheme in SCHEMES {
            if let Ok(url) = Url::parse(&format!("{scheme}://")) {
                object_store_factories().insert(url, Arc::clone(&factory));
            }
        }
    });
}

/// delta-rs' Azure factory, its stores wrapped.
struct Factory;

impl ObjectStoreFactory for Factory {
    fn parse_url_opts(
        &self,
        url: &Url,
        config: &StorageConfig,
    ) -> DeltaResult<(deltalake::logstore::ObjectStoreRef, Path)> {
        let (store, prefix) =
            deltalake::azure::AzureFactory::default().parse_url_opts(url, config)?;
        Ok((Arc::new(OffsetListing(store)), prefix))
    }
}

/// An object store whose listings from an offset hold only paths after the offset.
#[derive(Debug)]
struct OffsetListing(Arc<dyn ObjectStore>);

impl fmt::Display for OffsetListing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[async_trait]
impl ObjectStore for OffsetListing {
    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        let offset = offset.clone();
        self.0
            .list_with_offset(prefix, &offset)
            .filter(move |item| {
                let keep = item.as_ref().map_or(true, |meta| meta.location > offset);
                std::future::ready(keep)
            })
            .boxed()
    }

    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        self.0.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.0.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.0.get_opts(location, options).await
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        self.0.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        self.0.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.0.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.0.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.0.copy_opts(from, to, options).await
    }

    async fn rename_opts(&self, from: &Path, to: &Path, options: RenameOptions) -> Result<()> {
        self.0.rename_opts(from, to, options).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::logstore::object_store::ObjectStoreExt as _;
    use deltalake::logstore::object_store::memory::InMemory;
    use futures::TryStreamExt as _;

    /// A store that ignores the offset, as Azurite does.
    #[derive(Debug)]
    struct IgnoresOffset(InMemory);

    impl fmt::Display for IgnoresOffset {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("ignores offsets")
        }
    }

    #[async_trait]
    impl ObjectStore for IgnoresOffset {
        fn list_with_offset(
            &self,
            prefix: Option<&Path>,
            _offset: &Path,
        ) -> BoxStream<'static, Result<ObjectMeta>> {
            self.0.list(prefix)
        }
        async fn put_opts(&self, l: &Path, p: PutPayload, o: PutOptions) -> Result<PutResult> {
            self.0.put_opts(l, p, o).await
        }
        async fn put_multipart_opts(
            &self,
            l: &Path,
            o: PutMultipartOptions,
        ) -> Result<Box<dyn MultipartUpload>> {
            self.0.put_multipart_opts(l, o).await
        }
        async fn get_opts(&self, l: &Path, o: GetOptions) -> Result<GetResult> {
            self.0.get_opts(l, o).await
        }
        fn delete_stream(
            &self,
            l: BoxStream<'static, Result<Path>>,
        ) -> BoxStream<'static, Result<Path>> {
            self.0.delete_stream(l)
        }
        fn list(&self, p: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
            self.0.list(p)
        }
        async fn list_with_delimiter(&self, p: Option<&Path>) -> Result<ListResult> {
            self.0.list_with_delimiter(p).await
        }
        async fn copy_opts(&self, f: &Path, t: &Path, o: CopyOptions) -> Result<()> {
            self.0.copy_opts(f, t, o).await
        }
    }

    #[tokio::test]
    async fn a_listing_from_an_offset_starts_after_it_whatever_the_store_does() {
        let inner = IgnoresOffset(InMemory::new());
        for version in 0..3 {
            let path = Path::from(format!("t/_delta_log/{version:020}.json"));
            inner
                .put(&path, PutPayload::from_static(b"{}"))
                .await
                .unwrap();
        }
        let log = Path::from("t/_delta_log");
        let offset = Path::from(format!("t/_delta_log/{:020}", 1));
        let names = |store: &dyn ObjectStore| {
            store
                .list_with_offset(Some(&log), &offset)
                .map_ok(|m| m.location.filename().unwrap_or_default().to_string())
                .try_collect::<Vec<_>>()
        };
        assert_eq!(
            names(&inner).await.unwrap().len(),
            3,
            "the store ignores it"
        );
        let wrapped = OffsetListing(Arc::new(inner));
        assert_eq!(
            names(&wrapped).await.unwrap(),
            vec![format!("{:020}.json", 1), format!("{:020}.json", 2)]
        );
    }
}
