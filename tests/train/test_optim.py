import torch

from portachat.model import GPT, GPTConfig
from portachat.train.optim import Muon, OptimConfig, build_optimizers, newton_schulz
from portachat.train.schedule import lr_multiplier, muon_momentum


def test_newton_schulz_orthogonalizes():
    torch.manual_seed(0)
    for shape in [(32, 64), (64, 32), (48, 48)]:
        g = torch.randn(*shape)
        s = torch.linalg.svdvals(newton_schulz(g, steps=5, dtype=torch.float32))
        # Muon's quintic iteration lands singular values in roughly [0.7, 1.2], not exactly 1.
        assert s.min() > 0.5 and s.max() < 1.3, (shape, s.min(), s.max())


def test_muon_rejects_vectors():
    try:
        Muon([torch.nn.Parameter(torch.zeros(4))])
    except ValueError as exc:
        assert "2-D" in str(exc)
    else:
        raise AssertionError("Muon accepted a 1-D parameter")


def test_every_parameter_in_exactly_one_optimizer():
    for tied in (False, True):
        cfg = GPTConfig(vocab_size=64, n_layer=2, n_embd=32, n_head=2, n_kv_head=1, head_dim=16,
                        intermediate_size=64, max_seq_len=16, tie_embeddings=tied)
        model = GPT(cfg)
        opts = build_optimizers(model, OptimConfig(), model_dim=32, ns_dtype=torch.float32, fused=False)
        seen = [id(p) for o in opts for g in o.param_groups for p in g["params"]]
        assert len(seen) == len(set(seen))
        assert set(seen) == {id(p) for p in model.parameters()}
        assert all("initial_lr" in g for o in opts for g in o.param_groups)


def test_optimizers_reduce_loss_on_a_fixed_batch():
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=64, n_layer=2, n_embd=32, n_head=2, n_kv_head=2, head_dim=16,
                    intermediate_size=64, max_seq_len=16)
    model = GPT(cfg)
    opts = build_optimizers(model, OptimConfig(), model_dim=32, ns_dtype=torch.float32, fused=False)
    x = torch.randint(0, 64, (4, 16))
    first = None
    for _ in range(30):
        loss = model(x, x)
        first = first if first is not None else loss.item()
        loss.backward()
        for o in opts:
            o.step()
            o.zero_grad()
    assert loss.item() < 0.5 * first


def test_lr_schedule_shape():
    total = 100
    assert lr_multiplier(0, total, 0.1, 0.2, 0.0) == 0.1
    assert lr_multiplier(9, total, 0.1, 0.2, 0.0) == 1.0
    assert lr_multiplier(50, total, 0.1, 0.2, 0.0) == 1.0
    assert lr_multiplier(90, total, 0.1, 0.2, 0.0) == 0.5
    assert lr_multiplier(100, total, 0.1, 0.2, 0.1) == 0.1
    assert muon_momentum(0) == 0.85 and abs(muon_momentum(300) - 0.95) < 1e-12


def test_batched_newton_schulz_equals_one_by_one():
    torch.manual_seed(0)
    g = torch.randn(3, 24, 40)
    batched = newton_schulz(g, dtype=torch.float32)
    for i in range(3):
        assert torch.allclose(batched[i], newton_schulz(g[i], dtype=torch.float32), atol=1e-5)
