//! Server selection: which member serves a write (the primary) and which a read (by read
//! preference), or that none does yet — then the caller waits (see `wait`).
//!
//! As mongos's selector does it (`sdam/server_selector.cpp`):
//!
//! 1. `maxStalenessSeconds` below `heartbeat + 10 s` (the idle write period) is refused with
//!    MaxStalenessOutOfRange (the parser already refused anything below 90 s).
//! 2. Candidates by mode: primary → the primary; secondary → the secondaries; nearest → both;
//!    primaryPreferred → the primary, else as secondary; secondaryPreferred → as secondary,
//!    else the primary. Tags and staleness never filter a primary chosen as the fallback or
//!    as the only choice.
//! 3. Staleness: a secondary is kept if its estimated lag is at most `maxStalenessSeconds`.
//!    With a primary: `(S.lastUpdate − S.lastWrite) − (P.lastUpdate − P.lastWrite) +
//!    heartbeat`; without: `SMax.lastWrite − S.lastWrite + heartbeat`.
//! 4. Tag sets in order: the first set that at least one candidate matches wins; `{}` matches
//!    all; when none matches, there is no candidate.
//! 5. Latency window: candidates whose round trip is within `localThreshold` of the fastest;
//!    one of them at random (the caller passes the random number).
//!
//! A shard addressed as a single server (`host:port`) is always that server, whatever its
//! state, as mongos's standalone targeter does.

use std::time::Duration;

use crate::value::error_codes::ErrorCode;

use super::address::HostAddr;
use super::error::TopologyError;
use super::hello::ServerType;
use super::read_preference::{ReadPreference, ReadPreferenceMode};
use super::state::{Member, ShardTopology, TopologyKind};

/// mongod writes at least this often on an idle primary, which bounds the staleness that can
/// be measured.
pub const IDLE_WRITE_PERIOD: Duration = Duration::from_secs(10);

/// The member that serves a write now, if any.
pub fn select_for_write(topology: &ShardTopology) -> Option<HostAddr> {
    if topology.kind() == TopologyKind::Single {
        return topology.members().next().map(|m| m.addr().clone());
    }
    topology.primary().map(|m| m.addr().clone())
}

/// The member that serves a read with `pref` now: `Ok(None)` if none does yet, an error if
/// `pref` cannot be served by this topology's settings (`maxStalenessSeconds` too small).
/// `random` picks among the members in the latency window.
pub fn select_for_read(
    topology: &ShardTopology,
    pref: &ReadPreference,
    random: u64,
) -> Result<Option<HostAddr>, TopologyError> {
    let eligible = eligible_for_read(topology, pref)?;
    if eligible.is_empty() {
        return Ok(None);
    }
    let i = (random % eligible.len() as u64) as usize;
    Ok(Some(eligible[i].addr().clone()))
}

/// Every member a read with `pref` may go to now (after the latency window), in address
/// order.
pub fn eligible_for_read<'a>(
    topology: &'a ShardTopology,
    pref: &ReadPreference,
) -> Result<Vec<&'a Member>, TopologyError> {
    if topology.kind() == TopologyKind::Single {
        return Ok(topology.members().take(1).collect());
    }
    let heartbeat = topology.settings().heartbeat();
    if let Some(s) = pref.max_staleness_seconds {
        let floor = heartbeat + IDLE_WRITE_PERIOD;
        if Duration::from_secs(s.max(0) as u64) < floor {
            return Err(TopologyError::new(
                ErrorCode::MaxStalenessOutOfRange,
                format!(
                    "Parameter maxStalenessSeconds cannot be less than {}",
                    floor.as_secs()
                ),
            ));
        }
    }
    let primary_only = || -> Vec<&Member> { topology.primary().into_iter().collect() };
    let secondaries = || -> Vec<&Member> {
        let mut s: Vec<&Member> = topology
            .members()
            .filter(|m| m.server_type() == ServerType::RsSecondary)
            .filter(|m| fresh_enough(topology, m, pref))
            .collect();
        filter_tags(&mut s, pref);
        s
    };
    let mut candidates = match pref.mode {
        ReadPreferenceMode::Primary => primary_only(),
        ReadPreferenceMode::Secondary => secondaries(),
        ReadPreferenceMode::PrimaryPreferred => {
            let p = primary_only();
            if p.is_empty() {
                secondaries()
            } else {
                p
            }
        }
        ReadPreferenceMode::SecondaryPreferred => {
            let s = secondaries();
            if s.is_empty() {
                primary_only()
            } else {
                s
            }
        }
        ReadPreferenceMode::Nearest => {
            let mut all: Vec<&Member> = topology
                .members()
                .filter(|m| {
                    matches!(
                        m.server_type(),
                        ServerType::RsPrimary | ServerType::RsSecondary
                    )
                })
                .filter(|m| fresh_enough(topology, m, pref))
                .collect();
            filter_tags(&mut all, pref);
            all
        }
    };
    latency_window(&mut candidates, topology.settings().local_threshold);
    Ok(candidates)
}

/// A member's estimated lag behind the primary (or the freshest secondary), in
/// milliseconds; 0 for anything but a secondary.
pub fn staleness_ms(topology: &ShardTopology, member: &Member) -> i128 {
    if member.server_type() != ServerType::RsSecondary {
        return 0;
    }
    let heartbeat = topology.settings().heartbeat().as_millis() as i128;
    let last_write = |m: &Member| i128::from(m.hello().last_write_date_ms.unwrap_or(0));
    let updated = |m: &Member| i128::from(m.last_update().map(|n| n.wall_ms).unwrap_or(0));
    match topology.primary() {
        Some(p) => {
            (updated(member) - last_write(member)) - (updated(p) - last_write(p)) + heartbeat
        }
        None => {
            let max = topology
                .members()
                .filter(|m| m.server_type() == ServerType::RsSecondary)
                .map(last_write)
                .max()
                .unwrap_or(0);
            max - last_write(member) + heartbeat
        }
    }
}

fn fresh_enough(topology: &ShardTopology, member: &Member, pref: &ReadPreference) -> bool {
    match pref.max_staleness_seconds {
        None => true,
        Some(s) => staleness_ms(topology, member) <= i128::from(s) * 1000,
    }
}

/// Keeps the candidates that match the first tag set any of them matches.
fn filter_tags(candidates: &mut Vec<&Member>, pref: &ReadPreference) {
    if pref.tags.is_empty() {
        return;
    }
    for set in pref.tag_sets() {
        let matching: Vec<&Member> = candidates
            .iter()
            .copied()
            .filter(|m| {
                set.iter().all(|(k, v)| {
                    v.as_str()
                        .is_some_and(|want| m.hello().tags.get(k).map(String::as_str) == Some(want))
                })
            })
            .collect();
        if !matching.is_empty() {
            *candidates = matching;
            return;
        }
    }
    candidates.clear();
}

/// Keeps the candidates within `threshold` of the fastest round trip (a member not timed yet
/// counts as instant).
fn latency_window(candidates: &mut Vec<&Member>, threshold: Duration) {
    let rtt = |m: &Member| m.rtt().unwrap_or(Duration::ZERO);
    if let Some(fastest) = candidates.iter().map(|m| rtt(m)).min() {
        let limit = fastest.saturating_add(threshold);
        candidates.retain(|m| rtt(m) <= limit);
    }
}
