//! The body of a read request as the read path reads it: in place, from the request's bytes.
//!
//! The read path used to read every option of a `find`, `count`, `distinct` or `aggregate` from
//! an owned options document ([`CommandRequest::options_document`]), which costs more than the
//! rest of a targeted `find` together. [`ReadBody`] reads the same fields from the bytes the
//! client sent, after one walk that proves the owned document would hold the same values: no
//! field name repeats (an owned document keeps the last value at the first position) and no
//! value would change by being owned ([`changes_when_owned`]). A body that fails the walk is
//! read from that document's encoding instead, so every read sees what it saw before.

use bson::raw::CStr;
use bson::{Bson, Document, RawBsonRef, RawDocument, RawDocumentBuf};

use crate::command::{CommandError, CommandRequest};
use crate::value::error_codes::ErrorCode;
use crate::value::field::{number_raw, truthy};
use crate::wire::changes_when_owned;

/// A read request's body, its fields read in place: what
/// [`CommandRequest::options_document`] holds, field for field and value for value.
#[derive(Debug)]
pub struct ReadBody<'a> {
    /// The bytes the fields are read from.
    raw: &'a RawDocument,
    /// The body's fields in order, but `$clusterTime` (which the options document leaves out).
    fields: Vec<(&'a CStr, RawBsonRef<'a>)>,
}

/// What one walk of a body found.
enum Walked<'a> {
    /// The body, read in place.
    Read(ReadBody<'a>),
    /// A body that does not read in place (a repeated name, a value owning would change).
    Refused,
    /// The walk could not read on; another walk decides.
    Unread,
}

impl<'a> ReadBody<'a> {
    /// The body of `req`: its own bytes when they read as its options document would, else the
    /// encoding of that document, kept in `normalized`.
    pub fn of(
        req: &'a CommandRequest,
        normalized: &'a mut Option<RawDocumentBuf>,
    ) -> Result<Self, CommandError> {
        if let Some(body) = Self::parse(req.body.raw()) {
            return Ok(body);
        }
        let encoded = RawDocumentBuf::try_from(&req.options_document()).map_err(|e| {
            CommandError::new(
                ErrorCode::InternalError,
                format!("cannot encode the read's options: {e}"),
            )
        })?;
        let encoded: &'a RawDocumentBuf = normalized.insert(encoded);
        Self::parse(encoded).ok_or_else(|| {
            CommandError::new(
                ErrorCode::InternalError,
                "the read's options do not read in place once owned",
            )
        })
    }

    /// `raw` read in place; `None` when a field name repeats or a value would change by being
    /// owned (or the bytes do not read).
    ///
    /// The body is walked by [`crate::wire::elements`] (keys compared as bytes, values stepped
    /// over by their sizes, on bytes already validated on arrival); a body that walk does not
    /// read is walked again with the `bson` crate's iterator, which decides.
    fn parse(raw: &'a RawDocument) -> Option<Self> {
        match Self::collect(raw, crate::wire::elements(raw)) {
            Walked::Read(body) => Some(body),
            Walked::Refused => None,
            Walked::Unread => match Self::collect(raw, raw.iter().map(|item| item.ok())) {
                Walked::Read(body) => Some(body),
                Walked::Refused | Walked::Unread => None,
            },
        }
    }

    /// The fields of `raw` from `items` (an item `None`: the walk could not read on).
    fn collect(
        raw: &'a RawDocument,
        items: impl Iterator<Item = Option<(&'a CStr, RawBsonRef<'a>)>>,
    ) -> Walked<'a> {
        let mut fields: Vec<(&'a CStr, RawBsonRef<'a>)> = Vec::with_capacity(12);
        for item in items {
            let Some((k, v)) = item else {
                return Walked::Unread;
            };
            if k.as_str() == "$clusterTime" {
                continue;
            }
            if fields.iter().any(|(n, _)| n.as_str() == k.as_str()) || changes_when_owned(v) {
                return Walked::Refused;
            }
            fields.push((k, v));
        }
        Walked::Read(ReadBody { raw, fields })
    }

    /// The field `key`, when present.
    pub fn get(&self, key: &str) -> Option<RawBsonRef<'a>> {
        self.element(key).map(|(_, v)| v)
    }

    /// The field `key` with its name as encoded (to copy it into another document).
    pub fn element(&self, key: &str) -> Option<(&'a CStr, RawBsonRef<'a>)> {
        self.fields.iter().find(|(k, _)| k.as_str() == key).copied()
    }

    /// The field `key` as an owned value.
    pub fn owned(&self, key: &str) -> Option<Bson> {
        self.get(key).and_then(|v| Bson::try_from(v).ok())
    }

    /// The field `key` as a number ([`crate::value::field::number_field`]).
    pub fn number(&self, key: &str) -> Option<i64> {
        self.get(key).and_then(number_raw)
    }

    /// Whether the field `key` is present and true ([`truthy`]).
    pub fn truthy(&self, key: &str) -> bool {
        self.owned(key).is_some_and(|v| truthy(&v))
    }

    /// The field `key` as a string, when it is one.
    pub fn str(&self, key: &str) -> Option<&'a str> {
        match self.get(key) {
            Some(RawBsonRef::String(s)) => Some(s),
            _ => None,
        }
    }

    /// The field `key` as a document, when it is one.
    pub fn document(&self, key: &str) -> Option<&'a RawDocument> {
        match self.get(key) {
            Some(RawBsonRef::Document(d)) => Some(d),
            _ => None,
        }
    }

    /// The fields as an owned document: [`CommandRequest::options_document`] (for the readers
    /// that still take one: aggregation stages, snapshot reads).
    pub fn to_document(&self) -> Document {
        let mut d = Document::new();
        for (k, v) in &self.fields {
            if let Ok(v) = Bson::try_from(*v) {
                d.insert(k.as_str(), v);
            }
        }
        d
    }

    /// A statement of a transaction (`startTransaction` true, or `autocommit: false`), as the
    /// router's dispatch tells it from the options document.
    pub fn in_transaction(&self) -> bool {
        self.truthy("startTransaction")
            || matches!(self.get("autocommit"), Some(RawBsonRef::Boolean(false)))
    }

    /// The bytes the fields are read from.
    pub fn raw(&self) -> &'a RawDocument {
        self.raw
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn request(body: &RawDocument) -> CommandRequest {
        CommandRequest::new(
            "db".into(),
            crate::wire::BsonDoc::from_encoded(body.as_bytes().to_vec()),
            Vec::new(),
            false,
        )
    }

    /// The fields read in place are the options document's, whichever way the body is read.
    #[test]
    fn reads_what_the_options_document_holds() {
        let plain = RawDocumentBuf::try_from(&doc! {
            "find": "c", "filter": {"_id": 1}, "limit": 1, "singleBatch": true,
            "lsid": {"id": 1}, "$clusterTime": {"clusterTime": bson::Timestamp { time: 1, increment: 1 }},
            "$db": "db",
        })
        .unwrap();
        // A repeated field: the owned document keeps the last value at the first position.
        let mut repeated = RawDocumentBuf::new();
        repeated.append(bson::raw::cstr!("find"), "c");
        repeated.append(bson::raw::cstr!("limit"), 1);
        repeated.append(bson::raw::cstr!("filter"), RawDocumentBuf::new());
        repeated.append(bson::raw::cstr!("limit"), 5);
        // A regular expression whose options an owned copy sorts.
        let mut filter = RawDocumentBuf::new();
        filter.append(
            bson::raw::cstr!("a"),
            bson::RawRegexRef {
                pattern: bson::raw::cstr!("x"),
                options: bson::raw::cstr!("mi"),
            },
        );
        let mut regex = RawDocumentBuf::new();
        regex.append(bson::raw::cstr!("find"), "c");
        regex.append(bson::raw::cstr!("filter"), filter);
        for (body, in_place) in [(&plain, true), (&repeated, false), (&regex, false)] {
            let req = request(body);
            let mut normalized = None;
            let read = ReadBody::of(&req, &mut normalized).unwrap();
            assert_eq!(read.to_document(), req.options_document());
            assert_eq!(read.get("$clusterTime"), None);
            assert_eq!(std::ptr::eq(read.raw(), req.body.raw()), in_place);
        }
        let req = request(&repeated);
        let mut normalized = None;
        assert_eq!(
            ReadBody::of(&req, &mut normalized).unwrap().number("limit"),
            Some(5)
        );
    }
}
