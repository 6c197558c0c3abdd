//! The MongoDB wire protocol: framing, OP_MSG, the legacy OP_QUERY/OP_REPLY handshake and
//! OP_COMPRESSED.
//!
//! Everything here works on `bytes::Bytes`: a frame read from a socket is split into views
//! (the body, each document of a kind-1 sequence) without copying, and each document is read in
//! place as a `bson::RawDocument`. The codec knows nothing about commands or shards.
//!
//! Decoding is two steps, as in mini-redis: [`frame_length`] proves that a whole message is
//! buffered (or that the stream is beyond repair) before [`decode`] parses it.

mod bson_doc;
mod compression;
mod error;
mod header;
mod message;
mod op_msg;
mod op_query;
mod reply;

pub use bson_doc::{
    changes_when_owned, document_with_room, elements, empty_document, get_field, get_fields,
    last_fields, validate_document, BsonDoc, Elements, ElementsWithBytes,
};
pub use compression::Compressor;
pub use error::WireError;
pub use header::{Header, OpCode, HEADER_LEN};
pub use message::{compressed_frame, decode, encode_compressed, frame_length, Incoming, Message};
pub use op_msg::{DocumentSequence, MsgFlags, OpMsg, OpMsgBuilder};
pub use op_query::{encode_op_reply, OpQuery, ReplyFlags};
pub use reply::{cluster_time_document, Reply};

/// Largest message a peer may send or receive (`maxMessageSizeBytes`).
pub const MAX_MESSAGE_SIZE: usize = 48_000_000;

/// Largest user document (`maxBsonObjectSize`).
pub const MAX_BSON_OBJECT_SIZE: usize = 16 * 1024 * 1024;

/// Largest internal document: a user document plus room for command fields.
pub const MAX_BSON_INTERNAL_SIZE: usize = crate::limits::MAX_INTERNAL_DOCUMENT_SIZE;
