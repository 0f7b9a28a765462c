//! The fields of a plain-text log line, written as tracing-subscriber's default writer
//! writes them (`name=value`, strings quoted), but without `core::fmt` for the common
//! values, and without the colour styles that paint nothing (and allocate doing it): a
//! checkout's line is a dozen integers, booleans and short ASCII strings, and formatting
//! each through `write!` cost more than the rest of the line. Anything else goes to the default writer, so the text is
//! the same byte for byte (a unit test compares the two).

use std::fmt;

use tracing::field::{Field, Visit};
use tracing_subscriber::field::{RecordFields, VisitOutput};
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::fmt::format::{DefaultVisitor, Writer};

/// [`FormatFields`] for plain text (no colour codes).
#[derive(Clone, Copy, Debug, Default)]
pub struct PlainFields;

impl<'writer> FormatFields<'writer> for PlainFields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'writer>, fields: R) -> fmt::Result {
        let mut visitor = Plain {
            writer,
            is_empty: true,
            result: Ok(()),
        };
        fields.record(&mut visitor);
        visitor.result
    }
}

struct Plain<'a> {
    writer: Writer<'a>,
    is_empty: bool,
    result: fmt::Result,
}

impl Plain<'_> {
    /// Writes `name=` and then `value`, or hands the field to the default writer when
    /// its name is one it treats apart (the message, `r#` names, `log.` metadata).
    fn put(&mut self, field: &Field, value: impl FnOnce(&mut Writer<'_>) -> fmt::Result) -> bool {
        let name = field.name();
        if name == "message" || name.starts_with("r#") || name.starts_with("log.") {
            return false;
        }
        if self.result.is_ok() {
            self.result = (|| {
                if !std::mem::take(&mut self.is_empty) {
                    self.writer.write_char(' ')?;
                }
                self.writer.write_str(name)?;
                self.writer.write_char('=')?;
                value(&mut self.writer)
            })();
        }
        true
    }

    /// The default writer's way with this field. It skips `log.` metadata, which leaves
    /// the line as it was.
    fn by_default(&mut self, field: &Field, record: impl FnOnce(&mut DefaultVisitor<'_>)) {
        if self.result.is_err() || field.name().starts_with("log.") {
            return;
        }
        let is_empty = std::mem::take(&mut self.is_empty);
        let mut visitor = DefaultVisitor::new(self.writer.by_ref(), is_empty);
        record(&mut visitor);
        self.result = VisitOutput::finish(visitor);
    }
}

/// Text that `{:?}` writes as itself between quotes: printable ASCII but `"` and `\`.
fn plain(value: &str) -> bool {
    value
        .bytes()
        .all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\')
}

impl Visit for Plain<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if plain(value)
            && self.put(field, |w| {
                w.write_char('"')?;
                w.write_str(value)?;
                w.write_char('"')
            })
        {
            return;
        }
        self.by_default(field, |v| v.record_str(field, value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        if !self.put(field, |w| w.write_str(itoa::Buffer::new().format(value))) {
            self.by_default(field, |v| v.record_u64(field, value));
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        if !self.put(field, |w| w.write_str(itoa::Buffer::new().format(value))) {
            self.by_default(field, |v| v.record_i64(field, value));
        }
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        if !self.put(field, |w| w.write_str(if value { "true" } else { "false" })) {
            self.by_default(field, |v| v.record_bool(field, value));
        }
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.by_default(field, |v| v.record_error(field, value));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if !self.put(field, |w| write!(w, "{value:?}")) {
            self.by_default(field, |v| v.record_debug(field, value));
        }
    }
}

#[cfg(test)]
mod tests {
    use tracing_subscriber::fmt::format::DefaultFields;

    use super::*;
    use crate::telemetry::testing::CapturedLogs;

    /// Log lines of every kind of field, in a span with fields recorded late.
    fn log_lines() {
        let error = std::io::Error::other("disk \"full\"");
        let span = tracing::info_span!(
            "http",
            method = "POST",
            path = "/checkout",
            late = tracing::field::Empty
        );
        let _entered = span.enter();
        span.record("late", 7_u64);
        tracing::info!(
            order = "A-100",
            quoted = "say \"hi\"",
            slash = "a\\b",
            unicode = "café",
            control = "tab\there",
            count = 3_u64,
            negative = -4_i64,
            charged = true,
            ratio = 0.5_f64,
            models = ?["gpt-4o-mini"],
            shown = %"display",
            r#type = "raw",
            "checkout confirmed"
        );
        tracing::warn!(
            error = &error as &(dyn std::error::Error + 'static),
            "with {} args \x1b[31m",
            2
        );
        tracing::info!(empty = "", "");
    }

    fn written<N>(fields: N) -> String
    where
        N: for<'w> FormatFields<'w> + Send + Sync + 'static,
    {
        let lines = CapturedLogs::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(lines.clone())
            .with_ansi(false)
            .without_time()
            .fmt_fields(fields)
            .finish();
        tracing::subscriber::with_default(subscriber, log_lines);
        lines.text()
    }

    #[test]
    fn plain_fields_write_what_the_default_writer_writes() {
        let plain = written(PlainFields);
        assert_eq!(plain, written(DefaultFields::new()));
        assert_eq!(plain.lines().count(), 3);
        assert!(
            plain.contains(r#"order="A-100" quoted="say \"hi\"""#),
            "{plain}"
        );
    }
}
