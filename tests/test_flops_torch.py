"""Independent checks with torch: parameter counts of a model built on the meta device, and FLOPs
counted by torch.utils.flop_counter.FlopCounterMode over a real forward + backward on CPU.

The reference model below is written from the architecture description in perfgate.flops.config, not
from the library's counting code.
"""

from __future__ import annotations

from typing import Any

import pytest

from perfgate.flops import ModelConfig, MoEConfig, count_parameters, estimate_flops

torch = pytest.importorskip("torch")
nn = torch.nn


class Mlp(nn.Module):
    def __init__(self, h: int, f: int, swiglu: bool) -> None:
        super().__init__()
        self.swiglu = swiglu
        self.up = nn.Linear(h, f, bias=False)
        self.gate = nn.Linear(h, f, bias=False) if swiglu else None
        self.down = nn.Linear(f, h, bias=False)

    def forward(self, x: Any) -> Any:
        if self.gate is not None:
            return self.down(nn.functional.silu(self.gate(x)) * self.up(x))
        return self.down(nn.functional.gelu(self.up(x)))


class Moe(nn.Module):
    def __init__(self, cfg: ModelConfig, moe: MoEConfig) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.top_k = moe.top_k
        self.router = nn.Linear(h, moe.num_experts, bias=False)
        width = moe.moe_ffn_hidden_size or cfg.ffn_hidden_size
        self.experts = nn.ModuleList(Mlp(h, width, cfg.swiglu) for _ in range(moe.num_experts))
        shared = moe.shared_expert_ffn_hidden_size
        self.shared = Mlp(h, shared, cfg.swiglu) if shared else None

    def forward(self, x: Any) -> Any:
        probs = torch.softmax(self.router(x), dim=-1)
        weight, chosen = torch.topk(probs, self.top_k, dim=-1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            token, slot = torch.nonzero(chosen == e, as_tuple=True)
            if token.numel():
                out = out.index_add(0, token, expert(x[token]) * weight[token, slot, None])
        if self.shared is not None:
            out = out + self.shared(x)
        return out


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, moe_layer: bool, seq: int) -> None:
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim or cfg.hidden_size // cfg.num_attention_heads
        self.heads, self.d, self.seq = cfg.num_attention_heads, d, seq
        self.groups = cfg.num_kv_heads or cfg.num_attention_heads
        self.norm1 = nn.RMSNorm(h)
        self.q = nn.Linear(h, self.heads * d, bias=False)
        self.k = nn.Linear(h, self.groups * d, bias=False)
        self.v = nn.Linear(h, self.groups * d, bias=False)
        self.o = nn.Linear(self.heads * d, h, bias=False)
        self.norm2 = nn.RMSNorm(h)
        if moe_layer:
            assert cfg.moe is not None
            self.mlp: nn.Module = Moe(cfg, cfg.moe)
        else:
            self.mlp = Mlp(h, cfg.ffn_hidden_size, cfg.swiglu)

    def _split(self, t: Any, n: int) -> Any:
        # (batch*seq, n*d) -> (batch*n, seq, d), repeating kv heads up to the query heads
        b = t.shape[0] // self.seq
        t = t.view(b, self.seq, n, self.d).transpose(1, 2)
        if n != self.heads:
            t = t.repeat_interleave(self.heads // n, dim=1)
        return t.reshape(b * self.heads, self.seq, self.d)

    def forward(self, x: Any) -> Any:
        y = self.norm1(x)
        q, k, v = (
            self._split(self.q(y), self.heads),
            self._split(self.k(y), self.groups),
            self._split(self.v(y), self.groups),
        )
        scores = torch.bmm(q, k.transpose(1, 2)) / self.d**0.5
        mask = torch.ones(self.seq, self.seq, dtype=torch.bool).tril()
        p = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        ctx = torch.bmm(p, v)
        b = ctx.shape[0] // self.heads
        ctx = (
            ctx.view(b, self.heads, self.seq, self.d)
            .transpose(1, 2)
            .reshape(b * self.seq, self.heads * self.d)
        )
        x = x + self.o(ctx)
        return x + self.mlp(self.norm2(x))


class Decoder(nn.Module):
    def __init__(self, cfg: ModelConfig, seq: int) -> None:
        super().__init__()
        freq = cfg.moe.moe_layer_frequency if cfg.moe else 0
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.blocks = nn.ModuleList(
            Block(cfg, cfg.moe is not None and i % freq == 0, seq) for i in range(cfg.layers)
        )
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.head.weight = self.embed.weight

    def forward(self, ids: Any) -> Any:
        x = self.embed(ids.flatten())
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


DENSE = ModelConfig(
    layers=3,
    hidden_size=48,
    ffn_hidden_size=80,
    num_attention_heads=6,
    num_kv_heads=2,
    vocab_size=97,
    swiglu=True,
)
MOE = ModelConfig(
    layers=4,
    hidden_size=32,
    ffn_hidden_size=64,
    num_attention_heads=4,
    num_kv_heads=2,
    vocab_size=101,
    swiglu=True,
    tie_embeddings=True,
    moe=MoEConfig(
        num_experts=6,
        top_k=2,
        moe_ffn_hidden_size=24,
        shared_expert_ffn_hidden_size=40,
        moe_layer_frequency=2,
    ),
)
GELU = ModelConfig(
    layers=2, hidden_size=32, ffn_hidden_size=128, num_attention_heads=4, vocab_size=50, swiglu=False
)


@pytest.mark.parametrize("cfg", [DENSE, MOE, GELU], ids=["dense-gqa-swiglu", "moe-tied-shared", "dense-gelu"])
def test_parameter_count_matches_a_model_built_on_the_meta_device(cfg: ModelConfig) -> None:
    with torch.device("meta"):
        model = Decoder(cfg, seq=8)
    named = dict(model.named_parameters())  # tied weights appear once
    counted = count_parameters(cfg)
    assert sum(p.numel() for p in named.values()) == counted.total
    experts = sum(p.numel() for n, p in named.items() if ".experts." in n)
    assert experts == counted.expert_total
    assert named["embed.weight"].numel() == counted.input_embedding


@pytest.mark.parametrize("cfg", [DENSE, MOE, GELU], ids=["dense-gqa-swiglu", "moe-tied-shared", "dense-gelu"])
def test_palm_flops_equal_flop_counter_mode_over_forward_and_backward(cfg: ModelConfig) -> None:
    from torch.utils.flop_counter import FlopCounterMode

    seq, batch = 16, 3
    torch.manual_seed(0)
    model = Decoder(cfg, seq=seq)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq))
    counter = FlopCounterMode(display=False)
    with counter:
        model(ids).float().square().mean().backward()
    counts = counter.get_flop_counts()["Global"]
    # FlopCounterMode counts every matmul at 2mnk, forward and both backward products, and does not
    # discount the causal mask: the PaLM convention exactly (top-k routing sends each token to k experts).
    palm = estimate_flops(cfg, seq_len=seq, tokens_per_step=batch * seq, convention="palm")
    assert counter.get_total_flops() == palm.model_flops_per_step
    # Attention's bmm FLOPs are core attention; Megatron counts half of them and no router.
    core = counts[torch.ops.aten.bmm]
    assert core == palm.breakdown.core_attention
    megatron = estimate_flops(cfg, seq_len=seq, tokens_per_step=batch * seq, convention="megatron")
    assert megatron.model_flops_per_step == counter.get_total_flops() - core // 2 - palm.breakdown.router
