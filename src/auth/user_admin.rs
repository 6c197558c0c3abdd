//! The user-management commands on a set of users: `createUser`, `updateUser`, `dropUser`,
//! `dropAllUsersFromDatabase` and `usersInfo`, with mongod's argument checks and messages.
//!
//! They edit a [`UsersFile`] in memory and say whether it changed; keeping the file on disk is
//! the caller's. Passwords are turned into SCRAM credentials here and never kept.

use super::credentials::{parse_mechanisms, UserDocument, UsersFile};
use super::custom_roles::RoleGraph;
use super::roles::RoleName;
use super::{AuthError, UserName, EXTERNAL_DB};
use crate::value::error_codes::ErrorCode;
use bson::{doc, Bson, Document};

/// What a user-management command did.
#[derive(Debug)]
pub struct AdminResult {
    /// The reply's fields (without `ok`).
    pub reply: Document,
    /// The users that were created, changed or removed (`None`: removed), so that
    /// connections authenticated as one of them can refresh.
    pub changed: Vec<(UserName, Option<UserDocument>)>,
}

/// The commands this module answers.
pub const USER_ADMIN_COMMANDS: &[&str] = &[
    "createUser",
    "updateUser",
    "dropUser",
    "dropAllUsersFromDatabase",
    "usersInfo",
    "grantRolesToUser",
    "revokeRolesFromUser",
];

/// Whether the command edits users (the file must be written after it).
pub fn is_write(command: &str) -> bool {
    command != "usersInfo"
}

fn user_name_arg(command: &str, body: &Document, db: &str) -> Result<UserName, AuthError> {
    match body.get(command) {
        Some(Bson::String(u)) if !u.is_empty() => Ok(UserName::new(u.as_str(), db)),
        Some(Bson::String(_)) => Err(AuthError::bad_value(
            "User document needs 'user' field to be non-empty",
        )),
        _ => Err(AuthError::new(
            ErrorCode::TypeMismatch,
            format!("BSON field '{command}.{command}' is the wrong type, expected type 'string'"),
        )),
    }
}

/// The `roles` array of a command, each role existing in `graph` (or built in).
pub fn roles_arg(
    command: &str,
    value: &Bson,
    db: &str,
    graph: &RoleGraph,
) -> Result<Vec<RoleName>, AuthError> {
    let Bson::Array(items) = value else {
        return Err(AuthError::new(
            ErrorCode::TypeMismatch,
            format!("BSON field '{command}.roles' is the wrong type, expected type 'array'"),
        ));
    };
    let mut roles = Vec::new();
    for item in items {
        let role = RoleName::from_bson(item, db).map_err(AuthError::bad_value)?;
        if !graph.exists(&role) {
            return Err(AuthError::new(
                ErrorCode::RoleNotFound,
                format!("Could not find role: {role}"),
            ));
        }
        if !roles.contains(&role) {
            roles.push(role);
        }
    }
    Ok(roles)
}

fn password_arg(
    command: &str,
    body: &Document,
    name: &UserName,
) -> Result<Option<String>, AuthError> {
    let Some(pwd) = body.get("pwd") else {
        return Ok(None);
    };
    if name.db == EXTERNAL_DB {
        return Err(AuthError::bad_value(
            "Cannot set the password for users defined on the '$external' database",
        ));
    }
    let Bson::String(pwd) = pwd else {
        return Err(AuthError::new(
            ErrorCode::TypeMismatch,
            format!("BSON field '{command}.pwd' is the wrong type, expected type 'string'"),
        ));
    };
    if pwd.is_empty() {
        return Err(AuthError::bad_value("User passwords must not be empty"));
    }
    if body
        .get("digestPassword")
        .is_some_and(|d| d.as_bool() == Some(false))
    {
        return Err(AuthError::bad_value(
            "Use of SCRAM-SHA-256 requires undigested passwords",
        ));
    }
    Ok(Some(pwd.clone()))
}

fn custom_data_arg(command: &str, body: &Document) -> Result<Option<Document>, AuthError> {
    match body.get("customData") {
        None => Ok(None),
        Some(Bson::Document(d)) => Ok(Some(d.clone())),
        Some(_) => Err(AuthError::new(
            ErrorCode::TypeMismatch,
            format!("BSON field '{command}.customData' is the wrong type, expected type 'object'"),
        )),
    }
}

/// Runs one user-management command on `users`; `db` is the command's `$db`.
pub fn run(
    users: &mut UsersFile,
    command: &str,
    db: &str,
    body: &Document,
) -> Result<AdminResult, AuthError> {
    match command {
        "createUser" => create_user(users, db, body),
        "updateUser" => update_user(users, db, body),
        "dropUser" => {
            let name = user_name_arg(command, body, db)?;
            users.remove(&name)?;
            Ok(AdminResult {
                reply: Document::new(),
                changed: vec![(name, None)],
            })
        }
        "dropAllUsersFromDatabase" => {
            let dropped: Vec<UserName> = users
                .users()
                .iter()
                .filter(|u| u.name.db == db)
                .map(|u| u.name.clone())
                .collect();
            let n = users.remove_all_in_db(db);
            Ok(AdminResult {
                reply: doc! {"n": n as i32},
                changed: dropped.into_iter().map(|u| (u, None)).collect(),
            })
        }
        "usersInfo" => users_info(users, db, body),
        "grantRolesToUser" | "revokeRolesFromUser" => grant_roles(users, command, db, body),
        other => Err(AuthError::new(
            ErrorCode::CommandNotFound,
            format!("no such command: '{other}'"),
        )),
    }
}

fn create_user(users: &mut UsersFile, db: &str, body: &Document) -> Result<AdminResult, AuthError> {
    const C: &str = "createUser";
    let name = user_name_arg(C, body, db)?;
    if db == "local" {
        return Err(AuthError::bad_value(
            "Cannot create users in the local database",
        ));
    }
    let roles = match body.get("roles") {
        Some(r) => roles_arg(C, r, db, users.roles())?,
        None => {
            return Err(AuthError::new(
                ErrorCode(40414),
                "BSON field 'createUser.roles' is missing but a required field",
            ))
        }
    };
    let password = password_arg(C, body, &name)?;
    let mut user = if db == EXTERNAL_DB {
        if body.contains_key("mechanisms") {
            return Err(AuthError::bad_value(
                "mechanisms field must not be set for users on the $external database",
            ));
        }
        UserDocument::new_external(&name.user, roles)
    } else {
        let Some(password) = password else {
            return Err(AuthError::bad_value(
                "Must provide a 'pwd' field for all user documents, except those with \
                 '$external' as the user's source db",
            ));
        };
        let mechanisms = parse_mechanisms(C, body.get("mechanisms"))?;
        UserDocument::new_scram(name.clone(), &password, &mechanisms, roles)?
    };
    user.custom_data = custom_data_arg(C, body)?;
    if let Some(Bson::Array(r)) = body.get("authenticationRestrictions") {
        user.authentication_restrictions = Some(r.clone());
    }
    users.insert(user.clone())?;
    Ok(AdminResult {
        reply: Document::new(),
        changed: vec![(name, Some(user))],
    })
}

fn update_user(users: &mut UsersFile, db: &str, body: &Document) -> Result<AdminResult, AuthError> {
    const C: &str = "updateUser";
    let name = user_name_arg(C, body, db)?;
    let password = password_arg(C, body, &name)?;
    let roles = body
        .get("roles")
        .map(|r| roles_arg(C, r, db, users.roles()))
        .transpose()?;
    let custom_data = custom_data_arg(C, body)?;
    let restrictions = body.get("authenticationRestrictions");
    if password.is_none()
        && roles.is_none()
        && custom_data.is_none()
        && restrictions.is_none()
        && !body.contains_key("mechanisms")
    {
        return Err(AuthError::bad_value(
            "Must specify at least one field to update in updateUser",
        ));
    }
    let Some(existing) = users.find(&name) else {
        return Err(AuthError::new(
            ErrorCode::UserNotFound,
            format!("User {name} not found"),
        ));
    };
    let mut user = existing.clone();
    match password {
        Some(password) => {
            let mechanisms = parse_mechanisms(C, body.get("mechanisms"))?;
            let fresh = UserDocument::new_scram(name.clone(), &password, &mechanisms, vec![])?;
            user.credentials = fresh.credentials;
        }
        None if body.contains_key("mechanisms") => {
            // Without a password, mechanisms may only narrow what is stored.
            let mechanisms = parse_mechanisms(C, body.get("mechanisms"))?;
            for m in super::scram::ScramMechanism::ALL {
                if mechanisms.contains(&m) && user.credentials.scram(m).is_none() {
                    return Err(AuthError::bad_value(
                        "mechanisms field must be a subset of previously set mechanisms",
                    ));
                }
            }
            if !mechanisms.contains(&super::scram::ScramMechanism::Sha1) {
                user.credentials.scram_sha1 = None;
            }
            if !mechanisms.contains(&super::scram::ScramMechanism::Sha256) {
                user.credentials.scram_sha256 = None;
            }
        }
        None => {}
    }
    if let Some(roles) = roles {
        user.roles = roles;
    }
    if custom_data.is_some() {
        user.custom_data = custom_data;
    }
    if let Some(Bson::Array(r)) = restrictions {
        user.authentication_restrictions = Some(r.clone());
    }
    users.replace(user.clone())?;
    Ok(AdminResult {
        reply: Document::new(),
        changed: vec![(name, Some(user))],
    })
}

/// `grantRolesToUser` / `revokeRolesFromUser`: `{<command>: user, roles: [...]}`.
fn grant_roles(
    users: &mut UsersFile,
    command: &str,
    db: &str,
    body: &Document,
) -> Result<AdminResult, AuthError> {
    let name = user_name_arg(command, body, db)?;
    let roles = match body.get("roles") {
        Some(r) => roles_arg(command, r, db, users.roles())?,
        None => {
            return Err(AuthError::new(
                ErrorCode(40414),
                format!("BSON field '{command}.roles' is missing but a required field"),
            ))
        }
    };
    if roles.is_empty() {
        return Err(AuthError::bad_value(format!(
            "{command} command requires a non-empty \"roles\" array"
        )));
    }
    let Some(existing) = users.find(&name) else {
        return Err(AuthError::new(
            ErrorCode::UserNotFound,
            format!(
                "Could not find user \"{}\" for db \"{}\"",
                name.user, name.db
            ),
        ));
    };
    let mut user = existing.clone();
    if command == "grantRolesToUser" {
        for r in roles {
            if !user.roles.contains(&r) {
                user.roles.push(r);
            }
        }
    } else {
        user.roles.retain(|r| !roles.contains(r));
    }
    users.replace(user.clone())?;
    Ok(AdminResult {
        reply: Document::new(),
        changed: vec![(name, Some(user))],
    })
}

fn flag(body: &Document, field: &str) -> bool {
    body.get(field).is_some_and(crate::value::field::truthy)
}

fn users_info(users: &UsersFile, db: &str, body: &Document) -> Result<AdminResult, AuthError> {
    let show_credentials = flag(body, "showCredentials");
    let show_custom_data = body
        .get("showCustomData")
        .is_none_or(crate::value::field::truthy);
    let show_restrictions = flag(body, "showAuthenticationRestrictions");
    let show_privileges = flag(body, "showPrivileges");
    let wanted: Box<dyn Fn(&UserDocument) -> bool> = match body.get("usersInfo") {
        Some(Bson::Document(d)) if flag(d, "forAllDBs") => Box::new(|_| true),
        Some(v) if crate::value::field::is_number(v) => {
            let db = db.to_string();
            Box::new(move |u| u.name.db == db)
        }
        Some(Bson::Array(items)) => {
            let names = items
                .iter()
                .map(|i| user_spec(i, db))
                .collect::<Result<Vec<_>, _>>()?;
            Box::new(move |u| names.contains(&u.name))
        }
        Some(v) => {
            let name = user_spec(v, db)?;
            Box::new(move |u| u.name == name)
        }
        None => {
            return Err(AuthError::bad_value(
                "usersInfo requires a user specification",
            ))
        }
    };
    let mut found: Vec<&UserDocument> = users.users().iter().filter(|u| wanted(u)).collect();
    found.sort_by(|a, b| (&a.name.user, &a.name.db).cmp(&(&b.name.user, &b.name.db)));
    let docs: Vec<Bson> = found
        .into_iter()
        .map(|u| {
            let mut d =
                u.users_info_document(show_credentials, show_custom_data, show_restrictions);
            if show_privileges {
                let (roles, privileges) = match users.roles().resolve(&u.roles) {
                    Ok(r) => (
                        r.roles
                            .iter()
                            .map(|r| Bson::Document(r.to_document()))
                            .collect(),
                        r.privileges.to_documents(),
                    ),
                    Err(_) => (Vec::new(), Vec::new()),
                };
                d.insert("inheritedRoles", Bson::Array(roles));
                d.insert("inheritedPrivileges", Bson::Array(privileges));
            }
            Bson::Document(d)
        })
        .collect();
    Ok(AdminResult {
        reply: doc! {"users": docs},
        changed: Vec::new(),
    })
}

/// One user of `usersInfo`: `"name"` (in `db`) or `{user, db}`.
fn user_spec(v: &Bson, db: &str) -> Result<UserName, AuthError> {
    match v {
        Bson::String(s) => Ok(UserName::new(s.as_str(), db)),
        Bson::Document(d) => match (d.get_str("user"), d.get_str("db")) {
            (Ok(u), Ok(d)) => Ok(UserName::new(u, d)),
            _ => Err(AuthError::bad_value(
                "User name must contain 'user' and 'db' fields",
            )),
        },
        _ => Err(AuthError::bad_value(
            "User name must be either a string or an object with 'user' and 'db' fields",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::scram::ScramMechanism;

    fn run_ok(users: &mut UsersFile, db: &str, body: Document) -> Document {
        let name = body.keys().next().unwrap().clone();
        run(users, &name, db, &body).unwrap().reply
    }

    #[test]
    fn create_update_info_and_drop() {
        let mut users = UsersFile::new();
        run_ok(
            &mut users,
            "admin",
            doc! {"createUser": "alice", "pwd": "pw", "roles": ["root", {"role": "read", "db": "test"}]},
        );
        let stored = users.find(&UserName::new("alice", "admin")).unwrap();
        assert!(
            stored.credentials.scram_sha1.is_some() && stored.credentials.scram_sha256.is_some()
        );
        assert!(!users.to_text().contains("\"pw\""));
        let e = run(
            &mut users,
            "createUser",
            "admin",
            &doc! {"createUser": "alice", "pwd": "pw", "roles": []},
        )
        .unwrap_err();
        assert_eq!(e.code, ErrorCode::UserAlreadyExists);
        assert_eq!(e.message, "User \"alice@admin\" already exists");
        let info = run_ok(&mut users, "admin", doc! {"usersInfo": "alice"});
        let u = info.get_array("users").unwrap()[0]
            .as_document()
            .unwrap()
            .clone();
        assert_eq!(u.get_str("_id").unwrap(), "admin.alice");
        assert!(!u.contains_key("credentials"));
        assert_eq!(
            u.get_array("mechanisms").unwrap(),
            &vec![Bson::from("SCRAM-SHA-1"), Bson::from("SCRAM-SHA-256")]
        );
        run_ok(
            &mut users,
            "admin",
            doc! {"updateUser": "alice", "pwd": "new", "mechanisms": ["SCRAM-SHA-256"], "roles": []},
        );
        let stored = users.find(&UserName::new("alice", "admin")).unwrap();
        assert!(stored.credentials.scram(ScramMechanism::Sha1).is_none());
        assert!(stored.roles.is_empty());
        run_ok(&mut users, "admin", doc! {"dropUser": "alice"});
        let e = run(&mut users, "dropUser", "admin", &doc! {"dropUser": "alice"}).unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            (ErrorCode::UserNotFound, "User 'alice@admin' not found")
        );
    }

    #[test]
    fn argument_errors_are_mongods() {
        let mut users = UsersFile::new();
        let err = |users: &mut UsersFile, body: Document| {
            let name = body.keys().next().unwrap().clone();
            run(users, &name, "test", &body).unwrap_err()
        };
        let e = err(&mut users, doc! {"createUser": "a", "roles": []});
        assert!(e.message.starts_with("Must provide a 'pwd' field"));
        let e = err(
            &mut users,
            doc! {"createUser": "a", "pwd": "x", "roles": ["nosuch"]},
        );
        assert_eq!(
            (e.code, e.message.as_str()),
            (ErrorCode::RoleNotFound, "Could not find role: nosuch@test")
        );
        let e = err(&mut users, doc! {"createUser": "a", "pwd": "x"});
        assert_eq!(e.code, ErrorCode(40414));
        let e = err(&mut users, doc! {"updateUser": "a"});
        assert_eq!(
            e.message,
            "Must specify at least one field to update in updateUser"
        );
        let e = err(&mut users, doc! {"updateUser": "a", "roles": []});
        assert_eq!(
            (e.code, e.message.as_str()),
            (ErrorCode::UserNotFound, "User a@test not found")
        );
    }

    #[test]
    fn users_info_forms() {
        let mut users = UsersFile::new();
        for (u, db) in [("b", "test"), ("a", "test"), ("c", "other")] {
            run_ok(
                &mut users,
                db,
                doc! {"createUser": u, "pwd": "x", "roles": []},
            );
        }
        let names = |d: Document| -> Vec<String> {
            d.get_array("users")
                .unwrap()
                .iter()
                .map(|u| u.as_document().unwrap().get_str("_id").unwrap().to_string())
                .collect()
        };
        assert_eq!(
            names(run_ok(&mut users, "test", doc! {"usersInfo": 1})),
            ["test.a", "test.b"]
        );
        assert_eq!(
            names(run_ok(
                &mut users,
                "test",
                doc! {"usersInfo": {"forAllDBs": true}}
            )),
            ["test.a", "test.b", "other.c"]
        );
        assert_eq!(
            names(run_ok(
                &mut users,
                "test",
                doc! {"usersInfo": [{"user": "c", "db": "other"}, "a"]}
            )),
            ["test.a", "other.c"]
        );
        let with_creds = run_ok(
            &mut users,
            "test",
            doc! {"usersInfo": "a", "showCredentials": true},
        );
        let u = with_creds.get_array("users").unwrap()[0]
            .as_document()
            .unwrap()
            .clone();
        assert!(u
            .get_document("credentials")
            .unwrap()
            .contains_key("SCRAM-SHA-256"));
    }
}
