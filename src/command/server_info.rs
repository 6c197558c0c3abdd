//! Commands about the server itself: `buildInfo`, `getParameter`, `getLog`,
//! `connectionStatus`, `endSessions`, `getCmdLineOpts`, `serverStatus`, and the checks of
//! `shutdown` (each server acts on it its own way).
//!
//! Shapes follow mongos: mongosh reads `buildInfo.version` for its banner,
//! `getParameter.featureCompatibilityVersion.version`, and `getLog("startupWarnings").log`
//! (empty: no banner). `buildInfo` also carries a `sluice` field with Sluice's own version,
//! the one place where a client can tell Sluice from mongos.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bson::{doc, Bson, Document};

use super::{CommandError, CommandRequest, ServerState, GENERIC_ARGUMENTS};
use crate::value::error_codes::ErrorCode;
use crate::wire::{Compressor, MAX_BSON_OBJECT_SIZE};

/// The MongoDB version Sluice presents (drivers and mongosh gate features on it).
pub const MONGODB_VERSION: &str = "8.0.4";
/// The same, as `versionArray`.
pub const MONGODB_VERSION_ARRAY: [i32; 4] = [8, 0, 4, 0];
/// The feature compatibility version reported by `getParameter`.
pub const FEATURE_COMPATIBILITY_VERSION: &str = "8.0";

/// `buildInfo`.
pub fn build_info() -> Document {
    doc! {
        "version": MONGODB_VERSION,
        "gitVersion": "sluice",
        "modules": [],
        "allocator": "system",
        "javascriptEngine": "none",
        "sysInfo": "deprecated",
        "versionArray": MONGODB_VERSION_ARRAY.to_vec(),
        "openssl": {"running": "disabled"},
        "buildEnvironment": {
            "target_os": std::env::consts::OS,
            "target_arch": std::env::consts::ARCH,
        },
        "bits": 64,
        "debug": cfg!(debug_assertions),
        "maxBsonObjectSize": MAX_BSON_OBJECT_SIZE as i32,
        "storageEngines": [],
        "sluice": {"version": env!("CARGO_PKG_VERSION")},
    }
}

/// The settings of this process that `getParameter` reports beside the constant ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parameters {
    /// `enableTestCommands`: whether test-only commands are accepted.
    pub enable_test_commands: bool,
    /// Bytes a blocking aggregation stage may hold without `allowDiskUse`
    /// (`internalQueryMaxBlockingSortMemoryUsageBytes`,
    /// `internalDocumentSourceGroupMaxMemoryBytes`).
    pub stage_memory_bytes: usize,
}

impl Parameters {
    /// The parameters of a server started with `config`.
    pub fn of(config: &crate::config::Config) -> Parameters {
        Parameters {
            enable_test_commands: config.enable_test_commands,
            stage_memory_bytes: config.stage_memory_bytes,
        }
    }
}

/// The server parameters `getParameter` knows.
fn parameter(name: &str, params: &Parameters) -> Option<Bson> {
    Some(match name {
        "enableTestCommands" => Bson::Boolean(params.enable_test_commands),
        "internalQueryMaxBlockingSortMemoryUsageBytes" => {
            Bson::Int64(params.stage_memory_bytes as i64)
        }
        "internalDocumentSourceGroupMaxMemoryBytes" => {
            Bson::Int64(params.stage_memory_bytes as i64)
        }
        "featureCompatibilityVersion" => {
            Bson::Document(doc! {"version": FEATURE_COMPATIBILITY_VERSION})
        }
        "logLevel" => Bson::Int32(0),
        "authenticationMechanisms" => Bson::Array(vec![]),
        "maxBSONDepth" => Bson::Int32(200),
        "localLogicalSessionTimeoutMinutes" => {
            Bson::Int32(super::hello::LOGICAL_SESSION_TIMEOUT_MINUTES)
        }
        "internalQueryMaxPushBytes" => Bson::Int32(100 * 1024 * 1024),
        _ => return None,
    })
}

const ALL_PARAMETERS: &[&str] = &[
    "authenticationMechanisms",
    "enableTestCommands",
    "featureCompatibilityVersion",
    "internalDocumentSourceGroupMaxMemoryBytes",
    "internalQueryMaxBlockingSortMemoryUsageBytes",
    "internalQueryMaxPushBytes",
    "localLogicalSessionTimeoutMinutes",
    "logLevel",
    "maxBSONDepth",
];

/// `getParameter`: `{getParameter: 1, <name>: 1, …}`, or `"*"` / `{allParameters: true}`.
pub fn get_parameter(req: &CommandRequest, params: &Parameters) -> Result<Document, CommandError> {
    let body = req.body_document();
    let all = match body.get("getParameter") {
        Some(Bson::String(s)) => s == "*",
        Some(Bson::Document(d)) => d.get_bool("allParameters").unwrap_or(false),
        _ => false,
    };
    let mut out = Document::new();
    if all {
        for name in ALL_PARAMETERS {
            if let Some(v) = parameter(name, params) {
                out.insert(*name, v);
            }
        }
        return Ok(out);
    }
    for key in body.keys() {
        if key == "getParameter" || GENERIC_ARGUMENTS.contains(&key.as_str()) {
            continue;
        }
        if let Some(v) = parameter(key, params) {
            out.insert(key.clone(), v);
        }
    }
    if out.is_empty() {
        return Err(CommandError::new(
            ErrorCode::InvalidOptions,
            "no option found to get",
        ));
    }
    Ok(out)
}

/// `getLog`: the router keeps no in-memory log, so the lists are empty.
pub fn get_log(req: &CommandRequest) -> Result<Document, CommandError> {
    let body = req.body_document();
    match body.get("getLog") {
        Some(Bson::String(s)) if s == "*" => Ok(doc! {"names": ["global", "startupWarnings"]}),
        Some(Bson::String(s)) if s == "global" || s == "startupWarnings" => {
            Ok(doc! {"totalLinesWritten": 0, "log": []})
        }
        Some(Bson::String(s)) => Err(CommandError::new(
            ErrorCode::NoSuchKey,
            format!("No log named '{s}'"),
        )),
        _ => Err(CommandError::new(
            ErrorCode::TypeMismatch,
            "Argument to getLog must be of type String",
        )),
    }
}

/// `connectionStatus`: no authentication yet, so no users.
pub fn connection_status(req: &CommandRequest) -> Document {
    let body = req.body_document();
    let mut auth = doc! {"authenticatedUsers": [], "authenticatedUserRoles": []};
    if body
        .get("showPrivileges")
        .is_some_and(crate::value::field::truthy)
    {
        auth.insert("authenticatedUserPrivileges", Bson::Array(vec![]));
    }
    doc! {"authInfo": auth}
}

/// `endSessions`: the router keeps no session state of its own yet.
pub fn end_sessions(req: &CommandRequest) -> Result<Document, CommandError> {
    match req.body_document().get("endSessions") {
        Some(Bson::Array(_)) => Ok(Document::new()),
        _ => Err(CommandError::new(
            ErrorCode::TypeMismatch,
            "BSON field 'endSessions.endSessions' is the wrong type, expected type 'array'",
        )),
    }
}

/// `getCmdLineOpts`.
pub fn get_cmd_line_opts(state: &Arc<ServerState>) -> Document {
    let (ip, port) = state
        .config
        .listen
        .rsplit_once(':')
        .map(|(h, p)| (h.to_string(), p.parse::<i32>().unwrap_or(0)))
        .unwrap_or_default();
    doc! {
        "argv": state.argv.clone(),
        "parsed": {"net": {"bindIp": ip, "port": port, "maxIncomingConnections": state.config.max_connections as i64}},
    }
}

/// `serverStatus`: router-level sections.
pub fn server_status(state: &Arc<ServerState>) -> Document {
    let c = &state.counters;
    let uptime = state.started.elapsed();
    let current = c.connections_current.load(Ordering::Relaxed);
    let available = state.config.max_connections as i64 - current;
    let mut compression = Document::new();
    for comp in Compressor::SUPPORTED {
        if let Some(k) = c.compression_for(comp) {
            compression.insert(
                comp.name(),
                doc! {
                    "compressor": {
                        "bytesIn": k.compressor_in.load(Ordering::Relaxed) as i64,
                        "bytesOut": k.compressor_out.load(Ordering::Relaxed) as i64,
                    },
                    "decompressor": {
                        "bytesIn": k.decompressor_in.load(Ordering::Relaxed) as i64,
                        "bytesOut": k.decompressor_out.load(Ordering::Relaxed) as i64,
                    },
                },
            );
        }
    }
    doc! {
        "host": hostname(),
        "version": MONGODB_VERSION,
        "process": "mongos",
        "pid": std::process::id() as i64,
        "uptime": uptime.as_secs_f64(),
        "uptimeMillis": uptime.as_millis() as i64,
        "uptimeEstimate": uptime.as_secs() as i64,
        "localTime": bson::DateTime::now(),
        "connections": {
            "current": current as i32,
            "available": available.max(0) as i32,
            "totalCreated": c.connections_total.load(Ordering::Relaxed) as i32,
            "rejected": c.connections_rejected.load(Ordering::Relaxed) as i32,
        },
        "network": {
            "bytesIn": c.bytes_in.load(Ordering::Relaxed) as i64,
            "bytesOut": c.bytes_out.load(Ordering::Relaxed) as i64,
            "numRequests": c.requests.load(Ordering::Relaxed) as i64,
            "compression": compression,
        },
        "opcounters": {
            "insert": c.op_insert.load(Ordering::Relaxed),
            "query": c.op_query.load(Ordering::Relaxed),
            "update": c.op_update.load(Ordering::Relaxed),
            "delete": c.op_delete.load(Ordering::Relaxed),
            "getmore": c.op_getmore.load(Ordering::Relaxed),
            "command": c.op_command.load(Ordering::Relaxed),
        },
        "sluice": {"version": env!("CARGO_PKG_VERSION")},
    }
}

/// The machine's host name (for `serverStatus.host` and `config.mongos`).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(body: Document) -> CommandRequest {
        CommandRequest::from_document("admin", &body).unwrap()
    }

    #[test]
    fn get_parameter_fcv() {
        let params = Parameters::of(&crate::config::Config::default());
        let r = get_parameter(
            &req(doc! {"getParameter": 1, "featureCompatibilityVersion": 1, "$db": "admin"}),
            &params,
        )
        .unwrap();
        assert_eq!(
            r.get_document("featureCompatibilityVersion")
                .unwrap()
                .get_str("version")
                .unwrap(),
            "8.0"
        );
        let all = get_parameter(&req(doc! {"getParameter": "*"}), &params).unwrap();
        assert!(all.contains_key("featureCompatibilityVersion"));
        assert!(!all.get_bool("enableTestCommands").unwrap());
        let on = Parameters {
            enable_test_commands: true,
            ..params
        };
        let r =
            get_parameter(&req(doc! {"getParameter": 1, "enableTestCommands": 1}), &on).unwrap();
        assert!(r.get_bool("enableTestCommands").unwrap());
        let err = get_parameter(&req(doc! {"getParameter": 1, "nope": 1}), &params).unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidOptions);
    }

    #[test]
    fn get_log_startup_warnings_is_empty() {
        let r = get_log(&req(doc! {"getLog": "startupWarnings"})).unwrap();
        assert!(r.get_array("log").unwrap().is_empty());
        assert!(get_log(&req(doc! {"getLog": 1})).is_err());
    }

    #[test]
    fn build_info_names_sluice() {
        let b = build_info();
        assert_eq!(b.get_str("version").unwrap(), MONGODB_VERSION);
        assert!(b.get_document("sluice").unwrap().contains_key("version"));
    }
}

/// What a `shutdown` command asks for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShutdownRequest {
    /// `force`: shut down even when a primary cannot hand over to a caught-up secondary.
    pub force: bool,
    /// `timeoutSecs`: how long a primary waits for a secondary to catch up (mongod's default
    /// since 5.0 is 15 s).
    pub timeout: std::time::Duration,
}

/// mongod's and mongos's default `timeoutSecs` for `shutdown`.
pub const SHUTDOWN_TIMEOUT_SECS: i64 = 15;

/// Checks a `shutdown` command as mongod and mongos do before acting on it: on `admin` only
/// (13), from a loopback client when the server runs without authorization (13, mongod's
/// `localHostOnlyIfNoAuth`), `force` a boolean and `timeoutSecs` a number (14, the command
/// parser's messages).
pub fn shutdown_request(
    state: &ServerState,
    peer: std::net::SocketAddr,
    req: &CommandRequest,
) -> Result<ShutdownRequest, CommandError> {
    req.require_admin()?;
    if state.config.security.authorization == crate::config::Authorization::Disabled
        && !peer.ip().is_loopback()
    {
        return Err(CommandError::new(
            ErrorCode::Unauthorized,
            "shutdown must run from localhost when running db without auth",
        ));
    }
    let body = req.body_document();
    let wrong = |field: &str, v: &Bson, expected: &str| {
        CommandError::new(
            ErrorCode::TypeMismatch,
            format!(
                "BSON field 'shutdown.{field}' is the wrong type '{}', expected type{expected}",
                crate::value::field::type_name(v)
            ),
        )
    };
    let force = match body.get("force") {
        None | Some(Bson::Null) => false,
        Some(Bson::Boolean(b)) => *b,
        Some(v) => return Err(wrong("force", v, " 'bool'")),
    };
    let secs = match body.get("timeoutSecs") {
        None | Some(Bson::Null) => SHUTDOWN_TIMEOUT_SECS,
        Some(Bson::Int32(n)) => i64::from(*n),
        Some(Bson::Int64(n)) => *n,
        Some(Bson::Double(d)) if d.is_finite() => *d as i64,
        Some(v) => return Err(wrong("timeoutSecs", v, "s '[long, int, decimal, double]'")),
    };
    Ok(ShutdownRequest {
        force,
        timeout: std::time::Duration::from_secs(secs.max(0) as u64),
    })
}
