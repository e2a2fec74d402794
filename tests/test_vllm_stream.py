"""VLLMEngine's streaming requests (``submit``/``poll``/``abort``, what multi-turn rollouts use) against
its batched ``generate``, on the tiny model: the same seeded samples, stop strings, and an idle engine
after an abort."""

from __future__ import annotations

import pytest

from envs.types import Sampling

pytestmark = pytest.mark.slow


def test_streamed_requests_sample_what_generate_samples_and_abort_leaves_the_engine_idle(
    tiny_model_path, tiny_tokenizer
) -> None:
    from rollout.engine import VLLMEngine

    engine = VLLMEngine(tiny_model_path, dtype="float32", max_model_len=512, kv_cache_gib=0.25)
    try:
        s = Sampling(max_new_tokens=16, temperature=1.0, max_model_len=512)
        prompts = [[1, 2, 3], [4, 5, 6, 7], [1, 2, 3]]
        free = engine.generate(prompts[:1], s, seeds=[5])[0]
        stop = tiny_tokenizer.decode(free.token_ids[:3], skip_special_tokens=False)[-2:]
        ref = engine.generate(prompts, s, seeds=[5, 6, 5], stops=[[], [], [stop]])
        assert engine.poll() == [], "nothing submitted: nothing to wait for"
        for key, (p, seed, st) in enumerate(zip(prompts, [5, 6, 5], [[], [], [stop]])):
            engine.submit(10 + key, p, s, seed, st)
        got: dict[int, object] = {}
        for _ in range(200):
            got.update(engine.poll())
            if len(got) == 3:
                break
        assert [got[10], got[11], got[12]] == ref
        assert ref[2].finish_reason == "stop" and len(ref[2].token_ids) < len(free.token_ids)

        engine.submit(99, prompts[0], Sampling(max_new_tokens=200, temperature=1.0, max_model_len=512), 5, [])
        engine.abort()
        assert engine.poll() == [] and not engine.llm.llm_engine.has_unfinished_requests()
        assert engine.generate(prompts[:1], s, seeds=[5]) == [free], "generate works after an abort"
    finally:
        engine.shutdown()
