//! The convolution layers as the language spells them: `conv2d`, `max_pool2d`, `avg_pool2d`,
//! `batch_norm` (standard-library blocks with `as` names) and `flatten`; their parameters and
//! running statistics by name; and the errors of arguments that do not fit, at the argument
//! or the call.

use rumus::dsl;
use rumus::graph::Op;
use rumus::Source;

fn lower(src: &str) -> rumus::Result<rumus::graph::Graph> {
    let source = Source::new("m.rms", src);
    dsl::load(&source).and_then(|module| {
        let model = module.models().last().map(|m| m.name.name.clone()).unwrap_or_default();
        dsl::lower(&module, &model, &[], Some(2)).map_err(|e| e.in_source(&source))
    })
}

fn render(src: &str) -> String {
    match lower(src) {
        Ok(_) => "ok".to_string(),
        Err(e) => e.to_string(),
    }
}

const CNN: &str = "model cnn(x: f32[B, 1, 8, 8]) {
    h = relu(batch_norm(conv2d(x, 8, 3, padding = 1) as conv1) as bn1)
    h = max_pool2d(h, 2)
    h = conv2d(h, 6, 3, stride = [1, 1], padding = [1, 1], groups = 2) as conv2
    h = avg_pool2d(h, 2, stride = 1)
    return linear(flatten(h), 10) as fc
}
";

#[test]
fn a_cnn_lowers_with_named_parameters_and_running_statistics() {
    let g = lower(CNN).unwrap();
    let persistent: Vec<String> = g
        .nodes()
        .filter_map(|(id, n)| match &n.op {
            Op::Parameter { name, .. } => Some(format!("param {name}{:?}", g.shape(id))),
            Op::State { name, .. } => Some(format!("state {name}{:?}", g.shape(id))),
            _ => None,
        })
        .collect();
    assert_eq!(
        persistent,
        [
            "param conv1.weight[8, 1, 3, 3]",
            "param conv1.bias[8]",
            "param bn1.weight[8]",
            "param bn1.bias[8]",
            "state bn1.running_mean[8]",
            "state bn1.running_var[8]",
            "param conv2.weight[6, 4, 3, 3]",
            "param conv2.bias[6]",
            "param fc.weight[54, 10]",
            "param fc.bias[10]",
        ]
    );
    let out = g.output("fc").unwrap();
    assert_eq!(g.shape(out), [2, 10]);
    assert_eq!(g.updates.len(), 2, "the running statistics' updates");
}

/// Arguments that do not fit: each message names the argument, at the argument where the
/// value is wrong and at the call where the shapes are.
#[test]
fn arguments_that_do_not_fit_are_errors() {
    let m = |body: &str| format!("model m(x: f32[2, 3, 6, 6]) {{\n    return {body}\n}}\n");
    let table = [
        ("conv2d(x, 4, 3, stride = 0)", "m.rms:2:12: conv2d: `stride` must be between 1 and 2147483648, got 0"),
        ("conv2d(x, 4, 3, padding = [1, -1])", "m.rms:2:12: conv2d: `padding` must be between 0 and 2147483648, got -1"),
        ("conv2d(x, 4, 3, dilation = [1, 2, 3])", "m.rms:2:12: in `conv2d`: argument `dilation` of `conv2d` must be an integer or a list of two, got a list"),
        ("conv2d(x, 4, 7)", "m.rms:2:12: conv2d: `kernel` 7 with `dilation` 1 is larger than the padded input 6x6 (input 6x6, `padding` 0)"),
        ("conv2d(x, 4, 3, groups = 2)", "m.rms:2:12: in `conv2d`: `C / groups` is `3 / 2`, not a whole number"),
        ("conv2d(x, 3, 3, groups = 0)", "m.rms:2:12: in `conv2d`: division by zero"),
        ("conv2d(x, 4, 3, groups = 3)", "m.rms:2:12: conv2d: `groups` 3 must divide the input channels (3) and the output channels (4)"),
        ("conv2d(x, 3, 3, groups = 4)", "m.rms:2:12: in `conv2d`: `C / groups` is `3 / 4`, not a whole number"),
        ("ops.conv2d(x, param w[4, 3, 3, 3] = zeros, groups = 0)", "m.rms:2:64: conv2d: `groups` must be at least 1, got 0"),
        ("max_pool2d(x, 2, padding = 2)", "m.rms:2:12: max_pool2d: `padding` 2 must be at most half of `kernel` 2"),
        ("avg_pool2d(x, 7)", "m.rms:2:12: avg_pool2d: `kernel` 7 with `dilation` 1 is larger than the padded input 6x6 (input 6x6, `padding` 0)"),
        ("max_pool2d(x, [2, 0])", "m.rms:2:12: max_pool2d: `kernel` must be between 1 and 2147483648, got 0"),
        ("ops.max_pool2d(reshape(x, [6, 36]), 2, 2)", "m.rms:2:12: max_pool2d: input `x` must be f32 [N, C, H, W], got f32[6, 36]"),
        ("flatten(x, 4)", "m.rms:2:23: flatten: axis 4 is out of range for a tensor of rank 4"),
        ("batch_norm(x, momentum = 2)", "m.rms:2:12: batch_norm: `momentum` must be in [0, 1], got 2"),
        ("batch_norm(x, eps = 0)", "m.rms:2:12: batch_norm: `eps` must be a finite number of at least 1.1754944e-38 (the smallest normal f32: a GPU may flush a smaller one to 0), got 0"),
    ];
    let mut failures = Vec::new();
    for (body, want) in table {
        let got = render(&m(body));
        let first = got.lines().next().unwrap_or("").to_string();
        if first != want {
            failures.push(format!("{body}\n  got:  {first}\n  want: {want}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
