//! Collections and databases: `create`, `drop`, `listCollections`, `listDatabases`,
//! `collStats`, `dbStats`.

use bson::{doc, Document};

use super::reads::cursor_reply;
use super::{collection_name, err};
use crate::command::CommandRequest;
use crate::embedded::service::{lock, ShardService};
use crate::embedded::store::Collection;
use crate::embedded::views;
use crate::engine::matcher::Matcher;
use crate::engine::reads::document_argument;
use crate::engine::EngineError;
use crate::value::error_codes::ErrorCode;
use crate::value::field::truthy;

pub(super) fn create(
    svc: &ShardService,
    req: &CommandRequest,
    body: &Document,
) -> Result<Document, EngineError> {
    let coll = collection_name(req, body)?;
    let data = svc.data();
    let mut cat = lock(&data);
    if cat.collection(&req.db, &coll).is_some() {
        return Err(err(
            ErrorCode::NamespaceExists,
            format!("Collection {}.{coll} already exists.", req.db),
        ));
    }
    let options = if body.contains_key("viewOn") || body.contains_key("pipeline") {
        let options = views::parse_definition("create", body)?;
        views::check_graph(&cat, &req.db, &coll, &options)?;
        options
    } else {
        let mut options = Document::new();
        for (k, v) in body {
            if k != "create" && !crate::command::GENERIC_ARGUMENTS.contains(&k.as_str()) {
                options.insert(k.clone(), v.clone());
            }
        }
        options
    };
    cat.dbs
        .entry(req.db.clone())
        .or_default()
        .insert(coll, Collection::new(options));
    Ok(Document::new())
}

pub(super) fn drop_collection(
    svc: &ShardService,
    req: &CommandRequest,
    body: &Document,
) -> Result<Document, EngineError> {
    let coll = collection_name(req, body)?;
    let ns = format!("{}.{coll}", req.db);
    let data = svc.data();
    let mut cat = lock(&data);
    let removed = cat
        .dbs
        .get_mut(&req.db)
        .and_then(|colls| colls.remove(&coll));
    if cat.dbs.get(&req.db).is_some_and(|c| c.is_empty()) {
        cat.dbs.remove(&req.db);
    }
    drop_cursors(svc, &ns);
    Ok(match removed {
        Some(c) if views::is_view(&c) => Document::new(),
        Some(c) => doc! {"nIndexesWas": c.indexes().len() as i32, "ns": ns},
        None => Document::new(),
    })
}

fn drop_cursors(svc: &ShardService, ns: &str) {
    svc.cursors.drop_namespace(ns);
}

pub(super) fn list_collections(
    svc: &ShardService,
    req: &CommandRequest,
    body: &Document,
) -> Result<Document, EngineError> {
    let filter = document_argument(body, "filter", "listCollections")?;
    let matcher = Matcher::parse(&filter)?;
    let name_only = body.get("nameOnly").is_some_and(truthy);
    let data = svc.data();
    let cat = lock(&data);
    let mut out = Vec::new();
    if let Some(colls) = cat.dbs.get(&req.db) {
        for (name, c) in colls {
            let d = if views::is_view(c) {
                view_entry(name, &c.options, name_only)
            } else {
                crate::engine::reads::collection_entry(name, &c.options, c.uuid, name_only)
            };
            if matcher.matches(&d) {
                out.push(d);
            }
        }
    }
    drop(cat);
    Ok(cursor_reply(
        svc,
        format!("{}.$cmd.listCollections", req.db),
        out,
        usize::MAX,
        true,
    ))
}

/// A view as `listCollections` lists it: read-only, no UUID, no `_id` index.
fn view_entry(name: &str, options: &Document, name_only: bool) -> Document {
    if name_only {
        return doc! {"name": name, "type": "view"};
    }
    doc! {"name": name, "type": "view", "options": options.clone(), "info": {"readOnly": true}}
}

pub(super) fn list_databases(svc: &ShardService, body: &Document) -> Result<Document, EngineError> {
    let filter = document_argument(body, "filter", "listDatabases")?;
    let matcher = Matcher::parse(&filter)?;
    let name_only = body.get("nameOnly").is_some_and(truthy);
    let data = svc.data();
    let cat = lock(&data);
    let mut dbs = Vec::new();
    let mut total = 0i64;
    for (name, colls) in &cat.dbs {
        let size: i64 = colls.values().map(|c| c.data_size() as i64).sum();
        let d = if name_only {
            doc! {"name": name}
        } else {
            doc! {"name": name, "sizeOnDisk": size, "empty": colls.values().all(|c| c.is_empty())}
        };
        if matcher.matches(&d) {
            total += size;
            dbs.push(d);
        }
    }
    let mut reply = doc! {"databases": dbs};
    if !name_only {
        reply.insert("totalSize", total);
        reply.insert("totalSizeMb", total / (1024 * 1024));
    }
    Ok(reply)
}

pub(super) fn coll_stats(
    svc: &ShardService,
    req: &CommandRequest,
    body: &Document,
) -> Result<Document, EngineError> {
    let coll = collection_name(req, body)?;
    let ns = format!("{}.{coll}", req.db);
    let data = svc.data();
    let cat = lock(&data);
    let (count, size, nindexes) = match cat.collection(&req.db, &coll) {
        Some(c) => (
            c.len() as i64,
            c.data_size() as i64,
            c.indexes().len() as i32,
        ),
        None => (0, 0, 0),
    };
    Ok(crate::engine::reads::coll_stats_reply(
        &ns, count, size, nindexes,
    ))
}

pub(super) fn db_stats(svc: &ShardService, req: &CommandRequest) -> Result<Document, EngineError> {
    let data = svc.data();
    let cat = lock(&data);
    let (mut colls, mut objects, mut size, mut indexes) = (0i64, 0i64, 0i64, 0i64);
    if let Some(db) = cat.dbs.get(&req.db) {
        for c in db.values() {
            colls += 1;
            objects += c.len() as i64;
            size += c.data_size() as i64;
            indexes += c.indexes().len() as i64;
        }
    }
    Ok(crate::engine::reads::db_stats_reply(
        &req.db, colls, objects, size, indexes,
    ))
}
