//! Where results go: tables for people, JSON for programs, no colour unless a person is
//! looking, and notes on stderr so stdout stays clean for pipes.

use std::borrow::Cow;
use std::io::{self, IsTerminal, Stdout, Write};

use comfy_table::{Attribute, Cell, Color, ContentArrangement, presets};
use serde::Serialize;

use crate::error::Result;
use crate::model::LetterView;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Aligned columns for a terminal.
    Table,
    /// Stable JSON: one object for reports, one line per message for streams.
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ColorChoice {
    /// Colour when stdout is a terminal and NO_COLOR is not set.
    Auto,
    Always,
    Never,
}

pub struct Output {
    pub format: Format,
    color: bool,
    tty: bool,
    quiet: bool,
    out: Buffered<Stdout>,
}

impl Output {
    pub fn new(format: Format, color: ColorChoice, quiet: bool) -> Self {
        let stdout = io::stdout();
        let tty = stdout.is_terminal();
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        let color = match color {
            ColorChoice::Always => true,
            ColorChoice::Never => false,
            ColorChoice::Auto => tty && !no_color,
        };
        Output { format, color, tty, quiet, out: Buffered::new(stdout) }
    }

    pub fn quiet(&self) -> bool {
        self.quiet
    }

    pub fn is_json(&self) -> bool {
        self.format == Format::Json
    }

    pub fn writer(&mut self) -> &mut impl Write {
        &mut self.out
    }

    /// One JSON value on its own line (JSONL for streams, one line for reports).
    pub fn json_line<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<()> {
        serde_json::to_writer(&mut self.out, value).map_err(io::Error::from)?;
        self.out.write_all(b"\n")?;
        Ok(())
    }

    /// One dead letter as a JSONL line.
    pub fn letter_line(&mut self, letter: &LetterView<'_>) -> Result<()> {
        self.out.letter_line(letter)?;
        Ok(())
    }

    /// A table in the kubectl style: no borders, upper-case headers, fitted to the terminal.
    pub fn table(&self, headers: &[&str]) -> Table {
        let mut table = comfy_table::Table::new();
        table.load_preset(presets::NOTHING);
        if self.tty {
            table.set_content_arrangement(ContentArrangement::Dynamic);
        }
        if !self.color {
            table.force_no_tty();
        } else {
            table.enforce_styling();
        }
        table.set_header(headers.iter().map(|h| self.header_cell(h)));
        Table(table)
    }

    fn header_cell(&self, text: &str) -> Cell {
        let cell = Cell::new(text.to_ascii_uppercase());
        if self.color { cell.add_attribute(Attribute::Bold) } else { cell }
    }

    /// A cell coloured when colour is on.
    pub fn colored(&self, text: impl ToString, color: Color) -> Shown {
        let cell = Shown::from(text.to_string()).0;
        Shown(if self.color { cell.fg(color) } else { cell })
    }

    pub fn print_table(&mut self, table: &mut Table) -> Result<()> {
        for line in table.render() {
            writeln!(self.out, "{line}")?;
        }
        Ok(())
    }

    /// A caveat for the person at the terminal: stderr, silenced by --quiet.
    pub fn note(&self, message: &str) {
        if !self.quiet {
            say(&format!("note: {message}"));
        }
    }

    pub fn finish(mut self) -> Result<()> {
        self.out.flush()?;
        Ok(())
    }
}

/// A line for the person at the terminal, on stderr, as `dlqctl: LINE`, made printable. A
/// stderr nobody reads any more (`dlqctl redrive … 2>&1 | head`) is no reason to stop: what
/// cannot be written is dropped.
pub fn say(line: &str) {
    let _ = writeln!(io::stderr(), "dlqctl: {}", printable(line));
}

/// A table whose every cell is [`Shown`]: nothing a message carries reaches the terminal raw.
pub struct Table(comfy_table::Table);

impl Table {
    pub fn add_row<T: Into<Shown>>(&mut self, cells: impl IntoIterator<Item = T>) {
        self.0.add_row(cells.into_iter().map(|c| c.into().0));
    }

    /// The table's lines as they are printed: two spaces between columns and none at the left
    /// edge, like kubectl.
    pub fn render(&mut self) -> Vec<String> {
        for column in self.0.column_iter_mut() {
            column.set_padding((0, 2));
        }
        self.0.lines().map(|line| line.trim_end().to_owned()).collect()
    }
}

/// The most characters a table cell shows; the rest is cut, with an ellipsis. A table lays out
/// every cell, and a cell of megabytes (a hostile id) took seconds to lay out.
pub const CELL_CHARS: usize = 256;

/// A table cell: its text [`printable`], and cut to [`CELL_CHARS`].
pub struct Shown(Cell);

impl From<&str> for Shown {
    fn from(text: &str) -> Self {
        Shown(Cell::new(printable_cut(text, CELL_CHARS)))
    }
}

/// [`printable`] text at most `chars` characters wide, escapes included, with an ellipsis where
/// it was cut. Only the first `chars` characters are read, whatever the text's length.
pub fn printable_cut(text: &str, chars: usize) -> String {
    let head_end = text.char_indices().nth(chars).map(|(at, _)| at);
    let escaped = printable(&text[..head_end.unwrap_or(text.len())]);
    let mut shown: String = escaped.chars().take(chars).collect();
    if head_end.is_some() || shown.len() < escaped.len() {
        shown.push('…');
    }
    shown
}

impl From<String> for Shown {
    fn from(text: String) -> Self {
        Shown::from(text.as_str())
    }
}

impl From<&String> for Shown {
    fn from(text: &String) -> Self {
        Shown::from(text.as_str())
    }
}

/// Text from a message, a broker, a file or a flag, made safe to show on a terminal: control
/// characters (C0, DEL, C1: ESC, BEL, NUL, CR, newlines), Unicode's line and paragraph
/// separators, and the marks that reorder what is shown (bidirectional overrides and
/// isolates) are written as Rust escapes
/// (`\u{1b}`, `\n`), so no sequence a message carries reaches the terminal raw. JSON output
/// needs none of this: JSON escapes them itself.
pub fn printable(text: &str) -> Cow<'_, str> {
    escape(text, false)
}

/// [`printable`] for a text shown whole on lines of its own (`peek --full`): newlines and tabs
/// stay as they are.
pub fn printable_lines(text: &str) -> Cow<'_, str> {
    escape(text, true)
}

fn escape(text: &str, keep_lines: bool) -> Cow<'_, str> {
    let hidden = |c: char| {
        (c.is_control() && !(keep_lines && matches!(c, '\n' | '\t')))
            || matches!(
                c,
                '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{2028}' | '\u{2029}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}'
            )
    };
    if !text.chars().any(hidden) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if hidden(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// What a buffered writer holds before it writes: few writes for a pipe or a file, and small
/// enough to stay in cache.
const BUFFER: usize = 128 * 1024;

/// A buffered writer that JSONL lines are built in, in place: built in a buffer of their own
/// and then written through a `BufWriter`, they were copied once more on their way (284 MB for
/// a Kafka export of 100,000 letters).
pub struct Buffered<W: Write> {
    buf: Vec<u8>,
    inner: W,
}

impl<W: Write> Buffered<W> {
    pub fn new(inner: W) -> Self {
        Buffered { buf: Vec::with_capacity(BUFFER), inner }
    }

    /// One dead letter as a JSONL line.
    pub fn letter_line(&mut self, letter: &LetterView<'_>) -> io::Result<()> {
        letter.write_line(&mut self.buf);
        self.write_out_when_full()
    }

    pub fn get_ref(&self) -> &W {
        &self.inner
    }

    fn write_out_when_full(&mut self) -> io::Result<()> {
        if self.buf.len() >= BUFFER {
            self.write_out()?;
        }
        Ok(())
    }

    fn write_out(&mut self) -> io::Result<()> {
        self.inner.write_all(&self.buf)?;
        self.buf.clear();
        Ok(())
    }
}

impl<W: Write> Write for Buffered<W> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(data);
        self.write_out_when_full()?;
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.write_out()?;
        self.inner.flush()
    }
}

impl<W: Write> Drop for Buffered<W> {
    /// As `BufWriter` does: what was written before a failure still reaches the reader.
    fn drop(&mut self) {
        let _ = self.write_out();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_a_message_carries_reaches_the_terminal_raw() {
        let hostile = "id\u{1b}]0;owned\u{7}\u{1b}[2J\0\r\u{9b}31m\u{202e}txt.exe\nend";
        let shown = printable(hostile);
        assert!(!shown.chars().any(|c| c.is_control() || c == '\u{202e}'), "{shown}");
        assert_eq!(printable("plain ünïcode ✓"), "plain ünïcode ✓");
        assert_eq!(printable_lines("a\n\tb\u{1b}"), "a\n\tb\\u{1b}");
    }

    #[test]
    fn a_cell_of_escapes_is_cut_to_the_same_width() {
        // Found by fuzz/render_and_redact: each control character is six characters escaped.
        let controls = "\u{15}".repeat(100);
        let mut table = Output::new(Format::Table, ColorChoice::Never, true).table(&["id"]);
        table.add_row([controls.as_str()]);
        assert_eq!(table.render()[1].chars().count(), CELL_CHARS + 1);
    }

    #[test]
    fn a_huge_cell_is_cut_before_layout() {
        let huge = "x".repeat(10 * 1024 * 1024);
        let started = std::time::Instant::now();
        let mut table = Output::new(Format::Table, ColorChoice::Never, true).table(&["id"]);
        table.add_row([huge.as_str()]);
        let lines = table.render();
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
        assert_eq!(lines[1].chars().count(), CELL_CHARS + 1);
    }
}
