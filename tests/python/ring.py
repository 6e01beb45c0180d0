"""Ring attention (context parallelism) written with the package's operators, shared by the CPU and
GPU suites: the sequence cut into `chunks` equal chunks; chunk i's queries attend to each key chunk
they may see (under a causal mask the earlier ones whole, their own causally, the later ones not at
all), and the pairs' (out, lse) are merged by merge_states. Differentiable through autograd."""
import torch

import flashattn


def ring_attention(q, k, v, chunks, causal):
    b, s, hq, d = q.shape
    c = s // chunks
    outs = []
    for i in range(chunks):
        qi = q[:, i * c:(i + 1) * c]
        pairs = [flashattn.flash_attn_func(qi, k[:, j * c:(j + 1) * c], v[:, j * c:(j + 1) * c],
                                           causal=causal and i == j, return_lse=True)
                 for j in range(chunks) if not causal or j <= i]
        o_parts = torch.stack([o.reshape(b * c, hq, d) for o, _ in pairs])
        lse_parts = torch.stack([lse.transpose(1, 2).reshape(b * c, hq) for _, lse in pairs])
        outs.append(flashattn.merge_states(o_parts, lse_parts)[0].reshape(b, c, hq, d))
    return torch.cat(outs, dim=1)
