//! The connection's side of security: the process-wide [`Security`] (users, the keyfile's
//! `__system` credentials, whether authorization is on, the listener's TLS) and the one hook
//! every request passes through before and after the service answers it ([`Security::before`],
//! [`Security::after`]).
//!
//! Before: an admin-only command on another database is refused (always, as mongod does);
//! with authorization enabled the command is checked against the connection's user (13
//! Unauthorized with mongod's message), and so is the owner of a `getMore`'s or
//! `killCursors`'s cursor ([`CursorOwners`]); then the authentication commands (`saslStart`,
//! `saslContinue`, `authenticate`, `logout`) and the user-management commands (`createUser`,
//! `updateUser`, `dropUser`, `dropAllUsersFromDatabase`, `usersInfo`) are answered here, since
//! they concern the connection and the users file, not the service. After: the `hello` family
//! gets `saslSupportedMechs` and `speculativeAuthenticate`, `connectionStatus` the connection's
//! `authInfo`, `listDatabases` only the user's databases, and every cursor handed out is
//! recorded with its user. With no `[security]` configured nothing is checked and no user exists, so a
//! client without credentials sees exactly what it saw before.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use bson::{Bson, Document, RawDocument};

use crate::auth::authorize::{
    authorize, bypasses_document_validation, check_admin_only, list_databases_filter, CommandView,
    DatabaseFilter,
};
use crate::auth::credentials::{UserDocument, UsersFile};
use crate::auth::cursors::CursorOwners;
use crate::auth::custom_roles::{RoleDocument, RoleGraph};
use crate::auth::keyfile::{InternalCredentials, KeyFile};
use crate::auth::roles::{Principal, RoleName};
use crate::auth::scram::{ScramCredential, ScramMechanism};
use crate::auth::session::{AuthSession, Outcome, UserLookup};
use crate::auth::user_cache::{CacheCounts, ResolvedUser, UserCache};
use crate::auth::{role_admin, tls, user_admin, AuthError, UserName};
use crate::command::service::UserStore;
use crate::command::{self, CommandError, CommandRequest, ServerState};
use crate::config::{Authorization, Config};
use crate::sync::lock;
use crate::wire::Reply;

/// The security of one listener, built once from the configuration.
pub struct Security {
    authorization: bool,
    users: Mutex<UsersFile>,
    users_path: Option<PathBuf>,
    roles_path: Option<PathBuf>,
    /// Where else the users live (the service's own collections, or a config server).
    store: OnceLock<UserStore>,
    /// How often users held by another server are read again.
    refresh_interval: Duration,
    /// Held while a user an authentication request names is fetched from the config server,
    /// so that such reads run one at a time.
    on_demand: tokio::sync::Mutex<()>,
    /// Bumped on every change of the users or roles, always with `users` locked, so
    /// connections re-read their user and `resolved` drops what it holds.
    generation: AtomicU64,
    /// The users authenticated since the last change, resolved into their privileges and
    /// restrictions (one resolution per user, not per connection).
    resolved: Mutex<UserCache>,
    internal: Option<InternalCredentials>,
    tls: Option<(tls::TlsMode, tokio_rustls::TlsAcceptor)>,
    /// Who opened each open cursor (kept with authorization enabled).
    cursors: CursorOwners,
    /// This server's own certificate subject, whose `O`, `OU` and `DC` name the cluster's
    /// members, and whether members may authenticate by certificate (`clusterAuthMode`).
    cluster: Option<(crate::auth::x509::X509Name, bool)>,
}

impl std::fmt::Debug for Security {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Security")
            .field("authorization", &self.authorization)
            .field("users_path", &self.users_path)
            .field("keyfile", &self.internal.is_some())
            .field("tls", &self.tls.as_ref().map(|(m, _)| *m))
            .finish()
    }
}

fn read_file(path: &str, what: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read {what} {path}: {e}"))
}

impl Security {
    /// Reads the users file, the keyfile and the TLS files the configuration names.
    pub fn from_config(config: &Config) -> Result<Security, String> {
        let sec = &config.security;
        let roles = match &sec.roles_file {
            Some(path) if std::path::Path::new(path).exists() => {
                let text = String::from_utf8(read_file(path, "the roles file")?)
                    .map_err(|_| format!("the roles file {path} is not UTF-8"))?;
                RoleGraph::parse(&text).map_err(|e| format!("the roles file {path}: {e}"))?
            }
            _ => RoleGraph::new(),
        };
        let users = match &sec.users_file {
            Some(path) if std::path::Path::new(path).exists() => {
                let text = String::from_utf8(read_file(path, "the users file")?)
                    .map_err(|_| format!("the users file {path} is not UTF-8"))?;
                UsersFile::parse_with_roles(&text, roles)
                    .map_err(|e| format!("the users file {path}: {e}"))?
            }
            _ => UsersFile::from_parts(Vec::new(), roles),
        };
        let refresh_secs = sec
            .user_cache_invalidation_interval_secs
            .unwrap_or(DEFAULT_USER_CACHE_INVALIDATION_SECS);
        if !(1..=86_400).contains(&refresh_secs) {
            return Err(format!(
                "security.user_cache_invalidation_interval_secs must be between 1 and 86400,                  not {refresh_secs}"
            ));
        }
        let internal = match &sec.key_file {
            Some(path) if sec.cluster_auth_mode.accepts_keyfile() => Some(
                KeyFile::load(std::path::Path::new(path))
                    .and_then(|k| k.internal_credentials())
                    .map_err(|e| e.message)?,
            ),
            _ => None,
        };
        let mut cluster = None;
        let tls = if config.tls.mode.accepts_tls() {
            let Some(cert) = &config.tls.certificate_key_file else {
                return Err("tls.mode needs tls.certificate_key_file".into());
            };
            let cert = read_file(cert, "the certificate key file")?;
            let own = tls::own_subject(&cert).map_err(|e| e.message)?;
            cluster = Some((own, sec.cluster_auth_mode.accepts_x509()));
            let ca = match &config.tls.ca_file {
                Some(p) => Some(read_file(p, "the CA file")?),
                None => None,
            };
            let server = tls::server_config(&tls::ServerTlsSettings {
                certificate_key_pem: &cert,
                ca_pem: ca.as_deref(),
                allow_connections_without_certificates: config
                    .tls
                    .allow_connections_without_certificates,
            })
            .map_err(|e| e.message)?;
            Some((config.tls.mode, tokio_rustls::TlsAcceptor::from(server)))
        } else {
            None
        };
        Ok(Security {
            authorization: sec.authorization == Authorization::Enabled,
            users: Mutex::new(users),
            users_path: sec.users_file.as_ref().map(PathBuf::from),
            roles_path: sec.roles_file.as_ref().map(PathBuf::from),
            store: OnceLock::new(),
            refresh_interval: Duration::from_secs(refresh_secs),
            on_demand: tokio::sync::Mutex::new(()),
            generation: AtomicU64::new(0),
            resolved: Mutex::new(UserCache::new()),
            internal,
            tls,
            cursors: CursorOwners::default(),
            cluster,
        })
    }

    /// The listener's TLS mode and acceptor (`None`: plain only).
    pub fn tls(&self) -> Option<&(tls::TlsMode, tokio_rustls::TlsAcceptor)> {
        self.tls.as_ref()
    }

    /// Whether every command is checked.
    pub fn authorization_enabled(&self) -> bool {
        self.authorization
    }

    /// Keeps the users and roles where they are kept: the users and roles files (each through
    /// a temporary file, fsync and rename, mode 0600), and the service's own collections.
    fn save(&self, users: &UsersFile) -> Result<(), AuthError> {
        if let Some(path) = &self.users_path {
            write_private(path, &users.to_text()).map_err(|e| {
                AuthError::new(
                    crate::value::error_codes::ErrorCode::InternalError,
                    format!("cannot write the users file {}: {e}", path.display()),
                )
            })?;
        }
        if let Some(path) = &self.roles_path {
            write_private(path, &users.roles().to_text()).map_err(|e| {
                AuthError::new(
                    crate::value::error_codes::ErrorCode::InternalError,
                    format!("cannot write the roles file {}: {e}", path.display()),
                )
            })?;
        }
        if let Some(UserStore::Local(sink)) = self.store.get() {
            sink(user_documents(users), users.roles().documents());
        }
        Ok(())
    }

    /// Runs a user- or role-management command; the files are rewritten before the reply
    /// when it changed.
    fn user_admin(&self, req: &CommandRequest, body: &Document) -> Result<Document, AuthError> {
        let mut users = lock(&self.users);
        let before = users.clone();
        let roles_command = role_admin::ROLE_ADMIN_COMMANDS.contains(&req.name.as_str());
        if roles_command
            && role_admin::is_write(&req.name)
            && self.users_path.is_some()
            && self.roles_path.is_none()
        {
            return Err(AuthError::new(
                crate::value::error_codes::ErrorCode::IllegalOperation,
                format!(
                    "{} needs security.roles_file beside security.users_file: a role kept in \
                     memory only would be lost on restart while the users holding it are kept",
                    req.name
                ),
            ));
        }
        let result = if roles_command {
            role_admin::run(&mut users, &req.name, &req.db, body)?
        } else {
            user_admin::run(&mut users, &req.name, &req.db, body)?
        };
        let write = if roles_command {
            role_admin::is_write(&req.name)
        } else {
            user_admin::is_write(&req.name)
        };
        if write {
            if let Err(e) = self.save(&users) {
                *users = before;
                return Err(e);
            }
            self.generation.fetch_add(1, Ordering::Release);
            for (name, _) in &result.changed {
                tracing::info!(user = %name, command = %req.name, "user changed");
            }
            if roles_command {
                tracing::info!(command = %req.name, db = %req.db, "roles changed");
            }
        }
        Ok(result.reply)
    }

    /// Connects the listener to where its service keeps users: mirrors the users into the
    /// service's own collections, or reads them from the config server now and every
    /// [`Security::refresh_interval`] (the task ends with the listener).
    pub fn attach(self: &Arc<Self>, store: Option<UserStore>) {
        let Some(store) = store else {
            return;
        };
        if self.store.set(store.clone()).is_err() {
            return;
        }
        match store {
            UserStore::Local(sink) => {
                let users = lock(&self.users).clone();
                sink(user_documents(&users), users.roles().documents());
            }
            UserStore::Remote(_) => {
                let weak = Arc::downgrade(self);
                tokio::spawn(refresh_loop(weak));
            }
        }
    }

    /// The config server holding the users, for a `--configdb` router.
    fn remote(&self) -> Option<&Arc<dyn crate::command::service::RemoteUsers>> {
        match self.store.get() {
            Some(UserStore::Remote(r)) => Some(r),
            _ => None,
        }
    }

    /// Reads the users and roles from the config server and installs them when they changed
    /// (connections then re-read their user). A document that does not parse is left out and
    /// logged; a failed read keeps what was there.
    pub async fn reload(&self) -> Result<(), String> {
        let Some(remote) = self.remote() else {
            return Ok(());
        };
        let (user_docs, role_docs) = remote.load().await?;
        let roles = role_graph_of(&role_docs);
        let users = users_of(&user_docs);
        let fresh = UsersFile::from_parts(users, roles);
        let mut current = lock(&self.users);
        if *current != fresh {
            *current = fresh;
            self.generation.fetch_add(1, Ordering::Release);
        }
        Ok(())
    }

    /// For a `--configdb` router: when an authentication request (`saslStart`, or a `hello`
    /// naming a user for `saslSupportedMechs` or a speculative `saslStart`) names a user this
    /// router has not read yet, reads the users from the config server before it runs, as
    /// mongos fetches a user missing from its cache. A user it already holds is used as held
    /// until the next periodic read or `invalidateUserCache`. Such reads run one at a time.
    pub async fn fetch_named_user(&self, req: &CommandRequest) {
        if self.remote().is_none()
            || !matches!(
                req.name.as_str(),
                "saslStart" | "hello" | "isMaster" | "ismaster"
            )
        {
            return;
        }
        let Some(name) = AuthSession::named_user(&req.name, &req.db, &req.body_document()) else {
            return;
        };
        let known = |s: &Self| name.is_internal() || lock(&s.users).find(&name).is_some();
        if known(self) {
            return;
        }
        let _one_at_a_time = self.on_demand.lock().await;
        if known(self) {
            return;
        }
        if let Err(e) = self.fetch_user(&name).await {
            tracing::warn!(user = %name, error = %e, "cannot read the users from the config server");
        }
    }

    /// Adds the user `name` as the config server holds it now, when it exists there, leaving
    /// every user already held as it is. When the user's roles do not all resolve here, the
    /// roles are taken from the config server too (mongos resolves a user's roles when it
    /// fetches the user).
    async fn fetch_user(&self, name: &UserName) -> Result<(), String> {
        let Some(remote) = self.remote() else {
            return Ok(());
        };
        let (user_docs, role_docs) = remote.load().await?;
        let Some(user) = users_of(&user_docs).into_iter().find(|u| u.name == *name) else {
            return Ok(());
        };
        let mut current = lock(&self.users);
        if current.find(name).is_some() {
            return Ok(());
        }
        if current.principal(&user).is_err() {
            *current = UsersFile::from_parts(current.users().to_vec(), role_graph_of(&role_docs));
            self.generation.fetch_add(1, Ordering::Release);
        }
        // No generation bump: a user added changes no other user's resolution, and the user
        // cache holds no entry for it (a missing user is never kept).
        current.insert(user).map_err(|e| e.message)
    }

    /// For a `--configdb` router: runs an authorized user- or role-management command on the
    /// config server (with a majority write concern for a change, as mongos sends them), then
    /// reads the users again so this router sees its own change at once. `None`: not such a
    /// command, or not a `--configdb` router.
    pub async fn forward(
        &self,
        auth: &mut ConnectionAuth,
        state: &ServerState,
        req: &CommandRequest,
    ) -> Option<Document> {
        let remote = self.remote()?;
        let name = req.name.as_str();
        if name == "invalidateUserCache" {
            return Some(match self.reload().await {
                Ok(()) => {
                    self.refresh(auth);
                    ok_reply(state, Document::new())
                }
                Err(e) => error_reply(
                    state,
                    &AuthError::new(crate::value::error_codes::ErrorCode::HostUnreachable, e),
                ),
            });
        }
        let user_command = user_admin::USER_ADMIN_COMMANDS.contains(&name);
        if !user_command && !role_admin::ROLE_ADMIN_COMMANDS.contains(&name) {
            return None;
        }
        let write = if user_command {
            user_admin::is_write(name)
        } else {
            role_admin::is_write(name)
        };
        let mut body = Document::new();
        for (k, v) in req.body_document() {
            if k.starts_with('$') || matches!(k.as_str(), "lsid" | "txnNumber" | "autocommit") {
                continue;
            }
            body.insert(k, v);
        }
        if write && !body.contains_key("writeConcern") {
            body.insert("writeConcern", bson::doc! {"w": "majority"});
        }
        // The localhost exception let an unauthenticated `createUser` through on what this
        // router read; mongos asks the config server, and so does this: it closes as soon as
        // the config server holds a user, read or not.
        if auth.session.principal().is_none() && self.authorization {
            if let Err(e) = self.reload().await {
                tracing::warn!(error = %e, "cannot read the users from the config server");
            }
            if !lock(&self.users).users().is_empty() {
                let e = AuthError::new(
                    crate::value::error_codes::ErrorCode::Unauthorized,
                    format!("Command {name} requires authentication"),
                );
                return Some(error_reply(state, &e));
            }
        }
        let result = remote.run(&req.db, body).await;
        if write {
            if let Err(e) = self.reload().await {
                tracing::warn!(error = %e, "cannot read the users from the config server");
            }
            self.refresh(auth);
            tracing::info!(command = %req.name, db = %req.db, ok = result.is_ok(), "user or role change sent to the config server");
        }
        Some(match result {
            Ok(mut reply) => {
                for k in [
                    "ok",
                    "$clusterTime",
                    "operationTime",
                    "$configTime",
                    "$topologyTime",
                ] {
                    reply.remove(k);
                }
                ok_reply(state, reply)
            }
            Err(e) => {
                let mut reply = e.to_reply();
                command::append_cluster_time(state, &mut reply);
                reply
            }
        })
    }
}

/// Every user's stored document.
fn user_documents(users: &UsersFile) -> Vec<Document> {
    users.users().iter().map(|u| u.to_document()).collect()
}

/// Writes `text` to `path` through a temporary file, fsync and rename, mode 0600.
fn write_private(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    {
        use std::io::Write;
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut f = options.open(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)
}

/// mongos's `userCacheInvalidationIntervalSecs` default.
pub const DEFAULT_USER_CACHE_INVALIDATION_SECS: u64 = 30;

/// Reads a `--configdb` router's users from the config server at once, then on its period,
/// until the listener is gone. A failure is logged once until a read succeeds again.
async fn refresh_loop(security: Weak<Security>) {
    let mut failing = false;
    loop {
        let Some(s) = security.upgrade() else {
            return;
        };
        let interval = s.refresh_interval;
        match s.reload().await {
            Ok(()) => failing = false,
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "cannot read the users from the config server; keeping the ones read before");
                }
                failing = true;
            }
        }
        drop(s);
        tokio::time::sleep(interval).await;
    }
}

/// The users of a config server's `admin.system.users` documents; one that does not parse is
/// left out and logged.
fn users_of(docs: &[Document]) -> Vec<UserDocument> {
    docs.iter()
        .filter_map(|d| match UserDocument::from_document(d) {
            Ok(u) => Some(u),
            Err(e) => {
                tracing::warn!(document = ?d.get("_id"), error = %e, "admin.system.users document skipped");
                None
            }
        })
        .collect()
}

/// The custom roles of a config server's `admin.system.roles` documents; one that does not
/// parse is left out and logged.
fn role_graph_of(docs: &[Document]) -> RoleGraph {
    RoleGraph::from_roles(
        docs.iter()
            .filter_map(|d| match RoleDocument::from_document(d) {
                Ok(r) => Some(r),
                Err(e) => {
                    tracing::warn!(document = ?d.get("_id"), error = %e, "admin.system.roles document skipped");
                    None
                }
            })
            .collect(),
    )
}

impl UserLookup for Security {
    fn user(&self, name: &UserName) -> Option<UserDocument> {
        lock(&self.users).find(name).cloned()
    }
    fn scram_credential(
        &self,
        name: &UserName,
        mechanism: ScramMechanism,
    ) -> Option<Option<ScramCredential>> {
        lock(&self.users).scram_credential(name, mechanism)
    }
    fn internal_credentials(&self) -> Option<&InternalCredentials> {
        self.internal.as_ref()
    }
    fn principal(&self, user: &UserDocument) -> Result<Principal, RoleName> {
        lock(&self.users).principal(user)
    }
    fn restrictions(&self, user: &UserDocument) -> Vec<Vec<bson::Bson>> {
        lock(&self.users).restrictions(user)
    }
    /// From the user cache: resolved once per user until the users or roles change.
    fn resolve(&self, name: &UserName) -> Option<Result<Arc<ResolvedUser>, RoleName>> {
        let users = lock(&self.users);
        // Every change of the users bumps the generation with `users` locked, so this is
        // the generation of the set `users` holds.
        let generation = self.generation.load(Ordering::Acquire);
        lock(&self.resolved).get_or_resolve(generation, name, || users.resolve(name))
    }
}

/// A connection's authentication state: the session and the users generation it last saw.
#[derive(Debug, Default)]
pub struct ConnectionAuth {
    session: AuthSession,
    generation: u64,
}

impl ConnectionAuth {
    /// Records the connection's client and server addresses (for `authenticationRestrictions`).
    pub fn set_addresses(&mut self, client: std::net::SocketAddr, server: std::net::SocketAddr) {
        self.session
            .set_addresses(crate::auth::restrictions::ConnectionAddresses {
                client: client.ip(),
                server: server.ip(),
            });
    }

    /// Records the verified client certificate's subject, and whether it names a member of
    /// the cluster (the `O`, `OU` and `DC` of this server's own certificate).
    pub fn set_peer(&mut self, security: &Security, subject: &crate::auth::x509::X509Name) {
        self.session.set_peer_subject(Some(subject.to_string()));
        if let Some((own, accepted)) = &security.cluster {
            if subject.is_cluster_member_of(own) {
                self.session.set_peer_cluster_member(Some(*accepted));
            }
        }
    }
}

/// The request as the authorization checks read it.
struct View<'a>(&'a CommandRequest);

impl CommandView for View<'_> {
    fn db(&self) -> &str {
        &self.0.db
    }
    fn body(&self) -> &RawDocument {
        self.0.body.raw()
    }
    fn sequence(&self, identifier: &str) -> Option<Vec<&RawDocument>> {
        self.0
            .sequences
            .iter()
            .find(|s| s.identifier == identifier)
            .map(|s| s.documents.iter().map(|d| d.raw()).collect())
    }
    fn bypass_document_validation(&self) -> bool {
        self.0
            .bypass_document_validation
            .unwrap_or_else(|| bypasses_document_validation(self.0.body.raw()))
    }
}

fn is_hello(name: &str) -> bool {
    matches!(name, "hello" | "isMaster" | "ismaster")
}

fn error_reply(state: &ServerState, e: &AuthError) -> Document {
    let mut reply = CommandError::new(e.code, e.message.clone()).to_reply();
    command::append_cluster_time(state, &mut reply);
    reply
}

fn ok_reply(state: &ServerState, mut reply: Document) -> Document {
    reply.insert("ok", 1.0);
    command::append_cluster_time(state, &mut reply);
    reply
}

/// Logs and counts one authentication step's outcome (never a password, proof or payload).
fn record(conn: i64, peer: &std::net::SocketAddr, speculative: bool, outcome: &Outcome) {
    match outcome {
        Outcome::Continued => {}
        Outcome::Succeeded { user, mechanism } => {
            metrics::counter!("sluice_authentications_total",
                "mechanism" => mechanism.name(), "outcome" => "success")
            .increment(1);
            tracing::info!(conn, %peer, %user, %mechanism, speculative, "authentication succeeded");
        }
        Outcome::Failed {
            mechanism,
            user,
            error,
        } => {
            let m = mechanism.map(|m| m.name()).unwrap_or("unknown");
            metrics::counter!("sluice_authentications_total",
                "mechanism" => m, "outcome" => "failure")
            .increment(1);
            tracing::warn!(
                conn,
                %peer,
                user = user.as_ref().map(|u| u.to_string()).unwrap_or_default(),
                mechanism = m,
                speculative,
                error = error.for_log(),
                code = error.code.0,
                "authentication failed"
            );
        }
    }
}

impl Security {
    /// Brings the connection's user up to date after `createUser`/`updateUser`/`dropUser` or
    /// a role change on any connection: a dropped user is no longer authenticated, a changed
    /// one has its new roles.
    fn refresh(&self, auth: &mut ConnectionAuth) {
        let now = self.generation.load(Ordering::Acquire);
        if auth.generation == now {
            return;
        }
        auth.generation = now;
        auth.session.refresh_user(self);
    }

    /// How often an authentication found its user already resolved in the user cache.
    pub fn user_cache_counts(&self) -> CacheCounts {
        lock(&self.resolved).counts()
    }

    /// mongod's localhost exception: while no user exists, a client on the loopback interface
    /// may create the first user in `admin` (and nothing else without authenticating).
    fn localhost_exception(&self, peer: &std::net::SocketAddr, req: &CommandRequest) -> bool {
        req.name == "createUser"
            && req.db == "admin"
            && peer.ip().is_loopback()
            && lock(&self.users).users().is_empty()
    }

    /// Runs before the service: the authorization check, then the commands answered here.
    /// `Some(reply)` is the whole answer; `None` passes the request on.
    pub fn before(
        &self,
        auth: &mut ConnectionAuth,
        state: &ServerState,
        conn: (i64, &std::net::SocketAddr),
        req: &CommandRequest,
    ) -> Option<Document> {
        self.refresh(auth);
        // mongod refuses an admin-only command on another database whether or not
        // authorization is enabled.
        if req.db != "admin" {
            if let Err(e) = check_admin_only(&req.name, &req.db) {
                return Some(error_reply(state, &e));
            }
        }
        if self.authorization && !self.localhost_exception(conn.1, req) {
            let checked = authorize(auth.session.principal(), &View(req))
                .and_then(|()| self.run_time_checks(auth, req));
            if let Err(e) = checked {
                tracing::debug!(conn = conn.0, command = %req.name, error = %e.message, "unauthorized");
                return Some(error_reply(state, &e));
            }
        }
        let step = match req.name.as_str() {
            "saslStart" => auth.session.sasl_start(&req.db, &req.body_document(), self),
            "saslContinue" => auth.session.sasl_continue(&req.body_document(), self),
            "authenticate" => auth
                .session
                .authenticate(&req.db, &req.body_document(), self),
            "logout" => return Some(ok_reply(state, auth.session.logout())),
            // Nothing is cached here unless the users are another server's
            // ([`Security::forward`] reads them again then).
            "invalidateUserCache" if self.remote().is_none() => {
                return Some(ok_reply(state, Document::new()))
            }
            name if user_admin::USER_ADMIN_COMMANDS.contains(&name)
                || role_admin::ROLE_ADMIN_COMMANDS.contains(&name) =>
            {
                if self.remote().is_some() {
                    // Run on the config server by [`Security::forward`].
                    return None;
                }
                let reply = match self.user_admin(req, &req.body_document()) {
                    Ok(reply) => ok_reply(state, reply),
                    Err(e) => error_reply(state, &e),
                };
                self.refresh(auth);
                return Some(reply);
            }
            _ => return None,
        };
        let (result, outcome) = step;
        record(conn.0, conn.1, false, &outcome);
        if matches!(outcome, Outcome::Succeeded { .. }) {
            auth.generation = self.generation.load(Ordering::Acquire);
        }
        Some(match result {
            Ok(reply) => ok_reply(state, reply),
            Err(e) => error_reply(state, &e),
        })
    }

    /// The checks mongod makes when the command runs rather than before: the owner of the
    /// cursor of a `getMore` or `killCursors`, and whether `listDatabases` may list every
    /// database when the client insists (`authorizedDatabases: false`).
    fn run_time_checks(
        &self,
        auth: &ConnectionAuth,
        req: &CommandRequest,
    ) -> Result<(), AuthError> {
        let principal = auth.session.principal();
        let body = req.body.raw();
        match req.name.as_str() {
            "getMore" => match body.get("getMore") {
                Ok(Some(bson::RawBsonRef::Int64(id))) => self.cursors.check_get_more(principal, id),
                // A malformed id is the command parser's to refuse.
                _ => Ok(()),
            },
            "killCursors" => {
                let ids: Vec<i64> = match body.get("cursors") {
                    Ok(Some(bson::RawBsonRef::Array(a))) => a
                        .into_iter()
                        .filter_map(|v| match v {
                            Ok(bson::RawBsonRef::Int64(id)) => Some(id),
                            _ => None,
                        })
                        .collect(),
                    _ => Vec::new(),
                };
                self.cursors.check_kill(principal, &ids)
            }
            "listDatabases" => match principal {
                Some(p) => {
                    list_databases_filter(&p.privileges, authorized_databases(body)).map(|_| ())
                }
                None => Ok(()),
            },
            _ => Ok(()),
        }
    }

    /// Records the cursor an encoded reply hands out (see [`CursorOwners`]); called for every
    /// reply [`Security::after`] does not see. Nothing is read unless authorization is on,
    /// and the reply is walked once.
    pub fn observe_raw(&self, auth: &ConnectionAuth, req: &CommandRequest, reply: &RawDocument) {
        if !self.authorization || never_uses_a_cursor(&req.name) {
            return;
        }
        let facts = CursorFacts::of_raw(reply);
        self.note_cursors(auth, req, (facts.ok, facts.gone), facts.id, facts.ns);
    }

    /// Keeps the cursor owners in step with one reply (`ok`, and whether it failed because
    /// the cursor is gone): a cursor handed out is recorded, an exhausted one, one a
    /// `getMore` no longer finds, and the killed ones are forgotten.
    fn note_cursors(
        &self,
        auth: &ConnectionAuth,
        req: &CommandRequest,
        (ok, gone): (bool, bool),
        id: Option<i64>,
        ns: &str,
    ) {
        let body = req.body.raw();
        match req.name.as_str() {
            "getMore" => {
                let Ok(Some(bson::RawBsonRef::Int64(asked))) = body.get("getMore") else {
                    return;
                };
                if gone || (ok && id == Some(0)) {
                    self.cursors.forget([asked]);
                } else if let Some(id) = id {
                    self.cursors.record(auth.session.principal(), id, ns);
                }
            }
            "killCursors" if ok => {
                if let Ok(Some(bson::RawBsonRef::Array(a))) = body.get("cursors") {
                    self.cursors.forget(a.into_iter().filter_map(|v| match v {
                        Ok(bson::RawBsonRef::Int64(id)) => Some(id),
                        _ => None,
                    }));
                }
            }
            _ => {
                // A closed cursor (id 0) has no owner to record.
                if let (true, Some(id)) = (ok, id.filter(|id| *id != 0)) {
                    self.cursors.record(auth.session.principal(), id, ns);
                }
            }
        }
    }

    /// Whether [`Security::after`] may change the reply to the command `name` (an encoded
    /// reply is passed to it only then; it stays encoded unless a field must be replaced).
    pub fn edits_reply(&self, name: &str) -> bool {
        is_hello(name)
            || name == "connectionStatus"
            || (self.authorization && name == "listDatabases")
    }

    /// Runs after the service answered: the cursor owners (with authorization), the `hello`
    /// family's authentication fields and `connectionStatus`'s `authInfo`. An encoded reply
    /// stays encoded for the `hello` family: its fields are appended to its bytes, where the
    /// reply as a document would have had them inserted at its end (it never has them yet).
    pub fn after(
        &self,
        auth: &mut ConnectionAuth,
        conn: (i64, &std::net::SocketAddr),
        req: &CommandRequest,
        reply: &mut Reply,
    ) {
        if self.authorization && !never_uses_a_cursor(&req.name) {
            let facts = match &*reply {
                Reply::Document(d) => CursorFacts::of_document(d),
                Reply::Raw(r) => CursorFacts::of_raw(r),
            };
            self.note_cursors(auth, req, (facts.ok, facts.gone), facts.id, facts.ns);
        }
        if reply.ok() != Some(1.0) {
            return;
        }
        if self.authorization && req.name == "listDatabases" {
            if let Some(p) = auth.session.principal() {
                let asked = authorized_databases(req.body.raw());
                if let Ok(DatabaseFilter::Authorized) = list_databases_filter(&p.privileges, asked)
                {
                    edit_document(reply, |d| {
                        filter_databases(d, |db| p.privileges.has_any_privilege_in_db(db))
                    });
                }
            }
        }
        if is_hello(&req.name) {
            let body = req.body_fields(&AuthSession::HELLO_FIELDS);
            if body.is_empty() {
                return;
            }
            match AuthSession::sasl_supported_mechs(&body, self) {
                Ok(Some(mechs)) => {
                    reply.append(
                        bson::raw::cstr!("saslSupportedMechs"),
                        Bson::Array(mechs.into_iter().map(Bson::from).collect()),
                    );
                }
                Ok(None) => {}
                Err(e) => {
                    *reply = Reply::Document(CommandError::from(e).to_reply());
                    return;
                }
            }
            if let Some((spec, outcome)) = auth.session.speculative(&body, self) {
                record(conn.0, conn.1, true, &outcome);
                if matches!(outcome, Outcome::Succeeded { .. }) {
                    auth.generation = self.generation.load(Ordering::Acquire);
                }
                if let Some(spec) = spec {
                    reply.append(
                        bson::raw::cstr!("speculativeAuthenticate"),
                        Bson::Document(spec),
                    );
                }
            }
        } else if req.name == "connectionStatus" {
            let show = req
                .body
                .raw()
                .get("showPrivileges")
                .ok()
                .flatten()
                .and_then(|v| Bson::try_from(v).ok())
                .is_some_and(|v| crate::value::field::truthy(&v));
            let info = auth.session.auth_info(show);
            edit_document(reply, |d| {
                d.insert("authInfo", info);
            });
        }
    }
}

/// What the cursor owners need of a reply: whether it succeeded (`ok` 1, double or int),
/// whether it failed because the cursor is gone, and the cursor it hands out.
struct CursorFacts<'a> {
    ok: bool,
    gone: bool,
    id: Option<i64>,
    ns: &'a str,
}

impl<'a> CursorFacts<'a> {
    /// Read from an encoded reply in one walk of its top-level fields, each at its first
    /// occurrence (as `RawDocument::get` finds it), by the wire layer's field walker.
    fn of_raw(reply: &'a RawDocument) -> Self {
        let [ok, code, cursor] =
            crate::wire::get_fields(reply, ["ok", "code", "cursor"]).map(|v| v.ok().flatten());
        let cursor = match cursor {
            Some(bson::RawBsonRef::Document(c)) => Some(c),
            _ => None,
        };
        // The cursor's `id` and `ns` in one walk of it; `ns` is only needed for an open cursor.
        let (id, ns) = match cursor {
            Some(c) => {
                let [id, ns] = crate::wire::get_fields(c, ["id", "ns"]).map(|v| v.ok().flatten());
                let id = match id {
                    Some(bson::RawBsonRef::Int64(id)) => Some(id),
                    _ => None,
                };
                let ns = match (id, ns) {
                    (Some(i), Some(bson::RawBsonRef::String(ns))) if i != 0 => ns,
                    _ => "",
                };
                (id, ns)
            }
            None => (None, ""),
        };
        CursorFacts {
            ok: ok.is_some_and(|v| v.as_f64() == Some(1.0) || v.as_i32() == Some(1)),
            gone: matches!(code, Some(bson::RawBsonRef::Int32(c)) if cursor_gone(c)),
            id,
            ns,
        }
    }

    fn of_document(reply: &'a Document) -> Self {
        let cursor = reply.get_document("cursor").ok();
        let id = cursor.and_then(|c| c.get_i64("id").ok());
        CursorFacts {
            ok: reply.get_f64("ok").ok() == Some(1.0) || reply.get_i32("ok").ok() == Some(1),
            gone: reply.get_i32("code").ok().is_some_and(cursor_gone),
            id,
            ns: match id {
                Some(i) if i != 0 => cursor.and_then(|c| c.get_str("ns").ok()).unwrap_or(""),
                _ => "",
            },
        }
    }
}

/// Edits the reply as a document, decoding an encoded one first: for the edits that replace
/// a field where it stands (`listDatabases`'s list, `connectionStatus`'s `authInfo`).
fn edit_document(reply: &mut Reply, edit: impl FnOnce(&mut Document)) {
    let mut d = match std::mem::replace(reply, Reply::Document(Document::new())) {
        Reply::Document(d) => d,
        raw => raw.into_document(),
    };
    edit(&mut d);
    *reply = Reply::Document(d);
}

/// Whether the command's reply can neither hand out a cursor nor end one, so the cursor owners
/// need not read it: the commands a client sends most (writes, the `hello` family, the SASL
/// steps). Any command not named here is read, so a command that does hand out a cursor is
/// never missed; missing one would only make its owner's `getMore` fail (43), never admit
/// another user's.
fn never_uses_a_cursor(name: &str) -> bool {
    matches!(
        name,
        "insert"
            | "update"
            | "delete"
            | "findAndModify"
            | "hello"
            | "isMaster"
            | "ismaster"
            | "ping"
            | "saslStart"
            | "saslContinue"
            | "authenticate"
            | "logout"
            | "endSessions"
            | "count"
            | "distinct"
            | "commitTransaction"
            | "abortTransaction"
            | "buildInfo"
            | "connectionStatus"
    )
}

/// Whether an error code says the cursor no longer exists (CursorNotFound, CursorKilled).
fn cursor_gone(code: i32) -> bool {
    matches!(code, 43 | 237)
}

/// `listDatabases`'s `authorizedDatabases` (absent or null: the server decides).
fn authorized_databases(body: &RawDocument) -> Option<bool> {
    match body.get("authorizedDatabases") {
        Ok(Some(bson::RawBsonRef::Null)) | Ok(None) | Err(_) => None,
        Ok(Some(v)) => Bson::try_from(v)
            .ok()
            .map(|v| crate::value::field::truthy(&v)),
    }
}

/// Keeps in a `listDatabases` reply only the databases `keep` admits, with `totalSize` (and
/// `totalSizeMb`) over those, as mongod computes them for a filtered list.
fn filter_databases(reply: &mut Document, keep: impl Fn(&str) -> bool) {
    let Ok(databases) = reply.get_array("databases") else {
        return;
    };
    let kept: Vec<Bson> = databases
        .iter()
        .filter(|d| {
            d.as_document()
                .and_then(|d| d.get_str("name").ok())
                .is_some_and(&keep)
        })
        .cloned()
        .collect();
    if reply.contains_key("totalSize") {
        let total: i64 = kept
            .iter()
            .filter_map(|d| d.as_document())
            .filter_map(|d| crate::value::field::number_field(d, "sizeOnDisk"))
            .sum();
        reply.insert("totalSize", total);
        if reply.contains_key("totalSizeMb") {
            reply.insert("totalSizeMb", total / (1024 * 1024));
        }
    }
    reply.insert("databases", kept);
}

/// The listener's security, shared by its connections.
pub type SharedSecurity = Arc<Security>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::scram::{ClientConversation, ScramMechanism};
    use bson::doc;

    /// A listener's security with authorization on and one user, `alice@admin` (both SCRAM
    /// mechanisms, root).
    fn security(name: &str) -> Security {
        let dir =
            std::env::temp_dir().join(format!("sluice-security-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temporary directory");
        let mut users = UsersFile::new();
        users
            .insert(
                UserDocument::new_scram(
                    UserName::new("alice", "admin"),
                    "secret",
                    &ScramMechanism::ALL,
                    vec![RoleName::new("root", "admin")],
                )
                .expect("user"),
            )
            .expect("insert");
        let path = dir.join("users.json");
        std::fs::write(&path, users.to_text()).expect("users file");
        let mut config = Config::default();
        config.security.users_file = Some(path.display().to_string());
        config.security.authorization = Authorization::Enabled;
        Security::from_config(&config).expect("security")
    }

    /// A `hello` reply as the router's dispatch leaves it: `ok` and the cluster time last.
    fn hello_reply() -> Document {
        let t = bson::Timestamp {
            time: 1_764_000_000,
            increment: 7,
        };
        doc! {
            "isWritablePrimary": true,
            "msg": "isdbgrid",
            "maxBsonObjectSize": 16_777_216,
            "connectionId": 3,
            "ok": 1.0,
            "$clusterTime": crate::wire::cluster_time_document(t),
            "operationTime": t,
        }
    }

    fn request(body: Document) -> CommandRequest {
        CommandRequest::from_document("admin", &body).expect("request")
    }

    fn peer() -> std::net::SocketAddr {
        "127.0.0.1:40000".parse().expect("address")
    }

    /// The `hello` fields the hook adds are the same bytes whether the service answered with
    /// a document or with an encoded reply (which now stays encoded), and a `hello` that asks
    /// for none of them leaves the encoded reply exactly as it was.
    #[test]
    fn hello_fields_on_an_encoded_reply_are_the_bytes_of_the_document_path() {
        let security = security("hello-bytes");
        let encoded =
            |d: &Document| Reply::Raw(bson::RawDocumentBuf::try_from(d).expect("encodes"));
        for body in [
            doc! {"hello": 1, "helloOk": true, "$db": "admin"},
            doc! {"hello": 1, "saslSupportedMechs": "admin.alice", "$db": "admin"},
            doc! {"isMaster": 1, "saslSupportedMechs": "admin.nobody", "$db": "admin"},
            // Wrong type: the reply becomes the error, on both paths.
            doc! {"hello": 1, "saslSupportedMechs": 5, "$db": "admin"},
        ] {
            let req = request(body.clone());
            let mut as_document = Reply::Document(hello_reply());
            let mut as_raw = encoded(&hello_reply());
            for reply in [&mut as_document, &mut as_raw] {
                let mut auth = ConnectionAuth::default();
                security.after(&mut auth, (1, &peer()), &req, reply);
            }
            assert_eq!(
                as_document.clone().into_bytes().expect("encodes"),
                as_raw.clone().into_bytes().expect("encodes"),
                "{body}"
            );
            if body.contains_key("helloOk") {
                assert!(matches!(as_raw, Reply::Raw(_)), "stays encoded");
                assert_eq!(
                    as_raw.into_bytes().expect("encodes"),
                    hello_reply().to_vec().expect("encodes")
                );
            }
        }
        let mechs = request(doc! {"hello": 1, "saslSupportedMechs": "admin.alice", "$db": "admin"});
        let mut reply = encoded(&hello_reply());
        security.after(
            &mut ConnectionAuth::default(),
            (1, &peer()),
            &mechs,
            &mut reply,
        );
        let d = reply.into_document();
        let keys: Vec<&str> = d.keys().map(String::as_str).collect();
        assert_eq!(keys.last(), Some(&"saslSupportedMechs"));
        assert_eq!(
            d.get_array("saslSupportedMechs").expect("mechanisms").len(),
            2
        );
    }

    /// A speculative `saslStart` inside `hello` is answered on an encoded reply as on a
    /// document (the same fields, `speculativeAuthenticate` last), and the conversation it
    /// starts finishes with `saslContinue`, authenticating the connection.
    #[test]
    fn speculative_authentication_works_on_an_encoded_hello_reply() {
        let security = security("speculative");
        let state = ServerState::new(
            Config::default(),
            Vec::new(),
            std::sync::Arc::new(tokio::sync::watch::channel(false).0),
        );
        for encoded in [false, true] {
            let mut conv = ClientConversation::new(
                ScramMechanism::Sha256,
                "alice",
                "secret",
                "speculativenonce",
            )
            .expect("conversation");
            let payload = bson::Binary {
                subtype: bson::spec::BinarySubtype::Generic,
                bytes: conv.client_first(),
            };
            let req = request(doc! {
                "hello": 1,
                "speculativeAuthenticate": {
                    "saslStart": 1, "mechanism": "SCRAM-SHA-256", "payload": payload,
                    "options": {"skipEmptyExchange": true}, "db": "admin",
                },
                "$db": "admin",
            });
            let mut reply = if encoded {
                Reply::Raw(bson::RawDocumentBuf::try_from(&hello_reply()).expect("encodes"))
            } else {
                Reply::Document(hello_reply())
            };
            let mut auth = ConnectionAuth::default();
            security.after(&mut auth, (1, &peer()), &req, &mut reply);
            assert_eq!(matches!(reply, Reply::Raw(_)), encoded);
            let d = reply.into_document();
            let keys: Vec<&str> = d.keys().map(String::as_str).collect();
            let plain = hello_reply();
            let mut expected: Vec<&str> = plain.keys().map(String::as_str).collect();
            expected.push("speculativeAuthenticate");
            assert_eq!(keys, expected);
            let spec = d.get_document("speculativeAuthenticate").expect("answered");
            assert_eq!(spec.get_i32("conversationId").ok(), Some(1));
            let fin = conv
                .client_final(spec.get_binary_generic("payload").expect("payload"))
                .expect("server first");
            let cont = request(doc! {
                "saslContinue": 1, "conversationId": 1,
                "payload": bson::Binary {subtype: bson::spec::BinarySubtype::Generic, bytes: fin},
                "$db": "admin",
            });
            let done = security
                .before(&mut auth, &state, (1, &peer()), &cont)
                .expect("answered here");
            assert_eq!(done.get_f64("ok").ok(), Some(1.0), "{done}");
            assert_eq!(done.get_bool("done").ok(), Some(true), "{done}");
            assert_eq!(
                auth.session.principal().map(|p| p.user.user.as_str()),
                Some("alice")
            );
        }
    }

    /// A whole SCRAM-SHA-256 conversation as `alice`/`secret` on a new connection, through
    /// the hook, as the driver runs it (`saslStart`, `saslContinue`).
    fn log_in(security: &Security, state: &ServerState) -> ConnectionAuth {
        let mut auth = ConnectionAuth::default();
        let mut conv =
            ClientConversation::new(ScramMechanism::Sha256, "alice", "secret", "cachenonce")
                .expect("conversation");
        let bin = |bytes: Vec<u8>| bson::Binary {
            subtype: bson::spec::BinarySubtype::Generic,
            bytes,
        };
        let start = request(doc! {
            "saslStart": 1, "mechanism": "SCRAM-SHA-256", "payload": bin(conv.client_first()),
            "options": {"skipEmptyExchange": true}, "$db": "admin",
        });
        let first = security
            .before(&mut auth, state, (1, &peer()), &start)
            .expect("answered here");
        let fin = conv
            .client_final(first.get_binary_generic("payload").expect("payload"))
            .expect("server first");
        let cont = request(doc! {
            "saslContinue": 1, "conversationId": 1, "payload": bin(fin), "$db": "admin",
        });
        let done = security
            .before(&mut auth, state, (1, &peer()), &cont)
            .expect("answered here");
        assert_eq!(done.get_bool("done").ok(), Some(true), "{done}");
        auth
    }

    /// Logins of one user share one resolution of its roles until the users change: the
    /// second login is a cache hit and gets the very same privileges; a user command drops
    /// the cache (the connection that ran it reads its user again, a miss, and the next
    /// login shares that new resolution).
    #[test]
    fn logins_of_one_user_share_one_resolution_until_the_users_change() {
        let security = security("user-cache");
        let state = ServerState::new(
            Config::default(),
            Vec::new(),
            std::sync::Arc::new(tokio::sync::watch::channel(false).0),
        );
        let first = log_in(&security, &state);
        let second = log_in(&security, &state);
        assert_eq!(
            security.user_cache_counts(),
            CacheCounts { hits: 1, misses: 1 }
        );
        let (a, b) = (
            first.session.principal().expect("authenticated"),
            second.session.principal().expect("authenticated"),
        );
        assert!(std::ptr::eq(a, b), "one resolution, shared");

        let mut admin = second;
        let create =
            request(doc! {"createUser": "bob", "pwd": "bobpw", "roles": [], "$db": "admin"});
        let reply = security
            .before(&mut admin, &state, (1, &peer()), &create)
            .expect("answered here");
        assert_eq!(reply.get_f64("ok").ok(), Some(1.0), "{reply}");
        let third = log_in(&security, &state);
        assert_eq!(
            security.user_cache_counts(),
            CacheCounts { hits: 2, misses: 2 },
            "resolved again after the change"
        );
        assert!(!std::ptr::eq(
            a,
            third.session.principal().expect("authenticated")
        ));
    }

    #[test]
    fn cursor_facts_read_in_place_equal_those_of_the_document() {
        let replies = [
            doc! {"cursor": {"firstBatch": [{"a": 1}], "id": 42_i64, "ns": "db.c"}, "ok": 1.0},
            doc! {"ok": 1, "cursor": {"ns": "db.c", "nextBatch": [], "id": 0_i64}},
            doc! {"ok": 0.0, "errmsg": "gone", "code": 43, "codeName": "CursorNotFound"},
            doc! {"ok": 0.0, "code": 237},
            doc! {"ok": 0.0, "code": 13},
            doc! {"n": 1, "ok": 1.0},
            doc! {"ok": 2.0, "cursor": "not a document"},
            doc! {"cursor": {"id": 7_i32, "ns": 5}, "ok": 1.0},
        ];
        for reply in replies {
            let raw = bson::RawDocumentBuf::try_from(&reply).expect("encodes");
            let (a, b) = (CursorFacts::of_raw(&raw), CursorFacts::of_document(&reply));
            assert_eq!(
                (a.ok, a.gone, a.id, a.ns),
                (b.ok, b.gone, b.id, b.ns),
                "{reply}"
            );
        }
        let reply = doc! {"cursor": {"id": 9_i64, "ns": "d.c"}, "ok": 1};
        let raw = bson::RawDocumentBuf::try_from(&reply).expect("encodes");
        let first = CursorFacts::of_raw(&raw);
        assert_eq!((first.ok, first.id, first.ns), (true, Some(9), "d.c"));
    }

    #[test]
    fn replies_that_can_hand_out_a_cursor_are_read() {
        for name in [
            "find",
            "aggregate",
            "getMore",
            "killCursors",
            "listCollections",
            "listIndexes",
            "bulkWrite",
            "listSearchIndexes",
        ] {
            assert!(!never_uses_a_cursor(name), "{name}");
        }
    }
}
