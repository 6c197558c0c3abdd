//! Typed readers of BSON values and fields, one of each: MongoDB's truthiness, "is a number",
//! numbers read as `i64` or `f64`, the type names MongoDB writes into messages, and the random
//! positive ids cursors are given. Every layer reads values through these, so the router and the
//! embedded shard cannot disagree on what `0`, `NumberDecimal("0")` or `null` mean.

use bson::{Bson, Document};

use super::compare::decimal_to_f64;
use super::decimal::{any_decimal, decimal_arithmetic, Dec, Op};

/// MongoDB's truthiness (`BSONElement::trueValue`, and an expression's result in `$cond`,
/// `$and`, `$match: {$expr}`): `false`, `null`, `undefined`, a missing value and every zero
/// (`0`, `0.0`, `NumberLong(0)`, `NumberDecimal("0")`) are false; everything else is true.
pub fn truthy(value: &Bson) -> bool {
    let falsy = match value {
        Bson::Null | Bson::Undefined | Bson::Boolean(false) => true,
        Bson::Decimal128(d) => Dec::from_decimal128(d).is_zero(),
        v => is_number(v) && to_f64(v) == 0.0,
    };
    !falsy
}

/// Whether a value is one of the four numeric types.
pub fn is_number(value: &Bson) -> bool {
    matches!(
        value,
        Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_)
    )
}

/// A numeric value as an `f64` (`0.0` for any other type).
pub fn to_f64(value: &Bson) -> f64 {
    match value {
        Bson::Int32(i) => *i as f64,
        Bson::Int64(i) => *i as f64,
        Bson::Double(d) => *d,
        Bson::Decimal128(d) => decimal_to_f64(d),
        _ => 0.0,
    }
}

/// An integer operand exactly (int32 or int64), `None` for other types.
pub fn as_int(v: &Bson) -> Option<i64> {
    match v {
        Bson::Int32(i) => Some(*i as i64),
        Bson::Int64(i) => Some(*i),
        _ => None,
    }
}

/// A double as a Decimal128 (through its shortest decimal form), for results of operators that
/// compute in doubles but answer a decimal when an input was one (the window functions of
/// `series`); arithmetic itself computes in decimal through [`super::decimal`].
pub fn to_decimal(f: f64) -> Bson {
    let text = if f.is_nan() {
        "NaN".to_string()
    } else if f.is_infinite() {
        if f > 0.0 { "Infinity" } else { "-Infinity" }.to_string()
    } else {
        format!("{f:?}")
    };
    text.parse::<bson::Decimal128>()
        .map(Bson::Decimal128)
        .unwrap_or(Bson::Double(f))
}

/// An integer result as MongoDB types it: int32 when both operands were int32 and it fits,
/// else int64.
pub fn int_result(r: i64, both_int32: bool) -> Bson {
    match i32::try_from(r) {
        Ok(v) if both_int32 => Bson::Int32(v),
        _ => Bson::Int64(r),
    }
}

/// `a + b` (or `a * b`) with MongoDB's types, for `$add`, `$multiply`, `$sum`, `$inc` and
/// `$mul`: integers exactly, an int32 overflow widening to int64 and an int64 overflow to a
/// double; any decimal makes the operation decimal128 arithmetic (see [`super::decimal`]), any
/// double a double.
pub fn arithmetic(a: &Bson, b: &Bson, mul: bool) -> Bson {
    if any_decimal(a, b) {
        let op = if mul { Op::Multiply } else { Op::Add };
        if let Some(Ok(v)) = decimal_arithmetic(a, b, op) {
            return v;
        }
    }
    if let (Some(x), Some(y)) = (as_int(a), as_int(b)) {
        let both_int32 = matches!((a, b), (Bson::Int32(_), Bson::Int32(_)));
        let r = if mul {
            x.checked_mul(y)
        } else {
            x.checked_add(y)
        };
        return match r {
            Some(r) => int_result(r, both_int32),
            None => Bson::Double(if mul {
                x as f64 * y as f64
            } else {
                x as f64 + y as f64
            }),
        };
    }
    Bson::Double(if mul {
        to_f64(a) * to_f64(b)
    } else {
        to_f64(a) + to_f64(b)
    })
}

/// Reads a field that must be a number, as an `i64` (doubles are truncated as mongod does).
pub fn number_field(doc: &Document, key: &str) -> Option<i64> {
    number_value(doc.get(key)?)
}

/// A value that must be a number, as an `i64` (doubles are truncated as mongod does): what
/// [`number_field`] reads, for a value already in hand.
pub fn number_value(value: &Bson) -> Option<i64> {
    match value {
        Bson::Int32(v) => Some(*v as i64),
        Bson::Int64(v) => Some(*v),
        Bson::Double(v) if v.is_finite() => Some(*v as i64),
        _ => None,
    }
}

/// [`number_value`] of a value read in place.
pub fn number_raw(value: bson::RawBsonRef<'_>) -> Option<i64> {
    match value {
        bson::RawBsonRef::Int32(v) => Some(v as i64),
        bson::RawBsonRef::Int64(v) => Some(v),
        bson::RawBsonRef::Double(v) if v.is_finite() => Some(v as i64),
        _ => None,
    }
}

/// The name MongoDB uses for a value's type in messages.
pub fn type_name(v: &Bson) -> &'static str {
    match v {
        Bson::Double(_) => "double",
        Bson::String(_) => "string",
        Bson::Document(_) => "object",
        Bson::Array(_) => "array",
        Bson::Binary(_) => "binData",
        Bson::Undefined => "undefined",
        Bson::ObjectId(_) => "objectId",
        Bson::Boolean(_) => "bool",
        Bson::DateTime(_) => "date",
        Bson::Null => "null",
        Bson::RegularExpression(_) => "regex",
        Bson::DbPointer(_) => "dbPointer",
        Bson::JavaScriptCode(_) => "javascript",
        Bson::Symbol(_) => "symbol",
        Bson::JavaScriptCodeWithScope(_) => "javascriptWithScope",
        Bson::Int32(_) => "int",
        Bson::Timestamp(_) => "timestamp",
        Bson::Int64(_) => "long",
        Bson::Decimal128(_) => "decimal",
        Bson::MinKey => "minKey",
        Bson::MaxKey => "maxKey",
    }
}

/// A fresh random 64-bit value (an ObjectId's process-unique bytes mixed with the clock): not
/// cryptographic, only unpredictable enough that two servers' cursor ids do not repeat.
fn random_u64() -> u64 {
    let oid = bson::oid::ObjectId::new().bytes();
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mut x = u64::from_le_bytes([
        oid[4], oid[5], oid[6], oid[7], oid[8], oid[9], oid[10], oid[11],
    ]) ^ t.rotate_left(17);
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51afd7ed558ccd);
    x ^= x >> 33;
    x
}

/// A new cursor id: positive (drivers treat a negative id as a bug and `0` as "exhausted") and
/// not one of the ids `taken` reports in use.
pub fn new_cursor_id(taken: impl Fn(i64) -> bool) -> i64 {
    loop {
        let id = (random_u64() >> 2) as i64;
        if id > 0 && !taken(id) {
            return id;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::Decimal128;

    #[test]
    fn truthiness_follows_mongod_for_every_zero() {
        let zero_dec: Decimal128 = "0".parse().unwrap();
        let one_dec: Decimal128 = "1".parse().unwrap();
        for falsy in [
            Bson::Boolean(false),
            Bson::Null,
            Bson::Undefined,
            Bson::Int32(0),
            Bson::Int64(0),
            Bson::Double(0.0),
            Bson::Decimal128(zero_dec),
            Bson::Decimal128("-0E+30".parse().unwrap()),
        ] {
            assert!(!truthy(&falsy), "{falsy:?}");
        }
        for t in [
            Bson::Boolean(true),
            Bson::Int32(-1),
            Bson::Double(f64::NAN),
            Bson::Decimal128(one_dec),
            Bson::Decimal128("1E-400".parse().unwrap()),
            Bson::String(String::new()),
            Bson::Document(Document::new()),
        ] {
            assert!(truthy(&t), "{t:?}");
        }
    }

    #[test]
    fn cursor_ids_are_positive_and_avoid_taken_ones() {
        let first = new_cursor_id(|_| false);
        assert!(first > 0);
        let second = new_cursor_id(|id| id == first);
        assert!(second > 0 && second != first);
    }

    #[test]
    fn number_fields_truncate_doubles_and_refuse_other_types() {
        let d = bson::doc! {"a": 2.9, "b": 7i64, "c": "7", "d": f64::INFINITY};
        assert_eq!(number_field(&d, "a"), Some(2));
        assert_eq!(number_field(&d, "b"), Some(7));
        assert_eq!(number_field(&d, "c"), None);
        assert_eq!(number_field(&d, "d"), None);
        assert_eq!(number_field(&d, "missing"), None);
    }
}
