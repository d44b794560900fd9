//! Delivering to a sink ([`lakefill_table::sink::Sink`], as the project declares it):
//! `file:PATH` appends a JSON line, `openlineage+http(s)://…` POSTs an OpenLineage RunEvent of
//! it ([`super::lineage`]), `http(s)://…` POSTs the event (signed as the Standard Webhooks
//! convention says when a secret is set), each after the sink's filters.

use std::io::Write as _;
use std::path::Path;
use std::time::Duration;

use base64::Engine as _;
use hmac::{KeyInit as _, Mac as _};
use url::Url;

use super::event::Event;
use lakefill_table::sink::Target;
pub use lakefill_table::sink::{EVENT_TYPES, Sink};

/// Attempts per delivery before it is left for a later command.
const ATTEMPTS: u32 = 3;

/// How long one request may take before it counts as failed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a delivery did not happen.
#[derive(Debug)]
pub(crate) enum Undelivered {
    /// It was tried and failed: why the last attempt failed.
    Failed(String),
    /// The command's time for notifications ran out before it was tried.
    OutOfTime,
}

/// What the runner does with a sink: filter and deliver.
pub(crate) trait Deliver {
    /// Whether the sink wants `event` (its type and size filters).
    fn wants(&self, event: &Event) -> bool;

    /// Delivers `event` (its JSON `body`), retrying a few times with backoff, until `deadline`
    /// (no attempt starts after it, and none runs past it).
    async fn deliver(
        &self,
        event: &Event,
        body: &str,
        deadline: tokio::time::Instant,
    ) -> std::result::Result<(), Undelivered>;
}

impl Deliver for Sink {
    fn wants(&self, event: &Event) -> bool {
        (self.events().is_empty() || self.events().contains(&event.kind))
            && event.changed_rows() >= self.min_changed_rows()
    }

    async fn deliver(
        &self,
        event: &Event,
        body: &str,
        deadline: tokio::time::Instant,
    ) -> std::result::Result<(), Undelivered> {
        let mut last = None;
        for attempt in 0..ATTEMPTS {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                break;
            }
            let timeout = left.min(REQUEST_TIMEOUT);
            let result = match self.target() {
                Target::File(path) => append_line(path, &event.event_id, body),
                Target::Http(url) => post(self, url, event, body, timeout).await,
                Target::OpenLineage(url) => {
                    let run_event = super::lineage::run_event(event).to_string();
                    post(self, url, event, &run_event, timeout).await
                }
            };
            match result {
                Ok(()) => return Ok(()),
                Err(error) => {
                    tracing::debug!(sink = %self.name(), attempt, %error, "delivery failed");
                    last = Some((attempt + 1, error));
                }
            }
        }
        match last {
            Some((attempts, error)) => Err(Undelivered::Failed(format!(
                "{error} (after {attempts} attempt{})",
                if attempts == 1 { "" } else { "s" }
            ))),
            None => Err(Undelivered::OutOfTime),
        }
    }
}

/// POSTs `body` to `url` for `sink`, within `timeout`.
async fn post(
    sink: &Sink,
    url: &Url,
    event: &Event,
    body: &str,
    timeout: Duration,
) -> std::result::Result<(), String> {
    let timestamp = chrono::Utc::now().timestamp().to_string();
    let mut request = reqwest::Client::builder()
        .timeout(timeout)
        // A redirect would be followed as a GET without the event: a 3xx is a failure (#33).
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| e.to_string())?
        .post(url.clone())
        .header("content-type", "application/json")
        .header(
            "user-agent",
            concat!("lakefill/", env!("CARGO_PKG_VERSION")),
        )
        .header("webhook-id", &event.event_id)
        .header("webhook-timestamp", &timestamp);
    if let Some(secret) = sink.secret() {
        request = request.header(
            "webhook-signature",
            signature(secret, &event.event_id, &timestamp, body),
        );
    }
    let response = request
        .body(body.to_string())
        .send()
        .await
        // The client's error names the URL, which is the sink's credential: without it.
        .map_err(|e| lakefill_table::secrets::mask(&e.without_url().to_string()))?;
    let status = response.status();
    if status.is_success() {
        Ok(())
    } else {
        Err(format!("the receiver answered {status}"))
    }
}

/// `v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`, as Standard Webhooks signs: a secret
/// `whsec_<base64>` is the base64 of the key, any other secret is the key's bytes.
pub(crate) fn signature(secret: &str, id: &str, timestamp: &str, body: &str) -> String {
    let engine = base64::engine::general_purpose::STANDARD;
    let key = secret
        .strip_prefix("whsec_")
        .and_then(|encoded| engine.decode(encoded).ok())
        .unwrap_or_else(|| secret.as_bytes().to_vec());
    let mut mac =
        hmac::Hmac::<sha2_11::Sha256>::new_from_slice(&key).expect("HMAC takes keys of any size");
    mac.update(format!("{id}.{timestamp}.{body}").as_bytes());
    format!("v1,{}", engine.encode(mac.finalize().into_bytes()))
}

/// Appends `body` as one line to the file at `path`, unless a line of the same event is there
/// already (a delivery repeated after a crash writes it once).
fn append_line(path: &Path, event_id: &str, body: &str) -> std::result::Result<(), String> {
    let describe = |e: std::io::Error| format!("cannot write `{}`: {e}", path.display());
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(describe)?;
    }
    let needle = format!("\"event_id\":\"{event_id}\"");
    if let Ok(existing) = std::fs::read_to_string(path)
        && existing.lines().any(|line| line.contains(&needle))
    {
        return Ok(());
    }
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(describe)?;
    file.write_all(format!("{body}\n").as_bytes())
        .map_err(describe)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_follow_standard_webhooks() {
        // The example of the Standard Webhooks specification (its reference libraries' tests).
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let id = "msg_p5jXN8AQM9LWM0D4loKWxJek";
        let timestamp = "1614265330";
        let body = r#"{"test": 2432232314}"#;
        assert_eq!(
            signature(secret, id, timestamp, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }
}
