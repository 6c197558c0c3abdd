//! `createIndexes`, `listIndexes`, `dropIndexes`.

use bson::{doc, Bson, Document};

use super::reads::cursor_reply;
use super::{collection_name, err};
use crate::command::CommandRequest;
use crate::embedded::service::{lock, ShardService};
use crate::engine::EngineError;
use crate::value::error_codes::ErrorCode;

pub(super) fn create_indexes(
    svc: &ShardService,
    req: &CommandRequest,
    body: &Document,
) -> Result<Document, EngineError> {
    let coll = collection_name(req, body)?;
    let Ok(specs) = body.get_array("indexes") else {
        return Err(err(
            ErrorCode(40414),
            "BSON field 'createIndexes.indexes' is missing but a required field",
        ));
    };
    if specs.is_empty() {
        return Err(err(
            ErrorCode::BadValue,
            "Must specify at least one index to create",
        ));
    }
    let ns = format!("{}.{coll}", req.db);
    let data = svc.data();
    let mut cat = lock(&data);
    let (c, created) = cat.collection_mut(&req.db, &coll);
    let before = c.indexes().len() as i32;
    let mut backup = c.clone();
    let mut any_new = false;
    for spec in specs {
        let Bson::Document(spec) = spec else {
            return Err(err(
                ErrorCode::TypeMismatch,
                "index specification must be an object",
            ));
        };
        match backup.create_index(&ns, spec) {
            Ok(new) => any_new |= new,
            Err(e) => return Err(e),
        }
    }
    std::mem::swap(c, &mut backup);
    let after = c.indexes().len() as i32;
    let mut reply = doc! {"numIndexesBefore": before, "numIndexesAfter": after, "createdCollectionAutomatically": created};
    if !any_new {
        reply.insert("note", "all indexes already exist");
    }
    Ok(reply)
}

pub(super) fn list_indexes(
    svc: &ShardService,
    req: &CommandRequest,
    body: &Document,
) -> Result<Document, EngineError> {
    let coll = collection_name(req, body)?;
    let ns = format!("{}.{coll}", req.db);
    let specs: Vec<Document> = {
        let data = svc.data();
        let cat = lock(&data);
        let Some(c) = cat.collection(&req.db, &coll) else {
            return Err(err(
                ErrorCode::NamespaceNotFound,
                format!("ns does not exist: {ns}"),
            ));
        };
        c.indexes().iter().map(|i| i.spec.clone()).collect()
    };
    Ok(cursor_reply(svc, ns, specs, usize::MAX, true))
}

pub(super) fn drop_indexes(
    svc: &ShardService,
    req: &CommandRequest,
    body: &Document,
) -> Result<Document, EngineError> {
    let coll = collection_name(req, body)?;
    let ns = format!("{}.{coll}", req.db);
    let data = svc.data();
    let mut cat = lock(&data);
    let Some(c) = cat.existing_mut(&req.db, &coll) else {
        return Err(err(
            ErrorCode::NamespaceNotFound,
            format!("ns not found {ns}"),
        ));
    };
    let was = c.indexes().len() as i32;
    match body.get("index") {
        Some(Bson::String(s)) if s == "*" => c.drop_all_indexes(),
        Some(Bson::Array(names)) => {
            for n in names {
                c.drop_index(n)?;
            }
        }
        Some(which) => c.drop_index(which)?,
        None => {
            return Err(err(
                ErrorCode(40414),
                "BSON field 'dropIndexes.index' is missing but a required field",
            ))
        }
    }
    Ok(doc! {"nIndexesWas": was})
}
