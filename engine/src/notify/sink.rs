//! Where events go: `file:PATH` appends a JSON line, `openlineage+http(s)://…` POSTs an OpenLineage
//! RunEvent of it ([`super::lineage`]), `http(s)://…` POSTs the event (signed as the
//! Standard Webhooks convention says when a secret is set), each with optional filters.
//!
//! In `lakefill.toml`, per table (`[tables.NAME] notify = [...]`) or for every table (a
//! top-level `notify = [...]`), a sink is a URL, or a table:
//!
//! ```toml
//! notify = [
//!   "file:notifications.jsonl",
//!   { url = "https://hooks.example.com/lake", secret = "${HOOK_SECRET}",
//!     events = ["backfill.published"], min_changed_rows = 100 },
//! ]
//! ```

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use hmac::{KeyInit as _, Mac as _};
use url::Url;

use super::event::Event;

/// The event types a sink may filter on.
pub const EVENT_TYPES: &[&str] = &[
    "backfill.published",
    "backfill.reverted",
    "cascade.published",
];

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

/// A sink as written in `lakefill.toml`: a URL, or a table with `url` and optionally `secret`,
/// `events` and `min_changed_rows` (read by [`Sink::parse`], which names what is wrong).
pub(crate) type RawSink = toml::Value;

/// The keys of a sink's table form.
const SINK_KEYS: &[&str] = &["url", "secret", "events", "min_changed_rows"];

/// A configured sink.
#[derive(Clone)]
pub struct Sink {
    target: Target,
    /// As written, with `${ENV}` unexpanded: names the sink in output and in its delivery state.
    name: String,
    secret: Option<String>,
    events: Vec<String>,
    min_changed_rows: u64,
}

#[derive(Clone, Debug)]
enum Target {
    File(PathBuf),
    Http(Url),
    /// `openlineage+http(s)://…`: an OpenLineage RunEvent POSTed to the URL without the prefix.
    OpenLineage(Url),
}

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sink")
            .field("name", &self.name)
            .field("secret", &self.secret.as_ref().map(|_| "****"))
            .field("events", &self.events)
            .field("min_changed_rows", &self.min_changed_rows)
            .finish()
    }
}

impl Sink {
    /// Reads one sink of the project in `root`; `expand` expands `${ENV}` references. The error
    /// says what is wrong with it.
    pub(crate) fn parse(
        raw: &RawSink,
        root: &Path,
        expand: impl Fn(&str) -> crate::error::Result<String>,
    ) -> std::result::Result<Self, String> {
        let (url, secret, events, min_changed_rows) = match raw {
            toml::Value::String(url) => (url.clone(), None, Vec::new(), 0),
            toml::Value::Table(table) => {
                if let Some(unknown) = table.keys().find(|k| !SINK_KEYS.contains(&k.as_str())) {
                    return Err(format!(
                        "unknown key `{unknown}` (a sink has {})",
                        SINK_KEYS.join(", ")
                    ));
                }
                let text = |key: &str| match table.get(key) {
                    None => Ok(None),
                    Some(toml::Value::String(s)) => Ok(Some(s.clone())),
                    Some(_) => Err(format!("`{key}` must be a string")),
                };
                let url = text("url")?.ok_or("a sink table needs a `url`")?;
                let events = match table.get("events") {
                    None => Vec::new(),
                    Some(toml::Value::Array(items)) => items
                        .iter()
                        .map(|i| i.as_str().map(str::to_string))
                        .collect::<Option<Vec<_>>>()
                        .ok_or("`events` must be a list of event types")?,
                    Some(_) => return Err("`events` must be a list of event types".into()),
                };
                let min_changed_rows = match table.get("min_changed_rows") {
                    None => 0,
                    Some(toml::Value::Integer(n)) if *n >= 0 => *n as u64,
                    Some(_) => {
                        return Err("`min_changed_rows` must be a whole number, 0 or more".into());
                    }
                };
                (url, text("secret")?, events, min_changed_rows)
            }
            _ => {
                return Err(
                    "a sink is a URL such as `file:notifications.jsonl`, or a table with a `url`"
                        .into(),
                );
            }
        };
        for event in &events {
            if !EVENT_TYPES.contains(&event.as_str()) {
                return Err(format!(
                    "unknown event type `{event}` (known: {})",
                    EVENT_TYPES.join(", ")
                ));
            }
        }
        let expanded = expand(&url).map_err(|e| e.to_string())?;
        if expanded.starts_with("file:") {
            crate::secrets::register_url_credentials(&expanded);
        } else {
            crate::secrets::register_sink_url(&expanded);
            crate::secrets::register_sink_url(expanded.trim_start_matches("openlineage+"));
        }
        let secret = secret
            .map(|s| expand(&s).map_err(|e| e.to_string()))
            .transpose()?;
        if let Some(secret) = &secret {
            crate::secrets::register(secret);
        }
        let target = if let Some(path) = expanded.strip_prefix("file:") {
            let path = path.strip_prefix("//").unwrap_or(path);
            if path.is_empty() {
                return Err("`file:` needs a path, e.g. `file:notifications.jsonl`".into());
            }
            Target::File(root.join(path))
        } else if expanded.starts_with("http://") || expanded.starts_with("https://") {
            Target::Http(Url::parse(&expanded).map_err(|e| format!("`{url}` is not a URL: {e}"))?)
        } else if let Some(http) = expanded
            .strip_prefix("openlineage+")
            .filter(|u| u.starts_with("http://") || u.starts_with("https://"))
        {
            Target::OpenLineage(Url::parse(http).map_err(|e| format!("`{url}` is not a URL: {e}"))?)
        } else {
            return Err(format!(
                "`{url}` is not a sink: use `file:PATH`, an `http(s)://` URL or an `openlineage+http(s)://` URL"
            ));
        };
        if secret.is_some() && matches!(target, Target::File(_)) {
            return Err("a `secret` signs HTTP deliveries; a `file:` sink has none".into());
        }
        Ok(Self {
            target,
            name: url,
            secret,
            events,
            min_changed_rows,
        })
    }

    /// The sink as reports and logs name it: a `file:` path or a `${VARIABLE}` reference as
    /// written, an HTTP URL written out by its scheme, host and the shape of its path only (a
    /// webhook's URL is its credential, #33).
    pub fn name(&self) -> String {
        match &self.target {
            Target::File(_) => crate::secrets::mask(&self.name),
            _ if self.name.trim_start().starts_with("${") => crate::secrets::mask(&self.name),
            Target::Http(url) => crate::secrets::redacted_url(url.as_str()),
            Target::OpenLineage(url) => {
                format!("openlineage+{}", crate::secrets::redacted_url(url.as_str()))
            }
        }
    }

    /// A stable id for the sink's delivery state: a digest of where it delivers.
    pub(crate) fn id(&self) -> String {
        use sha2::Digest as _;
        let target = match &self.target {
            Target::File(path) => format!("file:{}", path.display()),
            Target::Http(url) => url.to_string(),
            Target::OpenLineage(url) => format!("openlineage+{url}"),
        };
        hex::encode(sha2::Sha256::digest(target))[..16].to_string()
    }

    /// Whether the sink wants `event` (its type and size filters).
    pub(crate) fn wants(&self, event: &Event) -> bool {
        (self.events.is_empty() || self.events.contains(&event.kind))
            && event.changed_rows() >= self.min_changed_rows
    }

    /// Delivers `event` (its JSON `body`), retrying a few times with backoff, until `deadline`
    /// (no attempt starts after it, and none runs past it).
    pub(crate) async fn deliver(
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
            let result = match &self.target {
                Target::File(path) => append_line(path, &event.event_id, body),
                Target::Http(url) => self.post(url, event, body, timeout).await,
                Target::OpenLineage(url) => {
                    let run_event = super::lineage::run_event(event).to_string();
                    self.post(url, event, &run_event, timeout).await
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

    async fn post(
        &self,
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
        if let Some(secret) = &self.secret {
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
            .map_err(|e| crate::secrets::mask(&e.without_url().to_string()))?;
        let status = response.status();
        if status.is_success() {
            Ok(())
        } else {
            Err(format!("the receiver answered {status}"))
        }
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
