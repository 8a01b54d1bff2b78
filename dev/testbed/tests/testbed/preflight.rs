//! The test bed's scripts refuse to start what this machine cannot run, saying what is missing,
//! instead of hanging or failing somewhere later.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Command;

fn script(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(name)
}

#[test]
fn without_root_the_network_namespace_and_the_node_refuse_to_start_and_say_why() {
    let cache = tempfile::tempdir().unwrap();
    std::fs::set_permissions(cache.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    for name in ["net.sh", "node.sh"] {
        // As nobody: what a user without root would see.
        let out = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(script(name))
            .arg("start")
            .env("STREAMAPP_CACHE", cache.path())
            .env("STREAMAPP_RUN", cache.path().join("run"))
            .output()
            .expect("running setpriv");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "dev/{name} start succeeded without root"
        );
        assert!(stderr.contains("needs root"), "dev/{name}: {stderr}");
    }
}
