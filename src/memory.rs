//! The memory budget: one running count of the bytes held by everything a script session owns
//! (script tensors, datasets, compiled models' host and device buffers, evaluation copies,
//! readers' buffers), checked before each allocation and given back when the owner is dropped.
//!
//! A [`Budget`] is shared (cloning it shares the count). A [`Charge`] is a claim of some bytes
//! against it, held by whatever owns the memory and released on drop. Code that allocates for a
//! script asks for the charge first and allocates only once it is granted, so going over the
//! budget is an `Err` of kind `Limit`, never an aborted process.

use crate::err;
use crate::error::{Error, Result};
use std::fmt;
use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A limit in bytes and the bytes charged against it so far.
#[derive(Clone)]
pub struct Budget(Arc<Inner>);

struct Inner {
    limit: u64,
    used: AtomicU64,
}

/// Bytes held against a [`Budget`]; released when dropped.
pub struct Charge {
    budget: Budget,
    bytes: u64,
}

impl Budget {
    /// A budget of `limit` bytes, nothing charged yet.
    pub fn new(limit: u64) -> Budget {
        Budget(Arc::new(Inner { limit, used: AtomicU64::new(0) }))
    }

    /// A budget that refuses nothing (for Rust callers that manage memory themselves).
    pub fn unlimited() -> Budget {
        Budget::new(u64::MAX)
    }

    pub fn limit(&self) -> u64 {
        self.0.limit
    }

    /// Bytes charged now.
    pub fn used(&self) -> u64 {
        self.0.used.load(Ordering::SeqCst)
    }

    /// Claim `bytes` for `what` (named in the error, e.g. "a tensor of shape [2, 3]").
    pub fn charge(&self, bytes: u64, what: impl fmt::Display) -> Result<Charge> {
        let mut c = self.empty();
        c.grow(bytes, what)?;
        Ok(c)
    }

    /// A charge of zero bytes, to [`grow`](Charge::grow) as a reader's buffers grow.
    pub fn empty(&self) -> Charge {
        Charge { budget: self.clone(), bytes: 0 }
    }

    fn take(&self, bytes: u64) -> std::result::Result<(), u64> {
        let limit = self.0.limit;
        let add = |used: u64| used.checked_add(bytes).filter(|&n| n <= limit);
        self.0.used.fetch_update(Ordering::SeqCst, Ordering::SeqCst, add).map(drop)
    }

    fn give_back(&self, bytes: u64) {
        self.0.used.fetch_sub(bytes, Ordering::SeqCst);
    }
}

impl fmt::Debug for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Budget({} of {} bytes used)", self.used(), self.limit())
    }
}

impl Charge {
    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Claim `more` bytes on top of what is held (for `what`, named in the error).
    pub fn grow(&mut self, more: u64, what: impl fmt::Display) -> Result<()> {
        match self.budget.take(more) {
            Ok(()) => {
                self.bytes += more;
                Ok(())
            }
            Err(used) => Err(over_budget(&what.to_string(), more, used, self.budget.limit())),
        }
    }

    /// Hold exactly `bytes`: grow, or give back what is over.
    pub fn resize(&mut self, bytes: u64, what: impl fmt::Display) -> Result<()> {
        if bytes > self.bytes {
            self.grow(bytes - self.bytes, what)
        } else {
            self.budget.give_back(self.bytes - bytes);
            self.bytes = bytes;
            Ok(())
        }
    }

    /// Move `bytes` (at most what is held) into a charge of their own, for a part of what this
    /// charge paid for that goes to another owner.
    pub fn split_off(&mut self, bytes: u64) -> Charge {
        let bytes = bytes.min(self.bytes);
        self.bytes -= bytes;
        Charge { budget: self.budget.clone(), bytes }
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.give_back(self.bytes);
    }
}

impl fmt::Debug for Charge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Charge({} bytes)", self.bytes)
    }
}

fn over_budget(what: &str, bytes: u64, used: u64, limit: u64) -> Error {
    if bytes > limit {
        // Dropping values cannot help: say so rather than suggest it.
        return err!(
            Limit,
            "{what} needs {}, more than the whole {} memory budget",
            human(bytes),
            human(limit)
        );
    }
    err!(
        Limit,
        "{what} needs {} but only {} of the {} memory budget is free; drop values you no longer \
         need (set their variables to `()`) or raise the budget",
        human(bytes),
        human(limit.saturating_sub(used)),
        human(limit)
    )
}

/// `1536` → `1.5 KiB`; exact bytes below 1 KiB.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} bytes");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1023.95 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

/// Bytes the process holds on its heap, as counted by [`CountingAllocator`].
static HEAP: AtomicU64 = AtomicU64::new(0);

/// The system allocator, counting the bytes it holds so that a script's own values (rhai
/// arrays, strings, maps, closures: no [`Budget`] sees them) cannot take the machine's memory.
/// The `rumus` binary installs it (`#[global_allocator]`); the sandbox's `heap_limit` is checked
/// against [`heap_bytes`] at every script operation.
pub struct CountingAllocator;

// SAFETY: every call is passed to the system allocator unchanged; only a counter is updated.
unsafe impl std::alloc::GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: the caller's contract is the system allocator's.
        let p = unsafe { std::alloc::System.alloc(layout) };
        if !p.is_null() {
            HEAP.fetch_add(layout.size() as u64, Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: the caller's contract is the system allocator's.
        let p = unsafe { std::alloc::System.alloc_zeroed(layout) };
        if !p.is_null() {
            HEAP.fetch_add(layout.size() as u64, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { std::alloc::System.dealloc(ptr, layout) };
        HEAP.fetch_sub(layout.size() as u64, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, size: usize) -> *mut u8 {
        // SAFETY: the caller's contract is the system allocator's.
        let p = unsafe { std::alloc::System.realloc(ptr, layout, size) };
        if !p.is_null() {
            HEAP.fetch_add(size as u64, Ordering::Relaxed);
            HEAP.fetch_sub(layout.size() as u64, Ordering::Relaxed);
        }
        p
    }
}

/// Bytes on the process's heap, where [`CountingAllocator`] is installed (else 0).
pub fn heap_bytes() -> u64 {
    HEAP.load(Ordering::Relaxed)
}

/// Whether [`CountingAllocator`] is the process's allocator (it has counted something).
pub fn heap_counted() -> bool {
    heap_bytes() > 0
}

/// The default budget: half of the memory this process may use ([`usable_memory`]; 4 GiB
/// where it cannot be read).
pub fn default_limit() -> u64 {
    usable_memory().map_or(4 << 30, |m| m / 2)
}

/// The memory this process may use: the machine's physical memory, or less where the process
/// is limited to less: its address space or data segment (`ulimit -v`, `ulimit -d`) or its
/// control group's memory limit (a container's). A budget from physical memory alone let a
/// process under `ulimit -v` abort on an allocation the budget would have refused.
pub fn usable_memory() -> Option<u64> {
    [physical_memory(), process_limit(), cgroup_limit()].into_iter().flatten().min()
}

#[cfg(unix)]
fn process_limit() -> Option<u64> {
    let limit = |resource| {
        let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit writes only the struct it is given.
        let ok = unsafe { libc::getrlimit(resource, &mut r) } == 0;
        (ok && r.rlim_cur != libc::RLIM_INFINITY).then_some(r.rlim_cur)
    };
    [limit(libc::RLIMIT_AS), limit(libc::RLIMIT_DATA)].into_iter().flatten().min()
}

#[cfg(not(unix))]
fn process_limit() -> Option<u64> {
    None
}

/// The memory limit of the process's control group (v2 `memory.max`, v1
/// `memory.limit_in_bytes`, as a container sees them at `/sys/fs/cgroup`); `None` when there is
/// none ("max", or v1's near-2^63 "unlimited") or it cannot be read.
fn cgroup_limit() -> Option<u64> {
    ["/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"]
        .into_iter()
        .filter_map(|f| std::fs::read_to_string(f).ok()?.trim().parse::<u64>().ok())
        .filter(|&m| m > 0 && m < 1 << 62)
        .min()
}

#[cfg(unix)]
fn physical_memory() -> Option<u64> {
    // SAFETY: sysconf only reads system configuration.
    let (pages, page) =
        unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    let (pages, page) = (u64::try_from(pages).ok()?, u64::try_from(page).ok()?);
    pages.checked_mul(page).filter(|&m| m > 0)
}

#[cfg(not(unix))]
fn physical_memory() -> Option<u64> {
    None
}

/// Read everything from `r`, growing `charge` before the buffer grows; `name` names the source
/// in errors. A source larger than the budget (a FIFO, `/dev/zero`, a gzip bomb) is refused
/// before it is held.
pub fn read_all(r: impl Read, charge: &mut Charge, name: &str) -> Result<Vec<u8>> {
    read_into(r, Vec::new(), charge, name)
}

/// [`read_all`] of a file, its length when opened charged before a byte is read: a file larger
/// than the budget is refused at once (reading first held up to the whole budget, 8 GiB of a
/// 13 GiB checkpoint, and then blamed the script's values for the shortfall).
pub fn read_file(file: std::fs::File, charge: &mut Charge, name: &str) -> Result<Vec<u8>> {
    let len = file.metadata().map_or(0, |m| m.len());
    let mut bytes = Vec::new();
    let len = usize::try_from(len).unwrap_or(usize::MAX);
    reserve(&mut bytes, len, charge, || format!("reading {name}"))?;
    read_into(file, bytes, charge, name)
}

fn read_into(
    mut r: impl Read,
    mut bytes: Vec<u8>,
    charge: &mut Charge,
    name: &str,
) -> Result<Vec<u8>> {
    let mut chunk = [0u8; 64 << 10];
    loop {
        let n = match r.read(&mut chunk) {
            Ok(0) => return Ok(bytes),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Error::io(name, e)),
        };
        reserve(&mut bytes, n, charge, || format!("reading {name}"))?;
        bytes.extend_from_slice(&chunk[..n]);
    }
}

/// Make room in `v` for `extra` more elements, charging the new capacity first (amortized
/// doubling, like `Vec::push`).
pub fn reserve<T>(
    v: &mut Vec<T>,
    extra: usize,
    charge: &mut Charge,
    what: impl FnOnce() -> String,
) -> Result<()> {
    let need = v.len().saturating_add(extra);
    if need <= v.capacity() {
        return Ok(());
    }
    let cap = need.max(v.capacity().saturating_mul(2)).max(8);
    let size = std::mem::size_of::<T>() as u64;
    let more = (cap - v.capacity()) as u64 * size;
    charge.grow(more, what())?;
    v.reserve_exact(cap - v.len());
    Ok(())
}

/// The library's unit tests run with an allocator that counts each thread's bytes, so that a
/// test can bound what a reader allocates beside what it charges (tests run on threads of
/// their own; the process-wide [`CountingAllocator`] would count the others').
#[cfg(test)]
pub(crate) mod per_thread {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    thread_local! {
        /// Bytes allocated minus bytes freed on this thread.
        static LIVE: Cell<i64> = const { Cell::new(0) };
        /// The most `LIVE` has been since [`peak`] started.
        static PEAK: Cell<i64> = const { Cell::new(0) };
    }

    struct PerThread;

    #[global_allocator]
    static ALLOCATOR: PerThread = PerThread;

    fn count(bytes: i64) {
        // `try_with`: nothing is counted while the thread's locals are torn down.
        let _ = LIVE.try_with(|live| {
            let now = live.get() + bytes;
            live.set(now);
            let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
        });
    }

    // SAFETY: every call is passed to the system allocator unchanged; only counters of the
    // calling thread are updated (const-initialized, without destructors: they never allocate).
    unsafe impl GlobalAlloc for PerThread {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            // SAFETY: the caller's contract is the system allocator's.
            let p = unsafe { System.alloc(layout) };
            if !p.is_null() {
                count(layout.size() as i64);
            }
            p
        }

        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            // SAFETY: the caller's contract is the system allocator's.
            let p = unsafe { System.alloc_zeroed(layout) };
            if !p.is_null() {
                count(layout.size() as i64);
            }
            p
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: the caller's contract is the system allocator's.
            unsafe { System.dealloc(ptr, layout) };
            count(-(layout.size() as i64));
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, size: usize) -> *mut u8 {
            // SAFETY: the caller's contract is the system allocator's.
            let p = unsafe { System.realloc(ptr, layout, size) };
            if !p.is_null() {
                // Both blocks, for a moment, as a realloc that moves holds them.
                count(size as i64);
                count(-(layout.size() as i64));
            }
            p
        }
    }

    /// What `f` returns, and the most bytes this thread held while `f` ran beyond what it
    /// held before.
    pub fn peak<R>(f: impl FnOnce() -> R) -> (R, u64) {
        let start = LIVE.with(Cell::get);
        PEAK.with(|p| p.set(start));
        let r = f();
        let most = PEAK.with(Cell::get);
        (r, u64::try_from(most - start).unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_add_up_and_are_given_back_on_drop() {
        let b = Budget::new(100);
        let a = b.charge(60, "a").unwrap();
        let e = b.charge(50, "a tensor of shape [5, 10]").unwrap_err();
        assert_eq!(e.kind, crate::ErrorKind::Limit);
        assert_eq!(
            e.message,
            "a tensor of shape [5, 10] needs 50 bytes but only 40 bytes of the 100 bytes memory \
             budget is free; drop values you no longer need (set their variables to `()`) or \
             raise the budget"
        );
        drop(a);
        assert_eq!(b.used(), 0);
        let mut c = b.charge(50, "c").unwrap();
        let d = c.split_off(20);
        c.resize(10, "c").unwrap();
        assert_eq!((c.bytes(), d.bytes(), b.used()), (10, 20, 30));
        assert!(c.grow(u64::MAX, "huge").is_err());
        drop((c, d));
        assert_eq!(b.used(), 0);
    }

    #[test]
    fn reading_stops_at_the_budget() {
        let b = Budget::new(1 << 20);
        let mut c = b.empty();
        let e = read_all(std::io::repeat(0), &mut c, "/dev/zero").unwrap_err();
        assert!(e.message.starts_with("reading /dev/zero needs "), "{e}");
        assert!(c.bytes() <= 1 << 20);
        drop(c);
        assert_eq!(b.used(), 0);
        let mut c = b.empty();
        assert_eq!(read_all(&[1u8, 2, 3][..], &mut c, "x").unwrap(), [1, 2, 3]);
        assert!(c.bytes() >= 3);
    }

    #[test]
    fn a_file_larger_than_the_budget_is_refused_before_it_is_read() {
        let path = std::env::temp_dir().join(format!("rumus-big-{}", std::process::id()));
        crate::files::write_atomic(&path, &vec![0; 3 << 20]).unwrap();
        let b = Budget::new(1 << 20);
        let mut c = b.empty();
        let e = read_file(std::fs::File::open(&path).unwrap(), &mut c, "big").unwrap_err();
        assert_eq!(e.message, "reading big needs 3.0 MiB, more than the whole 1.0 MiB memory budget");
        assert_eq!(c.bytes(), 0);
        crate::files::write_atomic(&path, &[0; 5]).unwrap();
        let bytes = read_file(std::fs::File::open(&path).unwrap(), &mut c, "small").unwrap();
        assert!(bytes == [0; 5] && c.bytes() >= 5, "{}", c.bytes());
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(human(512), "512 bytes");
        assert_eq!(human(1536), "1.5 KiB");
        assert_eq!(human(40_000_000_000), "37.3 GiB");
        assert_eq!(human((1 << 20) - 10), "1.0 MiB", "not 1024.0 KiB");
    }

    #[test]
    fn the_default_fits_the_machine() {
        let limit = default_limit();
        assert!(limit >= 1 << 28 && physical_memory().is_none_or(|m| limit <= m), "{limit}");
        assert!(usable_memory().is_none_or(|m| limit == m / 2), "{limit}");
    }
}
