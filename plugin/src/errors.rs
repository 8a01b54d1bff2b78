//! API errors in words a user acts on: which app does not exist where, which verb on which
//! resource is not allowed.

/// The sentence for a failed request `verb` on `resource` (`streamapps`, `pods`, ...) named
/// `name` in `ns`.
pub fn explain(
    err: &kube::Error,
    verb: &str,
    resource: &str,
    ns: &str,
    name: Option<&str>,
) -> String {
    let what = match name {
        Some(n) => format!("{resource}/{n}"),
        None => resource.to_string(),
    };
    match err {
        kube::Error::Api(e) if e.code == 404 && resource == "streamapps" && name.is_some() => {
            format!(
                "no StreamApp {} in namespace {ns} (kubectl streamapp status -A lists them all)",
                name.unwrap_or_default()
            )
        }
        kube::Error::Api(e) if e.code == 404 => format!("no {what} in namespace {ns}"),
        kube::Error::Api(e) if e.code == 403 => format!(
            "not allowed to {verb} {what} in namespace {ns}: ask for RBAC granting '{verb}' on '{resource}' ({})",
            e.message
        ),
        kube::Error::Api(e) if e.code == 401 => {
            format!(
                "the API server did not accept your credentials: {}",
                e.message
            )
        }
        other => format!("could not {verb} {what} in namespace {ns}: {other}"),
    }
}
