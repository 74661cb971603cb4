//! What a validation finds: a problem with one field (its full path and why), and user input
//! quoted for such a message.

use std::fmt;

/// One problem with one field. `path` is the full JSON path (`spec.files[2].contentFrom`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    pub path: String,
    pub message: String,
}

impl FieldError {
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        FieldError {
            path: path.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// Most characters of user input a message quotes.
pub const QUOTED_CHARS: usize = 200;

/// `value` quoted for a message: Rust string syntax, cut after [`QUOTED_CHARS`] characters with
/// the full length said, so a huge field never becomes a huge condition or Event.
pub fn quoted(value: &str) -> String {
    match value.char_indices().nth(QUOTED_CHARS) {
        Some((cut, _)) => format!("{:?}… ({} characters)", &value[..cut], value.chars().count()),
        None => format!("{value:?}"),
    }
}
