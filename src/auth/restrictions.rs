//! `authenticationRestrictions`: the addresses a user may authenticate from and to.
//!
//! A user document or a role document may hold an array of restriction documents, each with
//! `clientSource` (the client's address) and/or `serverAddress` (the address the server
//! accepted the connection on), each a list of IP addresses and CIDR ranges. As on mongod:
//! - one array is met when at least one of its documents is met, and a document is met when
//!   every field it has is met (the address lies in one of the field's entries); an empty
//!   array restricts nothing;
//! - a user authenticates only if its own array and the array of every role it holds, directly
//!   or by inheritance, are met;
//! - an entry that is not an address or a range matches nothing, so a restriction that cannot
//!   be read keeps the user out rather than letting anyone in.

use std::net::IpAddr;

use bson::Bson;

/// The two addresses of a client connection that restrictions are checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionAddresses {
    /// The client's address.
    pub client: IpAddr,
    /// The address the server accepted the connection on.
    pub server: IpAddr,
}

/// Whether `restrictions` (one user's or one role's `authenticationRestrictions`) are met.
pub fn met(restrictions: &[Bson], at: ConnectionAddresses) -> bool {
    restrictions.is_empty()
        || restrictions.iter().any(|r| {
            let Some(r) = r.as_document() else {
                return false;
            };
            r.iter().all(|(field, entries)| {
                let address = match field.as_str() {
                    "clientSource" => at.client,
                    "serverAddress" => at.server,
                    _ => return false,
                };
                match entries {
                    Bson::Array(entries) => entries
                        .iter()
                        .any(|e| e.as_str().is_some_and(|e| contains(e, address))),
                    _ => false,
                }
            })
        })
}

/// Whether the address or CIDR range `entry` (`10.0.0.1`, `10.0.0.0/8`, `::1`, `fe80::/10`)
/// contains `address`. IPv4 addresses carried in IPv6 (`::ffff:a.b.c.d`) compare as IPv4.
fn contains(entry: &str, address: IpAddr) -> bool {
    let (base, len) = match entry.split_once('/') {
        Some((base, len)) => match len.parse::<u32>() {
            Ok(len) => (base, Some(len)),
            Err(_) => return false,
        },
        None => (entry, None),
    };
    let Ok(base) = base.trim().parse::<IpAddr>() else {
        return false;
    };
    let address = canonical(address);
    match (canonical(base), address) {
        (IpAddr::V4(b), IpAddr::V4(a)) => {
            prefix_matches(u32::from(b).into(), u32::from(a).into(), 32, len)
        }
        (IpAddr::V6(b), IpAddr::V6(a)) => prefix_matches(u128::from(b), u128::from(a), 128, len),
        _ => false,
    }
}

fn canonical(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// Whether the first `len` of `bits` bits of `base` and `address` agree (`None`: all bits).
fn prefix_matches(base: u128, address: u128, bits: u32, len: Option<u32>) -> bool {
    let len = len.unwrap_or(bits);
    if len > bits {
        return false;
    }
    if len == 0 {
        return true;
    }
    let shift = bits - len;
    (base >> shift) == (address >> shift)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{bson, doc};

    fn at(client: &str, server: &str) -> ConnectionAddresses {
        ConnectionAddresses {
            client: client.parse().unwrap(),
            server: server.parse().unwrap(),
        }
    }

    fn array(b: Bson) -> Vec<Bson> {
        match b {
            Bson::Array(a) => a,
            _ => unreachable!(),
        }
    }

    #[test]
    fn addresses_and_ranges() {
        let a = "10.1.2.3".parse().unwrap();
        assert!(contains("10.1.2.3", a));
        assert!(contains("10.0.0.0/8", a));
        assert!(contains("10.1.2.0/24", a));
        assert!(!contains("10.1.3.0/24", a));
        assert!(contains("0.0.0.0/0", a));
        assert!(!contains("10.1.2.4", a));
        assert!(!contains("10.0.0.0/33", a));
        assert!(!contains("not an address", a));
        assert!(!contains("10.0.0.0/x", a));
        let six = "fe80::1".parse().unwrap();
        assert!(contains("fe80::/10", six));
        assert!(!contains("10.0.0.0/8", six));
        assert!(contains("::1", "::1".parse().unwrap()));
        assert!(contains("127.0.0.1", "::ffff:127.0.0.1".parse().unwrap()));
    }

    #[test]
    fn one_document_met_is_enough_and_every_field_of_it_must_be() {
        let r = array(bson!([
            {"clientSource": ["192.168.0.0/16"], "serverAddress": ["127.0.0.1"]},
            {"clientSource": ["127.0.0.2"]},
        ]));
        assert!(met(&r, at("192.168.1.1", "127.0.0.1")));
        assert!(!met(&r, at("192.168.1.1", "127.0.0.3")));
        assert!(met(&r, at("127.0.0.2", "127.0.0.9")));
        assert!(!met(&r, at("127.0.0.1", "127.0.0.1")));
        assert!(met(&[], at("127.0.0.1", "127.0.0.1")));
        // Unreadable restrictions keep everyone out.
        assert!(!met(&[Bson::Int32(1)], at("127.0.0.1", "127.0.0.1")));
        assert!(!met(
            &[Bson::Document(doc! {"clientSource": "127.0.0.1"})],
            at("127.0.0.1", "127.0.0.1")
        ));
        assert!(!met(
            &[Bson::Document(doc! {"elsewhere": ["127.0.0.1"]})],
            at("127.0.0.1", "127.0.0.1")
        ));
    }
}
