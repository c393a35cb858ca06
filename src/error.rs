//! One error type for the whole tool, so every failure maps to a documented exit code
//! and prints as a single line that names the thing and the fix.

use std::io;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The command line or a target is malformed: exit 2.
    #[error("{0}")]
    Usage(String),

    /// The backend cannot do this at all; the sentence says what to do instead.
    #[error("{backend} cannot {operation}: {why}")]
    NotSupported { backend: &'static str, operation: &'static str, why: String },

    /// A line of a JSONL archive is not a dead letter.
    #[error("{source_name}:{line}: {message} (fix the line, or pass --skip-invalid to skip bad lines)")]
    InvalidRecord { source_name: String, line: u64, message: String },

    /// An I/O failure, with what we were doing when it happened.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },

    /// Any other runtime failure, already phrased for the user.
    #[error("{0}")]
    Runtime(String),

    /// The command ran, reported what it did, and ends with this code (a partial redrive: 1;
    /// an interrupted one: 130).
    #[error("{message}")]
    Finished { code: u8, message: String },
}

impl Error {
    pub fn io(context: impl Into<String>, source: io::Error) -> Self {
        Error::Io { context: context.into(), source }
    }

    /// The documented exit code: 2 for usage errors, 1 for every runtime failure.
    /// (3 is reserved for lint findings and is never an error.)
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Usage(_) => 2,
            Error::Finished { code, .. } => *code,
            _ => 1,
        }
    }

    /// A reader closed our stdout (`dlqctl export ... | head`): not a failure.
    pub fn is_broken_pipe(&self) -> bool {
        matches!(self, Error::Io { source, .. } if source.kind() == io::ErrorKind::BrokenPipe)
    }
}

/// Writing to stdout is the one I/O whose failure is usually a closed pipe; keep it terse.
impl From<io::Error> for Error {
    fn from(source: io::Error) -> Self {
        Error::io("cannot write output", source)
    }
}
