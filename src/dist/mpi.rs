//! The [`Communicator`] over MPI (the `mpi` crate, rsmpi; feature `mpi`): MPI is initialized
//! once per process by [`init`] and finalized when its [`Guard`] drops. Collectives go through
//! `MPI_COMM_WORLD` in buckets of at most [`BUCKET`] elements (MPI counts are C ints). MPI's
//! default error handler ends the whole job on a failed collective, so these never return an
//! error of their own.

use super::{print_stderr, Communicator};
use crate::err;
use crate::error::Result;
use ::mpi::collective::SystemOperation;
use ::mpi::environment::Universe;
use ::mpi::topology::{Communicator as _, SimpleCommunicator};
use ::mpi::traits::{CommunicatorCollectives, Root};
use std::sync::Arc;

/// Most elements one collective call carries (256 MiB of f32).
pub const BUCKET: usize = 1 << 26;

/// Finalizes MPI when dropped.
pub struct Guard {
    _universe: Universe,
}

/// MPI's world, with the rank, size and local rank read once at start.
#[derive(Debug)]
struct Mpi {
    rank: usize,
    size: usize,
    local_rank: usize,
}

/// Initialize MPI (funneled: only the thread that calls this calls MPI).
pub fn init() -> Result<(Arc<dyn Communicator>, Guard)> {
    let (universe, _) = ::mpi::initialize_with_threading(::mpi::Threading::Funneled)
        .ok_or_else(|| err!(Invariant, "mpi was initialized twice in one process"))?;
    let world = universe.world();
    let local = world.split_shared(world.rank());
    let comm = Mpi {
        rank: world.rank() as usize,
        size: world.size() as usize,
        local_rank: local.rank() as usize,
    };
    Ok((Arc::new(comm), Guard { _universe: universe }))
}

impl Mpi {
    /// The world communicator, or an error once MPI is finalized.
    fn world(&self) -> Result<SimpleCommunicator> {
        if ::mpi::is_finalized() {
            return Err(err!(Invariant, "mpi was used after the job ended"));
        }
        Ok(SimpleCommunicator::world())
    }
}

impl Communicator for Mpi {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.size
    }
    fn local_rank(&self) -> usize {
        self.local_rank
    }
    fn all_reduce_mean(&self, data: &mut [f32]) -> Result<()> {
        let world = self.world()?;
        let n = self.size as f32;
        let mut send = Vec::with_capacity(data.len().min(BUCKET));
        for bucket in data.chunks_mut(BUCKET) {
            send.clear();
            send.extend_from_slice(bucket);
            world.all_reduce_into(&send[..], bucket, SystemOperation::sum());
            bucket.iter_mut().for_each(|x| *x /= n);
        }
        Ok(())
    }
    fn all_reduce_mean_into(&self, send: &[f32], recv: &mut [f32]) -> Result<()> {
        let world = self.world()?;
        let n = self.size as f32;
        for (send, recv) in send.chunks(BUCKET).zip(recv.chunks_mut(BUCKET)) {
            world.all_reduce_into(send, recv, SystemOperation::sum());
            recv.iter_mut().for_each(|x| *x /= n);
        }
        Ok(())
    }
    fn broadcast(&self, data: &mut [f32]) -> Result<()> {
        let world = self.world()?;
        let root = world.process_at_rank(0);
        for bucket in data.chunks_mut(BUCKET) {
            root.broadcast_into(bucket);
        }
        Ok(())
    }
    fn abort(&self, message: &str, code: i32) -> ! {
        print_stderr(message);
        match self.world() {
            Ok(world) => world.abort(code),
            Err(_) => std::process::exit(code),
        }
    }
}
