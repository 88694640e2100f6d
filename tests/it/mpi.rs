//! Data-parallel training under `mpirun` (feature `mpi`; OpenMPI's `mpirun` on the `PATH`): two
//! ranks of the built binary train as one process at the doubled batch, and a rank that fails
//! or is killed ends the whole job with an error instead of leaving the other waiting.

use super::dist::{assert_same_losses, losses, TRAIN_SCRIPT};
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a failed job may take to end (the brief's bound; a hang guard, not a timing).
const JOB_END: Duration = Duration::from_secs(30);

/// A script file under `target/` (inside the working directory, so the sandbox lets it run).
fn script(name: &str, text: &str) -> String {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/mpi_tests");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(name), text).unwrap();
    format!("target/mpi_tests/{name}")
}

/// `mpirun -np 2 --oversubscribe` of `program args`, allowed to run as root (CI runs as root).
fn mpirun(program: &str, args: &[&str]) -> Child {
    mpirun_with(&[], program, args)
}

/// [`mpirun`] with more of mpirun's own `options`.
fn mpirun_with(options: &[&str], program: &str, args: &[&str]) -> Child {
    Command::new("mpirun")
        .args(["-np", "2", "--oversubscribe"])
        .args(options)
        .arg(program)
        .args(args)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start mpirun (Debian: openmpi-bin)")
}

/// Wait for `child` at most `limit` (killing it past that, and failing); its exit code,
/// stdout and stderr.
fn finish(mut child: Child, limit: Duration) -> (i32, String, String) {
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > limit {
            child.kill().unwrap();
            let _ = child.wait();
            panic!("the job was still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut out = (String::new(), String::new());
    child.stdout.take().unwrap().read_to_string(&mut out.0).unwrap();
    child.stderr.take().unwrap().read_to_string(&mut out.1).unwrap();
    (status.code().unwrap_or(-1), out.0, out.1)
}

const RUMUS: &str = env!("CARGO_BIN_EXE_rumus");

/// What rank 0 prints, after the losses, when its trainer averaged gradients through the
/// memory the ranks share.
const SHARED: &str = "exchange: host-shared";

/// `TRAIN_SCRIPT` on `device` as one process and as two ranks under `mpirun` (with more of its
/// own `options`): the losses agree within `rel`. The job's output: its losses, and whether it
/// exchanged through shared memory.
fn mpirun_matches_one_process(options: &[&str], device: &str, rel: f64) -> bool {
    let option = format!(r#"device: "{device}""#);
    let mut text = TRAIN_SCRIPT.replace(r#"device: "cpu""#, &option);
    text.push_str(&format!(
        "if m.plan().contains(\"gradients averaged across ranks: host-shared\") {{ print(\"{SHARED}\") }}\n"
    ));
    let f = script(&format!("train_{device}.rms"), &text);
    let single = Command::new(RUMUS)
        .args(["run", &f])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(single.status.success(), "{}", String::from_utf8_lossy(&single.stderr));
    let (code, out, err) =
        finish(mpirun_with(options, RUMUS, &["run", &f]), Duration::from_secs(300));
    assert_eq!(code, 0, "{err}");
    let shared = out.lines().any(|l| l == SHARED);
    let out: String = out.lines().filter(|&l| l != SHARED).map(|l| format!("{l}\n")).collect();
    assert_same_losses(&losses(&out), &losses(&String::from_utf8_lossy(&single.stdout)), rel);
    shared
}

#[test]
fn two_ranks_under_mpirun_train_as_one_process_at_the_doubled_batch() {
    assert!(!mpirun_matches_one_process(&[], "cpu", 1e-6));
}

/// Without OpenMPI's shared-memory one-sided component (`--mca osc ^sm`) no rank can allocate
/// the window: every rank falls back to staging through host vectors, and trains the same.
#[test]
fn gpu_ranks_without_a_shared_window_stage_and_train_as_one_process() {
    let options = ["--mca", "osc", "^sm"];
    assert!(
        !mpirun_matches_one_process(&options, "gpu", 1e-5),
        "the ranks exchanged through shared memory without the component that allocates it"
    );
}

#[test]
fn two_ranks_on_gpus_under_mpirun_train_as_one_process_at_the_doubled_batch() {
    // Each rank opens its own device (here both the one software adapter, which imports host
    // memory) and the ranks average their gradients through an MPI shared-memory window both
    // devices import.
    assert!(
        mpirun_matches_one_process(&[], "gpu", 1e-5),
        "the ranks did not exchange through shared memory"
    );
}

#[test]
fn a_rank_whose_script_fails_ends_the_job_naming_it() {
    a_rank_whose_script_fails_ends_the_job_on("cpu");
}

/// On the GPU the ranks share a memory window for their gradients; the failing rank drops it
/// before it ends the job, which must not wait for the other rank (freeing a window is
/// collective: it used to hang both ranks here).
#[test]
fn a_gpu_rank_whose_script_fails_after_a_step_ends_the_job_naming_it() {
    let Some(_) = crate::common::gpu::or_skip("a_gpu_rank_whose_script_fails_after_a_step") else {
        return;
    };
    a_rank_whose_script_fails_ends_the_job_on("gpu");
}

/// Rank 1 of a job training forever on `device` throws after one step: the job ends with an
/// error that names the rank.
fn a_rank_whose_script_fails_ends_the_job_on(device: &str) {
    let f = script(
        &format!("fails_{device}.rms"),
        &r#"
        model net(x: f32[B, 2]) { return linear(x, 3) as fc }
        let m = net().compile(#{ batch: 2, loss: "cross_entropy", device: "DEVICE" });
        let x = zeros([2, 2]);
        let y = tensor([0, 1], "i32");
        m.train_step(x, y);
        if rank() == 1 { throw "rank one gives up"; }
        loop { m.train_step(x, y); }
        "#
        .replace("DEVICE", device),
    );
    let (code, _, err) = finish(mpirun(RUMUS, &["run", &f]), JOB_END);
    assert_ne!(code, 0, "{err}");
    assert!(err.contains("rank 1: ") && err.contains("rank one gives up"), "{err}");
}

/// Rank 1 of a job training forever on `device` is killed after `after` seconds: the job ends
/// with an error in time.
fn a_killed_rank_ends_the_job_on(device: &str, after: u32) {
    let f = script(
        &format!("forever_{device}.rms"),
        &r#"
        model net(x: f32[B, 2]) { return linear(x, 3) as fc }
        let m = net().compile(#{ batch: 2, loss: "cross_entropy", device: "DEVICE" });
        let x = zeros([2, 2]);
        let y = tensor([0, 1], "i32");
        loop { m.train_step(x, y); }
        "#
        .replace("DEVICE", device),
    );
    // Each rank is a shell running rumus; rank 1's shell kills its rumus after a while.
    let wrapper = format!(
        r#""$0" run "$1" & pid=$!
        if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then sleep {after}; kill -9 $pid; fi
        wait $pid"#
    );
    let (code, _, err) = finish(mpirun("sh", &["-c", &wrapper, RUMUS, &f]), JOB_END);
    assert_ne!(code, 0, "{err}");
}

#[test]
fn a_killed_rank_ends_the_job() {
    a_killed_rank_ends_the_job_on("cpu", 1);
}

#[test]
fn a_killed_gpu_rank_ends_the_job_waiting_in_the_exchange() {
    // The survivor waits for the dead rank's bucket in the shared-memory exchange's barrier.
    a_killed_rank_ends_the_job_on("gpu", 3);
}

#[test]
fn launch_without_mpirun_says_how_to_get_it() {
    let out = Command::new(RUMUS)
        .args(["launch", "-n", "2", "x.rms"])
        .env("PATH", "/nonexistent")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "mpirun is not installed (Debian: apt-get install openmpi-bin); `rumus launch` starts \
         its ranks through it\n"
    );
}

#[test]
fn launch_runs_the_script_on_each_rank() {
    let f = script("hello.rms", "print(`rank ${rank()} of ${world_size()}`);\n");
    let child = Command::new(RUMUS)
        .args(["launch", "-n", "2", &f])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_rmaps_base_oversubscribe", "1")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (code, out, err) = finish(child, Duration::from_secs(120));
    assert_eq!((code, out.as_str()), (0, "rank 0 of 2\n"), "{err}");
}
