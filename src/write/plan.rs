//! The planner: targeted statements in, a plan out, no I/O. Three plans (docs/design/write-path.md
//! section 2):
//!
//! - **mongos rounds**: each round is a maximal contiguous run of statements bound for one
//!   shard; a multi-target statement is alone in its round; each round waits for the previous
//!   one; execution stops at the first error. What mongos 4.2–8.x does with ordered bulks.
//! - **unordered**: one round, every shard gets its statements in original order.
//! - **proven rewrite**: an ordered bulk that is provably order-independent goes out as one
//!   round, one ordered child batch per shard.
//!
//! A single-document write that must be looked up first ([`Target::Lookup`], mongos 8.0's
//! write without shard key) is a round of its own in every plan: the statements before it
//! run first, then it, then the rest, so each shard still sees its statements in order.

use std::collections::{BTreeSet, HashSet};

use bson::Bson;

use super::target::{Target, Targeted};
use crate::value::compare::OrdBson;

pub use crate::config::Policy;

/// Which plan was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanKind {
    /// mongos's sequential rounds.
    MongosRounds,
    /// One round for an unordered bulk.
    Unordered,
    /// One round for a proven order-independent ordered bulk.
    Rewrite,
}

impl PlanKind {
    /// A label for metrics and logs.
    pub fn label(self) -> &'static str {
        match self {
            PlanKind::MongosRounds => "mongos_rounds",
            PlanKind::Unordered => "unordered",
            PlanKind::Rewrite => "rewrite",
        }
    }
}

/// The statements one shard receives in a round, in original order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardWork {
    /// The shard.
    pub shard: String,
    /// Global statement indexes.
    pub statements: Vec<usize>,
}

/// One step of a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Round {
    /// Send these child batches together and wait for all of them.
    Send(Vec<ShardWork>),
    /// Statement `i` cannot be targeted: it fails, and an ordered bulk stops here.
    Fail(usize),
    /// Statement `i` is a single-document write looked up on these shards first.
    Lookup(usize, Vec<String>),
}

/// A plan: rounds executed one after another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The kind chosen.
    pub kind: PlanKind,
    /// The rounds.
    pub rounds: Vec<Round>,
}

impl Plan {
    /// Rounds that send batches.
    pub fn send_rounds(&self) -> usize {
        self.rounds
            .iter()
            .filter(|r| matches!(r, Round::Send(_) | Round::Lookup(..)))
            .count()
    }
}

/// Why a rewrite was refused (for logs and tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProofFailure {
    /// A statement targets several shards or cannot be targeted.
    NotSingleShard,
    /// A statement has no identity.
    NoIdentity,
    /// Two statements touch the same document.
    DuplicateIdentity,
    /// A statement is not retry-safe.
    NotRetrySafe,
    /// A shard would run several updates or deletes whose results its reply only totals, and
    /// nothing can split them afterwards (no `txnNumber` to resend them under).
    UnresolvableCounts,
    /// The policy forbids rewriting.
    PolicyOff,
}

/// Checks the proof (docs/design/write-path.md section 2) for an ordered bulk. `exact_counts` says
/// whether each statement's result can be told apart in a child batch's reply: inserts report one
/// by one, and a retryable write's updates and deletes can be resent alone under their statement
/// ids; without it a rewrite must not give a shard two statements (an error between them would cut
/// a total the router cannot split).
pub fn prove(
    targeted: &[(usize, &Targeted)],
    policy: Policy,
    exact_counts: bool,
) -> Result<(), ProofFailure> {
    if policy == Policy::Off {
        return Err(ProofFailure::PolicyOff);
    }
    if !targeted
        .iter()
        .all(|(_, t)| matches!(t.target, Target::One(_)))
    {
        return Err(ProofFailure::NotSingleShard);
    }
    if !exact_counts {
        let mut seen = HashSet::new();
        let shared = targeted.iter().any(|(_, t)| match &t.target {
            Target::One(s) => !seen.insert(s.as_str()),
            _ => false,
        });
        if shared {
            return Err(ProofFailure::UnresolvableCounts);
        }
    }
    if policy == Policy::Always {
        return Ok(());
    }
    let mut ids = Vec::with_capacity(targeted.len());
    for (_, t) in targeted {
        let Some(id) = &t.identity else {
            return Err(ProofFailure::NoIdentity);
        };
        ids.push(id);
    }
    if !identities_distinct(&ids) {
        return Err(ProofFailure::DuplicateIdentity);
    }
    if !targeted.iter().all(|(_, t)| t.retry_safe) {
        return Err(ProofFailure::NotRetrySafe);
    }
    Ok(())
}

/// An identity in a form that hashes, for the common bulks whose `_id`s are all integers, all
/// strings or all ObjectIds: within one of those classes, equal keys mean equal values in
/// MongoDB's comparison (1 and 1.0 are never in the same class: a double sends the bulk to the
/// general path).
#[derive(PartialEq, Eq, Hash)]
enum FastId<'a> {
    Int(i64),
    Str(&'a str),
    Oid([u8; 12]),
}

fn fast_id(id: &Bson) -> Option<FastId<'_>> {
    match id {
        Bson::Int32(i) => Some(FastId::Int(*i as i64)),
        Bson::Int64(i) => Some(FastId::Int(*i)),
        Bson::String(s) => Some(FastId::Str(s)),
        Bson::ObjectId(o) => Some(FastId::Oid(o.bytes())),
        _ => None,
    }
}

/// Whether no two identities are equal in MongoDB's comparison.
fn identities_distinct(ids: &[&Bson]) -> bool {
    let fast: Option<Vec<FastId<'_>>> = ids.iter().map(|id| fast_id(id)).collect();
    if let Some(fast) = fast {
        let mut seen = HashSet::with_capacity(fast.len());
        return fast.into_iter().all(|k| seen.insert(k));
    }
    let mut seen = BTreeSet::new();
    ids.iter().all(|id| seen.insert(OrdBson((*id).clone())))
}

/// Plans statements (global index, targeting), given in original order; `exact_counts` as
/// for [`prove`].
pub fn plan(
    targeted: &[(usize, &Targeted)],
    ordered: bool,
    policy: Policy,
    exact_counts: bool,
) -> Plan {
    if !ordered {
        return Plan {
            kind: PlanKind::Unordered,
            rounds: unordered_rounds(targeted),
        };
    }
    if prove(targeted, policy, exact_counts).is_ok() {
        return Plan {
            kind: PlanKind::Rewrite,
            rounds: per_shard_round(targeted),
        };
    }
    Plan {
        kind: PlanKind::MongosRounds,
        rounds: mongos_rounds(targeted),
    }
}

/// Rounds with every shard's statements in original order: statements that cannot be targeted
/// fail first; a lookup splits the rest into the statements before it, itself, and after it.
fn unordered_rounds(targeted: &[(usize, &Targeted)]) -> Vec<Round> {
    let mut rounds: Vec<Round> = targeted
        .iter()
        .filter(|(_, t)| matches!(t.target, Target::Error { .. }))
        .map(|(i, _)| Round::Fail(*i))
        .collect();
    let mut segment: Vec<(usize, &Targeted)> = Vec::new();
    let flush = |segment: &mut Vec<(usize, &Targeted)>, rounds: &mut Vec<Round>| {
        let work = group_by_shard(segment.drain(..).flat_map(|(i, t)| {
            let shards: &[String] = match &t.target {
                Target::One(s) => std::slice::from_ref(s),
                Target::Many(shards) => shards,
                Target::Lookup(_) | Target::Error { .. } => &[],
            };
            shards.iter().map(move |s| (s.as_str(), i))
        }));
        if !work.is_empty() {
            rounds.push(Round::Send(work));
        }
    };
    for &(i, t) in targeted {
        if let Target::Lookup(shards) = &t.target {
            flush(&mut segment, &mut rounds);
            rounds.push(Round::Lookup(i, shards.clone()));
        } else {
            segment.push((i, t));
        }
    }
    flush(&mut segment, &mut rounds);
    rounds
}

fn per_shard_round(targeted: &[(usize, &Targeted)]) -> Vec<Round> {
    let work = group_by_shard(targeted.iter().filter_map(|(i, t)| match &t.target {
        Target::One(s) => Some((s.as_str(), *i)),
        _ => None,
    }));
    if work.is_empty() {
        Vec::new()
    } else {
        vec![Round::Send(work)]
    }
}

/// Each shard's statements, in the order given; a shard's name is copied once, not per
/// statement.
fn group_by_shard<'a>(pairs: impl Iterator<Item = (&'a str, usize)>) -> Vec<ShardWork> {
    let mut work: Vec<ShardWork> = Vec::new();
    for (shard, i) in pairs {
        match work.iter_mut().find(|w| w.shard == shard) {
            Some(w) => w.statements.push(i),
            None => work.push(ShardWork {
                shard: shard.to_string(),
                statements: vec![i],
            }),
        }
    }
    work.sort_by(|a, b| a.shard.cmp(&b.shard));
    work
}

/// mongos's ordered rounds: a round holds either any number of statements bound for the same
/// single shard, or one statement bound for several shards.
fn mongos_rounds(targeted: &[(usize, &Targeted)]) -> Vec<Round> {
    let mut rounds = Vec::new();
    let mut current: Option<ShardWork> = None;
    for (i, t) in targeted {
        match &t.target {
            Target::One(shard) => match &mut current {
                Some(w) if &w.shard == shard => w.statements.push(*i),
                _ => {
                    if let Some(w) = current.take() {
                        rounds.push(Round::Send(vec![w]));
                    }
                    current = Some(ShardWork {
                        shard: shard.clone(),
                        statements: vec![*i],
                    });
                }
            },
            Target::Lookup(shards) => {
                if let Some(w) = current.take() {
                    rounds.push(Round::Send(vec![w]));
                }
                rounds.push(Round::Lookup(*i, shards.clone()));
            }
            Target::Many(shards) => {
                if let Some(w) = current.take() {
                    rounds.push(Round::Send(vec![w]));
                }
                rounds.push(Round::Send(
                    shards
                        .iter()
                        .map(|s| ShardWork {
                            shard: s.clone(),
                            statements: vec![*i],
                        })
                        .collect(),
                ));
            }
            Target::Error { .. } => {
                if let Some(w) = current.take() {
                    rounds.push(Round::Send(vec![w]));
                }
                rounds.push(Round::Fail(*i));
                // Ordered execution stops at the failing statement.
                return rounds;
            }
        }
    }
    if let Some(w) = current.take() {
        rounds.push(Round::Send(vec![w]));
    }
    rounds
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::error_codes::ErrorCode;

    #[test]
    fn identities_are_compared_as_mongodb_compares_them() {
        let oid = bson::oid::ObjectId::new();
        let distinct = |ids: Vec<Bson>| identities_distinct(&ids.iter().collect::<Vec<_>>());
        assert!(distinct(vec![Bson::Int32(1), Bson::Int64(2)]));
        assert!(!distinct(vec![Bson::Int32(1), Bson::Int64(1)]));
        assert!(
            !distinct(vec![Bson::Int32(1), Bson::Double(1.0)]),
            "1 == 1.0"
        );
        assert!(distinct(vec![Bson::Int32(1), Bson::String("1".into())]));
        assert!(!distinct(vec![
            Bson::String("a".into()),
            Bson::String("a".into())
        ]));
        assert!(!distinct(vec![Bson::ObjectId(oid), Bson::ObjectId(oid)]));
        assert!(distinct(vec![
            Bson::ObjectId(oid),
            Bson::ObjectId(bson::oid::ObjectId::new())
        ]));
        assert!(!distinct(vec![
            bson::bson!({"a": 1}),
            Bson::Int32(3),
            bson::bson!({"a": 1.0})
        ]));
    }

    fn one(shard: &str, id: i32) -> Targeted {
        Targeted {
            target: Target::One(shard.into()),
            identity: Some(Bson::Int32(id)),
            retry_safe: true,
        }
    }

    fn indexed(ts: &[Targeted]) -> Vec<(usize, &Targeted)> {
        ts.iter().enumerate().collect()
    }

    #[test]
    fn the_analysis_example() {
        // d1..d8 on A, B, B, C, A, C, C, B: six ordered rounds, one unordered round.
        let shards = ["A", "B", "B", "C", "A", "C", "C", "B"];
        let ts: Vec<Targeted> = shards
            .iter()
            .enumerate()
            .map(|(i, s)| one(s, i as i32))
            .collect();
        let p = plan(&indexed(&ts), true, Policy::Off, true);
        assert_eq!(p.kind, PlanKind::MongosRounds);
        assert_eq!(p.send_rounds(), 6);
        assert_eq!(
            p.rounds[1],
            Round::Send(vec![ShardWork {
                shard: "B".into(),
                statements: vec![1, 2]
            }])
        );
        let u = plan(&indexed(&ts), false, Policy::Off, true);
        assert_eq!(u.send_rounds(), 1);
        let Round::Send(work) = &u.rounds[0] else {
            panic!()
        };
        assert_eq!(work.len(), 3);
        assert_eq!(work[0].statements, vec![0, 4]);
        assert_eq!(work[1].statements, vec![1, 2, 7]);
        let r = plan(&indexed(&ts), true, Policy::RetrySafe, true);
        assert_eq!(r.kind, PlanKind::Rewrite);
        assert_eq!(r.rounds, u.rounds);
    }

    #[test]
    fn proof_failures_fall_back_to_mongos_rounds() {
        let mut dup = vec![one("A", 1), one("B", 2), one("A", 1)];
        assert_eq!(
            prove(&indexed(&dup), Policy::RetrySafe, true),
            Err(ProofFailure::DuplicateIdentity)
        );
        assert_eq!(
            plan(&indexed(&dup), true, Policy::RetrySafe, true).kind,
            PlanKind::MongosRounds
        );
        // "always" keeps duplicates in order inside their shard's child batch.
        let always = plan(&indexed(&dup), true, Policy::Always, true);
        assert_eq!(always.kind, PlanKind::Rewrite);
        let Round::Send(work) = &always.rounds[0] else {
            panic!()
        };
        assert_eq!(work[0].statements, vec![0, 2]);

        dup[2] = one("A", 3);
        dup[1].retry_safe = false;
        assert_eq!(
            prove(&indexed(&dup), Policy::RetrySafe, true),
            Err(ProofFailure::NotRetrySafe)
        );
        dup[1].retry_safe = true;
        dup[1].identity = None;
        assert_eq!(
            prove(&indexed(&dup), Policy::RetrySafe, true),
            Err(ProofFailure::NoIdentity)
        );
        dup[1] = Targeted {
            target: Target::Many(vec!["A".into(), "B".into()]),
            identity: None,
            retry_safe: true,
        };
        assert_eq!(
            prove(&indexed(&dup), Policy::Always, true),
            Err(ProofFailure::NotSingleShard)
        );
        let p = plan(&indexed(&dup), true, Policy::RetrySafe, true);
        assert_eq!(p.kind, PlanKind::MongosRounds);
        assert_eq!(
            p.rounds.len(),
            3,
            "the broadcast statement is alone in its round"
        );
        assert_eq!(
            prove(&indexed(&[one("A", 1)]), Policy::Off, true),
            Err(ProofFailure::PolicyOff)
        );
    }

    #[test]
    fn targeting_errors() {
        let err = Targeted {
            target: Target::Error {
                code: ErrorCode::ShardKeyNotFound,
                message: "x".into(),
            },
            identity: None,
            retry_safe: false,
        };
        let ts = vec![one("A", 1), one("A", 2), err.clone(), one("B", 3)];
        let p = plan(&indexed(&ts), true, Policy::RetrySafe, true);
        assert_eq!(p.kind, PlanKind::MongosRounds);
        assert_eq!(
            p.rounds,
            vec![
                Round::Send(vec![ShardWork {
                    shard: "A".into(),
                    statements: vec![0, 1]
                }]),
                Round::Fail(2),
            ]
        );
        let u = plan(&indexed(&ts), false, Policy::RetrySafe, true);
        assert_eq!(u.rounds[0], Round::Fail(2));
        assert_eq!(u.send_rounds(), 1);
    }
}
