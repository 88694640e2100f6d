//! The graph: IR types, the checked builder, shape inference, verification, reverse-mode
//! autodiff and optimizer updates, all as nodes of one arena.

pub mod build;
pub mod init;
pub mod ir;
pub mod shape;
pub mod verify;

pub use ir::{BinaryOp, Graph, Init, Node, NodeId, Op, ReduceOp, UnaryOp, Update};
pub use verify::verify;
