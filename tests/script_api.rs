//! The script API, as data: each case is a script and what it prints (or the error it gives).

use rumus::error::Source;
use rumus::script::{Host, HostOptions};
use std::cell::RefCell;
use std::rc::Rc;

/// Run `code` in a fresh session; return its printed lines, then `error: ...` if it failed.
fn run(code: &str) -> String {
    let mut h = Host::new(HostOptions::default());
    let out = Rc::new(RefCell::new(String::new()));
    let o = out.clone();
    h.on_print(move |s| {
        o.borrow_mut().push_str(s);
        o.borrow_mut().push('\n');
    });
    if let Err(e) = h.eval(&Source::new("t.rms", code)) {
        out.borrow_mut().push_str(&format!("error: {}\n", e.message));
    }
    let s = out.borrow().clone();
    s
}

fn check(code: &str, expected: &str) {
    assert_eq!(run(code), expected, "script:\n{code}");
}

#[test]
fn tensors_from_arrays_and_ranges() {
    check(
        "let t = tensor([[1, 2, 3], [4, 5, 6]]); print(t); print(t.shape); print(t.dtype);",
        "tensor f32[2, 3] [[1, 2, 3], [4, 5, 6]]\n[2, 3]\nf32\n",
    );
    check("print(tensor(0..4));", "tensor f32[4] [0, 1, 2, 3]\n");
    check("print(tensor(1..=3));", "tensor f32[3] [1, 2, 3]\n");
    check("print(tensor([1, 2], \"i32\"));", "tensor i32[2] [1, 2]\n");
    check("print(zeros([2]) + 1.5);", "tensor f32[2] [1.5, 1.5]\n");
    check("print(tensor(0..20));", "tensor f32[20] [0, 1, 2, ..., 17, 18, 19]\n");
}

#[test]
fn element_access_and_to_array() {
    check(
        "let t = tensor([[1, 2], [3, 4]]); print(t[[1, 0]]); print(t[1]); t[[0, 1]] = 9; print(t.to_array());",
        "3.0\ntensor f32[2] [3, 4]\n[[1.0, 9.0], [3.0, 4.0]]\n",
    );
    check(
        "let t = tensor([1, 2]); let u = t; u[0] = 5; print(t); print(u);",
        "tensor f32[2] [1, 2]\ntensor f32[2] [5, 2]\n",
    );
    check("let t = tensor([1, 2]); t[2]", "error: index [2] is out of range for shape [2]\n");
}

#[test]
fn arithmetic_broadcasts() {
    check(
        "let a = tensor([[1, 2], [3, 4]]); let b = tensor([10, 20]); print(a + b); print(2 * a - 1); print(a / a);",
        "tensor f32[2, 2] [[11, 22], [13, 24]]\ntensor f32[2, 2] [[1, 3], [5, 7]]\ntensor f32[2, 2] [[1, 1], [1, 1]]\n",
    );
    check("tensor([1, 2, 3]) + tensor([1, 2])", "error: cannot broadcast shapes [3] and [2]\n");
    check(
        "let a = tensor([[1, 5], [7, 2]]); print(a.sum()); print(a.mean()); print(a.argmax()); print(a.max());",
        "15.0\n3.75\ntensor i32[2] [1, 0]\n7.0\n",
    );
    check("print(tensor(0..6).reshape([2, 3]));", "tensor f32[2, 3] [[0, 1, 2], [3, 4, 5]]\n");
}

#[test]
fn malformed_tensors_are_script_errors() {
    check(
        "tensor([[1, 2], [3]])",
        "error: tensor: ragged array: rows of length 2 and 1 at depth 1\n",
    );
    check("tensor([1, \"a\"])", "error: tensor elements must be numbers, got string\n");
    check("zeros([2, -1])", "error: shape: negative dimension -1\n");
    check("tensor([1], \"f64\")", "error: unknown dtype `f64`: expected \"f32\" or \"i32\"\n");
    check("tensor([1, 2]).item()", "error: item: tensor of shape [2] has 2 elements, not one\n");
}

/// Found by the fuzz driver: `throw` with no value (or an empty one) gave an error with an
/// empty message.
#[test]
fn throw_without_a_message_says_so() {
    let expected =
        "error: `throw` without a message: give one, as in `throw \"what went wrong\"`\n";
    check("throw", expected);
    check("throw ();", expected);
    check("throw \"  \";", expected);
    check("throw \"bad input\";", "error: bad input\n");
    check("throw 3;", "error: 3\n");
}

#[test]
fn datasets_from_csv_and_text() {
    check(
        "let d = csv(\"scripts/data/blobs.csv\", #{ label_col: 2 }); print(d.len()); print(d.x.shape); print(d.y.dtype);
         let s = d.split(0.8, 1); print(`${s.train.len()} ${s.test.len()}`);
         let bs = s.train.batches(50, 0); print(bs.len()); print(bs[0].x.shape);
         print(s.train.batches(50, 0, true).len());",
        "150\n[150, 2]\ni32\n120 30\n2\n[50, 2]\n3\n",
    );
    check(
        "let d = text(\"scripts/data/tiny.txt\", #{ seq_len: 8, stride: 100 }); print(d.x.shape); print(d.x[0]); print(d.y[0]);",
        "[5, 8]\ntensor i32[8] [73, 116, 32, 119, 97, 115, 32, 116]\ntensor i32[8] [116, 32, 119, 97, 115, 32, 116, 104]\n",
    );
    check(
        "let d = dataset(tensor([[1], [2], [3]]), tensor([0, 1, 0], \"i32\")); print(d.shuffle(3).len());",
        "3\n",
    );
    check(
        "csv(\"/etc/passwd\")",
        "error: reading `/etc/passwd` is not allowed: scripts read only below the script's folder and the working directory\n",
    );
    check(
        "dataset(zeros([2, 1]), zeros([3]))",
        "error: dataset needs x and y with the same first dimension, got [2, 1] and [3]\n",
    );
}

#[test]
fn sample_draws_from_softmax_of_logits_over_temperature() {
    // Temperature 0 is argmax; the last axis is removed, as by argmax.
    check("print(tensor([0.0, 5.0, 1.0]).sample(0, 1));", "tensor i32[] 1\n");
    // One draw per row; a logit of -inf (here ln 0) is never drawn.
    check("print(tensor([[0, 1], [1, 0]]).ln().sample(1.0, 5));", "tensor i32[2] [1, 0]\n");
    // The same seed gives the same draw.
    check("let p = randn([4, 9], 1); print(p.sample(1.0, 3) == p.sample(1.0, 3));", "true\n");
    // Frequencies follow softmax(logits / temperature): p = 0.8 at temperature 1, and
    // 0.64 / (0.64 + 0.04) = 0.94 at temperature 0.5 (2,000 draws, bounds at about 4 sigma).
    let count = |temperature: &str| -> i64 {
        let code = format!(
            "let p = tensor([0.2, 0.8]).ln(); let n = 0;
             for s in 0..2000 {{ n += p.sample({temperature}, s).item().to_int(); }} print(n);"
        );
        run(&code).trim().parse().unwrap()
    };
    let n = count("1.0");
    assert!((1530..=1670).contains(&n), "{n} of 2000 draws at p = 0.8");
    let n = count("0.5");
    assert!((1840..=1925).contains(&n), "{n} of 2000 draws at p = 0.94");
    check(
        "tensor([1.0]).sample(-1.0, 1)",
        "error: sample: temperature must be a finite number >= 0, got -1\n",
    );
    check(
        "tensor([0.0]).ln().sample(1.0, 1)",
        "error: sample: a row of logits is NaN, infinite or all -inf\n",
    );
    check("tensor(0..0).sample(1.0, 1)", "error: sample: last axis is empty\n");
}
