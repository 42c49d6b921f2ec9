"""`estimate memory --serve` on a CPU against the peak memory a real engine reaches (the
process's peak resident size, VmHWM, reset after a warm-up).

Each case serves a portachat model in a fresh process: batch x context tokens of prompts, prefilled
in steps of `step_tokens`, then a few decode steps. The estimate counts weights, the packed copies the
CPU engine keeps (none beside the own CPU kernels), the KV cache and one step's activations; it must land within 15% of the peak.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from portachat.model import GPTConfig
from portachat.model.serve_memory import estimate_serving

MEASURE = r"""
import json, sys, torch
from portachat.device import get_device
from portachat.model import GPT, GPTConfig
from portachat.engine import EngineConfig, LLMEngine, SamplingParams
from portachat.engine.oneshot import TokenIdsOnly

depth, batch, ctx, step_tokens = map(int, sys.argv[1:5])
torch.set_num_threads(1)

def status(field):  # kB in /proc/self/status
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith(field + ":"))

def serve(cfg, batch, ctx, step_tokens):
    model = GPT(cfg).eval().requires_grad_(False)
    config = EngineConfig(max_model_len=ctx, max_num_seqs=batch, max_num_batched_tokens=step_tokens, dtype="fp32",
                          num_blocks=batch * ctx // 16, enable_prefix_caching=False)
    engine = LLMEngine(model, TokenIdsOnly(cfg.vocab_size), config, device=get_device("cpu"))
    prompts = torch.randint(0, cfg.vocab_size, (batch, ctx - 8), generator=torch.Generator().manual_seed(0))
    engine.generate(prompts.tolist(), SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    return engine

small = GPTConfig.from_depth(1, vocab_size=512, max_seq_len=64)
serve(small, 2, 64, 64)  # loads the kernels' libraries (and any one-off probe) first: not the model's memory
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # resets the peak (VmHWM) to the resident size now, whatever the warm-up touched
base = status("VmRSS")
engine = serve(GPTConfig.from_depth(depth, vocab_size=32768, max_seq_len=ctx), batch, ctx, step_tokens)
from portachat.ops.cpu_linear import holds_packed_copy
# Packed copies exist where the engine fuses and the device keeps MKL's layout (not beside the own kernels).
packed = engine.runner.packed is not None and holds_packed_copy("cpu", torch.float32)
print(json.dumps({"peak_bytes": status("VmHWM") - base, "packed": packed}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("depth,batch,context,step_tokens", [(8, 4, 512, 1024), (4, 8, 256, 256)])
def test_serving_estimate_is_within_15_percent_of_the_measured_peak(depth, batch, context, step_tokens):
    run = subprocess.run([sys.executable, "-c", MEASURE, str(depth), str(batch), str(context), str(step_tokens)],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    measured = json.loads(run.stdout.strip().splitlines()[-1])
    cfg = GPTConfig.from_depth(depth, vocab_size=32768, max_seq_len=context)
    est = estimate_serving(cfg, 1, "fp32", batch, context, device_type="cpu", step_tokens=step_tokens)
    assert (est["packed_weights_bytes_per_device"] > 0) == measured["packed"]  # both follow the device layer
    ratio = est["total_bytes_per_device"] / measured["peak_bytes"]
    assert 0.85 <= ratio <= 1.15, (ratio, est, measured)
