//! The role-management commands on a set of users and custom roles: `createRole`,
//! `updateRole`, `dropRole`, `dropAllRolesFromDatabase`, `grantRolesToRole`,
//! `revokeRolesFromRole`, `grantPrivilegesToRole`, `revokePrivilegesFromRole` and `rolesInfo`,
//! with mongod's argument checks and messages (`user_management_commands.cpp`).
//!
//! They edit a [`UsersFile`]'s role graph in memory; keeping it is the caller's.

use super::credentials::UsersFile;
use super::custom_roles::{RoleDocument, RoleGraph};
use super::roles::{
    builtin_role_privileges, is_builtin_role, Action, ActionSet, Privilege, Privileges,
    ResourcePattern, RoleName,
};
use super::user_admin::{roles_arg, AdminResult};
use super::AuthError;
use crate::value::error_codes::ErrorCode;
use bson::{doc, Bson, Document};

/// The commands this module answers.
pub const ROLE_ADMIN_COMMANDS: &[&str] = &[
    "createRole",
    "updateRole",
    "dropRole",
    "dropAllRolesFromDatabase",
    "grantRolesToRole",
    "revokeRolesFromRole",
    "grantPrivilegesToRole",
    "revokePrivilegesFromRole",
    "rolesInfo",
];

/// Whether the command edits roles.
pub fn is_write(command: &str) -> bool {
    command != "rolesInfo"
}

fn missing(command: &str, field: &str) -> AuthError {
    AuthError::new(
        ErrorCode::IdlMissingField,
        format!("BSON field '{command}.{field}' is missing but a required field"),
    )
}

fn role_name_arg(command: &str, body: &Document, db: &str) -> Result<RoleName, AuthError> {
    match body.get(command) {
        Some(Bson::String(r)) => Ok(RoleName::new(r.as_str(), db)),
        _ => Err(AuthError::new(
            ErrorCode::TypeMismatch,
            format!("BSON field '{command}.{command}' is the wrong type, expected type 'string'"),
        )),
    }
}

fn not_found(role: &RoleName) -> AuthError {
    AuthError::new(
        ErrorCode::RoleNotFound,
        format!("Could not find role: {role}"),
    )
}

fn builtin_unmodifiable(role: &RoleName) -> Result<(), AuthError> {
    if is_builtin_role(role) {
        return Err(AuthError::bad_value(format!(
            "{role} is a built-in role and cannot be modified"
        )));
    }
    Ok(())
}

/// A `privileges` array: `[{resource: {...}, actions: [...]}]`, every action known, merged by
/// resource as mongod stores them.
fn privileges_arg(command: &str, value: &Bson) -> Result<Vec<Privilege>, AuthError> {
    let Bson::Array(items) = value else {
        return Err(AuthError::new(
            ErrorCode::TypeMismatch,
            format!("BSON field '{command}.privileges' is the wrong type, expected type 'array'"),
        ));
    };
    let mut unknown: Vec<String> = Vec::new();
    let mut merged = Privileges::none();
    for item in items {
        let Bson::Document(p) = item else {
            return Err(AuthError::new(
                ErrorCode::TypeMismatch,
                format!(
                    "BSON field '{command}.privileges' is the wrong type, expected type 'object'"
                ),
            ));
        };
        let resource = p
            .get_document("resource")
            .map_err(|_| missing("privilege", "resource"))
            .and_then(|r| ResourcePattern::from_document(r).map_err(AuthError::bad_value))?;
        let actions = p
            .get_array("actions")
            .map_err(|_| missing("privilege", "actions"))?;
        let mut set = ActionSet::empty();
        for a in actions {
            match a.as_str() {
                Some(name) => match Action::from_name(name) {
                    Some(action) => set.insert(action),
                    None => unknown.push(name.to_string()),
                },
                None => return Err(AuthError::bad_value("Privilege actions must be strings")),
            }
        }
        merged.add(Privilege {
            resource,
            actions: set,
        });
    }
    if !unknown.is_empty() {
        return Err(AuthError::bad_value(format!(
            "Unrecognized action privilege strings: {}",
            unknown.join(", ")
        )));
    }
    Ok(merged.iter().cloned().collect())
}

/// mongod's `checkOkayToGrantPrivilegesToRole`: a role outside `admin` may only hold
/// privileges on its own database and its collections.
fn check_privileges_for(role: &RoleName, privileges: &[Privilege]) -> Result<(), AuthError> {
    if role.db == "admin" {
        return Ok(());
    }
    for p in privileges {
        let ok = match &p.resource {
            ResourcePattern::Database(d) | ResourcePattern::Namespace(d, _) => *d == role.db,
            _ => false,
        };
        if !ok {
            return Err(AuthError::new(
                ErrorCode::InvalidRoleModification,
                format!(
                    "Roles on the '{}' database cannot be granted privileges that target other \
                     databases or the cluster",
                    role.db
                ),
            ));
        }
    }
    Ok(())
}

/// mongod's `checkOkayToGrantRolesToRole`: not itself, same database unless on `admin`, every
/// role existing, and no cycle.
fn check_roles_for(role: &RoleName, add: &[RoleName], graph: &RoleGraph) -> Result<(), AuthError> {
    for r in add {
        if r == role {
            return Err(AuthError::new(
                ErrorCode::InvalidRoleModification,
                format!("Cannot grant role {role} to itself."),
            ));
        }
        if role.db != "admin" && r.db != role.db {
            return Err(AuthError::new(
                ErrorCode::InvalidRoleModification,
                format!(
                    "Roles on the '{}' database cannot be granted roles from other databases",
                    role.db
                ),
            ));
        }
    }
    for r in add {
        if graph.inherits(r, role) {
            return Err(AuthError::new(
                ErrorCode::InvalidRoleModification,
                format!("Granting roles to {role} would introduce a cycle in the role graph"),
            ));
        }
    }
    Ok(())
}

fn roles_of(
    command: &str,
    body: &Document,
    db: &str,
    graph: &RoleGraph,
) -> Result<Vec<RoleName>, AuthError> {
    match body.get("roles") {
        Some(r) => roles_arg(command, r, db, graph),
        None => Err(missing(command, "roles")),
    }
}

fn restrictions_arg(body: &Document) -> Option<Vec<Bson>> {
    match body.get("authenticationRestrictions") {
        Some(Bson::Array(a)) if !a.is_empty() => Some(a.clone()),
        _ => None,
    }
}

fn done() -> Result<AdminResult, AuthError> {
    Ok(AdminResult {
        reply: Document::new(),
        changed: Vec::new(),
    })
}

/// Runs one role-management command on `users`' roles; `db` is the command's `$db`.
pub fn run(
    users: &mut UsersFile,
    command: &str,
    db: &str,
    body: &Document,
) -> Result<AdminResult, AuthError> {
    match command {
        "createRole" => create_role(users, db, body),
        "updateRole" => update_role(users, db, body),
        "dropRole" => {
            let name = role_name_arg(command, body, db)?;
            builtin_unmodifiable(&name)?;
            if users.roles().find(&name).is_none() {
                return Err(not_found(&name));
            }
            drop_roles(users, |r| *r == name);
            done()
        }
        "dropAllRolesFromDatabase" => {
            let n = users
                .roles()
                .roles()
                .iter()
                .filter(|r| r.name.db == db)
                .count();
            drop_roles(users, |r| r.db == db);
            Ok(AdminResult {
                reply: doc! {"n": n as i32},
                changed: Vec::new(),
            })
        }
        "grantRolesToRole" | "revokeRolesFromRole" => {
            let name = role_name_arg(command, body, db)?;
            let roles = roles_of(command, body, db, users.roles())?;
            if roles.is_empty() {
                return Err(AuthError::bad_value(format!(
                    "{command} command requires a non-empty \"roles\" array"
                )));
            }
            builtin_unmodifiable(&name)?;
            let mut role = users
                .roles()
                .find(&name)
                .cloned()
                .ok_or_else(|| not_found(&name))?;
            if command == "grantRolesToRole" {
                check_roles_for(&name, &roles, users.roles())?;
                for r in roles {
                    if !role.roles.contains(&r) {
                        role.roles.push(r);
                    }
                }
            } else {
                role.roles.retain(|r| !roles.contains(r));
            }
            users.roles_mut().put(role);
            done()
        }
        "grantPrivilegesToRole" | "revokePrivilegesFromRole" => {
            let name = role_name_arg(command, body, db)?;
            let privileges = match body.get("privileges") {
                Some(p) => privileges_arg(command, p)?,
                None => return Err(missing(command, "privileges")),
            };
            if privileges.is_empty() {
                return Err(AuthError::bad_value(format!(
                    "{command} command requires a non-empty \"privileges\" array"
                )));
            }
            builtin_unmodifiable(&name)?;
            let mut role = users
                .roles()
                .find(&name)
                .cloned()
                .ok_or_else(|| not_found(&name))?;
            if command == "grantPrivilegesToRole" {
                check_privileges_for(&name, &privileges)?;
                let mut merged = Privileges::none();
                role.privileges
                    .iter()
                    .chain(privileges.iter())
                    .for_each(|p| merged.add(p.clone()));
                role.privileges = merged.iter().cloned().collect();
            } else {
                for remove in &privileges {
                    for p in role.privileges.iter_mut() {
                        if p.resource == remove.resource {
                            p.actions = p.actions.minus(&remove.actions);
                        }
                    }
                }
                role.privileges.retain(|p| !p.actions.is_empty());
            }
            users.roles_mut().put(role);
            done()
        }
        "rolesInfo" => roles_info(users.roles(), db, body),
        other => Err(AuthError::new(
            ErrorCode::CommandNotFound,
            format!("no such command: '{other}'"),
        )),
    }
}

/// Removes the roles `which` selects, and every grant of them to users and roles (mongod's
/// `dropRole` removes the role from every user and role holding it).
fn drop_roles(users: &mut UsersFile, which: impl Fn(&RoleName) -> bool) {
    let names: Vec<RoleName> = users
        .roles()
        .roles()
        .iter()
        .map(|r| r.name.clone())
        .filter(|r| which(r))
        .collect();
    for n in &names {
        users.roles_mut().remove(n);
    }
    for u in users.users_mut() {
        u.roles.retain(|r| !names.contains(r));
    }
}

fn create_role(users: &mut UsersFile, db: &str, body: &Document) -> Result<AdminResult, AuthError> {
    const C: &str = "createRole";
    let name = role_name_arg(C, body, db)?;
    if name.role.is_empty() {
        return Err(AuthError::bad_value("Role name must be non-empty"));
    }
    if db == "local" {
        return Err(AuthError::bad_value(
            "Cannot create roles in the local database",
        ));
    }
    if db == super::EXTERNAL_DB {
        return Err(AuthError::bad_value(
            "Cannot create roles in the $external database",
        ));
    }
    if is_builtin_role(&name) {
        return Err(AuthError::bad_value(
            "Cannot create roles with the same name as a built-in role",
        ));
    }
    let privileges = match body.get("privileges") {
        Some(p) => privileges_arg(C, p)?,
        None => return Err(missing(C, "privileges")),
    };
    let roles = roles_of(C, body, db, users.roles())?;
    check_roles_for(&name, &roles, users.roles())?;
    check_privileges_for(&name, &privileges)?;
    if users.roles().find(&name).is_some() {
        return Err(AuthError::new(
            ErrorCode::RoleAlreadyExists,
            format!("Role \"{name}\" already exists"),
        ));
    }
    users.roles_mut().put(RoleDocument {
        name,
        roles,
        privileges,
        authentication_restrictions: restrictions_arg(body),
    });
    done()
}

fn update_role(users: &mut UsersFile, db: &str, body: &Document) -> Result<AdminResult, AuthError> {
    const C: &str = "updateRole";
    let name = role_name_arg(C, body, db)?;
    let has_roles = body.contains_key("roles");
    let has_privileges = body.contains_key("privileges");
    let has_restrictions = body.contains_key("authenticationRestrictions");
    if !(has_roles || has_privileges || has_restrictions) {
        return Err(AuthError::bad_value(
            "Must specify at least one field to update in updateRole",
        ));
    }
    let privileges = body
        .get("privileges")
        .map(|p| privileges_arg(C, p))
        .transpose()?;
    let roles = body
        .get("roles")
        .map(|r| roles_arg(C, r, db, users.roles()))
        .transpose()?;
    let mut role = users
        .roles()
        .find(&name)
        .cloned()
        .ok_or_else(|| not_found(&name))?;
    if let Some(roles) = roles {
        check_roles_for(&name, &roles, users.roles())?;
        role.roles = roles;
    }
    if let Some(privileges) = privileges {
        check_privileges_for(&name, &privileges)?;
        role.privileges = privileges;
    }
    if has_restrictions {
        role.authentication_restrictions = restrictions_arg(body);
    }
    users.roles_mut().put(role);
    done()
}

fn flag(body: &Document, field: &str) -> bool {
    body.get(field).is_some_and(crate::value::field::truthy)
}

/// One role of `rolesInfo`: `"name"` (in `db`) or `{role, db}`.
fn role_spec(v: &Bson, db: &str) -> Result<RoleName, AuthError> {
    match v {
        Bson::String(_) | Bson::Document(_) => {
            RoleName::from_bson(v, db).map_err(AuthError::bad_value)
        }
        _ => Err(AuthError::bad_value(
            "Role name must be either a string or an object with 'role' and 'db' fields",
        )),
    }
}

/// The `rolesInfo` document of one role (custom or built in).
fn role_info(graph: &RoleGraph, name: &RoleName, show_privileges: bool) -> Option<Document> {
    let (direct, own, builtin): (Vec<RoleName>, Vec<Privilege>, bool) = match graph.find(name) {
        Some(r) => (r.roles.clone(), r.privileges.clone(), false),
        None => (Vec::new(), builtin_role_privileges(name)?, true),
    };
    let resolved = graph.resolve(&direct).unwrap_or_default();
    let as_docs = |roles: &[RoleName]| -> Vec<Bson> {
        roles
            .iter()
            .map(|r| Bson::Document(r.to_document()))
            .collect()
    };
    let mut d = doc! {
        "_id": format!("{}.{}", name.db, name.role),
        "role": &name.role,
        "db": &name.db,
    };
    if show_privileges {
        d.insert(
            "privileges",
            own.iter()
                .map(|p| Bson::Document(p.to_document()))
                .collect::<Vec<_>>(),
        );
    }
    d.insert("roles", as_docs(&direct));
    d.insert("isBuiltin", builtin);
    d.insert("inheritedRoles", as_docs(&resolved.roles));
    if show_privileges {
        let mut all = resolved.privileges;
        own.into_iter().for_each(|p| all.add(p));
        d.insert("inheritedPrivileges", all.to_documents());
    }
    Some(d)
}

fn roles_info(graph: &RoleGraph, db: &str, body: &Document) -> Result<AdminResult, AuthError> {
    let show_privileges = flag(body, "showPrivileges");
    let names: Vec<RoleName> = match body.get("rolesInfo") {
        Some(v) if crate::value::field::is_number(v) => {
            let mut names: Vec<RoleName> = graph
                .roles()
                .iter()
                .filter(|r| r.name.db == db)
                .map(|r| r.name.clone())
                .collect();
            if flag(body, "showBuiltinRoles") {
                names.extend(
                    super::roles::BUILTIN_ROLES
                        .iter()
                        .map(|(r, _)| RoleName::new(*r, db))
                        .filter(is_builtin_role),
                );
            }
            names.sort();
            names
        }
        Some(Bson::Array(items)) => items
            .iter()
            .map(|i| role_spec(i, db))
            .collect::<Result<_, _>>()?,
        Some(v) => vec![role_spec(v, db)?],
        None => return Err(missing("rolesInfo", "rolesInfo")),
    };
    let roles: Vec<Bson> = names
        .iter()
        .filter_map(|n| role_info(graph, n, show_privileges))
        .map(Bson::Document)
        .collect();
    Ok(AdminResult {
        reply: doc! {"roles": roles},
        changed: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::roles::Resource;
    use crate::auth::UserName;

    fn run_ok(users: &mut UsersFile, db: &str, body: Document) -> Document {
        let name = body.keys().next().unwrap().clone();
        run(users, &name, db, &body).unwrap().reply
    }

    fn err(users: &mut UsersFile, db: &str, body: Document) -> (i32, String) {
        let name = body.keys().next().unwrap().clone();
        let e = run(users, &name, db, &body).unwrap_err();
        (e.code.0, e.message)
    }

    fn find_on(db: &str, coll: &str) -> Document {
        doc! {"resource": {"db": db, "collection": coll}, "actions": ["find"]}
    }

    #[test]
    fn create_grant_inherit_and_drop() {
        let mut users = UsersFile::new();
        run_ok(
            &mut users,
            "test",
            doc! {"createRole": "readC", "privileges": [find_on("test", "c")], "roles": []},
        );
        run_ok(
            &mut users,
            "test",
            doc! {"createRole": "outer", "privileges": [], "roles": ["readC"]},
        );
        let mut users_cmd = |body: Document| {
            let name = body.keys().next().unwrap().clone();
            crate::auth::user_admin::run(&mut users, &name, "test", &body).unwrap();
        };
        users_cmd(doc! {"createUser": "u", "pwd": "x", "roles": ["outer"]});
        let user = users.find(&UserName::new("u", "test")).unwrap().clone();
        let p = users.principal(&user).unwrap();
        assert!(p
            .privileges
            .is_authorized(&Resource::Namespace("test", "c"), &[Action::Find]));
        assert!(!p
            .privileges
            .is_authorized(&Resource::Namespace("test", "d"), &[Action::Find]));
        assert!(!p
            .privileges
            .is_authorized(&Resource::Namespace("test", "c"), &[Action::Insert]));

        run_ok(
            &mut users,
            "test",
            doc! {"grantPrivilegesToRole": "readC", "privileges": [
                {"resource": {"db": "test", "collection": "c"}, "actions": ["insert"]}
            ]},
        );
        let p = users.principal(&user).unwrap();
        assert!(p.privileges.is_authorized(
            &Resource::Namespace("test", "c"),
            &[Action::Find, Action::Insert]
        ));

        // A cycle is refused, as is a role granted to itself.
        assert_eq!(
            err(
                &mut users,
                "test",
                doc! {"grantRolesToRole": "readC", "roles": ["outer"]}
            ),
            (
                172,
                "Granting roles to readC@test would introduce a cycle in the role graph".into()
            )
        );
        assert_eq!(
            err(
                &mut users,
                "test",
                doc! {"grantRolesToRole": "readC", "roles": ["readC"]}
            )
            .0,
            172
        );

        let info = run_ok(
            &mut users,
            "test",
            doc! {"rolesInfo": "outer", "showPrivileges": true},
        );
        let r = info.get_array("roles").unwrap()[0]
            .as_document()
            .unwrap()
            .clone();
        assert!(!r.get_bool("isBuiltin").unwrap());
        assert_eq!(
            r.get_array("inheritedRoles").unwrap(),
            &vec![Bson::Document(doc! {"role": "readC", "db": "test"})]
        );
        assert_eq!(r.get_array("inheritedPrivileges").unwrap().len(), 1);

        // Dropping a role removes it from the roles and users holding it.
        run_ok(&mut users, "test", doc! {"dropRole": "readC"});
        assert!(users
            .roles()
            .find(&RoleName::new("outer", "test"))
            .unwrap()
            .roles
            .is_empty());
        run_ok(&mut users, "test", doc! {"dropRole": "outer"});
        assert!(users
            .find(&UserName::new("u", "test"))
            .unwrap()
            .roles
            .is_empty());
        assert_eq!(
            err(&mut users, "test", doc! {"dropRole": "outer"}),
            (31, "Could not find role: outer@test".into())
        );
    }

    #[test]
    fn argument_errors_are_mongods() {
        let mut users = UsersFile::new();
        assert_eq!(
            err(
                &mut users,
                "test",
                doc! {"createRole": "read", "privileges": [], "roles": []}
            ),
            (
                2,
                "Cannot create roles with the same name as a built-in role".into()
            )
        );
        assert_eq!(
            err(
                &mut users,
                "test",
                doc! {"createRole": "r", "privileges": [find_on("other", "c")], "roles": []}
            ),
            (
                172,
                "Roles on the 'test' database cannot be granted privileges that target other \
                 databases or the cluster"
                    .into()
            )
        );
        assert_eq!(
            err(
                &mut users,
                "test",
                doc! {"createRole": "r", "privileges": [], "roles": ["nosuch"]}
            ),
            (31, "Could not find role: nosuch@test".into())
        );
        assert_eq!(
            err(&mut users, "test", doc! {"createRole": "r", "roles": []}).0,
            40414
        );
        assert_eq!(
            err(
                &mut users,
                "test",
                doc! {"createRole": "r", "privileges": [
                    {"resource": {"db": "test", "collection": ""}, "actions": ["fly"]}
                ], "roles": []}
            ),
            (2, "Unrecognized action privilege strings: fly".into())
        );
        run_ok(
            &mut users,
            "admin",
            doc! {"createRole": "r", "privileges": [{"resource": {"cluster": true}, "actions": ["serverStatus"]}], "roles": []},
        );
        assert_eq!(
            err(
                &mut users,
                "admin",
                doc! {"createRole": "r", "privileges": [], "roles": []}
            ),
            (51002, "Role \"r@admin\" already exists".into())
        );
        assert_eq!(
            err(&mut users, "admin", doc! {"updateRole": "r"}).1,
            "Must specify at least one field to update in updateRole"
        );
        assert_eq!(
            err(
                &mut users,
                "admin",
                doc! {"grantRolesToRole": "read", "roles": ["r"]}
            ),
            (
                2,
                "read@admin is a built-in role and cannot be modified".into()
            )
        );
    }
}
