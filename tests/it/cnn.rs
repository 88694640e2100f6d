//! Convolutional models through the script API: batch norm's running statistics drive
//! evaluation (`predict`, `evaluate`) and travel in checkpoints like parameters.
//! (`scripts/digits_cnn.rms`'s accuracy is a command in BENCHMARKS.md, not a test: 20 epochs
//! are too long for a debug build.)

use rumus::Engine;

const BN: &str = r#"
model bn(x: f32[B, 2]) {
    return batch_norm(x, momentum = 1.0) as bn
}
let x = tensor([[1.0, 10.0], [3.0, 30.0]]);
fn make() { bn().compile(#{ batch: 2, loss: "mse", optimizer: sgd(#{ lr: 0.0 }), device: DEVICE }) }
"#;

fn dir() -> std::path::PathBuf {
    let d = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/cnn");
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn floats(v: rumus::script::rhai::Dynamic) -> Vec<f64> {
    v.into_array().unwrap().into_iter().map(|x| x.as_float().unwrap()).collect()
}

/// Before training the running statistics are (0, 1); one training step at momentum 1 makes
/// them the batch's (mean [2, 20], unbiased variance [2, 200]); evaluation normalizes a single
/// example with them (batch statistics of one example would give 0), and a checkpoint carries
/// them to a fresh model.
#[test]
fn evaluation_uses_the_running_statistics() {
    running_statistics_on("cpu");
}

/// The same on the GPU: the step's updates write the running statistics there, and the
/// evaluation plan reads them through `training_select`.
#[test]
fn evaluation_uses_the_running_statistics_on_the_gpu() {
    let Some((_gpu, _turn)) = crate::common::gpu::or_skip("running_statistics_on_the_gpu") else {
        return;
    };
    running_statistics_on("gpu");
}

fn running_statistics_on(device: &str) {
    let mut e = Engine::new();
    e.run(&BN.replace("DEVICE", &format!("\"{device}\""))).unwrap();
    let path = dir().join(format!("bn_{device}.safetensors"));
    let p = path.display();
    let one = "tensor([[4.0, 40.0]])";
    let before =
        floats(e.eval(&format!("let n = make(); n.predict({one}).to_array()[0]")).unwrap());
    let want = [4.0 / (1.0f64 + 1e-5).sqrt(), 40.0 / (1.0f64 + 1e-5).sqrt()];
    for (g, w) in before.iter().zip(want) {
        assert!((g - w).abs() < 1e-4, "{before:?}");
    }
    let after = floats(
        e.eval(&format!("n.train_step(x, x); n.save(\"{p}\"); n.predict({one}).to_array()[0]"))
            .unwrap(),
    );
    let want = [2.0 / (2.0f64 + 1e-5).sqrt(), 20.0 / (200.0f64 + 1e-5).sqrt()];
    for (g, w) in after.iter().zip(want) {
        assert!((g - w).abs() < 1e-4, "{after:?}");
    }
    let loaded = floats(
        e.eval(&format!("let m = make(); m.load(\"{p}\"); m.predict({one}).to_array()[0]"))
            .unwrap(),
    );
    assert_eq!(loaded, after);
    let state = e.eval(&format!("m.evaluate({one}, {one}).loss")).unwrap().as_float().unwrap();
    let mse = after.iter().zip([4.0, 40.0]).map(|(a, b)| (a - b) * (a - b)).sum::<f64>() / 2.0;
    assert!((state - mse).abs() < 1e-3 * mse, "{state} vs {mse}");
}

/// A checkpoint without a model's running statistics does not load strictly: they are part of
/// the model, as its parameters are (the optimizer's state may be absent, and is here).
#[test]
fn a_checkpoint_without_running_statistics_is_refused() {
    let mut e = Engine::new();
    e.run(&BN.replace("DEVICE", "\"cpu\"")).unwrap();
    let full = dir().join("bn_full.safetensors");
    let part = dir().join("bn_part.safetensors");
    e.run(&format!("make().save(\"{}\");", full.display())).unwrap();
    let mut meta = std::collections::BTreeMap::new();
    meta.insert("format".to_string(), "rumus".to_string());
    let mut held = rumus::memory::Budget::unlimited().empty();
    let ckpt = rumus::checkpoint::load(&full, &mut held).unwrap();
    let kept: Vec<(&str, &rumus::Tensor)> = ckpt
        .tensors
        .iter()
        .filter(|(n, _)| !n.starts_with("bn.running") && !n.starts_with("optim."))
        .map(|(n, t)| (n.as_str(), t))
        .collect();
    rumus::checkpoint::save(&part, &kept, &meta).unwrap();
    let err = e.run(&format!("make().load(\"{}\");", part.display())).unwrap_err();
    assert!(
        err.message.contains("checkpoint does not match the model: missing `bn.running_mean`"),
        "{}",
        err.message
    );
}
