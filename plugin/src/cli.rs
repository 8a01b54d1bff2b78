//! The command line: `kubectl streamapp`'s commands, arguments and help.

use clap::{Parser, Subcommand, ValueEnum};

const EXAMPLES: &str = "\
Examples:
  kubectl streamapp status                        # the apps of the current namespace
  kubectl streamapp status orders -n prod --watch # redraw as the status changes
  kubectl streamapp status -A -o json
  kubectl streamapp inspect orders-0 -n prod      # the processor's view of its state volume
  kubectl streamapp lookup orders cmd-1234 -n prod # was it processed, when, from where
  kubectl streamapp dead-letters orders --since 1h --reason invalid-json -n prod
  kubectl streamapp drain orders-1 -n prod        # hand its partitions over cleanly
  kubectl streamapp pause orders -n prod
  kubectl streamapp resume orders -n prod
  kubectl streamapp restart orders -n prod
  kubectl streamapp reset orders -n prod --to-earliest --yes";

#[derive(Parser)]
#[command(
    name = "kubectl-streamapp",
    bin_name = "kubectl streamapp",
    version,
    about = "Shows and operates the state of StreamApps",
    after_help = EXAMPLES
)]
pub struct Cli {
    /// Namespace (default: the current context's).
    #[arg(short, long, global = true)]
    pub namespace: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Output {
    Text,
    Json,
    Yaml,
}

#[derive(Subcommand)]
pub enum Command {
    /// The app, its conditions, its pods and their tasks (partition, state, offsets, restore
    /// progress, checkpoint, WAL, quarantines).
    Status {
        /// One app; all of the namespace when left out.
        name: Option<String>,
        /// Every namespace.
        #[arg(short = 'A', long)]
        all_namespaces: bool,
        #[arg(short, long, value_enum, default_value = "text")]
        output: Output,
        /// Redraw whenever the status changes (Ctrl-C to stop).
        #[arg(short, long)]
        watch: bool,
    },
    /// Runs `streamapp-processor inspect` in the pod's processor container (kubectl exec):
    /// tasks, stored offsets, checkpoints, WAL files, quarantines.
    Inspect { pod: String },
    /// Was an id processed? Asks the app's running pods what their stores hold about each id
    /// (first seen, expiry, the first occurrence's input record), through the API server's
    /// pod proxy (RBAC: `get` on `pods/proxy`).
    Lookup {
        /// The StreamApp.
        name: String,
        /// The dedup ids (at most 100).
        #[arg(required = true)]
        ids: Vec<String>,
        #[arg(short, long, value_enum, default_value = "text")]
        output: Output,
    },
    /// The latest dead letters: reason, source record, size and first bytes, read by one of the
    /// app's pods (read_committed, no consumer group) through the API server's pod proxy
    /// (RBAC: `get` on `pods/proxy`).
    DeadLetters {
        /// The StreamApp.
        name: String,
        /// Only those written in this last stretch of time (e.g. 30m, 1h, 7d).
        #[arg(long)]
        since: Option<String>,
        /// Only this reason (missing-dedup-id, invalid-json, value-too-large,
        /// timestamp-too-far-ahead, ...).
        #[arg(long)]
        reason: Option<String>,
        /// The latest this many (at most 1000).
        #[arg(long, default_value_t = streamapp_api::dead_letters::DEFAULT_LIMIT)]
        limit: usize,
        #[arg(short, long, value_enum, default_value = "text")]
        output: Output,
    },
    /// Deletes the pod with its grace period: the kubelet runs the preStop drain (finish the
    /// transaction, flush, checkpoint) and the StatefulSet starts it again.
    Drain { pod: String },
    /// The operator stops changing the app (annotation streamapp.dev/paused).
    Pause { name: String },
    /// Undoes pause.
    Resume { name: String },
    /// Rolls the pods one at a time without a spec change (annotation streamapp.dev/restart).
    Restart { name: String },
    /// Application reset: stop the pods, move the input offsets, delete the state, start again
    /// (annotation streamapp.dev/reset).
    Reset {
        name: String,
        #[arg(long, group = "to")]
        to_earliest: bool,
        #[arg(long, group = "to")]
        to_latest: bool,
        /// An RFC 3339 time, e.g. 2026-12-01T09:00:00Z.
        #[arg(long, group = "to")]
        to_datetime: Option<String>,
        /// Go ahead without asking (a reset deletes the app's state).
        #[arg(long)]
        yes: bool,
    },
    /// Prints a shell completion script for the `kubectl-streamapp` command itself, e.g.
    /// `kubectl-streamapp completion bash > /etc/bash_completion.d/kubectl-streamapp`.
    /// `kubectl streamapp <TAB>` completes through the `kubectl_complete-streamapp` script
    /// shipped next to the binary (kubectl 1.26+).
    Completion { shell: clap_complete::Shell },
    /// What kubectl's plugin completion asks (see completion.rs).
    #[command(name = "__complete", hide = true)]
    Complete {
        #[arg(allow_hyphen_values = true, trailing_var_arg = true)]
        words: Vec<String>,
    },
}
