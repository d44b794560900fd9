//! Throttling: a bound on the bytes a backfill writes per second, so it does not starve the
//! pipelines that run today.
//!
//! The staged-file writers go through [`ThrottledStore`], which makes every upload wait for its
//! bytes in a token bucket shared by the whole run. Reads follow: the model's query is pulled
//! only as fast as its output is written, so a bound on written bytes bounds the scan too.
//! Run it with `--max-parallel 1` for the smoothest traffic.

use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use deltalake::Path;
use deltalake::logstore::object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions, Result as StoreResult,
    UploadPart,
};
use futures::stream::BoxStream;

/// A token bucket of bytes, one second deep; callers that overdraw it wait off their debt.
#[derive(Debug)]
pub struct Throttle {
    bytes_per_second: f64,
    state: Mutex<(Instant, f64)>,
}

impl Throttle {
    /// A bound of `bytes_per_second` (at least 1).
    pub fn new(bytes_per_second: u64) -> Self {
        let rate = bytes_per_second.max(1) as f64;
        Self {
            bytes_per_second: rate,
            state: Mutex::new((Instant::now(), rate)),
        }
    }

    /// Waits until `bytes` may pass.
    pub async fn acquire(&self, bytes: u64) {
        let wait = {
            let mut state = match self.state.lock() {
                Ok(guard) => guard,
                Err(poisoned) => poisoned.into_inner(),
            };
            let now = Instant::now();
            let refill = now.duration_since(state.0).as_secs_f64() * self.bytes_per_second;
            state.0 = now;
            state.1 = (state.1 + refill).min(self.bytes_per_second) - bytes as f64;
            if state.1 < 0.0 {
                Duration::from_secs_f64(-state.1 / self.bytes_per_second)
            } else {
                Duration::ZERO
            }
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

/// An object store whose uploads wait for a [`Throttle`].
pub struct ThrottledStore {
    inner: Arc<dyn ObjectStore>,
    throttle: Arc<Throttle>,
}

impl ThrottledStore {
    /// Wraps `inner` so that its writes wait on `throttle`.
    pub fn wrap(
        inner: Arc<dyn ObjectStore>,
        throttle: Option<Arc<Throttle>>,
    ) -> Arc<dyn ObjectStore> {
        match throttle {
            Some(throttle) => Arc::new(Self { inner, throttle }),
            None => inner,
        }
    }
}

impl fmt::Display for ThrottledStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Throttled({})", self.inner)
    }
}

impl fmt::Debug for ThrottledStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThrottledStore")
            .field("throttle", &self.throttle)
            .finish()
    }
}

#[async_trait]
impl ObjectStore for ThrottledStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> StoreResult<PutResult> {
        self.throttle.acquire(payload.content_length() as u64).await;
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> StoreResult<Box<dyn MultipartUpload>> {
        let upload = self.inner.put_multipart_opts(location, opts).await?;
        Ok(Box::new(ThrottledUpload {
            inner: upload,
            throttle: Arc::clone(&self.throttle),
        }))
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> StoreResult<GetResult> {
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> StoreResult<Vec<Bytes>> {
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, StoreResult<Path>>,
    ) -> BoxStream<'static, StoreResult<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, StoreResult<ObjectMeta>> {
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, StoreResult<ObjectMeta>> {
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> StoreResult<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> StoreResult<()> {
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(&self, from: &Path, to: &Path, options: RenameOptions) -> StoreResult<()> {
        self.inner.rename_opts(from, to, options).await
    }
}

#[derive(Debug)]
struct ThrottledUpload {
    inner: Box<dyn MultipartUpload>,
    throttle: Arc<Throttle>,
}

#[async_trait]
impl MultipartUpload for ThrottledUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        let bytes = data.content_length() as u64;
        let throttle = Arc::clone(&self.throttle);
        // The part completes only once its bytes are paid for; the writer keeps a bounded number
        // of parts in flight, so that bounds the upload rate.
        let part = self.inner.put_part(data);
        Box::pin(async move {
            throttle.acquire(bytes).await;
            part.await
        })
    }

    async fn complete(&mut self) -> StoreResult<PutResult> {
        self.inner.complete().await
    }

    async fn abort(&mut self) -> StoreResult<()> {
        self.inner.abort().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_bucket_bounds_the_rate() {
        let throttle = Throttle::new(1_000_000);
        let started = Instant::now();
        // One second of burst, then 1.5 MB more must take at least 1.5 s.
        for _ in 0..25 {
            throttle.acquire(100_000).await;
        }
        assert!(
            started.elapsed() >= Duration::from_millis(1_400),
            "{:?}",
            started.elapsed()
        );
    }
}
