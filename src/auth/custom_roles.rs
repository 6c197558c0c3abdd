//! Custom roles: the `admin.system.roles` document, and the role graph a user's roles are
//! resolved through.
//!
//! A custom role has privileges of its own and inherits other roles (built-in or custom); a
//! user's privileges are the union over the transitive closure of its roles, as mongod's
//! `RoleGraph` computes them. The graph is acyclic: granting a role that already inherits the
//! grantee is refused when the grant is made (`role_admin`), and resolution walks each role
//! once, so a cycle that came in through a hand-edited document cannot loop.

use super::roles::{builtin_role_privileges, is_builtin_role, Privilege, Privileges, RoleName};
use bson::{doc, Bson, Document};

/// One custom role, as `admin.system.roles` holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct RoleDocument {
    /// `role` and `db`.
    pub name: RoleName,
    /// `roles`: the roles it inherits directly.
    pub roles: Vec<RoleName>,
    /// `privileges`: its own privileges.
    pub privileges: Vec<Privilege>,
    /// `authenticationRestrictions`, when given (enforced at authentication,
    /// [`crate::auth::restrictions`]).
    pub authentication_restrictions: Option<Vec<Bson>>,
}

impl RoleDocument {
    /// The stored document, in mongod's field order: `_id, role, db, privileges, roles,
    /// [authenticationRestrictions]`.
    pub fn to_document(&self) -> Document {
        let mut d = doc! {
            "_id": format!("{}.{}", self.name.db, self.name.role),
            "role": &self.name.role,
            "db": &self.name.db,
            "privileges": self.privileges.iter().map(|p| Bson::Document(p.to_document())).collect::<Vec<_>>(),
            "roles": self.roles.iter().map(|r| Bson::Document(r.to_document())).collect::<Vec<_>>(),
        };
        if let Some(r) = &self.authentication_restrictions {
            d.insert("authenticationRestrictions", r.clone());
        }
        d
    }

    /// Reads a stored document (a config server's `admin.system.roles`, a roles file).
    pub fn from_document(d: &Document) -> Result<RoleDocument, String> {
        let role = d
            .get_str("role")
            .map_err(|_| "role must be a string".to_string())?;
        let db = d
            .get_str("db")
            .map_err(|_| "db must be a string".to_string())?;
        if role.is_empty() || db.is_empty() {
            return Err("Role document needs non-empty 'role' and 'db' fields".into());
        }
        let name = RoleName::new(role, db);
        if let Some(id) = d.get("_id") {
            if id.as_str() != Some(format!("{db}.{role}").as_str()) {
                return Err(format!("_id must be \"{db}.{role}\""));
            }
        }
        let roles = match d.get("roles") {
            None => Vec::new(),
            Some(Bson::Array(items)) => items
                .iter()
                .map(|r| match r {
                    Bson::Document(_) => {
                        RoleName::from_bson(r, db).map_err(|e| format!("roles: {e}"))
                    }
                    _ => Err("roles must hold {role, db} objects".to_string()),
                })
                .collect::<Result<Vec<_>, _>>()?,
            Some(_) => return Err("roles must be an array".into()),
        };
        let privileges = match d.get("privileges") {
            None => Vec::new(),
            Some(Bson::Array(items)) => items
                .iter()
                .map(|p| match p {
                    Bson::Document(p) => Privilege::from_document(p),
                    _ => Err("privileges must hold {resource, actions} objects".to_string()),
                })
                .collect::<Result<Vec<_>, _>>()?,
            Some(_) => return Err("privileges must be an array".into()),
        };
        let authentication_restrictions = match d.get("authenticationRestrictions") {
            None => None,
            Some(Bson::Array(a)) => Some(a.clone()),
            Some(_) => return Err("authenticationRestrictions must be an array".into()),
        };
        Ok(RoleDocument {
            name,
            roles,
            privileges,
            authentication_restrictions,
        })
    }
}

/// What resolving a set of roles found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Resolved {
    /// Every role reached, the starting ones included, sorted (what `usersInfo` and
    /// `connectionStatus` list as a user's roles with their inherited ones).
    pub roles: Vec<RoleName>,
    /// The union of their privileges.
    pub privileges: Privileges,
}

/// The custom roles of a deployment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RoleGraph {
    roles: Vec<RoleDocument>,
}

impl RoleGraph {
    /// No custom role.
    pub fn new() -> RoleGraph {
        RoleGraph::default()
    }

    /// The graph of these roles (a second document for one role replaces the first).
    pub fn from_roles(roles: Vec<RoleDocument>) -> RoleGraph {
        let mut g = RoleGraph::new();
        for r in roles {
            g.put(r);
        }
        g
    }

    /// Parses a roles file: a JSON array of Extended JSON `admin.system.roles` documents (as
    /// `mongoexport --jsonArray` writes them).
    pub fn parse(text: &str) -> Result<RoleGraph, String> {
        let value: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| format!("the roles file is not valid JSON: {e}"))?;
        let serde_json::Value::Array(items) = value else {
            return Err("the roles file must hold a JSON array of role documents".into());
        };
        let mut roles = Vec::new();
        for (i, item) in items.into_iter().enumerate() {
            let doc = match Bson::try_from(item) {
                Ok(Bson::Document(d)) => d,
                _ => return Err(format!("role document {}: not an object", i + 1)),
            };
            roles.push(
                RoleDocument::from_document(&doc)
                    .map_err(|e| format!("role document {}: {e}", i + 1))?,
            );
        }
        let graph = RoleGraph::from_roles(roles);
        for r in &graph.roles {
            if let Some(missing) = r.roles.iter().find(|x| !graph.exists(x)) {
                return Err(format!("role {}: Could not find role: {missing}", r.name));
            }
        }
        Ok(graph)
    }

    /// The roles file's text: the documents as relaxed Extended JSON, one array.
    pub fn to_text(&self) -> String {
        let items: Vec<serde_json::Value> = self
            .roles
            .iter()
            .map(|r| Bson::Document(r.to_document()).into_relaxed_extjson())
            .collect();
        let mut text = serde_json::to_string_pretty(&serde_json::Value::Array(items))
            .unwrap_or_else(|_| "[]".to_string());
        text.push('\n');
        text
    }

    /// The stored documents, as `admin.system.roles` holds them.
    pub fn documents(&self) -> Vec<Document> {
        self.roles.iter().map(|r| r.to_document()).collect()
    }

    /// Every custom role.
    pub fn roles(&self) -> &[RoleDocument] {
        &self.roles
    }

    /// One custom role.
    pub fn find(&self, name: &RoleName) -> Option<&RoleDocument> {
        self.roles.iter().find(|r| r.name == *name)
    }

    /// Whether `name` is a built-in role or one of these.
    pub fn exists(&self, name: &RoleName) -> bool {
        is_builtin_role(name) || self.find(name).is_some()
    }

    /// Adds or replaces a role.
    pub fn put(&mut self, role: RoleDocument) {
        match self.roles.iter_mut().find(|r| r.name == role.name) {
            Some(slot) => *slot = role,
            None => self.roles.push(role),
        }
    }

    /// Removes a role and every grant of it to another role; returns whether it existed.
    pub fn remove(&mut self, name: &RoleName) -> bool {
        let before = self.roles.len();
        self.roles.retain(|r| r.name != *name);
        for r in &mut self.roles {
            r.roles.retain(|x| x != name);
        }
        before != self.roles.len()
    }

    /// The closure of `start`: every role reachable through inheritance and the union of
    /// their privileges (the starting roles' own included). A role that is neither built in
    /// nor defined here is the error.
    pub fn resolve(&self, start: &[RoleName]) -> Result<Resolved, RoleName> {
        let mut seen: Vec<RoleName> = Vec::new();
        let mut queue: Vec<RoleName> = start.to_vec();
        let mut privileges = Privileges::none();
        while let Some(role) = queue.pop() {
            if seen.contains(&role) {
                continue;
            }
            if let Some(list) = builtin_role_privileges(&role) {
                list.into_iter().for_each(|p| privileges.add(p));
            } else if let Some(custom) = self.find(&role) {
                custom
                    .privileges
                    .iter()
                    .for_each(|p| privileges.add(p.clone()));
                queue.extend(custom.roles.iter().cloned());
            } else {
                return Err(role);
            }
            seen.push(role);
        }
        seen.sort();
        Ok(Resolved {
            roles: seen,
            privileges,
        })
    }

    /// The `authenticationRestrictions` of every custom role `start` reaches, inherited ones
    /// included: each must be met for a user holding `start` to authenticate.
    pub fn restrictions(&self, start: &[RoleName]) -> Vec<Vec<Bson>> {
        let mut seen: Vec<&RoleName> = Vec::new();
        let mut queue: Vec<&RoleName> = start.iter().collect();
        let mut out = Vec::new();
        while let Some(role) = queue.pop() {
            if seen.contains(&role) {
                continue;
            }
            seen.push(role);
            if let Some(custom) = self.find(role) {
                if let Some(r) = &custom.authentication_restrictions {
                    out.push(r.clone());
                }
                queue.extend(custom.roles.iter());
            }
        }
        out
    }

    /// Whether `from` inherits `target`, directly or not (`from` itself excluded).
    pub fn inherits(&self, from: &RoleName, target: &RoleName) -> bool {
        let mut seen: Vec<&RoleName> = Vec::new();
        let mut queue: Vec<&RoleName> = match self.find(from) {
            Some(r) => r.roles.iter().collect(),
            None => return false,
        };
        while let Some(r) = queue.pop() {
            if r == target {
                return true;
            }
            if seen.contains(&r) {
                continue;
            }
            seen.push(r);
            if let Some(doc) = self.find(r) {
                queue.extend(doc.roles.iter());
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::roles::{Action, Resource, ResourcePattern};

    fn role(name: &str, db: &str, roles: &[(&str, &str)], privs: Vec<Privilege>) -> RoleDocument {
        RoleDocument {
            name: RoleName::new(name, db),
            roles: roles.iter().map(|(r, d)| RoleName::new(*r, *d)).collect(),
            privileges: privs,
            authentication_restrictions: None,
        }
    }

    #[test]
    fn documents_round_trip_in_mongods_shape() {
        let r = role(
            "reader",
            "test",
            &[("read", "test")],
            vec![Privilege::new(
                ResourcePattern::Namespace("test".into(), "c".into()),
                &[Action::Find],
            )],
        );
        let d = r.to_document();
        let keys: Vec<&str> = d.keys().map(|k| k.as_str()).collect();
        assert_eq!(keys, ["_id", "role", "db", "privileges", "roles"]);
        assert_eq!(d.get_str("_id").unwrap(), "test.reader");
        assert_eq!(RoleDocument::from_document(&d).unwrap(), r);
        let mut bad = d.clone();
        bad.insert("_id", "test.other");
        assert!(RoleDocument::from_document(&bad).is_err());
        bad = d.clone();
        bad.insert("privileges", 1);
        assert!(RoleDocument::from_document(&bad).is_err());
    }

    #[test]
    fn resolution_follows_inheritance_and_unions_privileges() {
        let find_c = Privilege::new(
            ResourcePattern::Namespace("test".into(), "c".into()),
            &[Action::Find],
        );
        let insert_d = Privilege::new(
            ResourcePattern::Namespace("test".into(), "d".into()),
            &[Action::Insert],
        );
        let g = RoleGraph::from_roles(vec![
            role("base", "test", &[], vec![find_c]),
            role("mid", "test", &[("base", "test")], vec![insert_d]),
            role(
                "top",
                "admin",
                &[("mid", "test"), ("clusterMonitor", "admin")],
                vec![],
            ),
        ]);
        let r = g.resolve(&[RoleName::new("top", "admin")]).unwrap();
        assert_eq!(
            r.roles,
            vec![
                RoleName::new("base", "test"),
                RoleName::new("clusterMonitor", "admin"),
                RoleName::new("mid", "test"),
                RoleName::new("top", "admin"),
            ]
        );
        let p = &r.privileges;
        assert!(p.is_authorized(&Resource::Namespace("test", "c"), &[Action::Find]));
        assert!(!p.is_authorized(&Resource::Namespace("test", "c"), &[Action::Insert]));
        assert!(p.is_authorized(&Resource::Namespace("test", "d"), &[Action::Insert]));
        assert!(p.is_authorized(&Resource::Cluster, &[Action::ServerStatus]));
        assert!(!p.is_authorized(&Resource::Namespace("test", "e"), &[Action::Find]));
        assert!(g.inherits(
            &RoleName::new("top", "admin"),
            &RoleName::new("base", "test")
        ));
        assert!(!g.inherits(
            &RoleName::new("base", "test"),
            &RoleName::new("top", "admin")
        ));
        assert_eq!(
            g.resolve(&[RoleName::new("nosuch", "test")]).unwrap_err(),
            RoleName::new("nosuch", "test")
        );
    }

    #[test]
    fn a_cycle_in_stored_documents_resolves_without_looping() {
        let g = RoleGraph::from_roles(vec![
            role("a", "test", &[("b", "test")], vec![]),
            role("b", "test", &[("a", "test")], vec![]),
        ]);
        let r = g.resolve(&[RoleName::new("a", "test")]).unwrap();
        assert_eq!(r.roles.len(), 2);
    }

    #[test]
    fn removing_a_role_removes_its_grants() {
        let mut g = RoleGraph::from_roles(vec![
            role("a", "test", &[("b", "test")], vec![]),
            role("b", "test", &[], vec![]),
        ]);
        assert!(g.remove(&RoleName::new("b", "test")));
        assert!(g
            .find(&RoleName::new("a", "test"))
            .unwrap()
            .roles
            .is_empty());
        assert!(!g.remove(&RoleName::new("b", "test")));
    }
}
