//! What the binary prints when its configuration cannot be used: what failed, then its cause,
//! each said once, and nothing that blames something else (a listener for a keyfile).

use std::process::Command;

/// Runs `sluice` with `args` and returns its exit status and standard error.
fn run(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .env("RUST_LIB_BACKTRACE", "0")
        .output()
        .expect("the binary runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A scratch directory for this test's files.
fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn a_configuration_error_says_what_failed_and_its_cause_once() {
    let dir = scratch("config-errors");
    let malformed = dir.join("malformed.toml");
    std::fs::write(&malformed, "listen = [\n").unwrap();
    let no_keyfile = dir.join("no-keyfile.toml");
    std::fs::write(
        &no_keyfile,
        "listen = \"127.0.0.1:0\"\nmetrics_listen = \"\"\n[security]\nkey_file = \"/nonexistent/cluster.key\"\n",
    )
    .unwrap();
    let missing = dir.join("missing.toml");
    let cases = [
        (missing.clone(), "No such file or directory", "cannot read"),
        (malformed.clone(), "invalid array", "invalid configuration"),
        (
            no_keyfile.clone(),
            "/nonexistent/cluster.key",
            "cannot start the router",
        ),
    ];
    for (path, cause, what) in cases {
        let (ok, stderr) = run(&["--config", path.to_str().unwrap()]);
        assert!(!ok, "{stderr}");
        assert!(stderr.contains(what), "{stderr}");
        assert_eq!(stderr.matches(cause).count(), 1, "the cause once: {stderr}");
        assert!(!stderr.contains("cannot listen"), "{stderr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
