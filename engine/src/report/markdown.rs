//! Markdown escaping for the report templates. minijinja escapes HTML and JSON; Markdown has
//! three contexts, each with its own rules, so they are written here:
//! - text: every character Markdown or the HTML inside it acts on is backslash-escaped, and a
//!   line break becomes a space (a reason cannot start a heading, a link or a table row);
//! - a code span (`code` filter): fenced by more backticks than the value holds;
//! - a fenced block (`fenced` filter): fenced by more backticks than any line holds.
//!
//! In every context a control character (a terminal escape sequence) is shown escaped, and `|`
//! is escaped so that a value never splits a table cell.

use minijinja::value::Value;
use minijinja::{AutoEscape, Output, State};

/// The name of the auto-escape mode of the Markdown templates.
pub(super) const AUTO_ESCAPE: &str = "markdown";

/// Writes a value into a template: Markdown text is escaped; every other mode as minijinja does.
pub(super) fn formatter(
    out: &mut Output,
    state: &State,
    value: &Value,
) -> Result<(), minijinja::Error> {
    if state.auto_escape() != AutoEscape::Custom(AUTO_ESCAPE) {
        return minijinja::escape_formatter(out, state, value);
    }
    if value.is_safe() {
        return write_plain(out, value);
    }
    match value.as_str() {
        Some(text) => out
            .write_str(&text_escaped(text))
            .map_err(minijinja::Error::from),
        None => write_plain(out, value),
    }
}

/// A value as a code span.
pub(super) fn code(value: Value) -> Value {
    let text = one_line(&value.to_string()).replace('|', "\\|");
    let fence = "`".repeat(longest_run(&text, '`') + 1);
    let pad = if text.starts_with('`') || text.ends_with('`') {
        " "
    } else {
        ""
    };
    Value::from_safe_string(format!("{fence}{pad}{text}{pad}{fence}"))
}

/// A value as a fenced block of `language`.
pub(super) fn fenced(value: Value, language: &str) -> Value {
    let text = controls_escaped(&value.to_string(), true);
    let fence = "`".repeat(longest_run(&text, '`').max(2) + 1);
    let language: String = language
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .collect();
    let newline = if text.ends_with('\n') { "" } else { "\n" };
    Value::from_safe_string(format!("{fence}{language}\n{text}{newline}{fence}"))
}

/// Text with every character Markdown (or HTML) acts on escaped, on one line: emphasis, code,
/// links and images, HTML and entities, table cells, and a heading opened by the first
/// character (a value never starts a line where a list could open).
fn text_escaped(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let chars: Vec<char> = text.chars().collect();
    let word = |i: Option<usize>| {
        i.and_then(|i| chars.get(i))
            .is_some_and(|c| c.is_alphanumeric())
    };
    for (i, &c) in chars.iter().enumerate() {
        // `_` inside a word (`event_id`) is no emphasis; at a word's edge it may be.
        let edge_underscore = c == '_' && !(word(i.checked_sub(1)) && word(Some(i + 1)));
        if matches!(c, '\n' | '\r') {
            out.push(' ');
        } else if c.is_control() && c != '\t' {
            // `\u{1b}`: a backslash before a letter is no Markdown escape; it shows as written.
            out.extend(c.escape_default());
        } else {
            if "\\`*[]<>|~&".contains(c) || edge_underscore || (i == 0 && c == '#') {
                out.push('\\');
            }
            out.push(c);
        }
    }
    out
}

/// Text on one line: line breaks become spaces, other control characters are shown escaped.
fn one_line(text: &str) -> String {
    let spaced: String = text
        .chars()
        .map(|c| if matches!(c, '\n' | '\r') { ' ' } else { c })
        .collect();
    controls_escaped(&spaced, false)
}

fn controls_escaped(text: &str, keep_newlines: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() && !(keep_newlines && c == '\n') && c != '\t' {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

fn longest_run(text: &str, of: char) -> usize {
    let (mut longest, mut run) = (0, 0);
    for c in text.chars() {
        run = if c == of { run + 1 } else { 0 };
        longest = longest.max(run);
    }
    longest
}

fn write_plain(out: &mut Output, value: &Value) -> Result<(), minijinja::Error> {
    write!(out, "{value}").map_err(minijinja::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_context_escapes_what_acts_in_it() {
        assert_eq!(
            text_escaped("# a\n<b>|[c](d) *e* _f_ g_h \u{1b}[0m"),
            "\\# a \\<b\\>\\|\\[c\\](d) \\*e\\* \\_f\\_ g_h \\u{1b}\\[0m"
        );
        assert_eq!(code(Value::from("a`b|c")).to_string(), "``a`b\\|c``");
        assert_eq!(code(Value::from("`x")).to_string(), "`` `x ``");
        assert_eq!(
            fenced(Value::from("-a\n```\n+b"), "diff").to_string(),
            "````diff\n-a\n```\n+b\n````"
        );
    }
}
