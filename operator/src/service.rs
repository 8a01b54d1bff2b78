//! The headless Service `<name>`: gives each pod a stable DNS name
//! (`<name>-<ordinal>.<name>.<namespace>.svc`), which the StatefulSet requires.

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use streamapp_api::crd::StreamApp;

use crate::owned;
use crate::processor_config::HTTP_PORT;

/// The headless Service of the StatefulSet, with the processors' HTTP port (metrics).
pub fn desired_service(app: &StreamApp) -> Service {
    Service {
        metadata: owned::metadata(app, owned::workload_name(app)),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            selector: Some(owned::selector_labels(app)),
            // Pods restoring their stores are not Ready yet, but their metrics and DNS names
            // should already resolve (restore progress is worth scraping).
            publish_not_ready_addresses: Some(true),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: i32::from(HTTP_PORT),
                target_port: Some(IntOrString::String("http".into())),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::app;

    #[test]
    fn service_is_headless_and_selects_the_apps_pods() {
        let svc = desired_service(&app());
        assert_eq!(svc.metadata.name.as_deref(), Some("orders"));
        let spec = svc.spec.unwrap();
        assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
        assert_eq!(spec.selector.unwrap()["streamapp.dev/app"], "orders");
        assert_eq!(spec.ports.unwrap()[0].port, 8080);
    }
}
