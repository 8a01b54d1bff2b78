//! The end-to-end tests, in one binary: the operator installed by Helm, the example
//! StreamApp applied with kubectl, on the real node.

mod fencing;
mod operations;
mod plugin;
mod real_node;
