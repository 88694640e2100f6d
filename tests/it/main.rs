//! rumus's integration tests, one module per area, linked into one test binary (each test
//! binary links the whole library and its dependencies: one link instead of two dozen).
//!
//! Run one area with a filter on its module: `cargo test --test it gpu_plan::`.

/// Counts the heap, as the `rumus` binary does, for `script_sandbox`'s test of
/// `Sandbox::heap_limit` (only a sandbox that sets one checks it).
#[global_allocator]
static ALLOCATOR: rumus::memory::CountingAllocator = rumus::memory::CountingAllocator;

mod common;
#[allow(dead_code)]
#[path = "../../examples/fuzz/harness/mod.rs"]
mod harness;
// The worker-thread example's logic, run by `script_embed` (its `main` is the example's).
#[allow(dead_code)]
#[path = "../../examples/worker.rs"]
mod worker;

mod accumulate;
mod attention_gpt;
mod checkpoint;
mod checkpoint_torch;
mod cnn;
mod codegen_valid;
mod conv;
mod cpu_interp;
mod data;
mod dist;
mod dsl_cli;
mod dsl_conv;
mod dsl_errors;
mod dsl_fuzz;
mod dsl_gpt;
mod fuzz_smoke;
mod gpu_coop;
mod gpu_diff;
mod gpu_kernels;
mod gpu_plan;
mod gpu_vs_cpu;
mod gradcheck;
mod layout;
#[cfg(feature = "mpi")]
mod mpi;
mod param_groups;
mod plan;
mod remat;
mod repl;
mod script_api;
mod script_api_doc;
mod script_checkpoint;
mod script_cli;
mod script_embed;
mod script_evaluate;
mod script_sandbox;
mod script_writes;
mod scripts_run;
mod shape_errors;
mod train_mlp;
mod tying;
mod wgsl_valid;
