//! A member's `hello` reply, read into the fields server discovery needs: its type (primary,
//! secondary, arbiter, …), the set it belongs to, the members it lists, `electionId` /
//! `setVersion` (to ignore a stale primary), `topologyVersion` (to ignore a stale reply), the
//! date of its last write (for `maxStalenessSeconds`) and its tags (for read-preference tag
//! sets).
//!
//! The reply may come from Sluice's own monitor or from the `mongodb` crate's
//! `ServerHeartbeatSucceededEvent::reply`; both are the raw document. Reading it never fails:
//! a field of the wrong type counts as absent, an address that does not parse is skipped, and a
//! reply with `ok` other than 1 describes an Unknown member (with its `topologyVersion`, which a
//! member shutting down still reports).

use std::collections::BTreeMap;

use bson::oid::ObjectId;
use bson::{Bson, Document};

use super::address::HostAddr;

/// What a member is, from its last `hello` (the server types of server discovery).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ServerType {
    /// Not checked yet, unreachable, or marked so after an error.
    Unknown,
    /// A mongod that is not part of a replica set.
    Standalone,
    /// A mongos (`msg: "isdbgrid"`); never a shard member.
    Mongos,
    /// The writable primary of its set.
    RsPrimary,
    /// A secondary: serves reads that allow it.
    RsSecondary,
    /// An arbiter: votes, holds no data.
    RsArbiter,
    /// A member in another state (starting up, recovering, rolling back) or hidden.
    RsOther,
    /// A member of a set that has no configuration yet (`isreplicaset: true`).
    RsGhost,
}

/// `topologyVersion`: a member's process (changes on restart) and a counter the member
/// increments on every change of its `hello` (step-up, step-down, reconfig, shutdown).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TopologyVersion {
    /// Changes when the member restarts.
    pub process_id: ObjectId,
    /// Grows with every state change of that process.
    pub counter: i64,
}

impl TopologyVersion {
    /// Reads `{processId: ObjectId, counter: long}`; `None` if it is not that shape.
    pub fn from_document(d: &Document) -> Option<Self> {
        let process_id = d.get_object_id("processId").ok()?;
        let counter = match d.get("counter")? {
            Bson::Int64(c) => *c,
            Bson::Int32(c) => i64::from(*c),
            _ => return None,
        };
        Some(TopologyVersion {
            process_id,
            counter,
        })
    }

    /// The document form, as an awaitable `hello` sends it back.
    pub fn to_document(&self) -> Document {
        bson::doc! {"processId": self.process_id, "counter": self.counter}
    }

    /// Whether a reply carrying `self` is older than what `known` describes, and must be
    /// ignored: same process, smaller counter (mongos's and the crate's rule for `hello`
    /// replies; a different process is always newer, since the member restarted).
    pub fn is_older_than(&self, known: &TopologyVersion) -> bool {
        self.process_id == known.process_id && self.counter < known.counter
    }

    /// Whether an error carrying `self` says nothing new about a member described at
    /// `known`: same process and a counter not greater (the server-discovery rule for
    /// application errors: the member's state already reflects what caused the error).
    pub fn is_stale_error_for(&self, known: &TopologyVersion) -> bool {
        self.process_id == known.process_id && self.counter <= known.counter
    }
}

/// The parts of a `hello` reply that server discovery and selection read.
#[derive(Debug, Clone, PartialEq)]
pub struct Hello {
    /// The member's type.
    pub server_type: ServerType,
    /// `errmsg` of a reply with `ok` other than 1.
    pub error: Option<String>,
    /// `setName`.
    pub set_name: Option<String>,
    /// `setVersion` (only trusted from a primary).
    pub set_version: Option<i32>,
    /// `electionId` (only a primary reports one).
    pub election_id: Option<ObjectId>,
    /// `hosts`: electable data-bearing members.
    pub hosts: Vec<HostAddr>,
    /// `passives`: data-bearing members with priority 0.
    pub passives: Vec<HostAddr>,
    /// `arbiters`.
    pub arbiters: Vec<HostAddr>,
    /// `primary`: who this member believes is primary.
    pub primary: Option<HostAddr>,
    /// `me`: the member's own address as the set's configuration names it.
    pub me: Option<HostAddr>,
    /// `topologyVersion`.
    pub topology_version: Option<TopologyVersion>,
    /// `lastWrite.lastWriteDate`, milliseconds since the Unix epoch.
    pub last_write_date_ms: Option<i64>,
    /// `tags` (string values only, as replica-set tags are).
    pub tags: BTreeMap<String, String>,
    /// `maxWireVersion`.
    pub max_wire_version: i32,
}

impl Hello {
    /// Reads a reply. Never fails; see the module header for what happens to odd fields.
    pub fn from_document(d: &Document) -> Hello {
        let ok = match d.get("ok") {
            Some(Bson::Double(v)) => *v == 1.0,
            Some(Bson::Int32(v)) => *v == 1,
            Some(Bson::Int64(v)) => *v == 1,
            Some(Bson::Boolean(v)) => *v,
            _ => false,
        };
        let topology_version = d
            .get_document("topologyVersion")
            .ok()
            .and_then(TopologyVersion::from_document);
        if !ok {
            let message = d.get_str("errmsg").unwrap_or("hello failed").to_string();
            return Hello {
                error: Some(message),
                topology_version,
                ..Hello::unknown()
            };
        }
        let flag = |name: &str| matches!(d.get(name), Some(Bson::Boolean(true)));
        let set_name = d.get_str("setName").ok().map(str::to_string);
        let writable = flag("isWritablePrimary") || flag("ismaster");
        let server_type = if d.get_str("msg").ok() == Some("isdbgrid") {
            ServerType::Mongos
        } else if set_name.is_some() {
            if flag("hidden") {
                ServerType::RsOther
            } else if writable {
                ServerType::RsPrimary
            } else if flag("secondary") {
                ServerType::RsSecondary
            } else if flag("arbiterOnly") {
                ServerType::RsArbiter
            } else {
                ServerType::RsOther
            }
        } else if flag("isreplicaset") {
            ServerType::RsGhost
        } else {
            ServerType::Standalone
        };
        let addresses = |name: &str| -> Vec<HostAddr> {
            let mut out = Vec::new();
            for v in d.get_array(name).map(|a| a.as_slice()).unwrap_or(&[]) {
                if let Some(h) = v.as_str().and_then(|s| HostAddr::parse(s).ok()) {
                    if !out.contains(&h) {
                        out.push(h);
                    }
                }
            }
            out
        };
        let address = |name: &str| d.get_str(name).ok().and_then(|s| HostAddr::parse(s).ok());
        let set_version = match d.get("setVersion") {
            Some(Bson::Int32(v)) => Some(*v),
            Some(Bson::Int64(v)) => i32::try_from(*v).ok(),
            _ => None,
        };
        let last_write_date_ms = d
            .get_document("lastWrite")
            .ok()
            .and_then(|lw| lw.get_datetime("lastWriteDate").ok())
            .map(|t| t.timestamp_millis());
        let tags = d
            .get_document("tags")
            .map(|t| {
                t.iter()
                    .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())))
                    .collect()
            })
            .unwrap_or_default();
        let max_wire_version = match d.get("maxWireVersion") {
            Some(Bson::Int32(v)) => *v,
            Some(Bson::Int64(v)) => i32::try_from(*v).unwrap_or(i32::MAX),
            _ => 0,
        };
        Hello {
            server_type,
            error: None,
            set_name,
            set_version,
            election_id: d.get_object_id("electionId").ok(),
            hosts: addresses("hosts"),
            passives: addresses("passives"),
            arbiters: addresses("arbiters"),
            primary: address("primary"),
            me: address("me"),
            topology_version,
            last_write_date_ms,
            tags,
            max_wire_version,
        }
    }

    /// The description of a member nothing is known about.
    pub fn unknown() -> Hello {
        Hello {
            server_type: ServerType::Unknown,
            error: None,
            set_name: None,
            set_version: None,
            election_id: None,
            hosts: Vec::new(),
            passives: Vec::new(),
            arbiters: Vec::new(),
            primary: None,
            me: None,
            topology_version: None,
            last_write_date_ms: None,
            tags: BTreeMap::new(),
            max_wire_version: 0,
        }
    }

    /// Every member this reply lists (`hosts`, `passives`, `arbiters`).
    pub fn listed_members(&self) -> impl Iterator<Item = &HostAddr> {
        self.hosts
            .iter()
            .chain(self.passives.iter())
            .chain(self.arbiters.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn oid(n: u8) -> ObjectId {
        let mut b = [0u8; 12];
        b[11] = n;
        ObjectId::from_bytes(b)
    }

    #[test]
    fn primary_reply_is_read_in_full() {
        let d = doc! {
            "topologyVersion": {"processId": oid(1), "counter": 6i64},
            "hosts": ["rs0-a:27018", "RS0-B:27018", "not a host"],
            "passives": ["rs0-p:27018"],
            "arbiters": ["rs0-arb:27018"],
            "setName": "rs0", "setVersion": 3,
            "isWritablePrimary": true, "secondary": false,
            "primary": "rs0-a:27018", "me": "rs0-a:27018",
            "electionId": oid(9),
            "lastWrite": {"lastWriteDate": bson::DateTime::from_millis(1_000)},
            "tags": {"dc": "east", "n": 1},
            "maxWireVersion": 25, "ok": 1.0,
        };
        let h = Hello::from_document(&d);
        assert_eq!(h.server_type, ServerType::RsPrimary);
        assert_eq!(h.set_name.as_deref(), Some("rs0"));
        assert_eq!(h.set_version, Some(3));
        assert_eq!(h.election_id, Some(oid(9)));
        // An entry that is not an address is skipped; names are lower-cased.
        assert_eq!(
            h.hosts,
            vec![HostAddr::new("rs0-a", 27018), HostAddr::new("rs0-b", 27018)]
        );
        assert_eq!(h.passives, vec![HostAddr::new("rs0-p", 27018)]);
        assert_eq!(h.arbiters, vec![HostAddr::new("rs0-arb", 27018)]);
        assert_eq!(h.listed_members().count(), 4);
        assert_eq!(h.me, Some(HostAddr::new("rs0-a", 27018)));
        assert_eq!(
            h.topology_version,
            Some(TopologyVersion {
                process_id: oid(1),
                counter: 6
            })
        );
        assert_eq!(h.last_write_date_ms, Some(1_000));
        assert_eq!(h.tags.get("dc").map(String::as_str), Some("east"));
        assert!(!h.tags.contains_key("n"));
        assert_eq!(h.max_wire_version, 25);
    }

    #[test]
    fn server_types() {
        let t = |d: Document| Hello::from_document(&d).server_type;
        assert_eq!(
            t(doc! {"ok": 1, "setName": "rs0", "secondary": true}),
            ServerType::RsSecondary
        );
        assert_eq!(
            t(doc! {"ok": 1, "setName": "rs0", "ismaster": true}),
            ServerType::RsPrimary
        );
        assert_eq!(
            t(doc! {"ok": 1, "setName": "rs0", "arbiterOnly": true}),
            ServerType::RsArbiter
        );
        assert_eq!(
            t(doc! {"ok": 1, "setName": "rs0", "secondary": true, "hidden": true}),
            ServerType::RsOther
        );
        assert_eq!(t(doc! {"ok": 1, "setName": "rs0"}), ServerType::RsOther);
        assert_eq!(t(doc! {"ok": 1, "isreplicaset": true}), ServerType::RsGhost);
        assert_eq!(t(doc! {"ok": 1, "msg": "isdbgrid"}), ServerType::Mongos);
        assert_eq!(
            t(doc! {"ok": 1, "isWritablePrimary": true}),
            ServerType::Standalone
        );
        assert_eq!(t(doc! {"ok": 0, "errmsg": "x"}), ServerType::Unknown);
        assert_eq!(t(doc! {}), ServerType::Unknown);
        // Wrong types count as absent, never as a panic.
        assert_eq!(
            t(doc! {"ok": 1, "setName": 5, "isWritablePrimary": "yes"}),
            ServerType::Standalone
        );
    }

    #[test]
    fn failed_reply_keeps_its_topology_version() {
        let h = Hello::from_document(&doc! {
            "ok": 0, "errmsg": "The server is in quiesce mode and will shut down",
            "code": 91, "topologyVersion": {"processId": oid(2), "counter": 3i64},
        });
        assert_eq!(h.server_type, ServerType::Unknown);
        assert_eq!(h.topology_version.map(|t| t.counter), Some(3));
        assert!(h.error.as_deref().unwrap().contains("quiesce"));
    }

    #[test]
    fn topology_version_order() {
        let a = TopologyVersion {
            process_id: oid(1),
            counter: 5,
        };
        let older = TopologyVersion { counter: 4, ..a };
        let restarted = TopologyVersion {
            process_id: oid(2),
            counter: 0,
        };
        assert!(older.is_older_than(&a));
        assert!(!a.is_older_than(&a));
        assert!(!restarted.is_older_than(&a));
        assert!(a.is_stale_error_for(&a));
        assert!(older.is_stale_error_for(&a));
        assert!(!TopologyVersion { counter: 6, ..a }.is_stale_error_for(&a));
        assert!(!restarted.is_stale_error_for(&a));
        assert_eq!(TopologyVersion::from_document(&a.to_document()), Some(a));
        assert_eq!(
            TopologyVersion::from_document(&doc! {"processId": "x", "counter": 1}),
            None
        );
    }
}
