//! A validated BSON document held as a zero-copy view over a received frame.

use bson::{RawBsonRef, RawDocument};
use bytes::Bytes;

use super::WireError;
use crate::limits::MAX_BSON_DEPTH;
use crate::value::error_codes::ErrorCode;

/// Bytes proven to be one well-formed BSON document (every element, recursively, and every
/// string valid UTF-8). Cloning shares the frame's buffer.
#[derive(Clone, PartialEq, Eq)]
pub struct BsonDoc(Bytes);

impl BsonDoc {
    /// Validates `bytes` (exactly one document) and wraps them.
    pub fn new(bytes: Bytes) -> Result<Self, WireError> {
        validate_document(&bytes)?;
        Ok(BsonDoc(bytes))
    }

    /// Wraps bytes produced by a BSON encoder (trusted: encoders emit valid documents).
    pub fn from_encoded(bytes: Vec<u8>) -> Self {
        BsonDoc(Bytes::from(bytes))
    }

    /// The document, read in place.
    pub fn raw(&self) -> &RawDocument {
        // Validated at construction, so this cannot fail; fall back to `{}` rather than panic.
        RawDocument::from_bytes(&self.0[..]).unwrap_or_else(|_| empty_document())
    }

    /// The underlying bytes (shared, not copied).
    pub fn bytes(&self) -> &Bytes {
        &self.0
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the document is `{}`.
    pub fn is_empty(&self) -> bool {
        self.0.len() <= 5
    }

    /// The first field's name (a command's name), if any.
    pub fn first_key(&self) -> Option<&str> {
        self.raw()
            .iter()
            .next()
            .and_then(|r| r.ok())
            .map(|(k, _)| k.as_str())
    }

    /// An owned `bson::Document` copy, for code off the hot path.
    pub fn to_document(&self) -> bson::Document {
        bson::Document::try_from(self.raw()).unwrap_or_default()
    }
}

impl std::fmt::Debug for BsonDoc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match bson::Document::try_from(self.raw()) {
            Ok(d) => write!(f, "{d}"),
            Err(_) => write!(f, "<{} bytes>", self.0.len()),
        }
    }
}

/// `{}`, read in place: what a document that cannot be read falls back to.
pub fn empty_document() -> &'static RawDocument {
    static EMPTY: std::sync::LazyLock<bson::RawDocumentBuf> =
        std::sync::LazyLock::new(bson::RawDocumentBuf::new);
    &EMPTY
}

/// Checks that `bytes` hold exactly one complete, well-formed BSON document.
pub fn validate_document(bytes: &[u8]) -> Result<(), WireError> {
    if bytes.len() < 5 {
        return Err(invalid("document is shorter than 5 bytes"));
    }
    let declared = i32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    if declared < 5 || declared as usize != bytes.len() {
        return Err(invalid(format!(
            "document length {declared} does not match the {} bytes available",
            bytes.len()
        )));
    }
    let doc = RawDocument::from_bytes(bytes).map_err(|e| invalid(e.to_string()))?;
    validate_elements(doc, 0)
}

/// Checks every element of `doc`, which sits `depth` levels below the top-level document.
/// Recursion is bounded: nesting beyond [`MAX_BSON_DEPTH`] (mongod's `maxBSONDepth`) is
/// refused with Overflow (15), as mongod's validator refuses it, before going deeper.
fn validate_elements(doc: &RawDocument, depth: usize) -> Result<(), WireError> {
    if depth > MAX_BSON_DEPTH {
        return Err(WireError::invalid(
            ErrorCode::Overflow,
            format!("BSONObj exceeded maximum nested object depth: {MAX_BSON_DEPTH}"),
        ));
    }
    for item in doc.iter() {
        let (_, value) = item.map_err(|e| invalid(e.to_string()))?;
        match value {
            RawBsonRef::Document(d) => validate_elements(d, depth + 1)?,
            RawBsonRef::Array(a) => {
                let as_doc =
                    RawDocument::from_bytes(a.as_bytes()).map_err(|e| invalid(e.to_string()))?;
                validate_elements(as_doc, depth + 1)?
            }
            RawBsonRef::JavaScriptCodeWithScope(c) => validate_elements(c.scope, depth + 1)?,
            _ => {}
        }
    }
    Ok(())
}

fn invalid(msg: impl Into<String>) -> WireError {
    WireError::invalid(ErrorCode::InvalidBSON, msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_valid_and_rejects_broken_documents() {
        let good = bson::doc! {"a": 1, "b": {"c": [1, "x"]}}.to_vec().unwrap();
        let doc = BsonDoc::new(Bytes::from(good.clone())).unwrap();
        assert_eq!(doc.first_key(), Some("a"));

        // Wrong declared length.
        let mut bad = good.clone();
        bad[0] = bad[0].wrapping_add(1);
        assert!(BsonDoc::new(Bytes::from(bad)).is_err());

        // Missing terminator.
        let mut bad = good.clone();
        let last = bad.len() - 1;
        bad[last] = 1;
        assert!(BsonDoc::new(Bytes::from(bad)).is_err());

        // An unknown element type inside.
        let mut bad = good;
        bad[4] = 0x77;
        assert!(BsonDoc::new(Bytes::from(bad)).is_err());

        assert!(BsonDoc::new(Bytes::from_static(&[1, 2])).is_err());
    }

    #[test]
    fn nesting_is_bounded_at_max_bson_depth() {
        fn nested(levels: usize) -> Vec<u8> {
            let mut d = bson::doc! {};
            for _ in 0..levels {
                d = bson::doc! {"a": d};
            }
            d.to_vec().unwrap()
        }
        assert!(BsonDoc::new(Bytes::from(nested(MAX_BSON_DEPTH))).is_ok());
        match BsonDoc::new(Bytes::from(nested(MAX_BSON_DEPTH + 1))) {
            Err(WireError::Invalid { code, message, .. }) => {
                assert_eq!(code, ErrorCode::Overflow);
                assert_eq!(message, "BSONObj exceeded maximum nested object depth: 200");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn rejects_invalid_utf8_in_nested_strings() {
        let mut bytes = bson::doc! {"a": {"s": "ab"}}.to_vec().unwrap();
        let pos = bytes.windows(2).position(|w| w == b"ab").unwrap();
        bytes[pos] = 0xff;
        assert!(BsonDoc::new(Bytes::from(bytes)).is_err());
    }
}
