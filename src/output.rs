//! Where results go: tables for people, JSON for programs, no colour unless a person is
//! looking, and notes on stderr so stdout stays clean for pipes.

use std::io::{self, IsTerminal, Stdout, Write};

use comfy_table::{Attribute, Cell, Color, ContentArrangement, Table, presets};
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
        let mut table = Table::new();
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
        table
    }

    fn header_cell(&self, text: &str) -> Cell {
        let cell = Cell::new(text.to_ascii_uppercase());
        if self.color { cell.add_attribute(Attribute::Bold) } else { cell }
    }

    /// A cell coloured when colour is on.
    pub fn colored(&self, text: impl ToString, color: Color) -> Cell {
        let cell = Cell::new(text);
        if self.color { cell.fg(color) } else { cell }
    }

    pub fn print_table(&mut self, table: &mut Table) -> Result<()> {
        // Two spaces between columns and none at the left edge, like kubectl.
        for column in table.column_iter_mut() {
            column.set_padding((0, 2));
        }
        for line in table.lines() {
            writeln!(self.out, "{}", line.trim_end())?;
        }
        Ok(())
    }

    /// A caveat for the person at the terminal: stderr, silenced by --quiet.
    pub fn note(&self, message: &str) {
        if !self.quiet {
            let _ = writeln!(io::stderr(), "dlqctl: note: {message}");
        }
    }

    pub fn finish(mut self) -> Result<()> {
        self.out.flush()?;
        Ok(())
    }
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
