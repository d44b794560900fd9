//! The only module that prints: results on stdout, status and errors on stderr.

#![expect(clippy::print_stderr, reason = "the printer is where output happens")]

use std::fmt::Write as _;
use std::io::Write as _;

use std::io::IsTerminal as _;
use std::sync::Arc;

use lakefill::{ProgressEvent, ProgressSink};
use serde::Serialize;

use crate::args::OutputFormat;

/// Whether a result document went to stdout (so an error after it adds none).
static RESULT_PRINTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// What a failed command tells its caller besides the message.
#[derive(Debug, Default)]
pub(crate) struct Failure {
    /// The next step.
    pub(crate) hint: Option<String>,
    /// The process exit code.
    pub(crate) exit_code: u8,
    /// The run the error is about.
    pub(crate) run_id: Option<String>,
    /// The run's state.
    pub(crate) state: Option<String>,
}

/// Writes results and status lines according to the global flags.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Printer {
    format: OutputFormat,
    quiet: bool,
    verbose: bool,
}

impl Printer {
    pub(crate) fn new(format: OutputFormat, quiet: bool, verbose: bool) -> Self {
        Self {
            format,
            quiet,
            verbose,
        }
    }

    /// Where a run's progress goes: JSON lines on stderr with `--output-format json`, a bar on
    /// a terminal, nothing under `-q` (or `-v`, whose logs would garble a bar).
    pub(crate) fn progress(&self) -> Option<Arc<dyn ProgressSink>> {
        if self.quiet {
            return None;
        }
        match self.format {
            OutputFormat::Json => Some(Arc::new(JsonProgress)),
            OutputFormat::Text if !self.verbose && std::io::stderr().is_terminal() => {
                Some(Arc::new(BarProgress::new()))
            }
            OutputFormat::Text => None,
        }
    }

    pub(crate) fn format(&self) -> OutputFormat {
        self.format
    }

    /// Prints a result: `text` for people, or `value` as one JSON document.
    pub(crate) fn result(&self, text: &str, value: &impl Serialize) -> anyhow::Result<()> {
        RESULT_PRINTED.store(true, std::sync::atomic::Ordering::SeqCst);
        let mut stdout = std::io::stdout().lock();
        match self.format {
            OutputFormat::Text => stdout.write_all(safe_text(text).as_bytes())?,
            OutputFormat::Json => {
                // JSON stays exact (its encoder escapes control characters); secrets still go.
                let document = serde_json::to_string_pretty(value)?;
                stdout.write_all(lakefill::mask_secrets(&document).as_bytes())?;
                stdout.write_all(b"\n")?;
            }
        }
        stdout.flush()?;
        Ok(())
    }

    /// Prints a document (a report) on stdout as it is: already masked, and meant to be saved.
    pub(crate) fn raw(&self, text: &str) -> anyhow::Result<()> {
        RESULT_PRINTED.store(true, std::sync::atomic::Ordering::SeqCst);
        let mut stdout = std::io::stdout().lock();
        stdout.write_all(text.as_bytes())?;
        stdout.flush()?;
        Ok(())
    }

    /// Prints shell completions for `lakefill` on stdout.
    pub(crate) fn completions(&self, shell: clap_complete::Shell) -> anyhow::Result<()> {
        use clap::CommandFactory as _;
        let mut command = crate::args::Cli::command();
        let mut stdout = std::io::stdout().lock();
        clap_complete::generate(shell, &mut command, "lakefill", &mut stdout);
        stdout.flush()?;
        Ok(())
    }

    /// Prints a status line on stderr, unless `-q`.
    pub(crate) fn status(&self, line: &str) {
        if !self.quiet {
            eprintln!("{}", safe_text(line));
        }
    }

    /// Prints an error chain and its hint on stderr (always, even under `-q`). With
    /// `--output-format json` it also prints one JSON document on stdout, unless the command
    /// already printed its result there (a failed validation prints its report first).
    pub(crate) fn error(&self, error: &anyhow::Error, failure: &Failure) {
        let mut out = format!("error: {error}\n");
        // Some errors repeat their source in their own message; print each text once.
        let mut previous = error.to_string();
        let mut causes = Vec::new();
        for cause in error.chain().skip(1) {
            let text = without_backtrace(&cause.to_string());
            if !previous.contains(&text) {
                let _ = writeln!(out, "caused by: {text}");
                causes.push(text.clone());
            }
            previous = text;
        }
        if let Some(hint) = &failure.hint {
            let _ = write!(out, "\nhint: {hint}\n");
        }
        eprint!("{}", safe_text(&out));
        if self.format == OutputFormat::Json
            && !RESULT_PRINTED.load(std::sync::atomic::Ordering::SeqCst)
        {
            let document = serde_json::json!({
                "error": error.to_string(),
                "caused_by": causes,
                "hint": failure.hint,
                "exit_code": failure.exit_code,
                "run_id": failure.run_id,
                "state": failure.state,
            });
            let mut stdout = std::io::stdout().lock();
            if let Ok(document) = serde_json::to_string_pretty(&document) {
                let _ = stdout.write_all(lakefill::mask_secrets(&document).as_bytes());
            }
            let _ = stdout.write_all(b"\n");
            let _ = stdout.flush();
        }
    }
}

/// Text for a terminal: secrets masked, and control characters (an escape sequence in a reason
/// another writer put in the log) shown escaped instead of acted on. Newlines and tabs stay.
pub(crate) fn safe_text(text: &str) -> String {
    let masked = lakefill::mask_secrets(text);
    if !masked
        .chars()
        .any(|c| c.is_control() && c != '\n' && c != '\t')
    {
        return masked;
    }
    let mut out = String::with_capacity(masked.len());
    for c in masked.chars() {
        if c.is_control() && c != '\n' && c != '\t' {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// An error's text without the Rust backtrace some libraries append to it (the Delta kernel
/// does under `RUST_BACKTRACE`): numbered frames are for bug reports, not for users (#32).
fn without_backtrace(text: &str) -> String {
    let frame = |line: &str| {
        let line = line.trim_start();
        line.split_once(": ")
            .is_some_and(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
    };
    let mut lines: Vec<&str> = Vec::new();
    for line in text.lines() {
        if frame(line) && line.starts_with(char::is_whitespace) {
            break;
        }
        lines.push(line);
    }
    lines.join("\n").trim_end().to_string()
}

/// Progress as one JSON document per line on stderr, for schedulers.
struct JsonProgress;

impl ProgressSink for JsonProgress {
    fn event(&self, event: &ProgressEvent) {
        if let Ok(line) = serde_json::to_string(event) {
            eprintln!("{line}");
        }
    }
}

/// A progress bar per run on stderr.
struct BarProgress {
    bar: indicatif::ProgressBar,
}

impl BarProgress {
    fn new() -> Self {
        let bar = indicatif::ProgressBar::with_draw_target(
            Some(0),
            indicatif::ProgressDrawTarget::stderr(),
        );
        let style = indicatif::ProgressStyle::with_template(
            "{spinner} [{bar:28}] {pos}/{len} batches  {msg}  ETA {eta}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> ");
        bar.set_style(style);
        Self { bar }
    }
}

impl ProgressSink for BarProgress {
    fn event(&self, event: &ProgressEvent) {
        match event {
            ProgressEvent::Started {
                batches_total,
                batches_resumed,
                ..
            } => {
                self.bar.set_length(*batches_total as u64);
                self.bar.set_position(*batches_resumed as u64);
                self.bar.set_message("staging");
                self.bar
                    .enable_steady_tick(std::time::Duration::from_millis(120));
            }
            ProgressEvent::BatchFinished {
                batches_done,
                rows_total,
                bytes_total,
                elapsed_ms,
                ..
            } => {
                self.bar.set_position(*batches_done as u64);
                let rate = *rows_total as f64 / (*elapsed_ms as f64 / 1000.0).max(0.001);
                self.bar.set_message(format!(
                    "{rows_total} rows ({rate:.0} rows/s), {} written",
                    crate::render::bytes(*bytes_total)
                ));
            }
            ProgressEvent::Phase { phase, .. } => self.bar.set_message(phase.clone()),
            ProgressEvent::Finished { .. } => self.bar.finish_and_clear(),
        }
    }
}
