//! rumus inside a Rust application: define a model in the model language, compile it from a
//! script, register a host function the script calls, train from Rust on `&[f32]` batches, and
//! query the trained model.
//!
//! Run with `cargo run --example embed`.

use rumus::script::HostOptions;
use rumus::{Engine, Tensor};

fn main() -> Result<(), rumus::Error> {
    let mut engine =
        Engine::with_options(HostOptions { device: "cpu".into(), ..HostOptions::default() });
    // A host function scripts can call.
    engine.script_engine().register_fn("host_batch_size", || 4_i64);
    engine.run(
        r#"
        model classifier(x: f32[B, 2], hidden = 16) {
            h = relu(linear(x, hidden) as fc1)
            return linear(h, 2) as fc2
        }
        let net = classifier(#{ hidden: 16 }).compile(#{
            batch: host_batch_size(),
            optimizer: adam(#{ lr: 0.05 }),
            seed: 3,
        });
        "#,
    )?;
    let net = engine.compiled("net")?;

    // XOR, fed from Rust.
    let x = [0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0];
    let y = Tensor::i32(&[4], vec![0, 1, 1, 0])?;
    let mut loss = 0.0;
    for _ in 0..300 {
        loss = net.train_step(&x, &[4, 2], &y)?;
    }
    println!("loss after {} steps: {loss:.4}", net.trainer()?.step());

    // Query one point at a time: any batch size works for prediction.
    for point in [[0.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 1.0]] {
        let logits = net.predict(&point, &[1, 2])?;
        let v = logits.to_f32_vec();
        let class = if v[1] > v[0] { 1 } else { 0 };
        println!("xor({}, {}) = {class}", point[0], point[1]);
    }
    Ok(())
}
