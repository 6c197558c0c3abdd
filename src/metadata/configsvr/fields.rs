//! Field readers with mongod's wording for a missing or mistyped field, in the two styles the
//! config documents are parsed with in MongoDB: the IDL parser (`config.databases`,
//! `config.collections`: `BSON field 'DatabaseType.primary' is missing but a required field`) and
//! the hand-written `bson_extract` helpers (`config.shards`, `config.chunks`: `Missing expected
//! field "host"`).
//!
//! Type names and values in messages come from the [`Printer`] the caller lends, so this module
//! holds no copy of the project's value helpers.

use bson::spec::BinarySubtype;
use bson::{oid::ObjectId, Bson, DateTime, Document, Timestamp, Uuid};

use crate::backend::topology::Printer;
use crate::value::error_codes::ErrorCode;

use super::error::MetadataError;

/// Reads the fields of one IDL struct (`ctx` is its name, or a dotted path for a nested one).
pub(super) struct Idl<'a> {
    pub doc: &'a Document,
    pub ctx: &'a str,
    pub printer: &'a Printer,
}

impl<'a> Idl<'a> {
    fn path(&self, field: &str) -> String {
        format!("{}.{field}", self.ctx)
    }

    /// `40414 BSON field '<ctx>.<field>' is missing but a required field`.
    pub fn missing(&self, field: &str) -> MetadataError {
        MetadataError::new(
            ErrorCode::IdlMissingField,
            format!(
                "BSON field '{}' is missing but a required field",
                self.path(field)
            ),
        )
    }

    /// `TypeMismatch BSON field '<ctx>.<field>' is the wrong type '<t>', expected type '<e>'`.
    pub fn wrong_type(&self, field: &str, value: &Bson, expected: &str) -> MetadataError {
        MetadataError::new(
            ErrorCode::TypeMismatch,
            format!(
                "BSON field '{}' is the wrong type '{}', expected type '{expected}'",
                self.path(field),
                (self.printer.type_name)(value)
            ),
        )
    }

    /// The field, `None` when absent or null (the IDL parser treats an explicit null as
    /// absent).
    pub fn get(&self, field: &str) -> Option<&'a Bson> {
        match self.doc.get(field) {
            None | Some(Bson::Null) => None,
            Some(v) => Some(v),
        }
    }

    fn required(&self, field: &str) -> Result<&'a Bson, MetadataError> {
        self.get(field).ok_or_else(|| self.missing(field))
    }

    pub fn string(&self, field: &str) -> Result<String, MetadataError> {
        match self.required(field)? {
            Bson::String(s) => Ok(s.clone()),
            v => Err(self.wrong_type(field, v, "string")),
        }
    }

    pub fn optional_object_id(&self, field: &str) -> Result<Option<ObjectId>, MetadataError> {
        match self.get(field) {
            None => Ok(None),
            Some(Bson::ObjectId(o)) => Ok(Some(*o)),
            Some(v) => Err(self.wrong_type(field, v, "objectId")),
        }
    }

    pub fn timestamp(&self, field: &str) -> Result<Timestamp, MetadataError> {
        match self.required(field)? {
            Bson::Timestamp(t) => Ok(*t),
            v => Err(self.wrong_type(field, v, "timestamp")),
        }
    }

    pub fn date(&self, field: &str) -> Result<DateTime, MetadataError> {
        match self.required(field)? {
            Bson::DateTime(d) => Ok(*d),
            v => Err(self.wrong_type(field, v, "date")),
        }
    }

    pub fn uuid(&self, field: &str) -> Result<Uuid, MetadataError> {
        let v = self.required(field)?;
        uuid_of(v).ok_or_else(|| match v {
            Bson::Binary(b) => MetadataError::new(
                ErrorCode::TypeMismatch,
                format!(
                    "BSON field '{}' is the wrong binData type '{}', expected type '{}'",
                    self.path(field),
                    u8::from(b.subtype),
                    u8::from(BinarySubtype::Uuid)
                ),
            ),
            _ => self.wrong_type(field, v, "binData"),
        })
    }

    pub fn document(&self, field: &str) -> Result<&'a Document, MetadataError> {
        match self.required(field)? {
            Bson::Document(d) => Ok(d),
            v => Err(self.wrong_type(field, v, "object")),
        }
    }

    pub fn optional_document(&self, field: &str) -> Result<Option<&'a Document>, MetadataError> {
        match self.get(field) {
            None => Ok(None),
            Some(Bson::Document(d)) => Ok(Some(d)),
            Some(v) => Err(self.wrong_type(field, v, "object")),
        }
    }

    pub fn optional_bool(&self, field: &str) -> Result<Option<bool>, MetadataError> {
        match self.get(field) {
            None => Ok(None),
            Some(Bson::Boolean(b)) => Ok(Some(*b)),
            Some(v) => Err(self.wrong_type(field, v, "bool")),
        }
    }

    pub fn int(&self, field: &str) -> Result<i32, MetadataError> {
        match self.required(field)? {
            Bson::Int32(i) => Ok(*i),
            v => Err(self.wrong_type(field, v, "int")),
        }
    }
}

/// A UUID stored as BinData subtype 4.
pub(super) fn uuid_of(v: &Bson) -> Option<Uuid> {
    match v {
        Bson::Binary(b) if b.subtype == BinarySubtype::Uuid => {
            let bytes: [u8; 16] = b.bytes.as_slice().try_into().ok()?;
            Some(Uuid::from_bytes(bytes))
        }
        _ => None,
    }
}

/// `bson_extract` style: `NoSuchKey Missing expected field "<field>"`.
pub(super) fn extract_missing(field: &str) -> MetadataError {
    MetadataError::new(
        ErrorCode::NoSuchKey,
        format!("Missing expected field \"{field}\""),
    )
}

/// `bson_extract` style: `TypeMismatch "<field>" had the wrong type. Expected <e>, found <t>`.
pub(super) fn extract_wrong_type(
    printer: &Printer,
    field: &str,
    value: &Bson,
    expected: &str,
) -> MetadataError {
    MetadataError::new(
        ErrorCode::TypeMismatch,
        format!(
            "\"{field}\" had the wrong type. Expected {expected}, found {}",
            (printer.type_name)(value)
        ),
    )
}

/// A required string field, `bson_extract` style.
pub(super) fn extract_string(
    printer: &Printer,
    doc: &Document,
    field: &str,
) -> Result<String, MetadataError> {
    match doc.get(field) {
        None => Err(extract_missing(field)),
        Some(Bson::String(s)) => Ok(s.clone()),
        Some(v) => Err(extract_wrong_type(printer, field, v, "string")),
    }
}

/// An optional boolean field, `bson_extract` style.
pub(super) fn extract_optional_bool(
    printer: &Printer,
    doc: &Document,
    field: &str,
) -> Result<Option<bool>, MetadataError> {
    match doc.get(field) {
        None => Ok(None),
        Some(Bson::Boolean(b)) => Ok(Some(*b)),
        Some(v) => Err(extract_wrong_type(printer, field, v, "bool")),
    }
}

/// How a document is named in an error: its `_id` as mongod prints an element
/// (`_id: ObjectId('…')`), or the whole document when it has none.
pub(super) fn name_of(printer: &Printer, doc: &Document) -> String {
    match doc.get("_id") {
        Some(id) => format!("_id: {}", (printer.value)(id)),
        None => (printer.document)(doc),
    }
}
