//! The StreamApp spec reference for users, generated from the CRD's schema (whose
//! descriptions are the doc comments of `streamapp_api::crd`): `docs/spec-reference.md`,
//! written by `make crds` and checked for drift by a test, like the CRD itself.

use kube::CustomResourceExt;
use serde_json::Value;
use streamapp_api::crd::StreamApp;

/// Path of the committed reference, relative to the repository root.
pub const REFERENCE_PATH: &str = "docs/spec-reference.md";

/// The reference as Markdown: one table row per field of `spec`, with its type, default,
/// allowed values and description, then the validation rules users meet at `kubectl apply`.
pub fn spec_reference() -> String {
    let crd = serde_json::to_value(StreamApp::crd()).expect("the CRD serialises");
    let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    let mut rows = Vec::new();
    let mut rules = Vec::new();
    walk("spec", spec, &mut rows, &mut rules);
    let mut out = String::from(
        "# StreamApp spec reference\n\n\
         Generated from the CRD (`api/src/crd.rs`, `api/src/config.rs`) by `make crds`; do not edit.\n\
         `kubectl explain streamapp.spec --recursive` shows the same descriptions.\n\n\
         | field | type | default | description |\n|---|---|---|---|\n",
    );
    for (path, ty, default, description) in rows {
        out.push_str(&format!(
            "| `{path}` | {ty} | {default} | {description} |\n"
        ));
    }
    out.push_str("\n## Validation rules\n\nChecked by the API server at `kubectl apply`:\n\n");
    for (path, message) in rules {
        out.push_str(&format!("- `{path}`: {message}\n"));
    }
    out
}

fn walk(
    path: &str,
    schema: &Value,
    rows: &mut Vec<(String, String, String, String)>,
    rules: &mut Vec<(String, String)>,
) {
    for rule in schema["x-kubernetes-validations"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let message = rule["message"]
            .as_str()
            .or(rule["rule"].as_str())
            .unwrap_or_default();
        rules.push((path.to_string(), message.to_string()));
    }
    let Some(props) = schema["properties"].as_object() else {
        return;
    };
    for (name, field) in props {
        let child = format!("{path}.{name}");
        let mut ty = field["type"].as_str().unwrap_or("object").to_string();
        if let Some(values) = field["enum"].as_array() {
            let values: Vec<String> = values
                .iter()
                .filter_map(|v| v.as_str())
                .map(|v| format!("`{v}`"))
                .collect();
            ty = format!("one of {}", values.join(", "));
        }
        if ty == "array" {
            ty = format!(
                "list of {}",
                field["items"]["type"].as_str().unwrap_or("object")
            );
        }
        let default = match &field["default"] {
            Value::Null => String::new(),
            v => format!("`{v}`"),
        };
        let description = field["description"]
            .as_str()
            .unwrap_or_default()
            .replace('\n', " ")
            .replace('|', "\\|");
        rows.push((child.clone(), ty, default, description));
        // Kubernetes' own types (resources, affinity, ...) are documented upstream.
        let is_kubernetes_type = [
            "resources",
            "affinity",
            "tolerations",
            "topologySpreadConstraints",
            "imagePullSecrets",
        ]
        .contains(&name.as_str())
            || child.starts_with("spec.agent.resources");
        if !is_kubernetes_type {
            walk(&child, field, rows, rules);
            if let Some(items) = field.get("items") {
                walk(&format!("{child}[]"), items, rows, rules);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn committed_spec_reference_matches_the_crd() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(REFERENCE_PATH);
        let committed = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!("{REFERENCE_PATH} cannot be read ({e}): generate it with `make crds`")
        });
        assert!(
            committed == spec_reference(),
            "{REFERENCE_PATH} is out of date: regenerate it with `make crds`"
        );
    }

    #[test]
    fn reference_lists_nested_fields_and_rules() {
        let r = spec_reference();
        assert!(r.contains("| `spec.topology.dedupId.source` |"), "{r}");
        assert!(
            r.contains("| `spec.rocksdb.wal.recoveryMode` | one of"),
            "{r}"
        );
        assert!(r.contains("topology.retention must be greater than topology.commitInterval"));
    }
}
