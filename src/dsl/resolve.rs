//! Static checks of a parsed program, before any hyperparameter has a value: duplicate
//! definitions, unknown names and ops, argument counts and names, initializers, where `return`
//! stands, `as` on calls that own no parameters, and recursion between blocks.
//!
//! The result, a [`Module`], is the user's definitions on top of the standard library (a user
//! block shadows a standard one of the same name). Shapes are checked later, by `lower`, once
//! dimensions are known.

use super::ast::*;
use super::bind::{self, bind};
use super::ops::{self, INITS};
use crate::err;
use crate::error::{Error, Result, Source, Span};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// The standard library, in the model language.
pub const STD_SOURCE: &str = include_str!("std.rms");

/// Resolved definitions: the standard library's and the user's, each with the source its spans
/// point into.
#[derive(Clone, Debug)]
pub struct Module {
    pub items: Vec<Item>,
    pub sources: Vec<Arc<Source>>,
    by_name: HashMap<String, usize>,
    /// The standard library's definitions, which a user *model* of the same name does not
    /// hide from calls (a model cannot be called; `model mlp` must not break std's blocks).
    std_by_name: HashMap<String, usize>,
}

impl Module {
    /// The definition called `name` (the user's when it shadows a standard one).
    pub fn item(&self, name: &str) -> Option<(&Item, &Arc<Source>)> {
        self.by_name.get(name).map(|&i| (&self.items[i], &self.sources[i]))
    }

    /// What a call of `name` refers to: the user's block, else the standard library's (also
    /// when a user model has that name, since models cannot be called).
    pub fn callable(&self, name: &str) -> Option<(&Item, &Arc<Source>)> {
        self.callable_index(name).map(|i| (&self.items[i], &self.sources[i]))
    }

    fn callable_index(&self, name: &str) -> Option<usize> {
        let i = *self.by_name.get(name)?;
        match (self.items[i].kind, self.std_by_name.get(name)) {
            (ItemKind::Model, Some(&std)) => Some(std),
            _ => Some(i),
        }
    }

    /// The user's models, in source order.
    pub fn models(&self) -> impl Iterator<Item = &Item> {
        self.items.iter().filter(|it| it.kind == ItemKind::Model)
    }

    /// Whether the item at `name` comes from the standard library.
    pub fn is_std(&self, name: &str) -> bool {
        self.item(name).is_some_and(|(_, s)| s.name == STD_NAME)
    }
}

/// The name the standard library's source goes by in messages.
pub const STD_NAME: &str = "<std>";

/// Resolve the user's program (parsed from `src`) on top of the standard library.
pub fn resolve(program: Program, src: &Arc<Source>) -> Result<Module> {
    let std_src = Source::new(STD_NAME, STD_SOURCE);
    let std_prog = super::parse::parse(&std_src)?;
    let mut module = Module {
        items: Vec::new(),
        sources: Vec::new(),
        by_name: HashMap::new(),
        std_by_name: HashMap::new(),
    };
    for it in std_prog.items {
        module.by_name.insert(it.name.name.clone(), module.items.len());
        module.items.push(it);
        module.sources.push(std_src.clone());
    }
    let n_std = module.items.len();
    module.std_by_name = module.by_name.clone();
    for it in program.items {
        if let Some(&prev) = module.by_name.get(&it.name.name) {
            if prev >= n_std {
                return Err(err!(Name, "duplicate definition `{}`", it.name.name)
                    .at(it.name.span)
                    .in_source(src));
            }
        }
        module.by_name.insert(it.name.name.clone(), module.items.len());
        module.items.push(it);
        module.sources.push(src.clone());
    }
    for (i, it) in module.items.iter().enumerate() {
        let mut cx = Checker { module: &module, calls: Vec::new() };
        cx.item(it).map_err(|e| e.in_source(&module.sources[i]))?;
    }
    check_recursion(&module)?;
    Ok(module)
}

/// How a name in scope may be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Binding {
    /// A variable or hyperparameter: may be rebound.
    Var,
    /// A `const` or a dimension: may not be rebound.
    Fixed,
}

struct Checker<'m> {
    module: &'m Module,
    /// Block calls seen, for the recursion check.
    calls: Vec<(String, Span)>,
}

impl Checker<'_> {
    fn item(&mut self, it: &Item) -> Result<()> {
        let mut env: HashMap<String, Binding> = HashMap::new();
        // Sets, not lists: a signature of 120,000 hyperparameters took 36 s in `contains` and
        // `retain` on lists (each name against all the others).
        let hyper_names: HashSet<&str> = it.hyper_names().collect();
        // Names of the signature first, so that a pattern may check a later hyperparameter.
        for p in &it.params {
            let name = p.name();
            if env.contains_key(&name.name) {
                return Err(err!(Name, "duplicate parameter `{}`", name.name).at(name.span));
            }
            env.insert(name.name.clone(), Binding::Var);
        }
        for p in &it.params {
            let SigParam::Tensor { dims, .. } = p else {
                continue;
            };
            let mut ellipsis = false;
            for d in dims {
                match d {
                    DimPat::Ellipsis(span) => {
                        if it.kind == ItemKind::Model {
                            return Err(err!(
                                Name,
                                "a model input cannot use `...`; give every dimension"
                            )
                            .at(*span));
                        }
                        if ellipsis {
                            return Err(
                                err!(Name, "`...` may appear only once in a pattern").at(*span)
                            );
                        }
                        ellipsis = true;
                    }
                    DimPat::Name(n) => {
                        if hyper_names.contains(n.name.as_str()) {
                            continue;
                        }
                        if env.get(&n.name) == Some(&Binding::Var) {
                            return Err(err!(Name, "`{}` names a tensor, not a dimension", n.name)
                                .at(n.span));
                        }
                        env.insert(n.name.clone(), Binding::Fixed);
                    }
                    DimPat::Size(v, span) => {
                        if *v <= 0 {
                            return Err(err!(Name, "a dimension must be positive").at(*span));
                        }
                    }
                }
            }
        }
        // Defaults may use dimensions, tensors and earlier hyperparameters.
        let mut later: HashSet<&str> = hyper_names.clone();
        for p in &it.params {
            if let SigParam::Hyper { name, default } = p {
                later.remove(name.name.as_str());
                if let Some(e) = default {
                    self.expr(e, &env, &later)?;
                }
            }
        }
        let n = it.body.len();
        for (i, s) in it.body.iter().enumerate() {
            if let Stmt::Return { span, .. } = s {
                if i + 1 != n {
                    return Err(err!(Name, "`return` must be the last statement").at(*span));
                }
            }
            self.stmt(s, &mut env)?;
        }
        if !matches!(it.body.last(), Some(Stmt::Return { .. })) {
            let what = if it.kind == ItemKind::Model { "model" } else { "block" };
            return Err(err!(Name, "{what} `{}` has no `return`", it.name.name).at(it.name.span));
        }
        Ok(())
    }

    fn stmt(&mut self, s: &Stmt, env: &mut HashMap<String, Binding>) -> Result<()> {
        match s {
            Stmt::Assign { name, value } => {
                self.expr(value, env, &HashSet::new())?;
                bind_inline_params(value, env);
                if env.get(&name.name) == Some(&Binding::Fixed) {
                    return Err(err!(
                        Name,
                        "cannot assign to `{}`, a constant or dimension",
                        name.name
                    )
                    .at(name.span));
                }
                env.insert(name.name.clone(), Binding::Var);
            }
            Stmt::Const { name, value } => {
                self.expr(value, env, &HashSet::new())?;
                if env.contains_key(&name.name) {
                    return Err(err!(Name, "duplicate name `{}`", name.name).at(name.span));
                }
                env.insert(name.name.clone(), Binding::Fixed);
            }
            Stmt::Param(decl) => self.param(decl, env)?,
            Stmt::Repeat { count, name: _, body, .. } => {
                self.expr(count, env, &HashSet::new())?;
                for s in body {
                    if let Stmt::Return { span, .. } = s {
                        return Err(err!(Name, "`return` cannot stand inside `repeat`").at(*span));
                    }
                    self.stmt(s, env)?;
                }
            }
            Stmt::Return { values, .. } => {
                for v in values {
                    self.expr(v, env, &HashSet::new())?;
                }
            }
        }
        Ok(())
    }

    fn param(&mut self, decl: &ParamDecl, env: &mut HashMap<String, Binding>) -> Result<()> {
        self.check_param(decl, env)?;
        env.insert(decl.name.name.clone(), Binding::Var);
        Ok(())
    }

    /// Checks a parameter declaration without binding its name.
    fn check_param(&mut self, decl: &ParamDecl, env: &HashMap<String, Binding>) -> Result<()> {
        if decl.shape.is_empty() {
            return Err(
                err!(Name, "parameter `{}` needs a shape", decl.name.name).at(decl.name.span)
            );
        }
        for e in &decl.shape {
            self.expr(e, env, &HashSet::new())?;
        }
        let (name, args, span) = match &decl.init.kind {
            ExprKind::Name(n) => (n.as_str(), &[][..], decl.init.span),
            ExprKind::Call(c) if c.alias.is_none() && !c.op_only => {
                (c.callee.name.as_str(), &c.args[..], c.callee.span)
            }
            _ => return Err(bad_init(decl.init.span)),
        };
        let Some((_, params)) = INITS.iter().find(|(n, _)| *n == name) else {
            return Err(bad_init(span));
        };
        if args.len() != params.len() || args.iter().any(|a| a.name.is_some()) {
            let usage = if params.is_empty() {
                name.to_string()
            } else {
                format!("{name}({})", params.join(", "))
            };
            return Err(err!(
                Name,
                "initializer `{name}` takes {} argument{}: {usage}",
                params.len(),
                if params.len() == 1 { "" } else { "s" }
            )
            .at(decl.init.span));
        }
        for a in args {
            self.expr(&a.value, env, &HashSet::new())?;
        }
        if env.get(&decl.name.name) == Some(&Binding::Fixed) {
            return Err(err!(
                Name,
                "cannot assign to `{}`, a constant or dimension",
                decl.name.name
            )
            .at(decl.name.span));
        }
        Ok(())
    }

    /// Checks an expression; `later` are hyperparameters not yet bound (for defaults).
    fn expr(&mut self, e: &Expr, env: &HashMap<String, Binding>, later: &HashSet<&str>) -> Result<()> {
        match &e.kind {
            ExprKind::Int(_) | ExprKind::Float(_) | ExprKind::Bool(_) => Ok(()),
            ExprKind::Name(n) => {
                if later.contains(n.as_str()) {
                    return Err(err!(Name, "`{n}` is used before it is bound").at(e.span));
                }
                // A dotted name is a parameter, known only once the model is lowered.
                if env.contains_key(n) || n.contains('.') {
                    Ok(())
                } else if INITS.iter().any(|(i, _)| i == n) {
                    Err(err!(Name, "initializer `{n}` can only follow `param NAME[...] =`")
                        .at(e.span))
                } else {
                    Err(err!(Name, "unknown name `{n}`").at(e.span))
                }
            }
            ExprKind::List(items) => items.iter().try_for_each(|x| self.expr(x, env, later)),
            ExprKind::Neg(x) => self.expr(x, env, later),
            ExprKind::Binary(_, a, b) => {
                self.expr(a, env, later)?;
                self.expr(b, env, later)
            }
            ExprKind::Param(decl) => {
                // An inline `param` binds its name for the statements after it
                // (`bind_inline_params`), so only check it here. (It was checked against a copy
                // of the scope: a model of 25,000 inline params took 13 s.)
                self.check_param(decl, env)
            }
            ExprKind::Call(c) => self.call(c, e.span, env, later),
        }
    }

    fn call(
        &mut self,
        c: &Call,
        span: Span,
        env: &HashMap<String, Binding>,
        later: &HashSet<&str>,
    ) -> Result<()> {
        for a in &c.args {
            self.expr(&a.value, env, later)?;
        }
        let block =
            if c.op_only { None } else { self.module.callable(&c.callee.name).map(|(it, _)| it) };
        if let Some(it) = block {
            if it.kind == ItemKind::Model {
                return Err(err!(
                    Name,
                    "`{}` is a model; only blocks and ops can be called",
                    c.callee.name
                )
                .at(c.callee.span));
            }
            bind(&it.params[..], unvalued(&c.args), || format!("block `{}`", c.callee.name), span)?;
            self.calls.push((c.callee.name.clone(), c.callee.span));
            return Ok(());
        }
        let Some(sig) = ops::op(&c.callee.name) else {
            if INITS.iter().any(|(i, _)| *i == c.callee.name) {
                return Err(err!(
                    Name,
                    "initializer `{}` can only follow `param NAME[...] =`",
                    c.callee.name
                )
                .at(c.callee.span));
            }
            let what = if c.op_only { "op" } else { "op or block" };
            return Err(err!(Name, "unknown {what} `{}`", c.callee.name).at(c.callee.span));
        };
        if let Some(alias) = &c.alias {
            return Err(err!(
                Name,
                "`{}` is an op and owns no parameters; `as` names block calls",
                c.callee.name
            )
            .at(alias.span));
        }
        bind(sig.params, unvalued(&c.args), || format!("`{}`", sig.usage()), span)?;
        Ok(())
    }
}

/// A call's arguments for the binder, which only checks them here.
fn unvalued(args: &[Arg]) -> impl ExactSizeIterator<Item = bind::Arg<'_, ()>> {
    args.iter().map(|a| bind::Arg { name: a.name.as_ref(), value: (), span: a.value.span })
}

/// Inline `param NAME[...] = init` expressions bind NAME for the statements that follow.
fn bind_inline_params(e: &Expr, env: &mut HashMap<String, Binding>) {
    match &e.kind {
        ExprKind::Param(decl) => {
            env.entry(decl.name.name.clone()).or_insert(Binding::Var);
        }
        ExprKind::List(items) => items.iter().for_each(|x| bind_inline_params(x, env)),
        ExprKind::Neg(x) => bind_inline_params(x, env),
        ExprKind::Binary(_, a, b) => {
            bind_inline_params(a, env);
            bind_inline_params(b, env);
        }
        ExprKind::Call(c) => c.args.iter().for_each(|a| bind_inline_params(&a.value, env)),
        _ => {}
    }
}

fn bad_init(span: Span) -> Error {
    err!(Name, "bad initializer; expected one of {}", ops::init_usage()).at(span)
}

/// Rejects a block that calls itself, directly or through others (iteratively, so long chains
/// cannot overflow the stack).
fn check_recursion(module: &Module) -> Result<()> {
    let n = module.items.len();
    let mut edges: Vec<Vec<(usize, Span)>> = vec![Vec::new(); n];
    for (i, it) in module.items.iter().enumerate() {
        let mut cx = Checker { module, calls: Vec::new() };
        // Already checked; this pass only collects the calls.
        let _ = cx.item(it);
        for (name, span) in cx.calls {
            if let Some(j) = module.callable_index(&name) {
                edges[i].push((j, span));
            }
        }
    }
    // 0 = unvisited, 1 = on the stack, 2 = done.
    let mut state = vec![0u8; n];
    for root in 0..n {
        if state[root] != 0 {
            continue;
        }
        let mut stack: Vec<(usize, usize)> = vec![(root, 0)];
        state[root] = 1;
        while let Some(&mut (node, ref mut next)) = stack.last_mut() {
            if let Some(&(to, span)) = edges[node].get(*next) {
                *next += 1;
                match state[to] {
                    0 => {
                        state[to] = 1;
                        stack.push((to, 0));
                    }
                    1 => {
                        let from = &module.items[node].name.name;
                        let callee = &module.items[to].name.name;
                        let msg = if from == callee {
                            format!("recursion: block `{from}` calls itself")
                        } else {
                            format!("recursion: block `{from}` calls `{callee}`, which calls back into `{from}`")
                        };
                        return Err(err!(Name, "{msg}").at(span).in_source(&module.sources[node]));
                    }
                    _ => {}
                }
            } else {
                state[node] = 2;
                stack.pop();
            }
        }
    }
    Ok(())
}
