//! Data-parallel training without MPI: each rank's share of the batches (as data), and two ranks
//! on two threads of this process, joined by an in-process [`Communicator`], training exactly
//! as one process does at the doubled batch. `tests/it/mpi.rs` runs the same script under
//! `mpirun` (feature `mpi`).

use rumus::data::rank_batches;
use rumus::dist::{Communicator, HostAlloc, NodeRegion};
use rumus::error::Source;
use rumus::script::{Host, HostOptions, ScriptTrainer};
use rumus::Tensor;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// A model trained for 20 steps on the CPU backend at a global batch of 16 (per rank:
/// `16 / world_size()`), printing each step's loss; every rank starts from its own seed, so
/// equal results need the broadcast from rank 0.
pub const TRAIN_SCRIPT: &str = r#"
model net(x: f32[B, 2]) {
    h = relu(linear(x, 16) as fc1)
    return linear(h, 3) as fc2
}
let d = csv("scripts/data/blobs.csv", #{ label_col: 2 });
let b = 16 / world_size();
let m = net().compile(#{
    batch: b, loss: "cross_entropy", optimizer: adam(#{ lr: 0.02 }), device: "cpu",
    seed: 5 + rank(),
});
let step = 0;
for epoch in 0..3 {
    for batch in d.batches(b, epoch) {
        if step < 20 { print(m.train_step(batch.x, batch.y)); }
        step += 1;
    }
}
"#;

/// Losses printed one a line, parsed.
pub fn losses(out: &str) -> Vec<f64> {
    out.lines().map(|l| l.trim().parse().unwrap_or(f64::NAN)).collect()
}

/// Whether every loss of `a` equals `b`'s within `rel` relative (and there are 20 of each).
pub fn assert_same_losses(a: &[f64], b: &[f64], rel: f64) {
    assert_eq!((a.len(), b.len()), (20, 20), "{a:?} vs {b:?}");
    for (step, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= rel * y.abs(), "step {step}: {x} vs {y}\n{a:?}\n{b:?}");
    }
}

#[test]
fn rank_batches_take_their_share_of_each_global_batch() {
    let order: Vec<usize> = (0..10).collect();
    // (size, rank, ranks, keep_last) -> the batches.
    type Case = ((usize, usize, usize, bool), &'static [&'static [usize]]);
    let cases: &[Case] = &[
        ((3, 0, 1, false), &[&[0, 1, 2], &[3, 4, 5], &[6, 7, 8]]),
        ((3, 0, 1, true), &[&[0, 1, 2], &[3, 4, 5], &[6, 7, 8], &[9]]),
        ((2, 0, 2, false), &[&[0, 1], &[4, 5]]),
        ((2, 1, 2, false), &[&[2, 3], &[6, 7]]),
        ((2, 0, 2, true), &[&[0, 1], &[4, 5], &[8]]),
        ((2, 1, 2, true), &[&[2, 3], &[6, 7], &[9]]),
        ((4, 2, 3, false), &[]),
        ((3, 0, 3, true), &[&[0, 1, 2]]),
        ((3, 2, 3, true), &[&[6, 7, 8], &[9]]),
    ];
    for &((size, rank, ranks, keep), want) in cases {
        let got = rank_batches(&order, size, rank, ranks, keep);
        assert_eq!(got, want, "size {size}, rank {rank} of {ranks}, keep_last {keep}");
    }
}

/// Ranks on threads of one process: sums in rank order, so every rank gets the same bits.
/// With `share`, the ranks share memory (one allocation), as MPI ranks on one machine do.
#[derive(Debug)]
struct ThreadComm {
    rank: usize,
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    ranks: usize,
    /// Ranks arrived at the current barrier, and how many barriers have been passed.
    gate: Mutex<(usize, u64)>,
    passed: Condvar,
    slots: Mutex<Vec<Vec<f32>>>,
    share: bool,
    region: Mutex<Option<Arc<HostAlloc>>>,
    /// Whether the ranks take turns between collectives ([`ThreadComm::take_turn`]), and
    /// whether one has the turn now.
    alternate: bool,
    busy: Mutex<bool>,
    free: Condvar,
}

/// How long a rank waits at a barrier for the others before its collective fails: a rank that
/// stopped with an error never arrives, and its peers must fail the test rather than hang it.
const BARRIER_WAIT: Duration = Duration::from_secs(120);

impl ThreadComm {
    fn world(ranks: usize) -> Vec<ThreadComm> {
        ThreadComm::world_sharing(ranks, false, false)
    }

    /// Ranks that share memory where `share`, and that take turns where `alternate`.
    fn world_sharing(ranks: usize, share: bool, alternate: bool) -> Vec<ThreadComm> {
        let shared = Arc::new(Shared {
            ranks,
            gate: Mutex::new((0, 0)),
            passed: Condvar::new(),
            slots: Mutex::new(vec![Vec::new(); ranks]),
            share,
            region: Mutex::new(None),
            alternate,
            busy: Mutex::new(false),
            free: Condvar::new(),
        });
        (0..ranks).map(|rank| ThreadComm { rank, shared: shared.clone() }).collect()
    }

    /// Where the ranks alternate: wait until no other rank runs (at most [`BARRIER_WAIT`]),
    /// then run. wgpu's OpenGL backend shares one context between threads and panics when a
    /// thread waits for it more than a few seconds, which two ranks compiling and running side
    /// by side on a loaded software adapter do; taking turns between collectives, never both
    /// use the device at once.
    fn take_turn(&self) {
        if self.shared.alternate {
            let busy = self.shared.busy.lock().unwrap();
            let (mut busy, _) =
                self.shared.free.wait_timeout_while(busy, BARRIER_WAIT, |b| *b).unwrap();
            *busy = true;
        }
    }

    /// The end of [`ThreadComm::take_turn`]'s turn.
    fn give_turn(&self) {
        if self.shared.alternate {
            *self.shared.busy.lock().unwrap() = false;
            self.shared.free.notify_all();
        }
    }

    /// Wait until every rank has arrived, or fail after [`BARRIER_WAIT`] (giving up the turn
    /// meanwhile, where the ranks alternate).
    fn wait_all(&self) -> rumus::Result<()> {
        self.give_turn();
        let arrived = self.arrive();
        self.take_turn();
        arrived
    }

    /// The barrier itself: wait until every rank has arrived, or fail after [`BARRIER_WAIT`].
    fn arrive(&self) -> rumus::Result<()> {
        let mut gate = self.shared.gate.lock().unwrap();
        let generation = gate.1;
        gate.0 += 1;
        if gate.0 == self.shared.ranks {
            *gate = (0, generation + 1);
            self.shared.passed.notify_all();
            return Ok(());
        }
        let (_gate, wait) = self
            .shared
            .passed
            .wait_timeout_while(gate, BARRIER_WAIT, |g| g.1 == generation)
            .unwrap();
        if wait.timed_out() {
            let why = format!("rank {} waited {BARRIER_WAIT:?} for the other ranks", self.rank);
            return Err(rumus::Error::new(rumus::error::ErrorKind::Device, why));
        }
        Ok(())
    }
}

impl Communicator for ThreadComm {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.shared.ranks
    }
    fn local_rank(&self) -> usize {
        self.rank
    }
    fn all_reduce_mean(&self, data: &mut [f32]) -> rumus::Result<()> {
        self.shared.slots.lock().unwrap()[self.rank] = data.to_vec();
        self.barrier()?;
        {
            let slots = self.shared.slots.lock().unwrap();
            for (i, x) in data.iter_mut().enumerate() {
                let sum = slots.iter().map(|s| s[i]).reduce(|a, b| a + b).unwrap_or(0.0);
                *x = sum / self.shared.ranks as f32;
            }
        }
        self.barrier()?;
        Ok(())
    }
    fn broadcast(&self, data: &mut [f32]) -> rumus::Result<()> {
        if self.rank == 0 {
            self.shared.slots.lock().unwrap()[0] = data.to_vec();
        }
        self.barrier()?;
        data.copy_from_slice(&self.shared.slots.lock().unwrap()[0]);
        self.barrier()?;
        Ok(())
    }
    fn barrier(&self) -> rumus::Result<()> {
        self.wait_all()
    }
    fn shares_memory(&self) -> bool {
        self.shared.share
    }
    fn node_region(&self, bytes: usize) -> rumus::Result<Option<NodeRegion>> {
        if !self.shared.share {
            return Ok(None);
        }
        if self.rank == 0 {
            *self.shared.region.lock().unwrap() = Some(HostAlloc::new(bytes)?);
        }
        self.wait_all()?;
        let region = self.shared.region.lock().unwrap().as_ref().map(|a| a.region());
        self.wait_all()?;
        if self.rank == 0 {
            *self.shared.region.lock().unwrap() = None;
        }
        Ok(region)
    }
    fn abort(&self, message: &str, _: i32) -> ! {
        panic!("rank {} aborted: {message}", self.rank)
    }
}

/// Run `code` as one rank of `comm`: what it printed (an error as `error: ...`) and the
/// parameters of its trainer `m`.
fn run_rank(comm: Arc<dyn Communicator>, code: &str) -> (String, Vec<(String, Tensor)>) {
    let (out, params, _) = run_rank_reporting(comm, code);
    (out, params)
}

/// [`run_rank`] with the plan report of the trainer `m` (which says how gradients were
/// averaged).
fn run_rank_reporting(
    comm: Arc<dyn Communicator>,
    code: &str,
) -> (String, Vec<(String, Tensor)>, String) {
    let mut h = Host::new(HostOptions { comm, device: "cpu".into(), ..HostOptions::default() });
    let out = crate::common::script::capture(&mut h);
    if let Err(e) = h.eval(&Source::new("t.rms", code)) {
        out.lock().unwrap().push_str(&format!("error: {}\n", e.message));
    }
    let m = h.get("m").and_then(|m| m.try_cast::<ScriptTrainer>());
    let params = m.as_ref().map(|m| m.lock().unwrap().parameters().unwrap()).unwrap_or_default();
    let report = m.map(|m| m.lock().unwrap().plan_report()).unwrap_or_default();
    let printed = out.lock().unwrap().clone();
    (printed, params, report)
}

#[test]
fn two_ranks_train_as_one_process_at_the_doubled_batch() {
    let (single, single_params) = run_rank(rumus::dist::single(), TRAIN_SCRIPT);
    let threads: Vec<_> = ThreadComm::world(2)
        .into_iter()
        .map(|c| std::thread::spawn(move || run_rank(Arc::new(c), TRAIN_SCRIPT)))
        .collect();
    let ranks: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert_same_losses(&losses(&ranks[0].0), &losses(&single), 1e-6);
    assert_eq!(ranks[1].0, "", "only rank 0 prints");
    // Every rank applied the same updates to the same (broadcast) parameters.
    assert_eq!(ranks[0].1, ranks[1].1);
    assert_eq!(ranks[0].1.len(), single_params.len());
}

#[test]
fn a_job_of_one_is_rank_zero_of_one() {
    let (out, _) = run_rank(rumus::dist::single(), "print(rank()); print(world_size());");
    assert_eq!(out, "0\n1\n");
    let threads: Vec<_> = ThreadComm::world(2)
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || {
                run_rank(Arc::new(c), "if rank() == 0 { print(`${rank()} of ${world_size()}`) }")
            })
        })
        .collect();
    let outs: Vec<String> = threads.into_iter().map(|t| t.join().unwrap().0).collect();
    assert_eq!(outs, ["0 of 2\n", ""]);
}

/// Two GPU ranks on threads (sharing memory when `share`) train as one process at the doubled
/// batch; the plan reports of both ranks name the exchange that ran.
fn two_gpu_ranks_train_as_one_process(test: &str, share: bool, exchange: &str) {
    let Some((gpu, _turn)) = crate::common::gpu::or_skip(test) else { return };
    // Vulkan drivers import host memory (lavapipe, NVIDIA's, RADV); other backends stage.
    let exchange = match gpu.info.backend {
        wgpu::Backend::Vulkan => exchange,
        _ => "staged",
    };
    let script = TRAIN_SCRIPT.replace(r#"device: "cpu""#, r#"device: "gpu""#);
    let (single, single_params) = run_rank(rumus::dist::single(), &script);
    let alternate = gpu.info.backend == wgpu::Backend::Gl;
    let threads: Vec<_> = ThreadComm::world_sharing(2, share, alternate)
        .into_iter()
        .map(|c| {
            let script = script.clone();
            std::thread::spawn(move || {
                let c = Arc::new(c);
                c.take_turn();
                let ran = run_rank_reporting(c.clone(), &script);
                c.give_turn();
                ran
            })
        })
        .collect();
    let ranks: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let line = format!("gradients averaged across ranks: {exchange}\n");
    for (rank, (_, _, report)) in ranks.iter().enumerate() {
        assert!(report.contains(&line), "rank {rank} did not report {line:?}:\n{report}");
    }
    assert_same_losses(&losses(&ranks[0].0), &losses(&single), 1e-5);
    assert_eq!(ranks[1].0, "", "only rank 0 prints");
    assert_eq!(ranks[0].1, ranks[1].1);
    for ((name, a), (_, b)) in ranks[0].1.iter().zip(&single_params) {
        let (a, b) = (a.as_f32().unwrap(), b.as_f32().unwrap());
        let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        assert!(worst <= 1e-4, "{name}: parameters differ by {worst}");
    }
}

#[test]
fn two_ranks_on_the_gpu_train_as_one_process_at_the_doubled_batch() {
    // Ranks that share no memory: the gradients go through host memory in several buckets (at
    // least four where the values allow), each averaged while the GPU runs the rest of the
    // backward pass.
    let test = "two_ranks_on_the_gpu_train_as_one_process_at_the_doubled_batch";
    two_gpu_ranks_train_as_one_process(test, false, "staged");
}

#[test]
fn two_gpu_ranks_sharing_memory_exchange_through_it() {
    // Ranks that share memory, on a device that imports host memory (lavapipe does): each
    // bucket goes by GPU copies through one region both ranks map, and one kernel averages.
    let test = "two_gpu_ranks_sharing_memory_exchange_through_it";
    two_gpu_ranks_train_as_one_process(test, true, "host-shared");
}
