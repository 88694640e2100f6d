"""PyTorch side of BENCHMARKS.md: the same models as scripts/bench/*.rms, each trained with AdamW
on random data; the figure is the median wall time of one training step (forward, loss,
backward, optimizer step) after warm-up, and the peak CUDA memory of those steps. Run it on the
same machine, in the same session, as `rumus bench`:

    MODELS=gpt-small,gpt-medium python3 scripts/bench/torch_baselines.py eager eager-tf32 eager-bf16

First written for the H200 baselines of 2026-11 (our bench notes); kept here so every PyTorch
figure in BENCHMARKS.md can be re-run from this repository alone."""
import os, sys, time, json, math, statistics
import torch, torch.nn as nn, torch.nn.functional as F

def mlp(cfg):
    d = cfg["dims"]
    layers = []
    for i in range(len(d) - 1):
        layers.append(nn.Linear(d[i], d[i + 1]))
        if i < len(d) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)

class Block(nn.Module):
    def __init__(s, d, h):
        super().__init__()
        s.ln1, s.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        s.qkv, s.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        s.fc, s.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        s.h = h
    def forward(s, x):
        B, T, D = x.shape
        q, k, v = s.qkv(s.ln1(x)).split(D, dim=2)
        q, k, v = (t.view(B, T, s.h, D // s.h).transpose(1, 2) for t in (q, k, v))
        if SDPA:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(D // s.h)
            mask = torch.triu(torch.ones(T, T, device=x.device, dtype=torch.bool), 1)
            att = att.masked_fill(mask, float("-inf")).softmax(-1)
            y = att @ v
        y = y.transpose(1, 2).reshape(B, T, D)
        x = x + s.proj(y)
        return x + s.out(F.gelu(s.fc(s.ln2(x)), approximate="tanh"))

class GPT(nn.Module):
    def __init__(s, V, D, H, L, T):
        super().__init__()
        s.wte, s.wpe = nn.Embedding(V, D), nn.Embedding(T, D)
        s.blocks = nn.ModuleList(Block(D, H) for _ in range(L))
        s.lnf, s.head = nn.LayerNorm(D), nn.Linear(D, V)
    def forward(s, idx):
        x = s.wte(idx) + s.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in s.blocks:
            x = b(x)
        return s.head(s.lnf(x))

SDPA = False  # set per mode in bench(): the "best" modes use fused attention

MODELS = {
    "mlp":        dict(kind="mlp", dims=[784, 1024, 1024, 10], batch=128),
    "gpt-small":  dict(kind="gpt", V=256, D=256, H=8, L=4, T=128, batch=32),
    "gpt-medium": dict(kind="gpt", V=256, D=768, H=12, L=12, T=256, batch=16),
}

def bench(name, mode, steps=40, warm=10):
    global SDPA
    cfg = MODELS[name]
    SDPA = mode.endswith("best")
    torch.manual_seed(0)
    if cfg["kind"] == "mlp":
        model = mlp(cfg).cuda()
        x = torch.randn(cfg["batch"], cfg["dims"][0], device="cuda")
        y = torch.randint(0, cfg["dims"][-1], (cfg["batch"],), device="cuda")
        loss_fn = lambda: F.cross_entropy(model(x), y)
    else:
        model = GPT(cfg["V"], cfg["D"], cfg["H"], cfg["L"], cfg["T"]).cuda()
        x = torch.randint(0, cfg["V"], (cfg["batch"], cfg["T"]), device="cuda")
        y = torch.randint(0, cfg["V"], (cfg["batch"], cfg["T"]), device="cuda")
        loss_fn = lambda: F.cross_entropy(model(x).view(-1, cfg["V"]), y.view(-1))
    best = mode.endswith("best")  # the strongest recipe: bf16 autocast, SDPA attention, fused AdamW
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=best, foreach=not best)
    torch.backends.cuda.matmul.allow_tf32 = mode == "eager-tf32"
    torch.backends.cudnn.allow_tf32 = mode == "eager-tf32"
    amp = mode in ("eager-bf16", "eager-best", "compile-best")
    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            loss = loss_fn()
        loss.backward()
        opt.step()
        return loss
    if not mode.startswith("eager"):
        step = torch.compile(step, mode="reduce-overhead" if mode == "reduce-overhead" else None)
    if os.environ.get("LOSSES"):
        # Every step's loss (warm-up included, as `rumus bench --json`'s `losses`), read back after
        # each step: for comparing precision modes' trajectories, not for timing.
        losses = [step().item() for _ in range(warm + steps)]
        return dict(model=name, mode=mode, losses=losses)
    t0 = time.perf_counter()
    for _ in range(warm):
        step()
    torch.cuda.synchronize()
    warm_s = time.perf_counter() - t0
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return dict(model=name, mode=mode, step_ms=round(statistics.median(times) * 1e3, 3),
                peak_mib=round(torch.cuda.max_memory_allocated() / 2**20, 1),
                params=sum(p.numel() for p in model.parameters()), warmup_s=round(warm_s, 1))

def layer_norm_bw(N=32768, D=1024, reps=50):
    x = torch.randn(N, D, device="cuda", requires_grad=True)
    ln = nn.LayerNorm(D).cuda()
    g = torch.randn(N, D, device="cuda")
    for _ in range(5):
        ln(x).backward(g)
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(reps):
        y = ln(x); y.backward(g)
    torch.cuda.synchronize(); dt = (time.perf_counter() - t) / reps
    # minimal traffic: fwd reads x writes y; bwd reads x, g, writes dx (weights negligible)
    return dict(bench="layernorm_fwd_bwd", N=N, D=D, ms=round(dt * 1e3, 3), GBps=round(5 * N * D * 4 / dt / 1e9))

def matmul(n=4096, tf32=False, dtype=torch.float32):
    torch.backends.cuda.matmul.allow_tf32 = tf32
    a = torch.randn(n, n, device="cuda", dtype=dtype); b = torch.randn(n, n, device="cuda", dtype=dtype)
    for _ in range(3): a @ b
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(10): a @ b
    torch.cuda.synchronize(); dt = (time.perf_counter() - t) / 10
    return dict(bench="matmul", n=n, tf32=tf32, dtype=str(dtype), TFLOPs=round(2 * n**3 / dt / 1e12, 2))

if __name__ == "__main__":
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    # modes: eager (fp32, TF32 off), eager-tf32, eager-bf16 (autocast), eager-best (bf16 autocast +
    # SDPA attention + fused AdamW), compile, compile-best, reduce-overhead (CUDA graphs)
    # MODELS=mlp,gpt-small limits the models; NO_KERNELS=1 skips the kernel figures; LOSSES=1
    # prints each step's loss instead of timing
    modes = sys.argv[1:] or ["eager", "compile", "reduce-overhead"]
    out = [] if os.environ.get("NO_KERNELS") else [
        matmul(4096, False), matmul(4096, True), matmul(4096, False, torch.float16),
        matmul(4096, False, torch.bfloat16), layer_norm_bw()]
    for r in out:
        print(json.dumps(r), flush=True)
    only = os.environ.get("MODELS")
    torch.backends.cuda.matmul.allow_tf32 = False
    for m in MODELS:
        if only and m not in only.split(","):
            continue
        for mode in modes:
            try:
                out.append(bench(m, mode))
            except Exception as e:
                out.append(dict(model=m, mode=mode, error=str(e)[:300]))
            print(json.dumps(out[-1]), flush=True)
    print(json.dumps(out))
