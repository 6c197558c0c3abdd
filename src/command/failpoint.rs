//! MongoDB's `failCommand` fail point, shared by every server that runs with test commands
//! enabled (the router, as mongos implements it on itself, and the embedded shard, as mongod):
//! `configureFailPoint` parsed and recorded here, and the action it takes on a matching
//! command (block, close the connection, fail with a code and labels, or add a
//! `writeConcernError`) decided here; each server only carries the action out.

use std::sync::Mutex;
use std::time::Duration;

use bson::{doc, Bson, Document};

use super::{ClientState, CommandError};
use crate::sync::lock;
use crate::value::error_codes::ErrorCode;
use crate::value::field::{number_field, truthy};

/// Error codes a retryable write may be retried on: a failure with one of them carries the
/// `RetryableWriteError` label when the command was a retryable write (or a transaction's
/// commit or abort), as mongod and mongos add it.
pub const RETRYABLE_CODES: &[i32] = &[
    6, 7, 89, 91, 189, 262, 9001, 10107, 11600, 11602, 13435, 13436, 50915,
];

/// The commands only tests may send: refused as unknown (59) unless the server was started
/// with test commands enabled.
pub const TEST_ONLY_COMMANDS: &[&str] = &["configureFailPoint", "sluiceSetLatency"];

/// What a `failCommand` fail point does to the commands it names.
#[derive(Debug, Clone, PartialEq)]
pub struct FailCommand {
    /// `None`: always on; `Some(n)`: n more times.
    times: Option<u64>,
    commands: Vec<String>,
    /// Close the connection without a reply.
    pub close_connection: bool,
    /// Fail with this code.
    pub error_code: Option<i32>,
    /// `errorLabels` given with the fail point (they replace the server's own).
    pub error_labels: Option<Vec<Bson>>,
    /// Wait this long first.
    pub block: Option<Duration>,
    /// Run the command, then add this `writeConcernError` to its reply.
    pub write_concern_error: Option<Document>,
    app_name: Option<String>,
}

/// One server's `failCommand` fail point.
#[derive(Debug, Default)]
pub struct FailPoints {
    current: Mutex<Option<FailCommand>>,
}

/// Whether a command is one whose failure may be retried by a driver (a retryable write, or
/// a transaction's commit or abort): the cases that get `RetryableWriteError`.
pub fn is_retryable_command(name: &str, body: &Document) -> bool {
    matches!(name, "commitTransaction" | "abortTransaction")
        || (body.contains_key("txnNumber")
            && !body.contains_key("startTransaction")
            && !matches!(body.get("autocommit"), Some(Bson::Boolean(false))))
}

/// Whether a command belongs to a transaction (`txnNumber` with `autocommit`, or a commit or
/// abort), where the servers' transaction labels apply.
pub fn in_transaction(name: &str, body: &Document) -> bool {
    body.contains_key("txnNumber")
        && (body.contains_key("autocommit")
            || matches!(name, "commitTransaction" | "abortTransaction"))
}

impl FailPoints {
    /// `configureFailPoint: "failCommand"`: `mode` `alwaysOn`, `off` or `{times: n}`, and
    /// `data` with `failCommands` (required), `errorCode`, `closeConnection`,
    /// `blockConnection`/`blockTimeMS`, `writeConcernError`, `errorLabels`, `appName`.
    /// Replies `{count}`: how many fail points were on before.
    pub fn configure(&self, body: &Document) -> Result<Document, CommandError> {
        let name = body.get_str("configureFailPoint").unwrap_or("");
        if name != "failCommand" {
            return Err(CommandError::new(
                ErrorCode::BadValue,
                format!("Cannot find failpoint: {name}"),
            ));
        }
        let mut guard = lock(&self.current);
        let previously = guard.is_some() as i32;
        let times = match body.get("mode") {
            Some(Bson::String(m)) if m == "off" => {
                *guard = None;
                return Ok(doc! {"count": previously});
            }
            Some(Bson::String(m)) if m == "alwaysOn" => None,
            Some(Bson::Document(m)) => match number_field(m, "times") {
                Some(n) if n > 0 => Some(n as u64),
                Some(_) => {
                    *guard = None;
                    return Ok(doc! {"count": previously});
                }
                None => {
                    return Err(CommandError::new(
                        ErrorCode::BadValue,
                        "mode: { times: <n> } is the only document mode supported",
                    ))
                }
            },
            _ => {
                return Err(CommandError::new(
                    ErrorCode::BadValue,
                    "mode must be \"alwaysOn\", \"off\" or {times: <n>}",
                ))
            }
        };
        let data = body.get_document("data").cloned().unwrap_or_default();
        let commands: Vec<String> = match data.get("failCommands") {
            Some(Bson::Array(items)) => items
                .iter()
                .filter_map(|v| v.as_str().map(|s| s.to_string()))
                .collect(),
            _ => {
                return Err(CommandError::new(
                    ErrorCode::BadValue,
                    "data.failCommands must be an array of command names",
                ))
            }
        };
        let block = data.get("blockConnection").is_some_and(truthy).then(|| {
            Duration::from_millis(number_field(&data, "blockTimeMS").unwrap_or(0).max(0) as u64)
        });
        *guard = Some(FailCommand {
            times,
            commands,
            close_connection: data.get("closeConnection").is_some_and(truthy),
            error_code: number_field(&data, "errorCode").map(|c| c as i32),
            error_labels: data.get_array("errorLabels").ok().cloned(),
            block,
            write_concern_error: data.get_document("writeConcernError").ok().cloned(),
            app_name: data.get_str("appName").ok().map(|s| s.to_string()),
        });
        Ok(doc! {"count": previously})
    }

    /// The fail point's action for this command from this client, consuming one of its
    /// `times`; `None` when it does not apply.
    pub fn fire(&self, client: &ClientState, name: &str) -> Option<FailCommand> {
        let mut guard = lock(&self.current);
        let fp = guard.as_mut()?;
        if !fp.commands.iter().any(|c| c == name) {
            return None;
        }
        if let Some(app) = &fp.app_name {
            let client_app = client
                .client_metadata
                .as_ref()
                .and_then(|m| m.get_document("application").ok())
                .and_then(|a| a.get_str("name").ok());
            if client_app != Some(app.as_str()) {
                return None;
            }
        }
        let fired = fp.clone();
        if let Some(t) = fp.times.as_mut() {
            *t -= 1;
            if *t == 0 {
                *guard = None;
            }
        }
        Some(fired)
    }
}

impl FailCommand {
    /// The error the command fails with (after any block), with its labels: the fail point's
    /// own, or `RetryableWriteError` for a retryable code on a retryable command.
    pub fn error(&self, name: &str, body: &Document) -> Option<CommandError> {
        let code = self.error_code?;
        let mut e = CommandError::new(
            ErrorCode(code),
            "Failing command via 'failCommand' failpoint",
        );
        e.labels = self.labels(name, body, code, false);
        Some(e)
    }

    /// The fail point's own labels, or those the server gives: `TransientTransactionError`
    /// for a transaction's command failing with a transient code (not for a
    /// `writeConcernError`, `from_wce`), else `RetryableWriteError` for a retryable code on a
    /// retryable command.
    fn labels(&self, name: &str, body: &Document, code: i32, from_wce: bool) -> Vec<String> {
        use crate::backend::topology::retry;
        match &self.error_labels {
            Some(l) => l
                .iter()
                .filter_map(|v| v.as_str().map(|s| s.to_string()))
                .collect(),
            None if !from_wce
                && in_transaction(name, body)
                && retry::is_transient_transaction_error(
                    code,
                    false,
                    matches!(name, "commitTransaction" | "abortTransaction"),
                ) =>
            {
                vec![retry::TRANSIENT_TRANSACTION_ERROR.to_string()]
            }
            None if is_retryable_command(name, body) && RETRYABLE_CODES.contains(&code) => {
                vec!["RetryableWriteError".to_string()]
            }
            None => Vec::new(),
        }
    }

    /// Adds the fail point's `writeConcernError` to a reply, with the labels it implies
    /// (`RetryableWriteError` for a retryable code on a retryable command, or the fail point's
    /// own `errorLabels`).
    pub fn decorate(&self, name: &str, body: &Document, reply: &mut Document) {
        let Some(wce) = &self.write_concern_error else {
            return;
        };
        reply.insert("writeConcernError", wce.clone());
        let code = wce.get_i32("code").unwrap_or(0);
        let labels = self.labels(name, body, code, true);
        if !labels.is_empty() {
            reply.insert("errorLabels", labels);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client() -> ClientState {
        ClientState::new(1, "127.0.0.1:1".parse().unwrap())
    }

    #[test]
    fn times_alwayson_off_and_actions() {
        let fps = FailPoints::default();
        let r = fps
            .configure(&doc! {"configureFailPoint": "failCommand", "mode": {"times": 2}, "data": {"failCommands": ["insert"], "errorCode": 91}})
            .unwrap();
        assert_eq!(r, doc! {"count": 0});
        let c = client();
        assert!(fps.fire(&c, "find").is_none());
        let fired = fps.fire(&c, "insert").unwrap();
        let e = fired
            .error("insert", &doc! {"insert": "c", "txnNumber": 1i64})
            .unwrap();
        assert_eq!(e.code.0, 91);
        assert_eq!(e.labels, vec!["RetryableWriteError".to_string()]);
        assert!(fired
            .error("insert", &doc! {"insert": "c"})
            .unwrap()
            .labels
            .is_empty());
        assert!(fps.fire(&c, "insert").is_some());
        assert!(fps.fire(&c, "insert").is_none(), "two times only");
        fps.configure(&doc! {"configureFailPoint": "failCommand", "mode": "alwaysOn", "data": {"failCommands": ["update"], "writeConcernError": {"code": 91, "errmsg": "x"}}})
            .unwrap();
        let fired = fps.fire(&c, "update").unwrap();
        let mut reply = doc! {"n": 1};
        fired.decorate(
            "update",
            &doc! {"update": "c", "txnNumber": 2i64},
            &mut reply,
        );
        assert_eq!(reply.get_array("errorLabels").unwrap().len(), 1);
        assert!(reply.contains_key("writeConcernError"));
        let r = fps
            .configure(&doc! {"configureFailPoint": "failCommand", "mode": "off"})
            .unwrap();
        assert_eq!(r, doc! {"count": 1});
        assert!(fps.fire(&c, "update").is_none());
        let e = fps
            .configure(&doc! {"configureFailPoint": "nope", "mode": "off"})
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::BadValue);
    }
}
