use super::*;
use crate::auth::credentials::UsersFile;
use crate::auth::keyfile::KeyFile;
use crate::auth::scram::ClientConversation;

struct Users {
    file: UsersFile,
    internal: Option<InternalCredentials>,
}

impl UserLookup for Users {
    fn user(&self, name: &UserName) -> Option<UserDocument> {
        self.file.find(name).cloned()
    }
    fn internal_credentials(&self) -> Option<&InternalCredentials> {
        self.internal.as_ref()
    }
}

fn users() -> Users {
    let mut file = UsersFile::new();
    file.insert(
        UserDocument::new_scram(
            UserName::new("alice", "admin"),
            "secret",
            &ScramMechanism::ALL,
            vec![RoleName::new("readWrite", "test")],
        )
        .unwrap(),
    )
    .unwrap();
    file.insert(
        UserDocument::new_scram(
            UserName::new("only256", "admin"),
            "pw",
            &[ScramMechanism::Sha256],
            vec![],
        )
        .unwrap(),
    )
    .unwrap();
    file.insert(UserDocument::new_external(
        "CN=client,O=Sluice",
        vec![RoleName::new("read", "test")],
    ))
    .unwrap();
    let key = KeyFile::parse("k", b"abcdefghijkl").unwrap();
    Users {
        file,
        internal: Some(key.internal_credentials().unwrap()),
    }
}

fn bin(p: Vec<u8>) -> Bson {
    Bson::Binary(Binary {
        subtype: BinarySubtype::Generic,
        bytes: p,
    })
}

fn payload(d: &Document) -> Vec<u8> {
    match d.get("payload") {
        Some(Bson::Binary(b)) => b.bytes.clone(),
        other => panic!("no payload: {other:?}"),
    }
}

/// Runs a whole conversation as a driver does; returns the last result.
fn converse(
    s: &mut AuthSession,
    u: &Users,
    m: ScramMechanism,
    db: &str,
    user: &str,
    password: &str,
    skip: bool,
) -> Result<Outcome, AuthError> {
    let mut client = ClientConversation::new(m, user, password, "clientnonce123456").unwrap();
    let mut start =
        doc! {"saslStart": 1, "mechanism": m.name(), "payload": bin(client.client_first())};
    if skip {
        start.insert("options", doc! {"skipEmptyExchange": true});
    }
    let (r, _) = s.sasl_start(db, &start, u);
    let first = r?;
    assert_eq!(first.get_i32("conversationId").unwrap(), 1);
    assert!(!first.get_bool("done").unwrap());
    let fin = client.client_final(&payload(&first)).unwrap();
    let (r, o) = s.sasl_continue(
        &doc! {"saslContinue": 1, "conversationId": 1, "payload": bin(fin)},
        u,
    );
    let second = r?;
    client.verify_server_final(&payload(&second)).unwrap();
    if second.get_bool("done").unwrap() {
        return Ok(o);
    }
    let (r, o) = s.sasl_continue(
        &doc! {"saslContinue": 1, "conversationId": 1, "payload": bin(vec![])},
        u,
    );
    assert!(r?.get_bool("done").unwrap());
    Ok(o)
}

#[test]
fn both_mechanisms_authenticate_with_and_without_the_empty_exchange() {
    let u = users();
    for m in ScramMechanism::ALL {
        for skip in [false, true] {
            let mut s = AuthSession::new();
            let o = converse(&mut s, &u, m, "admin", "alice", "secret", skip).unwrap();
            assert_eq!(
                o,
                Outcome::Succeeded {
                    user: UserName::new("alice", "admin"),
                    mechanism: m.mechanism()
                }
            );
            let p = s.principal().unwrap();
            assert_eq!(p.roles, vec![RoleName::new("readWrite", "test")]);
        }
    }
}

#[test]
fn wrong_password_unknown_user_and_wrong_db_look_alike() {
    let u = users();
    for (db, user, pw) in [
        ("admin", "alice", "wrong"),
        ("admin", "nobody", "secret"),
        ("test", "alice", "secret"),
    ] {
        let mut s = AuthSession::new();
        let e = converse(&mut s, &u, ScramMechanism::Sha256, db, user, pw, true).unwrap_err();
        assert_eq!(e.code, ErrorCode::AuthenticationFailed);
        assert_eq!(e.message, "Authentication failed.");
        assert!(s.principal().is_none());
    }
}

#[test]
fn a_user_without_sha1_credentials_cannot_use_sha1() {
    let u = users();
    let mut s = AuthSession::new();
    let e = converse(
        &mut s,
        &u,
        ScramMechanism::Sha1,
        "admin",
        "only256",
        "pw",
        true,
    )
    .unwrap_err();
    assert_eq!(e.code, ErrorCode::AuthenticationFailed);
    assert!(e.for_log().contains("without any SCRAM-SHA-1 credentials"));
    converse(
        &mut s,
        &u,
        ScramMechanism::Sha256,
        "admin",
        "only256",
        "pw",
        true,
    )
    .unwrap();
}

#[test]
fn unknown_mechanism_is_334() {
    let u = users();
    let mut s = AuthSession::new();
    let (r, _) = s.sasl_start(
        "admin",
        &doc! {"saslStart": 1, "mechanism": "PLAIN", "payload": bin(b"x".to_vec())},
        &u,
    );
    let e = r.unwrap_err();
    assert_eq!(e.code, ErrorCode::MechanismUnavailable);
    assert_eq!(
        e.message,
        "Received authentication for mechanism PLAIN which is unknown or not enabled"
    );
}

#[test]
fn continue_without_start_or_with_another_id_is_a_protocol_error() {
    let u = users();
    let mut s = AuthSession::new();
    let (r, _) = s.sasl_continue(
        &doc! {"saslContinue": 1, "conversationId": 1, "payload": bin(vec![])},
        &u,
    );
    let e = r.unwrap_err();
    assert_eq!(
        (e.code, e.message.as_str()),
        (ErrorCode::ProtocolError, "No SASL session state found")
    );
    let client =
        ClientConversation::new(ScramMechanism::Sha256, "alice", "secret", "abcdefghijkl").unwrap();
    let (r, _) = s.sasl_start(
        "admin",
        &doc! {"saslStart": 1, "mechanism": "SCRAM-SHA-256", "payload": bin(client.client_first())},
        &u,
    );
    r.unwrap();
    let (r, _) = s.sasl_continue(
        &doc! {"saslContinue": 1, "conversationId": 2, "payload": bin(vec![])},
        &u,
    );
    let e = r.unwrap_err();
    assert_eq!(e.message, "sasl: Mismatched conversation id");
}

#[test]
fn a_failed_or_finished_conversation_cannot_be_replayed() {
    let u = users();
    let mut s = AuthSession::new();
    let mut client =
        ClientConversation::new(ScramMechanism::Sha256, "alice", "secret", "abcdefghijkl").unwrap();
    let (r, _) = s.sasl_start(
        "admin",
        &doc! {"saslStart": 1, "mechanism": "SCRAM-SHA-256", "payload": bin(client.client_first()),
        "options": {"skipEmptyExchange": true}},
        &u,
    );
    let fin = client.client_final(&payload(&r.unwrap())).unwrap();
    let step = doc! {"saslContinue": 1, "conversationId": 1, "payload": bin(fin)};
    let (r, _) = s.sasl_continue(&step, &u);
    assert!(r.unwrap().get_bool("done").unwrap());
    let (r, _) = s.sasl_continue(&step, &u);
    assert_eq!(r.unwrap_err().code, ErrorCode::ProtocolError);
    // A truncated client-final ends the conversation with 18, and it is gone.
    let mut s = AuthSession::new();
    let client =
        ClientConversation::new(ScramMechanism::Sha256, "alice", "secret", "abcdefghijkl").unwrap();
    let (r, _) = s.sasl_start(
        "admin",
        &doc! {"saslStart": 1, "mechanism": "SCRAM-SHA-256", "payload": bin(client.client_first())},
        &u,
    );
    r.unwrap();
    let (r, _) = s.sasl_continue(
        &doc! {"saslContinue": 1, "conversationId": 1, "payload": bin(b"c=biws,r=".to_vec())},
        &u,
    );
    assert_eq!(r.unwrap_err().code, ErrorCode::AuthenticationFailed);
    let (r, _) = s.sasl_continue(
        &doc! {"saslContinue": 1, "conversationId": 1, "payload": bin(vec![])},
        &u,
    );
    assert_eq!(r.unwrap_err().code, ErrorCode::ProtocolError);
}

#[test]
fn internal_user_authenticates_with_the_keyfile_key() {
    let u = users();
    let mut s = AuthSession::new();
    converse(
        &mut s,
        &u,
        ScramMechanism::Sha256,
        "local",
        "__system",
        "abcdefghijkl",
        true,
    )
    .unwrap();
    assert!(s.principal().unwrap().user.is_internal());
    let mut s = AuthSession::new();
    let e = converse(
        &mut s,
        &u,
        ScramMechanism::Sha256,
        "local",
        "__system",
        "abcdefghijkX",
        true,
    )
    .unwrap_err();
    assert_eq!(e.code, ErrorCode::AuthenticationFailed);
    let no_key = Users {
        file: UsersFile::new(),
        internal: None,
    };
    let e = converse(
        &mut s,
        &no_key,
        ScramMechanism::Sha256,
        "local",
        "__system",
        "abcdefghijkl",
        true,
    )
    .unwrap_err();
    assert!(e.for_log().contains("without a --keyFile"));
}

#[test]
fn sasl_supported_mechs_lists_a_users_mechanisms() {
    let u = users();
    let ask = |s: &str| {
        AuthSession::sasl_supported_mechs(&doc! {"hello": 1, "saslSupportedMechs": s}, &u)
    };
    assert_eq!(
        ask("admin.alice").unwrap(),
        Some(vec!["SCRAM-SHA-1", "SCRAM-SHA-256"])
    );
    assert_eq!(ask("admin.only256").unwrap(), Some(vec!["SCRAM-SHA-256"]));
    assert_eq!(ask("admin.nobody").unwrap(), None);
    assert_eq!(ask("nodot").unwrap_err().code, ErrorCode::BadValue);
    assert_eq!(
        AuthSession::sasl_supported_mechs(&doc! {"hello": 1}, &u).unwrap(),
        None
    );
}

#[test]
fn speculative_sasl_start_then_continue() {
    let u = users();
    let mut s = AuthSession::new();
    let mut client =
        ClientConversation::new(ScramMechanism::Sha256, "alice", "secret", "abcdefghijkl").unwrap();
    let hello = doc! {"hello": 1, "speculativeAuthenticate": {
    "saslStart": 1, "mechanism": "SCRAM-SHA-256", "payload": bin(client.client_first()),
    "options": {"skipEmptyExchange": true}, "db": "admin"}};
    let (reply, outcome) = s.speculative(&hello, &u).unwrap();
    assert_eq!(outcome, Outcome::Continued);
    let reply = reply.unwrap();
    let fin = client.client_final(&payload(&reply)).unwrap();
    let (r, _) = s.sasl_continue(
        &doc! {"saslContinue": 1, "conversationId": 1, "payload": bin(fin)},
        &u,
    );
    assert!(r.unwrap().get_bool("done").unwrap());
    assert_eq!(s.principal().unwrap().user, UserName::new("alice", "admin"));
    // A failing speculative start leaves the field out.
    let bad = doc! {"hello": 1, "speculativeAuthenticate": {
    "saslStart": 1, "mechanism": "PLAIN", "payload": bin(vec![1]), "db": "admin"}};
    let (reply, outcome) = AuthSession::new().speculative(&bad, &u).unwrap();
    assert!(reply.is_none());
    assert!(matches!(outcome, Outcome::Failed { .. }));
}

#[test]
fn x509_authenticates_the_certificate_subject_only() {
    let u = users();
    let mut s = AuthSession::new();
    let cmd = doc! {"authenticate": 1, "mechanism": "MONGODB-X509"};
    let (r, _) = s.authenticate("$external", &cmd, &u);
    assert_eq!(
        r.unwrap_err().message,
        "No verified subject name available from client"
    );
    s.set_peer_subject(Some("CN=client,O=Sluice".into()));
    let (r, _) = s.authenticate("test", &cmd, &u);
    assert_eq!(r.unwrap_err().code, ErrorCode::BadValue);
    let (r, _) = s.authenticate(
        "$external",
        &doc! {"authenticate": 1, "mechanism": "MONGODB-X509", "user": "CN=other"},
        &u,
    );
    assert_eq!(r.unwrap_err().code, ErrorCode::AuthenticationFailed);
    let (r, _) = s.authenticate("$external", &cmd, &u);
    assert_eq!(r.unwrap().get_str("user").unwrap(), "CN=client,O=Sluice");
    assert_eq!(
        s.auth_info(false),
        doc! {"authenticatedUsers": [{"user": "CN=client,O=Sluice", "db": "$external"}],
        "authenticatedUserRoles": [{"role": "read", "db": "test"}]}
    );
    s.logout();
    assert_eq!(
        s.auth_info(true),
        doc! {"authenticatedUsers": [], "authenticatedUserRoles": [],
        "authenticatedUserPrivileges": []}
    );
}

#[test]
fn a_cluster_members_certificate_is_system_where_members_may_use_certificates() {
    let u = users();
    let cmd = doc! {"authenticate": 1, "mechanism": "MONGODB-X509"};
    let mut s = AuthSession::new();
    s.set_peer_subject(Some("CN=router,OU=Cluster,O=Sluice".into()));
    s.set_peer_cluster_member(Some(true));
    let (r, outcome) = s.authenticate("$external", &cmd, &u);
    assert!(r.is_ok());
    assert!(matches!(outcome, Outcome::Succeeded { ref user, .. } if user.is_internal()));
    assert!(s.principal().is_some_and(|p| p.user.is_internal()));

    // clusterAuthMode keyFile: mongod's refusal, whatever users exist.
    let mut s = AuthSession::new();
    s.set_peer_subject(Some("CN=client,O=Sluice".into()));
    s.set_peer_cluster_member(Some(false));
    let (r, _) = s.authenticate("$external", &cmd, &u);
    let e = r.unwrap_err();
    assert_eq!(e.code, ErrorCode::AuthenticationFailed);
    assert!(e
        .message
        .starts_with("The provided certificate can only be used for cluster authentication"));
    assert!(s.principal().is_none());
}

/// A lookup that counts the whole user documents it hands out.
struct CountingDocuments {
    users: Users,
    documents: std::cell::Cell<usize>,
}

impl UserLookup for CountingDocuments {
    fn user(&self, name: &UserName) -> Option<UserDocument> {
        self.documents.set(self.documents.get() + 1);
        self.users.user(name)
    }
    fn scram_credential(
        &self,
        name: &UserName,
        mechanism: ScramMechanism,
    ) -> Option<Option<ScramCredential>> {
        self.users.file.scram_credential(name, mechanism)
    }
    fn internal_credentials(&self) -> Option<&InternalCredentials> {
        self.users.internal_credentials()
    }
}

#[test]
fn sasl_start_takes_the_credential_without_copying_the_user_document() {
    let u = CountingDocuments {
        users: users(),
        documents: std::cell::Cell::new(0),
    };
    for (user, pw) in [("alice", "secret"), ("nobody", "secret")] {
        u.documents.set(0);
        let mut s = AuthSession::new();
        let mut client =
            ClientConversation::new(ScramMechanism::Sha256, user, pw, "clientnonce123456").unwrap();
        let start = doc! {"saslStart": 1, "mechanism": "SCRAM-SHA-256",
        "payload": bin(client.client_first()), "options": {"skipEmptyExchange": true}};
        let (r, _) = s.sasl_start("admin", &start, &u);
        assert_eq!(
            u.documents.get(),
            0,
            "{user}: saslStart copied a user document"
        );
        if user == "nobody" {
            assert_eq!(r.unwrap_err().code, ErrorCode::AuthenticationFailed);
            continue;
        }
        let fin = client.client_final(&payload(&r.unwrap())).unwrap();
        let (r, o) = s.sasl_continue(
            &doc! {"saslContinue": 1, "conversationId": 1, "payload": bin(fin)},
            &u,
        );
        client.verify_server_final(&payload(&r.unwrap())).unwrap();
        assert!(matches!(o, Outcome::Succeeded { .. }), "{o:?}");
    }
}
