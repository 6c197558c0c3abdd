//! The per-connection authentication slot: `saslStart`, `saslContinue`, `authenticate`
//! (MONGODB-X509), `logout`, the `hello` fields `saslSupportedMechs` and
//! `speculativeAuthenticate`, and the `authInfo` of `connectionStatus`.
//!
//! mongod's rules, kept here:
//! - one conversation at a time: `saslStart` (or `authenticate`) abandons the one in progress;
//!   `saslContinue` without one is 17 `No SASL session state found`, with a `conversationId`
//!   other than 1 it is 17 `sasl: Mismatched conversation id`;
//! - every failure inside a conversation answers 18 `Authentication failed.` whatever the
//!   reason (unknown user, wrong proof, a malformed message), and ends the conversation, so a
//!   replayed or retried step cannot continue it; the reason is kept for the log;
//! - an unknown mechanism is 334 `Received authentication for mechanism <m> which is unknown
//!   or not enabled`;
//! - a speculative start that fails leaves no trace in the `hello` reply;
//! - a connection is authenticated as one user at a time: a successful authentication as
//!   another user replaces it (mongod 5.0+ refuses a second user; re-authenticating as the
//!   same user is allowed).
//!
//! Users come from a [`UserLookup`]: the users file in static and demo mode, the keyfile's
//! `__system@local` when one is configured.

use super::credentials::{UserDocument, UsersFile};
use super::keyfile::InternalCredentials;
use super::restrictions::ConnectionAddresses;
use super::roles::{Principal, RoleName};
use super::scram::{
    server_nonce, ClientFirst, ScramCredential, ScramError, ScramMechanism, ServerConversation,
    ServerStep,
};
use super::user_cache::ResolvedUser;
use super::{AuthError, Mechanism, UserName, EXTERNAL_DB, INTERNAL_DB, INTERNAL_USER};
use crate::value::error_codes::ErrorCode;
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use bson::spec::BinarySubtype;
use bson::{doc, Binary, Bson, Document};
use std::sync::Arc;

/// Where a session finds users.
pub trait UserLookup {
    /// A user document by name (`None`: no such user).
    fn user(&self, name: &UserName) -> Option<UserDocument>;
    /// The user's SCRAM credential of `mechanism`, without the rest of its document (what
    /// `saslStart` needs). `None`: no such user; `Some(None)`: none of that mechanism.
    fn scram_credential(
        &self,
        name: &UserName,
        mechanism: ScramMechanism,
    ) -> Option<Option<ScramCredential>> {
        self.user(name)
            .map(|u| u.credentials.scram(mechanism).cloned())
    }
    /// The `__system@local` credentials of the configured keyfile (`None`: no keyfile).
    fn internal_credentials(&self) -> Option<&InternalCredentials>;
    /// The user's roles resolved into privileges (built-in roles only unless the lookup
    /// knows custom roles); a role it cannot resolve is the error.
    fn principal(&self, user: &UserDocument) -> Result<Principal, RoleName> {
        user.principal()
    }
    /// The `authenticationRestrictions` the user must meet (its own, and its custom roles'
    /// when the lookup knows custom roles).
    fn restrictions(&self, user: &UserDocument) -> Vec<Vec<Bson>> {
        user.authentication_restrictions.iter().cloned().collect()
    }
    /// The user `name` as authentication needs it: its principal and the restrictions to
    /// meet. `None`: no such user; `Err`: a role that does not exist. A lookup may keep the
    /// result for as long as its users and roles stay as they are
    /// ([`super::user_cache::UserCache`]).
    fn resolve(&self, name: &UserName) -> Option<Result<Arc<ResolvedUser>, RoleName>> {
        let user = self.user(name)?;
        Some(self.principal(&user).map(|principal| {
            Arc::new(ResolvedUser {
                principal: Arc::new(principal),
                restrictions: self.restrictions(&user),
            })
        }))
    }
}

/// The users of the set as authentication reads them (no keyfile user: the caller adds it).
impl UserLookup for UsersFile {
    fn user(&self, name: &UserName) -> Option<UserDocument> {
        self.find(name).cloned()
    }
    fn scram_credential(
        &self,
        name: &UserName,
        mechanism: ScramMechanism,
    ) -> Option<Option<ScramCredential>> {
        self.find(name)
            .map(|u| u.credentials.scram(mechanism).cloned())
    }
    fn internal_credentials(&self) -> Option<&InternalCredentials> {
        None
    }
    fn principal(&self, user: &UserDocument) -> Result<Principal, RoleName> {
        UsersFile::principal(self, user)
    }
    fn restrictions(&self, user: &UserDocument) -> Vec<Vec<Bson>> {
        UsersFile::restrictions(self, user)
    }
}

/// What an authentication step did, for the log and the counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The step went on (no user authenticated yet).
    Continued,
    /// A user was authenticated.
    Succeeded {
        /// Who.
        user: UserName,
        /// How.
        mechanism: Mechanism,
    },
    /// The step failed (the error is what the client was answered, with the log detail).
    Failed {
        /// The mechanism, when known.
        mechanism: Option<Mechanism>,
        /// Who tried, when known.
        user: Option<UserName>,
        /// The error.
        error: AuthError,
    },
}

/// One in-progress SCRAM conversation.
struct Pending {
    db: String,
    conversation: ServerConversation,
    payload_as_string: bool,
}

/// The authentication state of one client connection.
#[derive(Default)]
pub struct AuthSession {
    pending: Option<Pending>,
    /// Shared with the other connections of the same user (the lookup's resolved user).
    principal: Option<Arc<Principal>>,
    /// The verified client certificate's subject (RFC 2253), when the client presented one.
    peer_subject: Option<String>,
    /// Whether that certificate names a member of the cluster: `Some(true)` when members may
    /// authenticate by certificate (`clusterAuthMode` other than `keyFile`), `Some(false)`
    /// when they may not, `None` for any other certificate.
    peer_member: Option<bool>,
    /// The connection's addresses, which `authenticationRestrictions` are checked against
    /// (`None`: unknown, and a user with restrictions cannot authenticate).
    addresses: Option<ConnectionAddresses>,
}

impl std::fmt::Debug for AuthSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthSession")
            .field("user", &self.principal.as_ref().map(|p| &p.user))
            .field("in_conversation", &self.pending.is_some())
            .finish()
    }
}

/// A SASL payload: BinData, or (as mongod also accepts) a base64 string.
fn read_payload(body: &Document, command: &str) -> Result<(Vec<u8>, bool), AuthError> {
    match body.get("payload") {
        Some(Bson::Binary(b)) => Ok((b.bytes.clone(), false)),
        Some(Bson::String(s)) => BASE64
            .decode(s)
            .map(|p| (p, true))
            .map_err(|_| AuthError::bad_value("Invalid base64 in SASL payload")),
        Some(_) => Err(AuthError::new(
            ErrorCode::TypeMismatch,
            format!(
                "BSON field '{command}.payload' is the wrong type, expected types '[string, \
                 binData]'"
            ),
        )),
        None => Err(AuthError::new(
            ErrorCode(40414),
            format!("BSON field '{command}.payload' is missing but a required field"),
        )),
    }
}

fn sasl_reply(step: &ServerStep, as_string: bool) -> Document {
    let payload = if as_string {
        Bson::String(BASE64.encode(&step.payload))
    } else {
        Bson::Binary(Binary {
            subtype: BinarySubtype::Generic,
            bytes: step.payload.clone(),
        })
    };
    doc! {"conversationId": 1, "done": step.done, "payload": payload}
}

fn skip_empty_exchange(body: &Document) -> bool {
    body.get_document("options")
        .ok()
        .and_then(|o| o.get("skipEmptyExchange"))
        .is_some_and(|v| matches!(v, Bson::Boolean(true)) || v.as_i32().is_some_and(|i| i != 0))
}

/// The user resolved (`None`: no such user), or the role that does not exist.
fn resolve(
    name: &UserName,
    users: &dyn UserLookup,
) -> Option<Result<Arc<ResolvedUser>, AuthError>> {
    Some(users.resolve(name)?.map_err(|role: RoleName| {
        AuthError::authentication_failed(format!(
            "user {name} has a role that does not exist: {role}"
        ))
    }))
}

impl AuthSession {
    /// The fields of a `hello` request that [`AuthSession::sasl_supported_mechs`],
    /// [`AuthSession::speculative`] and [`AuthSession::named_user`] read: a body without
    /// either needs nothing from them.
    pub const HELLO_FIELDS: [&'static str; 2] = ["saslSupportedMechs", "speculativeAuthenticate"];

    /// A connection that has not authenticated.
    pub fn new() -> AuthSession {
        AuthSession::default()
    }

    /// Records the subject of the client certificate the TLS handshake verified.
    pub fn set_peer_subject(&mut self, subject: Option<String>) {
        self.peer_subject = subject;
    }

    /// Records the connection's client and server addresses.
    pub fn set_addresses(&mut self, addresses: ConnectionAddresses) {
        self.addresses = Some(addresses);
    }

    /// Records that the client certificate names a member of the cluster, and whether
    /// members may authenticate by certificate (see [`AuthSession::authenticate`]).
    pub fn set_peer_cluster_member(&mut self, accepted: Option<bool>) {
        self.peer_member = accepted;
    }

    /// The client certificate's subject, when there is one.
    pub fn peer_subject(&self) -> Option<&str> {
        self.peer_subject.as_deref()
    }

    /// The authenticated user, if any.
    pub fn principal(&self) -> Option<&Principal> {
        self.principal.as_deref()
    }

    /// Reads the authenticated user again after the users or roles changed (`dropUser`,
    /// `updateUser` of its roles, a role it inherits changed): mongod re-reads the user on its
    /// next command. A user that is gone, no longer resolves, or whose restrictions this
    /// connection no longer meets is logged out.
    pub fn refresh_user(&mut self, users: &dyn UserLookup) {
        let Some(name) = self.principal.as_ref().map(|p| p.user.clone()) else {
            return;
        };
        if name.is_internal() {
            return;
        }
        self.principal = match resolve(&name, users) {
            Some(Ok(user)) if self.restrictions_met(&user.restrictions) => {
                Some(Arc::clone(&user.principal))
            }
            _ => None,
        };
    }

    /// Whether this connection meets the `authenticationRestrictions` of a user and its
    /// roles.
    fn restrictions_met(&self, restrictions: &[Vec<Bson>]) -> bool {
        restrictions.iter().all(|r| {
            r.is_empty()
                || self
                    .addresses
                    .is_some_and(|at| super::restrictions::met(r, at))
        })
    }

    /// `saslStart` on `db`.
    pub fn sasl_start(
        &mut self,
        db: &str,
        body: &Document,
        users: &dyn UserLookup,
    ) -> (Result<Document, AuthError>, Outcome) {
        self.pending = None;
        let mechanism_name = match body.get("mechanism") {
            Some(Bson::String(m)) => m.as_str(),
            Some(_) => {
                let e = AuthError::new(
                    ErrorCode::TypeMismatch,
                    "BSON field 'saslStart.mechanism' is the wrong type, expected type 'string'",
                );
                return failed(None, None, e);
            }
            None => {
                let e = AuthError::new(
                    ErrorCode(40414),
                    "BSON field 'saslStart.mechanism' is missing but a required field",
                );
                return failed(None, None, e);
            }
        };
        let Some(mechanism) = ScramMechanism::from_name(mechanism_name) else {
            let e = AuthError::new(
                ErrorCode::MechanismUnavailable,
                format!(
                    "Received authentication for mechanism {mechanism_name} which is unknown or \
                     not enabled"
                ),
            );
            return failed(Mechanism::from_name(mechanism_name), None, e);
        };
        let (payload, as_string) = match read_payload(body, "saslStart") {
            Ok(p) => p,
            Err(e) => return failed(Some(mechanism.mechanism()), None, e),
        };
        let scram_failed = |user: Option<UserName>, e: ScramError| {
            failed(Some(mechanism.mechanism()), user, e.to_auth_error())
        };
        let first = match ClientFirst::parse(&payload) {
            Ok(f) => f,
            Err(e) => return scram_failed(None, e),
        };
        let name = UserName::new(first.user(), db);
        let credentials = if name.is_internal() {
            match users.internal_credentials() {
                Some(c) => c.scram(mechanism).to_vec(),
                None => return scram_failed(Some(name), ScramError::InternalUserWithoutKeyfile),
            }
        } else {
            match users.scram_credential(&name, mechanism) {
                Some(c) => c.into_iter().collect(),
                None => {
                    let e = ScramError::UserNotFound {
                        user: name.user.clone(),
                        db: name.db.clone(),
                    };
                    return scram_failed(Some(name), e);
                }
            }
        };
        let nonce = match server_nonce() {
            Ok(n) => n,
            Err(e) => return scram_failed(Some(name), e),
        };
        match ServerConversation::start_owned(
            mechanism,
            first,
            credentials,
            &nonce,
            skip_empty_exchange(body),
        ) {
            Ok((conversation, step)) => {
                self.pending = Some(Pending {
                    db: db.to_string(),
                    conversation,
                    payload_as_string: as_string,
                });
                (Ok(sasl_reply(&step, as_string)), Outcome::Continued)
            }
            Err(e) => scram_failed(Some(name), e),
        }
    }

    /// `saslContinue`.
    pub fn sasl_continue(
        &mut self,
        body: &Document,
        users: &dyn UserLookup,
    ) -> (Result<Document, AuthError>, Outcome) {
        let Some(mut pending) = self.pending.take() else {
            return failed(
                None,
                None,
                AuthError::new(ErrorCode::ProtocolError, "No SASL session state found"),
            );
        };
        let mechanism = pending.conversation.mechanism().mechanism();
        let name = UserName::new(pending.conversation.user(), pending.db.clone());
        let id_ok = match body.get("conversationId") {
            Some(v) => crate::value::field::is_number(v) && crate::value::field::to_f64(v) == 1.0,
            None => false,
        };
        if !id_ok {
            return failed(
                Some(mechanism),
                Some(name),
                AuthError::new(ErrorCode::ProtocolError, "sasl: Mismatched conversation id"),
            );
        }
        let (payload, _) = match read_payload(body, "saslContinue") {
            Ok(p) => p,
            Err(e) => return failed(Some(mechanism), Some(name), e),
        };
        let step = match pending.conversation.step(&payload) {
            Ok(step) => step,
            Err(e) => return failed(Some(mechanism), Some(name), e.to_auth_error()),
        };
        let reply = sasl_reply(&step, pending.payload_as_string);
        if !step.done {
            self.pending = Some(pending);
            return (Ok(reply), Outcome::Continued);
        }
        match self.principal_for(&name, users) {
            Ok(principal) => {
                self.principal = Some(principal);
                (
                    Ok(reply),
                    Outcome::Succeeded {
                        user: name,
                        mechanism,
                    },
                )
            }
            Err(e) => failed(Some(mechanism), Some(name), e),
        }
    }

    fn principal_for(
        &self,
        name: &UserName,
        users: &dyn UserLookup,
    ) -> Result<Arc<Principal>, AuthError> {
        if name.is_internal() {
            return Ok(Arc::new(Principal::internal()));
        }
        match resolve(name, users) {
            Some(user) => {
                let user = user?;
                if !self.restrictions_met(&user.restrictions) {
                    return Err(AuthError::authentication_failed(format!(
                        "Client {} does not meet the authentication restrictions of user \"{}\" \
                         for db \"{}\"",
                        self.addresses
                            .map_or("at an unknown address".to_string(), |a| a
                                .client
                                .to_string()),
                        name.user,
                        name.db
                    )));
                }
                Ok(Arc::clone(&user.principal))
            }
            None => Err(AuthError::authentication_failed(format!(
                "Could not find user \"{}\" for db \"{}\"",
                name.user, name.db
            ))),
        }
    }

    /// `authenticate` (MONGODB-X509 only, as on mongod 6+): the user is the verified client
    /// certificate's subject, in `$external`.
    pub fn authenticate(
        &mut self,
        db: &str,
        body: &Document,
        users: &dyn UserLookup,
    ) -> (Result<Document, AuthError>, Outcome) {
        self.pending = None;
        let mechanism = body.get_str("mechanism").unwrap_or("");
        if Mechanism::from_name(mechanism) != Some(Mechanism::MongodbX509) {
            let e = AuthError::new(
                ErrorCode::MechanismUnavailable,
                format!(
                    "Received authentication for mechanism {mechanism} which is unknown or not \
                     enabled"
                ),
            );
            return failed(None, None, e);
        }
        let x509 = Some(Mechanism::MongodbX509);
        if db != EXTERNAL_DB {
            let e = AuthError::new(
                ErrorCode::BadValue,
                "X.509 authentication must always use the $external database.",
            );
            return failed(x509, None, e);
        }
        let Some(subject) = self.peer_subject.clone() else {
            let e = AuthError::new(
                ErrorCode::AuthenticationFailed,
                "No verified subject name available from client",
            );
            return failed(x509, None, e);
        };
        if let Ok(claimed) = body.get_str("user") {
            if claimed != subject {
                let e = AuthError::new(
                    ErrorCode::AuthenticationFailed,
                    format!("There is no x.509 client certificate matching the user {claimed}"),
                );
                return failed(x509, Some(UserName::new(claimed, EXTERNAL_DB)), e);
            }
        }
        // A cluster member's certificate is `__system`, as on mongod; where members may not
        // use certificates it authenticates no one.
        match self.peer_member {
            Some(true) => {
                self.principal = Some(Arc::new(Principal::internal()));
                return (
                    Ok(doc! {"dbname": EXTERNAL_DB, "user": subject}),
                    Outcome::Succeeded {
                        user: UserName::new(INTERNAL_USER, INTERNAL_DB),
                        mechanism: Mechanism::MongodbX509,
                    },
                );
            }
            Some(false) => {
                let e = AuthError::new(
                    ErrorCode::AuthenticationFailed,
                    "The provided certificate can only be used for cluster authentication, not \
                     client authentication. The current configuration does not allow x.509 \
                     cluster authentication, check the --clusterAuthMode flag",
                );
                return failed(x509, None, e);
            }
            None => {}
        }
        let name = UserName::new(subject.clone(), EXTERNAL_DB);
        match self.principal_for(&name, users) {
            Ok(principal) => {
                self.principal = Some(principal);
                (
                    Ok(doc! {"dbname": EXTERNAL_DB, "user": subject}),
                    Outcome::Succeeded {
                        user: name,
                        mechanism: Mechanism::MongodbX509,
                    },
                )
            }
            Err(e) => failed(x509, Some(name), e),
        }
    }

    /// `logout`: forgets the authenticated user and any conversation.
    pub fn logout(&mut self) -> Document {
        self.pending = None;
        self.principal = None;
        Document::new()
    }

    /// The user an authentication request names before it runs: a `saslStart`'s SCRAM user
    /// on `db`, or a `hello`'s `saslSupportedMechs` user or speculative `saslStart` user. A
    /// server that reads its users from elsewhere fetches one it does not know yet. `None` for
    /// any other request, or when the request cannot be read (running it says why).
    pub fn named_user(command: &str, db: &str, body: &Document) -> Option<UserName> {
        let sasl_start = |db: &str, body: &Document| {
            let (payload, _) = read_payload(body, "saslStart").ok()?;
            let first = ClientFirst::parse(&payload).ok()?;
            Some(UserName::new(first.user(), db))
        };
        match command {
            "saslStart" => sasl_start(db, body),
            "hello" | "isMaster" | "ismaster" => {
                if let Some(Bson::String(s)) = body.get("saslSupportedMechs") {
                    return UserName::parse_db_dot_user(s).ok();
                }
                let spec = body.get_document("speculativeAuthenticate").ok()?;
                if !spec.contains_key("saslStart") {
                    return None;
                }
                sasl_start(spec.get_str("db").ok()?, spec)
            }
            _ => None,
        }
    }

    /// `hello {saslSupportedMechs: "<db>.<user>"}`: the mechanisms of that user, `None` when
    /// the request did not ask or the user does not exist (mongod then omits the field).
    pub fn sasl_supported_mechs(
        hello: &Document,
        users: &dyn UserLookup,
    ) -> Result<Option<Vec<&'static str>>, AuthError> {
        let Some(value) = hello.get("saslSupportedMechs") else {
            return Ok(None);
        };
        let Bson::String(s) = value else {
            return Err(AuthError::new(
                ErrorCode::TypeMismatch,
                "BSON field 'hello.saslSupportedMechs' is the wrong type, expected type 'string'",
            ));
        };
        let name = UserName::parse_db_dot_user(s)?;
        if name.is_internal() {
            return Ok(users.internal_credentials().map(|_| {
                ScramMechanism::ALL
                    .into_iter()
                    .map(|m| m.name())
                    .collect::<Vec<_>>()
            }));
        }
        Ok(users
            .user(&name)
            .map(|u| u.credentials.sasl_supported_mechs()))
    }

    /// `hello {speculativeAuthenticate: {…}}`: the first step of a `saslStart` or a whole
    /// X.509 `authenticate`, answered inside the `hello` reply. `None` (the field is left out)
    /// when the request did not carry one or it failed; the outcome is returned either way.
    pub fn speculative(
        &mut self,
        hello: &Document,
        users: &dyn UserLookup,
    ) -> Option<(Option<Document>, Outcome)> {
        let spec = hello.get_document("speculativeAuthenticate").ok()?;
        let db = spec.get_str("db").ok()?.to_string();
        let (result, outcome) = if spec.contains_key("saslStart") {
            self.sasl_start(&db, spec, users)
        } else if spec.contains_key("authenticate") {
            self.authenticate(&db, spec, users)
        } else {
            return None;
        };
        Some((result.ok(), outcome))
    }

    /// The `authInfo` of `connectionStatus`.
    pub fn auth_info(&self, show_privileges: bool) -> Document {
        let (users, roles) = match &self.principal {
            Some(p) => (
                vec![Bson::Document(
                    doc! {"user": &p.user.user, "db": &p.user.db},
                )],
                p.roles
                    .iter()
                    .map(|r| Bson::Document(r.to_document()))
                    .collect(),
            ),
            None => (Vec::new(), Vec::new()),
        };
        let mut d = doc! {"authenticatedUsers": users, "authenticatedUserRoles": roles};
        if show_privileges {
            let privileges = self
                .principal
                .as_ref()
                .map(|p| p.privileges.to_documents())
                .unwrap_or_default();
            d.insert("authenticatedUserPrivileges", privileges);
        }
        d
    }
}

fn failed(
    mechanism: Option<Mechanism>,
    user: Option<UserName>,
    error: AuthError,
) -> (Result<Document, AuthError>, Outcome) {
    (
        Err(error.clone()),
        Outcome::Failed {
            mechanism,
            user,
            error,
        },
    )
}

#[cfg(test)]
mod tests;
