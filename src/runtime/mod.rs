//! runtime: the wgpu side of rumus. Opens the device ([`device`]), turns codegen's programs
//! into pipelines, bind groups and dispatches ([`launch`]) through a pipeline cache kept on disk ([`pipeline_cache`]), runs plans ([`exec`]), averages a data-parallel step's gradients across ranks ([`exchange`], through host memory
//! the GPUs import where they can: [`host_memory`]) and times the
//! template kernels alone ([`kernel_bench`]). It writes no WGSL and knows no kernel kind.

pub mod backend;
pub mod device;

pub mod exchange;
pub mod exec;
pub mod host_memory;
pub mod kernel_bench;
pub mod launch;
pub mod pipeline_cache;

pub use device::{
    shared_gpu, split_workgroups, test_gpu, test_gpu_at_webgpu_limits, DeviceChoice, Dispatch, Gpu,
    STORAGE,
};
