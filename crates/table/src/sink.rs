//! A notification sink as the project file declares it: `file:PATH`, `http(s)://…` or
//! `openlineage+http(s)://…`, with an optional `secret` and filters (`events`,
//! `min_changed_rows`). Parsed and checked when the project is loaded; delivering is the
//! runner's (`lakefill::notify`).
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

use std::path::{Path, PathBuf};

use url::Url;

/// The event types a sink may filter on.
pub const EVENT_TYPES: &[&str] = &[
    "backfill.published",
    "backfill.reverted",
    "cascade.published",
];

/// A sink as written in `lakefill.toml`: a URL, or a table with `url` and optionally `secret`,
/// `events` and `min_changed_rows` (read by [`Sink::parse`], which names what is wrong).
pub type RawSink = toml::Value;

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

/// Where a sink delivers.
#[derive(Clone, Debug)]
pub enum Target {
    /// `file:PATH`: a JSON line appended to the file.
    File(PathBuf),
    /// `http(s)://…`: the event POSTed.
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
    pub fn parse(
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
    pub fn id(&self) -> String {
        use sha2::Digest as _;
        let target = match &self.target {
            Target::File(path) => format!("file:{}", path.display()),
            Target::Http(url) => url.to_string(),
            Target::OpenLineage(url) => format!("openlineage+{url}"),
        };
        hex::encode(sha2::Sha256::digest(target))[..16].to_string()
    }

    /// Where the sink delivers.
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// The secret that signs HTTP deliveries, if any.
    pub fn secret(&self) -> Option<&str> {
        self.secret.as_deref()
    }

    /// The event types the sink takes (all when empty).
    pub fn events(&self) -> &[String] {
        &self.events
    }

    /// The fewest changed rows an event must have for the sink to take it.
    pub fn min_changed_rows(&self) -> u64 {
        self.min_changed_rows
    }
}
