//! BSON rendered the way mongod prints it in error messages (`BSONObj::toString`), for
//! `not authorized on <db> to execute command <body>`.
//!
//! The rules are mongod's: `{ a: 1, b: "x" }` with `{}`/`[]` when empty, doubles through
//! `%.16g` with `.0` appended when the text has no `.`, `E` or `N` (so `1.0`, and mongod's own
//! `1e+20.0`), `UUID("…")` for 16-byte subtype-4 binaries, `BinData(<subtype>, <HEX>)`,
//! `Timestamp(<secs>, <inc>)`, `ObjectId('…')`, `new Date(<ms>)`, strings cut at 150 bytes
//! past 159, binaries at 70 bytes past 80, and `...` below 100 levels of nesting.
//!
//! The embedded shard's renderer (`embedded/render.rs`, for duplicate-key messages) lacks the
//! UUID, BinData, Timestamp, empty-array and `%.16g` forms; this one reads raw BSON and is the
//! candidate for the shared value renderer of the layering rebuild.

use bson::raw::{RawArray, RawBsonRef, RawDocument};
use bson::spec::BinarySubtype;
use bson::{Document, RawDocumentBuf};

/// mongod's `BSONObj::maxToStringRecursionDepth`.
const MAX_DEPTH: usize = 100;

/// Fields whose values never appear in a message or a log line, per command (mongod's
/// `snipForLogging`): passwords and SASL payloads.
fn sensitive_field(command: &str, field: &str) -> bool {
    match command {
        "createUser" | "updateUser" => field == "pwd",
        "saslStart" | "saslContinue" => field == "payload",
        _ => false,
    }
}

/// Renders a command body for an `Unauthorized` message or a log line: mongod's form, with
/// passwords and SASL payloads replaced by `"xxx"`.
pub fn render_command(body: &RawDocument) -> String {
    let command = body
        .iter()
        .next()
        .and_then(|r| r.ok())
        .map(|(k, _)| k.as_str().to_string())
        .unwrap_or_default();
    let mut out = String::new();
    render_doc(body, &mut out, 0, &|field| sensitive_field(&command, field));
    out
}

/// Renders a raw document as mongod's `toString` does.
pub fn render_raw(doc: &RawDocument) -> String {
    let mut out = String::new();
    render_doc(doc, &mut out, 0, &|_| false);
    out
}

/// Renders an owned document as mongod's `toString` does.
pub fn render_document(doc: &Document) -> String {
    match RawDocumentBuf::try_from(doc) {
        Ok(raw) => render_raw(&raw),
        Err(_) => "{}".to_string(),
    }
}

fn render_doc(doc: &RawDocument, out: &mut String, depth: usize, snip: &dyn Fn(&str) -> bool) {
    let mut first = true;
    for item in doc.iter() {
        let Ok((key, value)) = item else { break };
        out.push_str(if first { "{ " } else { ", " });
        first = false;
        out.push_str(key.as_str());
        out.push_str(": ");
        if depth < MAX_DEPTH && snip(key.as_str()) {
            out.push_str("\"xxx\"");
        } else {
            render_value(value, out, depth + 1);
        }
    }
    out.push_str(if first { "{}" } else { " }" });
}

fn render_array(arr: &RawArray, out: &mut String, depth: usize) {
    let mut first = true;
    for item in arr.into_iter() {
        let Ok(value) = item else { break };
        out.push_str(if first { "[ " } else { ", " });
        first = false;
        render_value(value, out, depth + 1);
    }
    out.push_str(if first { "[]" } else { " ]" });
}

fn push_truncated(out: &mut String, s: &str, keep: usize) {
    // mongod cuts bytes; cut at the nearest character boundary at or below.
    let mut end = keep.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    out.push_str(&s[..end]);
}

fn hex_upper(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02X}")).collect()
}

fn hex_lower(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Renders one value.
fn render_value(value: RawBsonRef<'_>, out: &mut String, depth: usize) {
    if depth > MAX_DEPTH {
        out.push_str("...");
        return;
    }
    match value {
        RawBsonRef::Document(d) => render_doc(d, out, depth, &|_| false),
        RawBsonRef::Array(a) => render_array(a, out, depth),
        RawBsonRef::Double(d) => out.push_str(&double_nice(d)),
        RawBsonRef::String(s) | RawBsonRef::Symbol(s) => {
            out.push('"');
            // `valuestrsize()` counts the terminating NUL: more than 160 means over 159 bytes.
            if s.len() + 1 > 160 {
                push_truncated(out, s, 150);
                out.push_str("...\"");
            } else {
                out.push_str(s);
                out.push('"');
            }
        }
        RawBsonRef::Int32(i) => out.push_str(&i.to_string()),
        RawBsonRef::Int64(i) => out.push_str(&i.to_string()),
        RawBsonRef::Decimal128(d) => out.push_str(&d.to_string()),
        RawBsonRef::Boolean(b) => out.push_str(if b { "true" } else { "false" }),
        RawBsonRef::Null => out.push_str("null"),
        RawBsonRef::Undefined => out.push_str("undefined"),
        RawBsonRef::MinKey => out.push_str("MinKey"),
        RawBsonRef::MaxKey => out.push_str("MaxKey"),
        RawBsonRef::ObjectId(o) => {
            out.push_str("ObjectId('");
            out.push_str(&o.to_hex());
            out.push_str("')");
        }
        RawBsonRef::DateTime(d) => {
            out.push_str(&format!("new Date({})", d.timestamp_millis()));
        }
        RawBsonRef::Timestamp(t) => {
            out.push_str(&format!("Timestamp({}, {})", t.time, t.increment));
        }
        RawBsonRef::RegularExpression(r) => {
            out.push('/');
            out.push_str(r.pattern.as_str());
            out.push('/');
            out.push_str(r.options.as_str());
        }
        RawBsonRef::JavaScriptCode(code) => {
            if code.len() + 1 > 80 {
                push_truncated(out, code, 70);
                out.push_str("...");
            } else {
                out.push_str(code);
            }
        }
        RawBsonRef::JavaScriptCodeWithScope(c) => {
            out.push_str("CodeWScope( ");
            out.push_str(c.code);
            out.push_str(", ");
            render_doc(c.scope, out, MAX_DEPTH, &|_| false);
            out.push(')');
        }
        RawBsonRef::Binary(b) => {
            let subtype = u8::from(b.subtype);
            if b.subtype == BinarySubtype::Uuid && b.bytes.len() == 16 {
                let x = b.bytes;
                out.push_str(&format!(
                    "UUID(\"{}-{}-{}-{}-{}\")",
                    hex_lower(&x[0..4]),
                    hex_lower(&x[4..6]),
                    hex_lower(&x[6..8]),
                    hex_lower(&x[8..10]),
                    hex_lower(&x[10..16])
                ));
            } else if b.bytes.len() > 80 {
                out.push_str(&format!(
                    "BinData({subtype}, {}...)",
                    hex_upper(&b.bytes[..70])
                ));
            } else {
                out.push_str(&format!("BinData({subtype}, {})", hex_upper(b.bytes)));
            }
        }
        RawBsonRef::DbPointer(_) => out.push_str("DBRef(...)"),
    }
}

/// `StringBuilder::appendDoubleNice`: `%.16g`, then `.0` unless the text holds `.`, `E` or
/// `N`.
pub fn double_nice(x: f64) -> String {
    let mut s = format_g16(x);
    if !s.contains('.') && !s.contains('E') && !s.contains('N') {
        s.push_str(".0");
    }
    s
}

/// C's `printf("%.16g", x)`.
fn format_g16(x: f64) -> String {
    const P: i32 = 16;
    if x.is_nan() {
        return if x.is_sign_negative() { "-nan" } else { "nan" }.to_string();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.to_string();
    }
    if x == 0.0 {
        return if x.is_sign_negative() { "-0" } else { "0" }.to_string();
    }
    let sci = format!("{:.*e}", (P - 1) as usize, x);
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if !(-4..P).contains(&exp) {
        let m = trim_fraction(mantissa);
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{m}e{sign}{:02}", exp.abs())
    } else {
        let fixed = format!("{:.*}", (P - 1 - exp) as usize, x);
        trim_fraction(&fixed).to_string()
    }
}

/// Drops trailing zeros of a fraction, and the point when nothing remains after it.
fn trim_fraction(s: &str) -> &str {
    if !s.contains('.') {
        return s;
    }
    let s = s.trim_end_matches('0');
    s.strip_suffix('.').unwrap_or(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{doc, rawdoc, Binary, Bson, Timestamp};

    #[test]
    fn renders_the_observed_unauthorized_bodies() {
        let body = rawdoc! {"listDatabases": 1.0, "$db": "admin"};
        assert_eq!(
            render_command(&body),
            "{ listDatabases: 1.0, $db: \"admin\" }"
        );
        let uuid = bson::Uuid::parse_str("07e7b998-a2d7-43c3-92ea-70033ad20e7c").unwrap();
        let body = rawdoc! {
            "find": "system.user", "filter": {}, "lsid": {"id": Binary::from(uuid)}, "$db": "admin"
        };
        assert_eq!(
            render_command(&body),
            "{ find: \"system.user\", filter: {}, lsid: { id: UUID(\"07e7b998-a2d7-43c3-92ea-70033ad20e7c\") }, $db: \"admin\" }"
        );
        let body = rawdoc! {
            "serverStatus": 1,
            "$clusterTime": {
                "clusterTime": Timestamp { time: 1716964746, increment: 3402 },
                "signature": {"hash": Binary { subtype: BinarySubtype::Generic, bytes: vec![0; 4] }, "keyId": 0_i64}
            },
            "$db": "db_name"
        };
        assert_eq!(
            render_command(&body),
            "{ serverStatus: 1, $clusterTime: { clusterTime: Timestamp(1716964746, 3402), signature: { hash: BinData(0, 00000000), keyId: 0 } }, $db: \"db_name\" }"
        );
    }

    #[test]
    fn snips_passwords_and_payloads() {
        let body = rawdoc! {"createUser": "alice", "pwd": "secret", "roles": [], "$db": "test"};
        assert_eq!(
            render_command(&body),
            "{ createUser: \"alice\", pwd: \"xxx\", roles: [], $db: \"test\" }"
        );
        let body = rawdoc! {"saslContinue": 1, "payload": Binary { subtype: BinarySubtype::Generic, bytes: b"c=biws".to_vec() }};
        assert_eq!(
            render_command(&body),
            "{ saslContinue: 1, payload: \"xxx\" }"
        );
        // Only at the top level of the command that has them.
        let body = rawdoc! {"insert": "c", "pwd": "visible"};
        assert_eq!(render_command(&body), "{ insert: \"c\", pwd: \"visible\" }");
    }

    #[test]
    fn doubles_print_like_append_double_nice() {
        assert_eq!(double_nice(1.0), "1.0");
        assert_eq!(double_nice(-2.0), "-2.0");
        assert_eq!(double_nice(0.5), "0.5");
        assert_eq!(double_nice(0.1), "0.1");
        assert_eq!(double_nice(1.0 / 3.0), "0.3333333333333333");
        assert_eq!(double_nice(123456789012345.0), "123456789012345.0");
        assert_eq!(double_nice(1e15), "1000000000000000.0");
        assert_eq!(double_nice(1e16), "1e+16.0");
        assert_eq!(double_nice(1.5e20), "1.5e+20");
        assert_eq!(double_nice(1e-5), "1e-05.0");
        assert_eq!(double_nice(0.0001), "0.0001");
        assert_eq!(double_nice(0.0), "0.0");
        assert_eq!(double_nice(f64::INFINITY), "inf.0");
        assert_eq!(double_nice(f64::NAN), "nan.0");
    }

    #[test]
    fn every_type_has_mongods_form() {
        let oid = bson::oid::ObjectId::parse_str("507f1f77bcf86cd799439011").unwrap();
        let d = doc! {
            "i": 1, "l": 2_i64, "s": "x", "t": true, "n": Bson::Null, "o": oid,
            "dt": bson::DateTime::from_millis(5), "a": [1, "b"], "e": [], "ed": {},
            "r": Bson::RegularExpression(bson::Regex {
                pattern: "ab".to_string().try_into().unwrap(),
                options: "i".to_string().try_into().unwrap(),
            }),
            "b": Binary { subtype: BinarySubtype::UserDefined(0x80), bytes: vec![0xab, 0x01] },
            "u": Bson::Undefined, "min": Bson::MinKey, "max": Bson::MaxKey,
            "dec": "1.5".parse::<bson::Decimal128>().unwrap(),
            "js": Bson::JavaScriptCode("f()".into()),
        };
        assert_eq!(
            render_document(&d),
            "{ i: 1, l: 2, s: \"x\", t: true, n: null, o: ObjectId('507f1f77bcf86cd799439011'), \
             dt: new Date(5), a: [ 1, \"b\" ], e: [], ed: {}, r: /ab/i, b: BinData(128, AB01), \
             u: undefined, min: MinKey, max: MaxKey, dec: 1.5, js: f() }"
        );
    }

    #[test]
    fn long_values_are_cut_like_mongod() {
        let long = "x".repeat(200);
        let s = render_document(&doc! {"s": &long});
        assert_eq!(s, format!("{{ s: \"{}...\" }}", "x".repeat(150)));
        let exact = "y".repeat(159);
        assert_eq!(
            render_document(&doc! {"s": &exact}),
            format!("{{ s: \"{exact}\" }}")
        );
        let bin = Binary {
            subtype: BinarySubtype::Generic,
            bytes: vec![0xff; 81],
        };
        assert_eq!(
            render_document(&doc! {"b": bin}),
            format!("{{ b: BinData(0, {}...) }}", "FF".repeat(70))
        );
    }

    #[test]
    fn deep_nesting_is_bounded() {
        let mut d = doc! {"x": 1};
        for _ in 0..150 {
            d = doc! {"d": d};
        }
        let s = render_document(&d);
        assert!(s.contains("..."));
        assert!(s.len() < 1000);
    }
}
