//! The progress of a primary shard's DDL coordinators (drop, rename, `dropDatabase` of
//! [`super::cluster_ddl`]), recorded as MongoDB's coordinators record it: one document per
//! coordinator in `config.system.sharding_ddl_coordinators` on the shard, `{_id: {namespace,
//! operationType}, phase, recoveredFromDisk, …}`, written before the coordinator acts on the
//! phase and removed when it is done. The document is in the shard's replicated state (the
//! data set an embedded replica set's members share), so a member that becomes primary finds
//! the coordinators its predecessor left unfinished and resumes each from the phase it
//! recorded ([`spawn_recovery`]); every phase is idempotent, so running one again is harmless.
//!
//! A coordinator notices that its member stopped being primary (or was elected again in a
//! later term) at its next phase and stops there with InterruptedDueToReplStateChange
//! (11602), releasing nothing: the critical sections it entered are part of the replicated
//! state too, and the new primary's coordinator finishes the change and releases them.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::{doc, Bson, Document};

use crate::engine::EngineError;
use crate::sync::lock;
use crate::value::error_codes::ErrorCode;

use super::migration::Donor;
use super::replset::MemberLink;
use super::store::Catalog;

/// Where the coordinators are recorded (MongoDB's `NamespaceString::kShardingDDLCoordinatorsNamespace`).
pub const DB: &str = "config";
/// See [`DB`].
pub const COLLECTION: &str = "system.sharding_ddl_coordinators";

/// `operationType` of each coordinator (MongoDB's `DDLCoordinatorTypeEnum` values).
pub const DROP_COLLECTION: &str = "dropCollection";
/// See [`DROP_COLLECTION`].
pub const RENAME_COLLECTION: &str = "renameCollection";
/// See [`DROP_COLLECTION`].
pub const DROP_DATABASE: &str = "dropDatabase";

/// The phase a finished rename keeps its response under, so a client that sends the same
/// rename again gets the outcome (MongoDB's `RenameCollectionCoordinatorPhase::kSetResponse`).
pub const SET_RESPONSE: &str = "setResponse";

/// How often a request that joins a running coordinator looks whether it finished.
const JOIN_POLL: Duration = Duration::from_millis(20);

/// The `_id` of a coordinator's document.
pub fn coordinator_id(operation: &str, namespace: &str) -> Document {
    doc! {"namespace": namespace, "operationType": operation}
}

/// The document recorded for `id`, if any.
pub fn recorded(catalog: &Mutex<Catalog>, id: &Document) -> Option<Document> {
    lock(catalog)
        .collection(DB, COLLECTION)
        .and_then(|c| c.by_id(&Bson::Document(id.clone())).map(|(_, d)| d.clone()))
}

/// Every recorded coordinator.
fn all_recorded(catalog: &Mutex<Catalog>) -> Vec<Document> {
    lock(catalog)
        .collection(DB, COLLECTION)
        .map(|c| c.iter().map(|(_, d)| d.clone()).collect())
        .unwrap_or_default()
}

fn write(catalog: &Mutex<Catalog>, document: Document) -> Result<(), EngineError> {
    let ns = format!("{DB}.{COLLECTION}");
    let id = document.get("_id").cloned().unwrap_or(Bson::Null);
    let mut catalog = lock(catalog);
    let (coll, _) = catalog.collection_mut(DB, COLLECTION);
    match coll.by_id(&id).map(|(rid, _)| rid) {
        Some(rid) => coll.replace(&ns, rid, document),
        None => coll.insert(&ns, document).map(|_| ()),
    }
}

fn remove(catalog: &Mutex<Catalog>, id: &Document) {
    let mut catalog = lock(catalog);
    if let Some(coll) = catalog.existing_mut(DB, COLLECTION) {
        if let Some(rid) = coll.by_id(&Bson::Document(id.clone())).map(|(rid, _)| rid) {
            coll.remove(rid);
        }
    }
}

/// Whether `e` is a coordinator stopping because its member is no longer primary.
pub fn interrupted(e: &EngineError) -> bool {
    e.code == ErrorCode::InterruptedDueToReplStateChange
}

/// One running coordinator: its document, and the term of the primary running it.
#[derive(Debug)]
pub struct Coordinator {
    catalog: Arc<Mutex<Catalog>>,
    member: Option<MemberLink>,
    term: Option<i64>,
    document: Document,
}

/// How a DDL request starts.
pub enum Begun {
    /// A new coordinator, recorded in phase `unset`.
    New(Coordinator),
    /// A coordinator of the same operation on the same namespace is recorded (running, or
    /// resumed by this primary, or finished with a response): its document.
    Existing(Document),
}

impl Coordinator {
    /// Records a new coordinator `{_id, phase: "unset", recoveredFromDisk: false, …fields}`
    /// unless one with this `_id` is recorded (that one is answered instead, so the request
    /// joins it). A recorded [`SET_RESPONSE`] document of an earlier request is answered as
    /// well; the caller decides whether its response is this request's.
    pub fn begin(
        d: &Donor,
        operation: &str,
        namespace: &str,
        fields: Document,
    ) -> Result<Begun, EngineError> {
        let id = coordinator_id(operation, namespace);
        let term = primary_term(d)?;
        let mut document = doc! {"_id": id.clone(), "phase": "unset", "recoveredFromDisk": false};
        document.extend(fields);
        {
            // One lock: two requests cannot both start a coordinator for the same `_id`.
            let mut catalog = lock(&d.catalog);
            let (coll, _) = catalog.collection_mut(DB, COLLECTION);
            if let Some((_, existing)) = coll.by_id(&Bson::Document(id)) {
                return Ok(Begun::Existing(existing.clone()));
            }
            coll.insert(&format!("{DB}.{COLLECTION}"), document.clone())?;
        }
        Ok(Begun::New(Coordinator {
            catalog: d.catalog.clone(),
            member: d.member.clone(),
            term,
            document,
        }))
    }

    /// A coordinator recorded by an earlier primary, resumed by this one (`recoveredFromDisk`).
    fn recovered(d: &Donor, term: i64, mut document: Document) -> Result<Coordinator, EngineError> {
        document.insert("recoveredFromDisk", true);
        write(&d.catalog, document.clone())?;
        Ok(Coordinator {
            catalog: d.catalog.clone(),
            member: d.member.clone(),
            term: Some(term),
            document,
        })
    }

    /// Replaces a [`SET_RESPONSE`] document of an earlier request (its response was not this
    /// request's) with a new coordinator.
    pub fn replace_finished(
        d: &Donor,
        finished: &Document,
        fields: Document,
    ) -> Result<Begun, EngineError> {
        if let Ok(id) = finished.get_document("_id") {
            let mut catalog = lock(&d.catalog);
            if let Some(coll) = catalog.existing_mut(DB, COLLECTION) {
                let current = coll.by_id(&Bson::Document(id.clone()));
                if let Some((rid, _)) = current.filter(|(_, doc)| *doc == finished) {
                    coll.remove(rid);
                }
            }
        }
        let id = finished.get_document("_id").ok();
        let field = |k: &str| id.and_then(|i| i.get_str(k).ok()).unwrap_or_default();
        Self::begin(d, field("operationType"), field("namespace"), fields)
    }

    /// The recorded document.
    pub fn document(&self) -> &Document {
        &self.document
    }

    /// The phase reached (`unset` before the first).
    pub fn phase(&self) -> &str {
        self.document.get_str("phase").unwrap_or("unset")
    }

    /// Moves to `phase`: records it (once the member is known to be still the primary of the
    /// coordinator's term), then the caller acts on it. InterruptedDueToReplStateChange
    /// (11602) when the member stepped down, before or right after recording.
    pub fn enter(&mut self, phase: &str) -> Result<(), EngineError> {
        self.check_primary()?;
        self.document.insert("phase", phase);
        write(&self.catalog, self.document.clone())?;
        if let Some(member) = &self.member {
            if member.step_down_after_phase(phase) {
                tracing::info!(phase, "stepping down after a DDL phase (fail point)");
            }
        }
        self.check_primary()
    }

    /// Records `value` under `field` in the coordinator's document (what a primary that takes
    /// over needs to know of what this one did).
    pub fn record(&mut self, field: &str, value: Bson) -> Result<(), EngineError> {
        self.check_primary()?;
        self.document.insert(field, value);
        write(&self.catalog, self.document.clone())
    }

    fn check_primary(&self) -> Result<(), EngineError> {
        let now = match &self.member {
            Some(member) => member.primary_term(),
            None => return Ok(()),
        };
        if now.is_none() || now != self.term {
            return Err(EngineError::new(
                ErrorCode::InterruptedDueToReplStateChange,
                "the DDL coordinator was interrupted: this member is no longer primary; the \
                 new primary resumes it",
            ));
        }
        Ok(())
    }

    /// The coordinator is done: its document goes.
    pub fn finish(self) {
        remove(&self.catalog, &self.id());
    }

    /// The coordinator is done with `response`, kept under [`SET_RESPONSE`] for a client
    /// that sends the same request again.
    pub fn finish_with(mut self, response: Document) -> Result<(), EngineError> {
        self.check_primary()?;
        self.document.insert("phase", SET_RESPONSE);
        self.document.insert("response", response);
        write(&self.catalog, self.document)
    }

    fn id(&self) -> Document {
        self.document
            .get_document("_id")
            .cloned()
            .unwrap_or_default()
    }
}

/// The term of this shard's primary, when the shard is a member of an embedded replica set
/// (`None` for a single server); NotWritablePrimary (10107) on a secondary.
fn primary_term(d: &Donor) -> Result<Option<i64>, EngineError> {
    match &d.member {
        None => Ok(None),
        Some(member) => member
            .primary_term()
            .map(Some)
            .ok_or_else(|| EngineError::new(ErrorCode::NotWritablePrimary, "not primary")),
    }
}

/// Waits until the coordinator recorded under `id` is done (its document gone, or finished
/// with a response while this member stays primary): the request that joined it then answers
/// as it did. The document it finished with, if it kept one.
pub async fn join(d: &Donor, id: &Document) -> Result<Option<Document>, EngineError> {
    loop {
        match recorded(&d.catalog, id) {
            None => return Ok(None),
            Some(doc) if doc.get_str("phase").ok() == Some(SET_RESPONSE) => return Ok(Some(doc)),
            Some(_) => {}
        }
        primary_term(d)?;
        tokio::time::sleep(JOIN_POLL).await;
    }
}

/// What resumes one recorded coordinator on a new primary.
pub type Resume =
    fn(Donor, Coordinator) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Starts the task that resumes the recorded coordinators each time this member becomes
/// primary (a new term): `resume` runs each unfinished one from its recorded phase in a task
/// of its own. Nothing for a shard that is not a replica-set member.
/// The task ends within a second of `alive` (the member's command handler) going away.
pub fn spawn_recovery<T: Send + Sync + 'static>(
    d: Donor,
    resume: Resume,
    alive: std::sync::Weak<T>,
) {
    let Some(member) = d.member.clone() else {
        return;
    };
    let mut changes = member.subscribe();
    tokio::spawn(async move {
        let mut resumed_term = None;
        loop {
            if alive.strong_count() == 0 {
                return;
            }
            if let Some(term) = member.primary_term() {
                if resumed_term != Some(term) {
                    resumed_term = Some(term);
                    resume_all(&d, term, resume);
                }
            }
            let waited = tokio::time::timeout(Duration::from_secs(1), changes.changed()).await;
            if let Ok(Err(_)) = waited {
                return;
            }
        }
    });
}

fn resume_all(d: &Donor, term: i64, resume: Resume) {
    for document in all_recorded(&d.catalog) {
        if document.get_str("phase").ok() == Some(SET_RESPONSE) {
            continue;
        }
        tracing::info!(coordinator = %document, "resuming a DDL coordinator on the new primary");
        match Coordinator::recovered(d, term, document) {
            Ok(c) => {
                tokio::spawn(resume(d.clone(), c));
            }
            Err(e) => tracing::warn!(error = %e.message, "a DDL coordinator could not be resumed"),
        }
    }
}
