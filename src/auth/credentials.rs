//! Users as MongoDB keeps them: the `admin.system.users` document, and the users file that
//! holds the same documents for Sluice's static and demo modes.
//!
//! A user document (what `createUser` stores and `usersInfo` returns):
//!
//! ```text
//! { _id: "test.alice", userId: UUID("…"), user: "alice", db: "test",
//!   credentials: { "SCRAM-SHA-1":   { iterationCount: 10000, salt: "<16 B>", storedKey, serverKey },
//!                  "SCRAM-SHA-256": { iterationCount: 15000, salt: "<28 B>", storedKey, serverKey } },
//!   customData: { … },                      // only if given
//!   roles: [ { role: "readWrite", db: "test" } ],
//!   authenticationRestrictions: [ … ] }     // only if given; auth::restrictions
//! ```
//!
//! `$external` users (X.509 subjects) have `credentials: {external: true}` and no password.
//! `mechanisms` is not stored: `usersInfo` derives it from the credentials' keys, and a
//! `mechanisms` field in an input document is accepted and ignored.
//!
//! **The users file** is a JSON array of these documents in MongoDB Extended JSON (relaxed or
//! canonical, as `mongoexport --jsonArray` writes them), so a file can be produced from a real
//! cluster's `admin.system.users` and read back unchanged. It holds credentials (salted keys),
//! never passwords. A document that does not parse is refused with its position and `_id`.

use super::custom_roles::RoleGraph;
use super::roles::{Principal, RoleName};
use super::scram::{ScramCredential, ScramMechanism, MIN_ITERATIONS};
use super::{AuthError, UserName, EXTERNAL_DB};
use crate::value::error_codes::ErrorCode;
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use bson::spec::BinarySubtype;
use bson::{doc, Binary, Bson, Document};
use std::fmt;

/// A user's stored credentials.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    /// `credentials."SCRAM-SHA-1"`.
    pub scram_sha1: Option<ScramCredential>,
    /// `credentials."SCRAM-SHA-256"`.
    pub scram_sha256: Option<ScramCredential>,
    /// `credentials.external: true`: authenticated outside MongoDB (X.509).
    pub external: bool,
}

impl Credentials {
    /// The credential of one SCRAM mechanism.
    pub fn scram(&self, mechanism: ScramMechanism) -> Option<&ScramCredential> {
        match mechanism {
            ScramMechanism::Sha1 => self.scram_sha1.as_ref(),
            ScramMechanism::Sha256 => self.scram_sha256.as_ref(),
        }
    }

    /// Generates the credentials `createUser`/`updateUser` store for a password: one per
    /// requested mechanism, random salts, mongod's default iteration counts.
    pub fn generate(
        user: &str,
        password: &str,
        mechanisms: &[ScramMechanism],
    ) -> Result<Credentials, AuthError> {
        let mut c = Credentials::default();
        for m in mechanisms {
            let cred = ScramCredential::generate(*m, user, password, m.default_iterations())?;
            match m {
                ScramMechanism::Sha1 => c.scram_sha1 = Some(cred),
                ScramMechanism::Sha256 => c.scram_sha256 = Some(cred),
            }
        }
        Ok(c)
    }

    /// The `mechanisms` array of `usersInfo`: the keys of `credentials`.
    pub fn mechanisms(&self) -> Vec<&'static str> {
        if self.external {
            return vec!["external"];
        }
        ScramMechanism::ALL
            .into_iter()
            .filter(|m| self.scram(*m).is_some())
            .map(|m| m.name())
            .collect()
    }

    /// What `hello {saslSupportedMechs}` lists for the user, in mongod's registry order.
    pub fn sasl_supported_mechs(&self) -> Vec<&'static str> {
        if self.external {
            return vec!["MONGODB-X509"];
        }
        ScramMechanism::ALL
            .into_iter()
            .filter(|m| self.scram(*m).is_some())
            .map(|m| m.name())
            .collect()
    }

    /// The `credentials` sub-document.
    pub fn to_document(&self) -> Document {
        let mut d = Document::new();
        if self.external {
            d.insert("external", true);
        }
        for m in ScramMechanism::ALL {
            if let Some(c) = self.scram(m) {
                d.insert(
                    m.name(),
                    doc! {
                        "iterationCount": c.iteration_count as i32,
                        "salt": &c.salt,
                        "storedKey": BASE64.encode(&c.stored_key),
                        "serverKey": BASE64.encode(&c.server_key),
                    },
                );
            }
        }
        d
    }

    /// Reads a `credentials` sub-document, validating what mongod validates when it loads a
    /// user: key lengths, a base64 salt, an iteration count of at least 4096.
    pub fn from_document(d: &Document) -> Result<Credentials, String> {
        let mut c = Credentials::default();
        for (key, value) in d {
            match key.as_str() {
                "external" => {
                    c.external = value.as_bool() == Some(true);
                    if !c.external {
                        return Err("credentials.external must be true when present".into());
                    }
                }
                name => {
                    let Some(m) = ScramMechanism::from_name(name) else {
                        return Err(format!("credentials has an unknown mechanism '{name}'"));
                    };
                    let Some(doc) = value.as_document() else {
                        return Err(format!("credentials.{name} must be an object"));
                    };
                    let cred =
                        parse_scram(m, doc).map_err(|e| format!("credentials.{name}.{e}"))?;
                    match m {
                        ScramMechanism::Sha1 => c.scram_sha1 = Some(cred),
                        ScramMechanism::Sha256 => c.scram_sha256 = Some(cred),
                    }
                }
            }
        }
        if c.external && (c.scram_sha1.is_some() || c.scram_sha256.is_some()) {
            return Err("credentials cannot be both external and SCRAM".into());
        }
        Ok(c)
    }
}

fn parse_scram(m: ScramMechanism, d: &Document) -> Result<ScramCredential, String> {
    let count = match d.get("iterationCount") {
        Some(Bson::Int32(i)) => i64::from(*i),
        Some(Bson::Int64(i)) => *i,
        Some(Bson::Double(f)) if f.fract() == 0.0 => *f as i64,
        _ => return Err("iterationCount must be an integer".into()),
    };
    if count < i64::from(MIN_ITERATIONS) || count > i64::from(i32::MAX) {
        return Err(format!(
            "iterationCount {count} is invalid, it must be at least {MIN_ITERATIONS}"
        ));
    }
    let text = |field: &str| -> Result<&str, String> {
        d.get_str(field)
            .map_err(|_| format!("{field} must be a string"))
    };
    let salt = text("salt")?;
    if BASE64.decode(salt).map(|s| s.is_empty()).unwrap_or(true) {
        return Err("salt must be non-empty base64".into());
    }
    let key = |field: &str| -> Result<Vec<u8>, String> {
        let bytes = BASE64
            .decode(text(field)?)
            .map_err(|_| format!("{field} is not valid base64"))?;
        if bytes.len() != m.hash_len() {
            return Err(format!(
                "{field} must be {} bytes, not {}",
                m.hash_len(),
                bytes.len()
            ));
        }
        Ok(bytes)
    };
    Ok(ScramCredential {
        iteration_count: count as u32,
        salt: salt.to_string(),
        stored_key: key("storedKey")?,
        server_key: key("serverKey")?,
    })
}

/// Reads the `mechanisms` option of `createUser`/`updateUser` (both when absent), with
/// mongod's errors.
pub fn parse_mechanisms(
    command: &str,
    value: Option<&Bson>,
) -> Result<Vec<ScramMechanism>, AuthError> {
    let Some(value) = value else {
        return Ok(ScramMechanism::ALL.to_vec());
    };
    let Bson::Array(items) = value else {
        return Err(AuthError::new(
            ErrorCode::TypeMismatch,
            format!(
                "BSON field '{command}.mechanisms' is the wrong type '{}', expected type 'array'",
                type_name(value)
            ),
        ));
    };
    if items.is_empty() {
        return Err(AuthError::new(
            ErrorCode::BadValue,
            "mechanisms field must not be empty",
        ));
    }
    let mut out = Vec::new();
    for item in items {
        let name = item.as_str().unwrap_or("");
        match ScramMechanism::from_name(name) {
            Some(m) if !out.contains(&m) => out.push(m),
            Some(_) => {}
            None => {
                return Err(AuthError::new(
                    ErrorCode::BadValue,
                    format!("Unknown auth mechanism '{name}'"),
                ))
            }
        }
    }
    Ok(out)
}

fn type_name(v: &Bson) -> &'static str {
    match v {
        Bson::Double(_) => "double",
        Bson::String(_) => "string",
        Bson::Document(_) => "object",
        Bson::Array(_) => "array",
        Bson::Binary(_) => "binData",
        Bson::ObjectId(_) => "objectId",
        Bson::Boolean(_) => "bool",
        Bson::DateTime(_) => "date",
        Bson::Null => "null",
        Bson::Int32(_) => "int",
        Bson::Int64(_) => "long",
        Bson::Decimal128(_) => "decimal",
        _ => "unknown",
    }
}

/// One user, as `admin.system.users` holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct UserDocument {
    /// `user` and `db`.
    pub name: UserName,
    /// `userId`: a UUID made at creation, so a re-created user is a different user.
    pub user_id: bson::Uuid,
    /// `credentials`.
    pub credentials: Credentials,
    /// `roles`: the roles granted directly.
    pub roles: Vec<RoleName>,
    /// `customData`, when given.
    pub custom_data: Option<Document>,
    /// `authenticationRestrictions`, when given (enforced at authentication,
    /// [`crate::auth::restrictions`]).
    pub authentication_restrictions: Option<Vec<Bson>>,
}

impl UserDocument {
    /// A password user, as `createUser` makes it (credentials generated here; the password
    /// itself is not kept).
    pub fn new_scram(
        name: UserName,
        password: &str,
        mechanisms: &[ScramMechanism],
        roles: Vec<RoleName>,
    ) -> Result<UserDocument, AuthError> {
        let credentials = Credentials::generate(&name.user, password, mechanisms)?;
        Ok(UserDocument {
            name,
            user_id: bson::Uuid::new(),
            credentials,
            roles,
            custom_data: None,
            authentication_restrictions: None,
        })
    }

    /// An `$external` user (an X.509 subject): no password.
    pub fn new_external(subject: &str, roles: Vec<RoleName>) -> UserDocument {
        UserDocument {
            name: UserName::new(subject, EXTERNAL_DB),
            user_id: bson::Uuid::new(),
            credentials: Credentials {
                external: true,
                ..Credentials::default()
            },
            roles,
            custom_data: None,
            authentication_restrictions: None,
        }
    }

    /// The stored document, in mongod's field order.
    pub fn to_document(&self) -> Document {
        let mut d = doc! {
            "_id": self.name.id(),
            "userId": Binary { subtype: BinarySubtype::Uuid, bytes: self.user_id.bytes().to_vec() },
            "user": &self.name.user,
            "db": &self.name.db,
            "credentials": self.credentials.to_document(),
        };
        if let Some(c) = &self.custom_data {
            d.insert("customData", c.clone());
        }
        d.insert("roles", self.roles_array());
        if let Some(r) = &self.authentication_restrictions {
            d.insert("authenticationRestrictions", r.clone());
        }
        d
    }

    fn roles_array(&self) -> Vec<Bson> {
        self.roles
            .iter()
            .map(|r| Bson::Document(r.to_document()))
            .collect()
    }

    /// The document `usersInfo` returns: `_id, userId, user, db, [credentials,]
    /// [customData,] roles, [authenticationRestrictions,] mechanisms`.
    pub fn users_info_document(
        &self,
        show_credentials: bool,
        show_custom_data: bool,
        show_authentication_restrictions: bool,
    ) -> Document {
        let mut d = doc! {
            "_id": self.name.id(),
            "userId": Binary { subtype: BinarySubtype::Uuid, bytes: self.user_id.bytes().to_vec() },
            "user": &self.name.user,
            "db": &self.name.db,
        };
        if show_credentials {
            d.insert("credentials", self.credentials.to_document());
        }
        if show_custom_data {
            if let Some(c) = &self.custom_data {
                d.insert("customData", c.clone());
            }
        }
        d.insert("roles", self.roles_array());
        if show_authentication_restrictions {
            d.insert(
                "authenticationRestrictions",
                self.authentication_restrictions.clone().unwrap_or_default(),
            );
        }
        let mechanisms: Vec<Bson> = self
            .credentials
            .mechanisms()
            .into_iter()
            .map(|m| Bson::String(m.to_string()))
            .collect();
        d.insert("mechanisms", mechanisms);
        d
    }

    /// Reads a stored document (or one a config server's `usersInfo` returned with
    /// `showCredentials`).
    pub fn from_document(d: &Document) -> Result<UserDocument, String> {
        let user = d
            .get_str("user")
            .map_err(|_| "user must be a string".to_string())?;
        let db = d
            .get_str("db")
            .map_err(|_| "db must be a string".to_string())?;
        if user.is_empty() {
            return Err("User document needs 'user' field to be non-empty".into());
        }
        if db.is_empty() {
            return Err("User document needs 'db' field to be non-empty".into());
        }
        let name = UserName::new(user, db);
        if let Some(id) = d.get("_id") {
            if id.as_str() != Some(name.id().as_str()) {
                return Err(format!("_id must be \"{}\"", name.id()));
            }
        }
        let user_id = match d.get("userId") {
            Some(Bson::Binary(b)) if b.subtype == BinarySubtype::Uuid && b.bytes.len() == 16 => {
                let mut bytes = [0u8; 16];
                bytes.copy_from_slice(&b.bytes);
                bson::Uuid::from_bytes(bytes)
            }
            None => bson::Uuid::new(),
            Some(_) => return Err("userId must be a UUID".into()),
        };
        let credentials = Credentials::from_document(
            d.get_document("credentials")
                .map_err(|_| "credentials must be an object".to_string())?,
        )?;
        if db == EXTERNAL_DB && !credentials.external {
            return Err("$external users must have credentials {external: true}".into());
        }
        if db != EXTERNAL_DB && credentials.external {
            return Err("only $external users may have external credentials".into());
        }
        if db != EXTERNAL_DB
            && credentials.scram_sha1.is_none()
            && credentials.scram_sha256.is_none()
        {
            return Err("credentials must hold SCRAM-SHA-1 or SCRAM-SHA-256".into());
        }
        let roles = d
            .get_array("roles")
            .map_err(|_| "roles must be an array".to_string())?
            .iter()
            .map(|r| match r {
                Bson::Document(_) => RoleName::from_bson(r, db).map_err(|e| format!("roles: {e}")),
                _ => Err("roles must hold {role, db} objects".to_string()),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let custom_data = match d.get("customData") {
            None => None,
            Some(Bson::Document(c)) => Some(c.clone()),
            Some(_) => return Err("customData must be an object".into()),
        };
        let authentication_restrictions = match d.get("authenticationRestrictions") {
            None => None,
            Some(Bson::Array(a)) => Some(a.clone()),
            Some(_) => return Err("authenticationRestrictions must be an array".into()),
        };
        Ok(UserDocument {
            name,
            user_id,
            credentials,
            roles,
            custom_data,
            authentication_restrictions,
        })
    }

    /// The authenticated identity with its privileges (built-in roles only; an unknown role
    /// is the error).
    pub fn principal(&self) -> Result<Principal, RoleName> {
        Principal::from_builtin_roles(self.name.clone(), self.roles.clone())
    }

    /// The authenticated identity with the privileges of its roles resolved through `graph`
    /// (built-in and custom roles, inherited ones included); an unknown role is the error.
    pub fn principal_in(&self, graph: &RoleGraph) -> Result<Principal, RoleName> {
        let resolved = graph.resolve(&self.roles)?;
        Ok(Principal {
            user: self.name.clone(),
            roles: self.roles.clone(),
            privileges: resolved.privileges,
        })
    }
}

/// A users file that could not be read: where and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsersFileError {
    /// 1-based position of the document in the array, when the error is in one.
    pub document: Option<usize>,
    /// The document's `_id`, when it has a readable one.
    pub id: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for UsersFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.document, &self.id) {
            (Some(n), Some(id)) => write!(f, "user document {n} (_id \"{id}\"): {}", self.message),
            (Some(n), None) => write!(f, "user document {n}: {}", self.message),
            _ => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for UsersFileError {}

/// The users of static and demo mode: the documents of a users file, with the edits the user
/// management commands make. Reading and writing the file itself (atomically) is the caller's.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UsersFile {
    users: Vec<UserDocument>,
    /// The custom roles the users may hold.
    roles: RoleGraph,
}

impl UsersFile {
    /// An empty set of users.
    pub fn new() -> UsersFile {
        UsersFile::default()
    }

    /// Parses the file's text: a JSON array of Extended JSON user documents. Every role must
    /// be a built-in role; two documents for one user are refused.
    pub fn parse(text: &str) -> Result<UsersFile, UsersFileError> {
        UsersFile::parse_with_roles(text, RoleGraph::new())
    }

    /// Users and the custom roles they may hold (the users file and the roles file).
    pub fn from_parts(users: Vec<UserDocument>, roles: RoleGraph) -> UsersFile {
        UsersFile { users, roles }
    }

    /// [`UsersFile::parse`] where a role may also be one of `roles`, which the result keeps.
    pub fn parse_with_roles(text: &str, roles: RoleGraph) -> Result<UsersFile, UsersFileError> {
        let whole = |message: String| UsersFileError {
            document: None,
            id: None,
            message,
        };
        let value: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| whole(format!("the users file is not valid JSON: {e}")))?;
        let serde_json::Value::Array(items) = value else {
            return Err(whole(
                "the users file must hold a JSON array of user documents".into(),
            ));
        };
        let mut file = UsersFile {
            users: Vec::new(),
            roles,
        };
        for (i, item) in items.into_iter().enumerate() {
            let id = item
                .get("_id")
                .and_then(|v| v.as_str())
                .map(|s| s.to_string());
            let err = |message: String| UsersFileError {
                document: Some(i + 1),
                id: id.clone(),
                message,
            };
            let doc = match Bson::try_from(item) {
                Ok(Bson::Document(d)) => d,
                Ok(_) => return Err(err("not an object".into())),
                Err(e) => return Err(err(format!("invalid Extended JSON: {e}"))),
            };
            let user = UserDocument::from_document(&doc).map_err(err)?;
            if let Some(role) = user.roles.iter().find(|r| !file.roles.exists(r)) {
                return Err(err(format!("Could not find role: {role}")));
            }
            if file.find(&user.name).is_some() {
                return Err(err(format!("a second document for user {}", user.name)));
            }
            file.users.push(user);
        }
        Ok(file)
    }

    /// The file's text: the documents as relaxed Extended JSON, one array, pretty-printed.
    pub fn to_text(&self) -> String {
        let items: Vec<serde_json::Value> = self
            .users
            .iter()
            .map(|u| Bson::Document(u.to_document()).into_relaxed_extjson())
            .collect();
        let mut text = serde_json::to_string_pretty(&serde_json::Value::Array(items))
            .unwrap_or_else(|_| "[]".to_string());
        text.push('\n');
        text
    }

    /// Every user, in file order.
    pub fn users(&self) -> &[UserDocument] {
        &self.users
    }

    /// The custom roles.
    pub fn roles(&self) -> &RoleGraph {
        &self.roles
    }

    /// The custom roles, to edit (`createRole`, …).
    pub fn roles_mut(&mut self) -> &mut RoleGraph {
        &mut self.roles
    }

    /// Every user, to edit (a dropped role leaves the users that held it).
    pub fn users_mut(&mut self) -> &mut [UserDocument] {
        &mut self.users
    }

    /// A user's principal, its roles resolved through the custom roles.
    pub fn principal(&self, user: &UserDocument) -> Result<Principal, RoleName> {
        user.principal_in(&self.roles)
    }

    /// The `authenticationRestrictions` a user must meet: its own and those of every custom
    /// role it holds, directly or by inheritance.
    pub fn restrictions(&self, user: &UserDocument) -> Vec<Vec<Bson>> {
        let mut out: Vec<Vec<Bson>> = user.authentication_restrictions.iter().cloned().collect();
        out.extend(self.roles.restrictions(&user.roles));
        out
    }

    /// One user.
    pub fn find(&self, name: &UserName) -> Option<&UserDocument> {
        self.users.iter().find(|u| u.name == *name)
    }

    /// Adds a user (`createUser`): 51003 `User "alice@test" already exists` if present.
    pub fn insert(&mut self, user: UserDocument) -> Result<(), AuthError> {
        if self.find(&user.name).is_some() {
            return Err(AuthError::new(
                ErrorCode::UserAlreadyExists,
                format!("User \"{}\" already exists", user.name),
            ));
        }
        self.users.push(user);
        Ok(())
    }

    /// Replaces a user (`updateUser`): 11 `User alice@test not found` if absent.
    pub fn replace(&mut self, user: UserDocument) -> Result<(), AuthError> {
        match self.users.iter_mut().find(|u| u.name == user.name) {
            Some(slot) => {
                *slot = user;
                Ok(())
            }
            None => Err(AuthError::new(
                ErrorCode::UserNotFound,
                format!("User {} not found", user.name),
            )),
        }
    }

    /// Removes a user (`dropUser`): 11 `User 'alice@test' not found` if absent.
    pub fn remove(&mut self, name: &UserName) -> Result<UserDocument, AuthError> {
        match self.users.iter().position(|u| u.name == *name) {
            Some(i) => Ok(self.users.remove(i)),
            None => Err(AuthError::new(
                ErrorCode::UserNotFound,
                format!("User '{name}' not found"),
            )),
        }
    }

    /// Removes every user of a database (`dropAllUsersFromDatabase`); returns how many.
    pub fn remove_all_in_db(&mut self, db: &str) -> usize {
        let before = self.users.len();
        self.users.retain(|u| u.name.db != db);
        before - self.users.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alice() -> UserDocument {
        UserDocument::new_scram(
            UserName::new("alice", "test"),
            "secret",
            &ScramMechanism::ALL,
            vec![RoleName::new("readWrite", "test")],
        )
        .unwrap()
    }

    #[test]
    fn stored_document_has_mongods_shape() {
        let a = alice();
        let d = a.to_document();
        let keys: Vec<&str> = d.keys().map(|k| k.as_str()).collect();
        assert_eq!(
            keys,
            ["_id", "userId", "user", "db", "credentials", "roles"]
        );
        assert_eq!(d.get_str("_id").unwrap(), "test.alice");
        let uid = d.get_binary_generic("userId");
        assert!(uid.is_err(), "userId is subtype 4, not generic");
        let creds = d.get_document("credentials").unwrap();
        let sha1 = creds.get_document("SCRAM-SHA-1").unwrap();
        assert_eq!(sha1.get_i32("iterationCount").unwrap(), 10000);
        assert_eq!(sha1.get_str("salt").unwrap().len(), 24);
        assert_eq!(sha1.get_str("storedKey").unwrap().len(), 28);
        let sha256 = creds.get_document("SCRAM-SHA-256").unwrap();
        assert_eq!(sha256.get_i32("iterationCount").unwrap(), 15000);
        assert_eq!(sha256.get_str("salt").unwrap().len(), 40);
        assert_eq!(sha256.get_str("serverKey").unwrap().len(), 44);
        assert_eq!(
            d.get_array("roles").unwrap(),
            &vec![Bson::Document(doc! {"role": "readWrite", "db": "test"})]
        );
        assert_eq!(UserDocument::from_document(&d).unwrap(), a);
    }

    #[test]
    fn users_info_shape_and_mechanisms() {
        let mut a = alice();
        a.custom_data = Some(doc! {"team": "x"});
        let d = a.users_info_document(false, true, false);
        let keys: Vec<&str> = d.keys().map(|k| k.as_str()).collect();
        assert_eq!(
            keys,
            [
                "_id",
                "userId",
                "user",
                "db",
                "customData",
                "roles",
                "mechanisms"
            ]
        );
        assert_eq!(
            d.get_array("mechanisms").unwrap(),
            &vec![Bson::from("SCRAM-SHA-1"), Bson::from("SCRAM-SHA-256")]
        );
        let with_creds = a.users_info_document(true, false, true);
        assert!(with_creds.contains_key("credentials"));
        assert!(with_creds.contains_key("authenticationRestrictions"));
        let x = UserDocument::new_external("CN=client,O=MongoDB", vec![]);
        assert_eq!(x.credentials.mechanisms(), ["external"]);
        assert_eq!(x.credentials.sasl_supported_mechs(), ["MONGODB-X509"]);
        assert_eq!(
            x.to_document().get_document("credentials").unwrap(),
            &doc! {"external": true}
        );
        let only256 = UserDocument::new_scram(
            UserName::new("b", "admin"),
            "p",
            &[ScramMechanism::Sha256],
            vec![],
        )
        .unwrap();
        assert_eq!(
            only256.credentials.sasl_supported_mechs(),
            ["SCRAM-SHA-256"]
        );
    }

    #[test]
    fn users_file_round_trips_through_extended_json() {
        let mut f = UsersFile::new();
        f.insert(alice()).unwrap();
        f.insert(UserDocument::new_external(
            "C=IS,ST=Reykjavik,L=Reykjavik,O=MongoDB,OU=Drivers,CN=client",
            vec![RoleName::new("root", "admin")],
        ))
        .unwrap();
        let text = f.to_text();
        assert!(text.contains("\"$binary\""), "{text}");
        assert!(!text.contains("secret"));
        let back = UsersFile::parse(&text).unwrap();
        assert_eq!(back, f);
    }

    #[test]
    fn users_file_accepts_what_mongoexport_writes() {
        // Canonical Extended JSON, with numbers as $numberInt and a $uuid.
        let text = r#"[{
            "_id": "admin.root",
            "userId": {"$binary": {"base64": "B+e5mKLXQ8OS6nADOtIOfA==", "subType": "04"}},
            "user": "root", "db": "admin",
            "credentials": {"SCRAM-SHA-256": {
                "iterationCount": {"$numberInt": "15000"},
                "salt": "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
                "storedKey": "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
                "serverKey": "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="}},
            "roles": [{"role": "root", "db": "admin"}],
            "mechanisms": ["SCRAM-SHA-256"]
        }]"#;
        let f = UsersFile::parse(text).unwrap();
        let root = f.find(&UserName::new("root", "admin")).unwrap();
        assert_eq!(
            root.user_id.to_string(),
            "07e7b998-a2d7-43c3-92ea-70033ad20e7c"
        );
        assert!(root.credentials.scram_sha1.is_none());
        assert_eq!(root.principal().unwrap().roles, root.roles);
    }

    #[test]
    fn users_file_errors_name_the_document() {
        let e = UsersFile::parse("{").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("the users file is not valid JSON"),
            "{e}"
        );
        let e = UsersFile::parse("{}").unwrap_err();
        assert_eq!(
            e.to_string(),
            "the users file must hold a JSON array of user documents"
        );
        let good = Bson::Document(alice().to_document()).into_relaxed_extjson();
        let mut bad = good.clone();
        bad["credentials"]["SCRAM-SHA-256"]["storedKey"] = serde_json::json!("AAAA");
        let text = serde_json::to_string(&vec![good.clone(), bad]).unwrap();
        let e = UsersFile::parse(&text).unwrap_err();
        assert_eq!(e.document, Some(2));
        assert_eq!(
            e.to_string(),
            "user document 2 (_id \"test.alice\"): credentials.SCRAM-SHA-256.storedKey must be 32 bytes, not 3"
        );
        let text = serde_json::to_string(&vec![good.clone(), good.clone()]).unwrap();
        assert_eq!(
            UsersFile::parse(&text).unwrap_err().to_string(),
            "user document 2 (_id \"test.alice\"): a second document for user alice@test"
        );
        let mut unknown_role = good.clone();
        unknown_role["roles"] = serde_json::json!([{"role": "root", "db": "test"}]);
        let text = serde_json::to_string(&vec![unknown_role]).unwrap();
        assert_eq!(
            UsersFile::parse(&text).unwrap_err().to_string(),
            "user document 1 (_id \"test.alice\"): Could not find role: root@test"
        );
        let mut low = good.clone();
        low["credentials"]["SCRAM-SHA-1"]["iterationCount"] = serde_json::json!(100);
        let text = serde_json::to_string(&vec![low]).unwrap();
        assert!(UsersFile::parse(&text)
            .unwrap_err()
            .message
            .contains("at least 4096"));
        let mut wrong_id = good;
        wrong_id["_id"] = serde_json::json!("admin.alice");
        let text = serde_json::to_string(&vec![wrong_id]).unwrap();
        assert_eq!(
            UsersFile::parse(&text).unwrap_err().message,
            "_id must be \"test.alice\""
        );
    }

    #[test]
    fn user_management_edits_carry_mongods_errors() {
        let mut f = UsersFile::new();
        f.insert(alice()).unwrap();
        let e = f.insert(alice()).unwrap_err();
        assert_eq!(e.code.0, 51003);
        assert_eq!(e.message, "User \"alice@test\" already exists");
        let ghost = UserName::new("ghost", "test");
        let e = f.remove(&ghost).unwrap_err();
        assert_eq!(e.code, ErrorCode::UserNotFound);
        assert_eq!(e.message, "User 'ghost@test' not found");
        let mut g = alice();
        g.name = ghost;
        let e = f.replace(g).unwrap_err();
        assert_eq!(e.message, "User ghost@test not found");
        f.replace(alice()).unwrap();
        assert_eq!(f.remove_all_in_db("test"), 1);
        assert!(f.users().is_empty());
    }

    #[test]
    fn mechanisms_option_is_validated_like_mongod() {
        assert_eq!(
            parse_mechanisms("createUser", None).unwrap(),
            ScramMechanism::ALL
        );
        let e = parse_mechanisms("createUser", Some(&Bson::Array(vec![]))).unwrap_err();
        assert_eq!(e.message, "mechanisms field must not be empty");
        let e = parse_mechanisms("createUser", Some(&Bson::Array(vec!["BAD".into()]))).unwrap_err();
        assert_eq!(e.message, "Unknown auth mechanism 'BAD'");
        let e = parse_mechanisms("createUser", Some(&Bson::from("x"))).unwrap_err();
        assert_eq!(
            e.message,
            "BSON field 'createUser.mechanisms' is the wrong type 'string', expected type 'array'"
        );
        assert_eq!(
            parse_mechanisms(
                "updateUser",
                Some(&Bson::Array(vec!["SCRAM-SHA-256".into()]))
            )
            .unwrap(),
            [ScramMechanism::Sha256]
        );
    }
}
