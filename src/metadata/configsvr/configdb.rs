//! `--configdb`: the config server replica set as mongos names it, `"<setName>/host:port,…"`,
//! and the driver URI it becomes.
//!
//! mongos accepts only the replica-set form (since 3.4): a single host or an empty set name is
//! `BadValue configdb supports only replica set connection string`, a bare host list is
//! `FailedToParse invalid url […]`; a host without a port gets the config server port, 27019.

use std::fmt;

use crate::backend::topology::{HostAddr, SeedList};
use crate::value::error_codes::ErrorCode;

use super::error::MetadataError;

/// The port a config server listens on when `--configdb` names none (mongod `--configsvr`).
pub const CONFIG_SERVER_PORT: u16 = 27019;

/// A parsed `--configdb`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigDb {
    /// The config server replica set's name.
    pub set_name: String,
    /// The seed members, without duplicates, in the order given.
    pub hosts: Vec<HostAddr>,
}

impl ConfigDb {
    /// Parses `"<setName>/host:port,host:port"`.
    pub fn parse(text: &str) -> Result<Self, MetadataError> {
        if text.is_empty() {
            return Err(MetadataError::new(
                ErrorCode::BadValue,
                "error: no args for --configdb",
            ));
        }
        let only_sets = || {
            MetadataError::new(
                ErrorCode::BadValue,
                "configdb supports only replica set connection string",
            )
        };
        if text.starts_with('/') {
            return Err(only_sets());
        }
        let seeds = SeedList::parse(text).map_err(|e| MetadataError::new(e.code, e.message))?;
        let Some(set_name) = seeds.set_name else {
            return Err(only_sets());
        };
        let list = text.split_once('/').map(|(_, l)| l).unwrap_or_default();
        let mut hosts: Vec<HostAddr> = Vec::new();
        for part in list.split(',') {
            let parsed =
                HostAddr::parse(part).map_err(|e| MetadataError::new(e.code, e.message))?;
            let host = if has_port(part) {
                parsed
            } else {
                HostAddr::new(parsed.host(), CONFIG_SERVER_PORT)
            };
            if !hosts.contains(&host) {
                hosts.push(host);
            }
        }
        Ok(ConfigDb { set_name, hosts })
    }

    /// The driver's connection string: every seed and `replicaSet=<setName>`, so the driver
    /// discovers the members and follows the primary.
    pub fn uri(&self) -> String {
        let hosts: Vec<String> = self.hosts.iter().map(|h| h.to_string()).collect();
        format!(
            "mongodb://{}/?replicaSet={}",
            hosts.join(","),
            percent_encode(&self.set_name)
        )
    }
}

impl fmt::Display for ConfigDb {
    /// The canonical `--configdb` form.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/", self.set_name)?;
        for (i, h) in self.hosts.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{h}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for ConfigDb {
    type Err = MetadataError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ConfigDb::parse(s)
    }
}

/// Whether one `host[:port]` item names its port (an IPv6 literal only after its `]`).
fn has_port(part: &str) -> bool {
    match part.rfind(']') {
        Some(close) => part[close..].contains(':'),
        None => part.contains(':'),
    }
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn replica_set_form_with_default_port() {
        let c = ConfigDb::parse("cfg/Host1:30000,host2,[::1],[::1]:30001").unwrap();
        assert_eq!(c.set_name, "cfg");
        assert_eq!(
            c.hosts,
            vec![
                HostAddr::new("host1", 30000),
                HostAddr::new("host2", 27019),
                HostAddr::new("::1", 27019),
                HostAddr::new("::1", 30001),
            ]
        );
        assert_eq!(
            c.uri(),
            "mongodb://host1:30000,host2:27019,[::1]:27019,[::1]:30001/?replicaSet=cfg"
        );
        assert_eq!(
            c.to_string(),
            "cfg/host1:30000,host2:27019,[::1]:27019,[::1]:30001"
        );
        assert_eq!(
            ConfigDb::parse("cfg/h:1,h:1").unwrap().hosts,
            vec![HostAddr::new("h", 1)],
            "duplicates collapse"
        );
        assert_eq!(
            ConfigDb::parse("a b/h:1").map(|c| c.uri()).ok(),
            None,
            "whitespace in a set name is refused by the seed-list parser"
        );
        assert_eq!(
            ConfigDb::parse("c%fg/h:1").unwrap().uri(),
            "mongodb://h:1/?replicaSet=c%25fg"
        );
    }

    #[test]
    fn mongos_refusals() {
        let bad = |t: &str| ConfigDb::parse(t).unwrap_err();
        let e = bad("host1:27019");
        assert_eq!(e.code, ErrorCode::BadValue);
        assert_eq!(
            e.message,
            "configdb supports only replica set connection string"
        );
        assert_eq!(bad("/host1:27019").code, ErrorCode::BadValue);
        assert_eq!(bad("").message, "error: no args for --configdb");
        let e = bad("h1:1,h2:2");
        assert_eq!(e.code, ErrorCode::FailedToParse);
        assert_eq!(e.message, "invalid url [h1:1,h2:2]");
        assert!(bad("h1:1,h2:2,h3:3")
            .message
            .contains("mirrored config server"));
        let e = bad("cfg/h1:99999");
        assert_eq!(e.code, ErrorCode::FailedToParse);
        assert!(e.message.contains("out of range"), "{}", e.message);
        assert_eq!(bad("cfg/").code, ErrorCode::FailedToParse);
        assert_eq!(bad("cfg/h1:1,").code, ErrorCode::FailedToParse);
    }

    proptest! {
        /// Any text parses or fails with a MongoDB code, never a panic; what parses prints back
        /// to a form that parses to the same value.
        #[test]
        fn parse_never_panics_and_round_trips(text in "[a-z0-9/:,\\[\\]. ]{0,40}") {
            if let Ok(c) = ConfigDb::parse(&text) {
                prop_assert_eq!(ConfigDb::parse(&c.to_string()).unwrap(), c.clone());
                prop_assert!(c.uri().starts_with("mongodb://"));
            }
        }

        #[test]
        fn generated_lists_parse(
            name in "[a-zA-Z][a-zA-Z0-9_-]{0,10}",
            hosts in proptest::collection::vec(("[a-z][a-z0-9]{0,8}", proptest::option::of(1u16..)), 1..5),
        ) {
            let list: Vec<String> = hosts
                .iter()
                .map(|(h, p)| match p { Some(p) => format!("{h}:{p}"), None => h.clone() })
                .collect();
            let c = ConfigDb::parse(&format!("{name}/{}", list.join(","))).unwrap();
            prop_assert_eq!(&c.set_name, &name);
            for (h, p) in &hosts {
                let want = HostAddr::new(h, p.unwrap_or(CONFIG_SERVER_PORT));
                prop_assert!(c.hosts.contains(&want));
            }
        }
    }
}
