//! Data-parallel training's one seam with the outside world: the [`Communicator`] trait (rank,
//! world size, local rank, the mean of an f32 slice across ranks, a broadcast from rank 0, and
//! ending every rank with a message), a single-process implementation ([`Single`], the default)
//! and, behind the cargo feature `mpi`, one over MPI (`mpi.rs`). Nothing else in the crate names
//! MPI: the session averages gradients and broadcasts parameters through this trait, the script
//! API reads the rank from it, and the command line starts and ends it through [`World`].
//!
//! Every collective must be called by every rank in the same order with the same lengths: a
//! rank that trains one step more than the others waits for them forever. The callers keep to
//! that by running the same script on every rank ([`crate::session`] calls the collectives at
//! compile, load and every training step, never in evaluation).

#[cfg(feature = "mpi")]
mod mpi;

use crate::error::Result;
use std::fmt::Debug;
use std::io::Write;
use std::sync::Arc;

/// The processes of one data-parallel job, as training sees them.
pub trait Communicator: Debug + Send + Sync {
    /// This process's number, `0..world_size()`.
    fn rank(&self) -> usize;
    /// How many processes the job has.
    fn world_size(&self) -> usize;
    /// This process's number among those on the same machine (which GPU it takes).
    fn local_rank(&self) -> usize;
    /// Replace `data` by its element-wise mean over every rank. Every rank passes the same
    /// length; every rank gets the same bits.
    fn all_reduce_mean(&self, data: &mut [f32]) -> Result<()>;
    /// Write into `recv` the element-wise mean over every rank of `send` (the same length).
    /// The default copies and averages in place; a communicator may read `send` directly.
    fn all_reduce_mean_into(&self, send: &[f32], recv: &mut [f32]) -> Result<()> {
        recv.copy_from_slice(send);
        self.all_reduce_mean(recv)
    }
    /// Replace `data` on every rank by rank 0's. Every rank passes the same length.
    fn broadcast(&self, data: &mut [f32]) -> Result<()>;
    /// Return once every rank has called it (a failed or dead rank ends the job, as in every
    /// collective). The default averages one number.
    fn barrier(&self) -> Result<()> {
        self.all_reduce_mean(&mut [0.0])
    }
    /// Whether [`Communicator::node_region`] can give memory every rank maps (all ranks on one
    /// machine, a communicator that can share memory). The same answer on every rank.
    fn shares_memory(&self) -> bool {
        false
    }
    /// At least `bytes` of host memory (contents unspecified) that every rank maps,
    /// starting at a multiple of [`REGION_ALIGN`] on every rank; `None` where
    /// [`Communicator::shares_memory`] says no. Collective: every rank asks for the same size.
    fn node_region(&self, _bytes: usize) -> Result<Option<NodeRegion>> {
        Ok(None)
    }
    /// Print `message` to stderr and end every rank of the job with exit code `code`.
    fn abort(&self, message: &str, code: i32) -> !;
}

/// The alignment of a [`NodeRegion`]'s start and size: a page, which is also what GPUs ask of
/// host memory they import (`minImportedHostPointerAlignment`: 4096 on NVIDIA's and Mesa's
/// Vulkan drivers).
pub const REGION_ALIGN: usize = 4096;

/// Host memory that every rank of a job on one machine maps (at its own address): an MPI-3
/// shared-memory window, or for ranks that are threads of one process a [`HostAlloc`]. GPUs
/// import it, so their copies move data between ranks without the host copying a byte.
pub struct NodeRegion {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
    /// What keeps the memory mapped; dropped last.
    _owner: Box<dyn std::any::Any + Send + Sync>,
}

// SAFETY: the region is plain memory; who writes which bytes when is the users' protocol
// (`runtime/exchange.rs`), and the owner is `Send + Sync`.
unsafe impl Send for NodeRegion {}
unsafe impl Sync for NodeRegion {}

impl NodeRegion {
    /// The region of `len` bytes at `ptr`, kept mapped by `owner`.
    ///
    /// # Safety
    /// `ptr` is valid for reads and writes of `len` bytes for as long as `owner` lives, and is
    /// a multiple of [`REGION_ALIGN`], as is `len`.
    pub unsafe fn new(
        ptr: std::ptr::NonNull<u8>,
        len: usize,
        owner: Box<dyn std::any::Any + Send + Sync>,
    ) -> NodeRegion {
        NodeRegion { ptr, len, _owner: owner }
    }
    /// The first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    /// The size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the region has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Debug for NodeRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NodeRegion({} bytes at {:p})", self.len, self.ptr)
    }
}

/// Zeroed host memory aligned to [`REGION_ALIGN`], for ranks that are threads of one process
/// (each takes a [`HostAlloc::region`] of the one allocation).
#[derive(Debug)]
pub struct HostAlloc {
    ptr: std::ptr::NonNull<u8>,
    layout: std::alloc::Layout,
}

// SAFETY: as for `NodeRegion`.
unsafe impl Send for HostAlloc {}
unsafe impl Sync for HostAlloc {}

impl HostAlloc {
    /// `bytes` rounded up to a multiple of [`REGION_ALIGN`] (at least one), zeroed.
    pub fn new(bytes: usize) -> Result<Arc<HostAlloc>> {
        let size = bytes.max(1).checked_next_multiple_of(REGION_ALIGN);
        let layout = size.and_then(|s| std::alloc::Layout::from_size_align(s, REGION_ALIGN).ok());
        let layout =
            layout.ok_or_else(|| crate::err!(Limit, "cannot share {bytes} bytes between ranks"))?;
        // SAFETY: the layout's size is not zero.
        let ptr = std::ptr::NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) }).ok_or_else(
            || crate::err!(Limit, "out of host memory sharing {bytes} bytes between ranks"),
        )?;
        Ok(Arc::new(HostAlloc { ptr, layout }))
    }

    /// The allocation as a region (kept alive by the region).
    pub fn region(self: &Arc<HostAlloc>) -> NodeRegion {
        // SAFETY: the allocation is aligned and sized by `new` and lives as long as the clone.
        unsafe { NodeRegion::new(self.ptr, self.layout.size(), Box::new(self.clone())) }
    }
}

impl Drop for HostAlloc {
    fn drop(&mut self) {
        // SAFETY: allocated by `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// One process on its own: rank 0 of 1. The collectives leave their data as it is.
#[derive(Clone, Copy, Debug, Default)]
pub struct Single;

impl Communicator for Single {
    fn rank(&self) -> usize {
        0
    }
    fn world_size(&self) -> usize {
        1
    }
    fn local_rank(&self) -> usize {
        0
    }
    fn all_reduce_mean(&self, _: &mut [f32]) -> Result<()> {
        Ok(())
    }
    fn broadcast(&self, _: &mut [f32]) -> Result<()> {
        Ok(())
    }
    fn abort(&self, message: &str, code: i32) -> ! {
        print_stderr(message);
        std::process::exit(code)
    }
}

/// The single-process communicator, shared.
pub fn single() -> Arc<dyn Communicator> {
    Arc::new(Single)
}

/// The job this process belongs to, for as long as a command runs: the communicator, and
/// (under MPI) what finalizes MPI when it is dropped. Make one per process, at the start of a
/// command, and keep it until the command's end.
pub struct World {
    comm: Arc<dyn Communicator>,
    #[cfg(feature = "mpi")]
    _mpi: Option<mpi::Guard>,
}

impl World {
    /// Join the job this process was started in: the MPI job when the binary was built with the
    /// feature `mpi` and a launcher (`mpirun`) started it, else a job of one. A binary without
    /// the feature started as one of several ranks is an error: each rank would train alone.
    pub fn init() -> Result<World> {
        #[cfg(not(feature = "mpi"))]
        if let Some(n) = launched_size().filter(|&n| n > 1) {
            return Err(crate::err!(
                Usage,
                "started as one of {n} ranks, but this rumus was built without the `mpi` feature, so each rank would train alone; build it with `cargo build --release --features mpi`"
            ));
        }
        #[cfg(feature = "mpi")]
        if launched() {
            let (comm, guard) = mpi::init()?;
            return Ok(World { comm, _mpi: Some(guard) });
        }
        Ok(World {
            comm: single(),
            #[cfg(feature = "mpi")]
            _mpi: None,
        })
    }

    /// The communicator (cloned into what trains).
    pub fn comm(&self) -> &Arc<dyn Communicator> {
        &self.comm
    }
}

/// The variables in which MPI launchers announce the world size: OpenMPI's
/// `OMPI_COMM_WORLD_SIZE`, MPICH's and Slurm's `PMI_SIZE`.
const LAUNCHER_SIZE: [&str; 2] = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"];

/// Whether an MPI launcher started this process (it sets the world size in the environment:
/// OpenMPI's `OMPI_COMM_WORLD_SIZE`, MPICH's and Slurm's `PMI_SIZE`).
pub fn launched() -> bool {
    LAUNCHER_SIZE.iter().any(|v| std::env::var_os(v).is_some())
}

/// The number of ranks a launcher announced, where it is a number.
#[cfg(not(feature = "mpi"))]
fn launched_size() -> Option<u64> {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.trim().parse().ok())
}

/// Whether this binary can join an MPI job (built with the feature `mpi`).
pub const MPI_BUILT: bool = cfg!(feature = "mpi");

/// Write a line to stderr; if even that fails there is nowhere left to say so.
fn print_stderr(message: &str) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{message}").and_then(|()| err.flush());
}
