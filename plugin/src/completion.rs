//! `kubectl streamapp <TAB>`: kubectl (1.26+) completes a plugin's words by running
//! `kubectl_complete-streamapp` with them (the script next to the binary runs
//! `kubectl-streamapp __complete`). The answer is cobra's: one candidate per line, then
//! `:<directive>` (4: no file names).

/// The subcommands, in `--help` order.
pub const COMMANDS: [&str; 8] = [
    "status",
    "inspect",
    "drain",
    "pause",
    "resume",
    "restart",
    "reset",
    "completion",
];

/// What the word being completed needs from the cluster.
#[derive(Debug, PartialEq, Eq)]
pub enum Needs {
    /// The first word: a subcommand.
    Command,
    Nothing,
    /// StreamApp names of the namespace.
    Apps,
    /// StreamApp pods of the namespace.
    Pods,
}

/// The words as kubectl passes them (after `streamapp`; the last one is being typed): the
/// namespace they name (`-n X`, `--namespace X`, `--namespace=X`), what the last word needs,
/// and its prefix.
pub fn parse(words: &[String]) -> (Option<String>, Needs, String) {
    let mut namespace = None;
    let mut positional: Vec<&str> = Vec::new();
    let mut i = 0;
    while i + 1 < words.len() {
        let w = words[i].as_str();
        if (w == "-n" || w == "--namespace") && i + 2 < words.len() {
            namespace = Some(words[i + 1].clone());
            i += 2;
            continue;
        }
        if let Some(ns) = w.strip_prefix("--namespace=") {
            namespace = Some(ns.to_string());
        } else if !w.starts_with('-') {
            positional.push(w);
        }
        i += 1;
    }
    let prefix = words.last().cloned().unwrap_or_default();
    let needs = match positional.as_slice() {
        [] => Needs::Command,
        ["status" | "pause" | "resume" | "restart" | "reset"] => Needs::Apps,
        ["inspect" | "drain"] => Needs::Pods,
        _ => Needs::Nothing,
    };
    (namespace, needs, prefix)
}

/// The answer: the candidates that start with `prefix`, then the directive.
pub fn answer(words: &[String], names: &[String]) -> String {
    let (_, needs, prefix) = parse(words);
    let candidates: Vec<String> = match needs {
        Needs::Command => COMMANDS.iter().map(|c| c.to_string()).collect(),
        Needs::Nothing => Vec::new(),
        Needs::Apps | Needs::Pods => names.to_vec(),
    };
    let mut out: String = candidates
        .into_iter()
        .filter(|c| c.starts_with(&prefix))
        .map(|c| c + "\n")
        .collect();
    out.push_str(":4\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(ws: &[&str]) -> Vec<String> {
        ws.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn the_first_word_is_a_subcommand() {
        assert_eq!(answer(&words(&["pa"]), &[]), "pause\n:4\n");
        assert_eq!(answer(&words(&["re"]), &[]), "resume\nrestart\nreset\n:4\n");
        let all = answer(&words(&["-n", "prod", ""]), &[]);
        assert!(all.starts_with("status\ninspect\n"), "{all:?}");
    }

    #[test]
    fn the_second_word_is_an_app_or_a_pod_of_the_named_namespace() {
        let w = words(&["pause", "-n", "prod", "or"]);
        assert_eq!(parse(&w), (Some("prod".into()), Needs::Apps, "or".into()));
        let names = ["orders".to_string(), "billing".to_string()];
        assert_eq!(answer(&w, &names), "orders\n:4\n");
        assert_eq!(
            parse(&words(&["--namespace=prod", "drain", ""])),
            (Some("prod".into()), Needs::Pods, String::new())
        );
        assert_eq!(parse(&words(&["pause", "orders", ""])).1, Needs::Nothing);
    }
}
