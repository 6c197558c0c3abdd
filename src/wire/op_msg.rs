//! OP_MSG (opcode 2013): flag bits, a kind-0 body, kind-1 document sequences and the optional
//! CRC-32C checksum.

use bytes::{BufMut, Bytes, BytesMut};

use super::{BsonDoc, Header, OpCode, WireError, HEADER_LEN, MAX_MESSAGE_SIZE};
use crate::value::error_codes::ErrorCode;

/// The OP_MSG flag bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MsgFlags(pub u32);

impl MsgFlags {
    /// A CRC-32C checksum follows the sections.
    pub const CHECKSUM_PRESENT: u32 = 1;
    /// Request: send no reply. Reply: another reply follows (exhaust).
    pub const MORE_TO_COME: u32 = 1 << 1;
    /// Request: the client accepts an exhaust stream of replies.
    pub const EXHAUST_ALLOWED: u32 = 1 << 16;
    /// Bits 0–15 must be understood by the receiver.
    const REQUIRED_MASK: u32 = 0xffff;
    const KNOWN_REQUIRED: u32 = Self::CHECKSUM_PRESENT | Self::MORE_TO_COME;

    /// Whether a checksum is present.
    pub fn checksum_present(self) -> bool {
        self.0 & Self::CHECKSUM_PRESENT != 0
    }

    /// Whether the sender expects no reply (request) or more replies (reply).
    pub fn more_to_come(self) -> bool {
        self.0 & Self::MORE_TO_COME != 0
    }

    /// Whether the client accepts exhaust replies.
    pub fn exhaust_allowed(self) -> bool {
        self.0 & Self::EXHAUST_ALLOWED != 0
    }
}

/// One kind-1 section: an identifier (`documents`, `updates`, `deletes`, …) and documents that
/// stand in for the body field of that name.
#[derive(Debug, Clone, PartialEq)]
pub struct DocumentSequence {
    /// The field name the sequence stands for.
    pub identifier: String,
    /// The documents, each a view into the frame.
    pub documents: Vec<BsonDoc>,
}

/// A decoded OP_MSG.
#[derive(Debug, Clone, PartialEq)]
pub struct OpMsg {
    /// The flag bits as received.
    pub flags: MsgFlags,
    /// The kind-0 section.
    pub body: BsonDoc,
    /// The kind-1 sections, in message order.
    pub sequences: Vec<DocumentSequence>,
}

impl OpMsg {
    /// Parses an OP_MSG. `frame` is the whole message, header included (the checksum covers
    /// it).
    pub fn decode(frame: &Bytes) -> Result<OpMsg, WireError> {
        let mut end = frame.len();
        if end < HEADER_LEN + 4 {
            return Err(WireError::invalid(
                ErrorCode::InvalidLength,
                "OP_MSG is too short to hold its flag bits",
            ));
        }
        let flags = MsgFlags(read_u32(frame, HEADER_LEN));
        let unknown_required = flags.0 & MsgFlags::REQUIRED_MASK & !MsgFlags::KNOWN_REQUIRED;
        if unknown_required != 0 {
            return Err(WireError::connection_fatal(
                ErrorCode::IllegalOpMsgFlag,
                format!(
                    "Message contains illegal flags value: Flag {:#x}",
                    unknown_required
                ),
            ));
        }
        if flags.checksum_present() {
            if end < HEADER_LEN + 4 + 4 {
                return Err(WireError::connection_fatal(
                    ErrorCode::ChecksumMismatch,
                    "OP_MSG with checksumPresent is too short to hold a checksum",
                ));
            }
            end -= 4;
            let expected = read_u32(frame, end);
            let actual = crc32c::crc32c(&frame[..end]);
            if expected != actual {
                return Err(WireError::connection_fatal(
                    ErrorCode::ChecksumMismatch,
                    format!(
                        "OP_MSG checksum does not match contents: expected {expected:#010x}, computed {actual:#010x}"
                    ),
                ));
            }
        }

        let mut pos = HEADER_LEN + 4;
        let mut body: Option<BsonDoc> = None;
        let mut sequences: Vec<DocumentSequence> = Vec::new();
        while pos < end {
            let kind = frame[pos];
            pos += 1;
            match kind {
                0 => {
                    let len = read_document_length(frame, pos, end)?;
                    let doc = BsonDoc::new(frame.slice(pos..pos + len))?;
                    pos += len;
                    if body.is_some() {
                        return Err(WireError::invalid(
                            ErrorCode::OpMsgMultipleBodies,
                            "Multiple body sections in message",
                        ));
                    }
                    body = Some(doc);
                }
                1 => {
                    if end - pos < 4 {
                        return Err(truncated("document sequence size"));
                    }
                    let size = read_u32(frame, pos) as usize;
                    if size < 5 || size > end - pos {
                        return Err(truncated("document sequence"));
                    }
                    let section_end = pos + size;
                    let mut p = pos + 4;
                    let name_end = frame[p..section_end]
                        .iter()
                        .position(|&b| b == 0)
                        .ok_or_else(|| truncated("document sequence identifier"))?;
                    let identifier = std::str::from_utf8(&frame[p..p + name_end])
                        .map_err(|_| {
                            WireError::invalid(
                                ErrorCode::InvalidBSON,
                                "document sequence identifier is not valid UTF-8",
                            )
                        })?
                        .to_string();
                    p += name_end + 1;
                    let mut documents = Vec::new();
                    while p < section_end {
                        let len = read_document_length(frame, p, section_end)?;
                        documents.push(BsonDoc::new(frame.slice(p..p + len))?);
                        p += len;
                    }
                    if sequences.iter().any(|s| s.identifier == identifier) {
                        return Err(WireError::invalid(
                            ErrorCode::OpMsgDuplicateSequence,
                            format!("Duplicate document sequence: {identifier}"),
                        ));
                    }
                    sequences.push(DocumentSequence {
                        identifier,
                        documents,
                    });
                    pos = section_end;
                }
                other => {
                    return Err(WireError::invalid(
                        ErrorCode::OpMsgUnknownSectionKind,
                        format!("Unknown section kind {other}"),
                    ))
                }
            }
        }
        let body = body.ok_or_else(|| {
            WireError::invalid(ErrorCode::OpMsgNoBody, "OP_MSG messages must have a body")
        })?;
        for seq in &sequences {
            if matches!(body.raw().get(&seq.identifier), Ok(Some(_))) {
                return Err(WireError::invalid(
                    ErrorCode::OpMsgDuplicateField,
                    format!(
                        "Duplicate field between body and document sequence {}",
                        seq.identifier
                    ),
                ));
            }
        }
        Ok(OpMsg {
            flags,
            body,
            sequences,
        })
    }

    /// The sequence with this identifier, if present.
    pub fn sequence(&self, identifier: &str) -> Option<&DocumentSequence> {
        self.sequences.iter().find(|s| s.identifier == identifier)
    }
}

/// Builds an OP_MSG: the body and sequences are appended as raw bytes, never re-encoded.
#[derive(Debug)]
pub struct OpMsgBuilder {
    buf: BytesMut,
    flags: u32,
    sequence_start: Option<usize>,
}

impl OpMsgBuilder {
    /// Starts a message whose body is `body` (an encoded BSON document).
    pub fn new(flags: u32, body: &[u8]) -> Self {
        let mut buf = BytesMut::with_capacity(HEADER_LEN + 5 + body.len() + 4);
        buf.put_bytes(0, HEADER_LEN);
        buf.put_u32_le(flags);
        buf.put_u8(0);
        buf.put_slice(body);
        OpMsgBuilder {
            buf,
            flags,
            sequence_start: None,
        }
    }

    /// Opens a kind-1 section named `identifier`; documents pushed next belong to it.
    pub fn begin_sequence(&mut self, identifier: &str) {
        self.end_sequence();
        self.buf.put_u8(1);
        self.sequence_start = Some(self.buf.len());
        self.buf.put_u32_le(0);
        self.buf.put_slice(identifier.as_bytes());
        self.buf.put_u8(0);
    }

    /// Appends one encoded document to the open sequence.
    pub fn push_document(&mut self, doc: &[u8]) {
        self.buf.put_slice(doc);
    }

    fn end_sequence(&mut self) {
        if let Some(start) = self.sequence_start.take() {
            let size = (self.buf.len() - start) as u32;
            self.buf[start..start + 4].copy_from_slice(&size.to_le_bytes());
        }
    }

    /// Bytes written so far (header included), to respect size limits while building.
    pub fn encoded_len(&self) -> usize {
        self.buf.len()
    }

    /// Finishes the message: fills the header and, if `CHECKSUM_PRESENT` is set, appends the
    /// CRC-32C.
    pub fn finish(mut self, request_id: i32, response_to: i32) -> Bytes {
        self.end_sequence();
        let checksum = self.flags & MsgFlags::CHECKSUM_PRESENT != 0;
        let length = self.buf.len() + if checksum { 4 } else { 0 };
        let header = Header {
            length: length as i32,
            request_id,
            response_to,
            op_code: OpCode::Msg,
        };
        let mut head = Vec::with_capacity(HEADER_LEN);
        header.write(&mut head);
        self.buf[..HEADER_LEN].copy_from_slice(&head);
        if checksum {
            let crc = crc32c::crc32c(&self.buf);
            self.buf.put_u32_le(crc);
        }
        debug_assert!(self.buf.len() <= MAX_MESSAGE_SIZE + HEADER_LEN);
        self.buf.freeze()
    }
}

fn read_u32(buf: &[u8], pos: usize) -> u32 {
    u32::from_le_bytes([buf[pos], buf[pos + 1], buf[pos + 2], buf[pos + 3]])
}

/// The length of the BSON document starting at `pos`, checked to fit before `end`.
fn read_document_length(buf: &[u8], pos: usize, end: usize) -> Result<usize, WireError> {
    if end < pos + 4 {
        return Err(truncated("document length"));
    }
    let len = i32::from_le_bytes([buf[pos], buf[pos + 1], buf[pos + 2], buf[pos + 3]]);
    if len < 5 || len as usize > end - pos {
        return Err(WireError::invalid(
            ErrorCode::InvalidBSON,
            format!(
                "invalid BSON document length {len} with {} bytes left in the section",
                end - pos
            ),
        ));
    }
    Ok(len as usize)
}

fn truncated(what: &str) -> WireError {
    WireError::invalid(
        ErrorCode::InvalidBSON,
        format!("OP_MSG {what} extends past the end of the message"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    const HELLO_52: &str = "34000000 01000000 00000000 dd070000 00000000 00 1f000000 1068656c6c6f00 01000000 022464620006000000 61646d696e00 00";

    #[test]
    fn reference_vector_hello_without_checksum() {
        let body = bson::doc! {"hello": 1, "$db": "admin"}.to_vec().unwrap();
        let built = OpMsgBuilder::new(0, &body).finish(1, 0);
        assert_eq!(built.to_vec(), hex(HELLO_52));
        assert_eq!(built.len(), 52);
        let msg = OpMsg::decode(&built).unwrap();
        assert_eq!(msg.flags, MsgFlags(0));
        assert_eq!(msg.body.first_key(), Some("hello"));
        assert!(msg.sequences.is_empty());
    }

    #[test]
    fn reference_vector_hello_with_checksum() {
        let body = bson::doc! {"hello": 1, "$db": "admin"}.to_vec().unwrap();
        let built = OpMsgBuilder::new(MsgFlags::CHECKSUM_PRESENT, &body).finish(1, 0);
        assert_eq!(built.len(), 56);
        assert_eq!(&built[52..], &hex("9e73bb67")[..]);
        assert_eq!(crc32c::crc32c(&built[..52]), 0x67BB739E);
        let mut expected = hex(HELLO_52);
        expected[0] = 0x38;
        expected[16] = 1;
        assert_eq!(&built[..52], &expected[..]);
        let msg = OpMsg::decode(&built).unwrap();
        assert!(msg.flags.checksum_present());
    }

    #[test]
    fn crc32c_check_value() {
        assert_eq!(crc32c::crc32c(b"123456789"), 0xE3069283);
    }

    fn insert_message(flags: u32) -> Bytes {
        let body = bson::doc! {"insert": "c", "$db": "d"}.to_vec().unwrap();
        let mut b = OpMsgBuilder::new(flags, &body);
        b.begin_sequence("documents");
        for i in 0..3 {
            b.push_document(&bson::doc! {"_id": i}.to_vec().unwrap());
        }
        b.finish(9, 0)
    }

    #[test]
    fn document_sequences_round_trip() {
        let frame = insert_message(0);
        let msg = OpMsg::decode(&frame).unwrap();
        let seq = msg.sequence("documents").unwrap();
        assert_eq!(seq.documents.len(), 3);
        assert_eq!(
            seq.documents[2].raw().get_i32("_id").unwrap(),
            2,
            "documents keep their order"
        );
        let frame = insert_message(MsgFlags::CHECKSUM_PRESENT | MsgFlags::MORE_TO_COME);
        let msg = OpMsg::decode(&frame).unwrap();
        assert!(msg.flags.more_to_come());
    }

    fn code_of(err: WireError) -> (i32, bool) {
        match err {
            WireError::Invalid {
                code, close_after, ..
            } => (code.0, close_after),
            WireError::Fatal(m) => panic!("unexpected fatal {m}"),
        }
    }

    fn with_length(mut v: Vec<u8>) -> Bytes {
        let len = v.len() as i32;
        v[..4].copy_from_slice(&len.to_le_bytes());
        Bytes::from(v)
    }

    #[test]
    fn malformed_messages_get_the_server_codes() {
        let body = bson::doc! {"ping": 1, "$db": "admin"}.to_vec().unwrap();
        let good = OpMsgBuilder::new(0, &body).finish(1, 0).to_vec();

        // Unknown required flag bit.
        let mut m = good.clone();
        m[16] = 0x04;
        assert_eq!(
            code_of(OpMsg::decode(&Bytes::from(m)).unwrap_err()),
            (223, true)
        );
        // Unknown optional bit is ignored.
        let mut m = good.clone();
        m[19] = 0x80;
        assert!(OpMsg::decode(&Bytes::from(m)).is_ok());

        // Two bodies.
        let mut m = good.clone();
        m.push(0);
        m.extend_from_slice(&body);
        assert_eq!(
            code_of(OpMsg::decode(&with_length(m)).unwrap_err()).0,
            40430
        );

        // Unknown section kind.
        let mut m = good.clone();
        m.push(7);
        m.extend_from_slice(&body);
        assert_eq!(
            code_of(OpMsg::decode(&with_length(m)).unwrap_err()).0,
            40432
        );

        // No body.
        let mut b = OpMsgBuilder::new(0, &body);
        b.begin_sequence("documents");
        let only_seq = b.finish(1, 0).to_vec();
        let mut m = only_seq[..20].to_vec();
        m.extend_from_slice(&only_seq[20 + 1 + body.len()..]);
        assert_eq!(
            code_of(OpMsg::decode(&with_length(m)).unwrap_err()).0,
            40587
        );

        // Duplicate sequence.
        let ib = bson::doc! {"insert": "c", "$db": "d"}.to_vec().unwrap();
        let mut b = OpMsgBuilder::new(0, &ib);
        b.begin_sequence("documents");
        b.push_document(&bson::doc! {"_id": 1}.to_vec().unwrap());
        b.begin_sequence("documents");
        assert_eq!(
            code_of(OpMsg::decode(&b.finish(1, 0)).unwrap_err()).0,
            40431
        );

        // Field both in the body and a sequence.
        let ib = bson::doc! {"insert": "c", "documents": [], "$db": "d"}
            .to_vec()
            .unwrap();
        let mut b = OpMsgBuilder::new(0, &ib);
        b.begin_sequence("documents");
        assert_eq!(
            code_of(OpMsg::decode(&b.finish(1, 0)).unwrap_err()).0,
            40433
        );

        // Wrong checksum.
        let mut m = OpMsgBuilder::new(MsgFlags::CHECKSUM_PRESENT, &body)
            .finish(1, 0)
            .to_vec();
        let last = m.len() - 1;
        m[last] ^= 0xff;
        assert_eq!(
            code_of(OpMsg::decode(&Bytes::from(m)).unwrap_err()),
            (288, true)
        );

        // Body length beyond the message.
        let mut m = good.clone();
        m[21] = 0x7f;
        assert_eq!(code_of(OpMsg::decode(&Bytes::from(m)).unwrap_err()).0, 22);

        // Invalid BSON inside the body.
        let mut m = good.clone();
        m[25] = 0x66;
        assert_eq!(code_of(OpMsg::decode(&Bytes::from(m)).unwrap_err()).0, 22);

        // Too short for flags.
        assert_eq!(
            code_of(OpMsg::decode(&with_length(good[..18].to_vec())).unwrap_err()).0,
            16
        );

        // Sequence size beyond the message.
        let mut m = insert_message(0).to_vec();
        let seq_pos = 20 + 1 + ib_len() + 1;
        m[seq_pos + 3] = 0x10;
        assert_eq!(code_of(OpMsg::decode(&Bytes::from(m)).unwrap_err()).0, 22);
    }

    fn ib_len() -> usize {
        bson::doc! {"insert": "c", "$db": "d"}
            .to_vec()
            .unwrap()
            .len()
    }
}
