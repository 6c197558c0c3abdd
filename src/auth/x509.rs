//! The subject name of an X.509 certificate, as mongod names MONGODB-X509 users, and the
//! cluster-membership rule for certificates of other cluster members.
//!
//! mongod prints a subject in its own RFC 2253 form: the relative distinguished names in
//! reverse certificate order (and the attributes of a multi-valued RDN reversed too), joined
//! by `,` with no space; attributes of one RDN joined by `+`; each `<short name>=<value>` with
//! OpenSSL's short names (`CN`, `OU`, `O`, `L`, `ST`, `C`, `DC`, `emailAddress`, …, an unknown
//! type as its dotted OID); values converted to UTF-8 and escaped as RFC 2253 §2.4 says
//! (`\ ` and `\#` at the start, `\ ` at the end, a backslash before `, + " \ < > ;`, and `\XX`
//! for every byte of 0x80 and above). A certificate issued for `CN=client, OU=Drivers,
//! O=MongoDB, L=Reykjavik, ST=Reykjavik, C=IS` is the user
//! `C=IS,ST=Reykjavik,L=Reykjavik,O=MongoDB,OU=Drivers,CN=client`.
//!
//! No allowed crate formats a subject, so the DER `Name` is walked here: a bounded reader of
//! definite-length tag-length-value items that refuses anything it does not expect, so any
//! byte string yields a name or an error, never a panic (a property test holds it).

use std::fmt;

/// An X.509 name that could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct X509Error(pub String);

impl fmt::Display for X509Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for X509Error {}

fn bad(what: &str) -> X509Error {
    X509Error(format!("invalid certificate subject: {what}"))
}

/// One attribute of a name: its type (dotted OID), the DER string type it was encoded with,
/// and its value converted to UTF-8.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Attribute {
    /// The attribute type, dotted (`2.5.4.3` for CN).
    pub oid: String,
    /// The DER tag of the value (UTF8String 0x0C, PrintableString 0x13, …).
    pub tag: u8,
    /// The value, as UTF-8.
    pub value: String,
}

/// A distinguished name, in mongod's order (reversed from the certificate's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct X509Name {
    rdns: Vec<Vec<Attribute>>,
}

/// OID of `DC` (domainComponent).
const OID_DC: &str = "0.9.2342.19200300.100.1.25";
/// OID of `O`.
const OID_O: &str = "2.5.4.10";
/// OID of `OU`.
const OID_OU: &str = "2.5.4.11";

/// OpenSSL's short name of an attribute type, or the dotted OID when it has none.
pub fn short_name(oid: &str) -> &str {
    match oid {
        "2.5.4.3" => "CN",
        "2.5.4.4" => "SN",
        "2.5.4.5" => "serialNumber",
        "2.5.4.6" => "C",
        "2.5.4.7" => "L",
        "2.5.4.8" => "ST",
        "2.5.4.9" => "street",
        OID_O => "O",
        OID_OU => "OU",
        "2.5.4.12" => "title",
        "2.5.4.13" => "description",
        "2.5.4.15" => "businessCategory",
        "2.5.4.17" => "postalCode",
        "2.5.4.41" => "name",
        "2.5.4.42" => "GN",
        "2.5.4.43" => "initials",
        "2.5.4.44" => "generationQualifier",
        "2.5.4.45" => "x500UniqueIdentifier",
        "2.5.4.46" => "dnQualifier",
        "2.5.4.65" => "pseudonym",
        "2.5.4.72" => "role",
        "2.5.4.97" => "organizationIdentifier",
        "0.9.2342.19200300.100.1.1" => "UID",
        OID_DC => "DC",
        "1.2.840.113549.1.9.1" => "emailAddress",
        "1.2.840.113549.1.9.2" => "unstructuredName",
        "1.3.6.1.4.1.311.60.2.1.1" => "jurisdictionL",
        "1.3.6.1.4.1.311.60.2.1.2" => "jurisdictionST",
        "1.3.6.1.4.1.311.60.2.1.3" => "jurisdictionC",
        other => other,
    }
}

impl X509Name {
    /// Reads the subject of a DER certificate.
    pub fn from_certificate(cert_der: &[u8]) -> Result<X509Name, X509Error> {
        let der = rustls_pki_types::CertificateDer::from(cert_der);
        let cert = webpki::EndEntityCert::try_from(&der)
            .map_err(|e| X509Error(format!("invalid certificate: {e:?}")))?;
        X509Name::from_der_contents(cert.subject())
    }

    /// Reads a DER `Name` given without its outer SEQUENCE header (what `rustls-webpki`'s
    /// `subject()` returns): `SET OF SEQUENCE { OID, value }`, repeated.
    pub fn from_der_contents(mut der: &[u8]) -> Result<X509Name, X509Error> {
        let mut rdns = Vec::new();
        while !der.is_empty() {
            let (tag, mut set, rest) = read_tlv(der)?;
            der = rest;
            if tag != 0x31 {
                return Err(bad("a relative distinguished name is not a SET"));
            }
            let mut rdn = Vec::new();
            while !set.is_empty() {
                let (tag, mut seq, rest) = read_tlv(set)?;
                set = rest;
                if tag != 0x30 {
                    return Err(bad("an attribute is not a SEQUENCE"));
                }
                let (tag, oid, rest) = read_tlv(seq)?;
                seq = rest;
                if tag != 0x06 {
                    return Err(bad("an attribute type is not an OID"));
                }
                let oid = decode_oid(oid)?;
                let (tag, value, rest) = read_tlv(seq)?;
                if !rest.is_empty() {
                    return Err(bad("an attribute has extra fields"));
                }
                rdn.push(Attribute {
                    oid,
                    tag,
                    value: decode_string(tag, value)?,
                });
            }
            if rdn.is_empty() {
                return Err(bad("an empty relative distinguished name"));
            }
            rdn.reverse();
            rdns.push(rdn);
        }
        rdns.reverse();
        Ok(X509Name { rdns })
    }

    /// The relative distinguished names, in mongod's (reversed) order.
    pub fn rdns(&self) -> &[Vec<Attribute>] {
        &self.rdns
    }

    /// Whether the name is empty (a certificate without a subject cannot authenticate).
    pub fn is_empty(&self) -> bool {
        self.rdns.is_empty()
    }

    /// Whether `self`, a peer's subject, names a member of the cluster whose own certificate
    /// subject is `member`: mongod's default rule, the `O`, `OU` and `DC` attributes (order
    /// ignored) equal and not all absent.
    pub fn is_cluster_member_of(&self, member: &X509Name) -> bool {
        let client = self.cluster_attributes();
        !client.is_empty() && client == member.cluster_attributes()
    }

    fn cluster_attributes(&self) -> Vec<&Attribute> {
        let mut v: Vec<&Attribute> = self
            .rdns
            .iter()
            .flatten()
            .filter(|a| a.oid == OID_DC || a.oid == OID_O || a.oid == OID_OU)
            .collect();
        v.sort();
        v
    }
}

impl fmt::Display for X509Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, rdn) in self.rdns.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            for (j, a) in rdn.iter().enumerate() {
                if j > 0 {
                    f.write_str("+")?;
                }
                write!(f, "{}={}", short_name(&a.oid), escape_rfc2253(&a.value))?;
            }
        }
        Ok(())
    }
}

/// mongod's RFC 2253 escaping of one attribute value.
pub fn escape_rfc2253(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = String::with_capacity(bytes.len() + 4);
    let mut start = 0;
    match bytes.first() {
        Some(b' ') => {
            out.push_str("\\ ");
            start = 1;
        }
        Some(b'#') => {
            out.push_str("\\#");
            start = 1;
        }
        _ => {}
    }
    for &b in &bytes[start..] {
        if b >= 0x80 {
            out.push_str(&format!("\\{b:02X}"));
        } else {
            if matches!(b, b',' | b'+' | b'"' | b'\\' | b'<' | b'>' | b';') {
                out.push('\\');
            }
            out.push(b as char);
        }
    }
    if out.len() > 2 && out.ends_with(' ') {
        out.pop();
        out.push_str("\\ ");
    }
    out
}

/// One definite-length DER item: (tag, contents, what follows). Single-byte tags, lengths of
/// up to four bytes, always within `data`.
fn read_tlv(data: &[u8]) -> Result<(u8, &[u8], &[u8]), X509Error> {
    let (&tag, rest) = data.split_first().ok_or_else(|| bad("truncated"))?;
    if tag & 0x1f == 0x1f {
        return Err(bad("multi-byte tag"));
    }
    let (&first, rest) = rest.split_first().ok_or_else(|| bad("truncated length"))?;
    let (len, rest) = if first < 0x80 {
        (first as usize, rest)
    } else {
        let n = (first & 0x7f) as usize;
        if n == 0 || n > 4 {
            return Err(bad("unsupported length encoding"));
        }
        if rest.len() < n {
            return Err(bad("truncated length"));
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | *b as usize);
        (len, &rest[n..])
    };
    if len > rest.len() {
        return Err(bad("length past the end"));
    }
    Ok((tag, &rest[..len], &rest[len..]))
}

/// A DER OBJECT IDENTIFIER's contents as dotted decimal.
fn decode_oid(bytes: &[u8]) -> Result<String, X509Error> {
    if bytes.is_empty() {
        return Err(bad("empty OID"));
    }
    let mut arcs: Vec<u64> = Vec::new();
    let mut value: u64 = 0;
    let mut in_arc = false;
    for &b in bytes {
        if !in_arc && b == 0x80 {
            return Err(bad("non-minimal OID"));
        }
        if value > (u64::MAX >> 7) {
            return Err(bad("OID arc too large"));
        }
        value = (value << 7) | u64::from(b & 0x7f);
        in_arc = b & 0x80 != 0;
        if !in_arc {
            arcs.push(value);
            value = 0;
        }
    }
    if in_arc {
        return Err(bad("truncated OID"));
    }
    let first = arcs[0];
    let (a, b) = match first {
        0..=39 => (0, first),
        40..=79 => (1, first - 40),
        _ => (2, first - 80),
    };
    let mut s = format!("{a}.{b}");
    for arc in &arcs[1..] {
        s.push('.');
        s.push_str(&arc.to_string());
    }
    Ok(s)
}

/// A directory string converted to UTF-8 as OpenSSL's `ASN1_STRING_to_UTF8` converts it.
fn decode_string(tag: u8, bytes: &[u8]) -> Result<String, X509Error> {
    match tag {
        // UTF8String.
        0x0C => std::str::from_utf8(bytes)
            .map(|s| s.to_string())
            .map_err(|_| bad("a UTF8String is not UTF-8")),
        // NumericString, PrintableString, TeletexString, IA5String, VisibleString: one byte a
        // character (Latin-1 for the 8-bit ones).
        0x12 | 0x13 | 0x14 | 0x16 | 0x1A => Ok(bytes.iter().map(|&b| b as char).collect()),
        // BMPString: UTF-16BE.
        0x1E => {
            if bytes.len() % 2 != 0 {
                return Err(bad("a BMPString of odd length"));
            }
            let units = bytes
                .chunks_exact(2)
                .map(|c| u16::from_be_bytes([c[0], c[1]]));
            char::decode_utf16(units)
                .collect::<Result<String, _>>()
                .map_err(|_| bad("a BMPString is not UTF-16"))
        }
        // UniversalString: UTF-32BE.
        0x1C => {
            if bytes.len() % 4 != 0 {
                return Err(bad("a UniversalString of bad length"));
            }
            bytes
                .chunks_exact(4)
                .map(|c| {
                    char::from_u32(u32::from_be_bytes([c[0], c[1], c[2], c[3]]))
                        .ok_or_else(|| bad("a UniversalString is not UTF-32"))
                })
                .collect()
        }
        _ => Err(bad("an attribute value is not a string")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// DER for one attribute `SET { SEQUENCE { OID, value } }`.
    fn der_item(tag: u8, content: &[u8]) -> Vec<u8> {
        let mut v = vec![tag];
        if content.len() < 0x80 {
            v.push(content.len() as u8);
        } else {
            v.push(0x82);
            v.extend_from_slice(&(content.len() as u16).to_be_bytes());
        }
        v.extend_from_slice(content);
        v
    }

    fn rdn(attrs: &[(&[u8], u8, &[u8])]) -> Vec<u8> {
        let mut set = Vec::new();
        for (oid, tag, value) in attrs {
            let mut seq = der_item(0x06, oid);
            seq.extend(der_item(*tag, value));
            set.extend(der_item(0x30, &seq));
        }
        der_item(0x31, &set)
    }

    const CN: &[u8] = &[0x55, 0x04, 0x03];
    const OU: &[u8] = &[0x55, 0x04, 0x0b];
    const O: &[u8] = &[0x55, 0x04, 0x0a];
    const L: &[u8] = &[0x55, 0x04, 0x07];
    const ST: &[u8] = &[0x55, 0x04, 0x08];
    const C: &[u8] = &[0x55, 0x04, 0x06];
    const DC: &[u8] = &[0x09, 0x92, 0x26, 0x89, 0x93, 0xf2, 0x2c, 0x64, 0x01, 0x19];

    fn spec_subject() -> Vec<u8> {
        let mut der = Vec::new();
        for (oid, value) in [
            (CN, "client"),
            (OU, "Drivers"),
            (O, "MongoDB"),
            (L, "Reykjavik"),
            (ST, "Reykjavik"),
            (C, "IS"),
        ] {
            der.extend(rdn(&[(oid, 0x0C, value.as_bytes())]));
        }
        der
    }

    #[test]
    fn the_spec_example_reads_in_reverse_order() {
        let name = X509Name::from_der_contents(&spec_subject()).unwrap();
        assert_eq!(
            name.to_string(),
            "C=IS,ST=Reykjavik,L=Reykjavik,O=MongoDB,OU=Drivers,CN=client"
        );
    }

    #[test]
    fn multi_valued_rdns_and_unknown_types() {
        let mut der = rdn(&[(CN, 0x13, b"a"), (OU, 0x13, b"b")]);
        der.extend(rdn(&[
            (&[0x2a, 0x03, 0x04], 0x0C, b"x"),
            (DC, 0x16, b"example"),
        ]));
        let name = X509Name::from_der_contents(&der).unwrap();
        assert_eq!(name.to_string(), "DC=example+1.2.3.4=x,OU=b+CN=a");
    }

    #[test]
    fn values_are_escaped_like_mongod() {
        assert_eq!(
            escape_rfc2253("a,b+c\"d\\e<f>g;h"),
            "a\\,b\\+c\\\"d\\\\e\\<f\\>g\\;h"
        );
        assert_eq!(escape_rfc2253(" lead"), "\\ lead");
        assert_eq!(escape_rfc2253("#hash"), "\\#hash");
        assert_eq!(escape_rfc2253("trail "), "trail\\ ");
        assert_eq!(escape_rfc2253("Þór"), "\\C3\\9E\\C3\\B3r");
        assert_eq!(escape_rfc2253("a=b"), "a=b");
        assert_eq!(escape_rfc2253(""), "");
    }

    #[test]
    fn string_types_convert_to_utf8() {
        let mut der = rdn(&[(CN, 0x1E, &[0x00, 0xDE, 0x00, 0x61])]); // BMPString "Þa"
        der.extend(rdn(&[(O, 0x14, &[0xE9])])); // TeletexString Latin-1 "é"
        der.extend(rdn(&[(OU, 0x1C, &[0, 0, 0, 0x41])])); // UniversalString "A"
        let name = X509Name::from_der_contents(&der).unwrap();
        assert_eq!(name.to_string(), "OU=A,O=\\C3\\A9,CN=\\C3\\9Ea");
    }

    #[test]
    fn malformed_names_are_errors() {
        for der in [
            vec![0x30, 0x00],                    // not a SET
            vec![0x31, 0x05, 0x30],              // length past the end
            vec![0x31, 0x00],                    // empty RDN
            vec![0x31, 0x80, 0x00, 0x00],        // indefinite length
            vec![0x31, 0x85, 1, 1, 1, 1, 1],     // five-byte length
            vec![0x1f, 0x01, 0x00],              // multi-byte tag
            rdn(&[(&[], 0x0C, b"x")]),           // empty OID
            rdn(&[(&[0x80, 0x01], 0x0C, b"x")]), // non-minimal OID
            rdn(&[(&[0x55, 0x84], 0x0C, b"x")]), // truncated OID
            rdn(&[(CN, 0x04, b"x")]),            // OCTET STRING value
            rdn(&[(CN, 0x0C, &[0xff])]),         // bad UTF-8
            rdn(&[(CN, 0x1E, &[0x00])]),         // odd BMPString
        ] {
            assert!(X509Name::from_der_contents(&der).is_err(), "{der:02x?}");
        }
        assert!(X509Name::from_der_contents(&[]).unwrap().is_empty());
    }

    #[test]
    fn cluster_membership_compares_o_ou_dc() {
        let name = |parts: &[(&[u8], &str)]| {
            let der: Vec<u8> = parts
                .iter()
                .flat_map(|(oid, v)| rdn(&[(oid, 0x0C, v.as_bytes())]))
                .collect();
            X509Name::from_der_contents(&der).unwrap()
        };
        let server = name(&[
            (CN, "server"),
            (OU, "Cluster"),
            (O, "Acme"),
            (DC, "example"),
        ]);
        let peer = name(&[
            (DC, "example"),
            (O, "Acme"),
            (OU, "Cluster"),
            (CN, "router"),
        ]);
        assert!(peer.is_cluster_member_of(&server));
        let outsider = name(&[(CN, "client"), (OU, "Apps"), (O, "Acme"), (DC, "example")]);
        assert!(!outsider.is_cluster_member_of(&server));
        let bare = name(&[(CN, "server")]);
        assert!(!bare.is_cluster_member_of(&name(&[(CN, "other")])));
    }

    proptest! {
        #[test]
        fn any_bytes_give_a_name_or_an_error(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = X509Name::from_der_contents(&bytes).map(|n| n.to_string());
        }

        #[test]
        fn mutated_subjects_never_panic(index in 0usize..90, byte in any::<u8>()) {
            let mut der = spec_subject();
            let i = index % der.len();
            der[i] = byte;
            let _ = X509Name::from_der_contents(&der).map(|n| n.to_string());
        }
    }
}
