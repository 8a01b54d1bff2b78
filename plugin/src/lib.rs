//! `kubectl streamapp`: the state of StreamApps as a tree, and the operations the operator
//! offers, as a kubectl plugin (a binary named `kubectl-streamapp` on PATH).
//!
//! Decisions are pure and tested without a cluster: [`render`] turns StreamApps into the text
//! `status` prints, [`actions`] says what each operating command changes and what to watch
//! next, [`errors`] turns API errors into sentences. [`cli`] is the command line; [`commands`]
//! talks to the API server.

pub mod actions;
pub mod cli;
pub mod commands;
pub mod completion;
pub mod dead_letters;
pub mod errors;
pub mod lookup;
pub mod render;
