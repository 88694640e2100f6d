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
    /// Print `message` to stderr and end every rank of the job with exit code `code`.
    fn abort(&self, message: &str, code: i32) -> !;
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
    /// feature `mpi` and a launcher (`mpirun`) started it, else a job of one.
    pub fn init() -> Result<World> {
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

/// Whether an MPI launcher started this process (it sets the world size in the environment:
/// OpenMPI's `OMPI_COMM_WORLD_SIZE`, MPICH's and Slurm's `PMI_SIZE`).
pub fn launched() -> bool {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"].iter().any(|v| std::env::var_os(v).is_some())
}

/// Whether this binary can join an MPI job (built with the feature `mpi`).
pub const MPI_BUILT: bool = cfg!(feature = "mpi");

/// Write a line to stderr; if even that fails there is nowhere left to say so.
fn print_stderr(message: &str) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{message}").and_then(|()| err.flush());
}
