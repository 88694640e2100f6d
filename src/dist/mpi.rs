//! The [`Communicator`] over MPI (the `mpi` crate, rsmpi; feature `mpi`): MPI is initialized
//! once per process by [`init`] and finalized when its [`Guard`] drops. Collectives go through
//! `MPI_COMM_WORLD` in buckets of at most [`BUCKET`] elements (MPI counts are C ints). MPI's
//! default error handler ends the whole job on a failed collective, so these never return an
//! error of their own.
//!
//! Ranks that all run on one machine share memory through an MPI-3 shared-memory window
//! (`MPI_Win_allocate_shared` over the world, through `mpi::ffi`: rsmpi 0.8 has no one-sided
//! API), which the GPUs import ([`Communicator::node_region`]).

use super::{print_stderr, Communicator, NodeRegion, REGION_ALIGN};
use crate::err;
use crate::error::Result;
use ::mpi::collective::SystemOperation;
use ::mpi::environment::Universe;
use ::mpi::raw::AsRaw;
use ::mpi::topology::{Communicator as _, SimpleCommunicator};
use ::mpi::traits::{CommunicatorCollectives, Root};
use std::sync::Arc;

/// Most elements one collective call carries (256 MiB of f32).
pub const BUCKET: usize = 1 << 26;

/// Finalizes MPI when dropped, after freeing the shared-memory windows ([`WINDOWS`]).
pub struct Guard {
    _universe: Universe,
}

impl Drop for Guard {
    fn drop(&mut self) {
        // Every rank that gets here (a normal end; a failing rank aborts the job instead)
        // allocated the same windows in the same order, so the collective frees match.
        let windows = std::mem::take(&mut *WINDOWS.lock().unwrap_or_else(|e| e.into_inner()));
        for mut w in windows {
            // SAFETY: a window this process allocated and has not freed; its regions' GPU
            // buffers were destroyed with their plans.
            unsafe { ::mpi::ffi::MPI_Win_free(&mut w.0) };
        }
    }
}

/// The shared-memory windows this process allocated, in creation order. They are freed
/// together by [`Guard`]'s drop, just before MPI is finalized, not when their regions drop:
/// `MPI_Win_free` is collective, and regions drop at different moments on different ranks (a
/// rank leaving with an error drops its plans before it aborts the job; a session's plans
/// drop in hash order), where a collective would hang the job instead of ending it. So a
/// window lives as long as the process: a run compiles its training plans once.
static WINDOWS: std::sync::Mutex<Vec<Window>> = std::sync::Mutex::new(Vec::new());

/// MPI's world, with the rank, size and local rank read once at start.
#[derive(Debug)]
struct Mpi {
    rank: usize,
    size: usize,
    local_rank: usize,
    /// How many ranks run on this machine.
    local_size: usize,
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
        local_size: local.size() as usize,
    };
    Ok((Arc::new(comm), Guard { _universe: universe }))
}

/// A shared-memory window's handle (freed only through [`WINDOWS`]).
struct Window(::mpi::ffi::MPI_Win);

// SAFETY: only the thread that initialized MPI uses it (funneled), as every call here.
unsafe impl Send for Window {}

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
    fn barrier(&self) -> Result<()> {
        self.world()?.barrier();
        Ok(())
    }
    fn shares_memory(&self) -> bool {
        self.local_size == self.size
    }
    fn node_region(&self, bytes: usize) -> Result<Option<NodeRegion>> {
        if !self.shares_memory() {
            return Ok(None);
        }
        let world = self.world()?;
        let len = bytes.checked_next_multiple_of(REGION_ALIGN).filter(|&n| n >= bytes);
        let len = len.ok_or_else(|| err!(Limit, "cannot share {bytes} bytes between ranks"))?;
        // Rank 0 allocates the whole window (a page more, for the alignment), the others
        // nothing; each maps rank 0's part. A window's processes map its segment at page
        // boundaries, so the aligned start is the same byte of it on every rank.
        let own = if self.rank == 0 { len + REGION_ALIGN } else { 0 };
        let own = ::mpi::ffi::MPI_Aint::try_from(own)
            .map_err(|_| err!(Limit, "cannot share {bytes} bytes between ranks"))?;
        let mut base: *mut std::ffi::c_void = std::ptr::null_mut();
        let mut win = std::mem::MaybeUninit::<::mpi::ffi::MPI_Win>::uninit();
        // On a copy of the world whose errors return instead of ending the job: a window that
        // cannot be allocated (too little shared memory) is an error the caller falls back
        // from. The copy is freed (collectively) when this function returns, on every rank.
        let comm = world.duplicate();
        // SAFETY: MPI writes the window handle and this rank's base address; every rank calls
        // these collectives in the same order with the same `bytes` (the trait's contract).
        let rc = unsafe {
            ::mpi::ffi::MPI_Comm_set_errhandler(comm.as_raw(), ::mpi::ffi::RSMPI_ERRORS_RETURN);
            ::mpi::ffi::MPI_Win_allocate_shared(
                own,
                1,
                ::mpi::ffi::RSMPI_INFO_NULL,
                comm.as_raw(),
                (&mut base as *mut *mut std::ffi::c_void).cast(),
                win.as_mut_ptr(),
            )
        };
        if rc != 0 {
            return Err(err!(
                Device,
                "cannot share {len} bytes between the ranks (MPI_Win_allocate_shared failed with code {rc})"
            ));
        }
        // SAFETY: initialized by the successful call.
        let win = unsafe { win.assume_init() };
        WINDOWS.lock().unwrap_or_else(|e| e.into_inner()).push(Window(win));
        let (mut size, mut unit) = (0 as ::mpi::ffi::MPI_Aint, 0);
        let mut start: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: queries rank 0's part of the window this rank holds.
        let rc = unsafe {
            ::mpi::ffi::MPI_Win_shared_query(
                win,
                0,
                &mut size,
                &mut unit,
                (&mut start as *mut *mut std::ffi::c_void).cast(),
            )
        };
        let start = start as usize;
        let aligned = start.checked_next_multiple_of(REGION_ALIGN);
        let fits = aligned.is_some_and(|a| a - start + len <= size.max(0) as usize);
        let ptr = aligned.and_then(|a| std::ptr::NonNull::new(a as *mut u8));
        match ptr {
            Some(ptr) if rc == 0 && fits => {
                // SAFETY: `len` bytes at an aligned address inside rank 0's part of the
                // window, mapped until the window is freed (at the end of the process).
                Ok(Some(unsafe { NodeRegion::new(ptr, len, Box::new(())) }))
            }
            _ => Err(err!(
                Device,
                "the shared-memory window of {len} bytes has no aligned start (code {rc})"
            )),
        }
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
