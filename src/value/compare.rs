//! MongoDB's cross-type comparison order for BSON values, shared by the embedded engine (sort,
//! range queries, unique indexes) and the chunk map (shard key bounds).
//!
//! Values compare first by *canonical type* (MinKey < null < numbers < strings < objects <
//! arrays < binary < ObjectId < bool < date < timestamp < regex < … < MaxKey), then within the
//! type: numbers numerically across int32/int64/double/decimal (NaN below every other number; a
//! decimal compares by exact value, a double meeting it widened to 34 digits as mongod does),
//! strings byte-wise (the simple collation), documents field by field (type, then name, then
//! value), binary by length, subtype, then bytes.

use std::cmp::Ordering;

use bson::spec::ElementType;
use bson::{Bson, Document};

use super::decimal::Dec;

/// The canonical type number MongoDB orders (and hashes) by.
pub fn canonical_type(v: &Bson) -> i32 {
    canonical_for(v.element_type())
}

/// The canonical type number of a BSON element type.
pub fn canonical_for(t: ElementType) -> i32 {
    use ElementType::*;
    match t {
        MinKey => -1,
        Undefined => 0,
        Null => 5,
        Double | Int32 | Int64 | Decimal128 => 10,
        String | Symbol => 15,
        EmbeddedDocument => 20,
        Array => 25,
        Binary => 30,
        ObjectId => 35,
        Boolean => 40,
        DateTime => 45,
        Timestamp => 47,
        RegularExpression => 50,
        DbPointer => 55,
        JavaScriptCode => 60,
        JavaScriptCodeWithScope => 65,
        MaxKey => 127,
    }
}

/// A number in a form that compares exactly across BSON's numeric types.
#[derive(Debug, Clone, Copy)]
enum Num {
    Int(i64),
    Float(f64),
}

fn as_num(v: &Bson) -> Option<Num> {
    match v {
        Bson::Int32(i) => Some(Num::Int(*i as i64)),
        Bson::Int64(i) => Some(Num::Int(*i)),
        Bson::Double(d) => Some(Num::Float(*d)),
        _ => None,
    }
}

/// Decimal128 as the nearest double (for operators that compute in doubles; comparisons use
/// the exact value).
pub fn decimal_to_f64(d: &bson::Decimal128) -> f64 {
    Dec::from_decimal128(d).to_f64()
}

/// 2^63 as a double: the first double above every int64.
const TWO_POW_63: f64 = 9_223_372_036_854_775_808.0;

/// Compares an integer with a double exactly.
fn cmp_int_float(i: i64, f: f64) -> Ordering {
    if f.is_nan() {
        return Ordering::Greater; // NaN is below every number
    }
    if f >= TWO_POW_63 {
        return Ordering::Less;
    }
    if f < -TWO_POW_63 {
        return Ordering::Greater;
    }
    let t = f.trunc();
    let ti = t as i64;
    match i.cmp(&ti) {
        Ordering::Equal => {
            let frac = f - t;
            if frac > 0.0 {
                Ordering::Less
            } else if frac < 0.0 {
                Ordering::Greater
            } else {
                Ordering::Equal
            }
        }
        o => o,
    }
}

fn cmp_float(a: f64, b: f64) -> Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Less,
        (false, true) => Ordering::Greater,
        _ => a.partial_cmp(&b).unwrap_or(Ordering::Equal),
    }
}

fn cmp_num(a: Num, b: Num) -> Ordering {
    match (a, b) {
        (Num::Int(x), Num::Int(y)) => x.cmp(&y),
        (Num::Float(x), Num::Float(y)) => cmp_float(x, y),
        (Num::Int(x), Num::Float(y)) => cmp_int_float(x, y),
        (Num::Float(x), Num::Int(y)) => cmp_int_float(y, x).reverse(),
    }
}

/// Compares two values in MongoDB's order.
pub fn compare(a: &Bson, b: &Bson) -> Ordering {
    let (ta, tb) = (canonical_type(a), canonical_type(b));
    if ta != tb {
        return ta.cmp(&tb);
    }
    match (a, b) {
        (Bson::Decimal128(_), _) | (_, Bson::Decimal128(_)) if ta == 10 => {
            match (Dec::for_comparison(a), Dec::for_comparison(b)) {
                (Some(x), Some(y)) => x.total_cmp(y),
                _ => Ordering::Equal,
            }
        }
        _ if ta == 10 => match (as_num(a), as_num(b)) {
            (Some(x), Some(y)) => cmp_num(x, y),
            _ => Ordering::Equal,
        },
        (Bson::String(x) | Bson::Symbol(x), Bson::String(y) | Bson::Symbol(y)) => {
            x.as_bytes().cmp(y.as_bytes())
        }
        (Bson::Document(x), Bson::Document(y)) => compare_documents(x, y),
        (Bson::Array(x), Bson::Array(y)) => compare_arrays(x, y),
        (Bson::Binary(x), Bson::Binary(y)) => x
            .bytes
            .len()
            .cmp(&y.bytes.len())
            .then_with(|| u8::from(x.subtype).cmp(&u8::from(y.subtype)))
            .then_with(|| x.bytes.cmp(&y.bytes)),
        (Bson::ObjectId(x), Bson::ObjectId(y)) => x.bytes().cmp(&y.bytes()),
        (Bson::Boolean(x), Bson::Boolean(y)) => x.cmp(y),
        (Bson::DateTime(x), Bson::DateTime(y)) => x.timestamp_millis().cmp(&y.timestamp_millis()),
        (Bson::Timestamp(x), Bson::Timestamp(y)) => {
            (x.time, x.increment).cmp(&(y.time, y.increment))
        }
        (Bson::RegularExpression(x), Bson::RegularExpression(y)) => x
            .pattern
            .as_str()
            .cmp(y.pattern.as_str())
            .then_with(|| x.options.as_str().cmp(y.options.as_str())),
        (Bson::JavaScriptCode(x), Bson::JavaScriptCode(y)) => x.cmp(y),
        (Bson::JavaScriptCodeWithScope(x), Bson::JavaScriptCodeWithScope(y)) => x
            .code
            .cmp(&y.code)
            .then_with(|| compare_documents(&x.scope, &y.scope)),
        (Bson::DbPointer(x), Bson::DbPointer(y)) => format!("{x:?}").cmp(&format!("{y:?}")),
        _ => Ordering::Equal,
    }
}

/// Compares documents field by field: canonical type, then field name, then value; a prefix
/// sorts first.
pub fn compare_documents(a: &Document, b: &Document) -> Ordering {
    let mut ia = a.iter();
    let mut ib = b.iter();
    loop {
        match (ia.next(), ib.next()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some((ka, va)), Some((kb, vb))) => {
                let o = canonical_type(va)
                    .cmp(&canonical_type(vb))
                    .then_with(|| ka.as_bytes().cmp(kb.as_bytes()))
                    .then_with(|| compare(va, vb));
                if o != Ordering::Equal {
                    return o;
                }
            }
        }
    }
}

fn compare_arrays(a: &[Bson], b: &[Bson]) -> Ordering {
    for (x, y) in a.iter().zip(b.iter()) {
        let o = canonical_type(x)
            .cmp(&canonical_type(y))
            .then_with(|| compare(x, y));
        if o != Ordering::Equal {
            return o;
        }
    }
    a.len().cmp(&b.len())
}

/// Whether two values are equal in MongoDB's sense (1 == 1.0 == NumberLong(1)).
pub fn values_equal(a: &Bson, b: &Bson) -> bool {
    compare(a, b) == Ordering::Equal
}

/// A value with MongoDB's total order, for ordered maps keyed by BSON values (index keys,
/// chunk bounds).
#[derive(Debug, Clone)]
pub struct OrdBson(pub Bson);

impl PartialEq for OrdBson {
    fn eq(&self, other: &Self) -> bool {
        compare(&self.0, &other.0) == Ordering::Equal
    }
}

impl Eq for OrdBson {}

impl PartialOrd for OrdBson {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for OrdBson {
    fn cmp(&self, other: &Self) -> Ordering {
        compare(&self.0, &other.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{doc, oid::ObjectId, Bson};

    #[test]
    fn cross_type_order() {
        let ordered = vec![
            Bson::MinKey,
            Bson::Null,
            Bson::Double(f64::NAN),
            Bson::Int32(-5),
            Bson::Double(1.5),
            Bson::Int64(2),
            Bson::String("a".into()),
            Bson::String("b".into()),
            Bson::Document(doc! {}),
            Bson::Document(doc! {"a": 1}),
            Bson::Array(vec![]),
            Bson::Array(vec![Bson::Int32(1)]),
            Bson::Binary(bson::Binary {
                subtype: bson::spec::BinarySubtype::Generic,
                bytes: vec![1],
            }),
            Bson::ObjectId(ObjectId::from_bytes([0; 12])),
            Bson::Boolean(false),
            Bson::Boolean(true),
            Bson::DateTime(bson::DateTime::from_millis(-1)),
            Bson::DateTime(bson::DateTime::from_millis(5)),
            Bson::Timestamp(bson::Timestamp {
                time: 1,
                increment: 0,
            }),
            Bson::RegularExpression(bson::Regex {
                pattern: "a".try_into().unwrap(),
                options: "".try_into().unwrap(),
            }),
            Bson::MaxKey,
        ];
        for (i, a) in ordered.iter().enumerate() {
            for (j, b) in ordered.iter().enumerate() {
                assert_eq!(compare(a, b), i.cmp(&j), "{a:?} vs {b:?}");
            }
        }
    }

    #[test]
    fn numbers_compare_across_types_exactly() {
        assert!(values_equal(&Bson::Int32(1), &Bson::Double(1.0)));
        assert!(values_equal(&Bson::Int64(3), &Bson::Int32(3)));
        assert_eq!(
            compare(&Bson::Int64(i64::MAX), &Bson::Double(TWO_POW_63)),
            Ordering::Less
        );
        assert_eq!(
            compare(
                &Bson::Int64(9_007_199_254_740_993),
                &Bson::Double(9_007_199_254_740_992.0)
            ),
            Ordering::Greater
        );
        assert_eq!(
            compare(&Bson::Double(-0.5), &Bson::Int32(0)),
            Ordering::Less
        );
        let dec = |s: &str| Bson::Decimal128(s.parse().unwrap());
        assert_eq!(compare(&dec("2.5"), &Bson::Int32(2)), Ordering::Greater);
        // Decimals compare by exact value, beyond a double's precision.
        assert_eq!(
            compare(&dec("9223372036854775807"), &Bson::Int64(i64::MAX)),
            Ordering::Equal
        );
        assert_eq!(
            compare(&dec("9223372036854775806.5"), &Bson::Int64(i64::MAX)),
            Ordering::Less
        );
        assert_eq!(
            compare(&dec("0.30000000000000000001"), &dec("0.3")),
            Ordering::Greater
        );
        assert!(!values_equal(&dec("1.10"), &Bson::Double(1.1)));
        assert!(values_equal(&dec("2.50"), &Bson::Double(2.5)));
        assert!(values_equal(&dec("NaN"), &Bson::Double(f64::NAN)));
        assert_eq!(compare(&dec("NaN"), &Bson::Int32(i32::MIN)), Ordering::Less);
    }

    #[test]
    fn documents_compare_by_type_then_name_then_value() {
        assert_eq!(
            compare_documents(&doc! {"a": 1}, &doc! {"a": "x"}),
            Ordering::Less
        );
        assert_eq!(
            compare_documents(&doc! {"a": 1}, &doc! {"b": 0}),
            Ordering::Less
        );
        assert_eq!(
            compare_documents(&doc! {"a": 1}, &doc! {"a": 1, "b": 1}),
            Ordering::Less
        );
        assert_eq!(
            compare_documents(&doc! {"a": 2}, &doc! {"a": 1.5}),
            Ordering::Greater
        );
    }
}
