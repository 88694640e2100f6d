//! rumus on a worker thread, with only `std`: the main thread sets up an `Engine` (a model, its
//! data, a print sink) and moves it to a worker thread, which owns it from then on and answers
//! jobs that arrive over a channel: train N steps, evaluate, predict. The main thread prints the
//! replies as they come. A web server or a worker pool holds an engine the same way: an
//! `Engine` is `Send`, so is the print sink it carries.
//!
//! Run with `cargo run --example worker`.

use rumus::script::rhai::Map;
use rumus::script::HostOptions;
use rumus::{Engine, Error, ErrorKind, Tensor};
use std::fmt;
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread;

/// The model, its data and its training settings, run once on the main thread.
const SETUP: &str = r#"
    model classifier(x: f32[B, 2], hidden = 16) {
        h = relu(linear(x, hidden) as fc1)
        return linear(h, 2) as fc2
    }
    let net = classifier(#{ hidden: 16 }).compile(#{
        batch: 4, optimizer: adam(#{ lr: 0.05 }), seed: 3, device: "cpu",
    });
    let xor_x = tensor([[0.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 1.0]]);
    let xor_y = tensor([0, 1, 1, 0], "i32");
    print(`classifier compiled on ${net.device}`);
"#;

/// XOR's four points, row-major, as the host feeds them.
const XOR_X: [f32; 8] = [0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0];
const XOR_Y: [i32; 4] = [0, 1, 1, 0];

/// What the main thread asks of the worker.
#[derive(Clone, Debug)]
pub enum Job {
    /// Train this many steps on XOR, fed from Rust.
    Train(usize),
    /// The mean loss and the accuracy on XOR, from the script's `net.evaluate`.
    Evaluate,
    /// The predicted class of one point.
    Predict([f32; 2]),
}

/// What the worker sends back: one reply a job, and a line for each script `print`.
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    /// A line a script printed.
    Printed(String),
    /// The step count after training, and the last step's loss.
    Trained { step: u64, loss: f32 },
    /// The mean loss and the accuracy.
    Evaluated { loss: f64, accuracy: f64 },
    /// The class the model gives `point`.
    Predicted { point: [f32; 2], class: usize },
    /// The job failed: the error.
    Failed(String),
}

impl fmt::Display for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reply::Printed(s) => write!(f, "script: {s}"),
            Reply::Trained { step, loss } => write!(f, "trained to step {step}, loss {loss:.4}"),
            Reply::Evaluated { loss, accuracy } => {
                write!(f, "evaluated: loss {loss:.4}, accuracy {accuracy:.2}")
            }
            Reply::Predicted { point, class } => {
                write!(f, "xor({}, {}) = {class}", point[0], point[1])
            }
            Reply::Failed(e) => write!(f, "failed: {e}"),
        }
    }
}

/// Set up an engine here, move it to a worker thread, send it `jobs`, and hand each reply to
/// `on_reply` as it arrives. Returns once the worker has answered every job and ended.
pub fn run(jobs: Vec<Job>, mut on_reply: impl FnMut(Reply)) -> Result<(), Error> {
    let (reply_tx, reply_rx) = mpsc::channel();
    let mut engine =
        Engine::with_options(HostOptions { device: "cpu".into(), ..HostOptions::default() });
    let printed = reply_tx.clone();
    engine.on_print(move |s| {
        let _ = printed.send(Reply::Printed(s.to_string()));
    });
    engine.run(SETUP)?;

    let (job_tx, job_rx) = mpsc::channel();
    // The engine (with its print sink) moves to the worker, which owns it from now on.
    let worker = thread::spawn(move || serve(engine, job_rx, reply_tx));
    for job in jobs {
        job_tx.send(job).map_err(|_| Error::new(ErrorKind::Io, "the worker has stopped"))?;
    }
    drop(job_tx); // no more jobs: the worker ends after the last one
                  // The channel closes when the worker has ended and dropped the engine (and its sink).
    for reply in reply_rx {
        on_reply(reply);
    }
    worker.join().map_err(|_| Error::new(ErrorKind::Io, "the worker thread panicked"))
}

/// The worker: answer each job until the job channel closes.
fn serve(mut engine: Engine, jobs: Receiver<Job>, replies: Sender<Reply>) {
    for job in jobs {
        let reply = answer(&mut engine, job).unwrap_or_else(|e| Reply::Failed(e.to_string()));
        if replies.send(reply).is_err() {
            return; // nobody is listening any more
        }
    }
}

fn answer(engine: &mut Engine, job: Job) -> Result<Reply, Error> {
    let net = engine.compiled("net")?;
    match job {
        Job::Train(steps) => {
            let y = Tensor::i32(&[4], XOR_Y.to_vec())?;
            let mut loss = f32::NAN;
            for _ in 0..steps {
                loss = net.train_step(&XOR_X, &[4, 2], &y)?;
            }
            let step = net.trainer()?.step();
            Ok(Reply::Trained { step, loss })
        }
        Job::Evaluate => {
            let scores = engine.eval("net.evaluate(xor_x, xor_y)")?;
            let number = |key: &str| {
                let m = scores.read_lock::<Map>();
                m.and_then(|m| m.get(key)?.as_float().ok()).ok_or_else(|| {
                    Error::new(ErrorKind::InvalidArgument, format!("no `{key}` in the scores"))
                })
            };
            Ok(Reply::Evaluated { loss: number("loss")?, accuracy: number("accuracy")? })
        }
        Job::Predict(point) => {
            let logits = net.predict(&point, &[1, 2])?.to_f32_vec();
            let class = if logits[1] > logits[0] { 1 } else { 0 };
            Ok(Reply::Predicted { point, class })
        }
    }
}

/// Train in two rounds, evaluating after each, then predict the four points.
pub fn xor_jobs() -> Vec<Job> {
    let mut jobs = vec![Job::Train(100), Job::Evaluate, Job::Train(200), Job::Evaluate];
    jobs.extend([[0.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 1.0]].map(Job::Predict));
    jobs
}

fn main() -> Result<(), Error> {
    run(xor_jobs(), |reply| println!("{reply}"))
}
