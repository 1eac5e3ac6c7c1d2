"""The scheduler's fake device: KV kept in the real pages (so shared or missing pages corrupt
what a row reads back), a mock sampler deterministic in (request, position), and the `make`
fixture in tests/engine/conftest.py that checks every page is back at teardown."""

from tgix.engine.request_state import RequestState
from tgix.engine.scheduler import Scheduler


def tok(rid: str, pos: int) -> int:
    """The mock sampler: deterministic in (request, position), so recompute repeats it."""
    return sum(map(ord, rid)) * 1000 + pos


def alone(prompt_len: int, rid: str, max_new: int) -> list[int]:
    return [tok(rid, prompt_len + k) for k in range(max_new)]


class Device:
    """Runs a step: writes each row's tokens into its pages, reads the whole context back from
    the pages and checks it equals prompt + outputs, then samples `tok` for producing rows."""

    def __init__(self, sched: Scheduler):
        self.sched, self.kv, self.seqs, self.log = sched, {}, {}, []

    def add(self, rid: str, prompt_len: int, max_new: int, prompt=None, **fields):
        prompt = [tok("p" + rid, i) for i in range(prompt_len)] if prompt is None else prompt
        seq = RequestState(rid, list(prompt), max_new, **fields)
        self.sched.add(seq)
        self.seqs[rid] = seq
        return seq

    def step(self, step=None) -> list[str]:
        step = step or self.sched.schedule()
        assert step is not None
        ps = self.sched.kv.page_size
        self.log.append([(r.request_id, len(r.token_ids), r.is_prompt) for r in step.rows])
        sampled = {}
        for r in step.rows:
            end = r.start_pos + len(r.token_ids)
            for i, t in enumerate(r.token_ids):
                pos = r.start_pos + i
                self.kv[r.pages[pos // ps], pos % ps] = t
            seq = self.seqs[r.request_id]
            assert [self.kv[r.pages[p // ps], p % ps] for p in range(end)] == (
                seq.prompt_ids + seq.output_ids
            )[:end]
            if r.produces_token:
                sampled[r.request_id] = [tok(r.request_id, end)]
        assert self.sched.kv.num_used <= self.sched.page_limit
        return self.sched.on_step_done(step, sampled)

    def run(self, max_steps: int = 500) -> None:
        for _ in range(max_steps):
            step = self.sched.schedule()
            if step is None:
                return
            self.step(step)
        raise AssertionError("did not finish")
