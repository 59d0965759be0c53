"""The generation engine against an uncached reference loop, Hugging Face generate, and bad input."""

from functools import partial

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from halluc_lab.generation import decoding, engine_graphs, sampling
from halluc_lab.generation import engine as engine_module
from halluc_lab.generation import engine_core
from halluc_lab.generation.backtrack import rollout
from halluc_lab.generation.engine import Engine, SamplingParams, engine_for, generate
from halluc_lab.model import attention, positional
from halluc_lab.model.hf_convert import to_hf
from halluc_lab.model.config import ModelConfig
from halluc_lab.model.transformer import Transformer
from halluc_lab.model.positional import RopeScaling
from tests.unit._tiny_lm import DECODING, small_transformer

V = 61
GREEDY = SamplingParams(greedy=True)
TOP_P = SamplingParams(temperature=0.8, top_p=0.9)


tiny = partial(small_transformer, V, **DECODING)  # tiny(seed=0, n_kv_heads=2, rope_scaling=None)


def prompts(n=4, seed=0, lengths=(5, 2, 7, 1)):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, V, (lengths[i % len(lengths)],), generator=g).tolist() for i in range(n)]


@torch.no_grad()
def reference(model, prompts, actions, params, generator=None, stop_tokens=(), max_new=100):
    """The uncached loop (000 §6.1): re-run the model on every whole sequence at every step.

    ``actions``: ("step", {row: forced token}) or ("rollback", rows, n). Returns tokens, log-probs and
    sampled flags per row, drawing from ``generator`` exactly as the engine does (one (B, V) draw a step).
    """
    seqs, out = [list(p) for p in prompts], [[] for _ in prompts]
    done = [False] * len(prompts)
    device = next(model.parameters()).device
    for action in actions:
        if action[0] == "rollback":
            _, rows, n = action
            for r in rows:
                del seqs[r][len(seqs[r]) - n:]
                del out[r][len(out[r]) - n:]
                done[r] = False
            continue
        force = action[1]
        logits = torch.stack([model(torch.tensor(s, device=device)[None])[0, -1] for s in seqs])  # (B, V)
        logp = sampling.log_softmax(logits)
        if params.greedy:
            choice = sampling.greedy(logits)
        else:
            choice = sampling.sample(logits, params.temperature, params.top_k, params.top_p, generator)
        for b in range(len(seqs)):
            if done[b]:
                continue
            tok = force.get(b, int(choice[b]))
            seqs[b].append(tok)
            out[b].append((tok, float(logp[b, tok]), b not in force))
            done[b] = tok in stop_tokens or len(out[b]) >= max_new
    return out


def run_engine(model, prompts, actions, params, generator=None, stop_tokens=(), max_new=100, batch=None, n_samples=1):
    eng = Engine(model, batch or len(prompts) * n_samples, 128)
    eng.start(prompts, max_new, params, stop_tokens=stop_tokens, generator=generator, n_samples=n_samples)
    for action in actions:
        if action[0] == "rollback":
            eng.rollback(action[1], action[2])
        else:
            eng.step(force=action[1])
    res = eng.result()
    return [list(zip(t, lp, s))[:n] for t, lp, s, n in zip(res.tokens.tolist(), res.logprobs.tolist(),
                                                           res.sampled_mask.tolist(), res.lengths.tolist())], eng


def assert_same(got, want):
    assert [[t for t, _, _ in row] for row in got] == [[t for t, _, _ in row] for row in want]
    assert [[s for _, _, s in row] for row in got] == [[s for _, _, s in row] for row in want]
    for g_row, w_row in zip(got, want):
        for (_, a, _), (_, b, _) in zip(g_row, w_row):
            assert abs(a - b) < 1e-4


STEPS = [("step", {})] * 6
WITH_ROLLBACKS = STEPS + [("rollback", [0, 2], 2)] + STEPS[:3] + [("rollback", [1], 5)] + STEPS


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1], ids=["MHA", "GQA", "MQA"])
@pytest.mark.parametrize("scaling", [None, RopeScaling("yarn", 4.0, original_max_positions=16)],
                         ids=["plain", "yarn"])
@pytest.mark.parametrize("params", [GREEDY, TOP_P], ids=["greedy", "top_p"])
@pytest.mark.parametrize("actions", [STEPS, WITH_ROLLBACKS], ids=["steps", "rollbacks"])
def test_cached_and_uncached_generation_give_identical_tokens(n_kv_heads, scaling, params, actions):
    model, ps = tiny(n_kv_heads=n_kv_heads, rope_scaling=scaling), prompts()
    got, _ = run_engine(model, ps, actions, params, torch.Generator().manual_seed(7))
    want = reference(model, ps, actions, params, torch.Generator().manual_seed(7))
    assert_same(got, want)


def test_forced_tokens_are_taken_marked_and_scored():
    model, ps = tiny(), prompts()
    actions = STEPS[:2] + [("step", {0: 5, 3: 9})] + STEPS[:2] + [("step", {1: 0})]
    got, _ = run_engine(model, ps, actions, TOP_P, torch.Generator().manual_seed(1))
    want = reference(model, ps, actions, TOP_P, torch.Generator().manual_seed(1))
    assert_same(got, want)
    assert got[0][2][0] == 5 and got[0][2][2] is False and got[3][2][0] == 9


def test_stop_tokens_end_a_row_and_are_kept():
    model, ps = tiny(), prompts()
    free = reference(model, ps, STEPS * 2, GREEDY)
    stop = free[0][3][0]  # a token row 0 emits at its fourth step
    got, eng = run_engine(model, ps, STEPS * 2, GREEDY, stop_tokens=(stop,))
    want = reference(model, ps, STEPS * 2, GREEDY, stop_tokens=(stop,))
    assert_same(got, want)
    assert got[0][-1][0] == stop and len(got[0]) <= 4
    res = eng.result()
    assert res.stopped.tolist() == [row[-1][0] == stop for row in got]


def test_rows_stop_after_max_new_tokens_and_run_finishes_them():
    model = tiny()
    eng = Engine(model, 4, 64)
    eng.start(prompts(), 9, GREEDY)
    eng.run()
    assert eng.done and eng.result().lengths.tolist() == [9, 9, 9, 9]
    assert eng.result().token_lists() == [[t for t, _, _ in row] for row in reference(model, prompts(), STEPS * 2, GREEDY, max_new=9)]


def test_rollback_of_everything_generated_returns_to_the_prompt():
    model, ps = tiny(), prompts()
    actions = STEPS[:4] + [("rollback", [0, 1, 2, 3], 4)] + STEPS[:3]
    got, eng = run_engine(model, ps, actions, GREEDY)
    assert_same(got, reference(model, ps, STEPS[:3], GREEDY))
    assert eng.cache.lengths.tolist() == [len(p) + 3 - 1 for p in ps]


def test_engine_greedy_tokens_equal_hugging_face_generate():
    model = tiny(rope_scaling=RopeScaling("linear", 2.0))
    hf = to_hf(model)
    x = torch.randint(0, V, (4, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=20, min_new_tokens=20,
                           do_sample=False, pad_token_id=0)[:, 9:]
    assert generate(model, x.tolist(), 20, sampling=GREEDY).token_lists() == want.tolist()


def test_generate_with_ragged_prompts_matches_each_row_alone():
    model, ps = tiny(), prompts(3)
    res = generate(model, ps, 8, sampling=GREEDY)
    for p, row in zip(ps, res.token_lists()):
        alone = decoding.decode(lambda t: model(t)[:, -1], torch.tensor(p), 8)
        assert row == alone[len(p):].tolist()


def test_same_generator_state_same_tokens_and_the_generator_advances():
    model, ps = tiny(), prompts()
    g = torch.Generator().manual_seed(11)
    first = generate(model, ps, 12, sampling=SamplingParams(top_k=10), generator=g).token_lists()
    second = generate(model, ps, 12, sampling=SamplingParams(top_k=10), generator=g).token_lists()
    again = generate(model, ps, 12, sampling=SamplingParams(top_k=10),
                     generator=torch.Generator().manual_seed(11)).token_lists()
    assert first == again and first != second


def test_generate_reuses_one_engine_per_bucket():
    model = tiny()
    generate(model, prompts(3), 4, sampling=GREEDY)
    eng = engine_for(model, 3, 11)
    assert eng.batch_size == 4 and eng.max_positions == 64
    assert engine_for(model, 4, 40) is eng


def test_engines_of_another_kind_or_options_are_cached_apart():
    from halluc_lab.generation.backtrack import BacktrackEngine

    model = tiny()
    plain = engine_for(model, 4, 40)
    keep = engine_for(model, 4, 40, engine_type=BacktrackEngine, bksp_id=3, context="keep")
    erase = engine_for(model, 4, 40, engine_type=BacktrackEngine, bksp_id=3, context="erase")
    assert type(plain) is Engine and isinstance(keep, BacktrackEngine) and keep is not erase
    assert (keep.context, erase.context) == ("keep", "erase")
    assert engine_for(model, 3, 20, engine_type=BacktrackEngine, bksp_id=3, context="keep") is keep
    assert engine_for(model, 4, 40) is plain


def test_logprobs_are_the_models_at_temperature_one():
    model, ps = tiny(), prompts(2)
    res = generate(model, ps, 5, sampling=SamplingParams(temperature=0.3),
                   generator=torch.Generator().manual_seed(0))
    for p, toks, lps in zip(ps, res.token_lists(), res.logprobs.tolist()):
        seq = torch.tensor(p + toks)[None]
        with torch.no_grad():
            logp = torch.log_softmax(model(seq)[0, len(p) - 1:-1], dim=-1)  # (5, V)
        torch.testing.assert_close(torch.tensor(lps), logp[torch.arange(5), torch.tensor(toks)], atol=1e-4, rtol=0)


def snapshot(eng):
    return [t.clone() for t in (eng.cache.lengths, eng.cache.k, eng.cache.v, eng.n_out, eng.tok, eng.finished)]


def unchanged(eng, before):
    return all(torch.equal(a, b) for a, b in zip(snapshot(eng), before))


@pytest.mark.parametrize("call, match", [
    (lambda e: e.start([[1] * 60], 10, GREEDY), "longer than the cache"),
    (lambda e: e.start([[1]] * 5, 3, GREEDY), "rows"),
    (lambda e: e.start([[1, 2]], 3, GREEDY, stop_tokens=(V,)), "unknown stop token"),
    (lambda e: e.start([[1, V]], 3, GREEDY), "outside"),
    (lambda e: e.start([[]], 3, GREEDY), "empty"),
    (lambda e: e.start([[1]], 3, SamplingParams(top_p=1.5)), "p must be"),
    (lambda e: e.start([[1]], 3, SamplingParams(temperature=0.0)), "temperature"),
    (lambda e: e.rollback([0], 3), "cannot reach into the prompt"),
    (lambda e: e.rollback([4], 1), "rows"),
    (lambda e: e.step(force={0: V}), "forced token"),
    (lambda e: e.step(force={0: True}), "forced token"),
    (lambda e: e.step(force={True: 3}), "forced row"),
    (lambda e: e.step(force=[(0, 3)]), "force must be a mapping"),
    (lambda e: e.start([[1]], 3, GREEDY, n_samples=0), "n_samples"),
    (lambda e: e.start([[1]], 3, GREEDY, n_samples=2.0), "n_samples"),
    (lambda e: e.start([[1]], 3, GREEDY, n_samples=True), "n_samples"),
    (lambda e: e.start([[1], [2], [3]], 3, GREEDY, n_samples=2), "rows"),
    (lambda e: e.start([1, 2, 3], 3, GREEDY), r"\[prompt\]"),
    (lambda e: e.start(torch.tensor([1, 2, 3]), 3, GREEDY), r"\[prompt\]"),
])
def test_bad_input_raises_and_leaves_the_cache_as_it_was(call, match):
    eng = Engine(tiny(), 4, 64)
    eng.start(prompts(), 10, GREEDY)
    eng.step(), eng.step()
    before = snapshot(eng)
    with pytest.raises((ValueError, TypeError), match=match):
        call(eng)
    assert unchanged(eng, before)


def test_forcing_a_bool_token_is_a_type_error():
    eng = Engine(tiny(), 2, 32)
    eng.start(prompts(2), 4, GREEDY)
    with pytest.raises(TypeError, match="forced token for row 0 must be an int"):
        eng.step(force={0: True})


# ----------------------------------------------------------------------------- groups: one prefill, G rows

def repeated(ps, G):
    return [p for p in ps for _ in range(G)]  # prompt-major, as the engine orders a group


@pytest.mark.parametrize("actions", [STEPS, WITH_ROLLBACKS], ids=["steps", "rollbacks"])
def test_group_fan_out_greedy_gives_the_tokens_of_every_prompt_passed_g_times(actions):
    model, ps = tiny(), prompts(3)
    got, _ = run_engine(model, ps, actions, GREEDY, n_samples=3)
    want, _ = run_engine(model, repeated(ps, 3), actions, GREEDY)
    assert_same(got, want)
    assert_same(got, reference(model, repeated(ps, 3), actions, GREEDY))


def test_group_fan_out_samples_differ_within_a_group_and_match_repeated_prompts():
    model, ps = tiny(), prompts(2, lengths=(6, 3))
    group = generate(model, ps, 12, n_samples=4, generator=torch.Generator().manual_seed(3))
    flat = generate(model, repeated(ps, 4), 12, generator=torch.Generator().manual_seed(3))
    rows = group.token_lists()
    assert len(rows) == 8 and rows == flat.token_lists()  # same draws: the prefill draws nothing
    for p in range(2):
        assert len({tuple(r) for r in rows[4 * p: 4 * p + 4]}) > 1, f"prompt {p}'s samples are all equal"


def test_group_fan_out_prefills_each_prompt_once_and_computes_no_logits_there():
    model, ps = tiny(), prompts(3)
    calls, heads = [], []
    model.register_forward_pre_hook(lambda m, args, kwargs: calls.append(tuple(args[0].shape)), with_kwargs=True)
    model.lm_head.register_forward_pre_hook(lambda m, args: heads.append(tuple(args[0].shape)))
    eng = Engine(model, 16, 64)
    eng.start(ps, 5, GREEDY, n_samples=5)
    T = max(len(p) for p in ps) - 1
    assert calls == [(3, T)]  # B prompts, not B·G rows
    assert heads == [(3, 0, 32)]  # the head ran on no position of the prefill
    assert eng.cache.lengths.tolist() == [len(p) - 1 for p in repeated(ps, 5)] + [0]
    eng.step()
    assert calls[-1] == (16, 1) and heads[-1] == (16, 1, 32)


def test_generate_accepts_a_2d_tensor_and_refuses_a_single_prompt():
    model, x = tiny(), torch.randint(0, V, (2, 5), generator=torch.Generator().manual_seed(0))
    from_tensor = generate(model, x, 3, sampling=GREEDY).token_lists()
    assert from_tensor == generate(model, x.tolist(), 3, sampling=GREEDY).token_lists()
    for one in (x[0], x[0].tolist()):
        with pytest.raises(ValueError, match=r"for one prompt pass \[prompt\]"):
            generate(model, one, 3, sampling=GREEDY)
    for bad in (dict(n_samples=0), dict(n_samples="2")):
        with pytest.raises(ValueError, match="n_samples"):
            generate(model, x, 3, **bad)


@pytest.mark.gpu
@pytest.mark.parametrize("params", [GREEDY, TOP_P], ids=["greedy", "top_p"])
def test_cuda_graph_path_equals_eager_path(params):
    model = tiny(n_kv_heads=1).cuda()
    ps = prompts(6)
    results = []
    for graph in (False, True):
        eng = Engine(model, 8, 64, cuda_graph=graph)
        eng.start(ps, 20, params, generator=torch.Generator("cuda").manual_seed(5))
        for _ in range(5):
            eng.step()
        eng.step(force={2: 3})
        eng.rollback([0, 4], [2, 1])
        eng.run()
        results.append(eng.result())
    eager, graphed = results
    assert graphed.token_lists() == eager.token_lists()
    torch.testing.assert_close(graphed.logprobs, eager.logprobs, atol=1e-4, rtol=0)
    assert torch.equal(graphed.sampled_mask, eager.sampled_mask)


@pytest.mark.gpu
def test_prefill_graphs_fill_the_cache_with_the_eager_prefills_bits():
    """A shape's prefill runs eagerly, then is captured, then replayed on new prompts: the cache each leaves
    is the eager engine's, bit for bit (bf16 autocast, as the chapters decode)."""
    model = tiny().cuda()
    graphed = Engine(model, 8, 64, dtype=torch.bfloat16)
    eager = Engine(model, 8, 64, dtype=torch.bfloat16, cuda_graph=False)
    a, b = prompts(4, seed=1), prompts(4, seed=2)  # the same lengths: one shape
    for ps in (a, a, b, a):  # eager, captured (its warm-up is the prefill), replayed twice
        for eng in (graphed, eager):
            eng.start(ps, 4, GREEDY, n_samples=2)
        assert torch.equal(graphed.cache.lengths, eager.cache.lengths)
        for name in ("k", "v"):  # every row's prefilled slots, the fanned-out copies included
            for row, n in enumerate(eager.cache.lengths.tolist()):
                assert torch.equal(getattr(graphed.cache, name)[:, row, :n], getattr(eager.cache, name)[:, row, :n])
    assert list(graphed._prefills.graphs) == [(4, 6)]
    graphed.run()
    eager.run()
    assert graphed.result().token_lists() == eager.result().token_lists()


def test_prefill_graphs_run_a_shape_eagerly_then_capture_it_then_replay_it(monkeypatch):
    """The bookkeeping on the CPU, with a stand-in graph whose replay reruns the captured body."""
    calls, pools = [], []

    class StandIn:
        def __init__(self, body):
            self.replay = body

    def stand_in_capture(body, device, pool=None, **kw):
        body()  # the warm-up is the real work; the capture itself runs nothing
        pools.append(pool)
        return StandIn(body)

    monkeypatch.setattr(engine_graphs, "capture", stand_in_capture)
    graphs = engine_graphs.PrefillGraphs()
    for ids in ([[1, 2]], [[1, 2]], [[3, 4]], [[5, 6, 7]], [[8, 9]]):
        graphs.run(lambda x: calls.append(x.tolist()), torch.tensor(ids), torch.device("cpu"), pool="pool")
    assert calls == [[[1, 2]], [[1, 2]], [[3, 4]], [[5, 6, 7]], [[8, 9]]]  # replays read the new ids
    assert pools == ["pool"] and list(graphs.graphs) == [(1, 2)]  # one capture: (1, 3) came once


@pytest.mark.gpu
def test_cuda_graph_generation_equals_uncached_reference_and_hugging_face():
    model = tiny().cuda()
    x = torch.randint(0, V, (4, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = to_hf(model).cuda().generate(x.cuda(), attention_mask=torch.ones_like(x).cuda(), max_new_tokens=20,
                                            min_new_tokens=20, do_sample=False, pad_token_id=0)[:, 9:]
    got = generate(model, x.tolist(), 20, sampling=GREEDY)
    assert got.token_lists() == want.tolist()
    ref = reference(model, x.tolist(), STEPS * 4, TOP_P, torch.Generator("cuda").manual_seed(2), max_new=20)
    sampled = generate(model, x.tolist(), 20, sampling=SamplingParams(temperature=0.8, top_p=0.9),
                       generator=torch.Generator("cuda").manual_seed(2))
    assert sampled.token_lists() == [[t for t, _, _ in row] for row in ref]


@pytest.mark.gpu
def test_cuda_graph_group_fan_out_equals_the_eager_one_and_repeated_prompts():
    model, ps = tiny().cuda(), prompts(3)
    runs = []
    for graph, n_samples in ((False, 4), (True, 4), (True, 1)):
        eng = Engine(model, 16, 64, cuda_graph=graph)
        eng.start(ps if n_samples > 1 else repeated(ps, 4), 12, TOP_P, n_samples=n_samples,
                  generator=torch.Generator("cuda").manual_seed(4))
        eng.run()
        runs.append(eng.result())
    eager, graphed, flat = runs
    assert graphed.token_lists() == eager.token_lists() == flat.token_lists()
    torch.testing.assert_close(graphed.logprobs, eager.logprobs, atol=1e-4, rtol=0)


def test_a_fused_engine_needs_a_cuda_graph_and_a_bool():
    with pytest.raises(ValueError, match="fused=True .* CUDA device"):
        Engine(tiny(), 2, 32, fused=True)  # the CPU: no graph to compile for
    with pytest.raises(TypeError, match="fused must be a bool"):
        Engine(tiny(), 2, 32, fused=1)


@pytest.mark.gpu
def test_fused_step_scores_forced_tokens_as_the_unfused_one_to_float32_rounding():
    """Teacher-forced, both steps see the same contexts: the fused kernels sum in another order, so the log-probs
    agree to rounding, not bit for bit; forcing, rollback and stop bookkeeping are the same."""
    model, ps = tiny().cuda(), prompts(6)
    forced = torch.randint(0, V, (12, 6), generator=torch.Generator().manual_seed(1)).tolist()
    results = []
    for fused in (False, True):
        eng = Engine(model, 8, 64, fused=fused)
        eng.start(ps, 12, TOP_P, stop_tokens=(forced[9][3],), generator=torch.Generator("cuda").manual_seed(5))
        for step in forced[:10]:
            eng.step(force=dict(enumerate(step)))
        eng.rollback([0, 4], [2, 1])
        for step in forced[10:]:
            eng.step(force=dict(enumerate(step)))
        results.append(eng.result())
    plain, fused = results
    assert fused.token_lists() == plain.token_lists()
    assert torch.equal(fused.stopped, plain.stopped) and torch.equal(fused.sampled_mask, plain.sampled_mask)
    torch.testing.assert_close(fused.logprobs, plain.logprobs, atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
def test_fused_greedy_generation_equals_the_unfused_one_where_no_token_is_nearly_tied():
    model, ps = tiny().cuda(), prompts(8)
    plain = generate(model, ps, 16, sampling=GREEDY)
    fused = generate(model, ps, 16, sampling=GREEDY, fused=True)
    assert fused.token_lists() == plain.token_lists()  # fp32, a tiny model: no two logits within rounding
    torch.testing.assert_close(fused.logprobs, plain.logprobs, atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
def test_bf16_engine_on_cuda_picks_what_fp32_scores_about_the_same():
    model = tiny().cuda()
    ps = prompts(8)
    fp32 = generate(model, ps, 16, sampling=GREEDY)
    bf16 = generate(model, ps, 16, sampling=GREEDY, dtype=torch.bfloat16)
    assert bf16.lengths.tolist() == [16] * 8
    # The first token sees the same context in both: bf16 may flip a near-tie, never pick a poor token.
    torch.testing.assert_close(bf16.logprobs[:, 0], fp32.logprobs[:, 0], atol=0.1, rtol=0)


def test_generate_does_not_keep_the_model_alive():
    import gc
    import weakref

    model = tiny()
    generate(model, prompts(2), 3, sampling=GREEDY)
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None


def test_graph_bookkeeping_matches_eager_with_a_stand_in_graph(monkeypatch):
    """The CUDA-graph path on the CPU: a stand-in graph replays the step in Python, so what is checked is
    the engine's own bookkeeping around capture (warm-up side effects undone, generator restored)."""
    import contextlib

    class StandInGraph:
        def __init__(self):
            self.step = None

        def register_generator_state(self, generator):
            pass

        def replay(self):
            with torch.no_grad():
                self.step()

        def pool(self):
            return None

    captured = []

    @contextlib.contextmanager
    def stand_in_capture(graph, pool=None):
        captured.append(graph)
        yield

    monkeypatch.setattr(torch.cuda, "CUDAGraph", StandInGraph)
    monkeypatch.setattr(torch.cuda, "graph", stand_in_capture)
    class StandInStream:
        def wait_stream(self, other):
            pass

    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: StandInStream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: StandInStream())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    model, ps = tiny(n_kv_heads=1), prompts(4)
    actions = STEPS[:3] + [("step", {2: 3})] + [("rollback", [0, 3], [2, 1])] + STEPS
    original = engine_core.capture_step

    def capture_step(eng, body, pool=None):
        graph = original(eng, body, pool)
        graph.step = body
        return graph

    monkeypatch.setattr(engine_core, "capture_step", capture_step)
    results = []
    for graphed in (False, True):
        eng = Engine(model, 8, 64)
        if graphed:
            eng.use_graph, eng.cache.static = True, True
        eng.start(ps, 30, TOP_P, generator=torch.Generator().manual_seed(9), n_samples=2)  # groups of two
        for action in actions:
            eng.rollback(action[1], action[2]) if action[0] == "rollback" else eng.step(force=action[1])
        results.append(eng.result())
    assert captured, "the stand-in graph was never captured"
    eager, graphed = results
    assert graphed.token_lists() == eager.token_lists()
    torch.testing.assert_close(graphed.logprobs, eager.logprobs, atol=1e-5, rtol=0)
    assert torch.equal(graphed.sampled_mask, eager.sampled_mask)


# -- numbers that must not go silently wrong ----------------------------------------------------

def nan_model() -> Transformer:
    model = tiny()
    with torch.no_grad():
        model.layers[0].mlp.down_proj.weight[0, 0] = float("nan")
    return model


@pytest.mark.parametrize("params", [GREEDY, TOP_P], ids=["greedy", "top_p"])
def test_nan_logits_raise_a_named_error_instead_of_becoming_tokens(params):
    with pytest.raises(engine_module.NonFiniteLogits, match=r"NaN .* rows \[0, 1\]"):
        generate(nan_model(), prompts(2), 4, sampling=params, generator=torch.Generator())
    with pytest.raises(engine_module.NonFiniteLogits):  # the backspace engine's result checks too
        rollout(nan_model(), prompts(2), 4, bksp_id=3, sampling=params)


def test_a_step_that_meets_nan_logits_flags_only_that_row():
    model = tiny()
    eng = Engine(model, 2, 32)
    eng.start(prompts(2), 3, GREEDY)
    eng.step()
    eng.nonfinite[1] = True  # what a NaN logit in row 1's step leaves behind
    with pytest.raises(engine_module.NonFiniteLogits, match=r"rows \[1\]"):
        eng.result()
    eng.start(prompts(2), 3, GREEDY)  # a new batch starts clean
    eng.run()
    assert eng.result().lengths.tolist() == [3, 3]


def test_a_temperature_float32_cannot_hold_is_refused_before_generating():
    for tau in (1e-300, 1e-40, 1e300):
        with pytest.raises(ValueError, match="temperature must be in"):
            generate(tiny(), prompts(2), 3, sampling=SamplingParams(temperature=tau))


def test_the_smallest_allowed_temperature_generates_the_greedy_tokens():
    model, ps = tiny(), prompts(3)
    cold = SamplingParams(temperature=sampling.MIN_TEMPERATURE)
    want = generate(model, ps, 6, sampling=GREEDY).token_lists()
    assert generate(model, ps, 6, sampling=cold, generator=torch.Generator()).token_lists() == want


def test_a_prompt_longer_than_the_models_context_is_refused():
    model = tiny()  # max_positions=128
    with pytest.raises(ValueError, match=r"prompt 1 has 128 tokens; .*max_positions=128"):
        generate(model, [[1, 2], [5] * 128], 1, sampling=GREEDY)
    with pytest.raises(ValueError, match=r"max_new_tokens must be at most 8 here, got 9"):
        generate(model, [[1] * 120], 9, sampling=GREEDY)
    edge = generate(model, [[1] * 120], 8, sampling=GREEDY)  # up to the edge of the context
    assert edge.lengths.tolist() == [8]


def test_a_max_new_tokens_that_would_need_terabytes_is_refused_before_allocating():
    with pytest.raises(ValueError, match="max_new_tokens must be at most 123 here, got 10{12}"):
        generate(tiny(), prompts(2), 10**12)
    with pytest.raises(ValueError, match="max_positions must be at most 128 here, got 10{12}"):
        Engine(tiny(), 2, 10**12)


class Scaled(Engine):
    """An engine whose step multiplies the model's logits by ``scale`` (huge logits, or inf)."""

    def __init__(self, *args, scale: float = 1.0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.scale = scale

    def _logits(self, logits):
        return logits * self.scale


@settings(max_examples=25, deadline=None)
@given(scale=st.sampled_from([1.0, 1e3, 1e30, 1e38, 1e39]) | st.floats(1.0, 1e38),
       tau=st.sampled_from([sampling.MIN_TEMPERATURE, 1e-30, 1e-3, 1.0, 1e30])
       | st.floats(1e-3, 10.0),
       top_k=st.none() | st.integers(1, V + 3), top_p=st.none() | st.floats(0.05, 1.0),
       seed=st.integers(0, 2**31 - 1))
def test_any_logit_scale_and_temperature_give_valid_tokens_or_a_named_error(
        scale, tau, top_k, top_p, seed):
    params = SamplingParams(temperature=tau, top_k=top_k, top_p=top_p)
    try:
        out = generate(PROPERTY_MODEL, prompts(3, seed % 7), 5, sampling=params, engine_type=Scaled,
                       scale=scale, generator=torch.Generator().manual_seed(seed))
    except engine_module.NonFiniteLogits:
        assert scale * 100 > torch.finfo(torch.float32).max  # only logits scaled past float32
        return
    tokens = out.tokens[out.sampled_mask]
    assert ((tokens >= 0) & (tokens < V)).all() and (out.lengths == 5).all()
    assert not out.logprobs.isnan().any()


PROPERTY_MODEL = tiny(seed=3)


# -- 004 §6.2's steps and 001's context window, recomputed for the errata page (chapter 6) -----

def errata_model(**kw) -> Transformer:
    """Chapter 6's untrained check model: width 64, 2 layers, 4 query heads on 2 KV heads."""
    args = dict(vocab_size=64, hidden_size=64, n_layers=2, n_heads=4, n_kv_heads=2,
                max_positions=64, tie_embeddings=False, init_std=0.2)
    args.update(kw)
    return Transformer(ModelConfig(**args), seed=0).eval()


def errata_tokens(T=12):
    return torch.randint(0, 64, (1, T), generator=torch.Generator().manual_seed(0))


@torch.no_grad()
def forward_with_mask(model, ids, mask):
    """The model's forward with ``mask`` (B, 1, T, T), True = may attend, for the causal one."""
    h = model.embed_tokens(ids)  # (1, T, d)
    positions = torch.arange(ids.shape[1])
    cos, sin = positional.rope_cos_sin(positions, model.inv_freq(h.device), model.attention_factor)
    cos, sin = cos[None, :, None].to(h.dtype), sin[None, :, None].to(h.dtype)  # (1, T, 1, D)
    for i, layer in enumerate(model.layers):
        h = layer(h, cos, sin, mask, None, i, None, 0)
    return model.lm_head(model.norm(h))  # (1, T, V)


def test_004_step_3_the_fed_tokens_own_key_is_part_of_the_attention_not_an_option():
    # 004 §6.2.1's numbers; the step that feeds x_3 (query q_3 = x_3 W^Q, W^Q = I).
    X = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], dtype=torch.float64)
    K = X @ torch.tensor([[1.0, 2.0], [0.0, 1.0]], dtype=torch.float64)
    V_ = X @ torch.tensor([[0.5, -0.5], [1.0, 0.5]], dtype=torch.float64)
    with_own, weights = attention.scaled_dot_product_attention(X[2:], K, V_)
    without, _ = attention.scaled_dot_product_attention(X[2:], K[:2], V_[:2])  # j = 1, …, t only
    assert with_own[0].tolist() == pytest.approx([8.5, 0.5])
    assert float(weights[0, 2]) == pytest.approx(1.0)
    assert without[0].tolist() == pytest.approx([5.5, 0.5])
    # The decoder, every token attending to the earlier keys only (the diagonal masked), against
    # the model itself.
    model = errata_model(fast=False).double()
    ids = errata_tokens()
    lower = torch.ones(ids.shape[1], ids.shape[1], dtype=torch.bool)
    with torch.no_grad():
        full = model(ids)[0, -1]  # what training and the cached engine compute
    causal = forward_with_mask(model, ids, lower.tril()[None, None])[0, -1]
    strict = forward_with_mask(model, ids, lower.tril(-1)[None, None])[0, -1]
    assert float((causal - full).abs().max()) < 1e-12  # the helper is the model's forward
    assert float((strict - full).abs().max()) == pytest.approx(3.72, abs=0.005)
    tv = 0.5 * float((strict.softmax(-1) - full.softmax(-1)).abs().sum())
    assert tv == pytest.approx(0.534, abs=0.0005)
    assert int(strict.argmax()) != int(full.argmax())  # the greedy token changes


def test_004_steps_2_and_5_project_each_layers_own_input_not_the_token_embedding():
    model = errata_model().double()
    ids = errata_tokens()
    seen = {}
    hooks = [block.input_layernorm.register_forward_hook(
        lambda m, i, o, n=n: seen.__setitem__(n, o)) for n, block in enumerate(model.layers)]
    cache = model.new_cache(1, 64)
    with torch.no_grad():
        model(ids, cache=cache)
        embedding = model.embed_tokens(ids)  # (1, T, d): 004's x_j
    for h in hooks:
        h.remove()
    c = model.config
    H, H_kv, D, T = c.n_heads, c.n_kv_heads, c.head_dim, ids.shape[1]
    relative = []
    for n, block in enumerate(model.layers):
        def values(x):  # x W^V of this layer: (1, T, H_kv, D)
            return block.self_attn.qkv_proj(x).view(1, T, H + 2 * H_kv, D)[:, :, H + H_kv:]
        with torch.no_grad():
            cached = cache.v[n, :, :T]  # (1, T, H_kv, D)
            assert torch.equal(values(seen[n]), cached)  # the layer's own (normed) input
            relative.append(float((values(embedding) - cached).norm() / cached.norm()))
    assert relative == pytest.approx([0.80, 0.98], abs=0.005)


def test_004_step_6_a_chosen_tokens_keys_are_written_by_the_step_that_feeds_it():
    model = errata_model()  # float32: the engine records float32 log-probs
    prompt = [3, 14, 15, 9, 26]
    eng = Engine(model, batch_size=1, max_positions=64)
    eng.start([prompt], 6, GREEDY)
    held = []
    for _ in range(6):
        eng.step()
        held.append(int(eng.cache.lengths[0]))
    generated = eng.result().token_lists()[0]
    assert held == [5, 6, 7, 8, 9, 10]  # the prompt and n − 1 generated tokens; the last is pending
    fresh = model.new_cache(1, 64)
    with torch.no_grad():
        model(torch.tensor([prompt + generated[:-1]]), cache=fresh)
    n = held[-1]
    assert torch.allclose(eng.cache.k[:, 0, :n], fresh.k[:, 0, :n], atol=1e-5)
    assert torch.allclose(eng.cache.v[:, 0, :n], fresh.v[:, 0, :n], atol=1e-5)


def test_001_remark_v_tokens_that_left_listing_4s_window_leave_no_trace_in_the_hidden_states():
    model = errata_model().double()
    delta = 8  # Δ, Listing 4's block_size
    a = errata_tokens()
    b = a.clone()
    b[0, 0] = (a[0, 0] + 1) % 64  # the two sequences differ in x_1 only
    with torch.no_grad():
        windowed = [model(s[:, -delta:])[0, -1] for s in (a, b)]  # idx[:, -block_size:]
        whole = [model(s)[0, -1] for s in (a, b)]
        rolling = []  # a cache keeping the last Δ − 1 keys and values, made while x_1 was visible
        for s in (a, b):
            full = model.new_cache(1, 64)
            model(s[:, :-1], cache=full)
            kept = model.new_cache(1, 64)
            t, keep = s.shape[1] - 1, delta - 1
            kept.k[:, :, :keep] = full.k[:, :, t - keep:t]
            kept.v[:, :, :keep] = full.v[:, :, t - keep:t]
            kept.set_lengths([keep])
            rolling.append(model(s[:, -1:], position_ids=torch.tensor([[t]]), cache=kept)[0, -1])
    assert torch.equal(windowed[0], windowed[1])  # nothing of x_1 is left
    assert float((whole[0] - whole[1]).abs().max()) == pytest.approx(1.95, abs=0.005)
    assert float((rolling[0] - rolling[1]).abs().max()) == pytest.approx(0.84, abs=0.005)
