"""One check behind BENCHMARKS.md: PyTorch's gpt-medium (scripts/bench/torch_baselines.py) memorizes its fixed
batch in 50 steps, rumus's does not. Is that the initialization? This trains PyTorch's model twice,
with PyTorch's default initialization and with rumus's standard library's (Linear weights Xavier
uniform, biases 0, embeddings N(0, 0.02)), and prints every third loss of each. Run from the
repository root on a CUDA machine: python3 scripts/bench/torch_init_check.py"""
import sys, json, torch, torch.nn as nn
sys.path.insert(0, "scripts/bench")
import torch_baselines as tb
import torch.nn.functional as F
torch.backends.cuda.matmul.allow_tf32 = False
for init in ["torch", "rumus"]:
    torch.manual_seed(0)
    cfg = tb.MODELS["gpt-medium"]
    m = tb.GPT(cfg["V"], cfg["D"], cfg["H"], cfg["L"], cfg["T"]).cuda()
    if init == "rumus":
        for mod in m.modules():
            if isinstance(mod, nn.Linear):
                nn.init.xavier_uniform_(mod.weight); nn.init.zeros_(mod.bias)
            if isinstance(mod, nn.Embedding):
                nn.init.normal_(mod.weight, 0.0, 0.02)
    x = torch.randint(0, cfg["V"], (cfg["batch"], cfg["T"]), device="cuda")
    y = torch.randint(0, cfg["V"], (cfg["batch"], cfg["T"]), device="cuda")
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    ls = []
    for _ in range(50):
        opt.zero_grad()
        loss = F.cross_entropy(m(x).view(-1, cfg["V"]), y.view(-1)); loss.backward(); opt.step()
        ls.append(round(loss.item(), 4))
    print(init, ls[::3])
