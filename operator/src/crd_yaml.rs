//! The StreamApp CustomResourceDefinition as YAML: what `crdgen` prints and what is committed
//! as `crds/streamapp.dev_streamapps.yaml` (a test fails when the two differ).

use kube::CustomResourceExt;
use streamapp_api::crd::StreamApp;

/// Path of the committed CRD, relative to the repository root.
pub const CRD_PATH: &str = "crds/streamapp.dev_streamapps.yaml";
/// The command that regenerates it.
pub const REGENERATE: &str = "make crds";

/// The CRD, generated from the Rust types in `streamapp_api::crd`.
pub fn crd_yaml() -> String {
    let yaml = serde_yaml::to_string(&StreamApp::crd()).expect("the CRD serialises to YAML");
    format!(
        "# Generated from api/src/crd.rs by `{REGENERATE}` (cargo run -p streamapp-operator --bin crdgen).\n\
         # Do not edit: change the Rust types and regenerate.\n{yaml}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn committed_crd_matches_the_rust_types() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(CRD_PATH);
        let committed = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!("{CRD_PATH} cannot be read ({e}): generate it with `{REGENERATE}`")
        });
        assert!(
            committed == crd_yaml(),
            "{CRD_PATH} is out of date with api/src/crd.rs: regenerate it with `{REGENERATE}` and commit the result"
        );
    }
}
