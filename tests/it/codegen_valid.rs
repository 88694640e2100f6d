//! Every WGSL module codegen emits for a plan passes naga's parser and validator (CPU only):
//! the programs of every kernel kind (generated, and templates filled with their generated
//! parts) of the fused and unfused plans of a GPT training step and of every op-table case, in
//! every matmul precision mode (the cooperative-matrix modules validated with naga's
//! cooperative-matrix and f16 capabilities, on a faked cooperative adapter, no hardware
//! needed), and none binds more storage buffers than the planner counted for its kernel (plus
//! the exponents of a cooperative product, which codegen checks against the device). Each
//! program holds the loops its generator states (`codegen::loops`): as many loop statements
//! in the functions its entry point reaches as the bound it gives counted.

use crate::common;

use rumus::codegen::loops::Loops;
use rumus::codegen::matmul::EXPONENT_SLOT;
use rumus::codegen::matmul_coop::{tiles, CoopMode};
use rumus::codegen::wgsl::generate_counted;
use rumus::codegen::{compile, CoopAttention, MatmulOptions, MatmulPrecision, Resource, Target};
use rumus::graph::{training_graph, Graph, OptimConfig, Optimizer};
use rumus::nn::{self, GptConfig};
use rumus::plan::limits::{guarded, storage_bindings};
use rumus::plan::{plan, KernelKind, Limits, PlanOptions};
use rumus::DType;

/// Parse and validate `src`; a module that enables f16 (the cooperative kernels) with the
/// capabilities a cooperative adapter gives it, an emulated cooperative one (tests: halves
/// packed into words) with `pack2x16float`'s (wgpu's `SHADER_F16_IN_F32` downlevel flag, which
/// lavapipe and Mesa's OpenGL give), every other one with none.
fn validate(label: &str, src: &str) -> Result<(), String> {
    use naga::valid::Capabilities;
    let module = naga::front::wgsl::parse_str(src)
        .map_err(|e| format!("{label}: parse: {}\n{src}", e.emit_to_string(src)))?;
    let caps = if src.starts_with("enable f16;") {
        Capabilities::COOPERATIVE_MATRIX | Capabilities::SHADER_FLOAT16
    } else if src.contains(", emulated (codegen/") {
        Capabilities::SHADER_FLOAT16_IN_FLOAT32
    } else {
        Capabilities::default()
    };
    naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps)
        .validate(&module)
        .map_err(|e| format!("{label}: validate: {e:?}\n{src}"))?;
    Ok(())
}

/// Loop statements (`for`, `while`, `loop`: naga's `Loop`) in the functions entry point
/// `entry` of `src` reaches, each counted once.
fn loop_statements(src: &str, entry: &str) -> u32 {
    use naga::{Block, Function, Handle, Statement};
    fn walk(block: &Block, loops: &mut u32, calls: &mut Vec<Handle<Function>>) {
        for s in block.iter() {
            match s {
                Statement::Block(b) => walk(b, loops, calls),
                Statement::If { accept, reject, .. } => {
                    walk(accept, loops, calls);
                    walk(reject, loops, calls);
                }
                Statement::Switch { cases, .. } => {
                    cases.iter().for_each(|c| walk(&c.body, loops, calls));
                }
                Statement::Loop { body, continuing, .. } => {
                    *loops += 1;
                    walk(body, loops, calls);
                    walk(continuing, loops, calls);
                }
                Statement::Call { function, .. } => calls.push(*function),
                _ => {}
            }
        }
    }
    let module = naga::front::wgsl::parse_str(src).expect("the module parses");
    let ep = module.entry_points.iter().find(|e| e.name == entry).expect("the entry point");
    let mut loops = 0;
    let mut calls = Vec::new();
    walk(&ep.function.body, &mut loops, &mut calls);
    let mut seen = Vec::new();
    while let Some(f) = calls.pop() {
        if !seen.contains(&f) {
            seen.push(f);
            walk(&module.functions[f].body, &mut loops, &mut calls);
        }
    }
    loops
}

/// A failure unless `label`'s module `src` (entry point `entry`) holds the loop statements
/// `loops` counts.
fn loops_stated(label: &str, src: &str, entry: &str, loops: &Loops) -> Result<(), String> {
    let held = loop_statements(src, entry);
    if held == loops.statements {
        return Ok(());
    }
    Err(format!(
        "{label}: {held} loops in its WGSL, {} in the bound of its generator",
        loops.statements
    ))
}

/// A generated module (templates, which open with a comment, are written by hand) is indented
/// four spaces a block, one statement a line.
fn formatted(src: &str) -> Result<(), String> {
    if src.starts_with("//") {
        return Ok(());
    }
    let mut depth = 0usize;
    for (i, line) in src.lines().enumerate() {
        let code = line.trim_start();
        if code.starts_with('}') {
            depth = depth.saturating_sub(1);
        }
        let indent = line.len() - code.len();
        let statements = code.matches(';').count();
        let one_statement = statements <= 1 || (code.starts_with("for (") && statements == 2);
        if !code.is_empty() && (indent != 4 * depth || !one_statement) {
            return Err(format!("line {}: not formatted: `{line}`\n{src}", i + 1));
        }
        let opens = code.matches('{').count();
        let closes = code.matches('}').count() - usize::from(code.starts_with('}'));
        depth = (depth + opens).saturating_sub(closes);
    }
    Ok(())
}

/// Validate every program of the plans of `g` for `wanted` (fused, unfused, fused at WebGPU's
/// default limits, and fused with the SIMT matmul wherever it applies); returns the number of
/// programs checked.
fn validate_plans(
    g: &Graph,
    wanted: &[rumus::graph::NodeId],
    train: bool,
    failures: &mut Vec<String>,
) -> usize {
    let mut n = 0;
    // A large GPU's limits, with every product that can on the generated SIMT matmul and every
    // reduction over more than 3 elements in two stages.
    let simt = Target {
        max_workgroup_bytes: 49152,
        max_invocations: 1024,
        matmul: MatmulOptions { simt_min_workgroups: 1, ..MatmulOptions::DEFAULT },
        reduce_chunk: 3,
        ..Target::WEBGPU_DEFAULT
    };
    let mut configs = vec![
        (true, None, Target::WEBGPU_DEFAULT),
        (false, None, Target::WEBGPU_DEFAULT),
        (true, Some(Limits::WEBGPU_DEFAULT), Target::WEBGPU_DEFAULT),
        (true, None, simt),
    ];
    // Each cooperative mode as the cost model chooses, emulated, and on each tile the model
    // chooses between (every product it fits; split into 2 slices of K where K allows).
    for (precision, mode) in
        [(MatmulPrecision::High, CoopMode::High), (MatmulPrecision::Medium, CoopMode::Medium)]
    {
        let mut matmuls = vec![
            // Attention's cooperative kernels too, real and emulated (the fp32 ones run in the
            // configurations above).
            MatmulOptions {
                precision,
                coop_attention: CoopAttention::All,
                ..MatmulOptions::DEFAULT
            },
            MatmulOptions {
                precision,
                emulate_coop: true,
                coop_attention: CoopAttention::All,
                ..MatmulOptions::DEFAULT
            },
        ];
        for (tile, split_k) in tiles(mode).into_iter().zip([None, Some(2)].into_iter().cycle()) {
            matmuls.push(MatmulOptions {
                precision,
                coop_tile: Some(tile),
                split_k,
                ..MatmulOptions::DEFAULT
            });
        }
        for matmul in matmuls {
            configs.push((true, None, Target { matmul, ..Target::COOPERATIVE }));
        }
    }
    for (fusion, limits, target) in configs {
        let matmul_prologues = target.converts_operands();
        let opts = PlanOptions { fusion, reuse: true, limits, matmul_prologues };
        let p = plan(g, wanted, train, opts).unwrap();
        // Merged dispatches (`codegen::merge`, which has naga validate each merged module as
        // it builds it): every one validates here too, and a merge (a label joining kernels by
        // ` + `) stays within the device's storage bindings. A kernel alone may bind more where
        // the plan was made without limits (`limits: None`: a concat of 256 buffers).
        let merged = compile(g, &p, &target).unwrap();
        for prog in merged.kernels.iter().flat_map(|k| &k.programs) {
            let storage = prog
                .bindings
                .iter()
                .filter(|b| !matches!(b.resource, Resource::Uniform(_) | Resource::Meta))
                .count();
            let checked = limits.is_some() || prog.label.contains(" + ");
            if checked && storage > target.max_storage_buffers as usize {
                failures.push(format!("{}: binds {storage} storage buffers", prog.label));
            }
            n += 1;
            if let Err(e) = validate(&prog.label, &prog.wgsl) {
                failures.push(e);
            }
        }
        // Each kernel's own programs, unmerged.
        let target = Target { merge_dispatches: false, ..target };
        let programs = compile(g, &p, &target).unwrap();
        assert_eq!(programs.kernels.len(), p.kernels.len());
        for (k, kp) in p.kernels.iter().zip(&programs.kernels) {
            let counted =
                storage_bindings(g, k, &|id| p.value_of(id).unwrap().buffer, guarded(g, &p, k));
            // A matmul runs the template when it can; its generated fallback must be valid too.
            let fallback = match k.kind {
                KernelKind::MatMul { .. } => generate_counted(g, &p, k, &target),
                _ => Vec::new(),
            };
            // The matmul kernels' bounds (one for all of a product's programs) are checked
            // against their loops in `the_matmul_kernels_hold_the_loops_codegen_loops_states`.
            let on_a_tile = !matches!(kp.matmul, None | Some("generated"));
            let own = kp.programs.iter().zip(&kp.loops).filter(|_| !on_a_tile);
            for (prog, loops) in own.chain(fallback.iter().map(|(p, l)| (p, l))) {
                if let Err(e) = loops_stated(&prog.label, &prog.wgsl, prog.entry, loops) {
                    failures.push(e);
                }
            }
            let fallback: Vec<_> = fallback.into_iter().map(|(p, _)| p).collect();
            for prog in kp.programs.iter().chain(&fallback) {
                let storage = prog
                    .bindings
                    .iter()
                    .filter(|b| !matches!(b.resource, Resource::Uniform(_) | Resource::Meta))
                    .filter(|b| b.resource != Resource::Scratch { slot: EXPONENT_SLOT })
                    .count();
                if storage > counted {
                    failures.push(format!("{}: binds {storage}, counted {counted}", prog.label));
                }
                n += 1;
                if let Err(e) = validate(&prog.label, &prog.wgsl).and(formatted(&prog.wgsl)) {
                    failures.push(e);
                }
            }
        }
        for prog in &programs.commits {
            n += 1;
            let check = loops_stated(&prog.label, &prog.wgsl, prog.entry, &Loops::NONE);
            if let Err(e) = validate(&prog.label, &prog.wgsl).and(check) {
                failures.push(e);
            }
        }
    }
    n
}

#[test]
fn generated_modules_of_a_gpt_training_step_validate() {
    let mut g = Graph::new();
    let c = GptConfig { vocab: 32, d: 16, heads: 2, layers: 1, ctx: 8 };
    let logits = nn::gpt(&mut g, c, 2).unwrap();
    let target = g.input("target", &[2, 8], DType::I32).unwrap();
    let loss = g.cross_entropy(logits, target, Some(0)).unwrap();
    let cfg = OptimConfig { clip_norm: Some(1.0), ..OptimConfig::new(Optimizer::adamw()) };
    let t = training_graph(g, loss, &cfg).unwrap();
    let mut failures = Vec::new();
    let n = validate_plans(&t.graph, &[t.loss], true, &mut failures);
    assert!(n > 100, "only {n} modules checked");
    assert!(failures.is_empty(), "{} invalid modules; first:\n{}", failures.len(), failures[0]);
}

#[test]
fn generated_modules_of_every_op_case_validate() {
    let mut failures = Vec::new();
    let mut cases = common::cases();
    cases.extend(common::attention_cases());
    cases.extend(common::attention_long());
    for c in cases {
        let b = common::build(&c).unwrap();
        let mut want = vec![b.out];
        want.extend(b.grads.iter().map(|&(_, d)| d));
        validate_plans(&b.g, &want, false, &mut failures);
    }
    assert!(failures.is_empty(), "{} invalid modules; first:\n{}", failures.len(), failures[0]);
}

/// Attention beyond what the kernels take is a plan error naming the limit, not a panic or a
/// device error at run time: a head dimension above 128, and more elements than a 32-bit
/// index of dK and dV reaches.
#[test]
fn attention_beyond_the_kernels_is_an_error() {
    let table: &[(&[usize], &str)] = &[
        (
            &[1, 1, 2, 129],
            "attention: head dimension 129 is above 128, the largest the GPU kernels take; use more heads",
        ),
        (
            &[1024, 1024, 1024, 1],
            "attention: q of shape [1024, 1024, 1024, 1] has more than 2^30 elements, too many for the GPU kernels; use a smaller batch",
        ),
    ];
    for &(shape, expected) in table {
        let mut g = Graph::new();
        let q = g.input("q", shape, DType::F32).unwrap();
        let y = g.attention(q, q, q).unwrap();
        let p = plan(&g, &[y], false, PlanOptions::default()).unwrap();
        let e = compile(&g, &p, &Target::WEBGPU_DEFAULT).unwrap_err();
        assert_eq!(e.message, expected);
    }
}

/// Which kernels the products of a GPT training step get per precision mode, on a faked
/// cooperative adapter (`Target::COOPERATIVE`, what `rumus plan --matmul-precision` plans for)
/// and on one without cooperative matrices, where `high` and `medium` keep the fp32 kernels:
/// (batch, d, products, expected tiles per mode). A tiny model's products are too small to
/// pay a cooperative product's pre-passes, so the cost model gives them fp32 in every mode, on
/// the dot kernel (a few blocks of C, K = 32 to 64: K across a workgroup beats one thread of
/// the register tile walking all of it); a gpt-small-sized one (4096 rows of 256) runs every
/// product on the cooperative kernels in `high` and `medium` (their products of K = 256 or
/// less cost a wave little, as the `mlp` model's measured), and on the register tile and the
/// SIMT kernel's three tiles in fp32.
#[test]
fn each_mode_gives_every_product_its_kernel() {
    use MatmulPrecision::*;
    type Expected = [(MatmulPrecision, bool, &'static [&'static str]); 6];
    let fp32: &[&str] = &["dot"];
    let tiny: Expected = [
        (Highest, true, fp32),
        (High, true, fp32),
        (Medium, true, fp32),
        (Highest, false, fp32),
        (High, false, fp32),
        (Medium, false, fp32),
    ];
    let big_fp32: &[&str] = &["register", "simt", "simt-128x64"];
    // WebGPU's default workgroup memory (16 KiB) holds only the SIMT kernel's 128x64 tile.
    let webgpu: &[&str] = &["register", "simt-128x64"];
    let big: Expected = [
        (Highest, true, big_fp32),
        (High, true, &["coop-high"]),
        (Medium, true, &["coop-medium"]),
        (Highest, false, webgpu),
        (High, false, webgpu),
        (Medium, false, webgpu),
    ];
    let mut wrong = Vec::new();
    for (batch, d, ctx, expected) in [(4, 32, 16, tiny), (32, 256, 128, big)] {
        let c = GptConfig { vocab: 64, d, heads: 2, layers: 1, ctx };
        let (g, loss) = crate::common::gpt_loss(c, batch);
        let cfg = OptimConfig::new(Optimizer::adamw());
        let t = training_graph(g, loss, &cfg).unwrap();
        let p = plan(&t.graph, &[t.loss], true, PlanOptions::default()).unwrap();
        for (precision, coop, want) in expected {
            let matmul = MatmulOptions { precision, ..MatmulOptions::DEFAULT };
            let base = if coop { Target::COOPERATIVE } else { Target::WEBGPU_DEFAULT };
            let programs = compile(&t.graph, &p, &Target { matmul, ..base }).unwrap();
            let mut tiles: Vec<&str> = programs.kernels.iter().filter_map(|k| k.matmul).collect();
            tiles.sort_unstable();
            tiles.dedup();
            if tiles != want {
                wrong.push(format!("d {d}, {precision}, cooperative: {coop}: {tiles:?}"));
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// Every elementwise op and `where` of constant operands only (a constant is inlined as its
/// literal): the modules validate. Codegen used to write `log(-0.5)`, a WGSL const-expression
/// out of the function's domain that fails shader creation, and `(--0.5)` for `neg`, which
/// WGSL reads as a decrement.
#[test]
fn elementwise_ops_of_constants_validate() {
    use rumus::graph::{BinaryOp, UnaryOp};
    let mut g = Graph::new();
    let x = g.input("x", &[3], DType::F32).unwrap();
    let (a, b) = (g.constant(-0.5), g.constant(-2.0));
    let mut outs = Vec::new();
    for u in UnaryOp::ALL {
        let y = g.unary(u, a).unwrap();
        outs.push(g.add(x, y).unwrap());
    }
    for op in BinaryOp::ALL {
        let y = g.binary(op, a, b).unwrap();
        outs.push(g.add(x, y).unwrap());
    }
    let c = g.select(a, a, b).unwrap();
    outs.push(g.add(x, c).unwrap());
    let mut failures = Vec::new();
    validate_plans(&g, &outs, false, &mut failures);
    assert!(failures.is_empty(), "{} invalid modules; first:\n{}", failures.len(), failures[0]);
}

/// The matmul kernels' loops are stated in `codegen::loops` rather than beside their code:
/// every fp32 tile's program, each cooperative mode's (emulated and not, on each of its tiles,
/// K short enough to store straight into C and longer) conversion (with B's column sums and
/// without) and product, and the split-K sum (with and without column sums), each with the
/// identity epilogue and another, hold the loop statements `codegen::loops` counts for them.
#[test]
fn the_matmul_kernels_hold_the_loops_codegen_loops_states() {
    use rumus::codegen::loops::{coop_conversion, matmul_product, split_k_sum};
    use rumus::codegen::matmul::{self, MatmulSpec, MatmulTile, SUM_WORKGROUPS};
    use rumus::codegen::matmul_coop::CoopKernel;
    use rumus::codegen::wgsl::MatmulEpilogue;
    let epilogue = |body: &str| MatmulEpilogue {
        decls: String::new(),
        body: body.to_string(),
        extra: Vec::new(),
        loads: 0,
    };
    let buffers = || [Resource::Buffer(0), Resource::Buffer(1), Resource::Buffer(2)];
    let mut failures = Vec::new();
    let mut check = |label: &str, src: &str, entry: &str, loops: Loops| {
        if let Err(e) = loops_stated(label, src, entry, &loops) {
            failures.push(e);
        }
    };
    for (body, identity) in [("return v;", true), ("return v * 2.0;", false)] {
        let e = epilogue(body);
        for (_, tile) in matmul::FP32_TILES {
            let spec = MatmulSpec::contiguous(1, 70, 90, 300);
            let p = matmul::program(&spec, tile, Some(&e), buffers()).unwrap();
            check(&p.label, &p.wgsl, p.entry, matmul_product(tile, 300, (Loops::NONE, identity)));
        }
        for mode in [CoopMode::High, CoopMode::Medium] {
            for tile in tiles(mode) {
                for (emulate, k, sums) in
                    [(true, 300, true), (true, 1000, false), (false, 300, false)]
                {
                    let kernel = CoopKernel { mode, tile, subgroup: 32, emulate };
                    let spec = MatmulSpec::contiguous(1, 70, 90, k);
                    let t = MatmulTile::Coop(kernel);
                    let summed = sums.then_some(Resource::Buffer(3));
                    let ps =
                        matmul::programs_summing("coop", &spec, t, Some(&e), buffers(), summed)
                            .unwrap();
                    let k = u64::from(k);
                    let conversion = coop_conversion(&kernel, [1, 70, 90, k], sums);
                    check(&ps[0].label, &ps[0].wgsl, ps[0].entry, conversion);
                    let product = matmul_product(t, k, (Loops::NONE, identity));
                    check(&ps[1].label, &ps[1].wgsl, ps[1].entry, product);
                }
            }
        }
        for sums in [false, true] {
            let both = sums.then_some([Resource::Buffer(3), Resource::Buffer(4)]);
            let parts = [Resource::Scratch { slot: 0 }, Resource::Buffer(2)];
            let p = matmul::split_k_sum((70, 90, 4), parts, &e, SUM_WORKGROUPS, "sum", both);
            check(&p.label, &p.wgsl, p.entry, split_k_sum((70, 90), sums, Loops::NONE));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
