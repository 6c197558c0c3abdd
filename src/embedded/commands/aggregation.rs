//! `aggregate`, including collection-less `$documents` pipelines and `$out` / `$merge`.

use bson::{Bson, Document};

use super::err;
use super::reads::{cursor_reply, matching_documents};
use crate::command::CommandRequest;
use crate::embedded::service::ShardService;
use crate::embedded::store::check_namespace;
use crate::engine::aggregate;
use crate::engine::matcher::Matcher;
use crate::engine::reads::{
    count_argument, request_variables, starts_with_documents, DEFAULT_BATCH,
};
use crate::engine::EngineError;
use crate::value::error_codes::ErrorCode;
use crate::value::field::truthy;

pub(super) fn aggregate_cmd(
    svc: &ShardService,
    req: &CommandRequest,
    body: &Document,
) -> Result<Document, EngineError> {
    let coll = match body.get("aggregate") {
        Some(Bson::String(s)) => {
            check_namespace(&req.db, s)?;
            s.clone()
        }
        Some(Bson::Int32(1)) | Some(Bson::Int64(1)) | Some(Bson::Double(_))
            if starts_with_documents(body) =>
        {
            "$cmd.aggregate".to_string()
        }
        Some(Bson::Int32(1)) | Some(Bson::Int64(1)) | Some(Bson::Double(_)) => return Err(err(
            ErrorCode::InvalidNamespace,
            "collection-less aggregations ({aggregate: 1}) are supported by the embedded shard only with $documents",
        )),
        _ => {
            return Err(err(
                ErrorCode::InvalidNamespace,
                "Invalid collection name specified",
            ))
        }
    };
    let Ok(pipeline) = body.get_array("pipeline") else {
        return Err(err(
            ErrorCode::TypeMismatch,
            "'pipeline' option must be specified as an array",
        ));
    };
    let cursor_opts =
        match body.get("cursor") {
            Some(Bson::Document(c)) => c.clone(),
            _ if body.get("explain").is_some_and(truthy) => Document::new(),
            _ => return Err(err(
                ErrorCode::FailedToParse,
                "The 'cursor' option is required, except for aggregate with the explain argument",
            )),
        };
    let ns = format!("{}.{coll}", req.db);
    svc.check_version(&ns, body)?;
    let vars = request_variables(body)?;
    let coll_less = coll == "$cmd.aggregate";
    let (stages, output) = crate::engine::output::split_output(pipeline, &req.db)?;
    if let Some(o) = &output {
        o.check_read_concern(body)?;
    }
    let docs = if coll_less {
        Vec::new()
    } else {
        matching_documents(svc, &req.db, &coll, &Document::new(), &Matcher::all())?
    };
    let options = aggregate::AggregateOptions::for_request(svc.stage_memory(), body);
    let reader = crate::embedded::pipeline_output::CatalogReader(svc);
    let env = aggregate::Env {
        db: req.db.clone(),
        vars,
        namespaces: Some(&reader),
    };
    let out = crate::sync::off_the_worker(|| aggregate::run_in(stages, docs, &options, &env))?;
    svc.bump_opcounter("command", 1);
    if let Some(stage) = output {
        crate::embedded::pipeline_output::write(svc, &stage, out, &env.vars)?;
        return Ok(cursor_reply(svc, ns, Vec::new(), 0, false));
    }
    let batch = count_argument(&cursor_opts, "batchSize")?.unwrap_or(DEFAULT_BATCH);
    Ok(cursor_reply(svc, ns, out, batch, false))
}
