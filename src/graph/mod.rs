//! The graph: IR types, the elementwise op table and the scalar its rows are written over,
//! the checked builder, shape inference, verification, reverse-mode autodiff,
//! rematerialization and optimizer updates, all as nodes of one arena.

pub mod autodiff;
pub mod build;
pub mod conv;
pub mod elementwise;
pub mod float;
pub mod init;
pub mod ir;
pub mod optim;
pub mod param_groups;
pub mod remat;
pub mod scalar;
pub mod shape;
pub mod train;
pub mod verify;

pub use conv::{BatchNorm, Conv2d, Window};
pub use ir::{BinaryOp, Graph, Init, Node, NodeId, Op, OpClass, ReduceOp, UnaryOp, Update};
pub use optim::{OptimConfig, Optimizer, ParamGroup};
pub use train::{training_graph, training_graph_with, TrainGraph, TrainOptions};
pub use verify::{check_feed_shapes, check_feeds, verify};
