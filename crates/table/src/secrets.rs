//! Secrets never show: masking by value, wherever a secret would otherwise appear.
//!
//! Storage options hold credentials, and so may URLs (`http://user:pass@host`, `s3://user:pass@`).
//! Masking by key name alone misses an endpoint with credentials, or a uri in an error message.
//! So the project loader [`register`]s every secret value it sees (values of secret-named options,
//! the user and password of every URL), and everything lakefill prints, logs or writes passes
//! through [`mask`], which replaces each registered value, and any URL userinfo at all, with
//! `****`. The registry is process-wide: a value is a secret for as long as the process runs.

use std::collections::BTreeSet;
use std::sync::{LazyLock, RwLock};

/// What a masked secret looks like.
pub const MASK: &str = "****";

/// Values shorter than this are not masked: masking every `a` would make output unreadable, and
/// such values are not secrets worth the name.
const SHORTEST: usize = 4;

static SECRETS: LazyLock<RwLock<BTreeSet<String>>> = LazyLock::new(|| RwLock::new(BTreeSet::new()));

/// Registers `value` as a secret (and its forms escaped in JSON and percent-encoded in URLs).
pub fn register(value: &str) {
    let value = value.trim();
    if value.chars().count() < SHORTEST {
        return;
    }
    let json = serde_json::to_string(value).unwrap_or_default();
    let json = json.trim_matches('"').to_string();
    let encoded = url::form_urlencoded::byte_serialize(value.as_bytes()).collect::<String>();
    if let Ok(mut secrets) = SECRETS.write() {
        for form in [value.to_string(), json, encoded] {
            if form.chars().count() >= SHORTEST {
                secrets.insert(form);
            }
        }
    }
}

/// Registers the user and password of `text` if it is a URL with credentials.
pub fn register_url_credentials(text: &str) {
    if let Ok(url) = url::Url::parse(text.trim()) {
        if !url.username().is_empty() && !names_a_container(url.scheme(), url.password()) {
            register(url.username());
            if let Ok(decoded) = percent_decode(url.username()) {
                register(&decoded);
            }
        }
        if let Some(password) = url.password() {
            register(password);
            if let Ok(decoded) = percent_decode(password) {
                register(&decoded);
            }
        }
    }
}

/// Registers what of a sink's URL can hold a secret (#33): the whole URL, its path (Slack-style
/// `/services/T/B/XXXX`) and its query (`?token=…`), so that no stray copy of them is printed.
pub fn register_sink_url(text: &str) {
    register_url_credentials(text);
    register(text);
    if let Ok(url) = url::Url::parse(text.trim()) {
        if url.path().len() > 1 {
            register(url.path());
        }
        if let Some(query) = url.query() {
            register(query);
        }
    }
}

/// A URL as reports show a sink: scheme, host and port, and the shape of its path and query,
/// every segment and the query masked (a webhook's URL is its credential).
pub fn redacted_url(text: &str) -> String {
    let Ok(url) = url::Url::parse(text.trim()) else {
        return MASK.to_string();
    };
    let mut out = format!("{}://{}", url.scheme(), url.host_str().unwrap_or(""));
    if let Some(port) = url.port() {
        out.push_str(&format!(":{port}"));
    }
    for _ in url.path().split('/').filter(|s| !s.is_empty()) {
        out.push('/');
        out.push_str(MASK);
    }
    if url.query().is_some() {
        out.push('?');
        out.push_str(MASK);
    }
    out
}

fn percent_decode(text: &str) -> std::result::Result<String, std::string::FromUtf8Error> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Ok(byte) = u8::from_str_radix(&text[i + 1..i + 3], 16)
        {
            out.push(byte);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8(out)
}

/// Whether the user part of a URL names an Azure container, not a user: ADLS Gen2 locations are
/// `abfss://container@account.dfs.core.windows.net/path`, with no password.
fn names_a_container(scheme: &str, password: Option<&str>) -> bool {
    matches!(scheme.to_ascii_lowercase().as_str(), "abfs" | "abfss") && password.is_none()
}

/// `text` with every registered secret, the userinfo of every URL (but an ADLS container), and
/// the signature of every Azure SAS token (`sig=…`) replaced by `****`.
pub fn mask(text: &str) -> String {
    let mut out = mask_sas_signatures(&mask_userinfo(text));
    if let Ok(secrets) = SECRETS.read() {
        // Longest first, so a secret that contains another is masked whole.
        let mut ordered: Vec<&String> = secrets.iter().collect();
        ordered.sort_by_key(|s| std::cmp::Reverse(s.len()));
        for secret in ordered {
            if out.contains(secret.as_str()) {
                out = out.replace(secret.as_str(), MASK);
            }
        }
    }
    out
}

/// Replaces `user:password@` (or `user@`) after every `scheme://` with `****@`.
fn mask_userinfo(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        // The authority ends at the first `/`, `?`, `#`, whitespace or quote.
        let end = tail
            .find(|c: char| matches!(c, '/' | '?' | '#' | '"' | '\'' | '`') || c.is_whitespace())
            .unwrap_or(tail.len());
        let authority = &tail[..end];
        let scheme = head[..head.len() - 3]
            .rsplit(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
            .next()
            .unwrap_or("");
        let userinfo_password = authority
            .rfind('@')
            .and_then(|at| authority[..at].split_once(':').map(|(_, p)| p));
        match authority.rfind('@') {
            Some(_) if names_a_container(scheme, userinfo_password) => out.push_str(authority),
            Some(at) => {
                out.push_str(MASK);
                out.push_str(&authority[at..]);
            }
            None => out.push_str(authority),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// Replaces the value of every `sig=` query parameter (an Azure SAS token's signature, which
/// is its secret part) with `****`, wherever a URL or token shows in `text`.
fn mask_sas_signatures(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("sig=") {
        let starts_parameter = at == 0 || matches!(rest.as_bytes()[at - 1], b'?' | b'&' | b';');
        out.push_str(&rest[..at + 4]);
        rest = &rest[at + 4..];
        if !starts_parameter {
            continue;
        }
        let end = rest
            .find(|c: char| matches!(c, '&' | '#' | '"' | '\'' | '`' | ';') || c.is_whitespace())
            .unwrap_or(rest.len());
        if end > 0 {
            out.push_str(MASK);
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sink_url_shows_its_host_and_the_shape_of_its_path_only() {
        assert_eq!(
            redacted_url("https://hooks.slack.com/services/T0/B0/XXXX?token=abc"),
            format!("https://hooks.slack.com/{MASK}/{MASK}/{MASK}/{MASK}?{MASK}")
        );
        assert_eq!(
            redacted_url("http://127.0.0.1:8089/"),
            "http://127.0.0.1:8089"
        );
        assert_eq!(redacted_url("not a url"), MASK);
    }

    #[test]
    fn urls_lose_their_credentials_and_registered_values_their_text() {
        assert_eq!(
            mask("cannot reach http://user:hunter22@127.0.0.1:9000/x and s3://key@bucket/t"),
            "cannot reach http://****@127.0.0.1:9000/x and s3://****@bucket/t"
        );
        assert_eq!(mask("plain s3://bucket/t"), "plain s3://bucket/t");
        // An ADLS container is not a user; a password after it would be.
        assert_eq!(
            mask("at abfss://events@acct.dfs.core.windows.net/lake"),
            "at abfss://events@acct.dfs.core.windows.net/lake"
        );
        assert_eq!(mask("abfss://u:pw@acct/x"), "abfss://****@acct/x");
        // A SAS token's signature, in a URL or alone.
        assert_eq!(
            mask("GET http://h/c/b?sv=2024&sp=rl&sig=AbC%2Bd%3D&se=1 failed"),
            "GET http://h/c/b?sv=2024&sp=rl&sig=****&se=1 failed"
        );
        assert_eq!(mask("sig=xyz&sv=1"), "sig=****&sv=1");
        assert_eq!(mask("design=ok"), "design=ok");
        register("sekret-value-123");
        assert_eq!(mask("a sekret-value-123 b"), "a **** b");
        register("ab");
        assert_eq!(mask("ab cab"), "ab cab", "short values are not masked");
        register("quo\"te-secret");
        assert_eq!(mask(r#"{"v": "quo\"te-secret"}"#), r#"{"v": "****"}"#);
        register_url_credentials("http://alice:p%40ss-w0rd@host:1");
        // The user of a URL's userinfo is masked too (often an access key id).
        assert_eq!(mask("p@ss-w0rd and alice"), "**** and ****");
    }
}
