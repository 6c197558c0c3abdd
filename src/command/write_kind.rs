//! The three write commands (`insert`, `update`, `delete`) and the field that carries each
//! one's statements: known where a request is parsed, so every server and the write path read
//! the statements the same way.

/// The kind of write command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteKind {
    /// `insert` (`documents`).
    Insert,
    /// `update` (`updates`).
    Update,
    /// `delete` (`deletes`).
    Delete,
}

impl WriteKind {
    /// The kind of a command name.
    pub fn from_command(name: &str) -> Option<WriteKind> {
        match name {
            "insert" => Some(WriteKind::Insert),
            "update" => Some(WriteKind::Update),
            "delete" => Some(WriteKind::Delete),
            _ => None,
        }
    }

    /// The command name.
    pub fn command(self) -> &'static str {
        match self {
            WriteKind::Insert => "insert",
            WriteKind::Update => "update",
            WriteKind::Delete => "delete",
        }
    }

    /// The field (and document sequence identifier) holding the statements.
    pub fn statements_field(self) -> &'static str {
        match self {
            WriteKind::Insert => "documents",
            WriteKind::Update => "updates",
            WriteKind::Delete => "deletes",
        }
    }
}
