//! WGSL traced from the op table: [`Wgsl`], a symbolic [`Scalar`] whose operations record an
//! expression instead of computing a number. Evaluating a row's generic value on it
//! (`UnaryOp::eval`, `BinaryOp::eval`) gives that row's WGSL, so the kernels compute the formula
//! the CPU interpreter computes, and this module owns every spelling: `exp(..)`, `inverseSqrt`,
//! NaN-propagating `max_`, the overflow-safe `tanh_`, `select(..)`, f32 literals.
//!
//! A trace is an arena of expression nodes; a [`Wgsl`] value is a constant or a handle into it,
//! so it is `Copy` like a number and row code reads like arithmetic. Rendering counts each
//! node's uses: one used more than once (a shared operand, `t` in `1 - t * t`) is bound to a
//! `let` once rather than written out again, so expressions grow with the formula, never
//! exponentially, and every kernel reads as one statement a line. Constant subexpressions fold
//! here, in f64 as WGSL folds its abstract-float constants, so the WGSL compiler never meets a
//! const-expression outside a function's domain (`log(-0.5)` fails shader creation). The composite functions of `Scalar`
//! (`sigmoid`, `gelu`, ...) become WGSL functions of [`math_wgsl`], traced from their one
//! definition, and the kernels call them by name.

use super::expr::f32_lit;
use crate::graph::scalar::Scalar;
use crate::graph::{BinaryOp, UnaryOp};
use std::cell::RefCell;
use std::ops::{Add, Div, Mul, Neg, Sub};
use std::sync::OnceLock;

/// The expression nodes of one trace, and the composite functions it called.
#[derive(Debug, Default)]
pub struct Trace {
    nodes: RefCell<Vec<Node>>,
    /// Each composite called: its name and its body's node over the parameter `x` (`None`
    /// while the body is being traced).
    functions: RefCell<Vec<(&'static str, Option<usize>)>>,
}

/// A value of a trace: a constant, or an expression node of the trace.
#[derive(Clone, Copy, Debug)]
pub enum Wgsl<'t> {
    /// A constant (folded in f64, written as an f32 literal).
    Lit(f64),
    /// Node `.1` of trace `.0`.
    Expr(&'t Trace, usize),
}

/// One expression node: what it computes, and the nodes it reads.
#[derive(Clone, Debug)]
struct Node {
    kind: Kind,
    args: Vec<usize>,
}

/// What a node computes.
#[derive(Clone, Debug)]
enum Kind {
    /// WGSL written elsewhere: an operand, a function's parameter.
    Leaf(String),
    Lit(f64),
    Neg,
    /// `+`, `-`, `*` or `/`.
    Arith(&'static str),
    /// An f32 function.
    Call(&'static str),
    /// A bool comparison, `>` or `==`.
    Compare(&'static str),
    /// A bool function.
    Test(&'static str),
    /// `select(otherwise, then, condition)` of the arguments (condition, then, otherwise).
    Select,
}

/// An operand of a traced op.
#[derive(Clone, Debug)]
pub enum Operand {
    /// A constant, folded with the constants it meets.
    Constant(f32),
    /// A WGSL expression computed elsewhere.
    Wgsl(String),
}

impl Trace {
    /// The trace's value of `operand`.
    pub fn operand(&self, operand: &Operand) -> Wgsl<'_> {
        match operand {
            Operand::Constant(v) => Wgsl::Lit(*v as f64),
            Operand::Wgsl(e) => self.leaf(e),
        }
    }

    /// The WGSL expression `wgsl`, computed elsewhere.
    fn leaf(&self, wgsl: &str) -> Wgsl<'_> {
        let id = self.push(Kind::Leaf(wgsl.to_string()), Vec::new());
        Wgsl::Expr(self, id)
    }

    /// The f32 WGSL expression of `value`; `bind` is called once for each subexpression used
    /// more than once, with its WGSL, and returns the name of the `let` it bound it to.
    pub fn render(&self, value: Wgsl<'_>, bind: &mut dyn FnMut(&str) -> String) -> String {
        match value {
            Wgsl::Lit(v) => lit(v),
            Wgsl::Expr(_, id) => {
                let nodes = self.nodes.borrow();
                let mut r = Render::new(&nodes, bind);
                r.count(id);
                r.value(id)
            }
        }
    }

    /// The WGSL functions of the composites called in this trace, each traced from its
    /// definition in `Scalar`.
    pub fn functions(&self) -> String {
        let mut out = String::new();
        for &(name, body) in self.functions.borrow().iter() {
            let Some(body) = body else { continue };
            out.push_str(&self.function(name, Wgsl::Expr(self, body)));
        }
        out
    }

    /// `fn {name}(x: f32) -> f32` returning `value`, an expression of this trace over the
    /// leaf `x`, each subexpression used more than once bound to a `let`.
    pub fn function(&self, name: &str, value: Wgsl<'_>) -> String {
        let mut lets = String::new();
        let mut n = 0;
        let result = self.render(value, &mut |e| {
            n += 1;
            lets.push_str(&format!("    let v{n} = {e};\n"));
            format!("v{n}")
        });
        format!("fn {name}(x: f32) -> f32 {{\n{lets}    return {result};\n}}\n")
    }

    fn push(&self, kind: Kind, args: Vec<usize>) -> usize {
        let mut nodes = self.nodes.borrow_mut();
        nodes.push(Node { kind, args });
        nodes.len() - 1
    }

    /// The node of `v` in this trace (a constant gets one).
    fn node_of(&self, v: Wgsl<'_>) -> usize {
        match v {
            Wgsl::Lit(x) => self.push(Kind::Lit(x), Vec::new()),
            Wgsl::Expr(_, id) => id,
        }
    }
}

impl<'t> Wgsl<'t> {
    /// `kind` of `args`, or `fold` of their values when all are constants.
    fn apply(args: &[Wgsl<'t>], kind: Kind, fold: impl FnOnce(&[f64]) -> f64) -> Wgsl<'t> {
        let trace = args.iter().find_map(|a| match a {
            Wgsl::Expr(t, _) => Some(*t),
            Wgsl::Lit(_) => None,
        });
        match trace {
            None => {
                let values: Vec<f64> = args.iter().map(|a| a.lit().unwrap_or(f64::NAN)).collect();
                Wgsl::Lit(fold(&values))
            }
            Some(t) => {
                let ids = args.iter().map(|&a| t.node_of(a)).collect();
                Wgsl::Expr(t, t.push(kind, ids))
            }
        }
    }

    fn lit(self) -> Option<f64> {
        match self {
            Wgsl::Lit(v) => Some(v),
            Wgsl::Expr(..) => None,
        }
    }

    /// The f32 WGSL function `name` of `self`.
    fn call(self, name: &'static str, fold: fn(f64) -> f64) -> Self {
        Wgsl::apply(&[self], Kind::Call(name), |v| fold(v[0]))
    }

    /// The f32 WGSL function `name` of `self` and `other`.
    fn call2(self, name: &'static str, other: Self, fold: fn(f64, f64) -> f64) -> Self {
        Wgsl::apply(&[self, other], Kind::Call(name), |v| fold(v[0], v[1]))
    }

    /// `self op other`, as WGSL writes it.
    fn arith(self, op: &'static str, other: Self, fold: fn(f64, f64) -> f64) -> Self {
        Wgsl::apply(&[self, other], Kind::Arith(op), |v| fold(v[0], v[1]))
    }
}

/// The four arithmetic operators, written as in Rust.
macro_rules! arith {
    ($($tr:ident $method:ident $op:tt),*) => {$(
        impl<'t> $tr for Wgsl<'t> {
            type Output = Self;
            fn $method(self, other: Self) -> Self {
                self.arith(stringify!($op), other, |a, b| a $op b)
            }
        }
    )*};
}

arith!(Add add +, Sub sub -, Mul mul *, Div div /);

impl<'t> Neg for Wgsl<'t> {
    type Output = Self;
    fn neg(self) -> Self {
        Wgsl::apply(&[self], Kind::Neg, |v| -v[0])
    }
}

impl<'t> Scalar for Wgsl<'t> {
    fn from_f64(x: f64) -> Self {
        Wgsl::Lit(x)
    }
    fn exp(self) -> Self {
        self.call("exp", f64::exp)
    }
    fn ln(self) -> Self {
        self.call("log_", f64::ln)
    }
    fn ln_1p(self) -> Self {
        self.call("log1p_", f64::ln_1p)
    }
    fn sqrt(self) -> Self {
        self.call("sqrt", f64::sqrt)
    }
    fn rsqrt(self) -> Self {
        self.call("inverseSqrt", |x| 1.0 / x.sqrt())
    }
    fn tanh(self) -> Self {
        self.call("tanh_", f64::tanh)
    }
    fn abs(self) -> Self {
        self.call("abs", f64::abs)
    }
    fn powf(self, e: Self) -> Self {
        self.call2("pow_", e, f64::powf)
    }
    fn erf(self) -> Self {
        self.call("erf_", <f64 as Scalar>::erf)
    }
    fn max_nan(self, other: Self) -> Self {
        self.call2("max_", other, <f64 as Scalar>::max_nan)
    }
    fn min_nan(self, other: Self) -> Self {
        self.call2("min_", other, <f64 as Scalar>::min_nan)
    }
    fn greater(self, other: Self) -> Self {
        Wgsl::apply(&[self, other], Kind::Compare(">"), |v| v[0].greater(v[1]))
    }
    fn equal(self, other: Self) -> Self {
        Wgsl::apply(&[self, other], Kind::Compare("=="), |v| v[0].equal(v[1]))
    }
    fn isnan(self) -> Self {
        Wgsl::apply(&[self], Kind::Test("is_nan_"), |v| v[0].isnan())
    }
    fn select(self, then: Self, otherwise: Self) -> Self {
        if let Wgsl::Lit(c) = self {
            return if c != 0.0 { then } else { otherwise };
        }
        Wgsl::apply(&[self, then, otherwise], Kind::Select, |v| v[0].select(v[1], v[2]))
    }
    /// A call of the WGSL function `name`, its definition traced once per trace for
    /// [`Trace::functions`].
    fn composite(self, name: &'static str, definition: fn(Self) -> Self) -> Self {
        let Wgsl::Expr(t, x) = self else { return definition(self) };
        if !t.functions.borrow().iter().any(|f| f.0 == name) {
            let param = t.push(Kind::Leaf("x".to_string()), Vec::new());
            t.functions.borrow_mut().push((name, None));
            let body = t.node_of(definition(Wgsl::Expr(t, param)));
            if let Some(f) = t.functions.borrow_mut().iter_mut().find(|f| f.0 == name) {
                f.1 = Some(body);
            }
        }
        Wgsl::Expr(t, t.push(Kind::Call(name), vec![x]))
    }
}

/// A constant as WGSL: an f32 literal that round-trips exactly (NaN as the quiet NaN).
fn lit(v: f64) -> String {
    f32_lit(if v.is_nan() { f32::NAN } else { v as f32 })
}

/// Rendered WGSL of a node: its text, whether it is bool, and whether it needs parentheses as
/// an operand of an operator.
#[derive(Clone, Debug)]
struct Text {
    wgsl: String,
    boolean: bool,
    compound: bool,
}

/// One rendering of a trace: use counts, then each node's text once.
struct Render<'a> {
    nodes: &'a [Node],
    uses: Vec<u32>,
    done: Vec<Option<Text>>,
    bind: &'a mut dyn FnMut(&str) -> String,
}

impl<'a> Render<'a> {
    fn new(nodes: &'a [Node], bind: &'a mut dyn FnMut(&str) -> String) -> Self {
        Render { nodes, uses: vec![0; nodes.len()], done: vec![None; nodes.len()], bind }
    }

    /// Counts the uses of `id` and, on its first, of what it reads.
    fn count(&mut self, id: usize) {
        self.uses[id] += 1;
        if self.uses[id] == 1 {
            for &a in &self.nodes[id].args {
                self.count(a);
            }
        }
    }

    /// `id` as an f32 value.
    fn value(&mut self, id: usize) -> String {
        let t = self.text(id);
        if t.boolean {
            format!("select(0.0, 1.0, {})", t.wgsl)
        } else {
            t.wgsl
        }
    }

    /// `id` as an operand of an operator.
    fn operand(&mut self, id: usize) -> String {
        let t = self.text(id);
        let s = if t.boolean { format!("select(0.0, 1.0, {})", t.wgsl) } else { t.wgsl };
        if t.compound && !t.boolean {
            format!("({s})")
        } else {
            s
        }
    }

    /// `id` as a condition: a bool as is, a value where it is nonzero (`!=` may compile to an
    /// ordered comparison, false for NaN; NaN is true here).
    fn condition(&mut self, id: usize) -> String {
        let t = self.text(id);
        if t.boolean {
            t.wgsl
        } else {
            format!("!({} == 0.0)", self.operand(id))
        }
    }

    /// The WGSL of `id`, bound to a `let` if it is used more than once and is not a name or a
    /// constant already.
    fn text(&mut self, id: usize) -> Text {
        if let Some(t) = &self.done[id] {
            return t.clone();
        }
        let node = &self.nodes[id];
        let args = node.args.clone();
        let text = |wgsl: String, boolean: bool, compound: bool| Text { wgsl, boolean, compound };
        let t = match &node.kind {
            Kind::Leaf(s) => text(s.clone(), false, s.starts_with('-')),
            Kind::Lit(v) => {
                let s = lit(*v);
                let negative = s.starts_with('-');
                text(s, false, negative)
            }
            Kind::Neg => text(format!("-{}", self.operand(args[0])), false, true),
            &Kind::Arith(op) => {
                let (a, b) = (self.operand(args[0]), self.operand(args[1]));
                text(format!("{a} {op} {b}"), false, true)
            }
            &Kind::Compare(op) => {
                let (a, b) = (self.operand(args[0]), self.operand(args[1]));
                text(format!("{a} {op} {b}"), true, true)
            }
            &Kind::Call(name) | &Kind::Test(name) => {
                let boolean = matches!(node.kind, Kind::Test(_));
                let a: Vec<String> = args.iter().map(|&a| self.value(a)).collect();
                text(format!("{name}({})", a.join(", ")), boolean, false)
            }
            Kind::Select => {
                let c = self.condition(args[0]);
                let (then, otherwise) = (self.value(args[1]), self.value(args[2]));
                text(format!("select({otherwise}, {then}, {c})"), false, false)
            }
        };
        let plain = |s: &str| s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.');
        let shared = self.uses[id] > 1
            && !matches!(self.nodes[id].kind, Kind::Lit(_))
            && !plain(&t.wgsl);
        let t = if shared { Text { wgsl: (self.bind)(&t.wgsl), compound: false, ..t } } else { t };
        self.done[id] = Some(t.clone());
        t
    }
}

/// Every WGSL function a kernel may call: the primitives' spellings below and the composite
/// functions the table's rows call, traced from their definitions.
pub fn math_wgsl() -> &'static str {
    static TEXT: OnceLock<String> = OnceLock::new();
    TEXT.get_or_init(|| {
        let t = Trace::default();
        let (a, b) = (t.leaf("a"), t.leaf("b"));
        for u in UnaryOp::ALL {
            u.eval(a);
        }
        for op in BinaryOp::ALL {
            op.eval(a, b);
        }
        format!("{PRIMITIVES_WGSL}{}", t.functions())
    })
}

/// The primitives WGSL lacks or leaves loose. NaN and the infinities behave as in the CPU
/// reference (Rust's f32, C's `powf`) rather than as WGSL leaves them: `max`, `min`, `clamp` and
/// `sign` may drop a NaN operand, and `pow` is `exp2(y * log2(x))`, defined for x > 0 only. NaN
/// is tested on its bits, which no optimizer may assume away.
const PRIMITIVES_WGSL: &str = "fn is_nan_(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }
fn is_inf_(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) == 0x7f800000u; }
fn max_(a: f32, b: f32) -> f32 {
    // NaN if either is NaN, else the larger (the first on ties)
    if (is_nan_(a) || is_nan_(b)) { return bitcast<f32>(0x7fc00000u); }
    return select(a, b, b > a);
}
fn min_(a: f32, b: f32) -> f32 {
    if (is_nan_(a) || is_nan_(b)) { return bitcast<f32>(0x7fc00000u); }
    return select(a, b, b < a);
}
fn sign_(x: f32) -> f32 { return select(select(select(0.0, -1.0, x < 0.0), 1.0, x > 0.0), x, is_nan_(x)); }
fn tanh_(x: f32) -> f32 {
    // tanh without overflow for large |x|, and by its series near 0 (where 1 - e cancels)
    if (abs(x) < 0.125) {
        let x2 = x * x;
        return x * (1.0 + x2 * (-0.33333333 + x2 * (0.13333333 + x2 * -0.053968254)));
    }
    let e = exp(-2.0 * abs(x));
    return sign_(x) * (1.0 - e) / (1.0 + e);
}
fn pow_(a: f32, b: f32) -> f32 {
    // C powf: x^0 = 1^y = 1 (NaN included), integer exponents of negative bases, zeros and
    // infinities by their limits
    if (b == 0.0 || a == 1.0) { return 1.0; }
    if (is_nan_(a) || is_nan_(b)) { return bitcast<f32>(0x7fc00000u); }
    let ab = abs(a);
    if (is_inf_(b)) {
        if (ab == 1.0) { return 1.0; }
        return select(0.0, bitcast<f32>(0x7f800000u), (ab > 1.0) == (b > 0.0));
    }
    let integer = b == floor(b);
    // every f32 of magnitude 2^24 or more is an even integer
    let odd = integer && abs(b) < 16777216.0 && (i32(b) & 1) == 1;
    let negative = (bitcast<u32>(a) >> 31u) == 1u;
    if (negative && !integer && ab != 0.0 && !is_inf_(a)) { return bitcast<f32>(0x7fc00000u); }
    var m: f32;
    if (ab == 0.0 || is_inf_(a)) {
        m = select(0.0, bitcast<f32>(0x7f800000u), (ab == 0.0) == (b < 0.0));
    } else {
        m = pow(ab, b);
    }
    return select(m, -m, negative && odd);
}
fn log_(x: f32) -> f32 {
    // log to a few ulps near 1 too, where WGSL's log need only be within 2^-21 (a relative
    // error of 5e-4 at log(1.001)): there 2 atanh(u), u = (x - 1) / (x + 1) (x - 1 exact),
    // by its series (|u| <= 0.2: the first term left out is below 2^-30 of the sum)
    if (x > 0.75 && x < 1.5) {
        let u = (x - 1.0) / (x + 1.0);
        let u2 = u * u;
        return 2.0 * u * (1.0 + u2 * (0.33333333 + u2 * (0.2 + u2 * (0.14285714 + u2 * (0.11111111 + u2 * 0.09090909)))));
    }
    return log(x);
}
fn log1p_(x: f32) -> f32 {
    // log(1 + x) without rounding 1 + x: 2 atanh(u), u = x / (2 + x), by its series where
    // |x| < 0.25 (|u| < 0.15: the first term left out is below 2^-36 of the sum)
    if (abs(x) < 0.25) {
        let u = x / (2.0 + x);
        let u2 = u * u;
        return 2.0 * u * (1.0 + u2 * (0.33333333 + u2 * (0.2 + u2 * (0.14285714 + u2 * (0.11111111 + u2 * 0.09090909)))));
    }
    return log_(1.0 + x);
}
fn erf_(x: f32) -> f32 {
    // Abramowitz-Stegun 7.1.26 refined: max abs error 1.5e-7
    let t = 1.0 / (1.0 + 0.3275911 * abs(x));
    let y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t * exp(-x * x);
    return sign_(x) * y;
}
";

#[cfg(test)]
mod tests {
    use super::*;

    /// The value `build` traces renders as `expected`: the `let`s bound, then the expression.
    fn check(build: impl for<'t> FnOnce(&'t Trace) -> Wgsl<'t>, expected: &str) {
        let t = Trace::default();
        let v = build(&t);
        let (mut lets, mut n) = (String::new(), 0);
        let e = t.render(v, &mut |e| {
            n += 1;
            lets.push_str(&format!("let v{n} = {e}; "));
            format!("v{n}")
        });
        assert_eq!(format!("{lets}{e}"), expected);
    }

    fn wgsl<'t>(t: &'t Trace, e: &str) -> Wgsl<'t> {
        t.operand(&Operand::Wgsl(e.to_string()))
    }

    fn constant(t: &Trace, v: f32) -> Wgsl<'_> {
        t.operand(&Operand::Constant(v))
    }

    #[test]
    fn rows_render_with_codegen_spellings() {
        use {BinaryOp as B, UnaryOp as U};
        check(|t| U::Neg.eval(wgsl(t, "x")), "-x");
        check(|t| U::Rsqrt.eval(wgsl(t, "x")), "inverseSqrt(x)");
        check(|t| U::Tanh.eval(wgsl(t, "x")), "tanh_(x)");
        check(|t| U::Relu.eval(wgsl(t, "x")), "max_(x, 0.0)");
        check(|t| U::Softplus.eval(wgsl(t, "x")), "max_(x, 0.0) + log1p_(exp(-abs(x)))");
        check(
            |t| U::Sign.eval(wgsl(t, "x")),
            "select(select(0.0, 1.0, x > 0.0) - select(0.0, 1.0, 0.0 > x), x, is_nan_(x))",
        );
        check(|t| U::GeluTanh.eval(wgsl(t, "x")), "gelu_tanh(x)");
        check(|t| B::Pow.eval(wgsl(t, "x"), wgsl(t, "y")), "pow_(x, y)");
        check(|t| B::Maximum.eval(wgsl(t, "x"), wgsl(t, "y")), "max_(x, y)");
        check(|t| B::Greater.eval(wgsl(t, "x"), wgsl(t, "y")), "select(0.0, 1.0, x > y)");
        check(|t| B::Equal.eval(wgsl(t, "x"), wgsl(t, "y")), "select(0.0, 1.0, x == y)");
        check(|t| wgsl(t, "c").select(wgsl(t, "x"), wgsl(t, "y")), "select(y, x, !(c == 0.0))");
    }

    #[test]
    fn shared_operands_are_bound_once_and_names_are_not() {
        check(|t| UnaryOp::Square.eval(wgsl(t, "x")), "x * x");
        check(|t| UnaryOp::Square.eval(wgsl(t, "b0[i]")), "let v1 = b0[i]; v1 * v1");
        check(
            |t| {
                let s = wgsl(t, "a") + wgsl(t, "b");
                let q = s * s;
                q * q
            },
            "let v1 = a + b; let v2 = v1 * v1; v2 * v2",
        );
        check(
            |t| {
                let c = wgsl(t, "x").greater(wgsl(t, "y"));
                c.select(c, wgsl(t, "z"))
            },
            "let v1 = x > y; select(z, select(0.0, 1.0, v1), v1)",
        );
    }

    #[test]
    fn negative_operands_are_parenthesized() {
        check(|t| -wgsl(t, "-0.5"), "-(-0.5)");
        check(|t| wgsl(t, "x") * constant(t, -0.5), "x * (-0.5)");
        check(|t| -(-wgsl(t, "x")), "-(-x)");
    }

    #[test]
    fn constant_subexpressions_fold() {
        check(|t| UnaryOp::Neg.eval(constant(t, -0.5)), "0.5");
        check(|t| UnaryOp::Log.eval(constant(t, -0.5)), "bitcast<f32>(2143289344u)");
        check(|t| UnaryOp::Sqrt.eval(constant(t, 4.0)) + wgsl(t, "x"), "2.0 + x");
        check(|t| BinaryOp::Div.eval(constant(t, 1.0), constant(t, 0.0)), "bitcast<f32>(2139095040u)");
        check(|t| constant(t, 0.0).select(wgsl(t, "x"), wgsl(t, "y")), "y");
        check(|t| constant(t, f32::NAN).select(wgsl(t, "x"), wgsl(t, "y")), "x");
    }

    #[test]
    fn composites_are_functions_traced_from_their_definitions() {
        let lib = math_wgsl();
        for name in ["sigmoid", "silu", "silu_grad", "gelu", "gelu_grad", "gelu_tanh"] {
            assert_eq!(lib.matches(&format!("fn {name}(x: f32) -> f32 {{")).count(), 1, "{name}");
        }
        assert!(lib.contains(
            "fn silu_grad(x: f32) -> f32 {\n    let v1 = sigmoid(x);\n    return v1 * (1.0 + (x * (1.0 - v1)));\n}\n"
        ));
    }
}
