//! The `rumus` command: the command line lives in the library ([`rumus::cli`]); this runs it on
//! a thread with room for scripts' recursion and exits with its code.

/// Counts the heap, so that a script's own values stop at the session's memory budget
/// (`Sandbox::heap_limit`) instead of taking the machine's memory.
#[global_allocator]
static ALLOCATOR: rumus::memory::CountingAllocator = rumus::memory::CountingAllocator;

fn main() {
    // Scripts recurse (rhai evaluates, drops, prints and compares values by recursion): give
    // them room beyond the limits they get. Half the heap limit, at least 256 MiB: a value
    // nested past what the nesting check sees needs a heap four times the stack it would
    // overflow (`rumus::script::nesting`), so the heap limit stops it first. Reserved, not
    // committed; where the system refuses the reservation, 256 MiB.
    let half_heap = usize::try_from(rumus::memory::default_limit() / 2).unwrap_or(usize::MAX);
    let spawn = |stack: usize| {
        std::thread::Builder::new().stack_size(stack).spawn(|| {
            let args = rumus::cli::text_args(std::env::args_os().skip(1));
            rumus::cli::exit_code(args.and_then(rumus::cli::cli))
        })
    };
    let code = spawn(half_heap.clamp(256 << 20, 64 << 30))
        .or_else(|_| spawn(256 << 20))
        .map(|t| t.join().unwrap_or(1))
        .unwrap_or(1);
    std::process::exit(code);
}
