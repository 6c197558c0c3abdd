//! Member addresses and seed lists, in the formats `config.shards.host` and a `[[shards]]`
//! entry use: `"rs0/host1:27018,host2:27018"` for a replica set, `"host:27018"` for a single
//! server, `"[::1]:27018"` for an IPv6 literal. Parsing never panics; malformed input gets
//! `FailedToParse` with the wording mongos uses for the same mistake where it has one.
//!
//! Host names are compared case-insensitively (they are DNS names), so they are stored in
//! lower case; the port defaults to 27017 as in a MongoDB connection string.

use std::fmt;

use crate::value::error_codes::ErrorCode;

use super::error::TopologyError;

/// The port a host without one listens on.
pub const DEFAULT_PORT: u16 = 27017;

/// One member's address: what `hello` reports in `hosts`, `me` and `primary`, and what a
/// pool connects to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostAddr {
    host: String,
    port: u16,
}

impl HostAddr {
    /// An address from its parts (the host is lower-cased; brackets of an IPv6 literal are
    /// not part of it).
    pub fn new(host: &str, port: u16) -> Self {
        HostAddr {
            host: host.to_ascii_lowercase(),
            port,
        }
    }

    /// Parses `host`, `host:port`, `[v6]` or `[v6]:port`.
    pub fn parse(text: &str) -> Result<Self, TopologyError> {
        let fail = |m: String| Err(TopologyError::new(ErrorCode::FailedToParse, m));
        let colon = text.rfind(':');
        let open = text.find('[');
        let close = text.find(']');
        let (host, port_text) = if let Some(open) = open {
            if open != 0 {
                return fail(format!("'[' present, but not first character in {text}"));
            }
            let Some(close) = close else {
                return fail(format!(
                    "ipv6 address is missing closing ']' in hostname in {text}"
                ));
            };
            let host = &text[1..close];
            let rest = &text[close + 1..];
            if rest.is_empty() {
                (host, None)
            } else if let Some(port) = rest.strip_prefix(':') {
                (host, Some(port))
            } else if colon.is_some_and(|c| c < close) {
                return fail(format!("missing colon after ']' before the port in {text}"));
            } else {
                return fail(format!(
                    "Extraneous characters between ']' and pre-port ':' in {text}"
                ));
            }
        } else if close.is_some() {
            return fail(format!("']' present without '[' in {text}"));
        } else if text.find(':') != colon {
            return fail(format!(
                "More than one ':' detected. If this is an ipv6 address, it needs to be \
                 surrounded by '[' and ']'; {text}"
            ));
        } else {
            match colon {
                Some(c) => (&text[..c], Some(&text[c + 1..])),
                None => (text, None),
            }
        };
        if host.is_empty() {
            return fail(format!(
                "Empty host component parsing HostAndPort from \"{}\"",
                text.escape_default()
            ));
        }
        if let Some(bad) = host
            .chars()
            .find(|c| c.is_whitespace() || c.is_control() || matches!(c, '/' | ',' | '[' | ']'))
        {
            return fail(format!(
                "Invalid character {:?} in host component parsing HostAndPort from \"{}\"",
                bad,
                text.escape_default()
            ));
        }
        let port = match port_text {
            None => DEFAULT_PORT,
            Some(p) => {
                if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
                    return fail(format!(
                        "Port number {p:?} is not a decimal number parsing HostAndPort from \
                         \"{}\"",
                        text.escape_default()
                    ));
                }
                match p.parse::<u32>() {
                    Ok(n) if (1..=65535).contains(&n) => n as u16,
                    _ => {
                        return fail(format!(
                            "Port number {p} out of range parsing HostAndPort from \"{}\"",
                            text.escape_default()
                        ))
                    }
                }
            }
        };
        Ok(HostAddr::new(host, port))
    }

    /// The host name or IP literal (without brackets).
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl fmt::Display for HostAddr {
    /// `host:port`, with an IPv6 literal in brackets so the text parses back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

impl std::str::FromStr for HostAddr {
    type Err = TopologyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        HostAddr::parse(s)
    }
}

/// A shard's address as configured: a replica-set name with seed members, or one server
/// reached directly (today's `host:port` shards and a standalone mongod).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeedList {
    /// `setName` the members must report; `None` for a single server.
    pub set_name: Option<String>,
    /// The seeds, without duplicates, in the order given. A single server has exactly one.
    pub hosts: Vec<HostAddr>,
}

impl SeedList {
    /// Parses `"rs0/h1:27018,h2:27018"` or `"h1:27018"`.
    ///
    /// Like mongos's connection-string parser: text before the first `/` is the set name;
    /// without one, exactly one host is allowed (two commas get mongos's message about
    /// mirrored config servers, other lists "invalid url").
    pub fn parse(text: &str) -> Result<Self, TopologyError> {
        let fail = |m: String| Err(TopologyError::new(ErrorCode::FailedToParse, m));
        match text.find('/') {
            Some(0) => fail(format!(
                "replica set name is empty in seed list \"{}\"",
                text.escape_default()
            )),
            Some(slash) => {
                let set_name = &text[..slash];
                if let Some(bad) = set_name
                    .chars()
                    .find(|c| c.is_whitespace() || c.is_control() || *c == ',')
                {
                    return fail(format!(
                        "Invalid character {bad:?} in replica set name of seed list \"{}\"",
                        text.escape_default()
                    ));
                }
                let mut hosts: Vec<HostAddr> = Vec::new();
                for part in text[slash + 1..].split(',') {
                    let h = HostAddr::parse(part)?;
                    if !hosts.contains(&h) {
                        hosts.push(h);
                    }
                }
                Ok(SeedList {
                    set_name: Some(set_name.to_string()),
                    hosts,
                })
            }
            None => match text.matches(',').count() {
                0 => Ok(SeedList {
                    set_name: None,
                    hosts: vec![HostAddr::parse(text)?],
                }),
                2 => fail(
                    "mirrored config server connections are not supported; for config server \
                     replica sets be sure to use the replica set connection string"
                        .to_string(),
                ),
                _ => fail(format!("invalid url [{text}]")),
            },
        }
    }

    /// Whether this names a replica set (members are discovered) rather than one server.
    pub fn is_replica_set(&self) -> bool {
        self.set_name.is_some()
    }
}

impl fmt::Display for SeedList {
    /// The canonical form, as `config.shards.host` holds it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(name) = &self.set_name {
            write!(f, "{name}/")?;
        }
        for (i, h) in self.hosts.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{h}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for SeedList {
    type Err = TopologyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SeedList::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn err(text: &str) -> String {
        let e = SeedList::parse(text).unwrap_err();
        assert_eq!(e.code, ErrorCode::FailedToParse, "{text}");
        e.message
    }

    #[test]
    fn replica_set_seed_list() {
        let s = SeedList::parse("rs0/Host1:27018,host2:27019").unwrap();
        assert_eq!(s.set_name.as_deref(), Some("rs0"));
        assert_eq!(
            s.hosts,
            vec![HostAddr::new("host1", 27018), HostAddr::new("host2", 27019)]
        );
        assert!(s.is_replica_set());
        assert_eq!(s.to_string(), "rs0/host1:27018,host2:27019");
    }

    #[test]
    fn single_host_and_default_port() {
        let s = SeedList::parse("localhost:27018").unwrap();
        assert_eq!(s.set_name, None);
        assert_eq!(s.hosts, vec![HostAddr::new("localhost", 27018)]);
        assert!(!s.is_replica_set());
        let s = SeedList::parse("db.example.com").unwrap();
        assert_eq!(s.hosts[0].port(), DEFAULT_PORT);
        assert_eq!(s.to_string(), "db.example.com:27017");
        let s = SeedList::parse("rs0/a").unwrap();
        assert_eq!(s.hosts, vec![HostAddr::new("a", 27017)]);
    }

    #[test]
    fn ipv6_literals() {
        let s = SeedList::parse("rs0/[::1]:27018,[fe80::1]").unwrap();
        assert_eq!(s.hosts[0], HostAddr::new("::1", 27018));
        assert_eq!(s.hosts[1], HostAddr::new("fe80::1", 27017));
        assert_eq!(s.to_string(), "rs0/[::1]:27018,[fe80::1]:27017");
        let single = SeedList::parse("[::1]:27017").unwrap();
        assert_eq!(single.hosts[0].host(), "::1");
    }

    #[test]
    fn duplicate_seeds_are_kept_once() {
        let s = SeedList::parse("rs0/a:1,A:1,b:2").unwrap();
        assert_eq!(s.hosts.len(), 2);
    }

    #[test]
    fn malformed_hosts_fail_to_parse() {
        assert_eq!(
            err("rs0/"),
            "Empty host component parsing HostAndPort from \"\""
        );
        assert_eq!(
            err("rs0/a:1,,b:2"),
            "Empty host component parsing HostAndPort from \"\""
        );
        assert_eq!(
            err(":27017"),
            "Empty host component parsing HostAndPort from \":27017\""
        );
        assert_eq!(
            err("a:0"),
            "Port number 0 out of range parsing HostAndPort from \"a:0\""
        );
        assert_eq!(
            err("a:65536"),
            "Port number 65536 out of range parsing HostAndPort from \"a:65536\""
        );
        assert_eq!(
            err("a:99999999999999999999"),
            "Port number 99999999999999999999 out of range parsing HostAndPort from \
             \"a:99999999999999999999\""
        );
        assert!(err("a:x1").starts_with("Port number \"x1\" is not a decimal number"));
        assert!(err("a:").starts_with("Port number \"\" is not a decimal number"));
        assert!(err("a:-1").starts_with("Port number \"-1\" is not a decimal number"));
        assert!(err("::1").starts_with("More than one ':' detected."));
        assert_eq!(
            err("x[::1]"),
            "'[' present, but not first character in x[::1]"
        );
        assert_eq!(
            err("[::1"),
            "ipv6 address is missing closing ']' in hostname in [::1"
        );
        assert_eq!(
            err("[::1]x:1"),
            "Extraneous characters between ']' and pre-port ':' in [::1]x:1"
        );
        assert_eq!(err("a]:1"), "']' present without '[' in a]:1");
        assert_eq!(
            err("[]:1"),
            "Empty host component parsing HostAndPort from \"[]:1\""
        );
        assert!(err("rs0/a b:1").starts_with("Invalid character ' ' in host component"));
        assert!(err("rs0/a:1, b:1").starts_with("Invalid character ' ' in host component"));
    }

    #[test]
    fn malformed_seed_lists_fail_to_parse() {
        assert_eq!(
            err("/a:1"),
            "replica set name is empty in seed list \"/a:1\""
        );
        assert_eq!(err("a:1,b:1"), "invalid url [a:1,b:1]");
        assert!(err("a:1,b:1,c:1").starts_with("mirrored config server connections"));
        assert!(err("r s/a:1").starts_with("Invalid character ' ' in replica set name"));
        assert_eq!(
            err(""),
            "Empty host component parsing HostAndPort from \"\""
        );
    }

    proptest! {
        /// Whatever the text, parsing returns (never panics), and what parses prints back to
        /// a text that parses to the same value.
        #[test]
        fn parse_never_panics_and_round_trips(text in "[a-zA-Z0-9:/,\\[\\]. -]{0,40}") {
            if let Ok(s) = SeedList::parse(&text) {
                prop_assert!(!s.hosts.is_empty());
                let again = SeedList::parse(&s.to_string()).unwrap();
                prop_assert_eq!(again, s);
            }
        }

        #[test]
        fn valid_addresses_round_trip(
            host in "[a-z][a-z0-9.-]{0,20}",
            port in 1u16..=65535,
            v6 in proptest::bool::ANY,
        ) {
            let addr = if v6 { HostAddr::new("fe80::1", port) } else { HostAddr::new(&host, port) };
            prop_assert_eq!(HostAddr::parse(&addr.to_string()).unwrap(), addr);
        }
    }
}
