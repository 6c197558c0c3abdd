//! `hash64`: MongoDB's hashed-index hash, bit for bit (`BSONElementHasher::hash64`, seed 0).
//!
//! The MD5 input is the seed (int32 LE), then for the value: its canonical type (int32 LE, see
//! [`crate::value::compare::canonical_type`]), the field name with its NUL for nested elements only,
//! then the value: numbers as the int64 of `safeNumberLongForHash` (LE); documents and arrays
//! as their elements recursively (with names) and a 4-zero-byte terminator; CodeWScope as the
//! code string with its NUL (no length), the scope's elements and the terminator; anything
//! else as its raw BSON value bytes. The result is the digest's first 8 bytes read as a
//! little-endian int64.

use bson::{Bson, RawBsonRef, RawDocument};
use md5::{Digest, Md5};

use crate::value::compare::canonical_for;

/// The hash of a value, as stored in a hashed index and used for hashed shard keys.
pub fn hash64(value: &Bson) -> i64 {
    // Scalars are read in place; anything else is encoded as the only element of a document
    // and hashed raw.
    let scalar = match value {
        Bson::Int32(i) => Some(RawBsonRef::Int32(*i)),
        Bson::Int64(i) => Some(RawBsonRef::Int64(*i)),
        Bson::Double(d) => Some(RawBsonRef::Double(*d)),
        Bson::String(s) => Some(RawBsonRef::String(s)),
        Bson::ObjectId(o) => Some(RawBsonRef::ObjectId(*o)),
        Bson::Boolean(b) => Some(RawBsonRef::Boolean(*b)),
        Bson::DateTime(d) => Some(RawBsonRef::DateTime(*d)),
        Bson::Timestamp(t) => Some(RawBsonRef::Timestamp(*t)),
        Bson::Decimal128(d) => Some(RawBsonRef::Decimal128(*d)),
        Bson::Null => Some(RawBsonRef::Null),
        Bson::MinKey => Some(RawBsonRef::MinKey),
        Bson::MaxKey => Some(RawBsonRef::MaxKey),
        _ => None,
    };
    if let Some(v) = scalar {
        return hash64_raw(v);
    }
    let mut d = bson::Document::new();
    d.insert("", value.clone());
    let bytes = d.to_vec().unwrap_or_default();
    match RawDocument::from_bytes(&bytes)
        .ok()
        .and_then(|raw| raw.iter().next())
        .and_then(|r| r.ok())
    {
        Some((_, v)) => hash64_raw(v),
        // Unreachable for values the bson crate can encode; hash as null rather than panic.
        None => hash64(&Bson::Null),
    }
}

/// The hash of a value read in place from a document.
pub fn hash64_raw(value: RawBsonRef<'_>) -> i64 {
    let mut h = Md5::new();
    h.update(0i32.to_le_bytes());
    hash_value(&mut h, value, None);
    let digest = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_le_bytes(first)
}

fn hash_elements(h: &mut Md5, doc: &RawDocument) {
    for (name, v) in doc.iter().flatten() {
        hash_value(h, v, Some(name.as_str()));
    }
    // The EOO terminator: canonical type 0, no name, no value.
    h.update(0i32.to_le_bytes());
}

fn hash_string(h: &mut Md5, s: &str) {
    h.update(((s.len() + 1) as i32).to_le_bytes());
    h.update(s.as_bytes());
    h.update([0u8]);
}

fn hash_value(h: &mut Md5, v: RawBsonRef<'_>, name: Option<&str>) {
    h.update(canonical_for(v.element_type()).to_le_bytes());
    if let Some(name) = name {
        h.update(name.as_bytes());
        h.update([0u8]);
    }
    use RawBsonRef::*;
    match v {
        Int32(i) => h.update((i as i64).to_le_bytes()),
        Int64(i) => h.update(i.to_le_bytes()),
        Double(d) => h.update(double_for_hash(d).to_le_bytes()),
        Decimal128(d) => h.update(decimal_for_hash(&d).to_le_bytes()),
        Document(d) => hash_elements(h, d),
        Array(a) => match RawDocument::from_bytes(a.as_bytes()) {
            Ok(d) => hash_elements(h, d),
            Err(_) => h.update(0i32.to_le_bytes()),
        },
        JavaScriptCodeWithScope(c) => {
            h.update(c.code.as_bytes());
            h.update([0u8]);
            hash_elements(h, c.scope);
        }
        String(s) | Symbol(s) | JavaScriptCode(s) => hash_string(h, s),
        ObjectId(o) => h.update(o.bytes()),
        Boolean(b) => h.update([b as u8]),
        DateTime(d) => h.update(d.timestamp_millis().to_le_bytes()),
        Timestamp(t) => {
            h.update(t.increment.to_le_bytes());
            h.update(t.time.to_le_bytes());
        }
        Binary(b) => {
            h.update((b.bytes.len() as i32).to_le_bytes());
            h.update([u8::from(b.subtype)]);
            h.update(b.bytes);
        }
        RegularExpression(r) => {
            h.update(r.pattern.as_str().as_bytes());
            h.update([0u8]);
            h.update(r.options.as_str().as_bytes());
            h.update([0u8]);
        }
        DbPointer(p) => {
            // The raw value: the namespace as a length-prefixed string, then the ObjectId. The
            // bson crate keeps both private, so read them back from the encoded value.
            let mut d = bson::RawDocumentBuf::new();
            d.append(cstr_empty(), RawBsonRef::DbPointer(p));
            let bytes = d.as_bytes();
            // 4 (doc length) + 1 (type) + 1 (empty name NUL) .. value .. 1 (doc terminator)
            if bytes.len() > 7 {
                h.update(&bytes[6..bytes.len() - 1]);
            }
        }
        Null | Undefined | MinKey | MaxKey => {}
    }
}

fn cstr_empty() -> &'static bson::raw::CStr {
    // The empty string is a valid C string; fall back to a fixed name if the crate objects.
    <&bson::raw::CStr>::try_from("").unwrap_or_else(|_| fallback_cstr())
}

#[cold]
fn fallback_cstr() -> &'static bson::raw::CStr {
    match <&bson::raw::CStr>::try_from("x") {
        Ok(c) => c,
        Err(_) => fallback_cstr(),
    }
}

/// `safeNumberLongForHash` for doubles: NaN → 0, exactly 2^63 → i64::MIN (the historical
/// overflow MongoDB preserves), beyond → clamped, otherwise truncated toward zero.
pub fn double_for_hash(d: f64) -> i64 {
    const TWO_POW_63: f64 = 9_223_372_036_854_775_808.0;
    if d.is_nan() {
        0
    } else if d == TWO_POW_63 {
        i64::MIN
    } else if d > TWO_POW_63 {
        i64::MAX
    } else if d <= -TWO_POW_63 {
        i64::MIN
    } else {
        d.trunc() as i64
    }
}

/// `safeNumberLongForHash` for Decimal128: NaN → 0, out of range → clamped, otherwise rounded
/// half to even.
pub fn decimal_for_hash(d: &bson::Decimal128) -> i64 {
    let s = d.to_string();
    let (neg, body) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s.strip_prefix('+').unwrap_or(&s)),
    };
    if body.eq_ignore_ascii_case("nan") {
        return 0;
    }
    if body.eq_ignore_ascii_case("infinity") || body.eq_ignore_ascii_case("inf") {
        return if neg { i64::MIN } else { i64::MAX };
    }
    let (mantissa, exp) = match body.find(['E', 'e']) {
        Some(i) => (&body[..i], body[i + 1..].parse::<i64>().unwrap_or(0)),
        None => (body, 0),
    };
    let (int_part, frac_part) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits: String = format!("{int_part}{frac_part}");
    let mut exp = exp - frac_part.len() as i64;
    let mut coeff: i128 = 0;
    for c in digits.chars() {
        let Some(dv) = c.to_digit(10) else { return 0 };
        coeff = coeff.saturating_mul(10).saturating_add(dv as i128);
    }
    let clamp = |v: i128| -> i64 {
        let v = if neg { -v } else { v };
        v.clamp(i64::MIN as i128, i64::MAX as i128) as i64
    };
    if coeff == 0 {
        return 0;
    }
    if exp >= 0 {
        while exp > 0 {
            if coeff > i64::MAX as i128 {
                return clamp(coeff);
            }
            coeff *= 10;
            exp -= 1;
        }
        return clamp(coeff);
    }
    let shift = -exp;
    if shift > 38 {
        return 0;
    }
    let div = 10i128.pow(shift as u32);
    let q = coeff / div;
    let r = coeff % div;
    let twice = r * 2;
    let rounded = if twice > div || (twice == div && q % 2 == 1) {
        q + 1
    } else {
        q
    };
    clamp(rounded)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{doc, Bson};
    use proptest::prelude::*;

    fn dec(s: &str) -> Bson {
        Bson::Decimal128(s.parse().unwrap())
    }

    #[test]
    fn mongodb_vectors() {
        let cases: Vec<(Bson, i64)> = vec![
            (Bson::Int32(42), -944302157085130861),
            (Bson::Double(42.123), -944302157085130861),
            (Bson::Int64(42), -944302157085130861),
            (Bson::Int32(0), 4854801880128277513),
            (Bson::Double(0.456), 4854801880128277513),
            (Bson::Int64(0), 4854801880128277513),
            (Bson::Double(f64::NAN), 4854801880128277513),
            (Bson::Int32(1), 5902408780260971510),
            (Bson::Double(1.987), 5902408780260971510),
            (Bson::Int64(1), 5902408780260971510),
            (Bson::Int32(-1), 1140205862565771219),
            (Bson::Double(-1.789), 1140205862565771219),
            (Bson::Int64(-1), 1140205862565771219),
            (Bson::Int32(i32::MIN), 6165898260261354870),
            (Bson::Double(i32::MIN as f64), 6165898260261354870),
            (Bson::Int64(i32::MIN as i64), 6165898260261354870),
            (Bson::Int32(i32::MAX), 1143184177162245883),
            (Bson::Double(i32::MAX as f64), 1143184177162245883),
            (Bson::Int64(i32::MAX as i64), 1143184177162245883),
            (Bson::Double(f64::MAX), 921523596458303250),
            (Bson::Int64(i64::MAX), 921523596458303250),
            (Bson::Double(-f64::MAX), 4532067210535695462),
            (Bson::Int64(i64::MIN), 4532067210535695462),
            (Bson::MinKey, 7961148599568647290),
            (Bson::MaxKey, 5504842513779440750),
            (Bson::Undefined, 40158834000849533),
            (Bson::Null, 2338878944348059895),
            (Bson::String("abc".into()), 8478485326885698097),
            (Bson::Symbol("abc".into()), 8478485326885698097),
            (Bson::String(String::new()), 2049396243249673340),
            (Bson::Symbol(String::new()), 2049396243249673340),
            (
                Bson::Document(doc! {"a": "abc", "b": 123i64}),
                4771603801758380216,
            ),
            (Bson::Document(doc! {}), 7980500913326740417),
            (
                Bson::Array(vec!["bar".into(), "baz".into(), "qux".into()]),
                -2938911267422831539,
            ),
            (Bson::Array(vec![]), 8849948234993459283),
            (
                Bson::Timestamp(bson::Timestamp {
                    time: 0,
                    increment: 0,
                }),
                -7867208682377458672,
            ),
        ];
        for (value, expected) in cases {
            assert_eq!(hash64(&value), expected, "hash64({value:?})");
        }
    }

    #[test]
    fn numeric_normalisation() {
        assert_eq!(double_for_hash(9_223_372_036_854_775_808.0), i64::MIN);
        assert_eq!(double_for_hash(f64::INFINITY), i64::MAX);
        assert_eq!(double_for_hash(f64::NEG_INFINITY), i64::MIN);
        assert_eq!(
            double_for_hash(9_223_372_036_854_774_784.0),
            9_223_372_036_854_774_784
        );
        assert_eq!(
            hash64(&Bson::Double(f64::INFINITY)),
            hash64(&Bson::Int64(i64::MAX))
        );
        // Decimal rounds half to even, doubles truncate.
        assert_eq!(hash64(&dec("2.5")), hash64(&Bson::Int32(2)));
        assert_eq!(hash64(&dec("3.5")), hash64(&Bson::Int32(4)));
        assert_eq!(hash64(&dec("2.7")), hash64(&Bson::Int32(3)));
        assert_eq!(hash64(&dec("-2.5")), hash64(&Bson::Int32(-2)));
        assert_eq!(hash64(&Bson::Double(2.7)), hash64(&Bson::Int32(2)));
        assert_eq!(hash64(&dec("NaN")), hash64(&Bson::Int32(0)));
        assert_eq!(hash64(&dec("1E+30")), hash64(&Bson::Int64(i64::MAX)));
        assert_eq!(hash64(&dec("-Infinity")), hash64(&Bson::Int64(i64::MIN)));
        assert_eq!(hash64(&dec("42")), -944302157085130861);
        assert_eq!(hash64(&dec("4.2E+1")), -944302157085130861);
    }

    #[test]
    fn relational_facts() {
        let h = hash64;
        assert_eq!(h(&Bson::Int32(3)), h(&Bson::Int64(3)));
        assert_eq!(h(&Bson::Int32(3)), h(&Bson::Double(3.1)));
        assert_ne!(h(&Bson::Int32(3)), h(&Bson::Int32(4)));
        assert_ne!(h(&Bson::Int32(3)), h(&Bson::String("3".into())));
        let re = Bson::RegularExpression(bson::Regex {
            pattern: "3".try_into().unwrap(),
            options: "".try_into().unwrap(),
        });
        assert_ne!(h(&Bson::String("3".into())), h(&re));
        assert_ne!(
            h(&Bson::Document(doc! {"a": {"0": 0, "1": 1}})),
            h(&Bson::Document(doc! {"a": [0, 1]}))
        );
        assert_ne!(
            h(&Bson::Document(doc! {"x": {"a": {}, "b": 1}})),
            h(&Bson::Document(doc! {"x": {"a": {"b": 1}}}))
        );
        assert_eq!(
            h(&Bson::Document(doc! {"x": {"a": 3, "b": [3.1, {"c": 3}]}})),
            h(&Bson::Document(
                doc! {"x": {"a": 3.1, "b": [3, {"c": 3.0}]}}
            ))
        );
        let cws = |scope| {
            Bson::JavaScriptCodeWithScope(bson::JavaScriptCodeWithScope {
                code: "x".into(),
                scope,
            })
        };
        assert_eq!(h(&cws(doc! {"a": 3})), h(&cws(doc! {"a": 3.1})));
        assert_ne!(h(&Bson::MinKey), h(&Bson::MaxKey));
        assert_eq!(
            h(&Bson::Int64(i64::MAX)),
            h(&Bson::Double(i64::MAX as f64 * i64::MAX as f64))
        );
        assert_eq!(
            h(&Bson::Int64(i64::MIN)),
            h(&Bson::Double(-(i64::MAX as f64) * i64::MAX as f64))
        );
    }

    proptest! {
        #[test]
        fn integral_values_hash_alike_across_numeric_types(i in any::<i32>()) {
            prop_assert_eq!(hash64(&Bson::Int32(i)), hash64(&Bson::Int64(i as i64)));
            prop_assert_eq!(hash64(&Bson::Int32(i)), hash64(&Bson::Double(i as f64)));
        }

        #[test]
        fn doubles_truncate_toward_zero(i in -1_000_000i64..1_000_000, frac in 0.0f64..0.999) {
            let d = if i < 0 { i as f64 - frac } else { i as f64 + frac };
            prop_assert_eq!(hash64(&Bson::Double(d)), hash64(&Bson::Int64(i)));
        }

        #[test]
        fn nested_numbers_are_normalised(a in any::<i32>(), b in any::<i32>()) {
            let x = Bson::Document(doc! {"k": [a, {"n": b}]});
            let y = Bson::Document(doc! {"k": [a as i64, {"n": b as f64}]});
            prop_assert_eq!(hash64(&x), hash64(&y));
        }

        #[test]
        fn strings_and_numbers_never_collide_by_type(i in any::<i64>()) {
            prop_assert_ne!(hash64(&Bson::Int64(i)), hash64(&Bson::String(i.to_string())));
        }
    }
}
