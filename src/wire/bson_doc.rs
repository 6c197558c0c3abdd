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

/// A copy of `doc` with room for `extra` more bytes, so that fields appended to it do not
/// move it ([`bson::RawDocumentBuf::append`] grows it by reallocation otherwise).
pub fn document_with_room(doc: &RawDocument, extra: usize) -> bson::RawDocumentBuf {
    let mut bytes = Vec::with_capacity(doc.as_bytes().len() + extra);
    bytes.extend_from_slice(doc.as_bytes());
    bson::RawDocumentBuf::from_bytes(bytes).unwrap_or_else(|_| doc.to_owned())
}

/// Checks that `bytes` hold exactly one complete, well-formed BSON document.
///
/// Every request and every shard reply passes here, so the common case is decided by
/// [`well_formed`], one walk of the bytes; only what it does not accept (malformed input, or
/// element types it leaves to the `bson` crate) is walked again by [`validate_with_bson`],
/// whose verdict and error stand.
pub fn validate_document(bytes: &[u8]) -> Result<(), WireError> {
    if well_formed(bytes, 0) {
        return Ok(());
    }
    validate_with_bson(bytes)
}

/// `doc.get(key)` (the first field named `key`, the same value and the same error), found by a
/// walk that compares the keys as bytes and steps over the values by their sizes, without the
/// element decoding the `bson` crate's iterator does for every field it passes. The walk
/// reads the element types requests carry; at anything else, or anything it would have to
/// report as malformed, the answer is `doc.get(key)` itself.
pub fn get_field<'a>(
    doc: &'a RawDocument,
    key: &str,
) -> bson::error::Result<Option<RawBsonRef<'a>>> {
    let [found] = get_fields(doc, [key]);
    found
}

/// [`get_field`] for several keys in one walk: `doc.get(key)` for each of `keys`. The walk ends
/// at the last of them or at the end of the document, so a key that usually comes last (`$db`)
/// finds the others on the way for nothing.
pub fn get_fields<'a, const N: usize>(
    doc: &'a RawDocument,
    keys: [&str; N],
) -> [bson::error::Result<Option<RawBsonRef<'a>>>; N] {
    match walk_fields(doc.as_bytes(), keys) {
        Some(found) => found.map(Ok),
        None => keys.map(|key| doc.get(key)),
    }
}

/// The walk of [`get_fields`]: the first value of each key, or `None` when the answer must be
/// the `bson` crate's (a type the walk does not read, or a malformed element).
fn walk_fields<'a, const N: usize>(
    bytes: &'a [u8],
    keys: [&str; N],
) -> Option<[Option<RawBsonRef<'a>>; N]> {
    let mut found: [Option<RawBsonRef<'a>>; N] = [None; N];
    let mut missing = N;
    let n = bytes.len();
    if n < 5 || bytes[n - 1] != 0 {
        return None;
    }
    let end = n - 1;
    let mut at = 4;
    while at < end && missing > 0 {
        let (tag, name, v, size) = step(bytes, at, end)?;
        // Each key at its first occurrence only (a key asked for twice gets it twice).
        let mut value = None;
        for i in 0..N {
            if found[i].is_some() || name != keys[i].as_bytes() {
                continue;
            }
            if value.is_none() {
                value = Some(value_of(tag, &bytes[v..v + size])?);
            }
            found[i] = value;
            missing -= 1;
        }
        at = v + size;
    }
    if missing == 0 || at == end {
        Some(found)
    } else {
        None
    }
}

/// The last value of each of `keys` in `doc` (an owned document keeps the last of a repeated
/// field), found by the byte walk of [`get_fields`] over the whole document; `None` when the
/// walk does not read the document or a value it must return (the `bson` crate's iterator
/// decides then). For documents validated on arrival ([`validate_document`]).
pub fn last_fields<'a, const N: usize>(
    doc: &'a RawDocument,
    keys: [&str; N],
) -> Option<[Option<RawBsonRef<'a>>; N]> {
    let bytes = doc.as_bytes();
    let mut found: [Option<RawBsonRef<'a>>; N] = [None; N];
    let end = bytes.len() - 1;
    let mut at = 4;
    while at < end {
        let (tag, name, v, size) = step(bytes, at, end)?;
        for i in 0..N {
            if name == keys[i].as_bytes() {
                found[i] = Some(value_of(tag, &bytes[v..v + size])?);
            }
        }
        at = v + size;
    }
    (at == end).then_some(found)
}

/// The element at `at` of a document whose terminator is at `end`, stepped over by its size:
/// its type, its key, where its value starts and the value's size; `None` at a type the walk
/// does not step over or a malformed element.
fn step(bytes: &[u8], at: usize, end: usize) -> Option<(u8, &[u8], usize, usize)> {
    let (tag, name, v) = element_head(bytes, at, end)?;
    let size = match tag {
        _ if let Some(size) = fixed_size(tag) => size,
        0x08 => 1,
        // Strings, code and symbols, documents and arrays end with a zero byte.
        0x02 | 0x0D | 0x0E | 0x03 | 0x04 => {
            let least = if matches!(tag, 0x03 | 0x04) { 5 } else { 1 };
            let size = match i32_at(bytes, v) {
                Some(len) if len >= least => len as usize + if least == 1 { 4 } else { 0 },
                _ => return None,
            };
            if v + size > end || bytes[v + size - 1] != 0 {
                return None;
            }
            size
        }
        0x05 => match i32_at(bytes, v) {
            Some(len) if len >= 0 => len as usize + 5,
            _ => return None,
        },
        _ => return None,
    };
    if v + size > end {
        return None;
    }
    Some((tag, name, v, size))
}

/// The value of type `tag` encoded in `bytes` (exactly its size), as the `bson` crate reads
/// it; `None` for a type the walk leaves to that crate (arrays among them: the crate makes
/// its array views itself) or a value it would refuse.
fn value_of(tag: u8, bytes: &[u8]) -> Option<RawBsonRef<'_>> {
    Some(match tag {
        0x01 => RawBsonRef::Double(f64::from_le_bytes(bytes.try_into().ok()?)),
        0x10 => RawBsonRef::Int32(i32::from_le_bytes(bytes.try_into().ok()?)),
        0x12 => RawBsonRef::Int64(i64::from_le_bytes(bytes.try_into().ok()?)),
        0x0A => RawBsonRef::Null,
        0x08 if bytes[0] <= 1 => RawBsonRef::Boolean(bytes[0] == 1),
        0x02 => RawBsonRef::String(std::str::from_utf8(&bytes[4..bytes.len() - 1]).ok()?),
        0x03 => RawBsonRef::Document(RawDocument::from_bytes(bytes).ok()?),
        0x07 => RawBsonRef::ObjectId(bson::oid::ObjectId::from_bytes(bytes.try_into().ok()?)),
        0x09 => RawBsonRef::DateTime(bson::DateTime::from_millis(i64::from_le_bytes(
            bytes.try_into().ok()?,
        ))),
        0x11 => {
            let u = u64::from_le_bytes(bytes.try_into().ok()?);
            RawBsonRef::Timestamp(bson::Timestamp {
                increment: u as u32,
                time: (u >> 32) as u32,
            })
        }
        // Binary but the old subtype (whose inner length the crate reads).
        0x05 if bytes[4] != 0x02 => RawBsonRef::Binary(bson::RawBinaryRef {
            subtype: bytes[4].into(),
            bytes: &bytes[5..],
        }),
        _ => return None,
    })
}

/// The elements of `doc` in order, each its key and value, read by the byte walk of
/// [`get_fields`] (keys compared as bytes, values stepped over by their sizes) instead of the
/// `bson` crate's iterator, which decodes and checks every element it passes. An item `None`
/// (the last) means the walk met an element it does not read (an array, a type requests seldom
/// carry, or a malformed element): read the document with the `bson` crate instead.
pub fn elements(doc: &RawDocument) -> Elements<'_> {
    let bytes = doc.as_bytes();
    Elements {
        bytes,
        at: 4,
        end: bytes.len() - 1,
    }
}

/// The iterator of [`elements`].
#[derive(Debug, Clone)]
pub struct Elements<'a> {
    bytes: &'a [u8],
    /// Where the next element starts (past `end` once the walk has failed).
    at: usize,
    /// The document's terminator.
    end: usize,
}

impl<'a> Iterator for Elements<'a> {
    type Item = Option<(&'a bson::raw::CStr, RawBsonRef<'a>)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.at >= self.end {
            return None;
        }
        let read = step(self.bytes, self.at, self.end).and_then(|(tag, name, v, size)| {
            let name = <&bson::raw::CStr>::try_from(std::str::from_utf8(name).ok()?).ok()?;
            let value = value_of(tag, &self.bytes[v..v + size])?;
            Some((name, value, v + size))
        });
        match read {
            Some((name, value, next)) => {
                self.at = next;
                Some(Some((name, value)))
            }
            None => {
                self.at = usize::MAX;
                Some(None)
            }
        }
    }
}

impl<'a> Elements<'a> {
    /// The same walk, each item with the element's encoded bytes (type, key and value) as
    /// they stand in the document: what a copy of the element appends unchanged.
    pub fn with_bytes(self) -> ElementsWithBytes<'a> {
        ElementsWithBytes(self)
    }
}

/// The iterator of [`Elements::with_bytes`].
#[derive(Debug, Clone)]
pub struct ElementsWithBytes<'a>(Elements<'a>);

impl<'a> Iterator for ElementsWithBytes<'a> {
    type Item = Option<(&'a bson::raw::CStr, RawBsonRef<'a>, &'a [u8])>;

    fn next(&mut self) -> Option<Self::Item> {
        let (bytes, start) = (self.0.bytes, self.0.at);
        let item = self.0.next()?;
        let end = self.0.at;
        Some(item.map(|(k, v)| (k, v, &bytes[start..end])))
    }
}

/// Whether converting `value` to an owned value and encoding it again would give other bytes:
/// a field name that repeats within a document (an owned document keeps the last), or a
/// regular expression whose options are not in order (an owned one sorts them).
pub fn changes_when_owned(value: RawBsonRef<'_>) -> bool {
    let doc = match value {
        RawBsonRef::Document(d) => d,
        RawBsonRef::Array(a) => {
            return a.into_iter().any(|v| v.map_or(true, changes_when_owned));
        }
        RawBsonRef::JavaScriptCodeWithScope(c) => c.scope,
        RawBsonRef::RegularExpression(re) => {
            let o = re.options.as_str().as_bytes();
            return o.windows(2).any(|w| w[0] > w[1]);
        }
        _ => return false,
    };
    if let Some(changes) = changes_when_owned_walked(doc) {
        return changes;
    }
    let mut names: Vec<&str> = Vec::new();
    for item in doc.iter() {
        let Ok((k, v)) = item else { return true };
        if names.contains(&k.as_str()) || changes_when_owned(v) {
            return true;
        }
        names.push(k.as_str());
    }
    false
}

/// [`changes_when_owned`] of a document read by [`elements`]; `None` when the walk does not
/// read it (the `bson` crate's iterator decides).
fn changes_when_owned_walked(doc: &RawDocument) -> Option<bool> {
    let mut names: [&[u8]; 16] = [&[]; 16];
    for (count, item) in elements(doc).enumerate() {
        let (k, v) = item?;
        let k = k.as_str().as_bytes();
        // Names past the sixteenth are left to the crate's iterator and its list.
        if count == names.len() {
            return None;
        }
        if names[..count].contains(&k) || changes_when_owned(v) {
            return Some(true);
        }
        names[count] = k;
    }
    Some(false)
}

/// The element at `at` of a document whose terminator is at `end`: its type, its key and where
/// its value starts; `None` when the key is not terminated before `end` or is not UTF-8.
fn element_head(bytes: &[u8], at: usize, end: usize) -> Option<(u8, &[u8], usize)> {
    let tag = bytes[at];
    let key_start = at + 1;
    let (i, ascii) = key_end(bytes, key_start, end)?;
    let key = &bytes[key_start..i];
    if !ascii && std::str::from_utf8(key).is_err() {
        return None;
    }
    Some((tag, key, i + 1))
}

/// Where the key starting at `start` ends (its zero byte, before `end`) and whether every byte
/// before that is ASCII: one pass, eight bytes at a time while eight remain.
fn key_end(bytes: &[u8], start: usize, end: usize) -> Option<(usize, bool)> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let mut i = start;
    let mut high = 0u64;
    while i + 8 <= end {
        let Ok(word) = <[u8; 8]>::try_from(&bytes[i..i + 8]) else {
            break;
        };
        let w = u64::from_le_bytes(word);
        // The lowest flagged byte is the first zero byte (flags above it may be false).
        let zero = w.wrapping_sub(ONES) & !w & HIGHS;
        if zero != 0 {
            let n = (zero.trailing_zeros() / 8) as usize;
            let before = if n == 0 { 0 } else { u64::MAX >> (64 - 8 * n) };
            high |= w & before;
            return Some((i + n, high & HIGHS == 0));
        }
        high |= w;
        i += 8;
    }
    let mut high = (high & HIGHS != 0) as u8 * 0x80;
    while i < end {
        let b = bytes[i];
        if b == 0 {
            return Some((i, high < 0x80));
        }
        high |= b;
        i += 1;
    }
    None
}

/// The size of a value whose type fixes it (the boolean aside: its byte is checked).
fn fixed_size(tag: u8) -> Option<usize> {
    match tag {
        0x01 | 0x09 | 0x11 | 0x12 => Some(8),
        0x10 => Some(4),
        0x07 => Some(12),
        0x13 => Some(16),
        0x06 | 0x0A | 0x7F | 0xFF => Some(0),
        _ => None,
    }
}

/// Reads a little-endian `i32` at `at`, when four bytes are there.
fn i32_at(bytes: &[u8], at: usize) -> Option<i32> {
    let b = bytes.get(at..at.checked_add(4)?)?;
    Some(i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// Whether `bytes` are one document every element of which (recursively, `depth` levels
/// below the top) is of a type requests and replies carry — double, string, document, array,
/// binary (but the old subtype 2), undefined, ObjectId, boolean, date, null, int32,
/// timestamp, int64, decimal128, min and max key — and is complete and well-formed as the
/// `bson` crate reads it: keys and strings valid UTF-8, lengths within their container, a
/// boolean 0 or 1, nesting within [`MAX_BSON_DEPTH`]. It accepts nothing
/// [`validate_with_bson`] refuses; `false` leaves the verdict to it.
fn well_formed(bytes: &[u8], depth: usize) -> bool {
    let n = bytes.len();
    if depth > MAX_BSON_DEPTH || n < 5 || i32_at(bytes, 0) != Some(n as i32) || bytes[n - 1] != 0 {
        return false;
    }
    // The elements lie in `bytes[4..end]`; `end` is the terminator.
    let end = n - 1;
    let mut at = 4;
    while at < end {
        let Some((tag, _, v)) = element_head(bytes, at, end) else {
            return false;
        };
        let size = match tag {
            _ if let Some(size) = fixed_size(tag) => size,
            0x08 => match bytes.get(v) {
                Some(0 | 1) => 1,
                _ => return false,
            },
            0x02 => {
                let Some(len) = i32_at(bytes, v).filter(|&l| l >= 1) else {
                    return false;
                };
                let size = 4 + len as usize;
                if v + size > end || bytes[v + size - 1] != 0 {
                    return false;
                }
                let text = &bytes[v + 4..v + size - 1];
                if !text.is_ascii() && std::str::from_utf8(text).is_err() {
                    return false;
                }
                size
            }
            0x03 | 0x04 => {
                let Some(len) = i32_at(bytes, v).filter(|&l| l >= 5) else {
                    return false;
                };
                let size = len as usize;
                if v + size > end || !well_formed(&bytes[v..v + size], depth + 1) {
                    return false;
                }
                size
            }
            0x05 => {
                let Some(len) = i32_at(bytes, v).filter(|&l| l >= 0) else {
                    return false;
                };
                let size = len as usize + 5;
                // The old binary subtype's inner length is left to the full check.
                if size >= i32::MAX as usize || v + size > end || bytes[v + 4] == 0x02 {
                    return false;
                }
                size
            }
            _ => return false,
        };
        if v + size > end {
            return false;
        }
        at = v + size;
    }
    at == end
}

/// [`validate_document`] through the `bson` crate's reader: the verdict and the error for
/// whatever [`well_formed`] does not accept.
fn validate_with_bson(bytes: &[u8]) -> Result<(), WireError> {
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

    /// Documents of every element type, nested, as requests and replies carry them.
    fn samples() -> Vec<Vec<u8>> {
        let bin = |subtype, bytes: Vec<u8>| bson::Bson::Binary(bson::Binary { subtype, bytes });
        let docs = [
            bson::doc! {},
            bson::doc! {"insert": "c", "ordered": true, "lsid": {"id": bin(bson::spec::BinarySubtype::Uuid, vec![7; 16])},
            "txnNumber": 5i64, "$db": "test", "écrit": "ünïcode ✓"},
            bson::doc! {"a": 1.5, "b": [1, "x", {"c": null}], "d": bson::oid::ObjectId::new(),
            "e": false, "f": bson::DateTime::from_millis(7), "g": bson::Timestamp {time: 1, increment: 2},
            "h": 9i64, "i": bson::Decimal128::from_bytes([3; 16]), "j": bson::Bson::MinKey,
            "k": bson::Bson::MaxKey, "l": bson::Bson::Undefined, "m": bin(bson::spec::BinarySubtype::Generic, vec![]),
            "n": ""},
            // Types left to the full check: each document is still valid.
            bson::doc! {"r": bson::Regex {pattern: bson::raw::cstr!("a").into(), options: bson::raw::cstr!("i").into()}},
            bson::doc! {"js": bson::Bson::JavaScriptCode("x".into()), "s": bson::Bson::Symbol("y".into())},
            bson::doc! {"old": bin(bson::spec::BinarySubtype::BinaryOld, vec![1, 2, 3])},
        ];
        docs.iter().map(|d| d.to_vec().unwrap()).collect()
    }

    /// `good` and copies of it with one byte past the length prefix replaced by each of a few
    /// telling values (type bytes, a UTF-8 lead byte, `0xff`): the damaged inputs the walks are
    /// compared on.
    fn damaged(good: &[u8]) -> Vec<Vec<u8>> {
        let mut variants = vec![good.to_vec()];
        for pos in 4..good.len() {
            for v in [0u8, 1, 2, 3, 5, 0x10, 0x7f, 0xc3, 0xff] {
                let mut bad = good.to_vec();
                bad[pos] = v;
                variants.push(bad);
            }
        }
        variants
    }

    /// The single walk accepts the common element types (so requests take the fast path) and
    /// never accepts what the `bson` crate's reader refuses: every sample, and every change of
    /// one byte (to each of a few telling values) and every truncation of each sample.
    #[test]
    fn the_single_walk_accepts_nothing_the_bson_reader_refuses() {
        let samples = samples();
        for (i, good) in samples.iter().enumerate() {
            assert!(validate_with_bson(good).is_ok());
            // The first three samples hold only the types the walk reads itself.
            assert_eq!(well_formed(good, 0), i < 3, "sample {i}");
            let mut variants = Vec::new();
            for pos in 0..good.len() {
                for v in [
                    0u8,
                    1,
                    2,
                    3,
                    4,
                    5,
                    0x7f,
                    0x80,
                    0xc3,
                    0xff,
                    good[pos].wrapping_add(1),
                ] {
                    let mut bad = good.clone();
                    bad[pos] = v;
                    variants.push(bad);
                }
                variants.push(good[..pos].to_vec());
            }
            for bad in variants {
                if well_formed(&bad, 0) {
                    assert!(
                        validate_with_bson(&bad).is_ok(),
                        "accepted what the bson reader refuses: {bad:?}"
                    );
                }
                assert_eq!(
                    validate_document(&bad).is_ok(),
                    validate_with_bson(&bad).is_ok()
                );
            }
        }
    }

    /// The byte walk finds what `RawDocument::get` finds — the same value or error, the first
    /// of a repeated field, nothing for a missing one — in every sample and every damaged copy
    /// of it, for every key the sample holds and one it does not, one key at a time and two
    /// keys in one walk ([`get_fields`], each pair in both orders).
    #[test]
    fn the_byte_walk_finds_what_the_bson_reader_finds() {
        let mut repeated = bson::RawDocumentBuf::new();
        repeated.append(bson::raw::cstr!("a"), 1);
        repeated.append(bson::raw::cstr!("a"), "two");
        let mut all = samples();
        all.push(repeated.into_bytes());
        for good in all {
            let keys: Vec<String> = RawDocument::from_bytes(&good)
                .unwrap()
                .iter()
                .flatten()
                .map(|(k, _)| k.as_str().to_string())
                .chain(["missing".to_string(), String::new()])
                .collect();
            let variants = damaged(&good);
            for bytes in &variants {
                let Ok(doc) = RawDocument::from_bytes(bytes) else {
                    continue;
                };
                let same = |key: &str, fast: &bson::error::Result<Option<RawBsonRef<'_>>>| {
                    let slow = doc.get(key);
                    match (fast, &slow) {
                        // Compared as printed: a damaged double may be NaN on both sides.
                        (Ok(a), Ok(b)) => {
                            assert_eq!(format!("{a:?}"), format!("{b:?}"), "{key} in {bytes:?}")
                        }
                        (Err(_), Err(_)) => {}
                        _ => panic!("{key} in {bytes:?}: {fast:?} against {slow:?}"),
                    }
                };
                for key in &keys {
                    same(key, &get_field(doc, key));
                    for other in &keys {
                        let [a, b] = get_fields(doc, [key.as_str(), other.as_str()]);
                        same(key, &a);
                        same(other, &b);
                    }
                }
            }
        }
    }

    /// The element walk reads what the `bson` crate's iterator reads — the same keys and
    /// values in the same order — as far as it reads, in every sample and damaged copy; a
    /// walk that reads to the end is one the iterator reads to the end without an error; and
    /// it reads the common request types itself.
    #[test]
    fn the_element_walk_reads_what_the_bson_iterator_reads() {
        let mut repeated = bson::RawDocumentBuf::new();
        repeated.append(bson::raw::cstr!("a"), 1);
        repeated.append(bson::raw::cstr!("a"), "two");
        let mut all = samples();
        all.push(repeated.into_bytes());
        // The samples without an array or a type left to the crate are read to the end.
        for i in [0, 1, 6] {
            let doc = RawDocument::from_bytes(&all[i]).unwrap();
            assert!(elements(doc).all(|e| e.is_some()), "sample {i}");
        }
        for good in all {
            let variants = damaged(&good);
            for bytes in &variants {
                let Ok(doc) = RawDocument::from_bytes(bytes) else {
                    continue;
                };
                let mut slow = doc.iter();
                let mut whole = true;
                for fast in elements(doc) {
                    let Some((k, v)) = fast else {
                        whole = false;
                        break;
                    };
                    match slow.next() {
                        Some(Ok((sk, sv))) => {
                            assert_eq!(k.as_str(), sk.as_str(), "{bytes:?}");
                            assert_eq!(format!("{v:?}"), format!("{sv:?}"), "{bytes:?}");
                        }
                        other => {
                            panic!("{bytes:?}: walked {k:?} where the iterator gave {other:?}")
                        }
                    }
                }
                if whole {
                    assert!(slow.next().is_none(), "{bytes:?}");
                }
            }
        }
    }

    /// Each element's bytes are the element as the `bson` crate encodes it again: appended
    /// one after another they give the document back, in every sample and valid damaged copy
    /// the walk reads.
    #[test]
    fn the_element_bytes_are_the_elements_encoded() {
        for good in samples() {
            let variants = damaged(&good);
            for bytes in &variants {
                let Ok(doc) = RawDocument::from_bytes(bytes) else {
                    continue;
                };
                let mut copied = vec![0u8; 4];
                let mut whole = true;
                for item in elements(doc).with_bytes() {
                    let Some((k, v, element)) = item else {
                        whole = false;
                        break;
                    };
                    let mut one = bson::RawDocumentBuf::new();
                    one.append(k, v);
                    let one = one.as_bytes();
                    assert_eq!(element, &one[4..one.len() - 1], "{bytes:?}");
                    copied.extend_from_slice(element);
                }
                if whole {
                    copied.push(0);
                    let len = copied.len() as i32;
                    copied[..4].copy_from_slice(&len.to_le_bytes());
                    assert_eq!(&copied, bytes);
                }
            }
        }
    }

    /// [`last_fields`] finds, in every valid sample and valid damaged copy, the last value of
    /// each key the `bson` crate's iterator finds, when it answers at all; and it answers for
    /// documents of the types it reads.
    #[test]
    fn last_fields_finds_the_iterators_last_values() {
        let mut repeated = bson::RawDocumentBuf::new();
        repeated.append(bson::raw::cstr!("a"), 1);
        repeated.append(bson::raw::cstr!("ok"), 0.0);
        repeated.append(bson::raw::cstr!("a"), "two");
        let mut all = samples();
        all.push(repeated.into_bytes());
        let doc = RawDocument::from_bytes(all.last().unwrap()).unwrap();
        assert_eq!(
            format!("{:?}", last_fields(doc, ["a", "ok", "x"])),
            format!(
                "{:?}",
                Some([
                    Some(RawBsonRef::String("two")),
                    Some(RawBsonRef::Double(0.0)),
                    None
                ])
            )
        );
        for good in all {
            let variants = damaged(&good);
            for bytes in variants.iter().filter(|b| validate_document(b).is_ok()) {
                let doc = RawDocument::from_bytes(bytes).unwrap();
                let keys: Vec<String> = doc
                    .iter()
                    .flatten()
                    .map(|(k, _)| k.as_str().to_string())
                    .chain(["missing".to_string()])
                    .collect();
                for key in &keys {
                    let Some([fast]) = last_fields(doc, [key.as_str()]) else {
                        continue;
                    };
                    let slow = doc
                        .iter()
                        .flatten()
                        .filter(|(k, _)| k.as_str() == key)
                        .last()
                        .map(|(_, v)| v);
                    assert_eq!(
                        format!("{fast:?}"),
                        format!("{slow:?}"),
                        "{key} in {bytes:?}"
                    );
                }
            }
        }
    }

    /// [`changes_when_owned`] by the element walk says what the `bson` crate's iterator says.
    #[test]
    fn changes_when_owned_walked_agrees_with_the_iterator() {
        let mut repeated = bson::RawDocumentBuf::new();
        repeated.append(bson::raw::cstr!("a"), 1);
        repeated.append(bson::raw::cstr!("b"), "x");
        repeated.append(bson::raw::cstr!("a"), "two");
        let mut nested = bson::RawDocumentBuf::new();
        nested.append(bson::raw::cstr!("x"), 1);
        nested.append(bson::raw::cstr!("in"), repeated.clone());
        let mut unsorted = bson::RawDocumentBuf::new();
        unsorted.append(
            bson::raw::cstr!("r"),
            bson::RawRegexRef {
                pattern: bson::raw::cstr!("x"),
                options: bson::raw::cstr!("mi"),
            },
        );
        // A name repeated past the sixteenth: the walk hands the document to the iterator.
        let mut wide = bson::RawDocumentBuf::new();
        for i in 0..20 {
            wide.append(
                <&bson::raw::CStr>::try_from(format!("f{i}").as_str()).unwrap(),
                i,
            );
        }
        wide.append(bson::raw::cstr!("f3"), "again");
        let mut docs: Vec<Vec<u8>> = samples();
        docs.extend([
            repeated.into_bytes(),
            nested.into_bytes(),
            unsorted.into_bytes(),
            wide.into_bytes(),
        ]);
        let expected = [
            false, false, false, false, false, false, true, true, true, true,
        ];
        for (bytes, expected) in docs.iter().zip(expected) {
            let doc = RawDocument::from_bytes(bytes).unwrap();
            assert_eq!(
                changes_when_owned(RawBsonRef::Document(doc)),
                expected,
                "{bytes:?}"
            );
        }
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
