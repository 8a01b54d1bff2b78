//! Prints the StreamApp CustomResourceDefinition as YAML (`make crds` writes it to
//! crds/streamapp.dev_streamapps.yaml), or with `--reference` the users' spec reference in
//! Markdown (docs/spec-reference.md).

fn main() {
    if std::env::args().any(|a| a == "--reference") {
        print!("{}", streamapp_operator::spec_reference::spec_reference());
    } else {
        print!("{}", streamapp_operator::crd_yaml::crd_yaml());
    }
}
