//! OP_QUERY (2004) and OP_REPLY (1): kept only for the legacy handshake, where drivers that do
//! not yet know the server speaks OP_MSG send `isMaster` on `admin.$cmd`.

use bytes::{BufMut, Bytes, BytesMut};

use super::{BsonDoc, Header, OpCode, WireError, HEADER_LEN};
use crate::value::error_codes::ErrorCode;

/// A decoded OP_QUERY.
#[derive(Debug, Clone)]
pub struct OpQuery {
    /// Query flags (tailable, secondaryOk, …).
    pub flags: i32,
    /// `<db>.<collection>`; commands use `<db>.$cmd`.
    pub full_collection_name: String,
    /// Documents to skip.
    pub number_to_skip: i32,
    /// Documents to return (−1 or 1 for commands).
    pub number_to_return: i32,
    /// The query, for commands the command document (possibly wrapped in `$query`).
    pub query: BsonDoc,
    /// Optional projection.
    pub return_fields_selector: Option<BsonDoc>,
}

impl OpQuery {
    /// Parses an OP_QUERY from a whole frame (header included).
    pub fn decode(frame: &Bytes) -> Result<OpQuery, WireError> {
        let end = frame.len();
        let mut pos = HEADER_LEN;
        if end < pos + 4 {
            return Err(short());
        }
        let flags = read_i32(frame, pos);
        pos += 4;
        let name_len = frame[pos..]
            .iter()
            .position(|&b| b == 0)
            .ok_or_else(short)?;
        let full_collection_name = std::str::from_utf8(&frame[pos..pos + name_len])
            .map_err(|_| {
                WireError::invalid(ErrorCode::InvalidBSON, "collection name is not UTF-8")
            })?
            .to_string();
        pos += name_len + 1;
        if end < pos + 8 {
            return Err(short());
        }
        let number_to_skip = read_i32(frame, pos);
        let number_to_return = read_i32(frame, pos + 4);
        pos += 8;
        let len = doc_len(frame, pos, end)?;
        let query = BsonDoc::new(frame.slice(pos..pos + len))?;
        pos += len;
        let return_fields_selector = if pos < end {
            let len = doc_len(frame, pos, end)?;
            let doc = BsonDoc::new(frame.slice(pos..pos + len))?;
            pos += len;
            Some(doc)
        } else {
            None
        };
        if pos != end {
            return Err(WireError::invalid(
                ErrorCode::InvalidBSON,
                "OP_QUERY has trailing bytes after its documents",
            ));
        }
        Ok(OpQuery {
            flags,
            full_collection_name,
            number_to_skip,
            number_to_return,
            query,
            return_fields_selector,
        })
    }

    /// Whether this is a command (`<db>.$cmd`).
    pub fn is_command(&self) -> bool {
        self.full_collection_name.ends_with(".$cmd")
    }

    /// The database part of the namespace.
    pub fn database(&self) -> &str {
        self.full_collection_name
            .split_once('.')
            .map(|(db, _)| db)
            .unwrap_or(&self.full_collection_name)
    }

    /// The command document, unwrapped from `{$query: cmd, $readPreference: …}` if needed.
    pub fn command(&self) -> BsonDoc {
        let raw = self.query.raw();
        for key in ["$query", "query"] {
            if self.query.first_key() == Some(key) {
                if let Ok(Some(bson::RawBsonRef::Document(inner))) = raw.get(key) {
                    return BsonDoc::from_encoded(inner.as_bytes().to_vec());
                }
            }
        }
        self.query.clone()
    }
}

/// OP_REPLY response flags.
pub struct ReplyFlags;

impl ReplyFlags {
    /// The query failed; the document is `{$err, code}`.
    pub const QUERY_FAILURE: i32 = 1 << 1;
    /// Always set by servers since 3.x (`AwaitCapable`).
    pub const AWAIT_CAPABLE: i32 = 1 << 3;
}

/// Encodes an OP_REPLY carrying one document.
pub fn encode_op_reply(request_id: i32, response_to: i32, flags: i32, doc: &[u8]) -> Bytes {
    let length = HEADER_LEN + 4 + 8 + 4 + 4 + doc.len();
    let mut buf = BytesMut::with_capacity(length);
    Header {
        length: length as i32,
        request_id,
        response_to,
        op_code: OpCode::Reply,
    }
    .write(&mut buf);
    buf.put_i32_le(flags);
    buf.put_i64_le(0);
    buf.put_i32_le(0);
    buf.put_i32_le(1);
    buf.put_slice(doc);
    buf.freeze()
}

fn read_i32(buf: &[u8], pos: usize) -> i32 {
    i32::from_le_bytes([buf[pos], buf[pos + 1], buf[pos + 2], buf[pos + 3]])
}

fn doc_len(buf: &[u8], pos: usize, end: usize) -> Result<usize, WireError> {
    if end < pos + 4 {
        return Err(short());
    }
    let len = read_i32(buf, pos);
    if len < 5 || len as usize > end - pos {
        return Err(WireError::invalid(
            ErrorCode::InvalidBSON,
            format!("invalid BSON document length {len} in OP_QUERY"),
        ));
    }
    Ok(len as usize)
}

fn short() -> WireError {
    WireError::invalid(ErrorCode::InvalidBSON, "OP_QUERY message is truncated")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds an OP_QUERY frame the way the Node.js driver does for its first handshake.
    pub(crate) fn op_query(ns: &str, query: &bson::Document) -> Bytes {
        let q = query.to_vec().unwrap();
        let mut body = Vec::new();
        body.extend_from_slice(&0i32.to_le_bytes());
        body.extend_from_slice(ns.as_bytes());
        body.push(0);
        body.extend_from_slice(&0i32.to_le_bytes());
        body.extend_from_slice(&(-1i32).to_le_bytes());
        body.extend_from_slice(&q);
        let mut out = Vec::new();
        Header {
            length: (HEADER_LEN + body.len()) as i32,
            request_id: 5,
            response_to: 0,
            op_code: OpCode::Query,
        }
        .write(&mut out);
        out.extend_from_slice(&body);
        Bytes::from(out)
    }

    #[test]
    fn decodes_the_legacy_handshake() {
        let frame = op_query(
            "admin.$cmd",
            &bson::doc! {"ismaster": 1, "helloOk": true, "compression": ["zstd"]},
        );
        let q = OpQuery::decode(&frame).unwrap();
        assert!(q.is_command());
        assert_eq!(q.database(), "admin");
        assert_eq!(q.number_to_return, -1);
        assert_eq!(q.command().first_key(), Some("ismaster"));
    }

    #[test]
    fn unwraps_query_wrapper() {
        let frame = op_query(
            "admin.$cmd",
            &bson::doc! {"$query": {"isMaster": 1}, "$readPreference": {"mode": "primary"}},
        );
        let q = OpQuery::decode(&frame).unwrap();
        assert_eq!(q.command().first_key(), Some("isMaster"));
    }

    #[test]
    fn rejects_truncated_queries() {
        let frame = op_query("admin.$cmd", &bson::doc! {"isMaster": 1});
        let mut cut = frame[..frame.len() - 3].to_vec();
        let len = cut.len() as i32;
        cut[..4].copy_from_slice(&len.to_le_bytes());
        assert!(OpQuery::decode(&Bytes::from(cut)).is_err());
    }

    #[test]
    fn op_reply_layout() {
        let doc = bson::doc! {"ok": 1.0}.to_vec().unwrap();
        let r = encode_op_reply(3, 5, ReplyFlags::AWAIT_CAPABLE, &doc);
        let h = Header::parse(&r).unwrap();
        assert_eq!(h.length as usize, r.len());
        assert_eq!(h.op_code, OpCode::Reply);
        assert_eq!(h.response_to, 5);
        assert_eq!(read_i32(&r, 16), 8);
        assert_eq!(read_i32(&r, 32), 1, "numberReturned");
        assert_eq!(&r[36..], &doc[..]);
    }
}
