//! The spanned syntax tree of the model language: what `parse` produces and `resolve` / `lower`
//! consume. Every node carries the [`Span`] of the text it came from (byte offsets into the
//! whole source, so positions stay right for model blocks inside `.rms` scripts).

use crate::error::Span;
use crate::tensor::DType;

/// A parsed source: its block and model definitions, in order.
#[derive(Clone, Debug, Default)]
pub struct Program {
    pub items: Vec<Item>,
}

/// `block` or `model`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ItemKind {
    Block,
    Model,
}

/// A block or model definition.
#[derive(Clone, Debug)]
pub struct Item {
    pub kind: ItemKind,
    pub name: Ident,
    pub params: Vec<SigParam>,
    pub body: Vec<Stmt>,
    pub span: Span,
}

/// A name with its position.
#[derive(Clone, Debug, PartialEq)]
pub struct Ident {
    pub name: String,
    pub span: Span,
}

/// One parameter of a signature.
#[derive(Clone, Debug)]
pub enum SigParam {
    /// `x: f32[B, T, D]`.
    Tensor { name: Ident, dtype: DType, dims: Vec<DimPat>, span: Span },
    /// `hidden` or `hidden = 4 * D`.
    Hyper { name: Ident, default: Option<Expr> },
}

impl SigParam {
    pub fn name(&self) -> &Ident {
        match self {
            SigParam::Tensor { name, .. } | SigParam::Hyper { name, .. } => name,
        }
    }
}

/// One dimension of a tensor pattern.
#[derive(Clone, Debug)]
pub enum DimPat {
    /// `...`: any number of leading dimensions.
    Ellipsis(Span),
    /// A name: binds the dimension, or checks it when the name is already bound.
    Name(Ident),
    /// A fixed size.
    Size(i64, Span),
}

/// A statement.
#[derive(Clone, Debug)]
pub enum Stmt {
    /// `name = value`.
    Assign { name: Ident, value: Expr },
    /// `const name = value`.
    Const { name: Ident, value: Expr },
    /// `param name[shape] = init` as a statement.
    Param(ParamDecl),
    /// `repeat count [as name] { body }`.
    Repeat { count: Expr, name: Option<Ident>, body: Vec<Stmt>, span: Span },
    /// `return a, b`.
    Return { values: Vec<Expr>, span: Span },
}

/// `param name[shape] = init`.
#[derive(Clone, Debug)]
pub struct ParamDecl {
    pub name: Ident,
    pub shape: Vec<Expr>,
    pub init: Expr,
    pub span: Span,
}

/// An expression with its span.
#[derive(Clone, Debug)]
pub struct Expr {
    pub kind: ExprKind,
    pub span: Span,
}

/// The forms of expression.
#[derive(Clone, Debug)]
pub enum ExprKind {
    Int(i64),
    Float(f64),
    Bool(bool),
    Name(String),
    List(Vec<Expr>),
    Neg(Box<Expr>),
    Binary(BinOp, Box<Expr>, Box<Expr>),
    Call(Call),
    Param(Box<ParamDecl>),
}

/// An infix operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Matmul,
}

impl BinOp {
    /// The operator as written.
    pub fn symbol(self) -> &'static str {
        match self {
            BinOp::Add => "+",
            BinOp::Sub => "-",
            BinOp::Mul => "*",
            BinOp::Div => "/",
            BinOp::Matmul => "@",
        }
    }

    /// The op-table name the operator lowers to.
    pub fn op_name(self) -> &'static str {
        match self {
            BinOp::Add => "add",
            BinOp::Sub => "sub",
            BinOp::Mul => "mul",
            BinOp::Div => "div",
            BinOp::Matmul => "matmul",
        }
    }

    /// Binding strength: `* / @` bind tighter than `+ -`.
    pub fn precedence(self) -> u8 {
        match self {
            BinOp::Add | BinOp::Sub => 1,
            BinOp::Mul | BinOp::Div | BinOp::Matmul => 2,
        }
    }
}

/// `f(args) [as name]` or `ops.f(args)`.
#[derive(Clone, Debug)]
pub struct Call {
    pub callee: Ident,
    /// Written `ops.f`: always the op, never a block.
    pub op_only: bool,
    pub args: Vec<Arg>,
    pub alias: Option<Ident>,
}

/// A call argument.
#[derive(Clone, Debug)]
pub struct Arg {
    pub name: Option<Ident>,
    pub value: Expr,
}

impl Item {
    /// Names of the hyperparameters in the signature, in order.
    pub fn hyper_names(&self) -> impl Iterator<Item = &str> {
        self.params.iter().filter_map(|p| match p {
            SigParam::Hyper { name, .. } => Some(name.name.as_str()),
            _ => None,
        })
    }
}
