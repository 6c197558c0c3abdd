//! The 16-byte standard message header shared by every opcode.

use bytes::{Buf, BufMut};

/// Size of the standard header.
pub const HEADER_LEN: usize = 16;

/// Opcodes Sluice knows by name. Anything else is kept as its number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpCode {
    /// OP_REPLY (1), the answer to OP_QUERY.
    Reply,
    /// OP_UPDATE (2001), removed in 5.1.
    Update,
    /// OP_INSERT (2002), removed in 5.1.
    Insert,
    /// OP_QUERY (2004), accepted only for the handshake.
    Query,
    /// OP_GET_MORE (2005), removed in 5.1.
    GetMore,
    /// OP_DELETE (2006), removed in 5.1.
    Delete,
    /// OP_KILL_CURSORS (2007), removed in 5.1.
    KillCursors,
    /// OP_COMPRESSED (2012).
    Compressed,
    /// OP_MSG (2013).
    Msg,
    /// Anything else.
    Other(i32),
}

impl OpCode {
    /// The opcode for a number from the wire.
    pub fn from_i32(n: i32) -> Self {
        match n {
            1 => OpCode::Reply,
            2001 => OpCode::Update,
            2002 => OpCode::Insert,
            2004 => OpCode::Query,
            2005 => OpCode::GetMore,
            2006 => OpCode::Delete,
            2007 => OpCode::KillCursors,
            2012 => OpCode::Compressed,
            2013 => OpCode::Msg,
            other => OpCode::Other(other),
        }
    }

    /// The number sent on the wire.
    pub fn as_i32(self) -> i32 {
        match self {
            OpCode::Reply => 1,
            OpCode::Update => 2001,
            OpCode::Insert => 2002,
            OpCode::Query => 2004,
            OpCode::GetMore => 2005,
            OpCode::Delete => 2006,
            OpCode::KillCursors => 2007,
            OpCode::Compressed => 2012,
            OpCode::Msg => 2013,
            OpCode::Other(n) => n,
        }
    }
}

/// The standard header: every field little-endian.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Total message length, header included.
    pub length: i32,
    /// Sender's identifier for this message.
    pub request_id: i32,
    /// For replies, the `request_id` being answered; 0 in requests.
    pub response_to: i32,
    /// What follows the header.
    pub op_code: OpCode,
}

impl Header {
    /// Reads a header from the first 16 bytes of `buf`; `None` if fewer are present.
    pub fn parse(mut buf: &[u8]) -> Option<Header> {
        if buf.len() < HEADER_LEN {
            return None;
        }
        Some(Header {
            length: buf.get_i32_le(),
            request_id: buf.get_i32_le(),
            response_to: buf.get_i32_le(),
            op_code: OpCode::from_i32(buf.get_i32_le()),
        })
    }

    /// Appends the header's 16 bytes.
    pub fn write(&self, out: &mut impl BufMut) {
        out.put_i32_le(self.length);
        out.put_i32_le(self.request_id);
        out.put_i32_le(self.response_to);
        out.put_i32_le(self.op_code.as_i32());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip() {
        let h = Header {
            length: 52,
            request_id: 7,
            response_to: 3,
            op_code: OpCode::Msg,
        };
        let mut out = Vec::new();
        h.write(&mut out);
        assert_eq!(out.len(), HEADER_LEN);
        assert_eq!(Header::parse(&out), Some(h));
        assert_eq!(Header::parse(&out[..15]), None);
        assert_eq!(OpCode::from_i32(1234), OpCode::Other(1234));
    }
}
