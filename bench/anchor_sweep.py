"""The anchors' sweep (shared/anchors/README.md) that the side-by-side scripts walk: bf16, a fixed
number of tokens in total (batch = tokens // seqlen), hidden 2048 (heads = hidden // d; --hidden
for other shapes), causal and not; and the FLOP counts their TFLOP/s use (forward 4*b*h*s*s*d,
halved when causal; backward 2.5x that)."""

HIDDEN = 2048


def add_sweep_args(p, seqlens, head_dims="64,128,256", lib=True):
    """The sweep's command-line options (comma-separated lists), and --lib unless lib is False."""
    if lib:
        p.add_argument("--lib", default="build/libflashattn.so")
    p.add_argument("--d", default=head_dims)
    p.add_argument("--s", default=seqlens)
    p.add_argument("--causal", default="0,1")
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--hidden", type=int, default=HIDDEN, help="heads = hidden / d (the anchors: 2048)")


def ints(csv):
    return [int(x) for x in csv.split(",") if x]


def shapes(a):
    """(d, causal, s, batch, heads) for every point of the parsed options' sweep, d slowest."""
    for d in ints(a.d):
        for causal in ints(a.causal):
            for s in ints(a.s):
                yield d, causal, s, max(1, a.tokens // s), a.hidden // d


def flops(b, h, s, d, causal, mode="fwd"):
    return 4 * b * h * s * s * d * (0.5 if causal else 1.0) * (2.5 if mode == "bwd" else 1.0)
