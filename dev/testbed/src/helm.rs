//! The real `helm`, against the local control plane.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

/// `$STREAMAPP_CACHE/tools/bin/helm` (where dev/install-kube.sh builds it), else `helm` on
/// PATH. Panics with the install command when there is neither: tests never skip.
pub fn program() -> PathBuf {
    let cached = crate::cache_dir().join("tools/bin/helm");
    if cached.is_file() {
        return cached;
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("helm"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "helm is not installed ({} is missing and there is none on PATH): \
                 install it with `make setup` (or dev/install-kube.sh)",
                cached.display()
            )
        })
}

/// Runs helm with the admin kubeconfig.
pub fn helm(args: &[&str]) -> Output {
    let program = program();
    Command::new(&program)
        .arg("--kubeconfig")
        .arg(crate::kube::kubeconfig_path())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {} ({e})", program.display()))
}

/// Runs helm and returns its standard output; panics with its error output when it fails.
pub fn helm_ok(args: &[&str]) -> String {
    let out = helm(args);
    assert!(
        out.status.success(),
        "helm {} failed:\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
