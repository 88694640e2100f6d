//! Code generation: WGSL for every kernel of a plan. Generated kernels are built from
//! [`expr`] (inlined elementwise expressions) and [`wgsl`] (one module per kernel kind); the
//! hand-written templates in `shaders/` serve matmul and LayerNorm.

pub mod expr;
pub mod wgsl;
