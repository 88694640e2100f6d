//! The `rumus` command: the command line lives in the library ([`rumus::cli`]); this runs it on
//! a thread with room for scripts' recursion and exits with its code.

/// Counts the heap, so that a script's own values stop at the session's memory budget
/// (`Sandbox::heap_limit`) instead of taking the machine's memory.
#[global_allocator]
static ALLOCATOR: rumus::memory::CountingAllocator = rumus::memory::CountingAllocator;

fn main() {
    // Scripts recurse (rhai evaluates by recursion); give them room beyond the limits they get.
    let code = std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(|| rumus::cli::exit_code(rumus::cli::cli(std::env::args().skip(1).collect())))
        .map(|t| t.join().unwrap_or(1))
        .unwrap_or(1);
    std::process::exit(code);
}
