//! A reply body on its way to the client: either built as a document (most commands), or
//! already encoded — results passed through from a shard as their bytes, counters written
//! straight into the buffer — so that nothing decodes it again only to encode it once more.
//! The frontend frames either form unchanged.

use bson::raw::{CStr, RawDocumentBuf};
use bson::{Bson, Document, RawBsonRef, Timestamp};

/// A reply body.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// Built as a document.
    Document(Document),
    /// Already encoded.
    Raw(RawDocumentBuf),
}

impl From<Document> for Reply {
    fn from(d: Document) -> Self {
        Reply::Document(d)
    }
}

impl From<RawDocumentBuf> for Reply {
    fn from(d: RawDocumentBuf) -> Self {
        Reply::Raw(d)
    }
}

/// The 20 zero bytes of an unsigned `$clusterTime` signature.
const ZERO_SIGNATURE: [u8; 20] = [0; 20];

impl Reply {
    /// Encodes a document reply (an encoded one stays as it is). A document that cannot be
    /// encoded stays a document: the frontend answers it with an error reply.
    pub fn encode(&mut self) {
        if let Reply::Document(d) = self {
            if let Ok(raw) = RawDocumentBuf::try_from(&*d) {
                *self = Reply::Raw(raw);
            }
        }
    }

    /// Whether the reply has a top-level field `key`.
    pub fn contains_key(&self, key: &str) -> bool {
        match self {
            Reply::Document(d) => d.contains_key(key),
            Reply::Raw(r) => matches!(super::get_field(r, key), Ok(Some(_))),
        }
    }

    /// The reply's `ok` when it is a double (as every server sends it).
    pub fn ok(&self) -> Option<f64> {
        match self {
            Reply::Document(d) => d.get_f64("ok").ok(),
            Reply::Raw(r) => match r.get("ok") {
                Ok(Some(RawBsonRef::Double(v))) => Some(v),
                _ => None,
            },
        }
    }

    /// Appends `key: value` at the end (the key must not be there yet; on a document an
    /// existing key is replaced in place, as `Document::insert` does).
    pub fn append(&mut self, key: &'static CStr, value: Bson) {
        match self {
            Reply::Document(d) => {
                d.insert(key.as_str(), value);
            }
            Reply::Raw(r) => match bson::RawBson::try_from(value) {
                Ok(v) => r.append(key, v),
                Err(e) => {
                    tracing::warn!(error = %e, key = key.as_str(), "cannot append to a raw reply")
                }
            },
        }
    }

    /// Appends `$clusterTime` (unsigned, as a router without keys sends it) and
    /// `operationTime`, both at `t`. On an encoded reply the fields are written straight after
    /// its last byte.
    pub fn append_cluster_time(&mut self, t: Timestamp) {
        match self {
            Reply::Document(d) => {
                d.insert("$clusterTime", cluster_time_document(t));
                d.insert("operationTime", t);
            }
            Reply::Raw(r) => {
                // Both elements written after the body's last element, as `append` writes
                // them, and the length set once.
                let mut bytes = std::mem::take(r).into_bytes();
                bytes.pop();
                bytes.reserve(CLUSTER_TIME_LEN + 32);
                bytes.extend_from_slice(b"\x03$clusterTime\0");
                bytes.extend_from_slice(&cluster_time_bytes(t));
                bytes.extend_from_slice(b"\x11operationTime\0");
                bytes.extend_from_slice(&t.increment.to_le_bytes());
                bytes.extend_from_slice(&t.time.to_le_bytes());
                bytes.push(0);
                let len = bytes.len() as i32;
                bytes[..4].copy_from_slice(&len.to_le_bytes());
                match RawDocumentBuf::from_bytes(bytes) {
                    Ok(done) => *r = done,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot append $clusterTime to a raw reply")
                    }
                }
            }
        }
    }

    /// The encoded bytes.
    pub fn into_bytes(self) -> Result<Vec<u8>, bson::error::Error> {
        match self {
            Reply::Document(d) => d.to_vec(),
            Reply::Raw(r) => Ok(r.into_bytes()),
        }
    }

    /// As a document (decoding an encoded reply): for the few readers that need one.
    pub fn into_document(self) -> Document {
        match self {
            Reply::Document(d) => d,
            Reply::Raw(r) => Document::try_from(r.as_ref()).unwrap_or_default(),
        }
    }
}

/// Bytes of an encoded `$clusterTime` value (see [`cluster_time_bytes`]).
const CLUSTER_TIME_LEN: usize = 88;

/// [`cluster_time_document`] encoded, written with its fixed layout (every reply carries one,
/// so no document is built for it):
/// `{clusterTime: Timestamp, signature: {hash: BinData(0, 20 zero bytes), keyId: Int64(0)}}`.
pub fn cluster_time_bytes(t: Timestamp) -> [u8; CLUSTER_TIME_LEN] {
    let mut b = [0u8; CLUSTER_TIME_LEN];
    let mut at = 0;
    let mut put = |bytes: &[u8]| {
        b[at..at + bytes.len()].copy_from_slice(bytes);
        at += bytes.len();
    };
    put(&(CLUSTER_TIME_LEN as i32).to_le_bytes());
    put(b"\x11clusterTime\0");
    put(&t.increment.to_le_bytes());
    put(&t.time.to_le_bytes());
    put(b"\x03signature\0");
    // The signature: 4 + (1 + 5 + 4 + 1 + 20) + (1 + 6 + 8) + 1 bytes.
    put(&51i32.to_le_bytes());
    put(b"\x05hash\0");
    put(&(ZERO_SIGNATURE.len() as i32).to_le_bytes());
    put(&[0]);
    put(&ZERO_SIGNATURE);
    put(b"\x12keyId\0");
    put(&0i64.to_le_bytes());
    put(&[0]);
    put(&[0]);
    debug_assert_eq!(at, CLUSTER_TIME_LEN);
    b
}

/// `{clusterTime: t, signature: {hash: BinData(0, 20 zero bytes), keyId: 0}}`.
pub fn cluster_time_document(t: Timestamp) -> Document {
    bson::doc! {
        "clusterTime": t,
        "signature": {
            "hash": Bson::Binary(bson::Binary {
                subtype: bson::spec::BinarySubtype::Generic,
                bytes: ZERO_SIGNATURE.to_vec(),
            }),
            "keyId": 0i64,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_and_document_replies_encode_alike() {
        let t = Timestamp {
            time: 7,
            increment: 3,
        };
        let body = bson::doc! {"cursor": {"firstBatch": [{"_id": 1}], "id": 0i64, "ns": "a.b"}};
        let mut d = Reply::Document(body.clone());
        let mut r = Reply::Raw(RawDocumentBuf::try_from(&body).expect("encodes"));
        let mut e = Reply::Document(body.clone());
        e.encode();
        assert!(matches!(e, Reply::Raw(_)));
        for reply in [&mut d, &mut r, &mut e] {
            assert!(!reply.contains_key("ok"));
            reply.append(bson::raw::cstr!("ok"), Bson::Double(1.0));
            reply.append_cluster_time(t);
            assert_eq!(reply.ok(), Some(1.0));
            assert!(reply.contains_key("$clusterTime"));
        }
        assert_eq!(d.clone().into_document(), r.clone().into_document());
        assert_eq!(e.into_document(), r.clone().into_document());
        assert_eq!(
            d.into_bytes().expect("encodes"),
            r.into_bytes().expect("encodes")
        );
    }

    #[test]
    fn the_fixed_cluster_time_layout_is_the_document_encoded() {
        for t in [
            Timestamp {
                time: 0,
                increment: 0,
            },
            Timestamp {
                time: 1_764_000_000,
                increment: 0xfedc_ba98,
            },
            Timestamp {
                time: u32::MAX,
                increment: 1,
            },
        ] {
            let bytes = cluster_time_bytes(t);
            assert_eq!(
                bytes.to_vec(),
                cluster_time_document(t).to_vec().expect("encodes")
            );
        }
    }
}
