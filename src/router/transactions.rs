//! Ending a transaction through the router (`docs/design/transactions.md` §2): the commit and
//! abort of a transaction that ran on one shard pass through to it; one that ran on several is
//! ended here.
//!
//! - `abortTransaction` goes to every participant.
//! - `commitTransaction` with at most one participant that was sent a write: the read-only
//!   participants commit first, then the one that wrote (a plain commit each, as mongos's
//!   "single write shard" commit).
//! - Two or more that wrote: a two-phase commit the router coordinates. `prepareTransaction` goes
//!   to every participant; if each prepared, `commitTransaction` with `commitTimestamp`, the
//!   latest `prepareTimestamp`, goes to each. If one refused, every participant aborts and the
//!   client gets NoSuchTransaction labelled `TransientTransactionError` (nothing was applied, the
//!   whole transaction may run again). A commit whose outcome the router cannot know gets
//!   `UnknownTransactionCommitResult`: the client retries the commit, which runs the two phases
//!   again (a prepare is answered with the same timestamp by a prepared participant and with
//!   TransactionCommitted by a committed one), so a retry reaches the same decision.
//!
//! mongos hands the coordination to a coordinator shard (`coordinateCommitTransaction`), which
//! writes its decision down; here the router decides and keeps nothing durable. The
//! `recoveryToken` of every statement's reply names the participants, so a commit retried
//! through another router recovers the decision from the participants' states (see
//! `Ends::recover_commit`): it never commits a transaction no router decided to commit.

use std::sync::Arc;

use bson::{doc, Bson, Document, Timestamp};

use crate::cluster::{Cluster, Participant};
use crate::command::{CommandError, CommandRequest};
use crate::value::error_codes::ErrorCode;

const TRANSIENT: &str = "TransientTransactionError";
const UNKNOWN_COMMIT: &str = "UnknownTransactionCommitResult";

/// The `recoveryToken` a statement's reply carries: mongos's `recoveryShardId` (the first
/// participant) and the participants, each with whether it is read-only so far.
pub fn recovery_token(participants: &[Participant]) -> Document {
    let list: Vec<Bson> = participants
        .iter()
        .map(|p| Bson::Document(doc! {"shardId": &p.shard, "readOnly": !p.wrote}))
        .collect();
    let mut token = Document::new();
    if let Some(first) = participants.first() {
        token.insert("recoveryShardId", &first.shard);
    }
    token.insert("participants", list);
    token
}

/// The participants a client's `recoveryToken` names (those this router knows as shards):
/// its list, or the one `recoveryShardId` (taken as written).
fn from_token(cluster: &Cluster, body: &Document) -> Option<Vec<Participant>> {
    let token = body.get_document("recoveryToken").ok()?;
    let known = |s: &str| cluster.pool(s).is_some();
    let participants: Vec<Participant> = match token.get_array("participants") {
        Ok(list) => list
            .iter()
            .filter_map(Bson::as_document)
            .filter_map(|p| {
                let shard = p.get_str("shardId").ok().filter(|s| known(s))?;
                Some(Participant {
                    shard: shard.to_string(),
                    wrote: !p.get_bool("readOnly").unwrap_or(false),
                })
            })
            .collect(),
        Err(_) => token
            .get_str("recoveryShardId")
            .ok()
            .filter(|s| known(s))
            .map(|s| Participant {
                shard: s.to_string(),
                wrote: true,
            })
            .into_iter()
            .collect(),
    };
    (!participants.is_empty()).then_some(participants)
}

/// `commitTransaction` or `abortTransaction` of transaction `txn` of `session`, on the
/// participants this router recorded or the client's `recoveryToken` names.
pub(super) async fn end_transaction(
    cluster: &Arc<Cluster>,
    req: &CommandRequest,
    body: &Document,
    session: [u8; 16],
    txn: i64,
) -> Result<Document, CommandError> {
    let known = cluster
        .transactions
        .participants(&session, txn)
        .filter(|p| !p.is_empty());
    let recovering = known.is_none();
    let participants = known.or_else(|| from_token(cluster, body));
    let Some(participants) = participants else {
        // Labelled as mongod and mongos label it: nothing of it can be committed, so the
        // whole transaction may be retried.
        let mut e = CommandError::new(
            ErrorCode::NoSuchTransaction,
            format!("Transaction with txnNumber {txn} has not been started on this router"),
        );
        e.labels.push(TRANSIENT.to_string());
        return Err(e);
    };
    let ends = Ends {
        cluster,
        lsid: body.get_document("lsid").cloned().unwrap_or_default(),
        txn,
        write_concern: body.get_document("writeConcern").ok().cloned(),
    };
    if recovering && req.name == "commitTransaction" {
        return ends.recover_commit(&participants).await;
    }
    if let [one] = participants.as_slice() {
        return super::route::forward(cluster, &one.shard, req, None).await;
    }
    if req.name == "abortTransaction" {
        return ends.abort(&participants).await;
    }
    let writers: Vec<&Participant> = participants.iter().filter(|p| p.wrote).collect();
    if writers.len() <= 1 {
        return ends.commit_one_writer(&participants).await;
    }
    ends.two_phase_commit(&participants).await
}

/// A participant's answer to a command of the router's.
enum Answer {
    /// `ok: 1`, the reply.
    Ok(Document),
    /// The shard's error.
    Refused(CommandError),
    /// No answer (connection lost, no primary): the outcome is unknown.
    Unanswered(CommandError),
}

/// What the router sends the participants of one transaction.
struct Ends<'a> {
    cluster: &'a Arc<Cluster>,
    lsid: Document,
    txn: i64,
    write_concern: Option<Document>,
}

impl Ends<'_> {
    fn command(&self, name: &str, extra: Document) -> Document {
        let mut d = doc! {
            name: 1,
            "lsid": self.lsid.clone(),
            "txnNumber": self.txn,
            "autocommit": false,
        };
        d.extend(extra);
        d.insert("$db", "admin");
        d
    }

    async fn send(&self, shard: &str, command: &Document) -> Answer {
        match self.cluster.run_on(shard, command).await {
            Ok(reply) if reply.get_f64("ok").ok() == Some(1.0) => Answer::Ok(reply),
            Ok(reply) => {
                let code = reply.get_i32("code").unwrap_or(ErrorCode::InternalError.0);
                let mut e = CommandError::new(
                    ErrorCode(code),
                    format!("{} at {shard}", reply.get_str("errmsg").unwrap_or_default()),
                );
                e.labels = crate::command::reply_labels(&reply);
                Answer::Refused(e)
            }
            Err(e) => Answer::Unanswered(CommandError::from(e.at(shard))),
        }
    }

    /// Sends `command` to every participant at once; answers in participant order.
    async fn send_all(&self, participants: &[&Participant], command: &Document) -> Vec<Answer> {
        crate::backend::join_all(participants.iter().map(|p| self.send(&p.shard, command))).await
    }

    fn with_write_concern(&self, mut extra: Document) -> Document {
        if let Some(wc) = &self.write_concern {
            extra.insert("writeConcern", wc.clone());
        }
        extra
    }

    /// `abortTransaction` on every participant: ok when each aborted (or never had the
    /// transaction), the first other error otherwise.
    async fn abort(&self, participants: &[Participant]) -> Result<Document, CommandError> {
        let all: Vec<&Participant> = participants.iter().collect();
        let command = self.command("abortTransaction", self.with_write_concern(Document::new()));
        for answer in self.send_all(&all, &command).await {
            match answer {
                Answer::Ok(_) => {}
                Answer::Refused(e) if e.code == ErrorCode::NoSuchTransaction => {}
                Answer::Refused(e) | Answer::Unanswered(e) => return Err(e),
            }
        }
        Ok(doc! {"ok": 1.0})
    }

    /// A plain commit on each participant, the read-only ones first and the one that wrote (if
    /// any) last: it alone decides what is applied.
    async fn commit_one_writer(
        &self,
        participants: &[Participant],
    ) -> Result<Document, CommandError> {
        let command = self.command(
            "commitTransaction",
            self.with_write_concern(Document::new()),
        );
        let mut order: Vec<&Participant> = participants.iter().filter(|p| !p.wrote).collect();
        order.extend(participants.iter().filter(|p| p.wrote));
        let mut reply = doc! {"ok": 1.0};
        for p in order {
            match self.send(&p.shard, &command).await {
                Answer::Ok(r) => keep_write_concern_error(&mut reply, &r, &p.shard),
                Answer::Refused(e) | Answer::Unanswered(e) => return Err(e),
            }
        }
        Ok(reply)
    }

    /// Aborts a transaction no commit was decided for on every participant: the client gets
    /// NoSuchTransaction labelled `TransientTransactionError` (nothing was applied; the whole
    /// transaction may run again), or, when an abort is not confirmed, the abort's error
    /// labelled `UnknownTransactionCommitResult`.
    async fn abort_undecided(
        &self,
        participants: &[Participant],
        why: &str,
        cause: &CommandError,
    ) -> CommandError {
        if let Err(e) = self.abort(participants).await {
            return unknown_commit(e);
        }
        let mut e = CommandError::new(
            ErrorCode::NoSuchTransaction,
            format!(
                "Transaction {} was aborted: {why} :: caused by :: {}",
                self.txn, cause.message
            ),
        );
        e.labels.push(TRANSIENT.to_string());
        e
    }

    /// A commit through a router that did not run the transaction, with the participants its
    /// `recoveryToken` names: as on mongos, the decision is recovered, never made here. The
    /// participants that wrote (the recovery shard when none did) are asked with
    /// `coordinateCommitTransaction`'s recovery form. One that never prepared aborts its part
    /// and answers NoSuchTransaction: no commit was decided (one is decided only once every
    /// participant prepared), so the transaction is aborted everywhere and the client gets
    /// NoSuchTransaction labelled `TransientTransactionError`. When each answers committed or
    /// prepared, commit was or would have been the decision, and the two phases finish it. A
    /// participant that does not answer leaves the outcome unknown.
    async fn recover_commit(&self, participants: &[Participant]) -> Result<Document, CommandError> {
        let mut asked: Vec<&Participant> = participants.iter().filter(|p| p.wrote).collect();
        if asked.is_empty() {
            asked.extend(participants.first());
        }
        let command = self.command("coordinateCommitTransaction", doc! {"participants": []});
        let (mut undecided, mut unknown) = (None, None);
        for answer in self.send_all(&asked, &command).await {
            match answer {
                Answer::Ok(_) => {}
                Answer::Refused(e) if e.code == ErrorCode::PreparedTransactionInProgress => {}
                Answer::Refused(e) if e.code == ErrorCode::NoSuchTransaction => {
                    undecided.get_or_insert(e);
                }
                Answer::Refused(e) | Answer::Unanswered(e) => {
                    unknown.get_or_insert(e);
                }
            }
        }
        if let Some(cause) = undecided {
            return Err(self
                .abort_undecided(participants, "no commit decision was recovered", &cause)
                .await);
        }
        if let Some(cause) = unknown {
            return Err(unknown_commit(cause));
        }
        self.two_phase_commit(participants).await
    }

    /// The two phases: prepare everywhere, then commit everywhere at the latest prepare
    /// timestamp, or abort everywhere if a participant did not prepare.
    async fn two_phase_commit(
        &self,
        participants: &[Participant],
    ) -> Result<Document, CommandError> {
        let all: Vec<&Participant> = participants.iter().collect();
        let prepare = self.command(
            "prepareTransaction",
            doc! {"writeConcern": {"w": "majority"}},
        );
        let answers = self.send_all(&all, &prepare).await;
        let mut commit_at: Option<Timestamp> = None;
        let mut to_commit: Vec<&Participant> = Vec::new();
        let mut committed = false;
        let mut failure: Option<CommandError> = None;
        for (p, answer) in all.iter().zip(answers) {
            match answer {
                Answer::Ok(r) => match r.get_timestamp("prepareTimestamp") {
                    Ok(t) => {
                        if commit_at.is_none_or(|c| (t.time, t.increment) > (c.time, c.increment)) {
                            commit_at = Some(t);
                        }
                        to_commit.push(p);
                    }
                    Err(_) => {
                        failure.get_or_insert(CommandError::new(
                            ErrorCode::InternalError,
                            format!(
                                "prepareTransaction at {} returned no prepareTimestamp",
                                p.shard
                            ),
                        ));
                    }
                },
                // Committed by an earlier attempt: the decision was to commit.
                Answer::Refused(e) if e.code == ErrorCode::TransactionCommitted => {
                    committed = true;
                }
                Answer::Refused(e) | Answer::Unanswered(e) => {
                    failure.get_or_insert(e);
                }
            }
        }
        if let Some(cause) = failure {
            if committed {
                // Some participant committed and another did not answer: the decision was
                // to commit, and this attempt cannot finish it.
                return Err(unknown_commit(cause));
            }
            // Nothing was committed anywhere: abort everywhere.
            return Err(self
                .abort_undecided(participants, "a participant did not prepare", &cause)
                .await);
        }
        let Some(at) = commit_at else {
            // Every participant had committed already (a retried commit).
            return Ok(doc! {"ok": 1.0});
        };
        let commit = self.command(
            "commitTransaction",
            self.with_write_concern(doc! {"commitTimestamp": at}),
        );
        let mut reply = doc! {"ok": 1.0};
        for (p, answer) in to_commit
            .iter()
            .zip(self.send_all(&to_commit, &commit).await)
        {
            match answer {
                Answer::Ok(r) => keep_write_concern_error(&mut reply, &r, &p.shard),
                Answer::Refused(e) | Answer::Unanswered(e) => return Err(unknown_commit(e)),
            }
        }
        Ok(reply)
    }
}

/// An error after which the transaction may or may not be committed: labelled
/// `UnknownTransactionCommitResult` (the client retries the commit), never
/// `TransientTransactionError` (it must not run the transaction again).
fn unknown_commit(mut e: CommandError) -> CommandError {
    e.labels.retain(|l| l != TRANSIENT);
    if !e.labels.iter().any(|l| l == UNKNOWN_COMMIT) {
        e.labels.push(UNKNOWN_COMMIT.to_string());
    }
    e
}

/// The first participant's `writeConcernError`, named by its shard as mongos names it.
fn keep_write_concern_error(reply: &mut Document, from: &Document, shard: &str) {
    if reply.contains_key("writeConcernError") {
        return;
    }
    if let Ok(wce) = from.get_document("writeConcernError") {
        let mut w = wce.clone();
        let reason = format!("{} at {shard}", wce.get_str("errmsg").unwrap_or_default());
        w.insert("errmsg", reason);
        reply.insert("writeConcernError", w);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recovery_token_names_the_first_participant_and_all_of_them() {
        let token = recovery_token(&[
            Participant {
                shard: "a".into(),
                wrote: false,
            },
            Participant {
                shard: "b".into(),
                wrote: true,
            },
        ]);
        assert_eq!(
            token,
            doc! {"recoveryShardId": "a", "participants": [
                {"shardId": "a", "readOnly": true},
                {"shardId": "b", "readOnly": false},
            ]}
        );
    }

    #[test]
    fn an_unknown_outcome_is_never_transient() {
        let mut e = CommandError::new(ErrorCode::HostUnreachable, "gone");
        e.labels.push(TRANSIENT.to_string());
        let e = unknown_commit(e);
        assert_eq!(e.labels, vec![UNKNOWN_COMMIT.to_string()]);
    }
}
