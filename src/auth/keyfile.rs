//! The cluster keyfile (`security.keyFile`) as mongod reads it, and the `__system@local`
//! credentials derived from it.
//!
//! Members of a keyfile cluster authenticate to each other as `__system` in the `local`
//! database, with SCRAM over the key's text as the password. Sluice does the same towards
//! keyfile-protected shards and config servers, and its embedded servers started with a keyfile
//! accept it.
//!
//! mongod's reading rules, kept exactly:
//! - the file is YAML: one scalar (one key) or a sequence of scalars (several keys, for key
//!   rotation: every key is accepted, the first one is used to connect); anything else is
//!   `Only strings and sequences are supported for YAML key files`;
//! - from each key, bytes `\t \n \v \f \r` and space are removed wherever they are (so a key
//!   wrapped over lines, as `openssl rand -base64 756` writes it, is one key), and any other
//!   character outside `A–Z a–z 0–9 + / =` is `invalid char in key file <path>` (the key is
//!   not decoded: its text is the password);
//! - each key is 6 to 1024 characters;
//! - on Unix the file must not be readable by group or others: `permissions on <path> are too
//!   open`.
//!
//! The YAML understood is the subset keyfiles use: a plain, quoted or block (`|`, `>`) scalar,
//! or a block (`- key`) or flow (`[a, b]`) sequence, with `#` comments and a leading `---`.

use super::scram::{
    prepare_password, ClientConversation, ScramClientError, ScramCredential, ScramMechanism,
};
use super::{secure_random, AuthError, INTERNAL_USER};
use crate::value::error_codes::ErrorCode;
use std::fmt;
use std::path::Path;

/// mongod's bounds on a key's length, in characters after whitespace removal.
pub const KEY_LENGTH: std::ops::RangeInclusive<usize> = 6..=1024;

/// The keys of a keyfile.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyFile {
    keys: Vec<String>,
}

impl fmt::Debug for KeyFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The keys are cluster passwords.
        write!(f, "KeyFile({} keys)", self.keys.len())
    }
}

impl KeyFile {
    /// Reads a keyfile: the permission check (Unix), then [`KeyFile::parse`].
    pub fn load(path: &Path) -> Result<KeyFile, AuthError> {
        let shown = path.display().to_string();
        let meta = std::fs::metadata(path).map_err(|e| {
            AuthError::new(
                ErrorCode::InvalidPath,
                format!("Error reading file {shown}: {}", os_message(&e)),
            )
        })?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            check_permissions(&shown, meta.permissions().mode())?;
        }
        #[cfg(not(unix))]
        let _ = meta;
        let bytes = std::fs::read(path).map_err(|e| {
            AuthError::new(
                ErrorCode::InvalidPath,
                format!("error opening file: {shown}: {}", os_message(&e)),
            )
        })?;
        KeyFile::parse(&shown, &bytes)
    }

    /// Parses a keyfile's contents; `path` only names the file in messages.
    pub fn parse(path: &str, contents: &[u8]) -> Result<KeyFile, AuthError> {
        let unsupported = |message: String| AuthError::new(ErrorCode::UnsupportedFormat, message);
        let text = std::str::from_utf8(contents)
            .map_err(|_| unsupported(format!("invalid char in key file {path}")))?;
        let raw = yaml_keys(text).map_err(|e| match e {
            YamlError::NotScalarOrSequence => unsupported(
                "Only strings and sequences are supported for YAML key files".to_string(),
            ),
            YamlError::Syntax(what) => unsupported(format!("error reading file: {path}: {what}")),
        })?;
        let mut keys = Vec::with_capacity(raw.len());
        for key in raw {
            let stripped: String = key
                .chars()
                .filter(|c| !matches!(c, '\x09'..='\x0D' | ' '))
                .collect();
            if stripped
                .chars()
                .any(|c| !(c.is_ascii_alphanumeric() || c == '+' || c == '/' || c == '='))
            {
                return Err(unsupported(format!("invalid char in key file {path}")));
            }
            if !KEY_LENGTH.contains(&stripped.len()) {
                return Err(AuthError::new(
                    ErrorCode::BadValue,
                    format!(
                        "security key in {path} has length {}, must be between 6 and 1024 chars",
                        stripped.len()
                    ),
                ));
            }
            keys.push(stripped);
        }
        if keys.is_empty() {
            return Err(AuthError::new(
                ErrorCode::KeyFileWithoutKeys,
                format!("Security key file {path} does not contain any valid keys"),
            ));
        }
        Ok(KeyFile { keys })
    }

    /// Every key, the one used to connect first.
    pub fn keys(&self) -> &[String] {
        &self.keys
    }

    /// The key Sluice authenticates with.
    pub fn primary(&self) -> &str {
        &self.keys[0]
    }

    /// The in-memory `__system@local` credentials a server started with this keyfile accepts:
    /// per key, SCRAM-SHA-1 over mongod's digest of `__system` and the key, and SCRAM-SHA-256
    /// over the key, with mongod's default iteration counts. All keys of a mechanism share one
    /// random salt: the server-first message names a single salt and count, and a peer holding
    /// any of the keys must derive matching keys from them.
    pub fn internal_credentials(&self) -> Result<InternalCredentials, AuthError> {
        let derive = |m: ScramMechanism| -> Result<Vec<ScramCredential>, AuthError> {
            let mut salt = vec![0u8; m.salt_len()];
            secure_random(&mut salt)?;
            self.keys
                .iter()
                .map(|key| {
                    let prepared = prepare_password(m, INTERNAL_USER, key)?;
                    Ok(ScramCredential::derive(
                        m,
                        &prepared,
                        &salt,
                        m.default_iterations(),
                    ))
                })
                .collect()
        };
        Ok(InternalCredentials {
            sha1: derive(ScramMechanism::Sha1)?,
            sha256: derive(ScramMechanism::Sha256)?,
        })
    }

    /// A client conversation as `__system` with the primary key (what a mongos sends to its
    /// shards: SCRAM-SHA-256, or SCRAM-SHA-1 when the server offers only that).
    pub fn client_conversation(
        &self,
        mechanism: ScramMechanism,
    ) -> Result<ClientConversation, ScramClientError> {
        let nonce = ClientConversation::random_nonce()?;
        ClientConversation::new(mechanism, INTERNAL_USER, self.primary(), &nonce)
    }
}

/// `__system@local`'s credentials on a server started with a keyfile: one per key and
/// mechanism, tried in key order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InternalCredentials {
    sha1: Vec<ScramCredential>,
    sha256: Vec<ScramCredential>,
}

impl InternalCredentials {
    /// The credentials of one mechanism (what [`super::scram::ServerConversation::start`]
    /// takes).
    pub fn scram(&self, mechanism: ScramMechanism) -> &[ScramCredential] {
        match mechanism {
            ScramMechanism::Sha1 => &self.sha1,
            ScramMechanism::Sha256 => &self.sha256,
        }
    }
}

/// mongod's permission rule: no bit for group or others (`mode & 077`).
pub fn check_permissions(path: &str, mode: u32) -> Result<(), AuthError> {
    if mode & 0o077 != 0 {
        return Err(AuthError::new(
            ErrorCode::InvalidPath,
            format!("permissions on {path} are too open"),
        ));
    }
    Ok(())
}

/// An I/O error's text without Rust's " (os error N)" suffix, as `strerror` prints it.
fn os_message(e: &std::io::Error) -> String {
    let text = e.to_string();
    match text.find(" (os error") {
        Some(i) => text[..i].to_string(),
        None => text,
    }
}

#[derive(Debug, PartialEq, Eq)]
enum YamlError {
    NotScalarOrSequence,
    Syntax(&'static str),
}

/// Removes a `#` comment: a `#` at the start of the line or after whitespace, outside
/// quotes.
fn strip_comment(line: &str) -> &str {
    let mut quote: Option<char> = None;
    let mut prev_space = true;
    for (i, c) in line.char_indices() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if c == '"' || c == '\'' => quote = Some(c),
            None if c == '#' && prev_space => return &line[..i],
            None => {}
        }
        prev_space = c == ' ' || c == '\t';
    }
    line
}

fn unquote(s: &str) -> Result<String, YamlError> {
    let s = s.trim();
    for q in ['"', '\''] {
        if let Some(rest) = s.strip_prefix(q) {
            return match rest.strip_suffix(q) {
                Some(inner) => Ok(inner.to_string()),
                None => Err(YamlError::Syntax("unterminated quoted scalar")),
            };
        }
    }
    Ok(s.to_string())
}

fn is_mapping(s: &str) -> bool {
    let s = s.trim_start();
    s.starts_with('{') || s.starts_with('?') || s.contains(": ") || s.trim_end().ends_with(':')
}

/// The scalars of a keyfile's YAML (a scalar, or a possibly nested sequence flattened).
fn yaml_keys(text: &str) -> Result<Vec<String>, YamlError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let lines: Vec<&str> = text
        .lines()
        .map(|l| strip_comment(l).trim_end())
        .filter(|l| !l.trim().is_empty())
        .filter(|l| *l != "---" && *l != "...")
        .collect();
    let Some(first) = lines.first() else {
        // An empty document is YAML null: neither a scalar nor a sequence.
        return Err(YamlError::NotScalarOrSequence);
    };
    let head = first.trim_start();
    if head.starts_with('-') && (head.len() == 1 || head[1..].starts_with([' ', '\t'])) {
        return block_sequence(&lines);
    }
    if head.starts_with('[') {
        let joined = lines.iter().map(|l| l.trim()).collect::<Vec<_>>().join(" ");
        let inner = joined
            .strip_prefix('[')
            .and_then(|s| s.strip_suffix(']'))
            .ok_or(YamlError::Syntax("unterminated flow sequence"))?;
        let mut keys = Vec::new();
        for item in inner.split(',') {
            let item = item.trim();
            if item.is_empty() {
                continue;
            }
            if item.starts_with('[') || item.starts_with('{') || is_mapping(item) {
                return Err(YamlError::NotScalarOrSequence);
            }
            keys.push(unquote(item)?);
        }
        return Ok(keys);
    }
    if lines.iter().any(|l| is_mapping(l)) {
        return Err(YamlError::NotScalarOrSequence);
    }
    if head.starts_with('|') || head.starts_with('>') {
        return Ok(vec![lines[1..].join("\n")]);
    }
    let joined = lines.iter().map(|l| l.trim()).collect::<Vec<_>>().join(" ");
    Ok(vec![unquote(&joined)?])
}

fn block_sequence(lines: &[&str]) -> Result<Vec<String>, YamlError> {
    let indent = |l: &str| l.len() - l.trim_start().len();
    let base = indent(lines[0]);
    let mut items: Vec<String> = Vec::new();
    for line in lines {
        let here = indent(line);
        let body = line.trim_start();
        if here == base && body.starts_with('-') {
            // Nested sequences (`- - a`) flatten, as mongod's visitor does.
            let mut item = body;
            while let Some(rest) = item.strip_prefix('-') {
                if !(rest.is_empty() || rest.starts_with([' ', '\t'])) {
                    break;
                }
                item = rest.trim_start();
            }
            if is_mapping(item) {
                return Err(YamlError::NotScalarOrSequence);
            }
            items.push(item.to_string());
        } else if here > base {
            match items.last_mut() {
                Some(last) => {
                    last.push(' ');
                    last.push_str(body);
                }
                None => return Err(YamlError::Syntax("bad indentation")),
            }
        } else {
            return Err(YamlError::Syntax("bad indentation of a sequence entry"));
        }
    }
    items.into_iter().map(|i| unquote(&i)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::scram::{ClientFirst, ServerConversation};

    fn keys(text: &str) -> Vec<String> {
        KeyFile::parse("/k", text.as_bytes())
            .unwrap()
            .keys()
            .to_vec()
    }

    fn err(text: &str) -> AuthError {
        KeyFile::parse("/k", text.as_bytes()).unwrap_err()
    }

    #[test]
    fn whitespace_anywhere_is_removed() {
        assert_eq!(keys("abcdef\n"), ["abcdef"]);
        assert_eq!(keys("key 1 is\tlong\r\n"), ["key1islong"]);
        assert_eq!(
            keys("QUJDREVG\nR0hJSktM\nTU5PUA==\n"),
            ["QUJDREVGR0hJSktMTU5PUA=="],
            "openssl's wrapped base64 is one key"
        );
    }

    #[test]
    fn sequences_hold_several_keys() {
        assert_eq!(keys("- firstkey\n- secondkey\n"), ["firstkey", "secondkey"]);
        assert_eq!(keys("[ firstkey, 'secondkey' ]"), ["firstkey", "secondkey"]);
        assert_eq!(
            keys("---\n# rotated keys\n- firstkey # current\n- - nested1\n  wrapped\n"),
            ["firstkey", "nested1wrapped"]
        );
        assert_eq!(keys("\"quoted key\""), ["quotedkey"]);
        assert_eq!(keys("|\n  abcdef\n  ghijkl\n"), ["abcdefghijkl"]);
        let k = KeyFile::parse("/k", b"- one111\n- two222\n").unwrap();
        assert_eq!(k.primary(), "one111");
    }

    #[test]
    fn refusals_carry_mongods_messages() {
        let e = err("abc$def");
        assert_eq!(e.code, ErrorCode::UnsupportedFormat);
        assert_eq!(e.message, "invalid char in key file /k");
        let e = err("abcde");
        assert_eq!(
            e.message,
            "security key in /k has length 5, must be between 6 and 1024 chars"
        );
        assert!(err(&"a".repeat(1025)).message.contains("has length 1025"));
        assert_eq!(keys(&"a".repeat(1024))[0].len(), 1024);
        let e = err("");
        assert_eq!(
            e.message,
            "Only strings and sequences are supported for YAML key files"
        );
        assert_eq!(
            err("key: value").message,
            "Only strings and sequences are supported for YAML key files"
        );
        let e = err("[]");
        assert_eq!(e.code.0, 50981);
        assert_eq!(
            e.message,
            "Security key file /k does not contain any valid keys"
        );
        assert_eq!(
            KeyFile::parse("/k", &[0xff, 0xfe]).unwrap_err().message,
            "invalid char in key file /k"
        );
    }

    #[test]
    fn permissions_follow_mongod() {
        assert!(check_permissions("/k", 0o100600).is_ok());
        assert!(check_permissions("/k", 0o100400).is_ok());
        let e = check_permissions("/k", 0o100640).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidPath);
        assert_eq!(e.message, "permissions on /k are too open");
        assert!(check_permissions("/k", 0o100604).is_err());
    }

    #[cfg(unix)]
    #[test]
    fn load_checks_the_file_on_disk() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("sluice-keyfile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("key");
        std::fs::write(&path, "secretkey123\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = KeyFile::load(&path).unwrap_err();
        assert!(e.message.ends_with("are too open"), "{}", e.message);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(KeyFile::load(&path).unwrap().primary(), "secretkey123");
        let e = KeyFile::load(&dir.join("missing")).unwrap_err();
        assert!(
            e.message.ends_with("missing: No such file or directory"),
            "{}",
            e.message
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn internal_user_authenticates_with_any_key_of_the_file() {
        let server_keys = KeyFile::parse("/k", b"- newkey123\n- oldkey123\n").unwrap();
        let creds = server_keys.internal_credentials().unwrap();
        assert_eq!(creds.scram(ScramMechanism::Sha1).len(), 2);
        for client_text in ["newkey123", "oldkey123"] {
            let client_keys = KeyFile::parse("/c", client_text.as_bytes()).unwrap();
            for m in ScramMechanism::ALL {
                let mut client = client_keys.client_conversation(m).unwrap();
                let first = ClientFirst::parse(&client.client_first()).unwrap();
                assert_eq!(first.user(), "__system");
                let (mut server, s1) =
                    ServerConversation::start(m, first, creds.scram(m), "SERVERNONCE", true)
                        .unwrap();
                let fin = client.client_final(&s1.payload).unwrap();
                let s2 = server.step(&fin).unwrap();
                client.verify_server_final(&s2.payload).unwrap();
            }
        }
        // A wrong keyfile is refused.
        let wrong = KeyFile::parse("/w", b"wrongkey1").unwrap();
        let mut client = wrong.client_conversation(ScramMechanism::Sha256).unwrap();
        let first = ClientFirst::parse(&client.client_first()).unwrap();
        let (mut server, s1) = ServerConversation::start(
            ScramMechanism::Sha256,
            first,
            creds.scram(ScramMechanism::Sha256),
            "SERVERNONCE",
            true,
        )
        .unwrap();
        let fin = client.client_final(&s1.payload).unwrap();
        assert!(server.step(&fin).is_err());
    }

    #[test]
    fn debug_never_shows_keys() {
        let k = KeyFile::parse("/k", b"supersecretkey").unwrap();
        assert_eq!(format!("{k:?}"), "KeyFile(1 keys)");
    }
}
