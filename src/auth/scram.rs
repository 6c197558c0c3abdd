//! SCRAM-SHA-1 and SCRAM-SHA-256 (RFC 5802, RFC 7677) as mongod implements them: key
//! derivation, the stored credentials of `createUser`, the server side of the conversation, and
//! the client side Sluice uses to authenticate itself to shards and config servers as
//! `__system`.
//!
//! The primitives come from the RustCrypto crates (`sha1`, `sha2`, `hmac`, `pbkdf2`) and the
//! SASLprep profile from `stringprep`; only the protocol is written here. The server never sees
//! a password: it holds `StoredKey`/`ServerKey` (what `admin.system.users` keeps) and checks the
//! client's proof against them in constant time.
//!
//! MongoDB specifics, all from mongod's conversation:
//! - SCRAM-SHA-1 runs over the hex MD5 digest of `"<user>:mongo:<password>"`, not the password;
//!   SCRAM-SHA-256 over the SASLprepped password. User names are never prepped.
//! - The server nonce is 24 random bytes (base64, 32 characters) appended to the client's.
//! - Parsing is mongod's: the gs2 flag must be `n` or `y`, an authzid must equal the user, `m=`
//!   is refused, empty fields between commas are skipped, the proof is the field after the last
//!   comma.
//! - After the server's `v=` the conversation is done when the client asked for
//!   `skipEmptyExchange`; otherwise one more, empty, round ends it.
//! - Every failure inside a step is one [`ScramError`] with mongod's internal message (for the
//!   log); the client is answered 18 "Authentication failed." for all of them alike
//!   ([`ScramError::to_auth_error`]), so an unknown user looks like a wrong password.

use super::{constant_time_eq, secure_random, AuthError};
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};
use sha1::Sha1;
use sha2::{Digest, Sha256};
use std::fmt;

/// The smallest iteration count mongod and the drivers accept (`kIterationCountMinimum`).
pub const MIN_ITERATIONS: u32 = 4096;

/// The two SCRAM hash functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScramMechanism {
    /// SCRAM-SHA-1.
    Sha1,
    /// SCRAM-SHA-256.
    Sha256,
}

impl ScramMechanism {
    /// Both, in mongod's registry order.
    pub const ALL: [ScramMechanism; 2] = [ScramMechanism::Sha1, ScramMechanism::Sha256];

    /// The mechanism name (`SCRAM-SHA-1`, `SCRAM-SHA-256`), also the key in `credentials`.
    pub fn name(self) -> &'static str {
        match self {
            ScramMechanism::Sha1 => "SCRAM-SHA-1",
            ScramMechanism::Sha256 => "SCRAM-SHA-256",
        }
    }

    /// The mechanism of a name.
    pub fn from_name(name: &str) -> Option<ScramMechanism> {
        ScramMechanism::ALL.into_iter().find(|m| m.name() == name)
    }

    /// The general mechanism this is.
    pub fn mechanism(self) -> super::Mechanism {
        match self {
            ScramMechanism::Sha1 => super::Mechanism::ScramSha1,
            ScramMechanism::Sha256 => super::Mechanism::ScramSha256,
        }
    }

    /// Bytes of a hash (and of StoredKey, ServerKey, proofs and signatures).
    pub fn hash_len(self) -> usize {
        match self {
            ScramMechanism::Sha1 => 20,
            ScramMechanism::Sha256 => 32,
        }
    }

    /// Bytes of a generated salt: the hash length minus 4, as mongod generates them (16 for
    /// SHA-1, 28 for SHA-256).
    pub fn salt_len(self) -> usize {
        self.hash_len() - 4
    }

    /// mongod's default iteration count (`scramIterationCount` 10000,
    /// `scramSHA256IterationCount` 15000).
    pub fn default_iterations(self) -> u32 {
        match self {
            ScramMechanism::Sha1 => 10_000,
            ScramMechanism::Sha256 => 15_000,
        }
    }

    fn hash(self, data: &[u8]) -> Vec<u8> {
        match self {
            ScramMechanism::Sha1 => Sha1::digest(data).to_vec(),
            ScramMechanism::Sha256 => Sha256::digest(data).to_vec(),
        }
    }

    fn hmac(self, key: &[u8], data: &[u8]) -> Vec<u8> {
        // HMAC takes keys of any length: `new_from_slice` cannot fail for it.
        match self {
            ScramMechanism::Sha1 => match <Hmac<Sha1> as KeyInit>::new_from_slice(key) {
                Ok(mut mac) => {
                    mac.update(data);
                    mac.finalize().into_bytes().to_vec()
                }
                Err(_) => Vec::new(),
            },
            ScramMechanism::Sha256 => match <Hmac<Sha256> as KeyInit>::new_from_slice(key) {
                Ok(mut mac) => {
                    mac.update(data);
                    mac.finalize().into_bytes().to_vec()
                }
                Err(_) => Vec::new(),
            },
        }
    }

    fn pbkdf2(self, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
        let mut out = vec![0u8; self.hash_len()];
        let ok = match self {
            ScramMechanism::Sha1 => {
                pbkdf2::pbkdf2::<Hmac<Sha1>>(password, salt, iterations, &mut out).is_ok()
            }
            ScramMechanism::Sha256 => {
                pbkdf2::pbkdf2::<Hmac<Sha256>>(password, salt, iterations, &mut out).is_ok()
            }
        };
        if ok {
            out
        } else {
            Vec::new()
        }
    }
}

impl fmt::Display for ScramMechanism {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// mongod's password digest for SCRAM-SHA-1 (and for the legacy MONGODB-CR before it): the
/// lowercase hex MD5 of `"<user>:mongo:<password>"`. Neither part is SASLprepped.
pub fn mongo_password_digest(user: &str, password: &str) -> String {
    use md5::{Digest as _, Md5};
    let digest = Md5::digest(format!("{user}:mongo:{password}").as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Why a password cannot be prepared for SCRAM-SHA-256, with the code and message mongod's ICU
/// SASLprep gives (`createUser`/`updateUser` report them; a client conversation reports them
/// as a local error).
pub fn saslprep_password(password: &str) -> Result<String, AuthError> {
    use crate::value::error_codes::ErrorCode;
    if password.is_empty() {
        return Err(AuthError::new(
            ErrorCode::SaslPrepEmpty,
            "Error preflighting UTF-8 conversion: U_STRING_NOT_TERMINATED_WARNING",
        ));
    }
    match stringprep::saslprep(password) {
        Ok(p) if p.contains('\0') || p.is_empty() => Err(AuthError::new(
            ErrorCode::SaslPrepProhibited,
            "Error preflighting normalization: U_STRINGPREP_PROHIBITED_ERROR",
        )),
        Ok(p) => Ok(p.into_owned()),
        Err(e) => {
            let name = if e.to_string().contains("bidirectional") {
                "U_STRINGPREP_CHECK_BIDI_ERROR"
            } else {
                "U_STRINGPREP_PROHIBITED_ERROR"
            };
            Err(AuthError::new(
                ErrorCode::SaslPrepProhibited,
                format!("Error preflighting normalization: {name}"),
            ))
        }
    }
}

/// The password SCRAM hashes for `user`: the MD5 digest for SHA-1, the SASLprepped password for
/// SHA-256.
pub fn prepare_password(
    mechanism: ScramMechanism,
    user: &str,
    password: &str,
) -> Result<String, AuthError> {
    match mechanism {
        ScramMechanism::Sha1 => Ok(mongo_password_digest(user, password)),
        ScramMechanism::Sha256 => saslprep_password(password),
    }
}

/// A stored SCRAM credential: the value of `credentials."SCRAM-SHA-…"` in a user document.
///
/// The keys are kept decoded; the salt is kept as the base64 text it is stored as, because the
/// server-first message repeats that text verbatim.
#[derive(Clone, PartialEq, Eq)]
pub struct ScramCredential {
    /// `iterationCount`.
    pub iteration_count: u32,
    /// `salt`, base64 as stored.
    pub salt: String,
    /// `storedKey`, decoded: H(ClientKey).
    pub stored_key: Vec<u8>,
    /// `serverKey`, decoded: HMAC(SaltedPassword, "Server Key").
    pub server_key: Vec<u8>,
}

impl fmt::Debug for ScramCredential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Keys are password equivalents for a replay-free attacker: keep them out of logs.
        f.debug_struct("ScramCredential")
            .field("iteration_count", &self.iteration_count)
            .field("salt", &self.salt)
            .field("stored_key", &"<redacted>")
            .field("server_key", &"<redacted>")
            .finish()
    }
}

impl ScramCredential {
    /// Derives the credential of an already prepared password (see [`prepare_password`]) for
    /// a given salt and iteration count.
    pub fn derive(
        mechanism: ScramMechanism,
        prepared_password: &str,
        salt: &[u8],
        iteration_count: u32,
    ) -> ScramCredential {
        let salted = mechanism.pbkdf2(prepared_password.as_bytes(), salt, iteration_count);
        let client_key = mechanism.hmac(&salted, b"Client Key");
        ScramCredential {
            iteration_count,
            salt: BASE64.encode(salt),
            stored_key: mechanism.hash(&client_key),
            server_key: mechanism.hmac(&salted, b"Server Key"),
        }
    }

    /// Generates the credential `createUser` stores for `user`/`password`: a random salt of
    /// the mechanism's length and the given iteration count (mongod's defaults are
    /// [`ScramMechanism::default_iterations`]).
    pub fn generate(
        mechanism: ScramMechanism,
        user: &str,
        password: &str,
        iteration_count: u32,
    ) -> Result<ScramCredential, AuthError> {
        let prepared = prepare_password(mechanism, user, password)?;
        let mut salt = vec![0u8; mechanism.salt_len()];
        secure_random(&mut salt)?;
        Ok(ScramCredential::derive(
            mechanism,
            &prepared,
            &salt,
            iteration_count.max(MIN_ITERATIONS),
        ))
    }

    /// Whether the credential can serve a conversation: mongod's `isValid` (non-empty salt
    /// and keys, a positive count) plus key lengths of the mechanism's hash.
    pub fn is_valid(&self, mechanism: ScramMechanism) -> bool {
        self.iteration_count > 0
            && !self.salt.is_empty()
            && self.stored_key.len() == mechanism.hash_len()
            && self.server_key.len() == mechanism.hash_len()
    }
}

/// A failure inside a SCRAM step, with mongod's internal message. Clients only ever see
/// [`ScramError::to_auth_error`]: 18 "Authentication failed.".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScramError {
    /// A malformed message (mongod's BadValue texts).
    Malformed(String),
    /// No such user (mongod's UserNotFound from the user lookup).
    UserNotFound {
        /// The user name from the client-first message.
        user: String,
        /// The authentication database.
        db: String,
    },
    /// The user exists but has no credentials of this mechanism.
    NoCredentials(ScramMechanism),
    /// The stored credentials are unusable.
    CorruptCredentials(ScramMechanism),
    /// `__system` on a server started without a keyfile.
    InternalUserWithoutKeyfile,
    /// The mechanism is refused for this user (a disabled mechanism, or keyfile cluster
    /// authentication no longer accepted).
    Disallowed(String),
    /// The client's proof does not match.
    StoredKeyMismatch,
    /// A step after the last one.
    InvalidStep(u32),
    /// No randomness available for the server nonce.
    NoRandomness,
}

impl fmt::Display for ScramError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScramError::Malformed(m) | ScramError::Disallowed(m) => f.write_str(m),
            ScramError::UserNotFound { user, db } => {
                write!(f, "Could not find user \"{user}\" for db \"{db}\"")
            }
            ScramError::NoCredentials(m) => write!(
                f,
                "Unable to use {m} based authentication for user without any {m} credentials \
                 registered"
            ),
            ScramError::CorruptCredentials(m) => write!(
                f,
                "Unable to validate {m} authentication due to corrupted stored credentials"
            ),
            ScramError::InternalUserWithoutKeyfile => f.write_str(
                "It is not possible to authenticate as the __system user on servers started \
                 without a --keyFile parameter",
            ),
            ScramError::StoredKeyMismatch => {
                f.write_str("SCRAM authentication failed, storedKey mismatch")
            }
            ScramError::InvalidStep(n) => write!(f, "Invalid SCRAM authentication step: {n}"),
            ScramError::NoRandomness => f.write_str("no secure random source for the nonce"),
        }
    }
}

impl std::error::Error for ScramError {}

impl ScramError {
    /// What the client is told: 18 "Authentication failed.", the reason kept for the log.
    pub fn to_auth_error(&self) -> AuthError {
        AuthError::authentication_failed(self.to_string())
    }
}

fn malformed(msg: impl Into<String>) -> ScramError {
    ScramError::Malformed(msg.into())
}

/// RFC 5802 user names encode `,` and `=` as `=2C` and `=3D`; mongod decodes exactly those
/// two sequences.
fn decode_user(s: &str) -> String {
    s.replace("=2C", ",").replace("=3D", "=")
}

/// RFC 5802 escaping of a user name for the `n=` attribute.
pub fn encode_user(s: &str) -> String {
    s.replace('=', "=3D").replace(',', "=2C")
}

fn utf8(payload: &[u8]) -> Result<&str, ScramError> {
    std::str::from_utf8(payload).map_err(|_| malformed("SCRAM message is not valid UTF-8"))
}

/// The client-first message, parsed (mongod's rules): what the server needs to look the user
/// up before it can answer.
#[derive(Clone, PartialEq, Eq)]
pub struct ClientFirst {
    user: String,
    nonce: String,
    bare: String,
}

impl fmt::Debug for ClientFirst {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientFirst")
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

impl ClientFirst {
    /// Parses `gs2-header client-first-message-bare`, e.g. `n,,n=user,r=nonce`.
    pub fn parse(payload: &[u8]) -> Result<ClientFirst, ScramError> {
        let input = utf8(payload)?;
        let bad_count = |got: usize| {
            malformed(format!(
                "Incorrect number of arguments for first SCRAM client message, got {got} \
                 expected at least 3"
            ))
        };
        let Some(cbind_comma) = input.find(',') else {
            return Err(bad_count(1));
        };
        let flag = &input[..cbind_comma];
        if flag.starts_with("p=") {
            return Err(malformed("Server does not support channel binding"));
        }
        if flag != "y" && flag != "n" {
            return Err(malformed(format!(
                "Incorrect SCRAM client message prefix: {flag}"
            )));
        }
        let rest = &input[cbind_comma + 1..];
        let Some(header_comma) = rest.find(',') else {
            return Err(bad_count(2));
        };
        let mut authzid = &rest[..header_comma];
        if !authzid.is_empty() {
            match authzid.strip_prefix("a=") {
                Some(a) => authzid = a,
                None => return Err(malformed(format!("Incorrect SCRAM authzid: {authzid}"))),
            }
        }
        let bare = &rest[header_comma + 1..];
        if bare.starts_with("m=") {
            return Err(malformed("SCRAM mandatory extensions are not supported"));
        }
        let fields: Vec<&str> = bare.split(',').filter(|f| !f.is_empty()).collect();
        if fields.len() < 2 {
            return Err(bad_count(fields.len() + 2));
        }
        if !fields[0].starts_with("n=") || fields[0].len() < 3 {
            return Err(malformed(format!("Invalid SCRAM user name: {}", fields[0])));
        }
        let user = decode_user(&fields[0][2..]);
        if !authzid.is_empty() && user != authzid {
            return Err(malformed(format!(
                "SCRAM user name {user} does not match authzid {authzid}"
            )));
        }
        if !fields[1].starts_with("r=") || fields[1].len() < 6 {
            return Err(malformed(format!(
                "Invalid SCRAM client nonce: {}",
                fields[1]
            )));
        }
        Ok(ClientFirst {
            user,
            nonce: fields[1][2..].to_string(),
            bare: bare.to_string(),
        })
    }

    /// The user name, decoded (`=2C`, `=3D`), not prepped.
    pub fn user(&self) -> &str {
        &self.user
    }

    /// The client's nonce.
    pub fn nonce(&self) -> &str {
        &self.nonce
    }
}

/// A fresh server nonce: 24 bytes from the CSPRNG, base64 (32 characters), as mongod makes it.
pub fn server_nonce() -> Result<String, ScramError> {
    let mut bytes = [0u8; 24];
    secure_random(&mut bytes).map_err(|_| ScramError::NoRandomness)?;
    Ok(BASE64.encode(bytes))
}

/// What one server step answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerStep {
    /// The reply's `payload`.
    pub payload: Vec<u8>,
    /// The reply's `done`: the user is authenticated once this is true.
    pub done: bool,
}

/// The server side of one SCRAM conversation, after the first step.
///
/// Made by [`ServerConversation::start`] once the user was looked up; each later
/// `saslContinue` payload goes to [`ServerConversation::step`]. A conversation that failed
/// must be dropped (the session does), so a replayed or retried step cannot continue it.
pub struct ServerConversation {
    mechanism: ScramMechanism,
    user: String,
    nonce: String,
    auth_message: String,
    secrets: Vec<ScramCredential>,
    skip_empty_exchange: bool,
    step: u32,
    done: bool,
}

impl fmt::Debug for ServerConversation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerConversation")
            .field("mechanism", &self.mechanism)
            .field("user", &self.user)
            .field("step", &self.step)
            .finish_non_exhaustive()
    }
}

impl ServerConversation {
    /// Step 1: answers the client-first message with the server-first message
    /// `r=<client nonce><server nonce>,s=<salt>,i=<count>`.
    ///
    /// `credentials` are the user's credentials of this mechanism; more than one only for
    /// `__system` with a multi-key keyfile (each is tried in turn, the first is answered with).
    /// An empty list means the user has none of this mechanism. `server_nonce` comes from
    /// [`server_nonce`] (tests pass fixed ones).
    pub fn start(
        mechanism: ScramMechanism,
        first: ClientFirst,
        credentials: &[ScramCredential],
        server_nonce: &str,
        skip_empty_exchange: bool,
    ) -> Result<(ServerConversation, ServerStep), ScramError> {
        Self::start_owned(
            mechanism,
            first,
            credentials.to_vec(),
            server_nonce,
            skip_empty_exchange,
        )
    }

    /// As [`ServerConversation::start`], keeping `credentials` as they are given (the
    /// conversation holds them until its last step) rather than copying them.
    pub fn start_owned(
        mechanism: ScramMechanism,
        first: ClientFirst,
        credentials: Vec<ScramCredential>,
        server_nonce: &str,
        skip_empty_exchange: bool,
    ) -> Result<(ServerConversation, ServerStep), ScramError> {
        let Some(primary) = credentials.first() else {
            return Err(ScramError::NoCredentials(mechanism));
        };
        if credentials.iter().any(|c| !c.is_valid(mechanism)) {
            return Err(ScramError::CorruptCredentials(mechanism));
        }
        let nonce = format!("{}{server_nonce}", first.nonce);
        let server_first = format!("r={nonce},s={},i={}", primary.salt, primary.iteration_count);
        let auth_message = format!("{},{server_first}", first.bare);
        Ok((
            ServerConversation {
                mechanism,
                user: first.user,
                nonce,
                auth_message,
                secrets: credentials,
                skip_empty_exchange,
                step: 1,
                done: false,
            },
            ServerStep {
                payload: server_first.into_bytes(),
                done: false,
            },
        ))
    }

    /// The user name of the conversation.
    pub fn user(&self) -> &str {
        &self.user
    }

    /// The mechanism of the conversation.
    pub fn mechanism(&self) -> ScramMechanism {
        self.mechanism
    }

    /// Whether the conversation finished successfully.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// The next step: the client-final message (step 2), then, without `skipEmptyExchange`,
    /// the empty last round (step 3, whose payload mongod does not examine).
    pub fn step(&mut self, payload: &[u8]) -> Result<ServerStep, ScramError> {
        self.step += 1;
        let total = if self.skip_empty_exchange { 2 } else { 3 };
        if self.step > total || self.done {
            return Err(ScramError::InvalidStep(self.step));
        }
        if self.step == 3 {
            self.done = true;
            return Ok(ServerStep {
                payload: Vec::new(),
                done: true,
            });
        }
        let signature = self.verify_client_final(payload)?;
        self.done = self.skip_empty_exchange;
        Ok(ServerStep {
            payload: format!("v={signature}").into_bytes(),
            done: self.skip_empty_exchange,
        })
    }

    fn verify_client_final(&mut self, payload: &[u8]) -> Result<String, ScramError> {
        let input = utf8(payload)?;
        let bad_count = |got: usize| {
            malformed(format!(
                "Incorrect number of arguments for second SCRAM client message, got {got} \
                 expected at least 3"
            ))
        };
        let Some(last_comma) = input.rfind(',') else {
            return Err(bad_count(1));
        };
        let without_proof = &input[..last_comma];
        let last = &input[last_comma + 1..];
        if last.len() < 3 || !last.starts_with("p=") {
            return Err(malformed(format!("Incorrect SCRAM ClientProof: {last}")));
        }
        let fields: Vec<&str> = without_proof.split(',').filter(|f| !f.is_empty()).collect();
        if fields.len() < 2 {
            return Err(bad_count(fields.len() + 1));
        }
        if !fields[0].starts_with("c=") || fields[0].len() < 3 {
            return Err(malformed(format!(
                "Incorrect SCRAM channel binding: {}",
                fields[0]
            )));
        }
        if !fields[1].starts_with("r=") || fields[1].len() < 6 {
            return Err(malformed(format!(
                "Incorrect SCRAM client|server nonce: {}",
                fields[1]
            )));
        }
        let nonce = &fields[1][2..];
        if nonce != self.nonce {
            return Err(malformed(format!(
                "Unmatched SCRAM nonce received from client in second step, expected {} but \
                 received {nonce}",
                self.nonce
            )));
        }
        let auth_message = format!("{},{without_proof}", self.auth_message);
        let proof = BASE64
            .decode(&last[2..])
            .map_err(|_| malformed("Invalid base64 in SCRAM ClientProof"))?;
        let m = self.mechanism;
        for secret in &self.secrets {
            if proof.len() != m.hash_len() {
                break;
            }
            let client_signature = m.hmac(&secret.stored_key, auth_message.as_bytes());
            let client_key: Vec<u8> = client_signature
                .iter()
                .zip(&proof)
                .map(|(a, b)| a ^ b)
                .collect();
            if constant_time_eq(&m.hash(&client_key), &secret.stored_key) {
                let server_signature = m.hmac(&secret.server_key, auth_message.as_bytes());
                return Ok(BASE64.encode(server_signature));
            }
        }
        Err(ScramError::StoredKeyMismatch)
    }
}

/// A failure of Sluice's own client conversation (the server misbehaved or refused).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScramClientError(pub String);

impl fmt::Display for ScramClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ScramClientError {}

/// The client side of SCRAM, for Sluice authenticating to shards and config servers (as
/// `__system` with the keyfile's key, or as any configured user).
///
/// Checks what the drivers check: the server nonce extends ours, `i >= 4096`, and the server's
/// `v=` signature.
pub struct ClientConversation {
    mechanism: ScramMechanism,
    prepared_password: String,
    nonce: String,
    first_bare: String,
    expected_server_signature: Option<Vec<u8>>,
    done: bool,
}

impl fmt::Debug for ClientConversation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientConversation")
            .field("mechanism", &self.mechanism)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl ClientConversation {
    /// Starts a conversation for `user` with `password` (prepared here: digested for SHA-1,
    /// SASLprepped for SHA-256). `client_nonce` is printable base64, normally from
    /// [`ClientConversation::random_nonce`].
    pub fn new(
        mechanism: ScramMechanism,
        user: &str,
        password: &str,
        client_nonce: &str,
    ) -> Result<ClientConversation, ScramClientError> {
        let prepared_password = prepare_password(mechanism, user, password)
            .map_err(|e| ScramClientError(format!("password cannot be prepared: {e}")))?;
        Ok(ClientConversation {
            mechanism,
            prepared_password,
            nonce: client_nonce.to_string(),
            first_bare: format!("n={},r={client_nonce}", encode_user(user)),
            expected_server_signature: None,
            done: false,
        })
    }

    /// 32 random bytes, base64: what the drivers send.
    pub fn random_nonce() -> Result<String, ScramClientError> {
        let mut bytes = [0u8; 32];
        secure_random(&mut bytes).map_err(|e| ScramClientError(e.message))?;
        Ok(BASE64.encode(bytes))
    }

    /// The client-first message: the `saslStart` payload.
    pub fn client_first(&self) -> Vec<u8> {
        format!("n,,{}", self.first_bare).into_bytes()
    }

    /// Answers the server-first message with the client-final message (the `saslContinue`
    /// payload).
    pub fn client_final(&mut self, server_first: &[u8]) -> Result<Vec<u8>, ScramClientError> {
        let text = std::str::from_utf8(server_first)
            .map_err(|_| ScramClientError("server-first message is not UTF-8".into()))?;
        let mut nonce = None;
        let mut salt = None;
        let mut iterations = None;
        for field in text.split(',') {
            if let Some(v) = field.strip_prefix("r=") {
                nonce = Some(v);
            } else if let Some(v) = field.strip_prefix("s=") {
                salt = Some(v);
            } else if let Some(v) = field.strip_prefix("i=") {
                iterations = Some(v);
            } else if field.starts_with("m=") {
                return Err(ScramClientError(
                    "server sent a mandatory SCRAM extension".into(),
                ));
            }
        }
        let (Some(nonce), Some(salt), Some(iterations)) = (nonce, salt, iterations) else {
            return Err(ScramClientError(format!(
                "invalid server-first message: {text}"
            )));
        };
        if !nonce.starts_with(&self.nonce) || nonce.len() == self.nonce.len() {
            return Err(ScramClientError(
                "server nonce does not extend the client nonce".into(),
            ));
        }
        let iterations: u32 = iterations
            .parse()
            .map_err(|_| ScramClientError(format!("invalid iteration count {iterations}")))?;
        if iterations < MIN_ITERATIONS {
            return Err(ScramClientError(format!(
                "server returned an invalid iteration count {iterations}, at least \
                 {MIN_ITERATIONS} is required"
            )));
        }
        let salt_bytes = BASE64
            .decode(salt)
            .map_err(|_| ScramClientError("server sent an invalid salt".into()))?;
        let m = self.mechanism;
        let salted = m.pbkdf2(self.prepared_password.as_bytes(), &salt_bytes, iterations);
        let client_key = m.hmac(&salted, b"Client Key");
        let stored_key = m.hash(&client_key);
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!("{},{text},{without_proof}", self.first_bare);
        let client_signature = m.hmac(&stored_key, auth_message.as_bytes());
        let proof: Vec<u8> = client_key
            .iter()
            .zip(&client_signature)
            .map(|(a, b)| a ^ b)
            .collect();
        let server_key = m.hmac(&salted, b"Server Key");
        self.expected_server_signature = Some(m.hmac(&server_key, auth_message.as_bytes()));
        Ok(format!("{without_proof},p={}", BASE64.encode(proof)).into_bytes())
    }

    /// Checks the server-final message (`v=<signature>`). After it the client is
    /// authenticated; if the reply said `done: false`, one empty `saslContinue` remains.
    pub fn verify_server_final(&mut self, server_final: &[u8]) -> Result<(), ScramClientError> {
        let Some(expected) = &self.expected_server_signature else {
            return Err(ScramClientError(
                "server-final message before the server-first message".into(),
            ));
        };
        let text = std::str::from_utf8(server_final)
            .map_err(|_| ScramClientError("server-final message is not UTF-8".into()))?;
        if let Some(e) = text.strip_prefix("e=") {
            return Err(ScramClientError(format!("server refused: {e}")));
        }
        let Some(v) = text.split(',').find_map(|f| f.strip_prefix("v=")) else {
            return Err(ScramClientError(format!(
                "invalid server-final message: {text}"
            )));
        };
        let got = BASE64
            .decode(v)
            .map_err(|_| ScramClientError("invalid server signature encoding".into()))?;
        if !constant_time_eq(&got, expected) {
            return Err(ScramClientError("server signature mismatch".into()));
        }
        self.done = true;
        Ok(())
    }

    /// Whether the server's signature was verified.
    pub fn is_done(&self) -> bool {
        self.done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(s: &str) -> Vec<u8> {
        BASE64.decode(s).unwrap()
    }

    /// The auth specification's SCRAM-SHA-1 conversation (user `user`, password `pencil`,
    /// over mongod's MD5 digest), replayed against the server with a fixed server nonce.
    #[test]
    fn sha1_server_matches_the_auth_spec_conversation() {
        let prepared = prepare_password(ScramMechanism::Sha1, "user", "pencil").unwrap();
        let cred = ScramCredential::derive(
            ScramMechanism::Sha1,
            &prepared,
            &b64("rQ9ZY3MntBeuP3E1TDVC4w=="),
            10000,
        );
        let first = ClientFirst::parse(b"n,,n=user,r=fyko+d2lbbFgONRv9qkxdawL").unwrap();
        assert_eq!(first.user(), "user");
        let (mut conv, step1) = ServerConversation::start(
            ScramMechanism::Sha1,
            first,
            &[cred],
            "Ho+Vgk7qvUOKUwuWLIWg4l/9SraGMHEE",
            true,
        )
        .unwrap();
        assert_eq!(
            step1.payload,
            b"r=fyko+d2lbbFgONRv9qkxdawLHo+Vgk7qvUOKUwuWLIWg4l/9SraGMHEE,s=rQ9ZY3MntBeuP3E1TDVC4w==,i=10000"
        );
        assert!(!step1.done);
        let step2 = conv
            .step(b"c=biws,r=fyko+d2lbbFgONRv9qkxdawLHo+Vgk7qvUOKUwuWLIWg4l/9SraGMHEE,p=MC2T8BvbmWRckDw8oWl5IVghwCY=")
            .unwrap();
        assert_eq!(step2.payload, b"v=UMWeI25JD1yNYZRMpZ4VHvhZ9e0=");
        assert!(step2.done, "skipEmptyExchange ends the conversation here");
        assert!(conv.is_done());
    }

    /// RFC 7677's SCRAM-SHA-256 example (also the auth specification's).
    #[test]
    fn sha256_server_matches_rfc_7677() {
        let prepared = prepare_password(ScramMechanism::Sha256, "user", "pencil").unwrap();
        let cred = ScramCredential::derive(
            ScramMechanism::Sha256,
            &prepared,
            &b64("W22ZaJ0SNY7soEsUEjb6gQ=="),
            4096,
        );
        let first = ClientFirst::parse(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO").unwrap();
        let (mut conv, step1) = ServerConversation::start(
            ScramMechanism::Sha256,
            first,
            &[cred],
            "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0",
            false,
        )
        .unwrap();
        assert_eq!(
            step1.payload,
            b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
        );
        let step2 = conv
            .step(b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
            .unwrap();
        assert_eq!(
            step2.payload,
            b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
        );
        assert!(
            !step2.done,
            "without skipEmptyExchange one empty round remains"
        );
        let step3 = conv.step(b"").unwrap();
        assert!(step3.done);
        assert!(step3.payload.is_empty());
        assert_eq!(conv.step(b"").unwrap_err(), ScramError::InvalidStep(4));
    }

    /// RFC 5802's own SCRAM-SHA-1 example runs over the plain password (no MongoDB digest):
    /// the key derivation is the RFC's.
    #[test]
    fn sha1_key_derivation_matches_rfc_5802() {
        let cred = ScramCredential::derive(
            ScramMechanism::Sha1,
            "pencil",
            &b64("QSXCR+Q6sek8bf92"),
            4096,
        );
        let first = ClientFirst::parse(b"n,,n=user,r=fyko+d2lbbFgONRv9qkxdawL").unwrap();
        let (mut conv, step1) = ServerConversation::start(
            ScramMechanism::Sha1,
            first,
            &[cred],
            "3rfcNHYJY1ZVvWVs7j",
            true,
        )
        .unwrap();
        assert_eq!(
            step1.payload,
            b"r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,s=QSXCR+Q6sek8bf92,i=4096"
        );
        let step2 = conv
            .step(b"c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,p=v0X8v3Bz2T0CJGbJQyF0X+HI4Ts=")
            .unwrap();
        assert_eq!(step2.payload, b"v=rmF9pqV8S7suAoZWja4dJRkFsKQ=");
    }

    #[test]
    fn client_conversation_reproduces_the_spec_vectors() {
        let mut c = ClientConversation::new(
            ScramMechanism::Sha256,
            "user",
            "pencil",
            "rOprNGfwEbeRWgbNEkqO",
        )
        .unwrap();
        assert_eq!(c.client_first(), b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO");
        let fin = c
            .client_final(b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
            .unwrap();
        assert_eq!(
            fin,
            b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
        );
        c.verify_server_final(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
            .unwrap();
        assert!(c.is_done());

        let mut c1 = ClientConversation::new(
            ScramMechanism::Sha1,
            "user",
            "pencil",
            "fyko+d2lbbFgONRv9qkxdawL",
        )
        .unwrap();
        let fin = c1
            .client_final(b"r=fyko+d2lbbFgONRv9qkxdawLHo+Vgk7qvUOKUwuWLIWg4l/9SraGMHEE,s=rQ9ZY3MntBeuP3E1TDVC4w==,i=10000")
            .unwrap();
        assert_eq!(
            fin,
            b"c=biws,r=fyko+d2lbbFgONRv9qkxdawLHo+Vgk7qvUOKUwuWLIWg4l/9SraGMHEE,p=MC2T8BvbmWRckDw8oWl5IVghwCY="
        );
        c1.verify_server_final(b"v=UMWeI25JD1yNYZRMpZ4VHvhZ9e0=")
            .unwrap();
    }

    #[test]
    fn client_refuses_a_lying_or_weak_server() {
        let new = || {
            ClientConversation::new(ScramMechanism::Sha256, "user", "pencil", "abcdefgh").unwrap()
        };
        let mut c = new();
        let e = c
            .client_final(b"r=zzzzzzzzNONCE,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
            .unwrap_err();
        assert!(e.0.contains("nonce"), "{e}");
        let mut c = new();
        let e = c
            .client_final(b"r=abcdefghNONCE,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4095")
            .unwrap_err();
        assert!(e.0.contains("4096"), "{e}");
        let mut c = new();
        c.client_final(b"r=abcdefghNONCE,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
            .unwrap();
        let e = c
            .verify_server_final(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
            .unwrap_err();
        assert_eq!(e.0, "server signature mismatch");
        let mut c = new();
        assert!(c.verify_server_final(b"v=AAAA").is_err(), "out of order");
    }

    /// The auth specification's SASLprep users: SCRAM-SHA-256 credentials made from the
    /// normalized password accept the non-normalized forms a driver would prep identically.
    #[test]
    fn saslprep_equivalent_passwords_derive_the_same_credential() {
        let salt = [7u8; 28];
        let derive = |pwd: &str| {
            ScramCredential::derive(
                ScramMechanism::Sha256,
                &saslprep_password(pwd).unwrap(),
                &salt,
                4096,
            )
        };
        assert_eq!(derive("IX"), derive("I\u{00AD}X"));
        assert_eq!(derive("\u{2163}"), derive("IV"));
        assert_eq!(derive("\u{2163}"), derive("I\u{00AD}V"));
        assert_ne!(derive("IX"), derive("IV"));
        // SHA-1 digests the raw password: no prepping there.
        assert_ne!(
            mongo_password_digest("IX", "IX"),
            mongo_password_digest("IX", "I\u{00AD}X")
        );
    }

    #[test]
    fn saslprep_errors_carry_mongods_codes() {
        let e = saslprep_password("").unwrap_err();
        assert_eq!(e.code.0, 50687);
        assert_eq!(
            e.message,
            "Error preflighting UTF-8 conversion: U_STRING_NOT_TERMINATED_WARNING"
        );
        let e = saslprep_password("a\0b").unwrap_err();
        assert_eq!(e.code.0, 50692);
        assert_eq!(
            e.message,
            "Error preflighting normalization: U_STRINGPREP_PROHIBITED_ERROR"
        );
    }

    #[test]
    fn mongo_digest_is_md5_hex_of_user_mongo_password() {
        // md5("user:mongo:pencil")
        assert_eq!(
            mongo_password_digest("user", "pencil"),
            "1c33006ec1ffd90f9cadcbcc0e118200"
        );
    }

    #[test]
    fn generated_credentials_have_mongods_shape_and_verify() {
        for m in ScramMechanism::ALL {
            let cred = ScramCredential::generate(m, "alice", "secret", 4096).unwrap();
            assert_eq!(b64(&cred.salt).len(), m.salt_len());
            assert_eq!(
                cred.salt.len(),
                if m == ScramMechanism::Sha1 { 24 } else { 40 }
            );
            assert!(cred.is_valid(m));
            let other = ScramCredential::generate(m, "alice", "secret", 4096).unwrap();
            assert_ne!(cred.salt, other.salt, "salts are random");
            // A full conversation with the client side succeeds.
            let mut client = ClientConversation::new(m, "alice", "secret", "clientnonce").unwrap();
            let first = ClientFirst::parse(&client.client_first()).unwrap();
            let (mut server, s1) =
                ServerConversation::start(m, first, &[cred], &server_nonce().unwrap(), true)
                    .unwrap();
            let fin = client.client_final(&s1.payload).unwrap();
            let s2 = server.step(&fin).unwrap();
            client.verify_server_final(&s2.payload).unwrap();
            assert!(s2.done);
        }
        assert_eq!(ScramMechanism::Sha1.default_iterations(), 10000);
        assert_eq!(ScramMechanism::Sha256.default_iterations(), 15000);
        let low = ScramCredential::generate(ScramMechanism::Sha256, "a", "b", 1).unwrap();
        assert_eq!(low.iteration_count, MIN_ITERATIONS);
    }

    #[test]
    fn server_nonce_is_24_random_bytes_in_base64() {
        let n = server_nonce().unwrap();
        assert_eq!(n.len(), 32);
        assert_eq!(b64(&n).len(), 24);
        assert_ne!(n, server_nonce().unwrap());
    }

    fn parse_err(p: &[u8]) -> String {
        ClientFirst::parse(p).unwrap_err().to_string()
    }

    #[test]
    fn client_first_parsing_follows_mongod() {
        assert_eq!(
            parse_err(b"p=tls-unique,,n=user,r=abcdef"),
            "Server does not support channel binding"
        );
        assert_eq!(
            parse_err(b"x,,n=user,r=abcdef"),
            "Incorrect SCRAM client message prefix: x"
        );
        assert_eq!(
            parse_err(b"n"),
            "Incorrect number of arguments for first SCRAM client message, got 1 expected at least 3"
        );
        assert_eq!(
            parse_err(b"n,"),
            "Incorrect number of arguments for first SCRAM client message, got 2 expected at least 3"
        );
        assert_eq!(
            parse_err(b"n,,n=user"),
            "Incorrect number of arguments for first SCRAM client message, got 3 expected at least 3"
        );
        assert_eq!(
            parse_err(b"n,b=x,n=user,r=abcdef"),
            "Incorrect SCRAM authzid: b=x"
        );
        assert_eq!(
            parse_err(b"n,a=bob,n=user,r=abcdef"),
            "SCRAM user name user does not match authzid bob"
        );
        assert_eq!(
            parse_err(b"n,,m=ext,n=user,r=abcdef"),
            "SCRAM mandatory extensions are not supported"
        );
        assert_eq!(parse_err(b"n,,n=,r=abcdef"), "Invalid SCRAM user name: n=");
        assert_eq!(
            parse_err(b"n,,n=user,r=abc"),
            "Invalid SCRAM client nonce: r=abc"
        );
        assert_eq!(
            parse_err(b"n,,r=abcdef,n=user"),
            "Invalid SCRAM user name: r=abcdef"
        );
        assert_eq!(
            parse_err(b"n,,n=\xff,r=abcdef"),
            "SCRAM message is not valid UTF-8"
        );
        // Lenient where mongod is: empty fields are skipped; `y` is accepted; a matching
        // authzid is fine; escaped names are decoded.
        let f = ClientFirst::parse(b"y,,n=a=2Cb=3Dc,,r=abcdef,x=ext").unwrap();
        assert_eq!(f.user(), "a,b=c");
        assert_eq!(
            ClientFirst::parse(b"n,a=user,n=user,r=abcdef")
                .unwrap()
                .user(),
            "user"
        );
        assert_eq!(f.nonce(), "abcdef");
        assert_eq!(encode_user("a,b=c"), "a=2Cb=3Dc");
    }

    fn conversation(skip: bool) -> (ServerConversation, String) {
        let cred = ScramCredential::derive(ScramMechanism::Sha256, "pencil", &[1u8; 28], 4096);
        let first = ClientFirst::parse(b"n,,n=user,r=clientnonce").unwrap();
        let (conv, s1) =
            ServerConversation::start(ScramMechanism::Sha256, first, &[cred], "SERVERNONCE", skip)
                .unwrap();
        (conv, String::from_utf8(s1.payload).unwrap())
    }

    #[test]
    fn client_final_errors_follow_mongod() {
        let cases: &[(&[u8], &str)] = &[
            (b"invalid", "Incorrect number of arguments for second SCRAM client message, got 1 expected at least 3"),
            (b"c=biws,r=clientnonceSERVERNONCE", "Incorrect SCRAM ClientProof: r=clientnonceSERVERNONCE"),
            (b"c=biws,r=clientnonceSERVERNONCE,p=", "Incorrect SCRAM ClientProof: p="),
            (b"c=biws,p=AAAA", "Incorrect number of arguments for second SCRAM client message, got 2 expected at least 3"),
            (b"c=,r=clientnonceSERVERNONCE,p=AAAA", "Incorrect SCRAM channel binding: c="),
            (b"c=biws,r=abc,p=AAAA", "Incorrect SCRAM client|server nonce: r=abc"),
            (b"c=biws,r=clientnonceOTHERNONCE,p=AAAA", "Unmatched SCRAM nonce received from client in second step, expected clientnonceSERVERNONCE but received clientnonceOTHERNONCE"),
            (b"c=biws,r=clientnonceSERVERNONCE,p=!!!!", "Invalid base64 in SCRAM ClientProof"),
            (b"c=biws,r=clientnonceSERVERNONCE,p=AAAA", "SCRAM authentication failed, storedKey mismatch"),
            (b"c=biws,r=clientnonceSERVERNONCE,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=", "SCRAM authentication failed, storedKey mismatch"),
        ];
        for (payload, message) in cases {
            let (mut conv, _) = conversation(true);
            let e = conv.step(payload).unwrap_err();
            assert_eq!(
                e.to_string(),
                *message,
                "{}",
                String::from_utf8_lossy(payload)
            );
            let client = e.to_auth_error();
            assert_eq!(client.code.0, 18);
            assert_eq!(client.message, "Authentication failed.");
        }
    }

    #[test]
    fn a_finished_conversation_accepts_no_more_steps() {
        let mut client =
            ClientConversation::new(ScramMechanism::Sha256, "user", "pencil", "clientnonce")
                .unwrap();
        let (mut conv, s1) = conversation(true);
        let fin = client.client_final(s1.as_bytes()).unwrap();
        assert!(conv.step(&fin).unwrap().done);
        // A replay of the same client-final on the finished conversation.
        assert_eq!(conv.step(&fin).unwrap_err(), ScramError::InvalidStep(3));
        // A replay of the same client-final in a new conversation fails on the nonce.
        let cred = ScramCredential::derive(ScramMechanism::Sha256, "pencil", &[1u8; 28], 4096);
        let first = ClientFirst::parse(b"n,,n=user,r=clientnonce").unwrap();
        let (mut fresh, _) = ServerConversation::start(
            ScramMechanism::Sha256,
            first,
            &[cred],
            &server_nonce().unwrap(),
            true,
        )
        .unwrap();
        assert!(matches!(
            fresh.step(&fin).unwrap_err(),
            ScramError::Malformed(m) if m.starts_with("Unmatched SCRAM nonce")
        ));
    }

    #[test]
    fn alternate_credentials_are_tried_in_turn() {
        let m = ScramMechanism::Sha256;
        let old = ScramCredential::derive(m, "oldkey", &[1u8; 28], 4096);
        let new = ScramCredential::derive(m, "newkey", &[1u8; 28], 4096);
        for password in ["oldkey", "newkey"] {
            let mut client = ClientConversation::new(m, "__system", password, "nonce1").unwrap();
            let first = ClientFirst::parse(&client.client_first()).unwrap();
            let (mut server, s1) =
                ServerConversation::start(m, first, &[new.clone(), old.clone()], "SRV", true)
                    .unwrap();
            let fin = client.client_final(&s1.payload).unwrap();
            let s2 = server.step(&fin).unwrap();
            client.verify_server_final(&s2.payload).unwrap();
        }
    }

    #[test]
    fn start_refuses_missing_or_corrupt_credentials() {
        let first = || ClientFirst::parse(b"n,,n=user,r=clientnonce").unwrap();
        let e =
            ServerConversation::start(ScramMechanism::Sha1, first(), &[], "N", true).unwrap_err();
        assert_eq!(
            e.to_string(),
            "Unable to use SCRAM-SHA-1 based authentication for user without any SCRAM-SHA-1 credentials registered"
        );
        let mut bad = ScramCredential::derive(ScramMechanism::Sha1, "x", &[0u8; 16], 4096);
        bad.stored_key.pop();
        let e = ServerConversation::start(ScramMechanism::Sha1, first(), &[bad], "N", true)
            .unwrap_err();
        assert_eq!(e, ScramError::CorruptCredentials(ScramMechanism::Sha1));
        assert_eq!(
            ScramError::UserNotFound {
                user: "bob".into(),
                db: "test".into()
            }
            .to_auth_error()
            .message,
            "Authentication failed."
        );
    }

    #[test]
    fn debug_output_never_shows_keys() {
        let cred = ScramCredential::derive(ScramMechanism::Sha256, "pencil", &[1u8; 28], 4096);
        let text = format!("{cred:?}");
        assert!(text.contains("<redacted>"));
        assert!(!text.contains(&format!("{:?}", cred.stored_key)));
    }
}
