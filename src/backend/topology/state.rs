//! One shard's topology as a sans-IO state machine: the members, each with its last `hello`,
//! round-trip time and connection-pool generation; which one is primary; the highest
//! `(electionId, setVersion)` seen. Inputs are events with the time as an argument —
//! [`ShardTopology::on_hello`], [`ShardTopology::on_monitor_error`],
//! [`ShardTopology::on_application_error`], [`ShardTopology::on_rtt_sample`] — and each returns
//! an [`Update`] saying what the caller must do (open or close a member's monitor and pool,
//! drop a pool's connections, check members now).
//!
//! The rules are mongos's streamable replica-set monitor's (server discovery and monitoring):
//! a reply older than the member's `topologyVersion` is ignored; a primary whose
//! `(electionId, setVersion)` is older than the highest seen is stale and marked Unknown
//! (electionId compared first, as mongos 6.0+ does); a primary's member list adds and removes
//! members; a member reporting another set name, or a different `me`, is removed;
//! NotPrimary and shutdown errors from the data path mark a member Unknown unless their
//! `topologyVersion` shows the monitor already knows better; errors from connections of an
//! older pool generation are ignored.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bson::oid::ObjectId;

use super::address::{HostAddr, SeedList};
use super::hello::{Hello, ServerType, TopologyVersion};
use super::retry::{
    is_network_code, is_network_timeout_code, is_not_primary_code, is_shutdown_code,
};

/// The clock, passed in: a monotonic instant for deadlines and intervals, and wall-clock
/// milliseconds since the Unix epoch, which staleness compares with members' `lastWriteDate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    /// For deadlines, intervals and round trips.
    pub instant: Instant,
    /// For `lastWriteDate` arithmetic (`maxStalenessSeconds`).
    pub wall_ms: i64,
}

/// The fewest milliseconds between two checks of one member (mongos and the server-discovery
/// specification: `minHeartbeatFrequencyMS`).
pub const MIN_HEARTBEAT_FREQUENCY: Duration = Duration::from_millis(500);

/// A new round-trip sample weighs 1/5 in the moving average (server discovery: alpha 0.2).
const RTT_ALPHA_DENOMINATOR: u128 = 5;

/// Settings of monitoring and selection (config: `heartbeat_frequency_ms`, mongos's
/// `--localThreshold`, `defaultFindReplicaSetHostTimeoutMS`).
#[derive(Debug, Clone, PartialEq)]
pub struct TopologySettings {
    /// How often a member is checked when all is well (default 10 s; never less than
    /// [`MIN_HEARTBEAT_FREQUENCY`]).
    pub heartbeat_frequency: Duration,
    /// The latency window above the nearest eligible member (default 15 ms).
    pub local_threshold: Duration,
    /// How long one server selection may wait for an eligible member (default 15 s).
    pub find_host_timeout: Duration,
    /// `maxAwaitTimeMS` of an awaitable `hello` (default 10 s).
    pub max_await_time: Duration,
    /// Whether members that report a `topologyVersion` are monitored with awaitable `hello`
    /// (streaming) rather than polled.
    pub streaming: bool,
}

impl Default for TopologySettings {
    fn default() -> Self {
        TopologySettings {
            heartbeat_frequency: Duration::from_secs(10),
            local_threshold: Duration::from_millis(15),
            find_host_timeout: Duration::from_secs(15),
            max_await_time: Duration::from_secs(10),
            streaming: true,
        }
    }
}

impl TopologySettings {
    /// The heartbeat frequency actually used (never below the minimum).
    pub fn heartbeat(&self) -> Duration {
        self.heartbeat_frequency.max(MIN_HEARTBEAT_FREQUENCY)
    }
}

/// What kind of deployment the shard is (server discovery's topology types, reduced to the
/// ones a shard can be).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopologyKind {
    /// A single server addressed directly (`host:port`): whatever it is, it serves everything.
    Single,
    /// A replica set without a known primary.
    ReplicaSetNoPrimary,
    /// A replica set with a known primary.
    ReplicaSetWithPrimary,
}

/// `(electionId, setVersion)` of a primary, ordered as mongos 6.0+ orders it: a pair with a
/// missing field is older than a complete one; otherwise `electionId` decides, then
/// `setVersion` (a missing value is smaller than any value).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ElectionIdSetVersion {
    /// `electionId` (0x7fffffff followed by the term).
    pub election_id: Option<ObjectId>,
    /// `setVersion`.
    pub set_version: Option<i32>,
}

impl ElectionIdSetVersion {
    fn all_defined(&self) -> bool {
        self.election_id.is_some() && self.set_version.is_some()
    }

    /// Whether a primary reporting `self` is stale given the highest pair seen, `max`.
    pub fn is_older_than(&self, max: &ElectionIdSetVersion) -> bool {
        if !self.all_defined() && max.all_defined() {
            return true;
        }
        self.election_id < max.election_id
            || (self.election_id == max.election_id && self.set_version < max.set_version)
    }
}

/// One member and what is known of it.
#[derive(Debug, Clone)]
pub struct Member {
    addr: HostAddr,
    hello: Hello,
    rtt: Option<Duration>,
    updated: Option<Now>,
    generation: u64,
    monitor_errors: u32,
}

impl Member {
    fn new(addr: HostAddr) -> Self {
        Member {
            addr,
            hello: Hello::unknown(),
            rtt: None,
            updated: None,
            generation: 0,
            monitor_errors: 0,
        }
    }

    /// The member's address.
    pub fn addr(&self) -> &HostAddr {
        &self.addr
    }

    /// Its type from the last accepted `hello` (Unknown after an error).
    pub fn server_type(&self) -> ServerType {
        self.hello.server_type
    }

    /// The last accepted `hello` (an Unknown description after an error).
    pub fn hello(&self) -> &Hello {
        &self.hello
    }

    /// The moving average of its round-trip times, once measured.
    pub fn rtt(&self) -> Option<Duration> {
        self.rtt
    }

    /// When its description was last installed (staleness's `lastUpdateTime`).
    pub fn last_update(&self) -> Option<Now> {
        self.updated
    }

    /// The generation of its connection pool: a connection opened under an older generation
    /// must be closed, and its errors are ignored.
    pub fn pool_generation(&self) -> u64 {
        self.generation
    }

    /// Its `topologyVersion`, from the last reply or error that carried one.
    pub fn topology_version(&self) -> Option<TopologyVersion> {
        self.hello.topology_version
    }
}

/// How a monitor's check of a member failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MonitorError {
    /// Connecting or the handshake failed: the member is Unknown.
    Connect,
    /// The monitoring connection broke after it worked: the first time, check again at once;
    /// the second time in a row, the member is Unknown.
    Network,
}

/// A failure the data path saw on a member (a request on one of the pool's connections).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApplicationError {
    /// No reply: the connection failed or timed out.
    Network {
        /// The pool generation of the connection.
        generation: u64,
        /// Whether it failed while connecting or in the handshake.
        during_handshake: bool,
        /// Whether it timed out waiting for the reply (then only the pool is cleared: the
        /// member may just be slow).
        timeout: bool,
    },
    /// The member answered with an error (command-level, or a `writeConcernError`).
    Command {
        /// The pool generation of the connection.
        generation: u64,
        /// The error code.
        code: i32,
        /// The `topologyVersion` the error carried, if any.
        topology_version: Option<TopologyVersion>,
    },
}

/// What one event changed, and what the caller must do about it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Update {
    /// Whether the event was applied (false: ignored as stale, or from a removed member).
    pub applied: bool,
    /// Members discovered: start a monitor and a pool for each.
    pub added: Vec<HostAddr>,
    /// Members gone: stop their monitor, close their pool.
    pub removed: Vec<HostAddr>,
    /// Drop every connection of this member's pool (its generation moved on).
    pub clear_pool: bool,
    /// Check the members now instead of waiting for the next heartbeat.
    pub request_check: bool,
    /// The primary changed (including to or from none).
    pub primary_changed: bool,
}

/// What a member's monitor should do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckKind {
    /// A plain `hello`, timed (its duration is a round-trip sample).
    Poll,
    /// An awaitable `hello` with this `topologyVersion` and `maxAwaitTimeMS`: the member
    /// answers when its state changes or when the time is up.
    Awaitable {
        /// Sent back as `topologyVersion`.
        topology_version: TopologyVersion,
        /// Sent as `maxAwaitTimeMS`.
        max_await: Duration,
    },
}

/// When and how a member's monitor checks it next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckPlan {
    /// The kind of check.
    pub kind: CheckKind,
    /// Not before this instant.
    pub at: Instant,
}

/// One shard's members and what is known of them; see the module header.
#[derive(Debug, Clone)]
pub struct ShardTopology {
    set_name: Option<String>,
    kind: TopologyKind,
    members: BTreeMap<HostAddr, Member>,
    max_election: ElectionIdSetVersion,
    settings: TopologySettings,
    version: u64,
    expedited: bool,
}

impl ShardTopology {
    /// A topology of the seed list's members, all Unknown.
    pub fn new(seeds: &SeedList, settings: TopologySettings) -> Self {
        let kind = if seeds.set_name.is_some() {
            TopologyKind::ReplicaSetNoPrimary
        } else {
            TopologyKind::Single
        };
        let members = seeds
            .hosts
            .iter()
            .map(|h| (h.clone(), Member::new(h.clone())))
            .collect();
        ShardTopology {
            set_name: seeds.set_name.clone(),
            kind,
            members,
            max_election: ElectionIdSetVersion::default(),
            settings,
            version: 0,
            expedited: true,
        }
    }

    /// The settings.
    pub fn settings(&self) -> &TopologySettings {
        &self.settings
    }

    /// The replica set's name (`None` for a single server).
    pub fn set_name(&self) -> Option<&str> {
        self.set_name.as_deref()
    }

    /// The topology kind.
    pub fn kind(&self) -> TopologyKind {
        self.kind
    }

    /// Grows with every applied change: a waiter for a member (see `wait`) re-runs selection
    /// when it moves.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The highest `(electionId, setVersion)` a primary has reported.
    pub fn max_election_id_set_version(&self) -> ElectionIdSetVersion {
        self.max_election
    }

    /// The members, in address order.
    pub fn members(&self) -> impl Iterator<Item = &Member> {
        self.members.values()
    }

    /// One member.
    pub fn member(&self, addr: &HostAddr) -> Option<&Member> {
        self.members.get(addr)
    }

    /// The primary, if one is known.
    pub fn primary(&self) -> Option<&Member> {
        self.members
            .values()
            .find(|m| m.server_type() == ServerType::RsPrimary)
    }

    /// The name errors use for the shard: the set name, or the single server's address.
    pub fn display_name(&self) -> String {
        match &self.set_name {
            Some(n) => n.clone(),
            None => self
                .members
                .keys()
                .next()
                .map(|h| h.to_string())
                .unwrap_or_default(),
        }
    }

    /// Applies a `hello` reply from `addr`, with the round trip it took if it was timed (an
    /// awaitable `hello` is not).
    pub fn on_hello(
        &mut self,
        addr: &HostAddr,
        hello: Hello,
        rtt_sample: Option<Duration>,
        now: Now,
    ) -> Update {
        let Some(member) = self.members.get(addr) else {
            return Update::default();
        };
        if let (Some(new), Some(known)) = (hello.topology_version, member.topology_version()) {
            if new.is_older_than(&known) {
                return Update::default();
            }
        }
        let rtt = match (member.rtt, rtt_sample) {
            (Some(old), Some(s)) => Some(ewma(old, s)),
            (None, Some(s)) => Some(s),
            (old, None) => old,
        };
        let primary_before = self.primary().map(|m| m.addr.clone());
        let mut update = Update {
            applied: true,
            ..Update::default()
        };
        if let Some(m) = self.members.get_mut(addr) {
            m.monitor_errors = 0;
            m.rtt = rtt;
        }
        self.install(addr, hello, now);
        self.run_state_machine(addr, now, &mut update);
        self.finish(primary_before, &mut update);
        update
    }

    /// Applies a failed check by `addr`'s monitor. Its pool is cleared either way.
    pub fn on_monitor_error(&mut self, addr: &HostAddr, error: MonitorError, now: Now) -> Update {
        let primary_before = self.primary().map(|m| m.addr.clone());
        let Some(member) = self.members.get_mut(addr) else {
            return Update::default();
        };
        let mut update = Update {
            applied: true,
            clear_pool: true,
            ..Update::default()
        };
        member.generation += 1;
        let known = member.server_type() != ServerType::Unknown;
        if error == MonitorError::Network && known && member.monitor_errors == 0 {
            // A known member's monitoring connection broke once: check again at once before
            // believing it is down.
            member.monitor_errors = 1;
            update.request_check = true;
            self.version += 1;
            return update;
        }
        member.monitor_errors = 0;
        self.install(addr, Hello::unknown(), now);
        self.run_state_machine(addr, now, &mut update);
        self.finish(primary_before, &mut update);
        update
    }

    /// Applies a failure the data path saw on `addr` (mongos's `updateReplSetMonitor`).
    pub fn on_application_error(
        &mut self,
        addr: &HostAddr,
        error: &ApplicationError,
        now: Now,
    ) -> Update {
        let Some(member) = self.members.get(addr) else {
            return Update::default();
        };
        let generation = match error {
            ApplicationError::Network { generation, .. }
            | ApplicationError::Command { generation, .. } => *generation,
        };
        if generation < member.generation {
            return Update::default();
        }
        let primary_before = self.primary().map(|m| m.addr.clone());
        let mut update = Update::default();
        let (mark_unknown, error_tv) = match error {
            ApplicationError::Network {
                during_handshake,
                timeout,
                ..
            } => {
                update.clear_pool = true;
                (*during_handshake || !*timeout, None)
            }
            ApplicationError::Command {
                code,
                topology_version,
                ..
            } => {
                let state_change = is_not_primary_code(*code) || is_shutdown_code(*code);
                if !state_change && !is_network_code(*code) {
                    return Update::default();
                }
                if let (Some(e), Some(k)) = (topology_version, member.topology_version()) {
                    if e.is_stale_error_for(&k) {
                        return Update::default();
                    }
                }
                update.request_check = state_change;
                update.clear_pool = is_shutdown_code(*code) || is_network_code(*code);
                // A network timeout reported by the member leaves it as it is, like one seen
                // on the connection.
                let mark = state_change || !is_network_timeout_code(*code);
                (mark, *topology_version)
            }
        };
        update.applied = true;
        if update.clear_pool {
            if let Some(m) = self.members.get_mut(addr) {
                m.generation += 1;
            }
        }
        if update.request_check {
            self.expedited = true;
        }
        if mark_unknown {
            let unknown = Hello {
                topology_version: error_tv,
                ..Hello::unknown()
            };
            self.install(addr, unknown, now);
            self.run_state_machine(addr, now, &mut update);
        }
        self.version += 1;
        self.finish(primary_before, &mut update);
        update
    }

    /// Feeds a round-trip sample (a timed `hello` or `ping`) into `addr`'s moving average.
    pub fn on_rtt_sample(&mut self, addr: &HostAddr, sample: Duration) {
        if let Some(m) = self.members.get_mut(addr) {
            m.rtt = Some(match m.rtt {
                Some(old) => ewma(old, sample),
                None => sample,
            });
        }
    }

    /// Asks the monitors to check soon (every [`MIN_HEARTBEAT_FREQUENCY`]) until a primary is
    /// found: what a server selection that found no member does.
    pub fn request_immediate_check(&mut self) {
        self.expedited = true;
    }

    /// Whether monitors are in the expedited mode: no primary (or, for a single server,
    /// the server is not known yet), or a check was requested and has not found one since.
    pub fn is_expedited(&self) -> bool {
        self.expedited || self.kind == TopologyKind::ReplicaSetNoPrimary
    }

    /// When and how `addr`'s monitor checks next, given when its last check started; `None`
    /// once the member is no longer part of the topology (stop its monitor).
    pub fn next_check(&self, addr: &HostAddr, last_check_started: Instant) -> Option<CheckPlan> {
        let member = self.members.get(addr)?;
        if self.settings.streaming && member.server_type() != ServerType::Unknown {
            if let Some(tv) = member.topology_version() {
                return Some(CheckPlan {
                    kind: CheckKind::Awaitable {
                        topology_version: tv,
                        max_await: self.settings.max_await_time,
                    },
                    at: last_check_started,
                });
            }
        }
        let interval = if self.is_expedited() || member.monitor_errors > 0 {
            MIN_HEARTBEAT_FREQUENCY
        } else {
            self.settings.heartbeat()
        };
        Some(CheckPlan {
            kind: CheckKind::Poll,
            at: last_check_started + interval,
        })
    }

    /// Installs `addr`'s new description; an Unknown member has no round trip.
    fn install(&mut self, addr: &HostAddr, hello: Hello, now: Now) {
        if let Some(m) = self.members.get_mut(addr) {
            if hello.server_type == ServerType::Unknown {
                m.rtt = None;
            }
            m.hello = hello;
            m.updated = Some(now);
        }
        self.version += 1;
    }

    /// The transition of server discovery for the member just installed at `addr`.
    fn run_state_machine(&mut self, addr: &HostAddr, now: Now, update: &mut Update) {
        if self.kind == TopologyKind::Single {
            return;
        }
        let Some(member) = self.members.get(addr) else {
            return;
        };
        let hello = member.hello.clone();
        match hello.server_type {
            ServerType::Standalone | ServerType::Mongos => self.remove(addr, update),
            ServerType::RsPrimary => self.update_from_primary(addr, &hello, now, update),
            ServerType::RsSecondary | ServerType::RsArbiter | ServerType::RsOther => {
                if hello.set_name != self.set_name {
                    self.remove(addr, update);
                    return self.check_if_has_primary();
                }
                // Without a primary, any member's list is the best knowledge of the set;
                // with one, only the primary's list counts.
                if self.kind == TopologyKind::ReplicaSetNoPrimary {
                    for h in hello.listed_members() {
                        self.add(h, update);
                    }
                }
                if hello.me.as_ref().is_some_and(|me| me != addr) {
                    self.remove(addr, update);
                }
            }
            ServerType::Unknown | ServerType::RsGhost => {}
        }
        self.check_if_has_primary();
    }

    fn update_from_primary(
        &mut self,
        addr: &HostAddr,
        hello: &Hello,
        now: Now,
        update: &mut Update,
    ) {
        if hello.set_name != self.set_name {
            self.remove(addr, update);
            return;
        }
        let incoming = ElectionIdSetVersion {
            election_id: hello.election_id,
            set_version: hello.set_version,
        };
        if incoming.is_older_than(&self.max_election) {
            // A stale primary: an old term still answering as primary.
            self.install(addr, Hello::unknown(), now);
            return;
        }
        self.max_election = incoming;
        let others: Vec<HostAddr> = self
            .members
            .values()
            .filter(|m| &m.addr != addr && m.server_type() == ServerType::RsPrimary)
            .map(|m| m.addr.clone())
            .collect();
        for other in others {
            self.install(&other, Hello::unknown(), now);
        }
        for h in hello.listed_members() {
            self.add(h, update);
        }
        let listed: Vec<&HostAddr> = hello.listed_members().collect();
        let gone: Vec<HostAddr> = self
            .members
            .keys()
            .filter(|k| !listed.contains(k))
            .cloned()
            .collect();
        for g in gone {
            self.remove(&g, update);
        }
    }

    fn add(&mut self, addr: &HostAddr, update: &mut Update) {
        if !self.members.contains_key(addr) {
            self.members.insert(addr.clone(), Member::new(addr.clone()));
            update.added.push(addr.clone());
            self.version += 1;
        }
    }

    fn remove(&mut self, addr: &HostAddr, update: &mut Update) {
        if self.members.remove(addr).is_some() {
            update.added.retain(|a| a != addr);
            update.removed.push(addr.clone());
            self.version += 1;
        }
    }

    fn check_if_has_primary(&mut self) {
        if self.kind == TopologyKind::Single {
            return;
        }
        self.kind = if self.primary().is_some() {
            TopologyKind::ReplicaSetWithPrimary
        } else {
            TopologyKind::ReplicaSetNoPrimary
        };
    }

    fn finish(&mut self, primary_before: Option<HostAddr>, update: &mut Update) {
        self.check_if_has_primary();
        let primary_after = self.primary().map(|m| m.addr.clone());
        update.primary_changed = primary_before != primary_after;
        let settled = match self.kind {
            TopologyKind::Single => self
                .members
                .values()
                .all(|m| m.server_type() != ServerType::Unknown),
            _ => primary_after.is_some(),
        };
        if settled {
            self.expedited = false;
        }
    }
}

/// `alpha · sample + (1 − alpha) · old`, in whole nanoseconds (alpha = 1/5).
fn ewma(old: Duration, sample: Duration) -> Duration {
    let nanos =
        (old.as_nanos() * (RTT_ALPHA_DENOMINATOR - 1) + sample.as_nanos()) / RTT_ALPHA_DENOMINATOR;
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}
