//! The CPU backend: a deliberately boring reference interpreter of the graph IR.
//!
//! It is the oracle every other backend is tested against (GPU kernels are compared to it, and
//! f64 gradient checks run through it), and the fallback device when no GPU adapter exists. It
//! owns:
//!
//! - the forward of every op, one function per op family: [`interp`] for elementwise ops (each
//!   row's value from the op table, `graph::elementwise`, run in [`Float`]: f32 or f64),
//!   reduction and shape ops, [`nn`] for softmax, layer norm, embedding, cross-entropy and
//!   dropout, each gradient-helper op next to the op it differentiates; [`attention`] for causal
//!   attention and its gradients;
//! - batched matrix multiplication on the `gemm` crate, with a plain-loop reference
//!   ([`mod@matmul`]);
//! - the [`Executor`], which holds parameters and state between steps and runs a graph.
//!
//! Invariant: results are deterministic. The same graph, inputs and options give bit-identical
//! outputs on every run and for every thread count: every sum runs in an order fixed by the
//! shapes (and, for matrix products, the processor's vector kernels), and threads only ever
//! split independent outputs.

pub mod attention;
pub mod backend;
pub mod conv;
pub mod exec;
pub mod interp;
pub mod matmul;
pub mod nn;

pub use crate::backend::RunOptions;
pub use crate::graph::float::Float;
pub use crate::rng::dropout_keep;
pub use backend::CpuBackend;
pub use exec::{Executor, HostStep};
pub use matmul::{bench_matmul, matmul, matmul_reference, LONG_RUN_S};

use crate::tensor::DType;

/// The elements of one value, row-major: floats for f32 values, `i32` for indices and labels.
#[derive(Clone, Debug, PartialEq)]
pub enum Buf<T> {
    /// Elements of an f32 value, computed in `T`.
    F(Vec<T>),
    /// Elements of an i32 value.
    I(Vec<i32>),
}

impl<T> Buf<T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Buf::F(v) => v.len(),
            Buf::I(v) => v.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The graph dtype these elements belong to.
    pub fn dtype(&self) -> DType {
        match self {
            Buf::F(_) => DType::F32,
            Buf::I(_) => DType::I32,
        }
    }

    /// The float elements, if this is a float buffer.
    pub fn as_f(&self) -> Option<&[T]> {
        match self {
            Buf::F(v) => Some(v),
            Buf::I(_) => None,
        }
    }

    /// The integer elements, if this is an i32 buffer.
    pub fn as_i(&self) -> Option<&[i32]> {
        match self {
            Buf::I(v) => Some(v),
            Buf::F(_) => None,
        }
    }
}
