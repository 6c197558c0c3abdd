//! Framing and dispatch on opcode: a whole frame in, a typed message out; OP_COMPRESSED is
//! unwrapped here so the layers above never see it.

use bytes::{BufMut, Bytes, BytesMut};

use super::{Compressor, Header, OpCode, OpMsg, OpQuery, WireError, HEADER_LEN, MAX_MESSAGE_SIZE};
use crate::value::error_codes::ErrorCode;

/// A decoded request.
#[derive(Debug, Clone)]
pub enum Message {
    /// OP_MSG.
    Msg(OpMsg),
    /// OP_QUERY.
    Query(OpQuery),
    /// An opcode removed in 5.1 (OP_INSERT, OP_UPDATE, OP_DELETE, OP_GET_MORE,
    /// OP_KILL_CURSORS): recognised so it can be refused as mongod refuses it.
    Legacy(OpCode),
}

/// A decoded request with its header and, if it came wrapped in OP_COMPRESSED, the
/// compressor (replies to it are compressed the same way).
#[derive(Debug, Clone)]
pub struct Incoming {
    /// The header of the outer frame.
    pub header: Header,
    /// The request.
    pub message: Message,
    /// The compressor of the OP_COMPRESSED wrapper, if any.
    pub compressor: Option<Compressor>,
    /// Size of the frame as received.
    pub wire_size: usize,
}

/// Inspects the start of `buf`: `Ok(None)` if more bytes are needed to know the length,
/// `Ok(Some(n))` for a message of `n` bytes (which may not be fully buffered yet), or a fatal
/// error when the declared length is impossible. Nothing is allocated before this check.
pub fn frame_length(buf: &[u8]) -> Result<Option<usize>, WireError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let len = i32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
    if len < HEADER_LEN as i32 || len as i64 > MAX_MESSAGE_SIZE as i64 {
        return Err(WireError::Fatal(format!(
            "recv(): message msgLen {len} is invalid. Min {HEADER_LEN} Max: {MAX_MESSAGE_SIZE}"
        )));
    }
    Ok(Some(len as usize))
}

/// Decodes one whole frame.
pub fn decode(frame: Bytes) -> Result<Incoming, WireError> {
    let header = Header::parse(&frame)
        .ok_or_else(|| WireError::Fatal("message shorter than its header".into()))?;
    if header.length as usize != frame.len() {
        return Err(WireError::Fatal(format!(
            "message length {} does not match the {} bytes framed",
            header.length,
            frame.len()
        )));
    }
    let wire_size = frame.len();
    let (frame, header_for_body, compressor) = if header.op_code == OpCode::Compressed {
        let (inner, compressor) = decompress_frame(&header, &frame)?;
        let inner_header = Header::parse(&inner)
            .ok_or_else(|| WireError::Fatal("decompressed message is empty".into()))?;
        (inner, inner_header, Some(compressor))
    } else {
        (frame, header, None)
    };
    let message = match header_for_body.op_code {
        OpCode::Msg => Message::Msg(OpMsg::decode(&frame)?),
        OpCode::Query => Message::Query(OpQuery::decode(&frame)?),
        op @ (OpCode::Update
        | OpCode::Insert
        | OpCode::GetMore
        | OpCode::Delete
        | OpCode::KillCursors) => Message::Legacy(op),
        OpCode::Compressed => {
            return Err(WireError::Fatal(
                "OP_COMPRESSED may not wrap another OP_COMPRESSED".into(),
            ))
        }
        op => {
            return Err(WireError::Fatal(format!(
                "Unsupported opcode {} received",
                op.as_i32()
            )))
        }
    };
    Ok(Incoming {
        header,
        message,
        compressor,
        wire_size,
    })
}

/// Unwraps an OP_COMPRESSED frame into the original message (with a rebuilt header carrying
/// the original opcode).
fn decompress_frame(header: &Header, frame: &[u8]) -> Result<(Bytes, Compressor), WireError> {
    if frame.len() < HEADER_LEN + 9 {
        return Err(WireError::Fatal("OP_COMPRESSED is too short".into()));
    }
    let p = HEADER_LEN;
    let original_opcode = i32::from_le_bytes([frame[p], frame[p + 1], frame[p + 2], frame[p + 3]]);
    let uncompressed = i32::from_le_bytes([frame[p + 4], frame[p + 5], frame[p + 6], frame[p + 7]]);
    let compressor_id = frame[p + 8];
    if uncompressed < 0 || uncompressed as usize > MAX_MESSAGE_SIZE - HEADER_LEN {
        return Err(WireError::Fatal(format!(
            "OP_COMPRESSED announces an invalid uncompressed size {uncompressed}"
        )));
    }
    let compressor = Compressor::from_id(compressor_id).ok_or_else(|| {
        WireError::invalid(
            ErrorCode::InternalError,
            format!("Cannot find compressor for message with id {compressor_id}"),
        )
    })?;
    let body = compressor.decompress(&frame[p + 9..], uncompressed as usize)?;
    let mut out = BytesMut::with_capacity(HEADER_LEN + body.len());
    Header {
        length: (HEADER_LEN + body.len()) as i32,
        request_id: header.request_id,
        response_to: header.response_to,
        op_code: OpCode::from_i32(original_opcode),
    }
    .write(&mut out);
    out.put_slice(&body);
    Ok((out.freeze(), compressor))
}

/// Wraps an encoded message (header included) in OP_COMPRESSED.
pub fn encode_compressed(message: &[u8], compressor: Compressor) -> Result<Bytes, WireError> {
    let body = message
        .get(HEADER_LEN..)
        .ok_or_else(|| WireError::Fatal("message shorter than its header".into()))?;
    compressed_frame(message, compressor, &compressor.compress(body)?)
}

/// The OP_COMPRESSED frame of `message` whose body, compressed by `compressor`, is `packed`:
/// [`encode_compressed`] after the compression (the fuzz harness compresses zlib at the fastest
/// level, which any zlib stream decoder reads alike).
pub fn compressed_frame(
    message: &[u8],
    compressor: Compressor,
    packed: &[u8],
) -> Result<Bytes, WireError> {
    let header = Header::parse(message)
        .ok_or_else(|| WireError::Fatal("message shorter than its header".into()))?;
    let body_len = message.len() - HEADER_LEN;
    let length = HEADER_LEN + 9 + packed.len();
    let mut out = BytesMut::with_capacity(length);
    Header {
        length: length as i32,
        request_id: header.request_id,
        response_to: header.response_to,
        op_code: OpCode::Compressed,
    }
    .write(&mut out);
    out.put_i32_le(header.op_code.as_i32());
    out.put_i32_le(body_len as i32);
    out.put_u8(compressor.id());
    out.put_slice(packed);
    Ok(out.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::OpMsgBuilder;

    fn hello() -> Bytes {
        let body = bson::doc! {"hello": 1, "$db": "admin"}.to_vec().unwrap();
        OpMsgBuilder::new(0, &body).finish(11, 0)
    }

    #[test]
    fn frame_length_checks_before_allocating() {
        assert_eq!(frame_length(&[1, 2]).unwrap(), None);
        assert_eq!(frame_length(&52i32.to_le_bytes()).unwrap(), Some(52));
        assert!(frame_length(&15i32.to_le_bytes()).is_err());
        assert!(frame_length(&(-1i32).to_le_bytes()).is_err());
        assert!(frame_length(&48_000_001i32.to_le_bytes()).is_err());
        assert_eq!(
            frame_length(&48_000_000i32.to_le_bytes()).unwrap(),
            Some(48_000_000)
        );
    }

    #[test]
    fn compressed_messages_round_trip_with_every_compressor() {
        for c in Compressor::SUPPORTED {
            let packed = encode_compressed(&hello(), c).unwrap();
            let incoming = decode(packed).unwrap();
            assert_eq!(incoming.compressor, Some(c));
            assert_eq!(incoming.header.op_code, OpCode::Compressed);
            match incoming.message {
                Message::Msg(m) => assert_eq!(m.body.first_key(), Some("hello")),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn rejects_bad_compressed_frames() {
        let mut packed = encode_compressed(&hello(), Compressor::Zlib)
            .unwrap()
            .to_vec();
        packed[24] = 9; // unknown compressor id
        assert!(matches!(
            decode(Bytes::from(packed.clone())),
            Err(WireError::Invalid { .. })
        ));
        packed[24] = 2;
        packed[20..24].copy_from_slice(&(60_000_000i32).to_le_bytes());
        assert!(matches!(
            decode(Bytes::from(packed)),
            Err(WireError::Fatal(_))
        ));
    }

    #[test]
    fn unknown_and_legacy_opcodes() {
        let mut m = hello().to_vec();
        m[12..16].copy_from_slice(&2002i32.to_le_bytes());
        assert!(matches!(
            decode(Bytes::from(m.clone())).unwrap().message,
            Message::Legacy(OpCode::Insert)
        ));
        m[12..16].copy_from_slice(&4242i32.to_le_bytes());
        assert!(matches!(decode(Bytes::from(m)), Err(WireError::Fatal(_))));
    }
}
