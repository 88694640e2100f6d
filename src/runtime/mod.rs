//! runtime: the wgpu side of rumus. Opens the device ([`device`]), owns the dedicated kernels
//! ([`kernels`]: matmul, layer norm forward and backward) and their benchmarks.
//!
//! WGSL templates live in `shaders/` and are compiled into the binary with `include_str!`; each
//! starts with `alias scalar = f32;` and marks the parts generated code fills as `{{NAME}}`.
//! [`kernels::Template::fill`] substitutes them.

pub mod backend;
pub mod device;

pub mod exec;
pub mod kernels;

pub use device::{
    shared_gpu, split_workgroups, test_gpu, test_gpu_at_webgpu_limits, DeviceChoice, Dispatch, Gpu,
    STORAGE,
};
