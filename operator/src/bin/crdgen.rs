//! Prints the StreamApp CustomResourceDefinition as YAML (`make crds` writes it to
//! crds/streamapp.dev_streamapps.yaml).

fn main() {
    print!("{}", streamapp_operator::crd_yaml::crd_yaml());
}
