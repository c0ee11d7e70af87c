"""Per-call CPU of what the multi-rank path does before exchanging: bind, build the call, its header (this tree)."""
import timeit
from syncreward import synced_reward
from syncreward._call import _build, header
from syncreward._identity import Site

class TrainerState:
    global_step = 3

def reward(completions, solution, **kwargs):
    return [0.0] * len(completions)

spec = synced_reward(reward).__syncreward_spec__
n = 64
trl = dict(prompts=["p"] * n, completions=["c"] * n, completion_ids=[[1, 2]] * n, solution=["s"] * n,
           trainer_state=TrainerState(), log_extra=print, log_metric=print)
plain = dict(completions=["c"] * n, solution=["s"] * n, threshold=0.5, step=3, config={"a": 1, "b": [1, 2.5]})

def run(kwargs):
    bound = spec.binder.bind((), kwargs)
    call = _build(spec, None, 0, Site("mod:fn+1", " called from x.py:1"), bound)
    header(call, True, 100, 0, ())

for name, kw in (("TRL-like (trainer_state, logs)", trl), ("threshold, step, small config", plain)):
    t = min(timeit.repeat(lambda: run(kw), number=5000, repeat=7)) / 5000 * 1e6
    print(f"{name:34s} {t:6.2f} us per call (bind + Call + header)")
