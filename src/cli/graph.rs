//! The logic of `rumus graph FILE [--model NAME] [--set NAME=VALUE] [--params]`: load a model
//! file (standalone or `.rms`), instantiate one model (`--set` sets hyperparameters and input
//! dimensions, as for `rumus plan`; dimensions left unset are 1), and render either its
//! parameter list or its graph as Graphviz DOT.

use super::model::{lower_model, Pick};
use crate::error::Result;
use crate::graph::{Graph, Init, Op};
use crate::tensor::fmt_shape;

/// Run `rumus graph`: the text to print, or an error (rendered with its source position).
pub fn cli_graph(
    path: &str,
    model: Option<&str>,
    sets: &[(String, String)],
    params: bool,
) -> Result<String> {
    let m = lower_model(path, model, Pick::Only, sets, Some(1))?;
    Ok(if params { param_table(&m.graph) } else { dot(&m.graph, &m.name) })
}

/// One line per parameter: dotted name, shape, initializer.
pub fn param_table(g: &Graph) -> String {
    let mut out = String::new();
    for (id, name) in g.parameters() {
        let init = match &g.node(id).op {
            Op::Parameter { init, .. } => fmt_init(init),
            _ => String::new(),
        };
        out.push_str(&format!("{name} {} {init}\n", fmt_shape(g.shape(id))));
    }
    out
}

/// An initializer as the language writes it.
pub fn fmt_init(init: &Init) -> String {
    match init {
        Init::Zeros => "zeros".into(),
        Init::Ones => "ones".into(),
        Init::Fill(v) => format!("fill({v})"),
        Init::Normal { mean, std } => format!("normal({mean}, {std})"),
        Init::Uniform { low, high } => format!("uniform({low}, {high})"),
        Init::Xavier => "xavier".into(),
        Init::Kaiming => "kaiming".into(),
    }
}

/// The graph as Graphviz DOT: one box per node (op, name, shape, dtype), edges from inputs.
pub fn dot(g: &Graph, name: &str) -> String {
    crate::plan::report::dot(g, name, None)
}
