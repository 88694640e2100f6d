//! Weight tying in the model language: a dotted name (`wte.weight`) uses a parameter declared
//! earlier in the model again, as GPT-2's head reuses its token embedding. One parameter, its
//! gradient the sum over both uses (checked against central differences in f64), and a GPT
//! with a tied head that trains on the CPU backend and on the GPU.

use rumus::cpu::{Buf, Executor, RunOptions};
use rumus::dsl::{self, Value};
use rumus::error::Source;
use rumus::graph::NodeId;
use rumus::script::{Host, HostOptions};
use rumus::DType;

const TIED: &str = "model tied(idx: i32[B, T], vocab = 5, d = 3) {
    x = embedding(idx, vocab, d) as wte
    h = gelu_tanh(x * 1.5)
    return h @ transpose(wte.weight, 0, 1)
}";

#[test]
fn a_tied_head_is_one_parameter_whose_gradient_sums_both_uses() {
    let src = Source::new("tied.rms", TIED);
    let module = dsl::load(&src).unwrap_or_else(|e| panic!("{e}"));
    let dims = [("B", Value::Int(2)), ("T", Value::Int(3))];
    let mut g = dsl::lower(&module, "tied", &dims, None).unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<&str> = g.parameters().into_iter().map(|(_, n)| n).collect();
    assert_eq!(names, ["wte.weight"]);
    let w = g.parameters()[0].0;
    let logits = g.output("output").unwrap();
    let labels = g.input("labels", &[2, 3], DType::I32).unwrap();
    let loss = g.cross_entropy(logits, labels, None).unwrap();
    let dw = rumus::graph::autodiff::grad(&mut g, loss, &[w]).unwrap()[0];
    let idx = g.input_named("idx").unwrap();
    let feeds = [(idx, Buf::I(vec![0, 4, 2, 2, 1, 0])), (labels, Buf::I(vec![1, 1, 3, 0, 4, 2]))];
    let opts = RunOptions { training: false, step: 0 };
    let mut exec = Executor::<f64>::new(&g, 7).unwrap();
    let w0 = exec.persistent(w).unwrap().to_vec();
    let value = |exec: &mut Executor<f64>, want: NodeId| match exec.run(&g, &feeds, &[want], opts) {
        Ok(mut v) => match v.remove(0) {
            Buf::F(v) => v,
            Buf::I(_) => panic!("float value"),
        },
        Err(e) => panic!("{e}"),
    };
    let analytic = value(&mut exec, dw);
    let eps = 1e-6;
    for e in 0..w0.len() {
        let mut at = |delta: f64| {
            let mut v = w0.clone();
            v[e] += delta;
            exec.set_persistent(&g, w, v).unwrap();
            value(&mut exec, loss)[0]
        };
        let numeric = (at(eps) - at(-eps)) / (2.0 * eps);
        let a = analytic[e];
        assert!(
            (a - numeric).abs() <= 1e-5 + 1e-3 * numeric.abs(),
            "element {e}: {a} vs {numeric}"
        );
    }
    // Both uses contribute: row 3 of the embedding is never looked up, so its gradient comes
    // from the head alone, and it is not zero.
    assert!(analytic[9..12].iter().any(|&v| v.abs() > 1e-6), "{analytic:?}");
}

const GPT: &str = "model gpt(idx: i32[B, T], vocab = 16, d = 8, heads = 2, layers = 1) {
    x = embedding(idx, vocab, d) as wte + position_embedding(T, T, d) as wpe
    repeat layers as blocks {
        x = x + causal_self_attention(layer_norm(x) as ln1, heads) as attn
        x = x + mlp(layer_norm(x) as ln2, 4 * d) as mlp
    }
    return layer_norm(x) as ln_f @ transpose(wte.weight, 0, 1)
}
let idx = tensor([[1, 2, 3, 4], [5, 6, 7, 8]], \"i32\");
let next = tensor([[2, 3, 4, 5], [6, 7, 8, 9]], \"i32\");
let net = gpt().compile(#{ batch: 2, dims: #{ T: 4 }, seed: 5, optimizer: adam(#{ lr: 0.02 }) });
print(net.params().filter(|n| n.contains(\"wte\") || n.contains(\"head\")));
let first = net.train_step(idx, next);
let last = first;
for i in 0..20 { last = net.train_step(idx, next); }
print(last < first * 0.7);
";

#[test]
fn a_gpt_with_a_tied_head_trains_on_either_device() {
    let (devices, _turn) = crate::common::gpu::devices_or_skip("tied gpt on the gpu");
    for dev in devices {
        let mut h = Host::new(HostOptions { device: dev.into(), ..HostOptions::default() });
        let out = crate::common::script::capture(&mut h);
        let _ = h.eval(&Source::new("gpt.rms", GPT)).unwrap_or_else(|e| panic!("{dev}: {e}"));
        assert_eq!(*out.lock().unwrap(), "[\"wte.weight\"]\ntrue\n", "{dev}");
    }
}

#[test]
fn a_dotted_name_must_be_a_parameter_declared_before_it() {
    const TAIL: &str = "declared before this point; a dotted name refers to a parameter by its full name, as `rumus graph --params` lists it";
    let cases = [
        (
            "model m(x: f32[B, 3]) {\n    y = linear(x, 3) as fc\n    return y @ fc.wieght\n}",
            "m.rms:3:16: no parameter `fc.wieght`",
        ),
        (
            "model m(x: f32[B, 3]) {\n    y = x @ fc.weight\n    return linear(y, 3) as fc\n}",
            "m.rms:2:13: no parameter `fc.weight`",
        ),
    ];
    for (src, expected) in cases {
        let source = Source::new("m.rms", src);
        let module = dsl::load(&source).unwrap();
        let e = dsl::lower(&module, "m", &[], Some(2)).unwrap_err().in_source(&source);
        let first = e.to_string().lines().next().unwrap_or_default().to_string();
        assert_eq!(first, format!("{expected} {TAIL}"));
    }
}
