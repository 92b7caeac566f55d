"""The values a prediction knows (memviz.predictor.values): small tensors from host data and factories computed on
the host beside their meta tensors; unknown values read as zeros, with a note; an assertion holds. Each program
asserts inside itself what a GPU run of it would see (the prediction runs it)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import memviz  # noqa: E402
from memviz.predictor.values import READ_BYTES  # noqa: E402


def _zero_read_notes(p: memviz.predictor.Prediction) -> list[str]:
    return [n for n in p.notes if "read as zeros" in n]


def test_values_from_factories_and_host_data_are_the_real_ones() -> None:
    def prog() -> None:
        ids = torch.tensor([[5, 7, 0, 0], [3, 0, 0, 0]]).to("cuda")
        mask = (ids != 0).long()
        assert mask.tolist() == [[1, 1, 0, 0], [1, 0, 0, 0]]
        positions = mask.cumsum(-1) - 1
        assert positions.cpu().tolist() == [[0, 1, 1, 1], [0, 0, 0, 0]]
        assert torch.arange(6, device="cuda").view(2, 3).sum().item() == 15
        assert bool((torch.ones(3, device="cuda") == 1).all())
        m = torch.ones(4, device="cuda")
        m[1] = 0
        m[2:].zero_()  # a view writes into its base
        assert m.tolist() == [1.0, 0.0, 0.0, 0.0]

    p = memviz.predict(prog, device="H200")
    assert p.fits and _zero_read_notes(p) == []


def test_unknown_values_read_as_zeros_with_a_note_naming_the_line() -> None:
    def prog() -> None:
        lin = torch.nn.Linear(64, 64).cuda()  # its initialisation is skipped: its values are not computed
        loss = lin(torch.randn(8, 64, device="cuda")).pow(2).mean()
        assert loss.item() == 0.0
        loss.backward()

    p = memviz.predict(prog, device="H200")
    notes = _zero_read_notes(p)
    assert len(notes) == 1 and "the first _local_scalar_dense.default at" in notes[0]
    assert "test_predict_values.py:" in notes[0]


def test_a_mask_selects_what_its_values_select() -> None:
    """``x[mask]`` with a known mask and an unknown ``x``: the GPU's index kernel runs ``nonzero`` on the mask
    (int64 positions) and gathers that many rows; so does the prediction."""
    def prog() -> None:
        x = torch.nn.Embedding(100, 256).cuda()(torch.zeros(4, 16, dtype=torch.long, device="cuda"))
        labels = torch.full((4, 16), -100, device="cuda")
        labels[:, :5] = 1
        picked = x[labels != -100]
        assert picked.shape == (20, 256)
        assert torch.masked_select(labels, labels > 0).shape == (20,)
        assert (labels > 0).nonzero().shape == (20, 2)

    p = memviz.predict(prog, device="H200")
    allocs = [e.nbytes for e in p.events if e.action == "alloc"]
    assert 20 * 2 * 8 in allocs and 20 * 256 * 4 in allocs  # the positions (x[mask]'s nonzero), the rows
    assert _zero_read_notes(p) == []


def test_a_mask_of_unknown_values_selects_nothing() -> None:
    def prog() -> None:
        x = torch.nn.Linear(8, 8).cuda()(torch.randn(4, 8, device="cuda"))
        assert x[x > 0].shape == (0,)

    assert len(_zero_read_notes(memviz.predict(prog, device="H200"))) == 1


def test_greedy_generation_of_unknown_tokens_runs_to_the_end() -> None:
    """A generate()-style loop: the next token is an argmax of logits the prediction does not compute (zeros),
    so no sequence meets its end token (2) and every step runs, growing the cache."""
    steps = []

    def prog() -> None:
        head = torch.nn.Linear(32, 50).cuda()
        tokens = torch.ones(2, 3, dtype=torch.long, device="cuda")
        unfinished = torch.ones(2, dtype=torch.long, device="cuda")
        for _ in range(6):
            logits = head(torch.randn(2, 32, device="cuda"))
            next_tokens = logits.argmax(-1) * unfinished
            tokens = torch.cat([tokens, next_tokens[:, None]], dim=-1)
            unfinished = unfinished & ~(next_tokens == 2)
            steps.append(tokens.shape[1])
            if unfinished.max() == 0:
                break

    memviz.predict(prog, device="H200")
    assert steps == [4, 5, 6, 7, 8, 9]


def test_a_known_stop_still_stops_when_it_meets_unknown_values() -> None:
    """generate()'s stopping criteria: ``done = max_length_reached | eos_seen``, the first known, the second on
    tokens the prediction does not compute. The unknown tokens are taken as zeros where they meet the known flag,
    so the length limit stops the loop (it ran forever when the whole ``|`` was unknown)."""
    steps = []

    def prog() -> None:
        head = torch.nn.Linear(32, 50).cuda()
        tokens = torch.ones(2, 3, dtype=torch.long, device="cuda")
        unfinished = torch.ones(2, dtype=torch.long, device="cuda")
        while True:
            next_tokens = head(torch.randn(2, 32, device="cuda")).argmax(-1)
            tokens = torch.cat([tokens, next_tokens[:, None]], dim=-1)
            at_limit = torch.full((2,), tokens.shape[1] >= 8, dtype=torch.bool, device="cuda")
            done = at_limit | torch.isin(tokens[:, -1], torch.tensor([2], device="cuda"))
            unfinished = unfinished & ~done
            steps.append(tokens.shape[1])
            if unfinished.max() == 0:
                break

    p = memviz.predict(prog, device="H200")
    assert steps == [4, 5, 6, 7, 8] and len(_zero_read_notes(p)) == 1


def test_a_decision_on_computed_numbers_keeps_a_beam_search_going_to_its_limit() -> None:
    """Beam search's stop test (transformers' ``_check_early_stop_heuristic``): ``unsatisfied & any(running_scores >
    worst_finished)``, the first flag known, the comparison on scores the prediction does not compute. That
    boolean is a decision on a model's numbers: where it meets the known flag it is taken as True, so the loop
    runs to its length limit (with zeros it stopped after one step, the cache a third of the GPU's), and the
    prediction says so apart from the zero reads."""
    steps = []

    def prog() -> None:
        head = torch.nn.Linear(32, 8).cuda()
        unsatisfied = torch.ones(2, 1, dtype=torch.bool, device="cuda")
        worst_finished = torch.full((2, 1), -1e9, device="cuda")
        for step in range(6):
            running_scores = head(torch.randn(2, 32, device="cuda")).log_softmax(-1)
            unsatisfied = unsatisfied & torch.any(running_scores > worst_finished, dim=-1, keepdim=True)
            steps.append(step)
            if not torch.any(unsatisfied):
                break

    p = memviz.predict(prog, device="H200")
    assert steps == [0, 1, 2, 3, 4, 5]
    assert len([n for n in p.notes if "decisions on numbers the model computes were taken as true" in n]) == 1


def test_an_assertion_on_unknown_values_holds() -> None:
    """A distribution validates its arguments (``torch._is_all_true``): on values the prediction does not compute
    the check holds, as in a healthy run; on known values it is the real check."""
    def prog(bad: bool) -> None:
        net = torch.nn.Linear(16, 4).cuda()
        scale = net(torch.randn(8, 16, device="cuda")).exp()
        torch.distributions.Normal(torch.zeros(8, 4, device="cuda"), scale).rsample().sum().backward()
        if bad:
            torch.distributions.Normal(0.0, torch.full((3,), -1.0, device="cuda"))

    assert memviz.predict(prog, False, device="H200").fits
    with pytest.raises(ValueError, match="scale"):
        memviz.predict(prog, True, device="H200")


def test_grad_scaler_sees_a_healthy_step() -> None:
    def prog() -> None:
        net = torch.nn.Linear(64, 64).cuda()
        opt = torch.optim.AdamW(net.parameters())
        scaler = torch.amp.GradScaler("cuda")
        for _ in range(2):
            with torch.autocast("cuda", dtype=torch.float16):
                loss = net(torch.randn(8, 64, device="cuda")).float().mean()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
        assert scaler.get_scale() == 65536.0  # no overflow: the scale stays
        assert len(opt.state) == 2  # the step was taken

    assert memviz.predict(prog, device="H200").fits


def test_a_read_too_large_to_fill_is_refused() -> None:
    def prog() -> None:
        big = torch.nn.Linear(8, READ_BYTES // 4 // 8 + 1024, bias=False).cuda().weight
        (big * 2).sum(0).tolist()  # a few KiB: read as zeros
        (big * 2).tolist()  # more than READ_BYTES: refused

    with pytest.raises(memviz.DataDependentError, match=r"tolist.*test_predict_values.py:\d+"):
        memviz.predict(prog, device="H200")
